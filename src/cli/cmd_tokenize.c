/*
 * cmd_tokenize.c — `cvllm tokenize MODEL`: the model's tokenizer from the command line.
 *
 *   cvllm tokenize MODEL --text T            one JSON array of ids
 *   cvllm tokenize MODEL --file F            F: one JSON string a line → one JSON array a line
 *   cvllm tokenize MODEL --decode --text '[9707, 11]' [--skip-special-tokens]
 *   cvllm tokenize MODEL --decode --file F   F: one JSON array of ids a line → one JSON string a line
 *
 * --text is taken literally when encoding (the shell already delivers a string); file lines are
 * JSON so that any text, newlines and NULs included, fits on one line (and NULs survive decoding).
 * `--file -` reads stdin.
 * Output is compact JSON with UTF-8 kept as is. The first bad line stops the run with
 * "cvllm tokenize: F:LINE: reason" and exit status 1 (usage errors: 2), after the lines before it
 * were printed, so a caller can tell exactly where it stopped.
 */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cvllm.h"
#include "tokenizer/tokenizer.h"

static const char usage[] =
    "usage: cvllm tokenize MODEL (--text TEXT | --file FILE) [--decode [--skip-special-tokens]]\n"
    "  --text TEXT             text to encode (with --decode: a JSON array of ids)\n"
    "  --file FILE             one JSON string per line (with --decode: one JSON array of ids per\n"
    "                          line); '-' reads stdin. Output: one JSON line per input line\n"
    "  --decode                turn ids back into text\n"
    "  --skip-special-tokens   with --decode: drop special tokens (<|im_end|>, ...)\n";

typedef struct tokenize_args {
    const char *model, *text, *file;
    bool decode, skip_special;
} tokenize_args;

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("cvllm tokenize: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

/* 0: run; -1: --help was printed; otherwise the usage-error exit status. */
static int parse_args(cv_args *a, tokenize_args *t) {
    while (a->i < a->argc && !a->failed) {
        const char *arg = a->argv[a->i];
        if (cv_args_flag(a, "--help|-h")) {
            fputs(usage, stdout);
            return -1;
        }
        if (cv_args_value(a, "--text", &t->text) || cv_args_value(a, "--file", &t->file)) continue;
        if (cv_args_flag(a, "--decode")) {
            t->decode = true;
        } else if (cv_args_flag(a, "--skip-special-tokens")) {
            t->skip_special = true;
        } else if (arg[0] == '-' && arg[1] != '\0') {
            if (!cv_args_unknown(a)) return 2;
        } else if (t->model) {
            return cv_args_error(a, "unexpected argument '%s' (MODEL is '%s')", arg, t->model);
        } else {
            t->model = arg;
            a->i++;
        }
    }
    if (a->failed) return 2;
    if (!t->model) return cv_args_error(a, "no MODEL given\n%s", usage);
    if (!t->text == !t->file) return cv_args_error(a, "give exactly one of --text and --file");
    if (t->skip_special && !t->decode)
        return cv_args_error(a, "--skip-special-tokens only applies with --decode");
    return 0;
}

static void print_json(json_t *v) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    puts(s);
    free(s);
    json_decref(v);
}

static int encode_one(const cvllm_tokenizer *tok, const char *text, size_t len) {
    int32_t *ids;
    size_t n;
    if (cvllm_tokenize(tok, text, len, &ids, &n) != CVLLM_OK) return -1;
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(arr, json_integer(ids[i]));
    cvllm_free(ids);
    print_json(arr);
    return 0;
}

/* Ids from a JSON array; the reason for a bad one goes to *why. */
static int32_t *parse_ids(const json_t *arr, size_t *n, const char **why) {
    if (!json_is_array(arr)) {
        *why = "expected a JSON array of token ids";
        return NULL;
    }
    *n = json_array_size(arr);
    int32_t *ids = cv_xmalloc((*n ? *n : 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++) {
        const json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN ||
            json_integer_value(v) > INT32_MAX) {
            *why = "token ids must be integers";
            free(ids);
            return NULL;
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    return ids;
}

static int decode_one(const cvllm_tokenizer *tok, const json_t *arr, const tokenize_args *t,
                      const char **why) {
    size_t n = 0;
    int32_t *ids = parse_ids(arr, &n, why);
    if (!ids) return -1;
    /* The internal call, because decoded text may contain NULs and cvllm_detokenize() returns a
     * C string without its length (a cvllm_tokenizer is a cv_tokenizer, see tokenizer.h). */
    char *text;
    size_t len;
    int rc = cv_tokenizer_decode((const cv_tokenizer *)tok, ids, n, t->skip_special, &text, &len);
    free(ids);
    if (rc != CVLLM_OK) {
        *why = cvllm_last_error();
        return -1;
    }
    print_json(json_stringn(text, len));
    free(text);
    return 0;
}

static int run_text(const cvllm_tokenizer *tok, const tokenize_args *t) {
    if (!t->decode)
        return encode_one(tok, t->text, strlen(t->text)) ? fail("%s", cvllm_last_error()) : 0;
    json_error_t err;
    json_t *arr = json_loads(t->text, JSON_DECODE_ANY, &err);
    if (!arr) return fail("--text: %s", err.text);
    const char *why = NULL;
    int rc = decode_one(tok, arr, t, &why);
    json_decref(arr);
    return rc ? fail("--text: %s", why) : 0;
}

/* One line of --file: parse, then encode or decode it. */
static int run_line(const cvllm_tokenizer *tok, const tokenize_args *t, const char *line,
                    size_t len, const char **why) {
    json_error_t err;
    json_t *v = json_loadb(line, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    static char msg[256];
    if (!v) {
        snprintf(msg, sizeof msg, "%s", err.text);
        *why = msg;
        return -1;
    }
    int rc;
    if (t->decode) {
        rc = decode_one(tok, v, t, why);
    } else if (!json_is_string(v)) {
        *why = "expected a JSON string";
        rc = -1;
    } else {
        rc = encode_one(tok, json_string_value(v), json_string_length(v));
        if (rc) *why = cvllm_last_error();
    }
    json_decref(v);
    return rc;
}

static int run_file(const cvllm_tokenizer *tok, const tokenize_args *t) {
    bool is_stdin = strcmp(t->file, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(t->file, "r");
    if (!f) return fail("cannot open %s: %s", t->file, strerror(errno));
    char *line = NULL;
    size_t cap = 0, line_no = 0;
    ssize_t n;
    int status = 0;
    while (status == 0 && (n = getline(&line, &cap, f)) >= 0) {
        line_no++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;
        const char *why = NULL;
        if (run_line(tok, t, line, (size_t)n, &why)) status = fail("%s:%zu: %s", t->file, line_no, why);
    }
    if (status == 0 && ferror(f)) status = fail("cannot read %s: %s", t->file, strerror(errno));
    free(line);
    if (!is_stdin) fclose(f);
    return status;
}

int cmd_tokenize(int argc, char **argv) {
    tokenize_args t = {0};
    cv_args a;
    int rc = cv_args_init(&a, "tokenize", argc, argv);
    if (rc == 0) rc = parse_args(&a, &t);
    cvllm_tokenizer *tok = NULL;
    if (rc == 0 && cvllm_tokenizer_create(t.model, &tok) != CVLLM_OK) rc = fail("%s", cvllm_last_error());
    else if (rc == 0) rc = t.file ? run_file(tok, &t) : run_text(tok, &t);
    cvllm_tokenizer_destroy(tok);
    cv_args_free(&a);
    return rc < 0 ? 0 : rc;
}
