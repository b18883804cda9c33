/*
 * test_tokenizer_cli.c — `cvllm tokenize` end to end: all 400 reference cases through --file (encode)
 * and --decode --file, --text both ways, and every usage and input error with its exact stderr line
 * and exit status. The binary runs with its output sent to files (no shell, so any text is safe).
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "check.h"
#include "testutil.h"

#define QWEN_DIR CVLLM_SOURCE_DIR "/models/qwen3-tokenizer"
#define CASES CVLLM_TEST_DATA "/tokenizer/qwen3-cases.jsonl"

static char tmp_dir[] = "/tmp/cvllm_tok_cli_XXXXXX";

static char *tmp_path(const char *name) { return cv_xasprintf("%s/%s", tmp_dir, name); }

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* Runs `cvllm tokenize ARGS...` (NULL-terminated) in tmp_dir; stdin from stdin_path when not NULL. */
static tu_run run(const char *stdin_path, const char *const *args) {
    const char *argv[32] = {"tokenize"};
    size_t n = 1;
    for (; args[n - 1] && n < 31; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    return tu_run_exec(tmp_dir, stdin_path, NULL, CVLLM_BINARY, argv);
}

/* Exact stdout; on a difference names the first line that differs instead of printing it all. */
static void check_same_output(const char *got, const char *want) {
    size_t line = 1, i = 0;
    while (got[i] && got[i] == want[i]) line += got[i++] == '\n';
    CHECK_MSG(got[i] == want[i], "stdout differs at line %zu (byte %zu)", line, i);
}

/* Runs and checks exit status, stdout (exact, or NULL to skip) and the first stderr line. */
static void expect(const char *stdin_path, const char *const *args, int status, const char *out,
                   const char *err_line) {
    tu_run r = run(stdin_path, args);
    CHECK_MSG(r.status == status, "%s %s: exit %d, want %d (%s)", args[0], args[1] ? args[1] : "",
              r.status, status, r.err);
    if (out) check_same_output(r.out, out);
    if (err_line) {
        char *nl = strchr(r.err, '\n');
        if (nl) *nl = '\0';
        CHECK_STR_EQ(r.err, err_line);
    } else {
        CHECK_STR_EQ(r.err, "");
    }
    tu_run_free(&r);
}

/* All reference cases through --file, and their ids back through --decode --file. */
static void test_reference_files(void) {
    FILE *f = fopen(CASES, "r");
    CHECK(f != NULL);
    if (!f) return;
    char *texts = NULL, *ids = NULL, *decoded = NULL, *line = NULL;
    size_t nt = 0, ct = 0, ni = 0, ci = 0, nd = 0, cd = 0, cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, f)) > 0) {
        json_t *c = json_loadb(line, (size_t)got, JSON_ALLOW_NUL, NULL);
        const char *keys[] = {"text", "ids", "decoded"};
        char **bufs[] = {&texts, &ids, &decoded};
        size_t *lens[] = {&nt, &ni, &nd}, *caps[] = {&ct, &ci, &cd};
        for (int k = 0; k < 3; k++) {
            char *s = json_dumps(json_object_get(c, keys[k]), JSON_COMPACT | JSON_ENCODE_ANY);
            size_t need = *lens[k] + strlen(s) + 2;
            if (need > *caps[k]) *bufs[k] = cv_xrealloc(*bufs[k], *caps[k] = 2 * need);
            *lens[k] += (size_t)sprintf(*bufs[k] + *lens[k], "%s\n", s);
            free(s);
        }
        json_decref(c);
    }
    free(line);
    fclose(f);
    char *texts_path = tmp_path("texts.jsonl"), *ids_path = tmp_path("ids.jsonl");
    write_text(texts_path, texts);
    write_text(ids_path, ids);
    expect(NULL, (const char *[]){QWEN_DIR, "--file", texts_path, NULL}, 0, ids, NULL);
    expect(texts_path, (const char *[]){QWEN_DIR, "--file", "-", NULL}, 0, ids, NULL);
    expect(NULL, (const char *[]){QWEN_DIR, "--decode", "--file", ids_path, NULL}, 0, decoded, NULL);
    free(texts_path);
    free(ids_path);
    free(texts);
    free(ids);
    free(decoded);
}

static void test_text(void) {
    expect(NULL, (const char *[]){QWEN_DIR, "--text", "Hello, world!", NULL}, 0,
           "[9707,11,1879,0]\n", NULL);
    expect(NULL, (const char *[]){QWEN_DIR, "--text=<think>\n</think>", NULL}, 0,
           "[151667,198,151668]\n", NULL);
    expect(NULL, (const char *[]){QWEN_DIR, "--text", "", NULL}, 0, "[]\n", NULL);
    expect(NULL, (const char *[]){QWEN_DIR, "--decode", "--text", "[151644, 9707, 11, 151645]", NULL},
           0, "\"<|im_start|>Hello,<|im_end|>\"\n", NULL);
    expect(NULL, (const char *[]){QWEN_DIR, "--decode", "--skip-special-tokens", "--text",
                                  "[151644, 9707, 11, 151667, 151645]", NULL},
           0, "\"Hello,<think>\"\n", NULL);
    tu_run r = run(NULL, (const char *[]){"--help", NULL});
    CHECK_EQ_INT(r.status, 0);
    CHECK_CONTAINS(r.out, "usage: cvllm tokenize MODEL");
    tu_run_free(&r);
}

