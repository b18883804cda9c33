/*
 * cors.c — see cors.h. The rules are Starlette's (starlette/middleware/cors.py), which vLLM's
 * server runs with its flags' values; header names go out in lower case, as uvicorn sends them.
 */
#include "server/cors.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/error.h"

static const char *const ALL_METHODS[] = {"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"};
static const char *const SAFELISTED[] = {"Accept", "Accept-Language", "Content-Language", "Content-Type"};

static bool has(const char *const *v, size_t n, const char *s) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(v[i], s)) return true;
    return false;
}

static void push(char ***v, size_t *n, const char *s) {
    *v = cv_xrealloc(*v, (*n + 1) * sizeof **v);
    (*v)[(*n)++] = cv_xstrdup(s);
}

static int by_bytes(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The items joined with ", ". */
static char *join(char *const *v, size_t n) {
    char *out = cv_xstrdup("");
    for (size_t i = 0; i < n; i++) {
        char *grown = cv_xasprintf("%s%s%s", out, i ? ", " : "", v[i]);
        free(out);
        out = grown;
    }
    return out;
}

void cv_cors_init(cv_cors *c, const char *const *origins, size_t n_origins, const char *const *methods,
                  size_t n_methods, const char *const *headers, size_t n_headers, bool allow_credentials) {
    static const char *const star[] = {"*"};
    if (!origins) origins = star, n_origins = 1;
    if (!methods) methods = star, n_methods = 1;
    if (!headers) headers = star, n_headers = 1;
    *c = (cv_cors){.all_origins = has(origins, n_origins, "*"), .all_headers = has(headers, n_headers, "*"),
                   .credentials = allow_credentials};
    for (size_t i = 0; i < n_origins; i++) push(&c->origins, &c->n_origins, origins[i]);
    if (has(methods, n_methods, "*")) methods = ALL_METHODS, n_methods = sizeof ALL_METHODS / sizeof *ALL_METHODS;
    for (size_t i = 0; i < n_methods; i++) push(&c->methods, &c->n_methods, methods[i]);
    c->methods_value = join(c->methods, c->n_methods);
    /* Starlette: sorted(SAFELISTED | set(allow_headers)), as given for the reply, lower case to match */
    char **named = NULL;
    size_t n_named = 0;
    for (size_t i = 0; i < sizeof SAFELISTED / sizeof *SAFELISTED; i++) push(&named, &n_named, SAFELISTED[i]);
    for (size_t i = 0; i < n_headers; i++)
        if (!has((const char *const *)named, n_named, headers[i])) push(&named, &n_named, headers[i]);
    qsort(named, n_named, sizeof *named, by_bytes);
    if (!c->all_headers) c->headers_value = join(named, n_named);
    for (size_t i = 0; i < n_named; i++) {
        for (char *p = named[i]; *p; p++) *p = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
        push(&c->headers, &c->n_headers, named[i]);
        free(named[i]);
    }
    free(named);
}

static void free_list(char **v, size_t n) {
    for (size_t i = 0; i < n; i++) free(v[i]);
    free(v);
}

void cv_cors_free(cv_cors *c) {
    free_list(c->origins, c->n_origins);
    free_list(c->methods, c->n_methods);
    free_list(c->headers, c->n_headers);
    free(c->methods_value);
    free(c->headers_value);
}

static bool origin_allowed(const cv_cors *c, const char *origin) {
    return c->all_origins || has((const char *const *)c->origins, c->n_origins, origin);
}

/* Whether each of the comma-separated request headers is allowed (Starlette: lower-cased, stripped). */
static bool headers_allowed(const cv_cors *c, const char *requested) {
    for (const char *p = requested;;) {
        const size_t len = strcspn(p, ",");
        size_t b = 0, e = len;
        while (b < e && (p[b] == ' ' || p[b] == '\t')) b++;
        while (e > b && (p[e - 1] == ' ' || p[e - 1] == '\t')) e--;
        bool found = false;
        for (size_t i = 0; i < c->n_headers && !found; i++)
            found = strlen(c->headers[i]) == e - b && !strncasecmp(c->headers[i], p + b, e - b);
        if (!found) return false;
        if (!p[len]) return true;
        p += len + 1;
    }
}

bool cv_cors_preflight(const cv_cors *c, cv_http_req *r) {
    const char *origin = cv_http_get_header(r, "Origin");
    const char *method = cv_http_get_header(r, "Access-Control-Request-Method");
    if (!origin || !method || strcmp(cv_http_method(r), "OPTIONS")) return false;
    const char *requested = cv_http_get_header(r, "Access-Control-Request-Headers");
    const bool explicit_origin = !c->all_origins || c->credentials;
    const bool ok_origin = origin_allowed(c, origin);
    if (explicit_origin) cv_http_set_header(r, "vary", "Origin");
    if (!explicit_origin) cv_http_set_header(r, "access-control-allow-origin", "*");
    else if (ok_origin) cv_http_set_header(r, "access-control-allow-origin", origin);
    cv_http_set_header(r, "access-control-allow-methods", c->methods_value);
    cv_http_set_header(r, "access-control-max-age", "600");
    if (c->headers_value) cv_http_set_header(r, "access-control-allow-headers", c->headers_value);
    if (c->credentials) cv_http_set_header(r, "access-control-allow-credentials", "true");
    bool ok_headers = true;
    if (c->all_headers && requested) cv_http_set_header(r, "access-control-allow-headers", requested);
    else if (requested) ok_headers = headers_allowed(c, requested);
    const bool ok_method = has((const char *const *)c->methods, c->n_methods, method);
    if (ok_origin && ok_method && ok_headers) {
        cv_http_respond(r, 200, "text/plain; charset=utf-8", "OK", 2);
        return true;
    }
    char text[64] = "Disallowed CORS";
    const char *sep = " ";
    if (!ok_origin) strcat(text, sep), strcat(text, "origin"), sep = ", ";
    if (!ok_method) strcat(text, sep), strcat(text, "method"), sep = ", ";
    if (!ok_headers) strcat(text, sep), strcat(text, "headers");
    cv_http_respond(r, 400, "text/plain; charset=utf-8", text, strlen(text));
    return true;
}

void cv_cors_reply_headers(const cv_cors *c, cv_http_req *r) {
    const char *origin = cv_http_get_header(r, "Origin");
    if (!origin) return;
    if (c->all_origins) cv_http_set_header(r, "access-control-allow-origin", "*");
    if (c->credentials) cv_http_set_header(r, "access-control-allow-credentials", "true");
    /* a cookie, or a list of origins: the origin itself, which the reply then varies by */
    if ((c->all_origins && cv_http_get_header(r, "Cookie")) || (!c->all_origins && origin_allowed(c, origin))) {
        cv_http_set_header(r, "access-control-allow-origin", origin);
        cv_http_set_header(r, "vary", "Origin");
    }
}
