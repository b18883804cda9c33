/*
 * test_server_cli.c — `cvllm serve` as a process: the tutorial command line (every vLLM flag in it
 * accepted, the meaningless ones logged as ignored), the chat flags (a --chat-template file with
 * --default-chat-template-kwargs reaches /v1/chat/completions/render; a template that does not parse
 * stops startup naming its line and column), startup errors for malformed values, and SIGTERM with
 * and without --shutdown-timeout (drain vs abort).
 *
 * The server listens on port 0 and the test reads the chosen port from its startup log line.
 */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "testutil.h"

static char *model_dir;

typedef struct proc {
    pid_t pid;
    char log[256];             /* the child's stderr */
    int port;
} proc;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return calloc(1, 1);
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Starts `cvllm serve MODEL args...` with stderr in a file. */
static proc spawn(const char *const *args, size_t n_args) {
    proc p = {0};
    snprintf(p.log, sizeof p.log, "%s/serve-%d.log", model_dir, (int)n_args);
    const char *argv[64] = {CVLLM_BINARY, "serve", model_dir};
    size_t argc = 3;
    for (size_t i = 0; i < n_args && argc < 63; i++) argv[argc++] = args[i];
    argv[argc] = NULL;
    p.pid = fork();
    if (p.pid == 0) {
        int fd = open(p.log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 2);
        dup2(fd, 1);
        execv(CVLLM_BINARY, (char *const *)argv);
        _exit(127);
    }
    return p;
}

/* Waits for the "API server on http://HOST:PORT" line; false when the process died or timed out. */
static bool wait_ready(proc *p, double seconds) {
    for (double t0 = now(); now() - t0 < seconds; usleep(50000)) {
        char *log = read_file(p->log);
        char *at = strstr(log, "API server on http://127.0.0.1:");
        if (at) p->port = atoi(at + strlen("API server on http://127.0.0.1:"));
        free(log);
        if (p->port > 0) return true;
        if (waitpid(p->pid, NULL, WNOHANG) == p->pid) return false;
    }
    return false;
}

/* Exit status after waiting up to `seconds` (-1 on timeout, then the process is killed). */
static int wait_exit(proc *p, double seconds) {
    int status;
    for (double t0 = now(); now() - t0 < seconds; usleep(20000))
        if (waitpid(p->pid, &status, WNOHANG) == p->pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &status, 0);
    return -1;
}

typedef struct call {
    int port;
    const char *path;          /* NULL = /v1/completions */
    const char *body;          /* NULL: a GET */
    long status;
    char *reply;
    size_t len;
} call;

static size_t collect(char *data, size_t size, size_t n, void *user) {
    call *c = user;
    c->reply = realloc(c->reply, c->len + size * n + 1);
    memcpy(c->reply + c->len, data, size * n);
    c->len += size * n;
    c->reply[c->len] = '\0';
    return size * n;
}

static void *post_completion(void *arg) {
    call *c = arg;
    CURL *h = curl_easy_init();
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", c->port, c->path ? c->path : "/v1/completions");
    struct curl_slist *hdr = curl_slist_append(curl_slist_append(NULL, "Content-Type: application/json"),
                                               "Authorization: Bearer sk-1");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    if (c->body) curl_easy_setopt(h, CURLOPT_POSTFIELDS, c->body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
    curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &c->status);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return NULL;
}

/* Waits (up to `seconds`) until the server's /metrics counts a request in its running batch: the
 * point after which a request is the server's to finish, whatever the machine's load. */
static bool wait_running(int port, double seconds) {
    for (double t0 = now(); now() - t0 < seconds; usleep(20000)) {
        call m = {.port = port, .path = "/metrics"};
        post_completion(&m);
        const char *at = m.reply ? strstr(m.reply, "\nvllm:num_requests_running{") : NULL;
        const char *end = at ? strchr(at, '}') : NULL;
        const bool running = end && strtod(end + 1, NULL) >= 1;
        free(m.reply);
        if (running) return true;
    }
    return false;
}

