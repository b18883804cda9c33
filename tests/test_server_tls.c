/*
 * test_server_tls.c — `cvllm serve` over HTTPS with vLLM's --ssl-* flags, as a client meets it
 * (libcurl, verifying the server against the certificate it was given): replies and a stream over
 * TLS; a plain-HTTP client and a client that trusts another CA are refused while the server serves
 * on; client certificates required against --ssl-ca-certs (and a key kept in the certfile);
 * --enable-ssl-refresh picking up a new certificate; and each malformed setup refused in one line
 * before the model loads. Certificates are made by the openssl command line in a temporary folder.
 */
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "serve_process.h"
#include "testutil.h"

static char *dir;

static void run_openssl(const char *const *args) {
    tu_run r = tu_run_exec(dir, NULL, NULL, "openssl", args);
    CHECK_MSG(r.status == 0, "openssl %s failed: %s", args[0], r.err ? r.err : "");
    tu_run_free(&r);
}

/* NAME.pem and NAME.key: a self-signed certificate for 127.0.0.1. */
static void self_signed(const char *name) {
    char key[64], pem[64], subject[80];
    snprintf(key, sizeof key, "%s.key", name);
    snprintf(pem, sizeof pem, "%s.pem", name);
    snprintf(subject, sizeof subject, "/CN=%s", name);
    const char *args[] = {"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                          key, "-out", pem, "-days", "2", "-subj", subject, "-addext", "subjectAltName=IP:127.0.0.1", NULL};
    run_openssl(args);
}

/* client.pem and client.key, signed by the CA ca.pem / ca.key. */
static void client_cert(void) {
    const char *req[] = {"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                         "client.key", "-out", "client.csr", "-subj", "/CN=client", NULL};
    run_openssl(req);
    const char *sign[] = {"x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                          "-out", "client.pem", "-days", "2", NULL};
    run_openssl(sign);
}

static char *path_of(const char *name) { return tu_strdupf("%s/%s", dir, name); }

/* dir/to becomes a copy of dir/from, at once (a rename), as a certificate rotation replaces files. */
static void replace_file(const char *from, const char *to) {
    char *src = path_of(from), *text = tu_read_text(src), *tmp = tu_strdupf("%s/%s.new", dir, to), *dst = path_of(to);
    FILE *f = fopen(tmp, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    CHECK_EQ_INT(rename(tmp, dst), 0);
    free(src);
    free(text);
    free(tmp);
    free(dst);
}

typedef struct reply {
    CURLcode rc;
    long status;
    char *body;
    size_t len;
} reply;

static size_t collect(char *data, size_t size, size_t n, void *user) {
    reply *r = user;
    r->body = realloc(r->body, r->len + size * n + 1);
    memcpy(r->body + r->len, data, size * n);
    r->len += size * n;
    r->body[r->len] = 0;
    return size * n;
}

/* A request to the server on `port`: https unless `plain`, trusting the certificate file `ca`
 * (a name in dir), with the client certificate `client` (NAME.pem / NAME.key) when not NULL; a POST
 * of `body` when not NULL. */
static reply call(int port, bool plain, const char *path, const char *ca, const char *client, const char *body) {
    reply r = {0};
    char url[128], cert[64], key[64];
    snprintf(url, sizeof url, "%s://127.0.0.1:%d%s", plain ? "http" : "https", port, path);
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
    char *ca_path = ca ? path_of(ca) : NULL, *cert_path = NULL, *key_path = NULL;
    if (ca_path) curl_easy_setopt(h, CURLOPT_CAINFO, ca_path);
    if (client) {
        snprintf(cert, sizeof cert, "%s.pem", client);
        snprintf(key, sizeof key, "%s.key", client);
        cert_path = path_of(cert);
        key_path = path_of(key);
        curl_easy_setopt(h, CURLOPT_SSLCERT, cert_path);
        curl_easy_setopt(h, CURLOPT_SSLKEY, key_path);
    }
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    }
    r.rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(headers);
    curl_easy_cleanup(h);
    free(ca_path);
    free(cert_path);
    free(key_path);
    return r;
}

/* A GET of /v1/models must succeed (or must not, `ok` false) over https. */
static void expect_models(int port, const char *ca, const char *client, bool ok, const char *what) {
    reply r = call(port, false, "/v1/models", ca, client, NULL);
    const bool got = r.rc == CURLE_OK && r.status == 200 && r.body && strstr(r.body, "\"object\":\"list\"");
    CHECK_MSG(got == ok, "%s: curl %d (%s), status %ld", what, (int)r.rc, curl_easy_strerror(r.rc), r.status);
    free(r.body);
}

static sp_proc serve(const char *tag, const char *const *tls_args, size_t n_tls) {
    const char *args[32] = {"--host", "127.0.0.1", "--port", "0", "--dtype", "float32", "--max-model-len", "64",
                            "--kv-cache-memory-bytes", "16M", "--num-threads", "1"};
    size_t n = 12;
    for (size_t i = 0; i < n_tls && n < 32; i++) args[n++] = tls_args[i];
    sp_proc p = sp_spawn(dir, dir, tag, args, n);
    CHECK_MSG(sp_wait_ready(&p, 60), "%s server did not start", tag);
    return p;
}

static void stop(sp_proc *p) {
    kill(p->pid, SIGTERM);
    CHECK_EQ_INT(sp_wait_exit(p, 20), 0);
}

/* HTTPS with the server's own certificate: JSON replies and a stream; a plain-HTTP client and one
 * that trusts another CA get no reply, and the server serves on. */
static void test_https(void) {
    char *key = path_of("server.key"), *cert = path_of("server.pem");
    const char *tls[] = {"--ssl-keyfile", key, "--ssl-certfile", cert};
    sp_proc p = serve("https", tls, 4);
    char *log = tu_read_text(p.log);
    CHECK_CONTAINS(log, "API server on https://127.0.0.1:");
    free(log);
    expect_models(p.port, "server.pem", NULL, true, "https with the server's certificate trusted");
    reply r = call(p.port, false, "/v1/completions", "server.pem", NULL,
                   "{\"prompt\": \"a b c\", \"max_tokens\": 4, \"stream\": true}");
    CHECK_MSG(r.rc == CURLE_OK && r.status == 200, "stream over https: curl %d, status %ld", (int)r.rc, r.status);
    CHECK_MSG(r.body && r.len > 14 && !strcmp(r.body + r.len - 14, "data: [DONE]\n\n"), "stream over https: %s",
              r.body ? r.body : "(none)");
    free(r.body);
    r = call(p.port, true, "/v1/models", NULL, NULL, NULL);
    CHECK_MSG(r.rc != CURLE_OK && r.status == 0, "plain HTTP to an HTTPS server: curl %d, status %ld", (int)r.rc, r.status);
    free(r.body);
    expect_models(p.port, "ca.pem", NULL, false, "https trusting another CA");
    expect_models(p.port, "server.pem", NULL, true, "https after refused clients");
    stop(&p);
    free(key);
    free(cert);
}

/* --ssl-cert-reqs 2 with --ssl-ca-certs: only a client with a certificate the CA signed is served.
 * The key is in the certfile itself (no --ssl-keyfile), as uvicorn allows. */
static void test_client_certificates(void) {
    char *server_path = path_of("server.pem"), *key_path = path_of("server.key");
    char *server = tu_read_text(server_path), *key = tu_read_text(key_path);
    char *both = tu_strdupf("%s%s", key, server);
    tu_write_file(dir, "both.pem", both, strlen(both));
    char *both_path = path_of("both.pem"), *ca = path_of("ca.pem");
    const char *tls[] = {"--ssl-certfile", both_path, "--ssl-ca-certs", ca, "--ssl-cert-reqs", "2"};
    sp_proc p = serve("mtls", tls, 6);
    expect_models(p.port, "server.pem", "client", true, "a client certificate the CA signed");
    expect_models(p.port, "server.pem", NULL, false, "no client certificate");
    expect_models(p.port, "server.pem", "server", false, "a client certificate of another issuer");
    stop(&p);
    free(server_path);
    free(key_path);
    free(server);
    free(key);
    free(both);
    free(both_path);
    free(ca);
}

/* --enable-ssl-refresh: once the files are replaced, new connections get the new certificate. */
static void test_refresh(void) {
    replace_file("server.key", "live.key");
    replace_file("server.pem", "live.pem");
    char *key = path_of("live.key"), *cert = path_of("live.pem");
    const char *tls[] = {"--ssl-keyfile", key, "--ssl-certfile", cert, "--enable-ssl-refresh"};
    sp_proc p = serve("refresh", tls, 5);
    expect_models(p.port, "server.pem", NULL, true, "before the rotation");
    expect_models(p.port, "second.pem", NULL, false, "the next certificate before the rotation");
    replace_file("second.key", "live.key");
    replace_file("second.pem", "live.pem");
    bool rotated = false;
    for (double t0 = sp_now(); !rotated && sp_now() - t0 < 30; usleep(100000)) {
        reply r = call(p.port, false, "/v1/models", "second.pem", NULL, NULL);
        rotated = r.rc == CURLE_OK && r.status == 200;
        free(r.body);
    }
    CHECK_MSG(rotated, "the replaced certificate was not served within 30 s");
    expect_models(p.port, "server.pem", NULL, false, "the old certificate after the rotation");
    char *log = tu_read_text(p.log);
    CHECK_CONTAINS(log, "SSL certificate and key reloaded from");
    free(log);
    stop(&p);
    free(key);
    free(cert);
}

/* Malformed setups: one line on stderr and a non-zero exit, before the model loads. Each flag set
 * names the folder with up to two %s. */
static void test_refusals(void) {
    static const struct {
        const char *flags, *message;
    } bad[] = {
        {"--ssl-keyfile %s/server.key", "--ssl-keyfile needs --ssl-certfile"},
        {"--ssl-certfile %s/missing.pem", "missing.pem: No such file or directory"},
        {"--ssl-certfile %s/config.json", "not a PEM certificate chain"},
        {"--ssl-certfile %s/server.pem --ssl-keyfile %s/second.key", "is not the key of the certificate in --ssl-certfile"},
        {"--ssl-certfile %s/server.pem --ssl-keyfile %s/server.key --ssl-cert-reqs 2",
         "--ssl-cert-reqs 2 checks client certificates: name their CA with --ssl-ca-certs"},
        {"--ssl-certfile %s/server.pem --ssl-keyfile %s/server.key --ssl-cert-reqs 3", "--ssl-cert-reqs"},
        {"--ssl-certfile %s/server.pem --ssl-keyfile %s/server.key --ssl-ciphers NO-SUCH-CIPHER",
         "--ssl-ciphers 'NO-SUCH-CIPHER': no cipher match"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        char *flags = tu_strdupf(bad[k].flags, dir, dir);
        char *cmd = tu_strdupf("serve %s --max-model-len 64 --kv-cache-memory-bytes 16M %s", dir, flags);
        tu_run r = tu_run_cvllm(dir, "", cmd);
        CHECK_MSG(r.status != 0 && strstr(r.err, bad[k].message), "%s: exit %d, stderr: %s", flags, r.status, r.err);
        CHECK_MSG(!strstr(r.err, "Initializing engine"), "%s: refused only after loading the model", flags);
        tu_run_free(&r);
        free(cmd);
        free(flags);
    }
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    dir = tu_model_dir("qwen3-dense-tied-f32");
    self_signed("server");
    self_signed("second");
    self_signed("ca");
    client_cert();
    test_https();
    test_client_certificates();
    test_refresh();
    test_refusals();
    tu_remove_tree(dir);
    free(dir);
    curl_global_cleanup();
    return cv_check_summary("test_server_tls");
}
