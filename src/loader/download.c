/*
 * download.c — libcurl transfers for the hub: small JSON GETs into memory, and resumable file
 * downloads.
 *
 * A file download writes into PATH.incomplete and renames it to PATH only when the transfer ends
 * cleanly, so a PATH that exists is always whole. Resuming uses curl's own resume support
 * (CURLOPT_RESUME_FROM_LARGE) rather than a hand-written Range header, because curl then checks the
 * server's answer: a server that ignores the range makes curl fail with CURLE_RANGE_ERROR instead
 * of silently appending the whole file again, and we restart from zero. The file is opened in the
 * write callback, on the first body byte of a 2xx response, so an error page never lands in it.
 *
 * Transfers cut short (connection reset, stall longer than the timeout) are retried a few times,
 * each retry resuming where the last one stopped; a host that cannot be resolved or reached is not
 * retried, it is reported at once so the CLI can suggest --load-format dummy.
 *
 * Rejected: writing to blobs/ with symlinks from snapshots/ as huggingface_hub does — it
 * deduplicates across revisions but needs the blob's etag before the transfer and symlink
 * fallbacks; hub.c writes snapshot files directly, which every HF-cache reader accepts.
 */
#include "loader/download.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <curl/curl.h>

#include "base/error.h"
#include "base/timeutil.h"

#define MAX_ATTEMPTS 4

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void init_curl(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

typedef struct request {
    CURL *curl;
    struct curl_slist *headers;
    char errbuf[CURL_ERROR_SIZE];
} request;

static int request_init(request *r, const char *url, const cv_http_options *opts) {
    pthread_once(&curl_once, init_curl);
    memset(r, 0, sizeof *r);
    r->curl = curl_easy_init();
    if (!r->curl) return cv_fail(CVLLM_ERR_INTERNAL, "curl_easy_init failed");
    CURL *c = r->curl;
    long timeout = opts->timeout_s > 0 ? opts->timeout_s : 10;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    /* The hub redirects file downloads to a CDN; curl drops our Authorization header when the host
     * changes (CURLOPT_UNRESTRICTED_AUTH stays off), so the token does not leak there. */
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "cvllm/" CVLLM_VERSION);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->errbuf);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, timeout);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, timeout);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (opts->token && opts->token[0]) {
        char *h = cv_xasprintf("Authorization: Bearer %s", opts->token);
        r->headers = curl_slist_append(NULL, h);
        free(h);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, r->headers);
    }
    return 0;
}

static void request_free(request *r) {
    curl_slist_free_all(r->headers);
    curl_easy_cleanup(r->curl);
}

static bool is_no_network(CURLcode cc) {
    return cc == CURLE_COULDNT_RESOLVE_HOST || cc == CURLE_COULDNT_RESOLVE_PROXY ||
           cc == CURLE_COULDNT_CONNECT;
}

static bool is_retryable(CURLcode cc) {
    return cc == CURLE_PARTIAL_FILE || cc == CURLE_RECV_ERROR || cc == CURLE_SEND_ERROR ||
           cc == CURLE_OPERATION_TIMEDOUT || cc == CURLE_GOT_NOTHING;
}

static int transport_error(const request *r, CURLcode cc, bool *no_network) {
    *no_network = is_no_network(cc);
    return cv_fail(CVLLM_ERR_NETWORK, "%s", r->errbuf[0] ? r->errbuf : curl_easy_strerror(cc));
}

/* ------------------------------------------------------------------------------------------------ */
/* GET into memory                                                                                   */

typedef struct membuf {
    char *data;
    size_t len, cap, max;
} membuf;

static size_t membuf_write(char *p, size_t size, size_t n, void *arg) {
    membuf *b = arg;
    size_t add = size * n;
    if (b->len + add > b->max) return 0; /* makes curl fail with CURLE_WRITE_ERROR */
    if (b->len + add + 1 > b->cap) {
        while (b->len + add + 1 > b->cap) b->cap = b->cap ? b->cap * 2 : 4096;
        b->data = cv_xrealloc(b->data, b->cap);
    }
    memcpy(b->data + b->len, p, add);
    b->len += add;
    return add;
}

int cv_http_get(const char *url, const cv_http_options *opts, size_t max_bytes, long *status,
                char **body, size_t *len, bool *no_network) {
    *body = NULL;
    *len = 0;
    *status = 0;
    *no_network = false;
    request r;
    int rc = request_init(&r, url, opts);
    if (rc) return rc;
    membuf b = {.max = max_bytes};
    curl_easy_setopt(r.curl, CURLOPT_WRITEFUNCTION, membuf_write);
    curl_easy_setopt(r.curl, CURLOPT_WRITEDATA, &b);
    CURLcode cc = curl_easy_perform(r.curl);
    if (cc == CURLE_WRITE_ERROR) {
        rc = cv_fail(CVLLM_ERR_NETWORK, "response from %s is larger than %zu bytes", url, max_bytes);
    } else if (cc != CURLE_OK) {
        rc = transport_error(&r, cc, no_network);
    } else {
        curl_easy_getinfo(r.curl, CURLINFO_RESPONSE_CODE, status);
        membuf_write("", 0, 0, &b); /* makes sure there is room for the terminator */
        if (!b.data) b.data = cv_xmalloc(1);
        b.data[b.len] = '\0';
        *body = b.data;
        *len = b.len;
        b.data = NULL;
    }
    free(b.data);
    request_free(&r);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* File download                                                                                     */

typedef struct sink {
    CURL *curl;
    const char *tmp_path;
    FILE *fp;
    long status;
    int64_t offset;      /* bytes already in tmp_path when this attempt started */
    int write_errno;     /* set when the file could not be opened or written */
    bool discard;        /* a non-2xx body: read and drop */
    /* progress bar */
    const char *label;
    bool progress;
    double started, last_shown;
} sink;

static size_t sink_write(char *p, size_t size, size_t n, void *arg) {
    sink *s = arg;
    if (!s->fp && !s->discard) {
        curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &s->status);
        if (s->status / 100 != 2) {
            s->discard = true;
        } else if (!(s->fp = fopen(s->tmp_path, s->offset > 0 ? "ab" : "wb"))) {
            s->write_errno = errno;
            return 0;
        }
    }
    if (s->discard) return size * n;
    if (fwrite(p, size, n, s->fp) != n) {
        s->write_errno = errno ? errno : EIO;
        return 0;
    }
    return size * n;
}

