/*
 * test_server_cli.c — `cvllm serve` as a process: the tutorial command line (every vLLM flag in it
 * accepted, the meaningless ones logged as ignored), the chat flags (a --chat-template file with
 * --default-chat-template-kwargs reaches /v1/chat/completions/render; a template that does not parse
 * stops startup naming its line and column), startup errors for malformed values and for an address
 * in use (before the model loads, and before -tp's ranks start), and SIGTERM with
 * and without --shutdown-timeout (drain vs abort).
 *
 * The server listens on port 0 and the test reads the chosen port from its startup log line
 * (serve_process.h).
 */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <regex.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "serve_process.h"
#include "testutil.h"

static char *model_dir;

/* Starts `cvllm serve` on the test's model, its log named by the number of arguments. */
static sp_proc spawn(const char *const *args, size_t n_args) {
    char tag[16];
    snprintf(tag, sizeof tag, "%d", (int)n_args);
    return sp_spawn(model_dir, model_dir, tag, args, n_args);
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
    const char *args[96];
    size_t n = 0;
    for (size_t i = 0; i < sizeof tutorial / sizeof *tutorial; i++) args[n++] = tutorial[i];
    args[n++] = "--shutdown-timeout";
    args[n++] = "30";
    /* vLLM frontend flags that change nothing here, each said once */
    const char *frontend[] = {"--root-path", "/api", "--disable-access-log-for-endpoints", "/health,/metrics",
                              "--h11-max-header-count", "100", "--tokenizer-mode", "auto", "--device", "cpu",
                              "--limit-mm-per-prompt", "{\"image\": 0}", "--hf-token"};
    for (size_t i = 0; i < sizeof frontend / sizeof *frontend; i++) args[n++] = frontend[i];
    /* Qwen3's own template needs special tokens the test vocabulary lacks: a plain one instead, given
     * as the value itself (vLLM takes a --chat-template that names no file and holds braces as the
     * template; the file form: test_bad_template) */
    const char *chat_flags[] = {"--chat-template", "{{ greeting }}{% for m in messages %} {{ m.content }}{% endfor %}",
                                "--default-chat-template-kwargs", "{\"greeting\": \"We\"}", "--trust-request-chat-template",
                                "--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                                "--reasoning-content"};
    for (size_t i = 0; i < sizeof chat_flags / sizeof *chat_flags; i++) args[n++] = chat_flags[i];
    sp_proc p = spawn(args, n);
    CHECK_MSG(sp_wait_ready(&p, 30), "server did not start");
    char *log = tu_read_text(p.log);
    CHECK_CONTAINS(log, "--trust-remote-code is accepted and ignored");
    CHECK_CONTAINS(log, "--compilation-config is accepted and ignored");
    CHECK_CONTAINS(log, "--additional-config is accepted and ignored");
    CHECK_CONTAINS(log, "--distributed-executor-backend mp is accepted and ignored");
    CHECK_CONTAINS(log, "--root-path /api is accepted and ignored");
    CHECK_CONTAINS(log, "--h11-max-header-count 100 is accepted and ignored");
    CHECK_CONTAINS(log, "--tokenizer-mode auto is accepted and ignored");
    CHECK_CONTAINS(log, "--device cpu is accepted and ignored");
    CHECK_CONTAINS(log, "Detected the chat template content format to be 'string'. You can set "
                        "`--chat-template-content-format` to override this.");
    free(log);
    sp_call rc = {.port = p.port, .path = "/v1/chat/completions/render",
               .body = "{\"messages\":[{\"role\":\"user\",\"content\":\"are in the house\"}]}"};
    sp_post(&rc);
    CHECK_EQ_INT(rc.status, 200);
    CHECK_CONTAINS(rc.reply, "\"prompt\":\"We are in the house\"");
    free(rc.reply);
    /* trusted, a request's own template renders it */
    sp_call own = {.port = p.port, .path = "/v1/chat/completions/render",
                   .body = "{\"messages\":[{\"role\":\"user\",\"content\":\"house\"}],"
                           "\"chat_template\":\"{% for m in messages %}in the {{ m.content }}{% endfor %}\"}"};
    sp_post(&own);
    CHECK_EQ_INT(own.status, 200);
    CHECK_CONTAINS(own.reply, "\"prompt\":\"in the house\"");
    free(own.reply);
    sp_call c = {.port = p.port,
              .body = "{\"model\":\"qwen3\",\"prompt\":\"I am in the house\",\"max_tokens\":1500,\"temperature\":0,\"ignore_eos\":true}"};
    pthread_t t;
    pthread_create(&t, NULL, sp_post, &c);
    CHECK_MSG(sp_wait_running(p.port, 30), "the completion never started running");
    kill(p.pid, SIGTERM);
    pthread_join(t, NULL);
    CHECK_EQ_INT(c.status, 200);
    json_t *j = json_loads(c.reply ? c.reply : "", 0, NULL);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_STR_EQ(json_string_value(json_object_get(ch, "finish_reason")), "length");
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 1500);
    json_decref(j);
    free(c.reply);
    CHECK_EQ_INT(sp_wait_exit(&p, 20), 0);
}

