/*
 * tls.c — the OpenSSL side of HTTPS (see tls.h).
 */
#include "server/tls.h"

#include <errno.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/log.h"

enum { N_FILES = 3 }; /* key, certificate, CA certificates */

typedef struct file_sig {
    bool present;
    struct timespec mtime;
    off_t size;
    ino_t ino;
} file_sig;

struct cv_tls {
    char *files[N_FILES]; /* NULL where not given */
    char *ciphers;
    int cert_reqs;
    bool refresh;
    SSL_CTX *ctx;
    file_sig sig[N_FILES];
    double next_look;
};

struct cv_tls_conn {
    SSL *ssl;
};

static const char *const FLAGS[N_FILES] = {"--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs"};

/* The reason of OpenSSL's last queued error ("no cipher match"), and the queue cleared; *code (may
 * be NULL) its reason code. */
static const char *ssl_reason_code(int *code) {
    unsigned long e = ERR_peek_last_error();
    ERR_clear_error();
    if (code) *code = ERR_GET_REASON(e);
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : "unknown OpenSSL error";
}

static const char *ssl_reason(void) { return ssl_reason_code(NULL); }

/* A file the context reads must be there and readable: said with the system's words, which
 * OpenSSL's queue does not always keep. */
static int readable(int k, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return cv_fail(CVLLM_ERR_IO, "%s %s: %s", FLAGS[k], path, strerror(errno));
    fclose(f);
    return 0;
}

static int load(const cv_tls *t, SSL_CTX **out) {
    const char *key = t->files[0], *cert = t->files[1], *ca = t->files[2];
    int rc = readable(1, cert);
    if (!rc && key != cert) rc = readable(0, key);
    if (!rc && ca) rc = readable(2, ca);
    if (rc) return rc;
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (!ctx) return cv_fail(CVLLM_ERR_INTERNAL, "cannot make a TLS context: %s", ssl_reason());
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* a peer that closes without close_notify ends its stream as one that sends it */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_IGNORE_UNEXPECTED_EOF);
    /* the server's output buffer moves as it grows, and a write may take part of it */
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
    int code = 0;
    const char *why = NULL;
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1)
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--ssl-certfile %s: not a PEM certificate chain (%s)", cert, ssl_reason());
    else if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 && (why = ssl_reason_code(&code)) &&
             code != X509_R_KEY_VALUES_MISMATCH)
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "%s %s: not a PEM private key (%s)", key == cert ? FLAGS[1] : FLAGS[0],
                     key, why);
    else if (why || SSL_CTX_check_private_key(ctx) != 1) /* a key of another type than the certificate's gets here */
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--ssl-keyfile %s is not the key of the certificate in --ssl-certfile %s",
                     key, cert);
    else if (ca && SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1)
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--ssl-ca-certs %s: not PEM certificates (%s)", ca, ssl_reason());
    else if (t->ciphers && SSL_CTX_set_cipher_list(ctx, t->ciphers) != 1)
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--ssl-ciphers '%s': %s", t->ciphers, ssl_reason());
    if (rc) {
        SSL_CTX_free(ctx);
        return rc;
    }
    SSL_CTX_set_verify(ctx, t->cert_reqs == 0   ? SSL_VERIFY_NONE
                            : t->cert_reqs == 1 ? SSL_VERIFY_PEER
                                                : SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    *out = ctx;
    return 0;
}

static file_sig sig_of(const char *path) {
    struct stat st;
    if (!path || stat(path, &st) != 0) return (file_sig){0};
    return (file_sig){true, st.st_mtim, st.st_size, st.st_ino};
}

static bool same_sig(const file_sig *a, const file_sig *b) {
    return a->present == b->present && a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec &&
           a->size == b->size && a->ino == b->ino;
}