static void show_progress(sink *s, int64_t done, int64_t total, bool final) {
    double now = cv_now();
    if (!final && now - s->last_shown < 0.1) return;
    s->last_shown = now;
    const double mib = 1024.0 * 1024.0;
    double rate = now > s->started ? (double)(done - s->offset) / (now - s->started) / mib : 0;
    char bar[31];
    int filled = total > 0 ? (int)(30 * done / total) : 0;
    for (int i = 0; i < 30; i++) bar[i] = i < filled ? '#' : ' ';
    bar[30] = '\0';
    fprintf(stderr, "\r%-40.40s [%s] %6.1f / %6.1f MiB %6.1f MiB/s%s", s->label, bar, (double)done / mib,
            (double)total / mib, rate, final ? "\n" : "");
}

static int sink_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                         curl_off_t ulnow) {
    (void)ultotal, (void)ulnow;
    sink *s = arg;
    if (s->status / 100 == 2 && dltotal > 0) show_progress(s, s->offset + dlnow, s->offset + dltotal, false);
    return 0;
}

static int64_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

/* One transfer; CURLE_OK means a response came (any status, in s->status). */
static CURLcode download_once(request *r, sink *s) {
    curl_easy_setopt(r->curl, CURLOPT_WRITEFUNCTION, sink_write);
    curl_easy_setopt(r->curl, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(r->curl, CURLOPT_RESUME_FROM_LARGE, (curl_off_t)s->offset);
    if (s->progress) {
        curl_easy_setopt(r->curl, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(r->curl, CURLOPT_XFERINFOFUNCTION, sink_progress);
        curl_easy_setopt(r->curl, CURLOPT_XFERINFODATA, s);
    }
    s->started = s->last_shown = cv_now();
    CURLcode cc = curl_easy_perform(r->curl);
    if (!s->status) curl_easy_getinfo(r->curl, CURLINFO_RESPONSE_CODE, &s->status);
    if (s->fp && fclose(s->fp) != 0 && cc == CURLE_OK) {
        s->write_errno = errno;
        cc = CURLE_WRITE_ERROR;
    }
    s->fp = NULL;
    return cc;
}

/* A complete 2xx transfer: the partial file becomes the real one (created empty for empty files). */
static int finish(const char *tmp_path, const char *path) {
    if (file_size(tmp_path) < 0) {
        FILE *fp = fopen(tmp_path, "wb");
        if (!fp) return cv_fail(CVLLM_ERR_IO, "cannot create %s: %s", tmp_path, strerror(errno));
        fclose(fp);
    }
    if (rename(tmp_path, path) != 0)
        return cv_fail(CVLLM_ERR_IO, "cannot rename %s to %s: %s", tmp_path, path, strerror(errno));
    return 0;
}

int cv_http_download(const char *url, const char *path, const char *label, const cv_http_options *opts,
                     long *status, bool *no_network) {
    *status = 0;
    *no_network = false;
    char *tmp_path = cv_xasprintf("%s.incomplete", path);
    request r;
    int rc = request_init(&r, url, opts);
    for (int attempt = 1; rc == 0; attempt++) {
        int64_t have = file_size(tmp_path);
        sink s = {.curl = r.curl, .tmp_path = tmp_path, .offset = have > 0 ? have : 0,
                  .label = label, .progress = opts->progress};
        CURLcode cc = download_once(&r, &s);
        if (s.progress && s.status / 100 == 2 && cc == CURLE_OK) {
            int64_t total = file_size(tmp_path);
            show_progress(&s, total, total, true);
        }
        if (cc == CURLE_OK && s.status == 416 && s.offset > 0 && attempt < MAX_ATTEMPTS) {
            remove(tmp_path); /* the partial file is longer than the remote one: start over */
            continue;
        }
        if (cc == CURLE_OK) {
            *status = s.status;
            if (s.status / 100 == 2) rc = finish(tmp_path, path);
            break;
        }
        if (s.write_errno) {
            rc = cv_fail(CVLLM_ERR_IO, "cannot write %s: %s", tmp_path, strerror(s.write_errno));
        } else if (cc == CURLE_RANGE_ERROR && attempt < MAX_ATTEMPTS) {
            remove(tmp_path); /* the server cannot resume: start over */
        } else if (!is_retryable(cc) || attempt >= MAX_ATTEMPTS) {
            rc = transport_error(&r, cc, no_network);
        }
        if (s.progress) fputc('\n', stderr);
    }
    if (r.curl) request_free(&r);
    free(tmp_path);
    return rc;
}
