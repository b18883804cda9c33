/*
 * test_download.c — cv_hub_resolve against a local stand-in for the hub (tests/tools/hf_server.py).
 *
 * The test writes a small repository (a real safetensors checkpoint plus configs and files the
 * loader must skip) into a mkdtemp folder, starts the server on 127.0.0.1 with an ephemeral port,
 * points HF_ENDPOINT at it and HF_HUB_CACHE at fresh folders, and checks: folder paths, bad ids,
 * offline and no-network errors, a download with and without weights (files byte-identical,
 * refs/main written, the cache reused afterwards with the server gone), resuming after a cut
 * connection and from a leftover .incomplete file, a 401 without (or with a wrong) token, 404s,
 * and the ModelScope API. alarm() bounds the whole run; the servers die with the test
 * (PR_SET_PDEATHSIG) or after their --lifetime.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "check.h"
#include "loader/hub.h"
#include "loader/safetensors.h"

#define REPO "org/tiny-model"
#define SHA "0123456789abcdef0123456789abcdef01234567"

static char tmp_root[256];

/* ------------------------------------------------------------------------------------------------ */
/* Files                                                                                             */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_tree(const char *dir) { nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

static char *tmp_path(const char *name) { return cv_xasprintf("%s/%s", tmp_root, name); }

static void write_file(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    CHECK(fp != NULL);
    if (!fp) return;
    CHECK(fwrite(data, 1, n, fp) == n);
    fclose(fp);
}

static char *read_file(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = cv_xmalloc((size_t)len + 1);
    *n = fread(buf, 1, (size_t)len, fp);
    buf[*n] = '\0';
    fclose(fp);
    return buf;
}

static bool exists(const char *dir, const char *name) {
    char *p = cv_xasprintf("%s/%s", dir, name);
    struct stat st;
    bool ok = stat(p, &st) == 0;
    free(p);
    return ok;
}

/* FILE in `got_dir` is byte-identical to FILE in the source repository. */
static bool same_file(const char *src_dir, const char *got_dir, const char *name) {
    char *a = cv_xasprintf("%s/%s", src_dir, name), *b = cv_xasprintf("%s/%s", got_dir, name);
    size_t na = 0, nb = 0;
    char *da = read_file(a, &na), *db = read_file(b, &nb);
    bool same = da && db && na == nb && memcmp(da, db, na) == 0;
    free(a), free(b), free(da), free(db);
    return same;
}

/* The source repository: a valid 1 MiB safetensors checkpoint, configs, and files to skip. */
static char *make_repo(void) {
    char *src = tmp_path("src");
    CHECK(mkdir(src, 0755) == 0);
    char *sub = cv_xasprintf("%s/extra", src);
    CHECK(mkdir(sub, 0755) == 0);
    free(sub);
    const char *files[][2] = {
        {"config.json", "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":64}"},
        {"generation_config.json", "{\"eos_token_id\":[1,2]}"},
        {"tokenizer.json", "{\"model\":{\"type\":\"BPE\"}}"},
        {"tokenizer_config.json", "{}"},
        {"README.md", "# tiny"},
        {"pytorch_model.bin", "not wanted"},
        {"extra/notes.safetensors", "not wanted either"},
    };
    for (size_t i = 0; i < CV_ARRAY_LEN(files); i++) {
        char *p = cv_xasprintf("%s/%s", src, files[i][0]);
        write_file(p, files[i][1], strlen(files[i][1]));
        free(p);
    }
    const char header[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[512,512],\"data_offsets\":[0,1048576]}}";
    size_t hl = (sizeof header - 1 + 7) / 8 * 8, total = 8 + hl + 1048576;
    unsigned char *buf = cv_xmalloc(total);
    memset(buf, ' ', 8 + hl);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, sizeof header - 1);
    for (size_t i = 8 + hl; i < total; i++) buf[i] = (unsigned char)(i * 2654435761u >> 13);
    char *p = cv_xasprintf("%s/model.safetensors", src);
    write_file(p, buf, total);
    free(p);
    free(buf);
    return src;
}

/* ------------------------------------------------------------------------------------------------ */
/* Server                                                                                            */

typedef struct server {
    pid_t pid;
    int port;
    char endpoint[64];
} server;

/* Starts hf_server.py with extra arguments (NULL-terminated); port 0 on failure. */
static server start_server(const char *root, const char *const *extra) {
    server s = {0};
    int fds[2];
    if (pipe(fds) != 0) return s;
    const char *argv[24] = {"python3", CVLLM_SOURCE_DIR "/tests/tools/hf_server.py", "--root", root,
                            "--repo", REPO, "--sha", SHA, "--lifetime", "90"};
    int argc = 10;
    for (; extra && *extra && argc < 22; extra++) argv[argc++] = *extra;
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execvp("python3", (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    char line[32] = {0};
    size_t n = 0;
    struct pollfd pfd = {fds[0], POLLIN, 0};
    while (n < sizeof line - 1 && !memchr(line, '\n', n) && poll(&pfd, 1, 10000) > 0) {
        ssize_t got = read(fds[0], line + n, sizeof line - 1 - n);
        if (got <= 0) break;
        n += (size_t)got;
    }
    close(fds[0]);
    s.pid = pid;
    s.port = atoi(line);
    snprintf(s.endpoint, sizeof s.endpoint, "http://127.0.0.1:%d", s.port);
    CHECK_MSG(s.port > 0, "hf_server.py did not start (is python3 installed?)");
    return s;
}

static void stop_server(server *s) {
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        waitpid(s->pid, NULL, 0);
    }
    s->pid = 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Cases                                                                                             */

static const cv_hub_options download_all = {.allow_download = true, .weights = true};
static const cv_hub_options download_configs = {.allow_download = true, .weights = false};
static const cv_hub_options cache_only = {.allow_download = false, .weights = true};

static char *use_cache(const char *name) {
    char *cache = tmp_path(name);
    setenv("HF_HUB_CACHE", cache, 1);
    return cache;
}

static void expect_resolve_error(const char *model, const cv_hub_options *opts, int code, const char *needle) {
    char *dir = (char *)"unchanged";
    cv_error_clear();
    CHECK_EQ_INT(cv_hub_resolve(model, opts, &dir), code);
    CHECK(dir == NULL);
    CHECK_CONTAINS(cv_error_message(), needle);
}

static void test_local_and_invalid(const char *src) {
    char *dir;
    CHECK_EQ_INT(cv_hub_resolve(src, &cache_only, &dir), 0);
    CHECK_STR_EQ(dir, src);
    free(dir);
    char *file = cv_xasprintf("%s/config.json", src);
    expect_resolve_error(file, &download_all, CVLLM_ERR_INVALID_ARGUMENT, "config.json is a file; give its folder");
    free(file);
    expect_resolve_error("a/b/c", &download_all, CVLLM_ERR_NOT_FOUND, "model a/b/c: no such folder, and not a hub id");
    expect_resolve_error("../x", &download_all, CVLLM_ERR_NOT_FOUND, "not a hub id");
    expect_resolve_error("org/-x", &download_all, CVLLM_ERR_NOT_FOUND, "not a hub id");
    expect_resolve_error("/no/such/folder", &download_all, CVLLM_ERR_NOT_FOUND, "not a hub id");
    cv_hub_options bad_rev = download_all;
    bad_rev.revision = "../../etc";
    expect_resolve_error(REPO, &bad_rev, CVLLM_ERR_INVALID_ARGUMENT, "invalid revision \"../../etc\"");
}

static void test_no_cache_no_network(void) {
    char *cache = use_cache("cache-empty");
    expect_resolve_error(REPO, &cache_only, CVLLM_ERR_NOT_FOUND, "not in the Hugging Face cache (");
    expect_resolve_error(REPO, &cache_only, CVLLM_ERR_NOT_FOUND, "cache-empty); downloads are disabled");
    setenv("HF_HUB_OFFLINE", "1", 1);
    expect_resolve_error(REPO, &download_all, CVLLM_ERR_NETWORK, "cannot download " REPO ": HF_HUB_OFFLINE is set");
    unsetenv("HF_HUB_OFFLINE");
    setenv("HF_ENDPOINT", "http://127.0.0.1:1", 1); /* nothing listens on port 1 */
    expect_resolve_error(REPO, &download_all, CVLLM_ERR_NETWORK, "cannot download " REPO ": no network (");
    CHECK(strchr(cv_error_message(), '\n') == NULL);
    free(cache);
}

static void test_download_and_cache(const char *src) {
    char *cache = use_cache("cache-hf");
    char *log = tmp_path("hf.log");
    server s = start_server(src, (const char *[]){"--log", log, NULL});
    setenv("HF_ENDPOINT", s.endpoint, 1);
    char *want = cv_xasprintf("%s/models--org--tiny-model/snapshots/" SHA, cache);

    char *dir = NULL;
    CHECK_EQ_INT(cv_hub_resolve(REPO, &download_configs, &dir), 0);
    CHECK_STR_EQ(dir, want);
    if (dir) {
        CHECK(same_file(src, dir, "config.json"));
        CHECK(same_file(src, dir, "generation_config.json"));
        CHECK(same_file(src, dir, "tokenizer.json"));
        CHECK(same_file(src, dir, "tokenizer_config.json"));
        CHECK(!exists(dir, "model.safetensors")); /* weights not asked for */
        CHECK(!exists(dir, "README.md") && !exists(dir, "pytorch_model.bin") && !exists(dir, "extra"));
    }
    free(dir);
    char *ref = cv_xasprintf("%s/models--org--tiny-model/refs/main", cache);
    size_t n;
    char *commit = read_file(ref, &n);
    CHECK_STR_EQ(commit, SHA);
    free(commit);
    free(ref);

    /* The cached snapshot lacks weights, so asking for them downloads the rest. */
    CHECK_EQ_INT(cv_hub_resolve(REPO, &download_all, &dir), 0);
    CHECK_STR_EQ(dir, want);
    if (dir) {
        CHECK(same_file(src, dir, "model.safetensors"));
        CHECK(!exists(dir, "model.safetensors.incomplete"));
        cv_checkpoint *ck;
        CHECK_EQ_INT(cv_checkpoint_open(dir, &ck), 0);
        if (ck) CHECK(cv_checkpoint_find(ck, "w") != NULL);
        cv_checkpoint_close(ck);
    }
    free(dir);

    expect_resolve_error("org/missing", &download_all, CVLLM_ERR_NOT_FOUND, "HTTP 404 from");
    cv_hub_options rev = download_all;
    rev.revision = "no-such-branch";
    expect_resolve_error(REPO, &rev, CVLLM_ERR_NOT_FOUND, "/revision/no-such-branch (no such repository");
    stop_server(&s);

    /* Server gone: the cache answers, by branch and by commit, offline or not. */
    CHECK_EQ_INT(cv_hub_resolve(REPO, &cache_only, &dir), 0);
    CHECK_STR_EQ(dir, want);
    free(dir);
    setenv("HF_HUB_OFFLINE", "1", 1);
    rev.revision = SHA;
    CHECK_EQ_INT(cv_hub_resolve(REPO, &rev, &dir), 0);
    CHECK_STR_EQ(dir, want);
    free(dir);
    unsetenv("HF_HUB_OFFLINE");

    size_t log_len;
    char *requests = read_file(log, &log_len);
    CHECK_CONTAINS(requests, "GET /api/models/org/tiny-model/revision/main range=-");
    CHECK_CONTAINS(requests, "GET /org/tiny-model/resolve/" SHA "/config.json range=-");
    free(requests);
    free(want);
    free(log);
    free(cache);
}

static void test_resume(const char *src) {
    char *log = tmp_path("resume.log");
    server s = start_server(src, (const char *[]){"--log", log, "--cut-once", "model.safetensors", NULL});
    setenv("HF_ENDPOINT", s.endpoint, 1);

    /* The connection drops halfway through model.safetensors; the retry resumes from there. */
    char *cache = use_cache("cache-resume");
    char *dir = NULL;
    CHECK_EQ_INT(cv_hub_resolve(REPO, &download_all, &dir), 0);
    if (dir) {
        CHECK(same_file(src, dir, "model.safetensors"));
        CHECK(!exists(dir, "model.safetensors.incomplete"));
    }
    free(dir);
    size_t n;
    char *requests = read_file(log, &n);
    CHECK_CONTAINS(requests, "model.safetensors range=bytes=");
    free(requests);
    free(cache);

    /* A leftover partial file from an earlier run is continued, not restarted. */
    cache = use_cache("cache-partial");
    char *snap = cv_xasprintf("%s/models--org--tiny-model/snapshots/" SHA, cache);
    char *cmd = cv_xasprintf("mkdir -p '%s' && head -c 1000 '%s/model.safetensors' > '%s/model.safetensors.incomplete'",
                             snap, src, snap);
    CHECK(system(cmd) == 0);
    CHECK_EQ_INT(cv_hub_resolve(REPO, &download_all, &dir), 0);
    if (dir) CHECK(same_file(src, dir, "model.safetensors"));
    free(dir);
    requests = read_file(log, &n);
    CHECK_CONTAINS(requests, "model.safetensors range=bytes=1000-");
    free(requests);
    free(cmd);
    free(snap);
    free(cache);

    /* A partial file longer than the real one (416) is thrown away and fetched again. */
    cache = use_cache("cache-toolong");
    snap = cv_xasprintf("%s/models--org--tiny-model/snapshots/" SHA, cache);
    cmd = cv_xasprintf("mkdir -p '%s' && head -c 2000000 /dev/zero > '%s/model.safetensors.incomplete'", snap, snap);
    CHECK(system(cmd) == 0);
    CHECK_EQ_INT(cv_hub_resolve(REPO, &download_all, &dir), 0);
    if (dir) CHECK(same_file(src, dir, "model.safetensors"));
    free(dir);
    free(cmd);
    free(snap);
    free(cache);
    stop_server(&s);
    free(log);
}

static void test_token(const char *src) {
    server s = start_server(src, (const char *[]){"--token", "s3cret", NULL});
    setenv("HF_ENDPOINT", s.endpoint, 1);
    char *cache = use_cache("cache-token");
    unsetenv("HF_TOKEN");
    expect_resolve_error(REPO, &download_all, CVLLM_ERR_NOT_FOUND, "cannot download " REPO ": HTTP 401 from");
    CHECK_CONTAINS(cv_error_message(), "set HF_TOKEN");
    setenv("HF_TOKEN", "wrong", 1);
    expect_resolve_error(REPO, &download_all, CVLLM_ERR_NOT_FOUND, "HF_TOKEN was not accepted");
    setenv("HF_TOKEN", "s3cret", 1);
    char *dir = NULL;
    CHECK_EQ_INT(cv_hub_resolve(REPO, &download_all, &dir), 0);
    if (dir) CHECK(same_file(src, dir, "model.safetensors") && same_file(src, dir, "config.json"));
    free(dir);
    unsetenv("HF_TOKEN");
    /* vLLM's --hf-token TOKEN, over a wrong HF_TOKEN; and --download-dir, the cache those files go to
     * whatever HF_HUB_CACHE says */
    setenv("HF_TOKEN", "wrong", 1);
    char *elsewhere = tmp_path("download-dir");
    cv_hub_options given = download_all;
    given.token = "s3cret";
    given.cache_dir = elsewhere;
    CHECK_EQ_INT(cv_hub_resolve(REPO, &given, &dir), 0);
    char *want = cv_xasprintf("%s/models--org--tiny-model/snapshots/" SHA, elsewhere);
    CHECK_STR_EQ(dir, want);
    if (dir) CHECK(same_file(src, dir, "model.safetensors"));
    free(dir);
    free(want);
    free(elsewhere);
    unsetenv("HF_TOKEN");
    /* without HF_TOKEN, the token `huggingface-cli login` stored */
    char *token_file = tmp_path("stored-token");
    write_file(token_file, "s3cret\n", 7);
    setenv("HF_TOKEN_PATH", token_file, 1);
    char *fresh = use_cache("cache-stored-token");
    CHECK_EQ_INT(cv_hub_resolve(REPO, &download_all, &dir), 0);
    free(dir);
    setenv("HF_TOKEN_PATH", "/nonexistent/token", 1);
    free(fresh);
    free(token_file);
    stop_server(&s);
    free(cache);
}

static void test_modelscope(const char *src) {
    server s = start_server(src, NULL);
    setenv("VLLM_USE_MODELSCOPE", "True", 1);
    setenv("MODELSCOPE_DOMAIN", s.endpoint, 1);
    setenv("HF_ENDPOINT", "http://127.0.0.1:1", 1); /* must not be used */
    char *cache = use_cache("cache-ms");
    char *dir = NULL;
    CHECK_EQ_INT(cv_hub_resolve(REPO, &download_all, &dir), 0);
    char *want = cv_xasprintf("%s/models--org--tiny-model/snapshots/master", cache);
    CHECK_STR_EQ(dir, want);
    if (dir) {
        CHECK(same_file(src, dir, "model.safetensors"));
        CHECK(same_file(src, dir, "tokenizer.json"));
        CHECK(!exists(dir, "README.md"));
    }
    free(dir);
    expect_resolve_error("org/missing", &download_all, CVLLM_ERR_NOT_FOUND, "HTTP 404 from");
    CHECK_CONTAINS(cv_error_message(), "/api/v1/models/org/missing/repo/files?Revision=master");
    stop_server(&s);
    CHECK_EQ_INT(cv_hub_resolve(REPO, &cache_only, &dir), 0);
    CHECK_STR_EQ(dir, want);
    free(dir);
    unsetenv("VLLM_USE_MODELSCOPE");
    unsetenv("MODELSCOPE_DOMAIN");
    free(want);
    free(cache);
}

int main(void) {
    alarm(120);
    snprintf(tmp_root, sizeof tmp_root, "%s/cvllm-download-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmp_root)) {
        perror("mkdtemp");
        return 1;
    }
    unsetenv("HF_TOKEN");
    unsetenv("HUGGING_FACE_HUB_TOKEN");
    setenv("HF_TOKEN_PATH", "/nonexistent/token", 1); /* no login token of this machine's */
    unsetenv("HF_HUB_OFFLINE");
    unsetenv("VLLM_USE_MODELSCOPE");
    setenv("HF_HUB_DOWNLOAD_TIMEOUT", "5", 1);
    setenv("CVLLM_LOG_LEVEL", "warning", 1);
    char *src = make_repo();
    test_local_and_invalid(src);
    test_no_cache_no_network();
    test_download_and_cache(src);
    test_resume(src);
    test_token(src);
    test_modelscope(src);
    free(src);
    remove_tree(tmp_root);
    return cv_check_summary("test_download");
}