int cv_tls_create(const cv_tls_options *o, cv_tls **out) {
    if (o->cert_reqs < 0 || o->cert_reqs > 2)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--ssl-cert-reqs %d: 0 (none), 1 (optional) or 2 (required)", o->cert_reqs);
    if (o->cert_reqs && !o->ca_certs)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--ssl-cert-reqs %d checks client certificates: name their CA with "
                       "--ssl-ca-certs", o->cert_reqs);
    cv_tls *t = cv_xcalloc(1, sizeof *t);
    t->files[1] = cv_xstrdup(o->certfile);
    t->files[0] = o->keyfile ? cv_xstrdup(o->keyfile) : t->files[1];
    t->files[2] = o->ca_certs ? cv_xstrdup(o->ca_certs) : NULL;
    t->ciphers = o->ciphers ? cv_xstrdup(o->ciphers) : NULL;
    t->cert_reqs = o->cert_reqs;
    t->refresh = o->refresh;
    for (int k = 0; k < N_FILES; k++) t->sig[k] = sig_of(t->files[k]);
    int rc = load(t, &t->ctx);
    if (rc) {
        cv_tls_destroy(t);
        return rc;
    }
    *out = t;
    return 0;
}

void cv_tls_destroy(cv_tls *t) {
    if (!t) return;
    SSL_CTX_free(t->ctx);
    if (t->files[0] != t->files[1]) free(t->files[0]);
    free(t->files[1]);
    free(t->files[2]);
    free(t->ciphers);
    free(t);
}

void cv_tls_refresh(cv_tls *t, double now) {
    if (!t->refresh || now < t->next_look) return;
    t->next_look = now + 1.0;
    bool changed = false;
    for (int k = 0; k < N_FILES; k++) {
        const file_sig s = sig_of(t->files[k]);
        if (!same_sig(&s, &t->sig[k])) changed = true;
        t->sig[k] = s;
    }
    if (!changed) return;
    SSL_CTX *ctx;
    if (load(t, &ctx)) {
        cv_warn("http", "SSL files changed but were not reloaded: %s", cvllm_last_error());
        return;
    }
    SSL_CTX_free(t->ctx); /* connections still using it hold their own reference */
    t->ctx = ctx;
    cv_info("http", "SSL certificate and key reloaded from %s", t->files[1]);
}

cv_tls_conn *cv_tls_accept(cv_tls *t, int fd) {
    SSL *ssl = SSL_new(t->ctx);
    if (!ssl || SSL_set_fd(ssl, fd) != 1) {
        cv_warn("http", "cannot start a TLS connection: %s", ssl_reason());
        SSL_free(ssl);
        return NULL;
    }
    SSL_set_accept_state(ssl);
    cv_tls_conn *c = cv_xcalloc(1, sizeof *c);
    c->ssl = ssl;
    return c;
}

static int clamp(size_t n) { return n > INT_MAX ? INT_MAX : (int)n; }

ssize_t cv_tls_recv(cv_tls_conn *c, void *buf, size_t n, bool *want_write) {
    ERR_clear_error();
    const int r = SSL_read(c->ssl, buf, clamp(n));
    if (r > 0) return r;
    switch (SSL_get_error(c->ssl, r)) {
    case SSL_ERROR_WANT_READ: errno = EAGAIN; return -1;
    case SSL_ERROR_WANT_WRITE:
        *want_write = true;
        errno = EAGAIN;
        return -1;
    case SSL_ERROR_ZERO_RETURN: return 0;
    case SSL_ERROR_SYSCALL:
        if (errno == 0) errno = ECONNRESET;
        return -1;
    default:
        /* a client speaking plain HTTP, an unknown CA, a missing client certificate: the client's
         * own error says it; a line here says why the connection ended */
        cv_debug("http", "TLS connection refused: %s", ssl_reason());
        errno = EPROTO;
        return -1;
    }
}

ssize_t cv_tls_send(cv_tls_conn *c, const void *buf, size_t n) {
    ERR_clear_error();
    const int r = SSL_write(c->ssl, buf, clamp(n));
    if (r > 0) return r;
    const int e = SSL_get_error(c->ssl, r);
    ERR_clear_error();
    errno = e == SSL_ERROR_WANT_WRITE ? EAGAIN : e == SSL_ERROR_SYSCALL && errno ? errno : EPIPE;
    return -1;
}

void cv_tls_close_notify(cv_tls_conn *c) {
    if (SSL_is_init_finished(c->ssl)) SSL_shutdown(c->ssl);
    ERR_clear_error();
}

void cv_tls_free(cv_tls_conn *c) {
    if (!c) return;
    SSL_free(c->ssl);
    free(c);
}
