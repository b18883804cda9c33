/*
 * http_parse.c — see http_parse.h.
 *
 * The head parser is one byte-driven state machine run from the start of the buffer on every call.
 * Being stateless keeps the server simple (it only keeps its read buffer), and the work stays
 * bounded because nothing past CV_HTTP_MAX_HEAD bytes is ever looked at. Every byte is judged the
 * moment it is seen, and every header's meaning (a duplicate Content-Length, Transfer-Encoding in
 * HTTP/1.0, ...) the moment its line ends or, for a name, its colon arrives, so a request that can
 * no longer become valid fails on the byte that made it so. Where the same bytes could still end
 * in two different statuses (an unknown method could yet be 501 or 400) the parser waits for the
 * byte that decides; the limits bound that wait.
 *
 * Where llhttp's strict mode and RFC 9112 both allow a choice, the stricter wins: no whitespace
 * after a chunk size (llhttp), "chunked" only as the last of the codings (RFC 9112 6.3), a request
 * line of exactly three parts with one SP each (RFC 9112 3). Leading empty lines before the request
 * line are skipped as RFC 9112 2.2 allows, since some clients send a stray CRLF after a body; they
 * count toward the head's size limit. The messages are llhttp's where it has one for the case.
 *
 * The chunked decoder keeps its state in cv_http_chunked because a body spans reads and may be
 * large; it copies payload out as it goes and grows the body only as data arrives, so a chunk that
 * merely announces a large size costs nothing until its bytes come.
 */
#include "server/http_parse.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/error.h"

static int fail(cv_http_error *err, int status, const char *msg) {
    if (err) {
        err->status = status;
        snprintf(err->message, sizeof err->message, "%s", msg);
    }
    return -1;
}

