/*
 * cors.h — Cross-Origin Resource Sharing as vLLM's server does it: Starlette's CORSMiddleware with
 * vLLM's --allowed-origins, --allowed-methods, --allowed-headers (JSON lists, each ["*"] by default)
 * and --allow-credentials. So a web page on another origin can call the API from a browser, as it
 * can call vLLM.
 *
 * A preflight (OPTIONS with Origin and Access-Control-Request-Method) is answered at once, before
 * routing and before the API key is looked at (vLLM's authentication lets OPTIONS through): 200 "OK",
 * or 400 "Disallowed CORS origin, method, headers" naming what the lists do not allow, with the
 * Access-Control-* headers either way. Any other request with an Origin header gets its reply's
 * Access-Control-Allow-Origin ("*", or the origin itself where a list or a cookie calls for it, with
 * Vary: Origin) and -Allow-Credentials; a 401 does not, as vLLM's authentication answers outside
 * its CORS middleware.
 */
#ifndef CV_SERVER_CORS_H
#define CV_SERVER_CORS_H

#include <stdbool.h>
#include <stddef.h>

#include "server/http.h"

typedef struct cv_cors {
    char **origins;            /* allowed origins, as given */
    size_t n_origins;
    bool all_origins, all_headers, credentials;
    char **methods;            /* allowed methods ("*": Starlette's seven) */
    size_t n_methods;
    char **headers;            /* allowed request headers, lower case, the CORS-safelisted ones included */
    size_t n_headers;
    char *methods_value;       /* Access-Control-Allow-Methods */
    char *headers_value;       /* Access-Control-Allow-Headers (without "*"), or NULL */
} cv_cors;

/* The lists as given (NULL: vLLM's default ["*"]). */
void cv_cors_init(cv_cors *c, const char *const *origins, size_t n_origins, const char *const *methods,
                  size_t n_methods, const char *const *headers, size_t n_headers, bool allow_credentials);
void cv_cors_free(cv_cors *c);
/* A preflight request is answered (true); anything else is left alone (false). */
bool cv_cors_preflight(const cv_cors *c, cv_http_req *r);
/* The CORS headers of the reply to a request with an Origin header (none without one). */
void cv_cors_reply_headers(const cv_cors *c, cv_http_req *r);

#endif
