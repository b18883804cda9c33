/*
 * test_http_parse.c — the strict HTTP/1.1 request parser (src/server/http_parse.c) on its own: valid
 * heads and what they mean, every malformed head with the exact status it must get, the path
 * decoder, and chunked bodies fed whole, split at every point and byte at a time.
 *
 * Two properties cover the "decide as early as the bytes allow" contract: every proper prefix of a
 * valid head is "need more" (0, never -1), and once a prefix of an invalid request fails, every
 * longer prefix fails with the same status, so the server's answer does not depend on how the
 * bytes were split into reads.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "server/http_parse.h"

#define S(lit) lit, sizeof(lit) - 1

static cv_http_head head;
static cv_http_error err;

static int parse(const char *s, size_t n) {
    memset(&err, 0, sizeof err);
    return cv_http_parse_head(s, n, &head, &err);
}

static bool span_eq(const char *p, size_t n, const char *lit) { return n == strlen(lit) && memcmp(p, lit, n) == 0; }

/* A complete valid head: 1 on the whole, 0 on every proper prefix (the byte-at-a-time feed). */
static void check_valid(const char *s, size_t n) {
    for (size_t k = 0; k < n; k++) {
        int rc = parse(s, k);
        CHECK_MSG(rc == 0, "prefix %zu of %.40s: %d (%d %s)", k, s, rc, err.status, err.message);
        if (rc != 0) break;
    }
    int rc = parse(s, n);
    CHECK_MSG(rc == 1 && head.head_len == n, "%.60s: rc %d head_len %zu (%d %s)", s, rc, head.head_len, err.status,
              err.message);
}

/* An invalid request: the status and message of the whole, and the same status from the first
 * failing prefix onward. */
static void check_invalid(const char *s, size_t n, int status) {
    int rc = parse(s, n);
    CHECK_MSG(rc == -1 && err.status == status, "%.60s: rc %d status %d (%s), want %d", s, rc, err.status, err.message,
              status);
    CHECK_MSG(rc != -1 || (err.message[0] && !strchr(err.message, '\n')), "%.60s: bad message", s);
    bool failed = false;
    for (size_t k = 0; k <= n; k++) {
        rc = parse(s, k);
        if (failed)
            CHECK_MSG(rc == -1 && err.status == status, "%.60s: prefix %zu gives %d/%d after failing", s, k, rc,
                      err.status);
        if (rc == -1) failed = true;
        if (failed && rc != -1) break;
    }
}

#define VALID(lit) check_valid(S(lit))
#define INVALID(lit, status) check_invalid(S(lit), status)
/* Decided before the request is complete: a prefix already fails. */
#define EARLY(lit, want)                                                                               \
    do {                                                                                               \
        int rc_ = parse(S(lit));                                                                       \
        CHECK_MSG(rc_ == -1 && err.status == (want), "%s: rc %d status %d", lit, rc_, err.status);     \
    } while (0)

/* ------------------------------------------------------------------------------------------------ */