/* tchar of RFC 9110 5.6.2: what a method, a header name or a transfer coding is made of. */
static bool is_tchar(unsigned char c) {
    if ((c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')) return true;
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool is_ows(unsigned char c) { return c == ' ' || c == '\t'; }

/* field-vchar, SP and HTAB: a header value's bytes (obs-text 0x80-0xFF included). */
static bool is_value_byte(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

static int hex_value(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    c |= 0x20;
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static bool span_is(const char *s, size_t n, const char *lit) {
    return n == strlen(lit) && strncasecmp(s, lit, n) == 0;
}

const cv_http_header *cv_http_find_header(const cv_http_head *head, const char *name) {
    for (size_t i = 0; i < head->n_headers; i++)
        if (span_is(head->headers[i].name, head->headers[i].name_len, name)) return &head->headers[i];
    return NULL;
}

/* ------------------------------------------------------------------------------------------------ */
/* Request head                                                                                      */

enum {
    H_LEAD,        /* before the request line: empty lines are skipped */
    H_LEAD_LF,
    H_METHOD,
    H_TARGET,
    H_VERSION,     /* "HTTP/d.d", position in version_pos */
    H_VERSION_END, /* after the minor digit: CR */
    H_LINE_LF,
    H_FIELD_START, /* at the start of a header line, or of the final empty line */
    H_NAME,
    H_VALUE,
    H_VALUE_LF,
    H_END_LF,
};

enum { SPECIAL_NONE, SPECIAL_LENGTH, SPECIAL_TE, SPECIAL_HOST, SPECIAL_CONNECTION, SPECIAL_EXPECT };

/* What the headers seen so far mean, gathered while parsing and judged at the end. */
typedef struct head_meaning {
    bool have_length, have_te, have_host, te_chunked, close, keep_alive;
    size_t te_codings;
    int special; /* of the header being parsed */
} head_meaning;

static bool known_method(const char *m, size_t n) {
    static const char *const methods[] = {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"};
    for (size_t i = 0; i < CV_ARRAY_LEN(methods); i++)
        if (n == strlen(methods[i]) && memcmp(m, methods[i], n) == 0) return true;
    return false;
}

/* Content-Length = 1*DIGIT. v starts at the value's first non-OWS byte; with complete false it is
 * the part received so far, which may still end in the OWS that precedes the line's CRLF. */
static int parse_length(const char *v, size_t n, bool complete, uint64_t *out, cv_http_error *err) {
    uint64_t x = 0;
    size_t i = 0;
    for (; i < n && v[i] >= '0' && v[i] <= '9'; i++) {
        if (x > ((uint64_t)INT64_MAX - (uint64_t)(v[i] - '0')) / 10) return fail(err, 400, "Content-Length overflow");
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    if (complete && i == 0) return fail(err, 400, "Empty Content-Length");
    while (i < n && is_ows((unsigned char)v[i])) i++;
    if (i < n) return fail(err, 400, "Invalid character in Content-Length");
    *out = x;
    return 0;
}

/* One Transfer-Encoding line, a comma list of codings that continues the list of earlier lines.
 * Anything after "chunked" is a 400 at once; whether the whole list is acceptable (chunked last,
 * nothing else) is judged at the end of the head, since a later line may still add to it. */
static int parse_te(head_meaning *m, const char *v, size_t n, cv_http_error *err) {
    size_t codings = 0;
    for (size_t i = 0; i <= n;) {
        size_t j = i;
        while (j < n && v[j] != ',') j++;
        size_t a = i, b = j;
        while (a < b && is_ows((unsigned char)v[a])) a++;
        while (b > a && is_ows((unsigned char)v[b - 1])) b--;
        if (a < b) {
            for (size_t k = a; k < b; k++)
                if (!is_tchar((unsigned char)v[k])) return fail(err, 400, "Invalid `Transfer-Encoding` header value");
            if (m->te_chunked) return fail(err, 400, "Invalid `Transfer-Encoding` header value");
            m->te_chunked = span_is(v + a, b - a, "chunked");
            m->te_codings++;
            codings++;
        }
        i = j + 1;
    }
    return codings ? 0 : fail(err, 400, "Empty Transfer-Encoding");
}

static void parse_connection(head_meaning *m, const char *v, size_t n) {
    for (size_t i = 0; i <= n;) {
        size_t j = i;
        while (j < n && v[j] != ',') j++;
        size_t a = i, b = j;
        while (a < b && is_ows((unsigned char)v[a])) a++;
        while (b > a && is_ows((unsigned char)v[b - 1])) b--;
        if (span_is(v + a, b - a, "close")) m->close = true;
        if (span_is(v + a, b - a, "keep-alive")) m->keep_alive = true;
        i = j + 1;
    }
}

/* A header name is complete (its colon arrived): the checks that need no value. */
static int on_name(cv_http_head *h, head_meaning *m, const cv_http_header *f, cv_http_error *err) {
    m->special = SPECIAL_NONE;
    if (span_is(f->name, f->name_len, "content-length")) {
        if (m->have_length) return fail(err, 400, "Duplicate Content-Length");
        if (m->have_te) return fail(err, 400, "Content-Length can't be present with Transfer-Encoding");
        m->have_length = true;
        m->special = SPECIAL_LENGTH;
    } else if (span_is(f->name, f->name_len, "transfer-encoding")) {
        if (m->have_length) return fail(err, 400, "Transfer-Encoding can't be present with Content-Length");
        if (h->version_minor == 0) return fail(err, 400, "Transfer-Encoding is not allowed in HTTP/1.0");
        m->have_te = true;
        m->special = SPECIAL_TE;
    } else if (span_is(f->name, f->name_len, "host")) {
        if (m->have_host) return fail(err, 400, "Duplicate Host header");
        m->have_host = true;
    } else if (span_is(f->name, f->name_len, "connection")) {
        m->special = SPECIAL_CONNECTION;
    } else if (span_is(f->name, f->name_len, "expect")) {
        m->special = SPECIAL_EXPECT;
    }
    return 0;
}

/* A header line is complete: the checks on its (trimmed) value. */
static int on_value(cv_http_head *h, head_meaning *m, const cv_http_header *f, cv_http_error *err) {
    switch (m->special) {
    case SPECIAL_LENGTH:
        return parse_length(f->value, f->value_len, true, &h->content_length, err);
    case SPECIAL_TE:
        return parse_te(m, f->value, f->value_len, err);
    case SPECIAL_CONNECTION:
        parse_connection(m, f->value, f->value_len);
        return 0;
    case SPECIAL_EXPECT:
        /* RFC 9110 10.1.1: a 100-continue in an HTTP/1.0 request is ignored; other expectations
         * are ignored too rather than answered with 417. */
        if (h->version_minor == 1 && span_is(f->value, f->value_len, "100-continue")) h->expect_continue = true;
        return 0;
    default:
        return 0;
    }
}

/* The head is complete: what only the whole header section can decide. */
static int on_head_end(cv_http_head *h, const head_meaning *m, cv_http_error *err) {
    if (h->version_minor == 1 && !m->have_host) return fail(err, 400, "Missing Host header");
    if (m->have_te) {
        /* RFC 9112 6.1: an unknown coding is 501; 6.3: a list that does not end in chunked is 400.
         * A single unknown coding is both; 501 says more. */
        if (!m->te_chunked) {
            if (m->te_codings == 1) return fail(err, 501, "Unsupported transfer encoding");
            return fail(err, 400, "Invalid `Transfer-Encoding` header value");
        }
        if (m->te_codings > 1) return fail(err, 501, "Unsupported transfer encoding");
        h->framing = CV_HTTP_CHUNKED;
    } else if (m->have_length) {
        h->framing = CV_HTTP_LENGTH;
    }
    h->keep_alive = !m->close && (h->version_minor == 1 || m->keep_alive);
    return 1;
}

int cv_http_parse_head(const char *buf, size_t len, cv_http_head *head, cv_http_error *err) {
    const unsigned char *b = (const unsigned char *)buf;
    cv_http_head *h = head;
    h->method = h->target = NULL;
    h->method_len = h->target_len = 0;
    h->version_minor = 0;
    h->n_headers = 0;
    h->framing = CV_HTTP_NO_BODY;
    h->content_length = 0;
    h->keep_alive = h->expect_continue = false;
    h->head_len = 0;
    head_meaning m = {0};
    cv_http_header *f = NULL;                  /* the header being parsed */
    size_t line = 0, version_pos = 0, value_end = 0;
    bool value_started = false;
    int state = H_LEAD, major = 0;
    size_t n = len < CV_HTTP_MAX_HEAD ? len : CV_HTTP_MAX_HEAD;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = b[i];
        if (state == H_LEAD) {
            if (c == '\r') {
                state = H_LEAD_LF;
                continue;
            }
            if (c == '\n') return fail(err, 400, "Missing expected CR before LF");
            state = H_METHOD;
            line = i;
            h->method = buf + i;
        }
        if (state >= H_METHOD && state <= H_VERSION_END && i - line >= CV_HTTP_MAX_REQUEST_LINE && c != '\r')
            return fail(err, 414, "Request line too long");
        switch (state) {
        case H_LEAD_LF:
            if (c != '\n') return fail(err, 400, "Expected LF after CR");
            state = H_LEAD;
            break;
        case H_METHOD:
            if (is_tchar(c)) break;
            h->method_len = i - line;
            if (c != ' ' || h->method_len == 0)
                return fail(err, 400, h->method_len && (c == '\r' || c == '\n' || c == '\t') ? "Expected space after method"
                                                                                            : "Invalid method");
            if (!known_method(h->method, h->method_len)) return fail(err, 501, "Method not implemented");
            h->target = buf + i + 1;
            state = H_TARGET;
            break;
        case H_TARGET:
            if (c > ' ' && c != 0x7f) break;
            h->target_len = (size_t)(buf + i - h->target);
            if (c != ' ') return fail(err, 400, c == '\r' || c == '\n' ? "Missing HTTP version" : "Invalid char in url");
            if (h->target_len == 0) return fail(err, 400, "Expected a single space before the request target");
            state = H_VERSION;
            version_pos = 0;
            break;
        case H_VERSION:
            if (version_pos < 5) {
                if (c != (unsigned char)"HTTP/"[version_pos]) return fail(err, 400, "Expected HTTP/");
            } else if (version_pos == 5) {
                if (c < '0' || c > '9') return fail(err, 400, "Invalid major version");
                major = c - '0';
            } else if (version_pos == 6) {
                if (c != '.') return fail(err, 400, "Expected dot");
            } else {
                if (c < '0' || c > '9') return fail(err, 400, "Invalid minor version");
                h->version_minor = c - '0';
                state = H_VERSION_END;
            }
            version_pos++;
            break;
        case H_VERSION_END:
            if (c != '\r') return fail(err, 400, "Expected CRLF after version");
            if (major != 1 || h->version_minor > 1) return fail(err, 505, "HTTP version not supported");
            state = H_LINE_LF;
            break;
        case H_LINE_LF:
            if (c != '\n') return fail(err, 400, "Expected CRLF after version");
            state = H_FIELD_START;
            break;
        case H_FIELD_START:
            if (c == '\r') {
                state = H_END_LF;
                break;
            }
            if (is_ows(c))
                return fail(err, 400, h->n_headers ? "Unexpected whitespace after header value" : "Unexpected space after start line");
            if (c == '\n') return fail(err, 400, "Missing expected CR before LF");
            if (!is_tchar(c)) return fail(err, 400, "Invalid header token");
            if (h->n_headers == CV_HTTP_MAX_HEADERS) return fail(err, 431, "Too many headers");
            f = &h->headers[h->n_headers++];
            *f = (cv_http_header){.name = buf + i};
            state = H_NAME;
            break;
        case H_NAME:
            if (is_tchar(c)) break;
            if (c != ':') return fail(err, 400, is_ows(c) ? "Invalid header field char" : "Invalid header token");
            f->name_len = (size_t)(buf + i - f->name);
            if (on_name(h, &m, f, err) < 0) return -1;
            f->value = buf + i + 1;
            value_end = i + 1;
            value_started = false;
            state = H_VALUE;
            break;
        case H_VALUE:
            if (c == '\r') {
                f->value_len = (size_t)(buf + value_end - f->value);
                state = H_VALUE_LF;
            } else if (c == '\n') {
                return fail(err, 400, "Missing expected CR after header value");
            } else if (!is_value_byte(c)) {
                return fail(err, 400, "Invalid header value char");
            } else if (!is_ows(c)) {
                if (!value_started) f->value = buf + i;
                value_started = true;
                value_end = i + 1;
            } else if (!value_started) {
                f->value = buf + i + 1;
                value_end = i + 1;
            }
            break;
        case H_VALUE_LF:
            if (c != '\n') return fail(err, 400, "Missing expected LF after header value");
            if (on_value(h, &m, f, err) < 0) return -1;
            state = H_FIELD_START;
            break;
        case H_END_LF:
            if (c != '\n') return fail(err, 400, "Expected LF after headers");
            h->head_len = i + 1;
            return on_head_end(h, &m, err);
        }
    }
    /* A Content-Length value can be judged before its line ends. */
    if ((state == H_VALUE || state == H_VALUE_LF) && m.special == SPECIAL_LENGTH) {
        uint64_t ignored;
        size_t got = state == H_VALUE ? (size_t)(buf + n - f->value) : f->value_len;
        if (parse_length(f->value, got, false, &ignored, err) < 0) return -1;
    }
    if (len > CV_HTTP_MAX_HEAD) return fail(err, 431, "Header section too large");
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Request target                                                                                    */

long cv_http_decode_path(const char *target, size_t target_len, char *out, size_t out_cap, const char **query) {
    if (query) *query = NULL;
    const char *p = target, *end = target + target_len;
    if (target_len == 0) return -1;
    if (*p != '/') {
        /* absolute-form: only the path matters here; the authority must be there but is not used */
        size_t scheme = target_len >= 7 && !strncasecmp(p, "http://", 7)    ? 7
                        : target_len >= 8 && !strncasecmp(p, "https://", 8) ? 8
                                                                             : 0;
        if (!scheme) return -1;
        p += scheme;
        const char *host = p;
        while (p < end && *p != '/' && *p != '?') p++;
        if (p == host) return -1;
    }
    const char *q = memchr(p, '?', (size_t)(end - p));
    const char *path_end = q ? q : end;
    if (query && q) *query = q + 1;
    size_t o = 0;
    if (p == path_end) { /* "http://host" or "http://host?q": the path is "/" */
        if (out_cap < 2) return -1;
        out[o++] = '/';
    }
    for (; p < path_end; p++) {
        if (o + 1 >= out_cap) return -1;
        int hi, lo;
        if (*p == '%' && path_end - p >= 3 && (hi = hex_value((unsigned char)p[1])) >= 0 &&
            (lo = hex_value((unsigned char)p[2])) >= 0) {
            if (hi == 0 && lo == 0) return -1;
            out[o++] = (char)(hi << 4 | lo);
            p += 2;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
    return (long)o;
}

/* ------------------------------------------------------------------------------------------------ */
/* Chunked body                                                                                      */

enum {
    C_SIZE,      /* the chunk size's hex digits; zeroed state starts here */
    C_EXT,       /* ";name=value" extensions up to the CR */
    C_SIZE_LF,
    C_DATA,
    C_DATA_CR,
    C_DATA_LF,
    C_TRAILER,   /* at the start of a trailer line, or of the final empty line */
    C_TR_NAME,
    C_TR_VALUE,
    C_TR_LF,
    C_END_LF,
    C_DONE,
};

/* Room for need bytes; doubling, but never past what max_body can use. */
static void reserve(char **body, size_t *cap, size_t need, size_t max_body) {
    if (need <= *cap) return;
    size_t most = max_body < SIZE_MAX ? max_body + 1 : SIZE_MAX;
    size_t c = *cap <= most / 2 ? *cap * 2 : most;
    if (c < need) c = need;
    *body = cv_xrealloc(*body, c);
    *cap = c;
}

int cv_http_chunked_feed(cv_http_chunked *st, const char *in, size_t len, size_t max_body, char **body,
                         size_t *body_len, size_t *body_cap, size_t *consumed, cv_http_error *err) {
    const unsigned char *b = (const unsigned char *)in;
    size_t i = 0;
    for (; i < len; i++) {
        unsigned char c = b[i];
        if (st->state >= C_TRAILER && st->state <= C_END_LF && ++st->trailer_len > CV_HTTP_MAX_TRAILERS) {
            *consumed = i;
            return fail(err, 431, "Trailer section too large");
        }
        const char *bad = NULL;
        int bad_status = 400;
        if ((st->state == C_SIZE || st->state == C_EXT) && c != '\r' && ++st->line_len > CV_HTTP_MAX_CHUNK_LINE) {
            *consumed = i;
            return fail(err, 400, "Chunk size line too long");
        }
        switch (st->state) {
        case C_SIZE: {
            int d = hex_value(c);
            if (d >= 0) {
                if (st->line_len > 16 || st->left > (uint64_t)INT64_MAX >> 4) {
                    bad = "Chunk size overflow";
                    break;
                }
                st->left = st->left << 4 | (uint64_t)d;
                st->any_digit = true;
            } else if (!st->any_digit || (c != ';' && c != '\r')) {
                bad = "Invalid character in chunk size";
            } else {
                st->state = c == ';' ? C_EXT : C_SIZE_LF;
            }
            break;
        }
        case C_EXT:
            if (c == '\r') st->state = C_SIZE_LF;
            else if (!is_value_byte(c)) bad = "Invalid character in chunk extensions";
            break;
        case C_SIZE_LF:
            if (c != '\n') {
                bad = "Expected LF after chunk size";
            } else if (st->left == 0) {
                st->state = C_TRAILER;
                st->trailer_len = 0;
            } else if (*body_len > max_body || st->left > max_body - *body_len) {
                bad = "Request body too large";
                bad_status = 413;
            } else {
                st->state = C_DATA;
            }
            st->line_len = 0;
            break;
        case C_DATA: {
            size_t n = len - i < st->left ? len - i : (size_t)st->left;
            reserve(body, body_cap, *body_len + n + 1, max_body);
            memcpy(*body + *body_len, in + i, n);
            *body_len += n;
            (*body)[*body_len] = '\0';
            st->left -= n;
            i += n - 1;
            if (st->left == 0) st->state = C_DATA_CR;
            break;
        }
        case C_DATA_CR:
            if (c != '\r') bad = "Expected CRLF after chunk data";
            st->state = C_DATA_LF;
            break;
        case C_DATA_LF:
            if (c != '\n') bad = "Expected CRLF after chunk data";
            st->state = C_SIZE;
            st->any_digit = false;
            break;
        case C_TRAILER:
            if (c == '\r') st->state = C_END_LF;
            else if (is_tchar(c)) st->state = C_TR_NAME;
            else bad = is_ows(c) ? "Unexpected whitespace after header value" : "Invalid header token";
            break;
        case C_TR_NAME:
            if (c == ':') st->state = C_TR_VALUE;
            else if (!is_tchar(c)) bad = is_ows(c) ? "Invalid header field char" : "Invalid header token";
            break;
        case C_TR_VALUE:
            if (c == '\r') st->state = C_TR_LF;
            else if (c == '\n') bad = "Missing expected CR after header value";
            else if (!is_value_byte(c)) bad = "Invalid header value char";
            break;
        case C_TR_LF:
            if (c != '\n') bad = "Missing expected LF after header value";
            st->state = C_TRAILER;
            break;
        case C_END_LF:
            if (c != '\n') {
                bad = "Expected LF after trailers";
                break;
            }
            st->state = C_DONE;
            /* a complete body is always a string, even an empty one */
            reserve(body, body_cap, *body_len + 1, max_body);
            (*body)[*body_len] = '\0';
            *consumed = i + 1;
            return 1;
        case C_DONE:
            *consumed = 0;
            return 1;
        }
        if (bad) {
            *consumed = i;
            return fail(err, bad_status, bad);
        }
    }
    *consumed = i;
    return st->state == C_DONE ? 1 : 0;
}