/* vLLM's request log: each prompt's parameters when it arrives, its output (cut to --max-log-len
 * characters and ids) when it is through, in vLLM's words. */
static void test_request_log(void) {
    const char *args[] = {"--host", "127.0.0.1", "--port", "0", "--num-threads", "2", "--kv-cache-memory-bytes", "64M",
                          "--max-model-len", "512", "--enable-log-requests", "--enable-log-outputs", "--max-log-len", "3"};
    sp_proc p = spawn(args, sizeof args / sizeof *args);
    CHECK_MSG(sp_wait_ready(&p, 30), "server did not start");
    sp_call c = {.port = p.port,
                 .body = "{\"prompt\":[\"I am\",\"in the\"],\"max_tokens\":5,\"temperature\":0,\"ignore_eos\":true,"
                         "\"stop\":[\"zzz\"]}"};
    sp_post(&c);
    CHECK_EQ_INT(c.status, 200);
    free(c.reply);
    kill(p.pid, SIGTERM);
    CHECK_EQ_INT(sp_wait_exit(&p, 20), 0);
    char *log = tu_read_text(p.log);
    CHECK_CONTAINS(log, "-0: params: SamplingParams(n=1, presence_penalty=0.0, frequency_penalty=0.0, "
                        "repetition_penalty=1.0, temperature=0.0, top_p=0.95, top_k=20, min_p=0.0, seed=None, "
                        "stop=['zzz'], stop_token_ids=[], bad_words=[], include_stop_str_in_output=False, "
                        "ignore_eos=True, max_tokens=5, ");
    CHECK_CONTAINS(log, "-1: params: SamplingParams(n=1, ");
    CHECK_CONTAINS(log, "lora_request: None.");
    regex_t re;
    CHECK(regcomp(&re, "Generated response cmpl-[0-9a-f]+-1: output: '[^']{0,3}', output_token_ids: \\[[0-9]+, [0-9]+, "
                       "[0-9]+\\], finish_reason: length", REG_EXTENDED) == 0);
    CHECK_MSG(regexec(&re, log, 0, NULL, 0) == 0, "no output line of prompt 1 in: %s", log);
    regfree(&re);
    free(log);
}

/* Without --shutdown-timeout, SIGTERM aborts a running stream: it ends with "abort" and [DONE]. */
static void test_sigterm_aborts(void) {
    const char *args[] = {"--host", "127.0.0.1", "--port", "0", "--api-key", "sk-1", "--num-threads", "2",
                          "--kv-cache-memory-bytes", "64M", "--max-model-len", "8192"};
    sp_proc p = spawn(args, sizeof args / sizeof *args);
    CHECK_MSG(sp_wait_ready(&p, 30), "server did not start");
    sp_call c = {.port = p.port,
              .body = "{\"prompt\":\"I am in the house\",\"max_tokens\":8000,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}"};
    pthread_t t;
    pthread_create(&t, NULL, sp_post, &c);
    CHECK_MSG(sp_wait_running(p.port, 30), "the stream never started running");
    kill(p.pid, SIGTERM);
    pthread_join(t, NULL);
    CHECK_EQ_INT(sp_wait_exit(&p, 10), 0); /* the 8000-token stream is not waited for */
    CHECK_EQ_INT(c.status, 200);
    CHECK_CONTAINS(c.reply, "\"finish_reason\":\"abort\"");
    CHECK(c.reply && c.len >= 14 && !strcmp(c.reply + c.len - 14, "data: [DONE]\n\n"));
    free(c.reply);
}

