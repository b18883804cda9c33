/*
 * http_parse.h — strict HTTP/1.1 request parsing (RFC 9112) with no I/O: a request head, the body
 * framing it declares, chunked bodies, and the request-target's path.
 *
 * The server reads bytes from a socket and asks this parser after each read whether they form a
 * complete head yet, can still become one, or never will. "Never will" is decided as early as the
 * bytes allow (a binary byte in the method fails at once, not when the 16 KiB limit is reached), so
 * a malformed request gets its 4xx immediately instead of waiting for a timeout.
 *
 * Strictness follows what Node's llhttp (uvicorn with httptools, i.e. vLLM's server) enforces, and
 * RFC 9112 where the two differ in the safe direction: CRLF line endings only; method and header
 * names are tokens; no whitespace before a header's colon; no obs-fold; no NUL or control bytes
 * (HTAB excepted) in values; exactly one valid Content-Length; Transfer-Encoding only "chunked"
 * (any other coding is 501, "chunked" not last is 400) and never together with Content-Length;
 * exactly one Host in HTTP/1.1; HTTP/1.0 and 1.1 only (another well-formed version is 505).
 */
#ifndef CV_HTTP_PARSE_H
#define CV_HTTP_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    CV_HTTP_MAX_HEADERS = 100,        /* more headers: 431 */
    CV_HTTP_MAX_REQUEST_LINE = 8192,  /* a longer request line: 414 */
    CV_HTTP_MAX_HEAD = 16384,         /* request line + headers + the blank line; more: 431 */
    CV_HTTP_MAX_CHUNK_LINE = 4096,    /* a chunk-size line with its extensions; more: 400 */
    CV_HTTP_MAX_TRAILERS = 16384,     /* the trailer section of a chunked body; more: 431 */
};

typedef struct cv_http_error {
    int status;                       /* 400, 413, 414, 431, 501 or 505 */
    char message[160];                /* one line for the client, e.g. "Invalid header name" */
} cv_http_error;

typedef struct cv_http_header {
    const char *name, *value;         /* point into the parsed buffer; value trimmed of SP/HTAB */
    size_t name_len, value_len;
} cv_http_header;

typedef enum cv_http_framing {
    CV_HTTP_NO_BODY,                  /* neither Content-Length nor Transfer-Encoding */
    CV_HTTP_LENGTH,                   /* content_length bytes follow */
    CV_HTTP_CHUNKED,
} cv_http_framing;

typedef struct cv_http_head {
    const char *method, *target;      /* point into the parsed buffer (not NUL-terminated) */
    size_t method_len, target_len;
    int version_minor;                /* HTTP/1.<minor>: 0 or 1 */
    cv_http_header headers[CV_HTTP_MAX_HEADERS];
    size_t n_headers;
    cv_http_framing framing;
    uint64_t content_length;          /* with CV_HTTP_LENGTH */
    bool keep_alive;                  /* 1.1 unless "Connection: close"; 1.0 only with "keep-alive" */
    bool expect_continue;             /* "Expect: 100-continue" */
    size_t head_len;                  /* bytes of the head, its final CRLFCRLF included */
} cv_http_head;

/* Parses the request head at the start of buf[0, len). Returns 1 when a complete, valid head is
 * there (*head filled; its pointers point into buf, so buf must stay put while they are used), 0
 * when the bytes so far are a valid prefix of a head and more are needed, -1 when no continuation
 * can make them valid (*err says why, with 400, 414, 431, 501 or 505). Stateless: each call parses
 * from the start, and the limits above bound that work. */
int cv_http_parse_head(const char *buf, size_t len, cv_http_head *head, cv_http_error *err);

/* The first header named `name` (ASCII case-insensitive), or NULL. */
const cv_http_header *cv_http_find_header(const cv_http_head *head, const char *name);

/* The path of a request-target (origin-form "/p?q", or absolute-form "http://host/p?q"), percent-
 * decoded into out (NUL-terminated; out_cap >= target_len + 1 always suffices). Returns its length,
 * or -1 when the target has no path ("*", authority-form, garbage) or decodes to a NUL byte, so no
 * route can match a path that a C string would cut short. A '%' not followed by two hex digits is
 * kept as it is. *query (may be NULL) receives the text after '?', or NULL. */
long cv_http_decode_path(const char *target, size_t target_len, char *out, size_t out_cap, const char **query);

/* A chunked body being decoded, across as many reads as it takes. Zero it before the first call. */
typedef struct cv_http_chunked {
    int state;
    uint64_t left;                    /* data bytes left in the current chunk */
    size_t line_len;                  /* bytes of the current chunk-size or trailer line */
    size_t trailer_len;               /* bytes of the trailer section so far */
    bool any_digit;
} cv_http_chunked;

/* Decodes the next bytes of a chunked body: payload is appended to *body (grown with realloc, kept
 * NUL-terminated) up to max_body bytes. Returns 1 when the last chunk and its trailers are complete
 * (*consumed = the bytes of `in` that belonged to the body; what follows is the next request), 0
 * when all of `in` was consumed and more is needed, -1 on a malformed body (400), a chunk-size or
 * trailer line over its limit (400 / 431), or a payload over max_body (413). */
int cv_http_chunked_feed(cv_http_chunked *st, const char *in, size_t len, size_t max_body, char **body,
                         size_t *body_len, size_t *body_cap, size_t *consumed, cv_http_error *err);

#endif