static void test_errors(void) {
    char *bad_path = tmp_path("bad.jsonl"), *not_str = tmp_path("notstr.jsonl");
    char *bad_ids = tmp_path("badids.jsonl"), *bad_utf8 = tmp_path("badutf8.jsonl");
    write_text(bad_path, "\"ok\"\n\"unterminated\n");
    write_text(not_str, "\"a\"\n[1, 2]\n");
    write_text(bad_ids, "[9707]\n[9707, \"x\"]\n");
    write_text(bad_utf8, "\"\xff\"\n");
    char *msg_bad = cv_xasprintf("cvllm tokenize: %s:2: premature end of input near '\"unterminated'", bad_path);
    char *msg_not_str = cv_xasprintf("cvllm tokenize: %s:2: expected a JSON string", not_str);
    char *msg_bad_ids = cv_xasprintf("cvllm tokenize: %s:2: token ids must be integers", bad_ids);
    char *msg_bad_utf8 = cv_xasprintf("cvllm tokenize: %s:1: unable to decode byte 0xff near '\"'", bad_utf8);
    const struct {
        const char *args[8];
        int status;
        const char *out, *err;
    } cases[] = {
        {{NULL}, 2, "", "cvllm tokenize: no MODEL given"},
        {{QWEN_DIR, NULL}, 2, "", "cvllm tokenize: give exactly one of --text and --file"},
        {{QWEN_DIR, "--text", "a", "--file", "x", NULL}, 2, "",
         "cvllm tokenize: give exactly one of --text and --file"},
        {{QWEN_DIR, "--text", NULL}, 2, "", "cvllm tokenize: --text needs a value"},
        {{QWEN_DIR, "--text", "a", "--skip-special-tokens", NULL}, 2, "",
         "cvllm tokenize: --skip-special-tokens only applies with --decode"},
        {{QWEN_DIR, "--text", "a", "--bogus", NULL}, 2, "", "cvllm tokenize: unknown option --bogus (see cvllm tokenize --help)"},
        {{QWEN_DIR, "other", "--text", "a", NULL}, 2, "",
         "cvllm tokenize: unexpected argument 'other' (MODEL is '" QWEN_DIR "')"},
        {{"/nonexistent/model", "--text", "a", NULL}, 1, "",
         "cvllm tokenize: model /nonexistent/model: no such folder, and not a hub id (ORG/NAME)"},
        {{QWEN_DIR, "--text", "a\xff", NULL}, 1, "",
         "cvllm tokenize: invalid UTF-8 at byte offset 1 (0xff)"},
        {{QWEN_DIR, "--file", "/nonexistent.jsonl", NULL}, 1, "",
         "cvllm tokenize: cannot open /nonexistent.jsonl: No such file or directory"},
        {{QWEN_DIR, "--file", bad_path, NULL}, 1, "[562]\n", msg_bad},
        {{QWEN_DIR, "--file", "/", NULL}, 1, "", "cvllm tokenize: cannot read /: Is a directory"},
        {{QWEN_DIR, "--file", not_str, NULL}, 1, "[64]\n", msg_not_str},
        {{QWEN_DIR, "--file", bad_utf8, NULL}, 1, "", msg_bad_utf8},
        {{QWEN_DIR, "--decode", "--file", bad_ids, NULL}, 1, "\"Hello\"\n", msg_bad_ids},
        {{QWEN_DIR, "--decode", "--text", "[1,", NULL}, 1, "",
         "cvllm tokenize: --text: ']' expected near end of file"},
        {{QWEN_DIR, "--decode", "--text", "\"hi\"", NULL}, 1, "",
         "cvllm tokenize: --text: expected a JSON array of token ids"},
        {{QWEN_DIR, "--decode", "--text", "[1.5]", NULL}, 1, "",
         "cvllm tokenize: --text: token ids must be integers"},
        {{QWEN_DIR, "--decode", "--text", "[4294967296]", NULL}, 1, "",
         "cvllm tokenize: --text: token ids must be integers"},
        {{QWEN_DIR, "--decode", "--text", "[151669]", NULL}, 1, "",
         "cvllm tokenize: --text: token id 151669 at position 0 is out of range (vocabulary size 151669)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        expect(NULL, cases[i].args, cases[i].status, cases[i].out, cases[i].err);
    unlink(bad_path);
    unlink(not_str);
    unlink(bad_ids);
    unlink(bad_utf8);
    free(bad_path);
    free(not_str);
    free(bad_ids);
    free(bad_utf8);
    free(msg_bad);
    free(msg_not_str);
    free(msg_bad_ids);
    free(msg_bad_utf8);
}

int main(void) {
    CHECK(mkdtemp(tmp_dir) != NULL);
    test_text();
    test_errors();
    test_reference_files();
    const char *names[] = {"out", "err", "texts.jsonl", "ids.jsonl"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char *p = tmp_path(names[i]);
        unlink(p);
        free(p);
    }
    rmdir(tmp_dir);
    return cv_check_summary("test_tokenizer_cli");
}
