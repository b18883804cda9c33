/*
 * tls.h — HTTPS for the HTTP server (vLLM's --ssl-keyfile, --ssl-certfile, --ssl-ca-certs,
 * --ssl-cert-reqs, --ssl-ciphers, --enable-ssl-refresh), over OpenSSL, the TLS library Debian
 * builds libcurl and most servers against. Only this file and tls.c name OpenSSL: the server moves
 * bytes through cv_tls_recv / cv_tls_send, which behave as recv / send do on a non-blocking socket.
 *
 * The context is made as uvicorn makes vLLM's: the certificate chain and its key, client
 * certificates verified against ca_certs per cert_reqs (Python's ssl.CERT_NONE 0, CERT_OPTIONAL 1,
 * CERT_REQUIRED 2), the TLS 1.2 cipher list when given, TLS 1.2 at least. Renegotiation is off,
 * so after the handshake a read never needs a write (or the reverse) except as cv_tls_recv says.
 *
 * With `refresh`, cv_tls_refresh (called by the server's loop on its timer) notices when the key,
 * certificate or CA file changes and builds a new context from them; connections accepted later use
 * it, those already open keep theirs. A file that fails to load leaves the old context in place.
 *
 * Threads: the context belongs to the loop thread (accept, refresh). A connection's calls must not
 * overlap (the server holds the connection's mutex around each).
 */
#ifndef CV_SERVER_TLS_H
#define CV_SERVER_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct cv_tls_options {
    const char *keyfile;  /* PEM private key; NULL: in certfile */
    const char *certfile; /* PEM certificate chain; NULL: no TLS */
    const char *ca_certs; /* PEM CA certificates that client certificates are checked against, or NULL */
    int cert_reqs;        /* 0: no client certificate asked for; 1: verified if sent; 2: required */
    const char *ciphers;  /* OpenSSL cipher list for TLS 1.2, or NULL: OpenSSL's default */
    bool refresh;         /* reload the files when they change */
} cv_tls_options;

typedef struct cv_tls cv_tls;
typedef struct cv_tls_conn cv_tls_conn;

/* Loads the files; fails with a one-line cvllm_last_error naming the flag and the file. */
int cv_tls_create(const cv_tls_options *o, cv_tls **out);
void cv_tls_destroy(cv_tls *t);

/* With `refresh`: rebuilds the context if a file changed since the last look (at most once a
 * second; `now` in seconds, monotonic). */
void cv_tls_refresh(cv_tls *t, double now);

/* A server side of the handshake over socket fd, which is still the caller's to close. */
cv_tls_conn *cv_tls_accept(cv_tls *t, int fd);
/* As recv(2) on a non-blocking socket: bytes read, 0 at the end of the stream, or -1 with errno
 * (EAGAIN: wait until the socket is readable, or writable when *want_write was set; EPROTO: the
 * peer broke the protocol, a plain-HTTP client for one). The handshake happens inside. */
ssize_t cv_tls_recv(cv_tls_conn *c, void *buf, size_t n, bool *want_write);
/* As send(2) with MSG_DONTWAIT | MSG_NOSIGNAL: partial writes, EAGAIN, EPIPE for a connection that
 * cannot take output (broken, or still in a handshake that waits for the peer). */
ssize_t cv_tls_send(cv_tls_conn *c, const void *buf, size_t n);
/* Sends close_notify (best effort), before the socket's write side is shut. */
void cv_tls_close_notify(cv_tls_conn *c);
void cv_tls_free(cv_tls_conn *c);

#endif
