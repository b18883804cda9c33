/*
 * testutil.h — helpers shared by the tests: scratch folders, model folders assembled from the
 * reference checkpoints in tests/data plus the shipped tokenizer, reading small JSON and .npy files,
 * running the cvllm binary (through the shell or without one) and capturing what it printed.
 * Header-only (static functions) so each test program stays one file plus this.
 */
#ifndef CV_TESTUTIL_H
#define CV_TESTUTIL_H

#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A new string: fmt with the two strings a and b; free() it. */
static inline char *tu_strdupf(const char *fmt, const char *a, const char *b) {
    size_t n = (size_t)snprintf(NULL, 0, fmt, a, b) + 1;
    char *s = malloc(n);
    snprintf(s, n, fmt, a, b);
    return s;
}

/* A new empty folder under $TMPDIR (or /tmp); caller removes it with tu_remove_tree. */
static inline char *tu_make_temp_dir(void) {
    const char *base = getenv("TMPDIR");
    char *tmpl = tu_strdupf("%s/%s", base && *base ? base : "/tmp", "cvllm-test-XXXXXX");
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        exit(1);
    }
    return tmpl;
}

/* Removes DIR and everything in it (rm -rf). */
static inline void tu_remove_tree(const char *dir) {
    char *cmd = tu_strdupf("rm -rf '%s'%s", dir, "");
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
    free(cmd);
}

/* How many entries DIR holds besides . and .., or -1 when it cannot be read. */
static inline int tu_dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

/* A symbolic link DIR/NAME to target. */
static inline void tu_link(const char *target, const char *dir, const char *name) {
    char *path = tu_strdupf("%s/%s", dir, name);
    if (symlink(target, path) != 0) {
        perror(path);
        exit(1);
    }
    free(path);
}

/* Links the Qwen3 tokenizer that cvllm ships into model folder dir. */
static inline void tu_link_tokenizer(const char *dir) {
    static const char *tok[] = {"tokenizer.json", "tokenizer_config.json"};
    for (size_t i = 0; i < 2; i++) {
        char *t = tu_strdupf("%s/models/qwen3-tokenizer/%s", CVLLM_SOURCE_DIR, tok[i]);
        tu_link(t, dir, tok[i]);
        free(t);
    }
}

/* A model folder: config, generation config and weights of tests/data/vectors/NAME, with the Qwen3
 * tokenizer that cvllm ships. */
static inline char *tu_model_dir(const char *vector_name) {
    char *dir = tu_make_temp_dir();
    char *src = tu_strdupf("%s/vectors/%s", CVLLM_TEST_DATA, vector_name);
    static const char *files[] = {"config.json", "generation_config.json", "model.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char *t = tu_strdupf("%s/%s", src, files[i]);
        tu_link(t, dir, files[i]);
        free(t);
    }
    tu_link_tokenizer(dir);
    free(src);
    return dir;
}

/* A model folder as tu_model_dir(config_from) but with the weights of weights_from: with a dense
 * config over MoE weights, a model that passes every check of its config and fails only when its
 * tensors are bound (missing tensor ...layers.0...). */
static inline char *tu_model_dir_over(const char *config_from, const char *weights_from) {
    char *dir = tu_model_dir(config_from);
    char *weights = tu_strdupf("%s/%s", dir, "model.safetensors");
    char *target = tu_strdupf("%s/vectors/%s/model.safetensors", CVLLM_TEST_DATA, weights_from);
    if (unlink(weights) != 0) {
        perror(weights);
        exit(1);
    }
    tu_link(target, dir, "model.safetensors");
    free(target);
    free(weights);
    return dir;
}

/* Writes `text` to DIR/NAME. */
static inline void tu_write_file(const char *dir, const char *name, const char *text, size_t len) {
    char *path = tu_strdupf("%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(text, 1, len, f) != len) {
        perror(path);
        exit(1);
    }
    fclose(f);
    free(path);
}

/* The files that make DIR a sentence-transformers embedding model, as Qwen3-Embedding ships:
 * modules.json (Transformer, Pooling in 1_Pooling, Normalize) and 1_Pooling/config.json with
 * pooling_mode_MODE true ("lasttoken", "cls_token", "mean_tokens"). */