static const char *const tutorial[] = {
    "--served-model-name", "qwen3", "--host", "127.0.0.1", "--port", "0", "--max-model-len", "5500",
    "--max-num-batched-tokens", "40960", "--max-num-seqs", "128", "--block-size", "128", "--enable-prefix-caching",
    "--async-scheduling", "--seed", "1024", "--trust-remote-code", "--compilation-config",
    "{\"cudagraph_mode\": \"FULL_DECODE_ONLY\"}", "--additional-config", "{\"ascend_scheduler_config\": {\"enabled\": true}}",
    "--distributed-executor-backend", "mp", "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.9",
    "--kv-cache-memory-bytes", "64M", "--num-threads", "2", "--api-key", "sk-1", "--disable-log-requests",
    "--disable-log-stats"};

/* The tutorial flags; SIGTERM with --shutdown-timeout lets a running request finish. */
static void test_tutorial_and_drain(void) {
    const char *args[64];
    size_t n = 0;
    for (size_t i = 0; i < sizeof tutorial / sizeof *tutorial; i++) args[n++] = tutorial[i];
    args[n++] = "--shutdown-timeout";
    args[n++] = "30";
    /* Qwen3's own template needs special tokens the test vocabulary lacks: a plain one instead. */
    const char tmpl[] = "{{ greeting }}{% for m in messages %} {{ m.content }}{% endfor %}";
    tu_write_file(model_dir, "plain.jinja", tmpl, sizeof tmpl - 1);
    char *tmpl_path = tu_strdupf("%s/%s", model_dir, "plain.jinja");
    const char *chat_flags[] = {"--chat-template", tmpl_path, "--default-chat-template-kwargs", "{\"greeting\": \"We\"}",
                                "--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                                "--reasoning-content"};
    for (size_t i = 0; i < sizeof chat_flags / sizeof *chat_flags; i++) args[n++] = chat_flags[i];
    proc p = spawn(args, n);
    CHECK_MSG(wait_ready(&p, 30), "server did not start");
    char *log = read_file(p.log);
    CHECK_CONTAINS(log, "--trust-remote-code is accepted and ignored");
    CHECK_CONTAINS(log, "--compilation-config is accepted and ignored");
    CHECK_CONTAINS(log, "--additional-config is accepted and ignored");
    CHECK_CONTAINS(log, "--distributed-executor-backend mp is accepted and ignored");
    CHECK_CONTAINS(log, "Detected the chat template content format to be 'string'. You can set "
                        "`--chat-template-content-format` to override this.");
    free(log);
    call rc = {.port = p.port, .path = "/v1/chat/completions/render",
               .body = "{\"messages\":[{\"role\":\"user\",\"content\":\"are in the house\"}]}"};
    post_completion(&rc);
    CHECK_EQ_INT(rc.status, 200);
    CHECK_CONTAINS(rc.reply, "\"prompt\":\"We are in the house\"");
    free(rc.reply);
    free(tmpl_path);
    call c = {.port = p.port,
              .body = "{\"model\":\"qwen3\",\"prompt\":\"I am in the house\",\"max_tokens\":1500,\"temperature\":0,\"ignore_eos\":true}"};
    pthread_t t;
    pthread_create(&t, NULL, post_completion, &c);
    CHECK_MSG(wait_running(p.port, 30), "the completion never started running");
    kill(p.pid, SIGTERM);
    pthread_join(t, NULL);
    CHECK_EQ_INT(c.status, 200);
    json_t *j = json_loads(c.reply ? c.reply : "", 0, NULL);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_STR_EQ(json_string_value(json_object_get(ch, "finish_reason")), "length");
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 1500);
    json_decref(j);
    free(c.reply);
    CHECK_EQ_INT(wait_exit(&p, 20), 0);
}

