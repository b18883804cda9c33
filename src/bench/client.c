/*
 * client.c — see client.h. The loop alternates between releasing due requests, starting as many as
 * the concurrency limit allows, letting libcurl move bytes, and collecting finished transfers; it
 * sleeps in curl_multi_poll() until the next arrival or network activity, whichever comes first,
 * so a single thread keeps up with hundreds of streams while timestamps stay within a poll wakeup
 * of the bytes' arrival.
 *
 * curl's default "Expect: 100-continue" for large bodies is switched off: servers that do not answer
 * it (Python's http.server, some proxies) would otherwise add a one-second stall to every TTFT.
 */
#include "bench/client.h"

#include <curl/curl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/timeutil.h"

enum { ERROR_BODY_MAX = 400, POLL_MAX_MS = 1000 };
static const long REQUEST_TIMEOUT_S = 6 * 60 * 60; /* vLLM's aiohttp total timeout */

typedef struct transfer {
    CURL *easy;
    struct curl_slist *headers;
    cv_stream stream;
    cv_request_result *r;
    long status;
    char error_body[ERROR_BODY_MAX + 1];
    size_t n_error_body;
    char curl_error[CURL_ERROR_SIZE];
} transfer;

static size_t on_body(char *data, size_t size, size_t nmemb, void *user) {
    transfer *t = user;
    size_t len = size * nmemb;
    if (!t->status) curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->status);
    if (t->status == 200) {
        cv_stream_feed(&t->stream, data, len, cv_now());
    } else {
        size_t room = ERROR_BODY_MAX - t->n_error_body, take = len < room ? len : room;
        memcpy(t->error_body + t->n_error_body, data, take);
        t->n_error_body += take;
        t->error_body[t->n_error_body] = '\0';
    }
    return len;
}

static struct curl_slist *header_list(const cv_bench_http_options *o, const char *request_id) {
    struct curl_slist *h = NULL;
    h = curl_slist_append(h, "Content-Type: application/json");
    h = curl_slist_append(h, "Expect:");
    const char *key = getenv("OPENAI_API_KEY");
    if (key && *key) {
        char *line = cv_xasprintf("Authorization: Bearer %s", key);
        h = curl_slist_append(h, line);
        free(line);
    }
    for (size_t i = 0; i < o->n_headers; i++) h = curl_slist_append(h, o->headers[i]);
    if (request_id) {
        char *line = cv_xasprintf("x-request-id: %s", request_id);
        h = curl_slist_append(h, line);
        free(line);
    }
    return h;
}

static int start_transfer(CURLM *multi, const cv_bench_http_options *o, const char *body, const char *request_id,
                          transfer *t) {
    t->easy = curl_easy_init();
    if (!t->easy) return cv_fail(CVLLM_ERR_INTERNAL, "bench serve: curl_easy_init failed");
    t->headers = header_list(o, request_id);
    cv_stream_init(&t->stream, o->api, t->r);
    CURL *e = t->easy;
    curl_easy_setopt(e, CURLOPT_URL, o->url);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, t->headers);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(e, CURLOPT_PRIVATE, t);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->curl_error);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, REQUEST_TIMEOUT_S);
    t->r->start_time = cv_now();
    if (curl_multi_add_handle(multi, e) != CURLM_OK)
        return cv_fail(CVLLM_ERR_INTERNAL, "bench serve: curl_multi_add_handle failed");
    return 0;
}

static void finish_transfer(CURLM *multi, transfer *t, CURLcode result) {
    if (result != CURLE_OK) {
        cv_request_fail(t->r, "%s", t->curl_error[0] ? t->curl_error : curl_easy_strerror(result));
    } else if (t->status != 200) {
        if (!t->status) curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->status);
        cv_request_fail(t->r, "HTTP %ld: %s", t->status, t->error_body);
    } else {
        cv_stream_finish(&t->stream);
    }
    curl_multi_remove_handle(multi, t->easy);
    curl_easy_cleanup(t->easy);
    curl_slist_free_all(t->headers);
    cv_stream_free(&t->stream);
    t->easy = NULL;
    t->headers = NULL;
}