static inline void tu_write_sentence_transformers(const char *dir, const char *mode) {
    static const char modules[] =
        "[{\"idx\": 0, \"name\": \"0\", \"path\": \"\", \"type\": \"sentence_transformers.models.Transformer\"},"
        " {\"idx\": 1, \"name\": \"1\", \"path\": \"1_Pooling\", \"type\": \"sentence_transformers.models.Pooling\"},"
        " {\"idx\": 2, \"name\": \"2\", \"path\": \"2_Normalize\", \"type\": \"sentence_transformers.models.Normalize\"}]";
    tu_write_file(dir, "modules.json", modules, strlen(modules));
    char *pool_dir = tu_strdupf("%s/%s", dir, "1_Pooling");
    if (mkdir(pool_dir, 0755) != 0) {
        perror(pool_dir);
        exit(1);
    }
    char *config = tu_strdupf("{\"word_embedding_dimension\": 64, \"pooling_mode_%s\": true}", mode, "");
    tu_write_file(pool_dir, "config.json", config, strlen(config));
    free(config);
    free(pool_dir);
}

/* Reads tests/data/vectors/NAME/ref.CASE.json. */
static inline json_t *tu_load_ref(const char *vector_name, const char *ref_case) {
    char *dir = tu_strdupf("%s/vectors/%s", CVLLM_TEST_DATA, vector_name);
    char *path = tu_strdupf("%s/ref.%s.json", dir, ref_case);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) {
        fprintf(stderr, "%s: %s\n", path, err.text);
        exit(1);
    }
    free(dir);
    free(path);
    return j;
}

/* An int array of a JSON array field; *n gets its length. */
static inline int32_t *tu_json_ids(const json_t *obj, const char *key, size_t *n) {
    const json_t *a = json_object_get(obj, key);
    *n = json_array_size(a);
    int32_t *ids = malloc((*n ? *n : 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return ids;
}

/* Loads a float32 C-order .npy file; *rows × *cols (1-D arrays give rows = 1). */
static inline float *tu_load_npy(const char *path, size_t *rows, size_t *cols) {
    FILE *f = fopen(path, "rb");
    unsigned char pre[10];
    if (!f || fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        fprintf(stderr, "%s: not a .npy file\n", path);
        exit(1);
    }
    size_t hlen = pre[6] == 1 ? (size_t)(pre[8] | pre[9] << 8) : 0;
    if (pre[6] != 1) {
        unsigned char more[2];
        if (fread(more, 1, 2, f) != 2) exit(1);
        hlen = (size_t)(pre[8] | pre[9] << 8 | more[0] << 16 | more[1] << 24);
    }
    char *header = calloc(1, hlen + 1);
    if (fread(header, 1, hlen, f) != hlen || !strstr(header, "'<f4'") || strstr(header, "True")) {
        fprintf(stderr, "%s: expected little-endian float32 in C order\n", path);
        exit(1);
    }
    const char *shape = strstr(header, "'shape': (");
    long r = 1, c = 1;
    if (!shape || sscanf(shape, "'shape': (%ld, %ld)", &r, &c) < 1) exit(1);
    if (!strchr(shape, ',') || strstr(shape, ",)")) c = r, r = 1;
    free(header);
    *rows = (size_t)r;
    *cols = (size_t)c;
    float *data = malloc(*rows * *cols * sizeof *data);
    if (fread(data, sizeof *data, *rows * *cols, f) != *rows * *cols) exit(1);
    fclose(f);
    return data;
}

/* Loads tests/data/vectors/NAME/FILE (a float32 .npy file) as tu_load_npy does. */
static inline float *tu_load_ref_npy(const char *vector_name, const char *file, size_t *rows, size_t *cols) {
    char *dir = tu_strdupf("%s/vectors/%s", CVLLM_TEST_DATA, vector_name);
    char *path = tu_strdupf("%s/%s", dir, file);
    float *d = tu_load_npy(path, rows, cols);
    free(dir);
    free(path);
    return d;
}

/* The whole file as a string ("" when it cannot be read); free() it. */
static inline char *tu_read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    char *s = NULL;
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (s = calloc(1, (size_t)n + 1)) && fread(s, 1, (size_t)n, f) != (size_t)n)
        s[0] = '\0';
    if (f) fclose(f);
    return s ? s : calloc(1, 1);
}

