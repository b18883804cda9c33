/*
 * serve_process.h — `cvllm serve` as a child process, for the tests that run the server as users do
 * (test_server_cli.c, test_data_parallel.c): start it on port 0 with its output in a log file, read
 * the chosen port from its startup line, call it with libcurl (from any thread), read one series of
 * its /metrics, and wait for it to exit. Header-only (static functions), like testutil.h.
 */
#ifndef CV_SERVE_PROCESS_H
#define CV_SERVE_PROCESS_H

#include <curl/curl.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

typedef struct sp_proc {
    pid_t pid;
    char log[512];             /* the child's stdout and stderr */
    int port;
} sp_proc;

static inline double sp_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Starts `cvllm serve MODEL args...` with its output in LOG_DIR/serve-TAG.log. */
static inline sp_proc sp_spawn(const char *model, const char *log_dir, const char *tag, const char *const *args,
                               size_t n_args) {
    sp_proc p = {0};
    snprintf(p.log, sizeof p.log, "%s/serve-%s.log", log_dir, tag);
    const char *argv[128] = {CVLLM_BINARY, "serve", model};
    size_t argc = 3;
    if (n_args > 124) { /* a test's mistake: said, not a command line cut short */
        fprintf(stderr, "sp_spawn: %zu arguments, at most 124\n", n_args);
        abort();
    }
    for (size_t i = 0; i < n_args; i++) argv[argc++] = args[i];
    argv[argc] = NULL;
    fflush(NULL);
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

/* Waits for the "API server on http://127.0.0.1:PORT" line (https:// for HTTPS); false when the
 * process died or timed out. */
static inline bool sp_wait_ready(sp_proc *p, double seconds) {
    static const char line[] = "API server on http", host[] = "://127.0.0.1:";
    for (double t0 = sp_now(); sp_now() - t0 < seconds; usleep(50000)) {
        char *log = tu_read_text(p->log);
        char *at = strstr(log, line);
        if (at) at = strstr(at, host);
        if (at) p->port = atoi(at + strlen(host));
        free(log);
        if (p->port > 0) return true;
        if (waitpid(p->pid, NULL, WNOHANG) == p->pid) return false;
    }
    return false;
}

/* Exit status after waiting up to `seconds` (-1 on timeout, then the process is killed). */
static inline int sp_wait_exit(sp_proc *p, double seconds) {
    int status;
    for (double t0 = sp_now(); sp_now() - t0 < seconds; usleep(20000))
        if (waitpid(p->pid, &status, WNOHANG) == p->pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &status, 0);
    return -1;
}

typedef struct sp_call {
    int port;
    const char *path;          /* NULL = /v1/completions */
    const char *body;          /* NULL: a GET */
    long status;
    char *reply;
    size_t len;
} sp_call;

static inline size_t sp_collect(char *data, size_t size, size_t n, void *user) {
    sp_call *c = user;
    c->reply = realloc(c->reply, c->len + size * n + 1);
    memcpy(c->reply + c->len, data, size * n);
    c->len += size * n;
    c->reply[c->len] = '\0';
    return size * n;
}

/* One request (a pthread start routine too). It sends the key the tests start servers with
 * (--api-key sk-1), which a server without keys does not look at. */
static inline void *sp_post(void *arg) {
    sp_call *c = arg;
    CURL *h = curl_easy_init();
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", c->port, c->path ? c->path : "/v1/completions");
    struct curl_slist *hdr = curl_slist_append(curl_slist_append(NULL, "Content-Type: application/json"),
                                               "Authorization: Bearer sk-1");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    if (c->body) curl_easy_setopt(h, CURLOPT_POSTFIELDS, c->body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sp_collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
    curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &c->status);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return NULL;
}

/* The value of the /metrics sample whose name and labels are `series` (e.g.
 * `vllm:num_requests_running{engine="0",model_name="m"}`), or -1 when there is none. */
static inline double sp_metric(int port, const char *series) {
    sp_call m = {.port = port, .path = "/metrics"};
    sp_post(&m);
    const char *at = m.reply ? m.reply : "";
    size_t n = strlen(series);
    double v = -1;
    for (; (at = strstr(at, series)); at += n)
        if ((at == m.reply || at[-1] == '\n') && at[n] == ' ') {
            v = strtod(at + n + 1, NULL);
            break;
        }
    free(m.reply);
    return v;
}

/* Waits (up to `seconds`) until the first engine's /metrics counts a request in its running batch:
 * the point after which a request is the server's to finish, whatever the machine's load. */
static inline bool sp_wait_running(int port, double seconds) {
    for (double t0 = sp_now(); sp_now() - t0 < seconds; usleep(20000)) {
        sp_call m = {.port = port, .path = "/metrics"};
        sp_post(&m);
        const char *at = m.reply ? strstr(m.reply, "\nvllm:num_requests_running{") : NULL;
        const char *end = at ? strchr(at, '}') : NULL;
        const bool running = end && strtod(end + 1, NULL) >= 1;
        free(m.reply);
        if (running) return true;
    }
    return false;
}

#endif