/* Without --shutdown-timeout, SIGTERM aborts a running stream: it ends with "abort" and [DONE]. */
static void test_sigterm_aborts(void) {
    const char *args[] = {"--host", "127.0.0.1", "--port", "0", "--api-key", "sk-1", "--num-threads", "2",
                          "--kv-cache-memory-bytes", "64M", "--max-model-len", "8192"};
    proc p = spawn(args, sizeof args / sizeof *args);
    CHECK_MSG(wait_ready(&p, 30), "server did not start");
    call c = {.port = p.port,
              .body = "{\"prompt\":\"I am in the house\",\"max_tokens\":8000,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}"};
    pthread_t t;
    pthread_create(&t, NULL, post_completion, &c);
    CHECK_MSG(wait_running(p.port, 30), "the stream never started running");
    kill(p.pid, SIGTERM);
    pthread_join(t, NULL);
    CHECK_EQ_INT(wait_exit(&p, 10), 0); /* the 8000-token stream is not waited for */
    CHECK_EQ_INT(c.status, 200);
    CHECK_CONTAINS(c.reply, "\"finish_reason\":\"abort\"");
    CHECK(c.reply && c.len >= 14 && !strcmp(c.reply + c.len - 14, "data: [DONE]\n\n"));
    free(c.reply);
}

/* A malformed value stops startup with a one-line reason and status 2. */
static void expect_usage_error(const char *const *args, size_t n, const char *needle) {
    proc p = spawn(args, n);
    CHECK_EQ_INT(wait_exit(&p, 20), 2);
    char *log = read_file(p.log);
    CHECK_CONTAINS(log, needle);
    free(log);
}

static void test_bad_flags(void) {
#define EXPECT_USAGE_ERROR(needle, ...)                                          \
    do {                                                                          \
        const char *args_[] = {__VA_ARGS__};                                      \
        expect_usage_error(args_, sizeof args_ / sizeof *args_, needle);          \
    } while (0)
    EXPECT_USAGE_ERROR("cvllm serve: --compilation-config is not valid JSON", "--compilation-config", "{cudagraph_mode");
    EXPECT_USAGE_ERROR("cvllm serve: --port must be in [0, 65535]", "--port", "70000");
    EXPECT_USAGE_ERROR("--shutdown-timeout expects a number", "--shutdown-timeout", "soon");
    EXPECT_USAGE_ERROR("unknown option --no-such-flag", "--no-such-flag");
    EXPECT_USAGE_ERROR("--tensor-parallel-size expects an integer", "--tensor-parallel-size", "two");
    EXPECT_USAGE_ERROR("unknown --reasoning-parser 'deepseek_v3' (supported: qwen3)", "--reasoning-parser", "deepseek_v3");
    EXPECT_USAGE_ERROR("unknown tool call parser 'pythonic' (supported: hermes, qwen3_coder)", "--tool-call-parser", "pythonic");
    EXPECT_USAGE_ERROR("--enable-auto-tool-choice requires --tool-call-parser", "--enable-auto-tool-choice");
    EXPECT_USAGE_ERROR("--default-chat-template-kwargs must be a JSON object", "--default-chat-template-kwargs", "[1]");
    EXPECT_USAGE_ERROR("cvllm serve: argument --chat-template-content-format: invalid choice: 'text' (choose from auto, "
                       "string, openai)", "--chat-template-content-format", "text");
#undef EXPECT_USAGE_ERROR
}

/* A chat template that does not parse stops startup (status 1) with its line and column. */
static void test_bad_template(void) {
    const char bad[] = "{% for m in messages %}\n{{ m.content }\n{% endfor %}";
    tu_write_file(model_dir, "bad.jinja", bad, sizeof bad - 1);
    char *path = tu_strdupf("%s/%s", model_dir, "bad.jinja");
    const char *args[] = {"--port", "0", "--host", "127.0.0.1", "--num-threads", "2", "--kv-cache-memory-bytes", "64M",
                          "--chat-template", path};
    proc p = spawn(args, sizeof args / sizeof *args);
    CHECK_EQ_INT(wait_exit(&p, 30), 1);
    char *log = read_file(p.log);
    CHECK_CONTAINS(log, "bad.jinja");
    CHECK_CONTAINS(log, "line 2 column");
    free(log);
    free(path);
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    model_dir = tu_model_dir("qwen3-dense-f32");
    test_bad_flags();
    test_bad_template();
    test_tutorial_and_drain();
    test_sigterm_aborts();
    tu_remove_tree(model_dir);
    free(model_dir);
    curl_global_cleanup();
    return cv_check_summary("test_server_cli");
}
