/*
 * fuzz_http.c — libFuzzer target for the strict HTTP/1.1 request parser (src/server/http_parse.c).
 *
 * The input is parsed as a request head. Beyond memory safety it checks the contract the server
 * relies on: results point inside the buffer; the answer for the input and for the input less its
 * last byte agree (a failure stays the same failure as bytes arrive, "need more" never follows a
 * failure, a complete head stays the same head), so the status a client gets does not depend on
 * how its bytes were split into reads; and a complete head's target decodes to a path without NUL
 * that fits the documented buffer. What follows the head (or the whole input, when it is not a
 * head, so the decoder is fuzzed directly too) is then decoded as a chunked body twice, whole and
 * in pieces whose sizes come from the input, and both must give the same outcome, consumption and
 * payload.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/http_parse.h"

static void require(int cond) {
    if (!cond) abort();
}

static bool inside(const char *p, size_t n, const char *buf, size_t len) {
    return p >= buf && n <= len && p - buf <= (ptrdiff_t)(len - n);
}

static void check_error(const cv_http_error *err, const int *allowed) {
    require(memchr(err->message, '\0', sizeof err->message) != NULL && err->message[0]);
    for (; *allowed; allowed++)
        if (err->status == *allowed) return;
    abort();
}

static void check_head(const char *buf, size_t len, const cv_http_head *h) {
    require(h->head_len > 0 && h->head_len <= len && h->head_len <= CV_HTTP_MAX_HEAD);
    require(inside(h->method, h->method_len, buf, h->head_len) && h->method_len > 0);
    require(inside(h->target, h->target_len, buf, h->head_len) && h->target_len > 0);
    require(h->version_minor == 0 || h->version_minor == 1);
    require(h->n_headers <= CV_HTTP_MAX_HEADERS);
    for (size_t i = 0; i < h->n_headers; i++) {
        const cv_http_header *f = &h->headers[i];
        require(inside(f->name, f->name_len, buf, h->head_len) && f->name_len > 0);
        require(inside(f->value, f->value_len, buf, h->head_len));
        require(!memchr(f->value, '\0', f->value_len) && !memchr(f->value, '\r', f->value_len));
        require(f->value_len == 0 || (!strchr(" \t", f->value[0]) && !strchr(" \t", f->value[f->value_len - 1])));
    }
    require(h->framing != CV_HTTP_CHUNKED || h->version_minor == 1);

    char *out = malloc(h->target_len + 1);
    const char *query;
    long n = cv_http_decode_path(h->target, h->target_len, out, h->target_len + 1, &query);
    if (n >= 0) {
        require((size_t)n <= h->target_len && out[0] == '/' && strlen(out) == (size_t)n);
        require(!query || (query > h->target && query <= h->target + h->target_len && query[-1] == '?'));
    }
    free(out);
}

typedef struct chunked_result {
    int rc, status;
    size_t consumed, body_len;
    char *body;
} chunked_result;

/* Feeds in[0, len) in pieces: whole when seed is 0, else of 1 + (rng % 16) bytes. */
static chunked_result chunked(const char *in, size_t len, size_t max_body, uint64_t seed) {
    cv_http_chunked st = {0};
    chunked_result r = {0};
    cv_http_error err = {0};
    size_t cap = 0, off = 0;
    do {
        size_t take = len - off;
        if (seed) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            if (take > 1 + seed % 16) take = 1 + seed % 16;
        }
        size_t used = (size_t)-1;
        r.rc = cv_http_chunked_feed(&st, in + off, take, max_body, &r.body, &r.body_len, &cap, &used, &err);
        require(r.rc >= -1 && r.rc <= 1 && used <= take);
        require(r.rc != 0 || used == take);
        require(r.body_len <= max_body && (!r.body || (r.body_len < cap && r.body[r.body_len] == '\0')));
        off += used;
    } while (r.rc == 0 && off < len);
    r.consumed = off;
    if (r.rc == 1) require(r.body != NULL);
    if (r.rc == -1) {
        check_error(&err, (const int[]){400, 413, 431, 0});
        r.status = err.status;
    }
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *buf = (const char *)data;
    cv_http_head *head = malloc(sizeof *head), *shorter = malloc(sizeof *shorter);
    cv_http_error err = {0}, err_shorter = {0};
    int rc = cv_http_parse_head(buf, size, head, &err);
    require(rc >= -1 && rc <= 1);
    if (rc == -1) check_error(&err, (const int[]){400, 414, 431, 501, 505, 0});
    if (rc == 1) check_head(buf, size, head);
    if (size > 0) {
        int rc1 = cv_http_parse_head(buf, size - 1, shorter, &err_shorter);
        if (rc1 == -1) require(rc == -1 && err.status == err_shorter.status);
        if (rc1 == 1) require(rc == 1 && head->head_len == shorter->head_len);
        if (rc == 0) require(rc1 == 0);
        if (rc == 1) require(cv_http_parse_head(buf, head->head_len - 1, shorter, &err_shorter) == 0);
    }

    uint64_t seed = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++) seed = (seed ^ data[i]) * 1099511628211ull;
    seed |= 1;
    size_t body_at = rc == 1 ? head->head_len : 0;
    size_t max_body = seed & 2 ? 64 : 1 << 20;
    chunked_result whole = chunked(buf + body_at, size - body_at, max_body, 0);
    chunked_result split = chunked(buf + body_at, size - body_at, max_body, seed);
    require(whole.rc == split.rc && whole.status == split.status);
    if (whole.rc == 1) {
        require(whole.consumed == split.consumed && whole.body_len == split.body_len);
        require(memcmp(whole.body, split.body, whole.body_len) == 0);
    }
    free(whole.body);
    free(split.body);
    free(head);
    free(shorter);
    return 0;
}