/* One run of a program: exit status (-1 when it did not exit), stdout, stderr, and its peak resident
 * memory (what "refused before allocating" means, measured without depending on the clock). */
typedef struct tu_run {
    int status;
    char *out, *err;
    long max_rss_kib;
} tu_run;

/* Waits for child `pid`: its wait status (-1 when the fork or the wait failed) and peak RSS, which
 * wait4 reports for the child and the children it waited for (a shell and its command). */
static inline int tu_wait(pid_t pid, long *max_rss_kib) {
    struct rusage ru = {0};
    int st = -1;
    if (pid <= 0 || wait4(pid, &st, 0, &ru) != pid) st = -1;
    *max_rss_kib = ru.ru_maxrss;
    return st;
}

/* The result of a run that ended with wait status st; its output from DIR/out, DIR/err. */
static inline tu_run tu_run_result(const char *dir, int st, long max_rss_kib) {
    tu_run r = {.status = st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1, .max_rss_kib = max_rss_kib};
    char *p = tu_strdupf("%s/%s", dir, "out");
    r.out = tu_read_text(p);
    free(p);
    p = tu_strdupf("%s/%s", dir, "err");
    r.err = tu_read_text(p);
    free(p);
    return r;
}

/* Runs `ENV cvllm ARGS` through the shell (ENV: assignments such as "HF_HUB_OFFLINE=1", or ""),
 * with stdout and stderr in files under `tmp`. */
static inline tu_run tu_run_cvllm(const char *tmp, const char *env, const char *args) {
    size_t n = (size_t)snprintf(NULL, 0, "%s %s %s >%s/out 2>%s/err", env, CVLLM_BINARY, args, tmp, tmp) + 1;
    char *cmd = malloc(n);
    snprintf(cmd, n, "%s %s %s >%s/out 2>%s/err", env, CVLLM_BINARY, args, tmp, tmp);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    long rss = 0;
    int st = tu_wait(pid, &rss);
    free(cmd);
    return tu_run_result(tmp, st, rss);
}

/* Runs PROG (a path, or a name looked up in PATH) with ARGS (NULL-terminated) without a shell, so
 * no argument needs quoting: in the folder DIR, stdin from the file IN (NULL: /dev/null), stdout and
 * stderr in DIR/out and DIR/err, after applying ENV (NULL-terminated, may be NULL: "K=V" sets K, a
 * bare "K" unsets it). */
static inline tu_run tu_run_exec(const char *dir, const char *in, const char *const *env, const char *prog,
                                 const char *const *args) {
    size_t n = 0;
    while (args[n]) n++;
    const char **argv = calloc(n + 2, sizeof *argv);
    argv[0] = prog;
    memcpy(argv + 1, args, (n + 1) * sizeof *argv);
    char *out = tu_strdupf("%s/%s", dir, "out"), *err = tu_strdupf("%s/%s", dir, "err");
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int fi = open(in ? in : "/dev/null", O_RDONLY);
        int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fi < 0 || fo < 0 || fe < 0 || dup2(fi, 0) < 0 || dup2(fo, 1) < 0 || dup2(fe, 2) < 0 || chdir(dir) != 0)
            _exit(127);
        for (; env && *env; env++)
            if (strchr(*env, '=')) putenv((char *)*env);
            else unsetenv(*env);
        execvp(prog, (char *const *)argv);
        _exit(127);
    }
    long rss = 0;
    int st = tu_wait(pid, &rss);
    free(argv);
    free(out);
    free(err);
    return tu_run_result(dir, st, rss);
}

/* Frees a run's captured output. */
static inline void tu_run_free(tu_run *r) {
    free(r->out);
    free(r->err);
}

/* The last line of s, a pointer into s (log lines come before a command's error line); it keeps
 * the trailing newline(s). */
static inline const char *tu_last_line(const char *s) {
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == '\n') n--;
    while (n > 0 && s[n - 1] != '\n') n--;
    return s + n;
}

#endif
