/*
 * tokenizer_bench.c — encode and decode throughput of the tokenizer.
 *
 * The input is the texts of the reference cases (English, code, CJK, emoji, whitespace oddities,
 * special tokens) joined by newlines and repeated up to the requested size, so the mix is the one
 * the exactness tests cover. Reports the best of a few runs, in tokens/s and MB/s of UTF-8 input.
 *
 *   bench_tokenizer [MODEL_DIR] [MEGABYTES]     (defaults: models/qwen3-tokenizer, 8)
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/timeutil.h"
#include "base/utf8.h"
#include "tokenizer/tokenizer.h"

#define RUNS 3

static char *corpus(const char *path, size_t *len) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "bench_tokenizer: cannot open %s\n", path);
        return NULL;
    }
    char *out = NULL, *line = NULL;
    size_t n = 0, cap = 0, line_cap = 0;
    ssize_t got;
    while ((got = getline(&line, &line_cap, f)) > 0) {
        json_t *c = json_loadb(line, (size_t)got, 0, NULL);
        const json_t *t = json_object_get(c, "text");
        if (t) {
            cv_buf_append(&out, &n, &cap, json_string_value(t), json_string_length(t));
            cv_buf_append(&out, &n, &cap, "\n", 1);
        }
        json_decref(c);
    }
    free(line);
    fclose(f);
    *len = n;
    return out;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : CVLLM_SOURCE_DIR "/models/qwen3-tokenizer";
    double mb = argc > 2 ? atof(argv[2]) : 8;
    cv_tokenizer *tok;
    double t0 = cv_now();
    if (cv_tokenizer_load(dir, &tok)) {
        fprintf(stderr, "bench_tokenizer: %s\n", cv_error_message());
        return 1;
    }
    printf("load: %.3f s\n", cv_now() - t0);
    size_t unit_len;
    char *unit = corpus(CVLLM_SOURCE_DIR "/tests/data/tokenizer/qwen3-cases.jsonl", &unit_len);
    if (!unit || unit_len == 0) return 1;
    char *text = NULL;
    size_t len = 0, cap = 0;
    while ((double)len < mb * 1e6) cv_buf_append(&text, &len, &cap, unit, unit_len);

    double best_enc = 1e30, best_dec = 1e30;
    int32_t *ids = NULL;
    size_t n = 0;
    for (int run = 0; run < RUNS; run++) {
        free(ids);
        t0 = cv_now();
        if (cv_tokenizer_encode(tok, text, len, &ids, &n)) {
            fprintf(stderr, "bench_tokenizer: %s\n", cv_error_message());
            return 1;
        }
        double t = cv_now() - t0;
        if (t < best_enc) best_enc = t;
        char *out;
        size_t out_len;
        t0 = cv_now();
        cv_tokenizer_decode(tok, ids, n, false, &out, &out_len);
        t = cv_now() - t0;
        if (t < best_dec) best_dec = t;
        free(out);
    }
    printf("input: %.2f MB, %zu tokens (%.2f bytes/token)\n", (double)len / 1e6, n,
           (double)len / (double)n);
    printf("encode: %.3f s  %.0f tokens/s  %.2f MB/s\n", best_enc, (double)n / best_enc,
           (double)len / 1e6 / best_enc);
    printf("decode: %.3f s  %.0f tokens/s  %.2f MB/s\n", best_dec, (double)n / best_dec,
           (double)len / 1e6 / best_dec);
    free(ids);
    free(text);
    free(unit);
    cv_tokenizer_free(tok);
    return 0;
}