static void test_valid_heads(void) {
    const char *get = "GET /v1/models?x=1 HTTP/1.1\r\nHost: localhost:8000\r\nUser-Agent: curl/8.0\r\n"
                      "Accept:*/*\r\nX-Empty:\r\nX-Pad: \t padded value \t \r\n\r\n";
    check_valid(get, strlen(get));
    CHECK(parse(get, strlen(get)) == 1);
    CHECK(span_eq(head.method, head.method_len, "GET"));
    CHECK(span_eq(head.target, head.target_len, "/v1/models?x=1"));
    CHECK(head.method == get && head.target == get + 4);
    CHECK_EQ_INT(head.version_minor, 1);
    CHECK_EQ_INT(head.n_headers, 5);
    CHECK(span_eq(head.headers[0].name, head.headers[0].name_len, "Host"));
    CHECK(span_eq(head.headers[0].value, head.headers[0].value_len, "localhost:8000"));
    CHECK(span_eq(head.headers[2].value, head.headers[2].value_len, "*/*"));
    CHECK_EQ_INT(head.headers[3].value_len, 0);
    CHECK(span_eq(head.headers[4].value, head.headers[4].value_len, "padded value"));
    CHECK(head.framing == CV_HTTP_NO_BODY && head.keep_alive && !head.expect_continue);
    const cv_http_header *h = cv_http_find_header(&head, "user-AGENT");
    CHECK(h && span_eq(h->value, h->value_len, "curl/8.0"));
    CHECK(cv_http_find_header(&head, "User") == NULL);

    const char *post = "POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                       "Content-Length:  42 \r\nExpect: 100-Continue\r\n\r\n";
    check_valid(post, strlen(post));
    CHECK(parse(post, strlen(post)) == 1);
    CHECK(head.framing == CV_HTTP_LENGTH && head.content_length == 42 && head.expect_continue);

    VALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
    CHECK(head.framing == CV_HTTP_CHUNKED);
    VALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:  ChUnKeD \r\n\r\n");
    CHECK(head.framing == CV_HTTP_CHUNKED);
    VALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: , chunked\r\n\r\n");
    CHECK(head.framing == CV_HTTP_CHUNKED);
    VALID("PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 003\r\n\r\n");
    CHECK(head.framing == CV_HTTP_LENGTH && head.content_length == 3);
    VALID("PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
    CHECK(head.framing == CV_HTTP_LENGTH && head.content_length == 0);
    VALID("PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 9223372036854775807\r\n\r\n");
    CHECK(head.content_length == INT64_MAX);

    /* every method the server knows */
    VALID("HEAD / HTTP/1.1\r\nHost: a\r\n\r\n");
    VALID("DELETE / HTTP/1.1\r\nHost: a\r\n\r\n");
    VALID("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n");
    VALID("TRACE / HTTP/1.1\r\nHost: a\r\n\r\n");
    VALID("PATCH / HTTP/1.1\r\nHost: a\r\n\r\n");
    VALID("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n");

    /* bytes a target and a value may carry */
    VALID("GET /caf\xc3\xa9?q=\"a\"&b={x}|^ HTTP/1.1\r\nHost: a\r\nX: \x80\xff\tv~\r\n\r\n");
    VALID("GET http://example.com:8000/v1/models HTTP/1.1\r\nHost: a\r\n\r\n");

    /* empty lines before the request line are skipped, and belong to the head */
    VALID("\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n");
    CHECK(span_eq(head.method, head.method_len, "GET"));

    /* HTTP/1.0: no Host needed, keep-alive only when asked */
    VALID("GET / HTTP/1.0\r\n\r\n");
    CHECK(head.version_minor == 0 && !head.keep_alive);
    VALID("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
    CHECK(head.keep_alive);
    VALID("GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n");
    CHECK(!head.keep_alive);
    VALID("GET / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n");
    CHECK(!head.expect_continue); /* RFC 9110 10.1.1: ignored in HTTP/1.0 */
    VALID("GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade,  CLOSE \r\n\r\n");
    CHECK(!head.keep_alive);
    VALID("GET / HTTP/1.1\r\nHost: a\r\nConnection: closed\r\n\r\n");
    CHECK(head.keep_alive);
    VALID("GET / HTTP/1.1\r\nHost: a\r\nConnection: a\r\nConnection: close\r\n\r\n");
    CHECK(!head.keep_alive);
    VALID("GET / HTTP/1.1\r\nHost: a\r\nExpect: something-else\r\n\r\n");
    CHECK(!head.expect_continue);
    VALID("GET / HTTP/1.1\r\nHost:\r\n\r\n"); /* an empty Host is allowed (RFC 9110 7.2) */
}

static void test_pipelined(void) {
    const char *two = "POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
                      "GET /health HTTP/1.1\r\nHost: a\r\n\r\n";
    size_t n = strlen(two);
    CHECK(parse(two, n) == 1);
    CHECK(head.framing == CV_HTTP_LENGTH && head.content_length == 5);
    size_t next = head.head_len + 5;
    CHECK(memcmp(two + head.head_len, "hello", 5) == 0);
    CHECK(parse(two + next, n - next) == 1);
    CHECK(span_eq(head.target, head.target_len, "/health") && head.head_len == n - next);
}

static void test_early_decisions(void) {
    CHECK(parse(S("GE")) == 0);
    CHECK(parse(S("GET /v1/mod")) == 0);
    CHECK(parse(S("")) == 0);
    CHECK(parse(S("\r")) == 0);
    CHECK(parse(S("BREW")) == 0); /* could still be 400 or 501 */
    EARLY("\x16", 400);           /* a TLS ClientHello */
    EARLY("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400);
    EARLY("GARBAGE\r", 400);
    EARLY("GET\r", 400);
    EARLY("BREW ", 501);
    EARLY("GET / HTTP/2.0\r", 505);
    EARLY("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1x", 400);
    EARLY("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 2", 400);
    EARLY("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999", 400);
    CHECK(parse(S("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 12 ")) == 0);
    EARLY("GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length:", 400);
    EARLY("GET / HTTP/1.1\r\nHost: a\r\nHost:", 400);
    EARLY("GET / HTTP/1.0\r\nTransfer-Encoding:", 400);
    EARLY("GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n", 400);
    INVALID("GARBAGE\r\n\r\n", 400);
    INVALID("GET\r\n\r\n", 400);
}

static void test_request_line(void) {
    INVALID("get / HTTP/1.1\r\nHost: a\r\n\r\n", 501);
    INVALID("BREW /pot HTTP/1.1\r\nHost: a\r\n\r\n", 501);
    INVALID("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 501);
    INVALID("G(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID("G\x00T / HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID(" GET / HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID("GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID("GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID("GET /  HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1 \r\nHost: a\r\n\r\n", 400);
    INVALID("GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID("GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID("GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID("GET /a\x00 HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID("GET /a\tb HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID("GET /\r\n\r\n", 400);
    INVALID("GET / \r\n\r\n", 400);
    INVALID("GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505);
    INVALID("GET / HTTP/0.9\r\nHost: a\r\n\r\n", 505);
    INVALID("GET / HTTP/3.1\r\nHost: a\r\n\r\n", 505);
    INVALID("GET / HTTP/1.2\r\nHost: a\r\n\r\n", 505);
    INVALID("GET / HTTP/1.10\r\nHost: a\r\n\r\n", 400);
    INVALID("GET / HTTP/11.1\r\nHost: a\r\n\r\n", 400);
    INVALID("GET / HTTP/1.\r\nHost: a\r\n\r\n", 400);
    INVALID("GET / HTTP/1\r\nHost: a\r\n\r\n", 400);
    INVALID("GET / HTTP/a.1\r\nHost: a\r\n\r\n", 400);
    INVALID("GET / http/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID("GET / HTTPS/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\nHost: a\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\rHost: a\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\rHost: a\r\n\r\n", 400);
    INVALID("\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID("\rGET / HTTP/1.1\r\nHost: a\r\n\r\n", 400);
    INVALID("\r\n GET / HTTP/1.1\r\nHost: a\r\n\r\n", 400);

    /* the request line limit: exactly at it is fine, one byte over is 414 before any CRLF */
    size_t line = CV_HTTP_MAX_REQUEST_LINE;
    char *buf = malloc(line + 64);
    memcpy(buf, "GET /", 5);
    memset(buf + 5, 'a', line - 5 - 9);
    memcpy(buf + line - 9, " HTTP/1.1\r\nHost: a\r\n\r\n", 22);
    check_valid(buf, line + 22 - 9);
    CHECK_EQ_INT(head.target_len, line - 4 - 9);
    buf[line - 9] = 'a';
    memcpy(buf + line - 8, " HTTP/1.1\r\nHost: a\r\n\r\n", 22);
    CHECK(parse(buf, line) == 0);
    CHECK(parse(buf, line + 1) == -1 && err.status == 414);
    check_invalid(buf, line + 22 - 8, 414);
    CHECK_STR_EQ(err.message, "Request line too long");
    free(buf);
}

static void test_header_fields(void) {
    INVALID("GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost\t: a\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\nX: b\r\n  folded\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\nX: b\r\n\tfolded\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\n: empty\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\nNa(me: v\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\nNa\x00me: v\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\n\xc3\xa9: v\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\nX: a\x01" "b\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\nX: a\x00" "b\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\nX: a\x7f\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\nX: \x1b[31m\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n", 400);
    CHECK_STR_EQ(err.message, "Missing expected CR after header value");
    INVALID("GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\n\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\n\r\r", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\n\rX", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\nX:\n\r\n", 400);

    /* the header count limit */
    size_t cap = 64 + (CV_HTTP_MAX_HEADERS + 1) * 16;
    char *buf = malloc(cap);
    size_t n = (size_t)sprintf(buf, "GET / HTTP/1.1\r\nHost: a\r\n");
    for (int i = 1; i < CV_HTTP_MAX_HEADERS; i++) n += (size_t)sprintf(buf + n, "X-%d: v\r\n", i);
    memcpy(buf + n, "\r\n", 2);
    check_valid(buf, n + 2);
    CHECK_EQ_INT(head.n_headers, CV_HTTP_MAX_HEADERS);
    n += (size_t)sprintf(buf + n, "X-last: v\r\n\r\n");
    check_invalid(buf, n, 431);
    free(buf);

    /* the head size limit: exactly at it is fine, one byte over is 431 before the final CRLF */
    buf = malloc(CV_HTTP_MAX_HEAD + 64);
    n = (size_t)sprintf(buf, "GET / HTTP/1.1\r\nHost: a\r\nX: ");
    memset(buf + n, 'v', CV_HTTP_MAX_HEAD - n - 4);
    memcpy(buf + CV_HTTP_MAX_HEAD - 4, "\r\n\r\n", 4);
    check_valid(buf, CV_HTTP_MAX_HEAD);
    buf[CV_HTTP_MAX_HEAD - 4] = 'v';
    memcpy(buf + CV_HTTP_MAX_HEAD - 3, "\r\n\r\n", 4);
    check_invalid(buf, CV_HTTP_MAX_HEAD + 1, 431);
    CHECK(parse(buf, CV_HTTP_MAX_HEAD) == 0);
    CHECK(parse(buf, CV_HTTP_MAX_HEAD + 1) == -1 && err.status == 431);
    CHECK_STR_EQ(err.message, "Header section too large");
    /* empty lines before the request line count toward it too */
    memset(buf, '\r', CV_HTTP_MAX_HEAD + 2);
    for (size_t i = 1; i < CV_HTTP_MAX_HEAD + 2; i += 2) buf[i] = '\n';
    CHECK(parse(buf, CV_HTTP_MAX_HEAD) == 0);
    CHECK(parse(buf, CV_HTTP_MAX_HEAD + 2) == -1 && err.status == 431);
    free(buf);
}

static void test_body_framing(void) {
    const char *bad_lengths[] = {"", " ", "abc", "-1", "+1", "1 2", "0x10", "1.5", "1,1", "1, 1", "1e3",
                                 "9223372036854775808", "18446744073709551616", "99999999999999999999999"};
    for (size_t i = 0; i < sizeof bad_lengths / sizeof *bad_lengths; i++) {
        char req[256];
        int n = snprintf(req, sizeof req, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %s\r\n\r\n", bad_lengths[i]);
        check_invalid(req, (size_t)n, 400);
    }
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", 400);
    CHECK_STR_EQ(err.message, "Duplicate Content-Length");
    INVALID("POST / HTTP/1.1\r\nHost: a\r\ncontent-length: 5\r\nCONTENT-LENGTH: 6\r\n\r\n", 400);
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400);
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", 400);
    CHECK_STR_EQ(err.message, "Content-Length can't be present with Transfer-Encoding");

    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 400);
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 400);
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400);
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n", 400);
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, deflate\r\n\r\n", 400);
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n", 400);
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:  \r\n\r\n", 400);
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: ,\r\n\r\n", 400);
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked;q=1\r\n\r\n", 400);
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501);
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n", 501);
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 501);
    CHECK_STR_EQ(err.message, "Unsupported transfer encoding");
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n", 501);
    INVALID("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: bogus\r\n\r\n", 501);
    INVALID("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400);

    INVALID("GET / HTTP/1.1\r\n\r\n", 400);
    CHECK_STR_EQ(err.message, "Missing Host header");
    INVALID("GET / HTTP/1.1\r\nUser-Agent: x\r\n\r\n", 400);
    INVALID("GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n", 400);
    INVALID("GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400);
}

static void check_path(const char *target, long want_len, const char *want, const char *want_query) {
    char out[256];
    const char *q = (const char *)1;
    long n = cv_http_decode_path(target, strlen(target), out, sizeof out, &q);
    CHECK_MSG(n == want_len, "%s: %ld, want %ld", target, n, want_len);
    if (n < 0 || want_len < 0) return;
    CHECK_MSG(memcmp(out, want, (size_t)n) == 0 && out[n] == '\0', "%s: \"%s\", want \"%s\"", target, out, want);
    if (want_query) CHECK_MSG(q && strcmp(q, want_query) == 0, "%s: query \"%s\"", target, q ? q : "(null)");
    else CHECK_MSG(q == NULL, "%s: unexpected query", target);
}

static void test_decode_path(void) {
    check_path("/v1/models", 10, "/v1/models", NULL);
    check_path("/", 1, "/", NULL);
    check_path("/a%2Fb%41%6a%6A?x=1&y=%41", 7, "/a/bAjj", "x=1&y=%41");
    check_path("/a%3Fb?c", 4, "/a?b", "c");
    check_path("/a?b?c", 2, "/a", "b?c");
    check_path("/a?", 2, "/a", "");
    check_path("/caf%C3%A9", 6, "/caf\xc3\xa9", NULL);
    check_path("/%zz%4%", 7, "/%zz%4%", NULL);
    check_path("/%4?x", 3, "/%4", "x");
    check_path("/%", 2, "/%", NULL);
    check_path("/%25", 2, "/%", NULL);
    check_path("/a%00b", -1, NULL, NULL);
    check_path("/a%00", -1, NULL, NULL);
    check_path("/a?%00", 2, "/a", "%00"); /* the query is the caller's, not decoded here */
    check_path("http://example.com:8000/v1/models?x", 10, "/v1/models", "x");
    check_path("HTTPS://example.com/a%20b", 4, "/a b", NULL);
    check_path("http://example.com", 1, "/", NULL);
    check_path("http://example.com?x=1", 1, "/", "x=1");
    check_path("http:///x", -1, NULL, NULL);
    check_path("http://", -1, NULL, NULL);
    check_path("ftp://example.com/x", -1, NULL, NULL);
    check_path("*", -1, NULL, NULL);
    check_path("example.com:443", -1, NULL, NULL);
    check_path("v1/models", -1, NULL, NULL);
    check_path("", -1, NULL, NULL);

    /* the target is not NUL-terminated: only target_len bytes are read; out_cap target_len + 1 fits */
    char out[8];
    CHECK(cv_http_decode_path("/abcXYZ", 4, out, 5, NULL) == 4 && strcmp(out, "/abc") == 0);
    CHECK(cv_http_decode_path("/ab%41", 4, out, 5, NULL) == 4 && strcmp(out, "/ab%") == 0);
    CHECK(cv_http_decode_path("/abc", 4, out, 4, NULL) == -1);
}

/* ------------------------------------------------------------------------------------------------ */
/* Chunked                                                                                           */

typedef struct fed {
    int rc;
    size_t consumed, body_len;
    char *body;
    cv_http_error err;
} fed;

/* Feeds s in pieces of `step` bytes (0: whole) until done or failed; consumed is the total. */
static fed feed(const char *s, size_t n, size_t step, size_t max_body) {
    cv_http_chunked st = {0};
    fed f = {0};
    size_t cap = 0, off = 0;
    for (;;) {
        size_t take = step && n - off > step ? step : n - off, used = 0;
        f.rc = cv_http_chunked_feed(&st, s + off, take, max_body, &f.body, &f.body_len, &cap, &used, &f.err);
        CHECK(used <= take);
        CHECK(f.body_len <= max_body && (!f.body || f.body[f.body_len] == '\0'));
        off += used;
        if (f.rc != 0 || off >= n) break;
        CHECK(used == take);
    }
    f.consumed = off;
    return f;
}

/* A complete chunked body followed by `rest`: same payload and consumption for every split. */
static void check_chunked(const char *s, size_t n, const char *payload, size_t rest) {
    for (size_t step = 0; step <= 7; step++) {
        fed f = feed(s, n, step, 1 << 20);
        CHECK_MSG(f.rc == 1 && f.consumed == n - rest, "%.30s step %zu: rc %d consumed %zu (%s)", s, step, f.rc,
                  f.consumed, f.err.message);
        CHECK_MSG(f.body && f.body_len == strlen(payload) && strcmp(f.body, payload) == 0, "%.30s step %zu: body", s,
                  step);
        free(f.body);
    }
    for (size_t k = 0; k < n - rest; k++) {
        fed f = feed(s, k, 0, 1 << 20);
        CHECK_MSG(f.rc == 0 && f.consumed == k, "%.30s prefix %zu: rc %d", s, k, f.rc);
        free(f.body);
    }
}

static void check_chunked_invalid(const char *s, size_t n, size_t max_body, int status) {
    for (size_t step = 0; step <= 3; step++) {
        fed f = feed(s, n, step, max_body);
        CHECK_MSG(f.rc == -1 && f.err.status == status, "%.30s step %zu: rc %d status %d (%s), want %d", s, step, f.rc,
                  f.err.status, f.err.message, status);
        free(f.body);
    }
}

#define CHUNKED_INVALID(lit, status) check_chunked_invalid(S(lit), 1 << 20, status)

static void test_chunked(void) {
    const char *body = "5;name=val;q=\"a b;c\"\t\r\nhello\r\n6\r\n world\r\nA\r\n0123456789\r\nf\r\n"
                       "abcdefghijklmno\r\n0;last\r\nX-Trailer: v\r\nChecksum:\r\n\r\n"
                       "GET / HTTP/1.1\r\n";
    check_chunked(body, strlen(body), "hello world0123456789abcdefghijklmno", strlen("GET / HTTP/1.1\r\n"));
    check_chunked(S("0\r\n\r\n"), "", 0);
    check_chunked(S("1\r\nx\r\n00000\r\n\r\n"), "x", 0);
    check_chunked(S("0000000000000001\r\nx\r\n0\r\n\r\n"), "x", 0);

    /* the body grows only as data arrives: a large announced chunk costs nothing yet */
    fed f = feed(S("7fffffffffffffff\r\nab"), 0, SIZE_MAX);
    CHECK(f.rc == 0 && f.body_len == 2);
    free(f.body);

    CHUNKED_INVALID("\r\n", 400);
    CHUNKED_INVALID(";ext\r\n", 400);
    CHUNKED_INVALID("+5\r\nhello\r\n0\r\n\r\n", 400);
    CHUNKED_INVALID("-5\r\nhello\r\n0\r\n\r\n", 400);
    CHUNKED_INVALID("0x5\r\nhello\r\n0\r\n\r\n", 400);
    CHUNKED_INVALID(" 5\r\nhello\r\n0\r\n\r\n", 400);
    CHUNKED_INVALID("5 \r\nhello\r\n0\r\n\r\n", 400);
    CHUNKED_INVALID("5 ;a\r\nhello\r\n0\r\n\r\n", 400);
    CHUNKED_INVALID("g\r\n", 400);
    CHUNKED_INVALID("5\nhello\r\n0\r\n\r\n", 400);
    CHUNKED_INVALID("5\rhello\r\n0\r\n\r\n", 400);
    CHUNKED_INVALID("5\r\nhelloX\r\n0\r\n\r\n", 400);
    CHUNKED_INVALID("5\r\nhello\n0\r\n\r\n", 400);
    CHUNKED_INVALID("5\r\nhello\rX0\r\n\r\n", 400);
    CHUNKED_INVALID("5;a\x01" "b\r\nhello\r\n0\r\n\r\n", 400);
    CHUNKED_INVALID("5;a\nhello\r\n0\r\n\r\n", 400);
    CHUNKED_INVALID("00000000000000001\r\nx\r\n0\r\n\r\n", 400); /* 17 digits */
    CHUNKED_INVALID("8000000000000000\r\n", 400);
    CHUNKED_INVALID("ffffffffffffffff\r\n", 400);
    CHUNKED_INVALID("0\r\n bad: v\r\n\r\n", 400);
    CHUNKED_INVALID("0\r\nbad : v\r\n\r\n", 400);
    CHUNKED_INVALID("0\r\n: v\r\n\r\n", 400);
    CHUNKED_INVALID("0\r\nnocolon\r\n\r\n", 400);
    CHUNKED_INVALID("0\r\nX: a\x01\r\n\r\n", 400);
    CHUNKED_INVALID("0\r\nX: a\n\r\n", 400);
    CHUNKED_INVALID("0\r\nX: a\r\r\n", 400);
    CHUNKED_INVALID("0\r\n\rX", 400);
    CHUNKED_INVALID("0\r\n\n", 400);

    /* payload limit: exactly at it is fine; over it is 413 before the chunk's data arrives */
    f = feed(S("5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n"), 0, 8);
    CHECK(f.rc == 1 && f.body_len == 8);
    free(f.body);
    check_chunked_invalid(S("5\r\nhello\r\n4\r\n"), 8, 413);
    check_chunked_invalid(S("7fffffffffffffff\r\n"), 1 << 20, 413);

    /* the chunk-size line limit, decided before its CRLF */
    size_t n = CV_HTTP_MAX_CHUNK_LINE + 64;
    char *buf = malloc(n);
    memcpy(buf, "1;", 2);
    memset(buf + 2, 'e', CV_HTTP_MAX_CHUNK_LINE - 2);
    memcpy(buf + CV_HTTP_MAX_CHUNK_LINE, "\r\nx\r\n0\r\n\r\n", 10);
    check_chunked(buf, CV_HTTP_MAX_CHUNK_LINE + 10, "x", 0);
    buf[CV_HTTP_MAX_CHUNK_LINE] = 'e';
    check_chunked_invalid(buf, CV_HTTP_MAX_CHUNK_LINE + 1, 1 << 20, 400);
    free(buf);

    /* the trailer section limit (its final CRLF included), decided before it ends */
    n = CV_HTTP_MAX_TRAILERS + 64;
    buf = malloc(n);
    memcpy(buf, "0\r\nX: ", 6);
    memset(buf + 6, 'v', CV_HTTP_MAX_TRAILERS - 4 - 3);
    memcpy(buf + 3 + CV_HTTP_MAX_TRAILERS - 4, "\r\n\r\n", 4);
    check_chunked(buf, 3 + CV_HTTP_MAX_TRAILERS, "", 0);
    memset(buf + 3 + CV_HTTP_MAX_TRAILERS - 4, 'v', 5);
    check_chunked_invalid(buf, 3 + CV_HTTP_MAX_TRAILERS + 1, 1 << 20, 431);
    free(buf);

    /* after the end, nothing more is taken */
    cv_http_chunked st = {0};
    char *b = NULL;
    size_t len = 0, cap = 0, used = 0;
    CHECK(cv_http_chunked_feed(&st, S("0\r\n\r\nGET"), 1 << 20, &b, &len, &cap, &used, &err) == 1 && used == 5);
    CHECK(cv_http_chunked_feed(&st, S("GET"), 1 << 20, &b, &len, &cap, &used, &err) == 1 && used == 0);
    free(b);
}

int main(void) {
    test_valid_heads();
    test_pipelined();
    test_early_decisions();
    test_request_line();
    test_header_fields();
    test_body_framing();
    test_decode_path();
    test_chunked();
    return cv_check_summary("test_http_parse");
}