/* Milliseconds to sleep before the next arrival (capped so that a stalled poll is retried). */
static int wait_ms(const double *arrivals, size_t arrived, size_t n, double elapsed) {
    if (arrived >= n) return POLL_MAX_MS;
    double dt = arrivals[arrived] - elapsed;
    if (dt <= 0) return 0;
    return dt * 1000 >= POLL_MAX_MS ? POLL_MAX_MS : (int)ceil(dt * 1000);
}

int cv_bench_http_run(const cv_bench_http_options *o, char *const *bodies, char *const *request_ids, const double *arrivals,
                size_t n, cv_request_result *results, double *duration) {
    CURLM *multi = curl_multi_init();
    if (!multi) return cv_fail(CVLLM_ERR_INTERNAL, "bench serve: curl_multi_init failed");
    transfer *ts = cv_xcalloc(n ? n : 1, sizeof *ts);
    double *released_at = cv_xcalloc(n ? n : 1, sizeof *released_at);
    size_t arrived = 0, started = 0, finished = 0;
    int32_t active = 0;
    int rc = 0;
    double t0 = cv_now();
    while (finished < n && !rc) {
        double elapsed = cv_now() - t0;
        while (arrived < n && arrivals[arrived] <= elapsed) released_at[arrived++] = cv_now();
        while (started < arrived && (o->max_concurrency == 0 || active < o->max_concurrency) && !rc) {
            ts[started].r = &results[started];
            rc = start_transfer(multi, o, bodies[started], request_ids ? request_ids[started] : NULL, &ts[started]);
            results[started].queue_time = results[started].start_time - released_at[started];
            started++;
            active++;
        }
        int running;
        curl_multi_perform(multi, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(multi, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            transfer *t;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&t);
            finish_transfer(multi, t, msg->data.result);
            active--;
            finished++;
        }
        bool can_start = started < arrived && (o->max_concurrency == 0 || active < o->max_concurrency);
        int ms = wait_ms(arrivals, arrived, n, cv_now() - t0);
        if (!can_start && finished < n && (ms > 0 || active > 0)) curl_multi_poll(multi, NULL, 0, ms, NULL);
    }
    *duration = cv_now() - t0;
    for (size_t i = 0; i < n; i++)
        if (ts[i].easy) finish_transfer(multi, &ts[i], CURLE_ABORTED_BY_CALLBACK);
    free(released_at);
    free(ts);
    curl_multi_cleanup(multi);
    return rc;
}

static size_t collect(char *data, size_t size, size_t nmemb, void *user) {
    char **buf = user;
    size_t len = size * nmemb, have = *buf ? strlen(*buf) : 0;
    *buf = cv_xrealloc(*buf, have + len + 1);
    memcpy(*buf + have, data, len);
    (*buf)[have + len] = '\0';
    return len;
}

int cv_bench_http_get(const char *url, const char *const *headers, size_t n_headers, char **body) {
    *body = NULL;
    CURL *e = curl_easy_init();
    if (!e) return cv_fail(CVLLM_ERR_INTERNAL, "curl_easy_init failed");
    cv_bench_http_options o = {.headers = headers, .n_headers = n_headers};
    struct curl_slist *h = header_list(&o, NULL);
    char err[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, body);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 60L);
    CURLcode res = curl_easy_perform(e);
    long status = 0;
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    int rc = 0;
    if (res != CURLE_OK) rc = cv_fail(CVLLM_ERR_NETWORK, "GET %s: %s", url, err[0] ? err : curl_easy_strerror(res));
    else if (status != 200) rc = cv_fail(CVLLM_ERR_NETWORK, "GET %s: HTTP %ld", url, status);
    else if (!*body) *body = cv_xstrdup("");
    if (rc) {
        free(*body);
        *body = NULL;
    }
    return rc;
}