/* A malformed value stops startup with a one-line reason and status 2. */
static void expect_usage_error(const char *const *args, size_t n, const char *needle) {
    sp_proc p = spawn(args, n);
    CHECK_EQ_INT(sp_wait_exit(&p, 20), 2);
    char *log = tu_read_text(p.log);
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
    EXPECT_USAGE_ERROR("--ssl-keyfile needs --ssl-certfile", "--ssl-keyfile", "key.pem");
    EXPECT_USAGE_ERROR("--tool-parser-plugin is not supported: cvllm cannot load Python plugins", "--tool-parser-plugin=x.py");
    EXPECT_USAGE_ERROR("argument --allowed-origins: invalid loads value: 'http://a'", "--allowed-origins", "http://a");
    EXPECT_USAGE_ERROR("argument --fingerprint-mode: invalid choice: 'x'", "--fingerprint-mode", "x");
    EXPECT_USAGE_ERROR("-dpa is not supported: data parallelism across machines", "-dpa", "10.0.0.1");
    EXPECT_USAGE_ERROR("argument --device: invalid choice: 'cuda' (choose from 'auto', 'cpu')", "--device", "cuda");
    EXPECT_USAGE_ERROR("--hf-overrides must be a JSON object", "--hf-overrides", "[1]");
#undef EXPECT_USAGE_ERROR
}

/* A chat template that does not parse, or a path that names no file, stops startup (status 1) with
 * its line and column, or vLLM's words, before the model is loaded. */
static void test_bad_template(void) {
    const char bad[] = "{% for m in messages %}\n{{ m.content }\n{% endfor %}";
    tu_write_file(model_dir, "bad.jinja", bad, sizeof bad - 1);
    char *path = tu_strdupf("%s/%s", model_dir, "bad.jinja");
    const char *wants[][2] = {{path, "bad.jinja: chat template: line 2 column"},
                              {"/nonexistent/chat.jinja", "cvllm serve: The supplied chat template (/nonexistent/"
                                                          "chat.jinja) looks like a file path, but it failed to be opened."}};
    for (size_t i = 0; i < sizeof wants / sizeof *wants; i++) {
        const char *args[] = {"--port", "0", "--host", "127.0.0.1", "--num-threads", "2", "--kv-cache-memory-bytes",
                              "64M", "--chat-template", wants[i][0]};
        sp_proc p = spawn(args, sizeof args / sizeof *args);
        CHECK_EQ_INT(sp_wait_exit(&p, 30), 1);
        char *log = tu_read_text(p.log);
        CHECK_CONTAINS(log, wants[i][1]);
        CHECK_MSG(!strstr(log, "Initializing engine"), "the model was loaded first:\n%s", log);
        free(log);
    }
    free(path);
}

/* An address in use is said at once, as vLLM does: before the model is loaded, and with -tp 2
 * before any rank is started. */
static void test_address_in_use(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0 && listen(fd, 1) == 0 &&
          getsockname(fd, (struct sockaddr *)&addr, &len) == 0);
    char port[16], want[64];
    snprintf(port, sizeof port, "%d", ntohs(addr.sin_port));
    snprintf(want, sizeof want, "cvllm serve: cannot listen on 127.0.0.1:%s", port);
    for (int tp = 1; tp <= 2; tp++) {
        const char *args[] = {"--port", port, "--host", "127.0.0.1", "--num-threads", "2", "-tp", tp == 1 ? "1" : "2"};
        sp_proc p = spawn(args, sizeof args / sizeof *args);
        CHECK_EQ_INT(sp_wait_exit(&p, 30), 1);
        char *log = tu_read_text(p.log);
        CHECK_MSG(!strncmp(tu_last_line(log), want, strlen(want)), "-tp %d: %s", tp, log);
        CHECK_MSG(!strstr(log, "[engine]") && !strstr(log, "mpirun"), "-tp %d: loaded before binding: %s", tp, log);
        free(log);
    }
    close(fd);
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    model_dir = tu_model_dir("qwen3-dense-f32");
    test_bad_flags();
    test_request_log();
    test_bad_template();
    test_address_in_use();
    test_tutorial_and_drain();
    test_sigterm_aborts();
    tu_remove_tree(model_dir);
    free(model_dir);
    curl_global_cleanup();
    return cv_check_summary("test_server_cli");
}
