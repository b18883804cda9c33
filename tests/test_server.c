/*
 * test_server.c — the HTTP server in-process on 127.0.0.1 (ephemeral ports), driven with libcurl.
 *
 * Two servers run side by side:
 *   - the reference checkpoint (tests/data/vectors/qwen3-dense-f32, vocabulary 4096) for
 *     completions: the tutorials' requests, 64 concurrent streams checked token for token against
 *     the offline engine, clients that hang up, 1,000 malformed requests, API keys, metrics;
 *   - the same shape with the full Qwen3 vocabulary and dummy weights, for chat, whose template's
 *     special tokens lie outside the small vocabulary. It serves the Qwen3 chat template from the
 *     model folder with the qwen3 reasoning parser and hermes tool calls.
 * Greedy decoding makes every expected text exact: the offline engine (cvllm_engine directly) gives
 * the reference for each prompt. Random weights never write <think> or <tool_call> on their own, so
 * chat end to end checks what the server controls: the prompt the template renders (/tokenize and
 * /v1/chat/completions/render against the chat library), well-formed replies with tools, streaming
 * equal to non-streaming, and reasoning from a prompt that leaves <think> open. With structured
 * outputs the grammar decides the text, so there it checks that every output is valid: regexes,
 * choices, JSON schemas and forced tool calls (the chat server constrains JSON without whitespace,
 * --structured-outputs-config's disable_any_whitespace, so that small schemas end within max_tokens),
 * and that invalid constraints are vLLM's 400.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "chat/chat.h"
#include "check.h"
#include "cvllm.h"
#include "engine/engine_group.h"
#include "server/server.h"
#include "testutil.h"

#define KEY "sk-test-key"
#define NAME "qwen3-test"
enum { MAX_MODEL_LEN = 4096, MAX_BODY = 256 * 1024 };

typedef struct fixture {
    char *dir;
    cv_chat_template *tmpl;
    cv_engine_group *group;
    cv_server *srv;
    char base[64];
} fixture;

static fixture ref_srv, chat_srv;

static cvllm_engine_options engine_options(const char *dir, const char *load_format) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.load_format = load_format;
    o.max_model_len = MAX_MODEL_LEN;
    o.kv_cache_memory_bytes = 64u << 20;
    o.num_threads = 2;
    o.block_size = 16;
    o.max_num_seqs = 128;
    o.seed = 1024;
    return o;
}

static void start_server(fixture *f, const char *load_format, cv_api_structured_config structured) {
    cvllm_engine_options o = engine_options(f->dir, load_format);
    cv_loop_options lo = {.async_scheduling = true};
    int rc = cv_engine_group_start(&o, &lo, &f->group);
    CHECK_MSG(rc == 0, "engine: %s", cvllm_last_error());
    if (rc) exit(1);
    static const char *names[] = {NAME, "alias"};
    static const char *keys[] = {"other-key", KEY};
    CHECK_MSG(cv_chat_template_load(f->dir, NULL, &f->tmpl) == 0, "chat template: %s", cvllm_last_error());
    cv_server_options so = {.host = "127.0.0.1", .served_model_names = names, .n_served_model_names = 2,
                            .model_root = f->dir, .api_keys = keys, .n_api_keys = 2,
                            .enable_prompt_tokens_details = true, .max_body_bytes = MAX_BODY,
                            .chat_template = f->tmpl, .reasoning_parser = "qwen3", .enable_auto_tool_choice = true,
                            .tool_call_parser = "hermes", .structured = structured,
                            /* the chat server (dummy weights) tracks load, echoes request ids and has
                             * /tokenizer_info */
                            .enable_request_id_headers = load_format != NULL,
                            .enable_server_load_tracking = load_format != NULL,
                            .enable_tokenizer_info = load_format != NULL,
                            .responses_store = load_format != NULL};
    rc = cv_server_start(f->group, &so, &f->srv);
    CHECK_MSG(rc == 0, "server: %s", cvllm_last_error());
    if (rc) exit(1);
    snprintf(f->base, sizeof f->base, "http://127.0.0.1:%d", cv_server_port(f->srv));
}

static void stop_server(fixture *f) {
    cv_server_stop(f->srv, 0);
    cv_engine_group_stop(f->group);
    cv_chat_template_free(f->tmpl);
    tu_remove_tree(f->dir);
    free(f->dir);
}

/* A copy of the reference config with the full Qwen3 vocabulary, for dummy weights. */
static char *full_vocab_model_dir(void) {
    char *dir = tu_model_dir("qwen3-dense-f32");
    char *cfg = tu_strdupf("%s/%s", dir, "config.json");
    json_t *j = json_load_file(cfg, 0, NULL);
    CHECK(j != NULL);
    json_object_set_new(j, "vocab_size", json_integer(151936));
    unlink(cfg);
    CHECK(json_dump_file(j, cfg, 0) == 0);
    json_decref(j);
    free(cfg);
    return dir;
}

/* ------------------------------------------------------------------------------------------------ */
/* HTTP client                                                                                       */

typedef struct reply {
    long status;
    char *body;
    size_t len;
    char content_type[128];
    CURLcode curl;
    char *headers;  /* the reply's header lines, lower-cased names (with_headers only) */
} reply;

static size_t collect_header(char *data, size_t size, size_t n, void *user) {
    reply *r = user;
    const size_t old = r->headers ? strlen(r->headers) : 0, k = size * n;
    r->headers = realloc(r->headers, old + k + 1);
    memcpy(r->headers + old, data, k);
    r->headers[old + k] = '\0';
    for (size_t i = old; i < old + k && r->headers[i] != ':'; i++)
        if (r->headers[i] >= 'A' && r->headers[i] <= 'Z') r->headers[i] += 32;
    return k;
}

/* The value of reply header `name` (lower case), copied into buf, or NULL when absent. */
static const char *header_of(const reply *r, const char *name, char *buf, size_t cap) {
    char needle[96];
    snprintf(needle, sizeof needle, "\n%s: ", name);
    const char *at = r->headers ? strstr(r->headers, needle) : NULL;
    if (!at) return NULL;
    at += strlen(needle);
    snprintf(buf, cap, "%.*s", (int)strcspn(at, "\r\n"), at);
    return buf;
}

static size_t collect(char *data, size_t size, size_t n, void *user) {
    reply *r = user;
    r->body = realloc(r->body, r->len + size * n + 1);
    memcpy(r->body + r->len, data, size * n);
    r->len += size * n;
    r->body[r->len] = '\0';
    return size * n;
}

static CURL *easy; /* the main thread's connection, kept alive across requests */

/* Extra request header lines for the next http_on (NULL-terminated), and whether it collects the
 * reply's headers. */
static const char *const *extra_request_headers;

static reply http_on(CURL *c, const fixture *f, const char *method, const char *path, const char *ctype,
                     const char *body, size_t len, const char *key) {
    reply r = {0};
    char url[256], auth[128], ct[128];
    snprintf(url, sizeof url, "%s%s", f->base, path);
    curl_easy_reset(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (!strcmp(method, "HEAD")) curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    struct curl_slist *h = NULL;
    if (key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
        h = curl_slist_append(h, auth);
    }
    if (ctype) {
        snprintf(ct, sizeof ct, "Content-Type: %s", ctype);
        h = curl_slist_append(h, ct);
    }
    h = curl_slist_append(h, "Expect:");
    for (const char *const *x = extra_request_headers; x && *x; x++) h = curl_slist_append(h, *x);
    if (extra_request_headers) {
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, collect_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)len);
    }
    r.curl = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    char *type = NULL;
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &type);
    snprintf(r.content_type, sizeof r.content_type, "%s", type ? type : "");
    curl_slist_free_all(h);
    if (!r.body) r.body = calloc(1, 1);
    return r;
}

static reply http(const fixture *f, const char *method, const char *path, const char *body) {
    return http_on(easy, f, method, path, body ? "application/json" : NULL, body, body ? strlen(body) : 0, KEY);
}

static json_t *reply_json(const reply *r) {
    json_error_t e;
    json_t *j = json_loadb(r->body, r->len, 0, &e);
    CHECK_MSG(j != NULL, "not JSON (%s): %.200s", e.text, r->body);
    return j;
}

/* A POST of `body` to f's /v1/completions (JSON, the API key, and `extra_header` when not NULL), its
 * reply collected into r; the caller performs it (or adds it to a multi handle) and frees it with
 * post_free. */
typedef struct post {
    CURL *c;
    struct curl_slist *h;
    reply r;
} post;

static post *post_new(const fixture *f, const char *body, const char *extra_header) {
    post *p = calloc(1, sizeof *p);
    char url[160];
    snprintf(url, sizeof url, "%s/v1/completions", f->base);
    p->h = curl_slist_append(curl_slist_append(NULL, "Content-Type: application/json"), "Authorization: Bearer " KEY);
    if (extra_header) p->h = curl_slist_append(p->h, extra_header);
    p->c = curl_easy_init();
    curl_easy_setopt(p->c, CURLOPT_URL, url);
    curl_easy_setopt(p->c, CURLOPT_HTTPHEADER, p->h);
    curl_easy_setopt(p->c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(p->c, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(p->c, CURLOPT_WRITEDATA, &p->r);
    curl_easy_setopt(p->c, CURLOPT_TIMEOUT, 60L);
    return p;
}

static void post_free(post *p) {
    curl_easy_cleanup(p->c);
    curl_slist_free_all(p->h);
    free(p->r.body);
    free(p);
}

/* The reply is vLLM's error object with `status`; its message contains `needle`. */
static bool is_error(const reply *r, long status, const char *needle) {
    json_error_t e;
    json_t *j = json_loadb(r->body, r->len, 0, &e);
    json_t *err = json_object_get(j, "error");
    json_t *msg = json_object_get(err, "message"), *type = json_object_get(err, "type"),
           *param = json_object_get(err, "param"), *code = json_object_get(err, "code");
    bool ok = r->status == status && json_is_string(msg) && json_is_string(type) && param &&
              (json_is_null(param) || json_is_string(param)) && json_integer_value(code) == status &&
              (!needle || strstr(json_string_value(msg), needle));
    if (!ok) fprintf(stderr, "expected %ld '%s', got %ld: %.300s\n", status, needle ? needle : "", r->status, r->body);
    json_decref(j);
    return ok;
}

/* ------------------------------------------------------------------------------------------------ */
/* SSE                                                                                               */

typedef struct stream_result {
    char *text[8];            /* per choice index */
    char *finish[8];
    int n_chunks;
    bool done_last, usage, well_formed;
    long completion_tokens;
} stream_result;

static void append_str(char **dst, const char *s) {
    size_t a = *dst ? strlen(*dst) : 0, b = strlen(s);
    *dst = realloc(*dst, a + b + 1);
    memcpy(*dst + a, s, b + 1);
}

static stream_result parse_sse(const char *body, bool chat) {
    stream_result s = {.well_formed = true};
    for (int i = 0; i < 8; i++) s.text[i] = calloc(1, 1);
    const char *p = body;
    while (*p) {
        const char *end = strstr(p, "\n\n");
        if (strncmp(p, "data: ", 6) || !end) {
            s.well_formed = false;
            break;
        }
        s.done_last = !strncmp(p + 6, "[DONE]", 6) && end == p + 12;
        if (!s.done_last) {
            json_t *j = json_loadb(p + 6, (size_t)(end - p - 6), 0, NULL);
            s.well_formed &= j != NULL;
            json_t *ch = json_object_get(j, "choices"), *usage = json_object_get(j, "usage");
            if (json_is_object(usage) && json_array_size(ch) == 0) {
                s.usage = true;
                s.completion_tokens = (long)json_integer_value(json_object_get(usage, "completion_tokens"));
            }
            for (size_t i = 0; i < json_array_size(ch); i++) {
                json_t *c = json_array_get(ch, i);
                size_t idx = (size_t)json_integer_value(json_object_get(c, "index")) & 7;
                json_t *t = chat ? json_object_get(json_object_get(c, "delta"), "content") : json_object_get(c, "text");
                if (json_is_string(t)) append_str(&s.text[idx], json_string_value(t));
                json_t *fr = json_object_get(c, "finish_reason");
                if (json_is_string(fr)) s.finish[idx] = strdup(json_string_value(fr));
            }
            s.n_chunks++;
            json_decref(j);
        }
        p = end + 2;
    }
    return s;
}

static void free_stream(stream_result *s) {
    for (int i = 0; i < 8; i++) {
        free(s->text[i]);
        free(s->finish[i]);
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Offline reference (the engine without the server)                                                */

static char **offline_greedy(const char *dir, const char *const *prompts, const int *max_tokens, size_t n) {
    cvllm_engine_options o = engine_options(dir, NULL);
    cvllm_engine *e = NULL;
    CHECK_MSG(cvllm_engine_create(&o, &e) == 0, "%s", cvllm_last_error());
    uint64_t *ids = calloc(n, sizeof *ids);
    char **texts = calloc(n, sizeof *texts);
    for (size_t i = 0; i < n; i++) {
        cvllm_sampling_params p;
        cvllm_sampling_params_default(e, &p);
        p.temperature = 0;
        p.max_tokens = max_tokens[i];
        cvllm_prompt pr = {.text = prompts[i]};
        CHECK_MSG(cvllm_engine_add_request(e, &pr, &p, &ids[i]) == 0, "'%s': %s", prompts[i], cvllm_last_error());
    }
    while (cvllm_engine_has_unfinished(e)) {
        const cvllm_request_output *const *outs;
        size_t n_outs;
        if (cvllm_engine_step(e, &outs, &n_outs)) break;
        for (size_t k = 0; k < n_outs; k++)
            for (size_t i = 0; i < n; i++)
                if (outs[k]->finished && ids[i] == outs[k]->request_id) texts[i] = strdup(outs[k]->outputs[0].text);
    }
    cvllm_engine_destroy(e);
    free(ids);
    return texts;
}

/* Every word tokenizes to ids below the test vocabulary's 4096. */
static const char *const words[] = {"I", "am", "in", "the", "house.", "We", "are", "at", "the", "house,", "and", "you",
                                    "see", "the", "box.", "It", "is", "on", "a", "big", "red", "box"};

/* Prompt i: the first 2 + i % 20 words, so lengths vary. */
static char *prompt_of(size_t i) {
    char *s = calloc(1, 256);
    for (size_t w = 0; w < 2 + i % 20; w++) {
        if (w) strcat(s, " ");
        strcat(s, words[w % (sizeof words / sizeof *words)]);
    }
    return s;
}

static char *completion_body(const char *prompt, int max_tokens, bool stream) {
    json_t *j = json_pack("{s:s, s:s, s:i, s:i, s:b}", "model", NAME, "prompt", prompt, "max_tokens", max_tokens,
                          "temperature", 0, "stream", stream);
    if (stream) json_object_set_new(j, "stream_options", json_pack("{s:b}", "include_usage", 1));
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

/* ------------------------------------------------------------------------------------------------ */
/* Metrics                                                                                           */

static double metric(const fixture *f, const char *name_and_labels) {
    reply r = http(f, "GET", "/metrics", NULL);
    double v = -1;
    char *p = strstr(r.body, name_and_labels);
    if (p && (p == r.body || p[-1] == '\n')) v = strtod(p + strlen(name_and_labels), NULL);
    free(r.body);
    return v;
}

#define LABELS "{engine=\"0\",model_name=\"" NAME "\"}"

/* Waits (up to `seconds`) until nothing runs and the KV cache is empty; returns the seconds taken. */
static double wait_idle(const fixture *f, double seconds) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        double dt = (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9;
        if (metric(f, "vllm:num_requests_running" LABELS " ") == 0 && metric(f, "vllm:kv_cache_usage_perc" LABELS " ") == 0 &&
            metric(f, "vllm:num_requests_waiting" LABELS " ") == 0)
            return dt;
        if (dt > seconds) return dt;
        usleep(20000);
    }
}

static double aborted_total(const fixture *f) {
    return metric(f, "vllm:request_success_total{engine=\"0\",finished_reason=\"abort\",model_name=\"" NAME "\"} ");
}

static double length_total(const fixture *f) {
    return metric(f, "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"" NAME "\"} ");
}

static char *scrape(const fixture *f) {
    reply r = http(f, "GET", "/metrics", NULL);
    CHECK_EQ_INT(r.status, 200);
    return r.body;
}

/* The value of one series ("name{labels} ", or "name " without labels) in a scrape; -1 if absent. */
static double sample_in(const char *text, const char *series) {
    for (const char *p = strstr(text, series); p; p = strstr(p + 1, series))
        if (p == text || p[-1] == '\n') return strtod(p + strlen(series), NULL);
    return -1;
}

/* Waits (up to 10 s) until the series reaches `want`: an HTTP request counts once its response has
 * gone out, which the client may see a moment earlier. */
static bool wait_for_sample(const fixture *f, const char *series, double want) {
    for (int i = 0; i < 500; i++) {
        char *text = scrape(f);
        double v = sample_in(text, series);
        free(text);
        if (v == want) return true;
        usleep(20000);
    }
    return false;
}

/* ------------------------------------------------------------------------------------------------ */
/* Tests                                                                                             */

static void test_small_endpoints(void) {
    reply r = http_on(easy, &ref_srv, "GET", "/health", NULL, NULL, 0, NULL);
    CHECK_EQ_INT(r.status, 200);
    CHECK_EQ_INT(r.len, 0);
    free(r.body);
    r = http_on(easy, &ref_srv, "HEAD", "/health", NULL, NULL, 0, NULL);
    CHECK_EQ_INT(r.status, 200);
    free(r.body);
    r = http_on(easy, &ref_srv, "POST", "/ping", NULL, NULL, 0, NULL);
    CHECK_EQ_INT(r.status, 200);
    free(r.body);
    r = http_on(easy, &ref_srv, "GET", "/version", NULL, NULL, 0, NULL);
    CHECK_CONTAINS(r.body, "\"version\":\"" CVLLM_VERSION "\"");
    free(r.body);
    r = http_on(easy, &ref_srv, "GET", "/metrics", NULL, NULL, 0, NULL);
    CHECK_EQ_INT(r.status, 200);
    CHECK_CONTAINS(r.content_type, "text/plain");
    CHECK_CONTAINS(r.body, "# TYPE vllm:e2e_request_latency_seconds histogram");
    free(r.body);

    /* API keys guard /v1 only. */
    r = http_on(easy, &ref_srv, "GET", "/v1/models", NULL, NULL, 0, NULL);
    CHECK(is_error(&r, 401, "Unauthorized"));
    free(r.body);
    r = http_on(easy, &ref_srv, "GET", "/v1/models", NULL, NULL, 0, "sk-wrong");
    CHECK(is_error(&r, 401, "Unauthorized"));
    free(r.body);
    const char *body = "{\"prompt\":\"I am\",\"max_tokens\":1}";
    r = http_on(easy, &ref_srv, "POST", "/v1/completions", "application/json", body, strlen(body), NULL);
    CHECK(is_error(&r, 401, NULL));
    free(r.body);
    r = http_on(easy, &ref_srv, "GET", "/v1/models", NULL, NULL, 0, "other-key");
    CHECK_EQ_INT(r.status, 200);
    free(r.body);
    r = http(&ref_srv, "GET", "/v1/models", NULL);
    json_t *j = reply_json(&r);
    json_t *data = json_object_get(j, "data");
    CHECK_STR_EQ(json_string_value(json_object_get(j, "object")), "list");
    CHECK_EQ_INT(json_array_size(data), 2);
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(data, 0), "id")), NAME);
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(data, 0), "owned_by")), "vllm");
    CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(data, 0), "max_model_len")), MAX_MODEL_LEN);
    json_decref(j);
    free(r.body);

    /* /tokenize and /detokenize round-trip, without a key. */
    const char *tk = "{\"prompt\":\"I am in the house\",\"return_token_strs\":true}";
    r = http_on(easy, &ref_srv, "POST", "/tokenize", "application/json", tk, strlen(tk), NULL);
    j = reply_json(&r);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "count")), 5);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "max_model_len")), MAX_MODEL_LEN);
    /* convert_ids_to_tokens spelling, as vLLM returns it: the byte-level vocabulary string "Ġhouse". */
    CHECK_STR_EQ(json_string_value(json_array_get(json_object_get(j, "token_strs"), 4)), "\xc4\xa0house");
    char *tokens = json_dumps(json_object_get(j, "tokens"), JSON_COMPACT);
    CHECK_STR_EQ(tokens, "[40,1079,304,279,3753]");
    char *detok = tu_strdupf("{\"tokens\":%s%s}", tokens, "");
    json_decref(j);
    free(r.body);
    r = http_on(easy, &ref_srv, "POST", "/detokenize", "application/json", detok, strlen(detok), NULL);
    j = reply_json(&r);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "prompt")), "I am in the house");
    json_decref(j);
    free(r.body);
    free(detok);
    free(tokens);
    const char *bad = "{\"tokens\":[5000]}";
    r = http_on(easy, &ref_srv, "POST", "/detokenize", "application/json", bad, strlen(bad), NULL);
    CHECK(is_error(&r, 400, "out of vocabulary"));
    free(r.body);
    r = http(&ref_srv, "GET", "/v1/nope", NULL);
    CHECK(is_error(&r, 404, "Not Found"));
    free(r.body);
    r = http(&ref_srv, "GET", "/v1/completions", NULL);
    CHECK(is_error(&r, 405, "Method Not Allowed"));
    free(r.body);
}

/* Every family vLLM's /metrics has and cvllm can produce, with its TYPE, its labels and vLLM's
 * buckets; the request histograms move by exactly what a few requests add, and the HTTP counts
 * follow the instrumentator vLLM installs (handler "none" for unknown paths, status classes, the
 * excluded /metrics and /health, no count for a 401 answered by the authentication middleware). */
static void test_metrics_families(void) {
    static const struct {
        const char *name, *type, *sample;
    } families[] = {
        {"process_virtual_memory_bytes", "gauge", "process_virtual_memory_bytes "},
        {"process_resident_memory_bytes", "gauge", "process_resident_memory_bytes "},
        {"process_start_time_seconds", "gauge", "process_start_time_seconds "},
        {"process_cpu_seconds_total", "counter", "process_cpu_seconds_total "},
        {"process_open_fds", "gauge", "process_open_fds "},
        {"process_max_fds", "gauge", "process_max_fds "},
        {"vllm:num_requests_running", "gauge", "vllm:num_requests_running" LABELS " "},
        {"vllm:prompt_tokens_total", "counter", "vllm:prompt_tokens_total" LABELS " "},
        {"vllm:prefix_cache_hits_total", "counter", "vllm:prefix_cache_hits_total" LABELS " "},
        {"vllm:request_success_total", "counter",
         "vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"" NAME "\"} "},
        {"vllm:request_prompt_tokens", "histogram",
         "vllm:request_prompt_tokens_bucket{engine=\"0\",le=\"2000.0\",model_name=\"" NAME "\"} "},
        {"vllm:request_generation_tokens", "histogram", "vllm:request_generation_tokens_sum" LABELS " "},
        {"vllm:iteration_tokens_total", "histogram",
         "vllm:iteration_tokens_total_bucket{engine=\"0\",le=\"16384.0\",model_name=\"" NAME "\"} "},
        {"vllm:request_max_num_generation_tokens", "histogram",
         "vllm:request_max_num_generation_tokens_bucket{engine=\"0\",le=\"1.0\",model_name=\"" NAME "\"} "},
        {"vllm:request_params_n", "histogram",
         "vllm:request_params_n_bucket{engine=\"0\",le=\"20.0\",model_name=\"" NAME "\"} "},
        {"vllm:request_params_max_tokens", "histogram", "vllm:request_params_max_tokens_count" LABELS " "},
        {"vllm:time_to_first_token_seconds", "histogram",
         "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"2560.0\",model_name=\"" NAME "\"} "},
        {"vllm:inter_token_latency_seconds", "histogram", "vllm:inter_token_latency_seconds_count" LABELS " "},
        {"vllm:request_time_per_output_token_seconds", "histogram",
         "vllm:request_time_per_output_token_seconds_bucket{engine=\"0\",le=\"0.025\",model_name=\"" NAME "\"} "},
        {"vllm:e2e_request_latency_seconds", "histogram", "vllm:e2e_request_latency_seconds_count" LABELS " "},
        {"vllm:request_queue_time_seconds", "histogram",
         "vllm:request_queue_time_seconds_bucket{engine=\"0\",le=\"7680.0\",model_name=\"" NAME "\"} "},
        {"vllm:request_inference_time_seconds", "histogram", "vllm:request_inference_time_seconds_sum" LABELS " "},
        {"vllm:request_prefill_time_seconds", "histogram", "vllm:request_prefill_time_seconds_sum" LABELS " "},
        {"vllm:request_decode_time_seconds", "histogram", "vllm:request_decode_time_seconds_sum" LABELS " "},
        {"http_requests_total", "counter",
         "http_requests_total{handler=\"/v1/completions\",method=\"POST\",status=\"2xx\"} "},
        {"http_request_duration_highr_seconds", "histogram", "http_request_duration_highr_seconds_bucket{le=\"60.0\"} "},
        {"http_request_duration_seconds", "histogram",
         "http_request_duration_seconds_bucket{handler=\"/v1/completions\",le=\"+Inf\",method=\"POST\"} "},
    };
    /* The per-request and per-step histograms, whose counts and sums the requests below move. */
    static const char *const hist_series[] = {
        "vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:request_max_num_generation_tokens",
        "vllm:request_params_n", "vllm:request_params_max_tokens", "vllm:iteration_tokens_total",
        "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds", "vllm:request_inference_time_seconds",
        "vllm:request_time_per_output_token_seconds"};
    enum { PROMPT, GENERATION, MAX_GENERATION, N, MAX_TOKENS, ITERATION, TTFT, E2E, QUEUE, PREFILL, DECODE, INFERENCE,
           TPOT, N_HIST };
    static const struct {
        int n_prompt, max_tokens, n;
    } reqs[] = {{7, 3, 1}, {20, 5, 2}, {33, 1, 1}};
    const char *ok_series = "http_requests_total{handler=\"/v1/completions\",method=\"POST\",status=\"2xx\"} ";
    const char *none_series = "http_requests_total{handler=\"none\",method=\"GET\",status=\"4xx\"} ";
    const char *models_series = "http_requests_total{handler=\"/v1/models\",method=\"GET\",status=\"4xx\"} ";
    const char *lat_series = "http_request_duration_seconds_count{handler=\"/v1/completions\",method=\"POST\"} ";
    CHECK(wait_idle(&ref_srv, 30) < 30);
    char *before = scrape(&ref_srv);
    double count0[N_HIST], sum0[N_HIST];
    char series[256];
    for (int h = 0; h < N_HIST; h++) {
        snprintf(series, sizeof series, "%s_count" LABELS " ", hist_series[h]);
        count0[h] = sample_in(before, series);
        snprintf(series, sizeof series, "%s_sum" LABELS " ", hist_series[h]);
        sum0[h] = sample_in(before, series);
    }
    double ok0 = fmax(sample_in(before, ok_series), 0), none0 = fmax(sample_in(before, none_series), 0);
    double models0 = sample_in(before, models_series), lat0 = fmax(sample_in(before, lat_series), 0);
    double highr0 = sample_in(before, "http_request_duration_highr_seconds_count ");

    int prompt_sum = 0, gen_sum = 0, longest_sum = 0, n_sum = 0, max_tokens_sum = 0;
    for (size_t i = 0; i < sizeof reqs / sizeof *reqs; i++) {
        json_t *ids = json_array();
        for (int t = 0; t < reqs[i].n_prompt; t++) json_array_append_new(ids, json_integer((t * 67 + (int)i * 5 + 9) % 4096));
        json_t *j = json_pack("{s:s, s:o, s:i, s:i, s:i, s:b}", "model", NAME, "prompt", ids, "max_tokens",
                              reqs[i].max_tokens, "temperature", 0, "n", reqs[i].n, "ignore_eos", 1);
        char *body = json_dumps(j, JSON_COMPACT);
        reply r = http(&ref_srv, "POST", "/v1/completions", body);
        CHECK_MSG(r.status == 200, "%ld: %.200s", r.status, r.body);
        free(r.body);
        free(body);
        json_decref(j);
        prompt_sum += reqs[i].n_prompt;
        gen_sum += reqs[i].max_tokens * reqs[i].n;
        longest_sum += reqs[i].max_tokens;
        n_sum += reqs[i].n;
        max_tokens_sum += reqs[i].max_tokens;
    }
    reply r = http(&ref_srv, "GET", "/v1/nope", NULL);
    CHECK_EQ_INT(r.status, 404);
    free(r.body);
    r = http_on(easy, &ref_srv, "GET", "/health", NULL, NULL, 0, NULL);
    free(r.body);
    r = http_on(easy, &ref_srv, "GET", "/v1/models", NULL, NULL, 0, NULL);
    CHECK_EQ_INT(r.status, 401);
    free(r.body);
    CHECK(wait_for_sample(&ref_srv, none_series, none0 + 1));
    CHECK(wait_for_sample(&ref_srv, ok_series, ok0 + 3));
    CHECK(wait_idle(&ref_srv, 30) < 30);
    char *after = scrape(&ref_srv);

    for (size_t i = 0; i < sizeof families / sizeof *families; i++) {
        char type_line[160];
        snprintf(type_line, sizeof type_line, "\n# TYPE %s %s\n", families[i].name, families[i].type);
        CHECK_MSG(strstr(after, type_line), "no '%s'", type_line + 1);
        CHECK_MSG(sample_in(after, families[i].sample) >= 0, "no sample '%s'", families[i].sample);
    }
    CHECK(!strstr(after, "vllm:time_per_output_token_seconds")); /* renamed; hidden in current vLLM */
    double d_count[N_HIST], d_sum[N_HIST];
    for (int h = 0; h < N_HIST; h++) {
        snprintf(series, sizeof series, "%s_count" LABELS " ", hist_series[h]);
        double count = sample_in(after, series);
        d_count[h] = count - count0[h];
        /* One observation per finished request; iteration tokens one per step (with outputs). */
        int want = h == ITERATION ? longest_sum : 3;
        CHECK_MSG(d_count[h] == want, "%s: %g more observations, expected %d", hist_series[h], d_count[h], want);
        snprintf(series, sizeof series, "%s_bucket{engine=\"0\",le=\"+Inf\",model_name=\"" NAME "\"} ", hist_series[h]);
        CHECK_MSG(sample_in(after, series) == count, "%s: the +Inf bucket is not the count", hist_series[h]);
        snprintf(series, sizeof series, "%s_sum" LABELS " ", hist_series[h]);
        d_sum[h] = sample_in(after, series) - sum0[h];
    }
    CHECK_EQ_INT((int)d_sum[PROMPT], prompt_sum);
    CHECK_EQ_INT((int)d_sum[GENERATION], gen_sum); /* all completions */
    CHECK_EQ_INT((int)d_sum[MAX_GENERATION], longest_sum);
    CHECK_EQ_INT((int)d_sum[N], n_sum);
    CHECK_EQ_INT((int)d_sum[MAX_TOKENS], max_tokens_sum);
    /* vLLM's iteration tokens: each request's prompt in the step of its first token, plus every
     * generated token; the requests ran one at a time, one step per output token. */
    CHECK_EQ_INT((int)d_sum[ITERATION], prompt_sum + gen_sum);
    for (int h = TTFT; h < N_HIST; h++) CHECK_MSG(d_sum[h] >= 0, "%s: negative time", hist_series[h]);
    CHECK(fabs(d_sum[INFERENCE] - (d_sum[PREFILL] + d_sum[DECODE])) < 1e-6);
    CHECK(d_sum[E2E] > d_sum[INFERENCE] && d_sum[E2E] >= d_sum[QUEUE]);
    CHECK(d_sum[DECODE] > 0 && d_sum[TPOT] > 0);
    /* HTTP: 3 completions, the 404 under "none"; not the 401, /health or the scrapes. */
    CHECK(sample_in(after, ok_series) == ok0 + 3);
    CHECK(sample_in(after, none_series) == none0 + 1);
    CHECK(sample_in(after, models_series) == models0);
    CHECK(sample_in(after, lat_series) == lat0 + 3);
    CHECK(sample_in(after, "http_request_duration_highr_seconds_count ") == highr0 + 4);
    CHECK(!strstr(after, "handler=\"/health\"") && !strstr(after, "handler=\"/metrics\""));
    /* The process, from /proc. */
    double start = sample_in(after, "process_start_time_seconds "), now = (double)time(NULL);
    CHECK(start > now - 3600 && start <= now + 1);
    CHECK(sample_in(after, "process_resident_memory_bytes ") > 1e6);
    CHECK(sample_in(after, "process_virtual_memory_bytes ") >= sample_in(after, "process_resident_memory_bytes "));
    CHECK(sample_in(after, "process_cpu_seconds_total ") > 0);
    double fds = sample_in(after, "process_open_fds ");
    CHECK(fds > 3 && fds <= sample_in(after, "process_max_fds "));
    free(before);
    free(after);
}

/* lm-eval's loglikelihood requests (local-completions: a token-id prompt, echo, logprobs=1,
 * max_tokens=1, temperature 0, a seed) for four choices that share a long context, one after the
 * other. The 2nd to 4th find the context in the prefix cache — its blocks were cached in the very
 * step that computed them, though every request finishes there — and their logprobs are those of a
 * cold run (the same request with its own cache_salt), bit for bit. */
static void test_loglikelihood_prefix_cache(void) {
    enum { CONTEXT = 150, CHOICES = 4 };
    double hits0 = metric(&ref_srv, "vllm:prefix_cache_hits_total" LABELS " ");
    size_t cached_sum = 0;
    for (int c = 0; c < CHOICES; c++) {
        json_t *ids = json_array();
        for (int t = 0; t < CONTEXT; t++) json_array_append_new(ids, json_integer((t * 151 + 17) % 4096));
        for (int t = 0; t < 3 + c; t++) json_array_append_new(ids, json_integer((c * 977 + t * 31 + 5) % 4096));
        json_t *j = json_pack("{s:s, s:o, s:i, s:i, s:i, s:i, s:b}", "model", NAME, "prompt", ids, "temperature", 0,
                              "max_tokens", 1, "logprobs", 1, "seed", 1234, "echo", 1);
        char *warm_body = json_dumps(j, JSON_COMPACT);
        char salt[32];
        snprintf(salt, sizeof salt, "cold-%d", c);
        json_object_set_new(j, "cache_salt", json_string(salt));
        char *cold_body = json_dumps(j, JSON_COMPACT);
        reply warm = http(&ref_srv, "POST", "/v1/completions", warm_body);
        reply cold = http(&ref_srv, "POST", "/v1/completions", cold_body);
        json_t *w = reply_json(&warm), *k = reply_json(&cold);
        json_t *wc = json_array_get(json_object_get(w, "choices"), 0), *kc = json_array_get(json_object_get(k, "choices"), 0);
        json_int_t cached = json_integer_value(
            json_object_get(json_object_get(json_object_get(w, "usage"), "prompt_tokens_details"), "cached_tokens"));
        json_int_t cold_cached = json_integer_value(
            json_object_get(json_object_get(json_object_get(k, "usage"), "prompt_tokens_details"), "cached_tokens"));
        /* The context's 9 full blocks; the first choice found nothing. */
        CHECK_MSG(cached == (c ? 144 : 0), "choice %d: %lld tokens cached", c, (long long)cached);
        CHECK_EQ_INT(cold_cached, 0);
        json_t *lp = json_object_get(wc, "logprobs");
        CHECK_EQ_INT(json_array_size(json_object_get(lp, "token_logprobs")), CONTEXT + 3 + c + 1);
        CHECK_MSG(json_equal(lp, json_object_get(kc, "logprobs")), "choice %d: logprobs differ from a cold run", c);
        CHECK(json_equal(json_object_get(wc, "text"), json_object_get(kc, "text")));
        cached_sum += (size_t)cached;
        json_decref(w);
        json_decref(k);
        json_decref(j);
        free(warm.body);
        free(cold.body);
        free(warm_body);
        free(cold_body);
    }
    CHECK(metric(&ref_srv, "vllm:prefix_cache_hits_total" LABELS " ") == hits0 + (double)cached_sum);
}

/* The tutorials' requests: non-streaming and streaming agree, and match the offline engine. */
/* A second server on a port that is taken must fail to start, as uvicorn does ("address already in
 * use"), instead of silently sharing the port through SO_REUSEPORT and splitting the clients. */
static void test_port_in_use(void) {
    cv_server_options so = {.host = "127.0.0.1", .port = cv_server_port(ref_srv.srv), .model_root = ref_srv.dir};
    cv_server *second = NULL;
    CHECK_EQ_INT(cv_server_start(ref_srv.group, &so, &second), CVLLM_ERR_IO);
    CHECK(second == NULL);
    CHECK_CONTAINS(cvllm_last_error(), "cannot listen on 127.0.0.1:");
}

static void test_tutorial_completions(void) {
    const char *prompt = "I am in the house";
    int max_tokens = 24;
    char **expect = offline_greedy(ref_srv.dir, &prompt, &max_tokens, 1);
    char *body = completion_body(prompt, max_tokens, false);
    reply r = http(&ref_srv, "POST", "/v1/completions", body);
    CHECK_EQ_INT(r.status, 200);
    CHECK_CONTAINS(r.content_type, "application/json");
    json_t *j = reply_json(&r);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_STR_EQ(json_string_value(json_object_get(c, "text")), expect[0]);
    CHECK_STR_EQ(json_string_value(json_object_get(c, "finish_reason")), "length");
    CHECK(!strncmp(json_string_value(json_object_get(j, "id")), "cmpl-", 5));
    CHECK_STR_EQ(json_string_value(json_object_get(j, "model")), NAME);
    json_t *u = json_object_get(j, "usage");
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "prompt_tokens")), 5);
    CHECK_EQ_INT(json_integer_value(json_object_get(u, "completion_tokens")), max_tokens);
    CHECK(json_is_object(json_object_get(u, "prompt_tokens_details")));
    json_decref(j);
    free(r.body);
    free(body);

    body = completion_body(prompt, max_tokens, true);
    r = http(&ref_srv, "POST", "/v1/completions", body);
    CHECK_EQ_INT(r.status, 200);
    CHECK_CONTAINS(r.content_type, "text/event-stream");
    stream_result s = parse_sse(r.body, false);
    CHECK(s.well_formed && s.done_last && s.usage);
    CHECK_STR_EQ(s.text[0], expect[0]);
    CHECK_STR_EQ(s.finish[0], "length");
    CHECK_EQ_INT(s.completion_tokens, max_tokens);
    free_stream(&s);
    free(r.body);
    free(body);

    /* The served-name alias, a stop string taken from the expected text, n > 1, echo, logprobs. */
    /* Three ASCII bytes from the second half of the expected text, so the stop string is valid UTF-8. */
    char stop[8] = {0};
    size_t len = strlen(expect[0]), cut = len / 2;
    while (cut + 3 <= len && ((expect[0][cut] | expect[0][cut + 1] | expect[0][cut + 2]) & 0x80)) cut++;
    CHECK(cut + 3 <= len);
    memcpy(stop, expect[0] + (cut + 3 <= len ? cut : 0), 3);
    json_t *req = json_pack("{s:s, s:s, s:i, s:i, s:s, s:i, s:b, s:i, s:i}", "model", "alias", "prompt", prompt,
                            "max_tokens", max_tokens, "temperature", 0, "stop", stop, "n", 2, "echo", 1, "logprobs", 2,
                            "prompt_logprobs", 1);
    body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    r = http(&ref_srv, "POST", "/v1/completions", body);
    j = reply_json(&r);
    json_t *choices = json_object_get(j, "choices");
    CHECK_EQ_INT(json_array_size(choices), 2);
    const char *first_stop = strstr(expect[0], stop);
    for (size_t i = 0; i < json_array_size(choices); i++) {
        c = json_array_get(choices, i);
        const char *text = json_string_value(json_object_get(c, "text"));
        CHECK(text && !strncmp(text, prompt, strlen(prompt)));
        CHECK(text && first_stop && strlen(text) == strlen(prompt) + (size_t)(first_stop - expect[0]) &&
              !strncmp(text + strlen(prompt), expect[0], (size_t)(first_stop - expect[0])));
        CHECK_STR_EQ(json_string_value(json_object_get(c, "finish_reason")), "stop");
        CHECK_STR_EQ(json_string_value(json_object_get(c, "stop_reason")), stop);
        json_t *lp = json_object_get(c, "logprobs");
        size_t n_tok = json_array_size(json_object_get(lp, "tokens"));
        CHECK(n_tok > 5 && n_tok == json_array_size(json_object_get(lp, "token_logprobs")));
        CHECK(json_is_null(json_array_get(json_object_get(lp, "token_logprobs"), 0)));
        CHECK(json_object_size(json_array_get(json_object_get(lp, "top_logprobs"), 5)) <= 3);
        CHECK(json_is_null(json_array_get(json_object_get(c, "prompt_logprobs"), 0)));
        CHECK_EQ_INT(json_array_size(json_object_get(c, "prompt_logprobs")), 5);
    }
    json_decref(j);
    free(r.body);
    free(body);

    /* Token-id prompts and a list of prompts. */
    r = http(&ref_srv, "POST", "/v1/completions",
             "{\"prompt\":[[40,1079,304,279,3753],[40,1079]],\"max_tokens\":24,\"temperature\":0}");
    j = reply_json(&r);
    choices = json_object_get(j, "choices");
    CHECK_EQ_INT(json_array_size(choices), 2);
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(choices, 0), "text")), expect[0]);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_array_get(choices, 1), "index")), 1);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), 7);
    json_decref(j);
    free(r.body);

    /* A seed makes sampling repeatable. */
    const char *seeded = "{\"prompt\":\"I am\",\"max_tokens\":12,\"temperature\":1.0,\"top_k\":-1,\"top_p\":1,\"seed\":7}";
    reply a = http(&ref_srv, "POST", "/v1/completions", seeded), b = http(&ref_srv, "POST", "/v1/completions", seeded);
    json_t *ja = reply_json(&a), *jb = reply_json(&b);
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(json_object_get(ja, "choices"), 0), "text")),
                 json_string_value(json_object_get(json_array_get(json_object_get(jb, "choices"), 0), "text")));
    json_decref(ja);
    json_decref(jb);
    free(a.body);
    free(b.body);
    free(expect[0]);
    free(expect);
}

/* 64 streaming clients at once, mixed prompt and output lengths. */
static void test_concurrent_streams(void) {
    enum { N = 64 };
    const char *prompts[N];
    int max_tokens[N];
    char *bodies[N];
    for (size_t i = 0; i < N; i++) {
        prompts[i] = prompt_of(i);
        max_tokens[i] = 4 + (int)(i * 7 % 41);
        bodies[i] = completion_body(prompts[i], max_tokens[i], true);
    }
    char **expect = offline_greedy(ref_srv.dir, prompts, max_tokens, N);
    CURLM *m = curl_multi_init();
    post *h[N];
    for (size_t i = 0; i < N; i++) {
        h[i] = post_new(&ref_srv, bodies[i], NULL);
        curl_multi_add_handle(m, h[i]->c);
    }
    int running = 1;
    while (running) {
        curl_multi_perform(m, &running);
        if (running) curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    int ok = 0;
    for (size_t i = 0; i < N; i++) {
        reply *r = &h[i]->r;
        curl_easy_getinfo(h[i]->c, CURLINFO_RESPONSE_CODE, &r->status);
        stream_result s = parse_sse(r->body ? r->body : "", false);
        bool good = r->status == 200 && s.well_formed && s.done_last && expect[i] && !strcmp(s.text[0], expect[i]) &&
                    s.completion_tokens == max_tokens[i];
        CHECK_MSG(good, "client %zu: status %ld, text '%s', expected '%s'", i, r->status, s.text[0],
                  expect[i] ? expect[i] : "?");
        ok += good;
        free_stream(&s);
        curl_multi_remove_handle(m, h[i]->c);
        post_free(h[i]);
        free(bodies[i]);
        free((char *)prompts[i]);
        free(expect[i]);
    }
    CHECK_EQ_INT(ok, N);
    free(expect);
    curl_multi_cleanup(m);
    CHECK_MSG(wait_idle(&ref_srv, 5) < 5, "the KV cache did not drain after the streams");
}

/* A streaming client and a non-streaming one hang up mid-way; another stream is unaffected. */
static size_t drop_after_three(char *data, size_t size, size_t n, void *user) {
    reply *r = user;
    collect(data, size, n, user);
    int chunks = 0;
    for (const char *p = r->body; (p = strstr(p, "data: ")); p += 6) chunks++;
    return chunks >= 3 ? 0 : size * n; /* 0 makes libcurl abort the transfer and close the socket */
}

/* Posts `body` to the reference server's completions and hangs up after 300 ms without an answer. */
static void give_up_after_300ms(const fixture *f, const char *body) {
    post *p = post_new(f, body, NULL);
    curl_easy_setopt(p->c, CURLOPT_TIMEOUT_MS, 300L);
    CHECK_EQ_INT(curl_easy_perform(p->c), CURLE_OPERATION_TIMEDOUT);
    post_free(p);
}

static void test_disconnects(void) {
    double aborted0 = aborted_total(&ref_srv);
    const char *prompt = "We are at the house";
    int short_tokens = 16;
    char **expect = offline_greedy(ref_srv.dir, &prompt, &short_tokens, 1);
    const char *long_body = "{\"prompt\":\"I am in the house\",\"max_tokens\":4000,\"temperature\":0,\"ignore_eos\":true,\"stream\":true}";
    char *short_body = completion_body(prompt, short_tokens, true);
    CURLM *m = curl_multi_init();
    post *dropper = post_new(&ref_srv, long_body, NULL), *other = post_new(&ref_srv, short_body, NULL);
    curl_easy_setopt(dropper->c, CURLOPT_WRITEFUNCTION, drop_after_three);
    curl_multi_add_handle(m, dropper->c);
    curl_multi_add_handle(m, other->c);
    int running = 1;
    while (running) {
        curl_multi_perform(m, &running);
        if (running) curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left)))
        if (msg->easy_handle == dropper->c) CHECK_EQ_INT(msg->data.result, CURLE_WRITE_ERROR);
    stream_result s = parse_sse(other->r.body ? other->r.body : "", false);
    CHECK(s.done_last);
    CHECK_STR_EQ(s.text[0], expect[0]);
    free_stream(&s);
    curl_multi_remove_handle(m, dropper->c);
    curl_multi_remove_handle(m, other->c);
    post_free(dropper);
    post_free(other);
    curl_multi_cleanup(m);
    double dt = wait_idle(&ref_srv, 3);
    CHECK_MSG(dt < 3, "blocks of the dropped stream not freed after %.2f s", dt);
    CHECK(aborted_total(&ref_srv) == aborted0 + 1);

    /* Non-streaming: the client gives up after 300 ms. */
    give_up_after_300ms(&ref_srv, "{\"prompt\":\"I am in the house\",\"max_tokens\":4000,\"temperature\":0,\"ignore_eos\":true}");
    dt = wait_idle(&ref_srv, 3);
    CHECK_MSG(dt < 3, "blocks of the abandoned request not freed after %.2f s", dt);
    CHECK(aborted_total(&ref_srv) == aborted0 + 2);
    free(short_body);
    free(expect[0]);
    free(expect);
}

/* One malformed request of kind k (variant v); returns whether the reply was the right error. */
static bool malformed(size_t k, size_t v) {
    char buf[512];
    const char *ct = "application/json";
    const char *key = KEY, *path = "/v1/completions";
    const char *body = buf;
    size_t len = 0;
    long status = 400;
    const char *needle = NULL;
    char *big = NULL;
    switch (k) {
    case 0: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"max_tokens\": %zu", v); needle = "JSON decode error"; break;
    case 1: snprintf(buf, sizeof buf, "[%zu]", v); needle = "JSON object"; break;
    case 2: snprintf(buf, sizeof buf, "{\"prompt\": %zu}", v); break;
    case 3: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"max_tokens\": \"%zu tokens\"}", v); needle = "valid integer"; break;
    case 4: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"temperature\": [%zu]}", v); break;
    case 5: snprintf(buf, sizeof buf, "{\"prompt\": \"I am \xff\xfe%zu\"}", v); needle = "JSON decode error"; break;
    case 6: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"max_tokens\": %zu0000000000000000000000}", v + 1); break;
    case 7: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"max_tokens\": -%zu}", v + 1); needle = "at least 1"; break;
    case 8: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"n\": %zu}", 1000 + v); needle = "n must be"; break;
    case 9: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"temperature\": -%zu.5}", v); needle = "temperature"; break;
    case 10: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"top_p\": %zu.5}", v + 1); needle = "top_p"; break;
    case 11: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"model\": \"gpt-%zu\"}", v); status = 404; needle = "does not exist"; break;
    case 12: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\"}"); ct = v % 2 ? "text/plain" : "application/x-www-form-urlencoded"; status = 415; needle = "application/json"; break;
    case 13:
        big = malloc(MAX_BODY + 100 + v);
        memset(big, ' ', MAX_BODY + 100 + v);
        memcpy(big, "{\"prompt\":\"", 11);
        big[MAX_BODY + 98 + v] = '"';
        big[MAX_BODY + 99 + v] = '}';
        body = big;
        len = MAX_BODY + 100 + v;
        status = 413;
        needle = "too large";
        break;
    case 14: {
        /* A prompt longer than max_model_len, as token ids. */
        size_t n = MAX_MODEL_LEN + v;
        big = malloc(n * 3 + 64);
        char *w = big + sprintf(big, "{\"prompt\":[40");
        for (size_t i = 1; i < n; i++) w += sprintf(w, ",40");
        strcpy(w, "]}");
        body = big;
        needle = "maximum context length";
        break;
    }
    case 15: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"max_tokens\": %zu}", MAX_MODEL_LEN + v); needle = "is too large"; break;
    case 16: snprintf(buf, sizeof buf, "{\"prompt\": [40, %zu]}", 4096 + v * 1000); needle = "out of vocabulary"; break;
    case 17: snprintf(buf, sizeof buf, "{\"prompt\": [40, -%zu]}", v + 1); needle = "greater than or equal to 0"; break;
    case 18: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"stream_options\": {\"include_usage\": true}, \"n\": %zu}", v % 3 + 1); needle = "stream=True"; break;
    case 19: snprintf(buf, sizeof buf, "{\"prompt\": \"\", \"max_tokens\": %zu}", v + 1); needle = "empty"; break;
    case 20: snprintf(buf, sizeof buf, "{\"messages\": %zu}", v); path = "/v1/chat/completions"; break;
    case 21: snprintf(buf, sizeof buf, "{\"messages\": [{\"role\": \"user\", \"content\": \"%zu\"}], \"top_logprobs\": 2}", v); path = "/v1/chat/completions"; needle = "logprobs"; break;
    case 22: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"logprobs\": %zu}", 21 + v); needle = "max allowed"; break;
    case 23: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"stop\": [\"\"], \"seed\": %zu}", v); needle = "stop"; break;
    case 24: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"max_tokens\": %zu}", v); key = v % 2 ? "nope" : NULL; status = 401; break;
    default: snprintf(buf, sizeof buf, "{\"prompt\": \"I am\", \"seed\": 1%zu000000000000000000000}", v); break;
    }
    if (!len) len = strlen(body);
    reply r = http_on(easy, &ref_srv, "POST", path, ct, body, len, key);
    bool ok = is_error(&r, status, needle);
    free(r.body);
    free(big);
    return ok;
}

/* 1,000 malformed requests, with correct answers checked in between. */
static void test_malformed_requests(void) {
    enum { KINDS = 26, TOTAL = 1000 };
    const char *prompt = "It is on a big red box";
    int max_tokens = 8;
    char **expect = offline_greedy(ref_srv.dir, &prompt, &max_tokens, 1);
    char *good = completion_body(prompt, max_tokens, false);
    int bad = 0, good_ok = 0, good_n = 0;
    for (size_t i = 0; i < TOTAL; i++) {
        if (!malformed(i % KINDS, i / KINDS)) {
            bad++;
            CHECK_MSG(false, "malformed request %zu (kind %zu) got the wrong reply", i, i % KINDS);
        }
        if (i % 50 == 49) {
            reply r = http(&ref_srv, "POST", "/v1/completions", good);
            json_t *j = reply_json(&r);
            const char *t = json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text"));
            good_ok += r.status == 200 && t && !strcmp(t, expect[0]);
            good_n++;
            json_decref(j);
            free(r.body);
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(good_ok, good_n);
    free(good);
    free(expect[0]);
    free(expect);
    CHECK(wait_idle(&ref_srv, 3) < 3);
}

/* Chat through the Qwen3 template on the full-vocabulary model: streaming agrees with non-streaming. */
static void test_chat(void) {
    const char *base = "{\"model\":\"" NAME "\",\"messages\":[{\"role\":\"system\",\"content\":\"You are helpful.\"},"
                       "{\"role\":\"user\",\"content\":\"Give me a short introduction to large language models.\"}],"
                       "\"max_tokens\":20,\"temperature\":0,\"logprobs\":true,\"top_logprobs\":2";
    char *plain = tu_strdupf("%s%s", base, "}");
    char *streamed = tu_strdupf("%s%s", base, ",\"stream\":true,\"stream_options\":{\"include_usage\":true}}");
    reply r = http(&chat_srv, "POST", "/v1/chat/completions", plain);
    CHECK_EQ_INT(r.status, 200);
    json_t *j = reply_json(&r);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    const char *content = json_string_value(json_object_get(json_object_get(c, "message"), "content"));
    CHECK(content != NULL);
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(c, "message"), "role")), "assistant");
    CHECK(!strncmp(json_string_value(json_object_get(j, "id")), "chatcmpl-", 9));
    CHECK_STR_EQ(json_string_value(json_object_get(j, "object")), "chat.completion");
    json_t *lp = json_object_get(json_object_get(c, "logprobs"), "content");
    CHECK_EQ_INT(json_array_size(lp), 20);
    CHECK_EQ_INT(json_array_size(json_object_get(json_array_get(lp, 0), "top_logprobs")), 2);
    long prompt_tokens = (long)json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    reply s = http(&chat_srv, "POST", "/v1/chat/completions", streamed);
    stream_result sr = parse_sse(s.body, true);
    CHECK(sr.well_formed && sr.done_last && sr.usage);
    CHECK_STR_EQ(sr.text[0], content ? content : "");
    CHECK_STR_EQ(sr.finish[0], "length");
    free_stream(&sr);
    free(s.body);
    json_decref(j);
    free(r.body);

    /* /tokenize with messages counts the same prompt. */
    const char *tk = "{\"messages\":[{\"role\":\"system\",\"content\":\"You are helpful.\"},"
                     "{\"role\":\"user\",\"content\":\"Give me a short introduction to large language models.\"}]}";
    r = http(&chat_srv, "POST", "/tokenize", tk);
    j = reply_json(&r);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "count")), prompt_tokens);
    CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(j, "tokens"), 0)), 151644); /* <|im_start|> */
    json_decref(j);
    free(r.body);

    /* Without max_tokens the rest of the context is allowed; over the context it is a 400. */
    r = http(&chat_srv, "POST", "/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_completion_tokens\":5000}");
    CHECK(is_error(&r, 400, "maximum context length is 4096 tokens"));
    free(r.body);
    free(plain);
    free(streamed);
}

/* The concatenation of choices[0].delta.FIELD over a stream's chunks. */
static char *sse_delta_concat(const char *body, const char *fieldname) {
    char *out = calloc(1, 1);
    for (const char *p = body; (p = strstr(p, "data: {")) != NULL; p += 6) {
        const char *end = strstr(p, "\n\n");
        json_t *j = end ? json_loadb(p + 6, (size_t)(end - p - 6), 0, NULL) : NULL;
        json_t *d = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
        json_t *v = json_object_get(d, fieldname);
        if (json_is_string(v)) append_str(&out, json_string_value(v));
        json_decref(j);
    }
    return out;
}

#define MESSAGES "[{\"role\":\"system\",\"content\":\"You are helpful.\"},{\"role\":\"user\",\"content\":\"What is the weather in Paris?\"}]"
#define TOOLS                                                                                                  \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Current weather\","        \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]"

/* The prompt the chat library renders for the fixture's template, and its tokens. */
static char *library_prompt(const char *tools, const char *documents, const char *kwargs, int32_t **ids, size_t *n) {
    json_t *m = json_loads(MESSAGES, 0, NULL), *t = json_loads(tools, 0, NULL), *d = json_loads(documents, 0, NULL),
           *k = json_loads(kwargs, 0, NULL);
    cv_chat_request cr = {.messages = m, .tools = t, .documents = d, .kwargs = k, .add_generation_prompt = true};
    char *text = NULL;
    CHECK(cv_chat_render(chat_srv.tmpl, &cr, &text, NULL) == 0);
    const cvllm_tokenizer *tok = cvllm_engine_tokenizer(cv_engine_group_engine(chat_srv.group));
    CHECK(cvllm_tokenize(tok, text, strlen(text), ids, n) == CVLLM_OK);
    json_decref(m);
    json_decref(t);
    json_decref(d);
    json_decref(k);
    return text;
}

static bool same_ids(const json_t *a, const int32_t *ids, size_t n) {
    if (json_array_size(a) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (json_integer_value(json_array_get(a, i)) != ids[i]) return false;
    return true;
}

/* One request with extra header lines (`hdrs`, NULL-terminated), its reply's headers collected. */
static reply http_with(const fixture *f, const char *method, const char *path, const char *body, const char *key,
                       const char *const *hdrs) {
    extra_request_headers = hdrs;
    reply r = http_on(easy, f, method, path, body ? "application/json" : NULL, body, body ? strlen(body) : 0, key);
    extra_request_headers = NULL;
    return r;
}

static void free_reply(reply *r) {
    free(r->body);
    free(r->headers);
}

/* Whether reply header `name` is `want` (NULL: absent). */
static bool header_is(const reply *r, const char *name, const char *want) {
    char buf[512];
    const char *v = header_of(r, name, buf, sizeof buf);
    if (!want || !v) return !want && !v;
    return !strcmp(v, want);
}

/* CORS as vLLM's Starlette middleware answers it: with the defaults (every origin, method and
 * header), a preflight is 200 "OK" without an API key, the requested headers mirrored; a request
 * with an Origin gets Access-Control-Allow-Origin "*" (its own origin when it sends a cookie), one
 * without none; a 401 none; an OPTIONS that is no preflight is a 405. With lists and credentials (a
 * second server on the same engines), allowed origins are echoed, the rest refused by name. */
static void test_cors(void) {
    const char *const preflight[] = {"Origin: http://app.example", "Access-Control-Request-Method: POST",
                                     "Access-Control-Request-Headers: content-type, authorization", NULL};
    reply r = http_with(&chat_srv, "OPTIONS", "/v1/chat/completions", NULL, NULL, preflight);
    CHECK_EQ_INT(r.status, 200);
    CHECK_STR_EQ(r.body, "OK");
    CHECK(header_is(&r, "access-control-allow-origin", "*"));
    CHECK(header_is(&r, "access-control-allow-methods", "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"));
    CHECK(header_is(&r, "access-control-max-age", "600"));
    CHECK(header_is(&r, "access-control-allow-headers", "content-type, authorization"));
    CHECK(header_is(&r, "access-control-allow-credentials", NULL));
    free_reply(&r);
    const char *const origin[] = {"Origin: http://app.example", NULL};
    r = http_with(&chat_srv, "GET", "/v1/models", NULL, KEY, origin);
    CHECK_EQ_INT(r.status, 200);
    CHECK(header_is(&r, "access-control-allow-origin", "*") && header_is(&r, "vary", NULL));
    free_reply(&r);
    const char *const cookie[] = {"Origin: http://app.example", "Cookie: a=1", NULL};
    r = http_with(&chat_srv, "GET", "/v1/models", NULL, KEY, cookie);
    CHECK(header_is(&r, "access-control-allow-origin", "http://app.example") && header_is(&r, "vary", "Origin"));
    free_reply(&r);
    const char *const none[] = {NULL};
    r = http_with(&chat_srv, "GET", "/v1/models", NULL, KEY, none);
    CHECK(header_is(&r, "access-control-allow-origin", NULL));
    free_reply(&r);
    r = http_with(&chat_srv, "GET", "/v1/models", NULL, "wrong", origin);
    CHECK_EQ_INT(r.status, 401);
    CHECK(header_is(&r, "access-control-allow-origin", NULL));
    free_reply(&r);
    r = http_with(&chat_srv, "OPTIONS", "/v1/chat/completions", NULL, KEY, origin);
    CHECK_EQ_INT(r.status, 405);
    CHECK(header_is(&r, "access-control-allow-origin", "*"));
    free_reply(&r);

    static const char *names[] = {NAME};
    static const char *origins[] = {"http://ok.example"}, *methods[] = {"GET", "POST"}, *headers[] = {"X-Trace"};
    cv_server_options so = {.host = "127.0.0.1", .served_model_names = names, .n_served_model_names = 1,
                            .model_root = ref_srv.dir, .allowed_origins = origins, .n_allowed_origins = 1,
                            .allowed_methods = methods, .n_allowed_methods = 2, .allowed_headers = headers,
                            .n_allowed_headers = 1, .allow_credentials = true};
    fixture f = {0};
    CHECK_MSG(cv_server_start(ref_srv.group, &so, &f.srv) == 0, "server: %s", cvllm_last_error());
    snprintf(f.base, sizeof f.base, "http://127.0.0.1:%d", cv_server_port(f.srv));
    const char *const ok[] = {"Origin: http://ok.example", "Access-Control-Request-Method: POST",
                              "Access-Control-Request-Headers: X-Trace, Content-Type", NULL};
    r = http_with(&f, "OPTIONS", "/v1/completions", NULL, NULL, ok);
    CHECK_EQ_INT(r.status, 200);
    CHECK(header_is(&r, "access-control-allow-origin", "http://ok.example") && header_is(&r, "vary", "Origin"));
    CHECK(header_is(&r, "access-control-allow-methods", "GET, POST"));
    CHECK(header_is(&r, "access-control-allow-headers", "Accept, Accept-Language, Content-Language, Content-Type, X-Trace"));
    CHECK(header_is(&r, "access-control-allow-credentials", "true"));
    free_reply(&r);
    const char *const bad[] = {"Origin: http://evil.example", "Access-Control-Request-Method: PUT",
                               "Access-Control-Request-Headers: X-Other", NULL};
    r = http_with(&f, "OPTIONS", "/v1/completions", NULL, NULL, bad);
    CHECK_EQ_INT(r.status, 400);
    CHECK_STR_EQ(r.body, "Disallowed CORS origin, method, headers");
    CHECK(header_is(&r, "access-control-allow-origin", NULL));
    free_reply(&r);
    const char *const ok_origin[] = {"Origin: http://ok.example", NULL}, *const evil[] = {"Origin: http://evil.example", NULL};
    r = http_with(&f, "GET", "/v1/models", NULL, NULL, ok_origin);
    CHECK(header_is(&r, "access-control-allow-origin", "http://ok.example") &&
          header_is(&r, "access-control-allow-credentials", "true"));
    free_reply(&r);
    r = http_with(&f, "GET", "/v1/models", NULL, NULL, evil);
    CHECK_EQ_INT(r.status, 200);
    CHECK(header_is(&r, "access-control-allow-origin", NULL));
    free_reply(&r);
    cv_server_stop(f.srv, 0);
}

/* GET `path` over the Unix socket `sock`: the status (0 when nothing answered). */
static long get_over_unix(const char *sock, const char *path) {
    CURL *c = curl_easy_init();
    char url[128];
    snprintf(url, sizeof url, "http://localhost%s", path);
    reply r = {0};
    curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, sock);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    long status = 0;
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    free(r.body);
    return status;
}

/* vLLM's --uds: the API on a Unix socket. A socket file left by a server that is gone is taken
 * over; a live server's path, or a path that is no socket, fails in one line; the path goes when
 * the server stops. */
static void test_unix_socket(void) {
    char *dir = tu_make_temp_dir(), *sock = tu_strdupf("%s/%s", dir, "api.sock");
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", sock);
    int stale = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(bind(stale, (struct sockaddr *)&a, sizeof a) == 0);
    close(stale); /* its file stays, and nothing listens there */
    static const char *names[] = {NAME};
    cv_server_options so = {.uds = sock, .served_model_names = names, .n_served_model_names = 1,
                            .model_root = ref_srv.dir};
    cv_server *s = NULL, *second = NULL;
    CHECK_MSG(cv_server_start(ref_srv.group, &so, &s) == 0, "server: %s", cvllm_last_error());
    CHECK_EQ_INT(get_over_unix(sock, "/v1/models"), 200);
    CHECK_EQ_INT(get_over_unix(sock, "/health"), 200);
    CHECK_EQ_INT(cv_server_start(ref_srv.group, &so, &second), CVLLM_ERR_IO);
    CHECK_CONTAINS(cvllm_last_error(), "cannot listen on Unix socket");
    CHECK_CONTAINS(cvllm_last_error(), "the path exists (a server listens there, or it is no socket)");
    cv_server_stop(s, 0);
    struct stat st;
    CHECK_MSG(stat(sock, &st) != 0, "the socket file outlived its server");
    tu_write_file(dir, "api.sock", "x", 1);
    CHECK_EQ_INT(cv_server_start(ref_srv.group, &so, &second), CVLLM_ERR_IO);
    CHECK_EQ_INT(stat(sock, &st), 0); /* not a socket: left alone */
    tu_remove_tree(dir);
    free(dir);
    free(sock);
}

/* SageMaker's /invocations, as vLLM routes it: a chat body answers as /v1/chat/completions, a
 * completion body as /v1/completions (the same greedy text), anything else is vLLM's 400; no API key
 * is asked for, as the route is outside /v1. */
static void test_invocations(void) {
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":6,\"temperature\":0}";
    const char *completion = "{\"prompt\":\"The capital of France is\",\"max_tokens\":6,\"temperature\":0}";
    reply want = http(&chat_srv, "POST", "/v1/chat/completions", chat);
    reply got = http_on(easy, &chat_srv, "POST", "/invocations", "application/json", chat, strlen(chat), NULL);
    CHECK_EQ_INT(got.status, 200);
    json_t *w = reply_json(&want), *g = reply_json(&got);
    CHECK_STR_EQ(json_string_value(json_object_get(g, "object")), "chat.completion");
    const json_t *wc = json_object_get(json_object_get(json_array_get(json_object_get(w, "choices"), 0), "message"), "content");
    const json_t *gc = json_object_get(json_object_get(json_array_get(json_object_get(g, "choices"), 0), "message"), "content");
    CHECK(wc && gc && !strcmp(json_string_value(wc), json_string_value(gc)));
    json_decref(w);
    json_decref(g);
    free(want.body);
    free(got.body);
    want = http(&chat_srv, "POST", "/v1/completions", completion);
    got = http(&chat_srv, "POST", "/invocations", completion);
    CHECK_EQ_INT(got.status, 200);
    w = reply_json(&want), g = reply_json(&got);
    CHECK_STR_EQ(json_string_value(json_object_get(g, "object")), "text_completion");
    wc = json_object_get(json_array_get(json_object_get(w, "choices"), 0), "text");
    gc = json_object_get(json_array_get(json_object_get(g, "choices"), 0), "text");
    CHECK(wc && gc && !strcmp(json_string_value(wc), json_string_value(gc)));
    json_decref(w);
    json_decref(g);
    free(want.body);
    free(got.body);
    got = http(&chat_srv, "POST", "/invocations", "{\"max_tokens\":6}");
    CHECK(is_error(&got, 400, "Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest', "
                              "'CompletionRequest']"));
    free(got.body);
    got = http(&chat_srv, "POST", "/invocations", "{\"messages\":");
    CHECK(is_error(&got, 400, "JSON decode error"));
    free(got.body);
}

/* /tokenize and /v1/chat/completions/render give the template's rendering of messages, tools,
 * documents and chat_template_kwargs, byte for byte as the chat library renders it. */
static void test_chat_prompt_endpoints(void) {
    const char *docs = "[{\"title\":\"Forecast\",\"text\":\"Sunny\"}]", *kwargs = "{\"enable_thinking\":false}";
    int32_t *ids = NULL;
    size_t n = 0;
    char *want = library_prompt(TOOLS, docs, kwargs, &ids, &n);
    CHECK_CONTAINS(want, "get_weather");
    CHECK_CONTAINS(want, "<think>\n\n</think>");
    char *body = malloc(4096);
    snprintf(body, 4096, "{\"messages\":%s,\"tools\":%s,\"documents\":%s,\"chat_template_kwargs\":%s}", MESSAGES, TOOLS,
             docs, kwargs);
    reply r = http(&chat_srv, "POST", "/tokenize", body);
    json_t *j = reply_json(&r);
    CHECK_EQ_INT(r.status, 200);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "count")), n);
    CHECK(same_ids(json_object_get(j, "tokens"), ids, n));
    json_decref(j);
    free(r.body);
    r = http(&chat_srv, "POST", "/v1/chat/completions/render", body);
    j = reply_json(&r);
    CHECK_EQ_INT(r.status, 200);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "prompt")), want);
    CHECK(same_ids(json_object_get(j, "token_ids"), ids, n));
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "max_tokens")), MAX_MODEL_LEN - (long)n);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "model")), NAME);
    json_decref(j);
    free(r.body);
    /* The render endpoint checks like a completion: bad tools and kwargs are 400s, nothing runs. */
    r = http(&chat_srv, "POST", "/v1/chat/completions/render", "{\"messages\":" MESSAGES ",\"tools\":[]}");
    CHECK(is_error(&r, 400, "`tools` must not be an empty array"));
    free(r.body);
    r = http(&chat_srv, "POST", "/tokenize", "{\"messages\":" MESSAGES ",\"chat_template_kwargs\":{\"tokenize\":true}}");
    CHECK(is_error(&r, 400, "Found unexpected chat template kwargs"));
    free(r.body);
    r = http(&chat_srv, "POST", "/v1/chat/completions",
             "{\"messages\":" MESSAGES ",\"tools\":" TOOLS ",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"x\"}}}");
    CHECK(is_error(&r, 400, "does not match any of the specified `tools`"));
    free(r.body);
    free(body);
    free(want);
    cvllm_free(ids);
}

/* Replies with tools are well-formed and streaming agrees with non-streaming; a prompt that leaves
 * <think> open makes the output reasoning. */
static void test_chat_tools_and_reasoning(void) {
    const char *tools_body = "{\"messages\":" MESSAGES ",\"tools\":" TOOLS ",\"max_tokens\":12,\"temperature\":0";
    char *plain = tu_strdupf("%s%s", tools_body, "}");
    char *streamed = tu_strdupf("%s%s", tools_body, ",\"stream\":true}");
    reply r = http(&chat_srv, "POST", "/v1/chat/completions", plain);
    CHECK_EQ_INT(r.status, 200);
    json_t *j = reply_json(&r);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0), *msg = json_object_get(c, "message");
    const char *finish = json_string_value(json_object_get(c, "finish_reason"));
    CHECK(json_is_array(json_object_get(msg, "tool_calls")));
    CHECK(finish && (!strcmp(finish, "length") || !strcmp(finish, "stop") || !strcmp(finish, "tool_calls")));
    const char *content = json_string_value(json_object_get(msg, "content"));
    reply s = http(&chat_srv, "POST", "/v1/chat/completions", streamed);
    stream_result sr = parse_sse(s.body, true);
    CHECK(sr.well_formed && sr.done_last);
    CHECK_STR_EQ(sr.text[0], content ? content : "");
    CHECK_STR_EQ(sr.finish[0], finish);
    free_stream(&sr);
    free(s.body);
    json_decref(j);
    free(r.body);
    free(plain);
    free(streamed);

    /* The assistant turn is continued inside an open <think>: the parser starts in reasoning. */
    const char *think_body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Why is the sky blue?\"},"
                             "{\"role\":\"assistant\",\"content\":\"<think>\\nLet me\"}],\"add_generation_prompt\":false,"
                             "\"continue_final_message\":true,\"max_tokens\":8,\"temperature\":0";
    plain = tu_strdupf("%s%s", think_body, "}");
    streamed = tu_strdupf("%s%s", think_body, ",\"stream\":true}");
    r = http(&chat_srv, "POST", "/v1/chat/completions", plain);
    j = reply_json(&r);
    msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    const char *reasoning = json_string_value(json_object_get(msg, "reasoning"));
    CHECK_MSG(reasoning && *reasoning, "no reasoning: %.300s", r.body);
    CHECK(json_is_null(json_object_get(msg, "content")));
    s = http(&chat_srv, "POST", "/v1/chat/completions", streamed);
    char *streamed_reasoning = sse_delta_concat(s.body, "reasoning");
    CHECK_STR_EQ(streamed_reasoning, reasoning ? reasoning : "");
    free(streamed_reasoning);
    free(s.body);
    json_decref(j);
    free(r.body);
    free(streamed);
    free(plain);
    /* include_reasoning=false drops it. */
    plain = tu_strdupf("%s%s", think_body, ",\"include_reasoning\":false}");
    r = http(&chat_srv, "POST", "/v1/chat/completions", plain);
    j = reply_json(&r);
    msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    CHECK(json_is_null(json_object_get(msg, "reasoning")));
    json_decref(j);
    free(r.body);
    free(plain);
}

/* --chat-template-content-format over HTTP: servers on the chat engine with Qwen3.6's template
 * (detected "openai": it loops over content in its render_content macro). A message of text parts is
 * concatenated by default and under "openai", joined with newlines under "string" — what
 * transformers renders for the content vLLM hands it (vllm/renderers/hf.py) — and it generates. */
static void test_chat_content_parts(void) {
    cv_chat_template *t36 = NULL;
    CHECK_MSG(cv_chat_template_load(CVLLM_SOURCE_DIR "/models/Qwen/Qwen3.6-35B-A3B", NULL, &t36) == 0, "%s",
              cvllm_last_error());
    if (!t36) return;
#define PARTS "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Describe it.\"},{\"type\":\"text\",\"text\":\"Briefly.\"}]}]"
    const struct { cv_chat_content_format f; const char *prompt; } cases[] = {
        {CV_CHAT_CONTENT_AUTO, "<|im_start|>user\nDescribe it.Briefly.<|im_end|>\n<|im_start|>assistant\n<think>\n"},
        {CV_CHAT_CONTENT_STRING, "<|im_start|>user\nDescribe it.\nBriefly.<|im_end|>\n<|im_start|>assistant\n<think>\n"},
        {CV_CHAT_CONTENT_OPENAI, "<|im_start|>user\nDescribe it.Briefly.<|im_end|>\n<|im_start|>assistant\n<think>\n"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fixture f = {.dir = chat_srv.dir, .group = chat_srv.group};
        cv_server_options so = {.host = "127.0.0.1", .model_root = chat_srv.dir, .chat_template = t36,
                                .chat_template_content_format = cases[i].f};
        CHECK_MSG(cv_server_start(chat_srv.group, &so, &f.srv) == 0, "%s", cvllm_last_error());
        if (!f.srv) continue;
        snprintf(f.base, sizeof f.base, "http://127.0.0.1:%d", cv_server_port(f.srv));
        reply r = http(&f, "POST", "/v1/chat/completions/render", "{\"messages\":" PARTS "}");
        json_t *j = reply_json(&r);
        CHECK_EQ_INT(r.status, 200);
        CHECK_STR_EQ(json_string_value(json_object_get(j, "prompt")), cases[i].prompt);
        json_int_t count = json_integer_value(json_object_get(j, "count"));
        json_decref(j);
        free(r.body);
        r = http(&f, "POST", "/v1/chat/completions", "{\"messages\":" PARTS ",\"max_tokens\":2,\"temperature\":0}");
        j = reply_json(&r);
        CHECK_EQ_INT(r.status, 200);
        CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens")), count);
        json_decref(j);
        free(r.body);
        cv_server_stop(f.srv, 0);
    }
#undef PARTS
    cv_chat_template_free(t36);
}

/* Request fields end to end: truncate_prompt_tokens shrinks the prompt the engine sees (usage counts
 * it), add_special_tokens and user are accepted, allowed_token_ids keeps greedy decoding inside the
 * allowed ids, a wrong-typed field is vLLM's validation error and a wrong method's error carries the
 * reason phrase as its type. */
static json_t *completion_reply(const char *body, long *status) {
    reply r = http(&ref_srv, "POST", "/v1/completions", body);
    *status = r.status;
    json_t *j = reply_json(&r);
    free(r.body);
    return j;
}

static json_int_t prompt_tokens(const json_t *j) {
    return json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
}

static void test_request_fields(void) {
    long status;
    json_t *j = completion_reply("{\"prompt\":\"I am in the house\",\"max_tokens\":1,\"user\":\"alice\"}", &status);
    CHECK_EQ_INT(status, 200);
    CHECK_EQ_INT(prompt_tokens(j), 5);
    json_decref(j);
    j = completion_reply("{\"prompt\":\"I am in the house\",\"max_tokens\":1,\"truncate_prompt_tokens\":2}", &status);
    CHECK_EQ_INT(status, 200);
    CHECK_EQ_INT(prompt_tokens(j), 2);
    json_decref(j);
    j = completion_reply("{\"prompt\":\"I am in the house\",\"max_tokens\":1,\"truncate_prompt_tokens\":-1,"
                         "\"add_special_tokens\":false}",
                         &status);
    CHECK_EQ_INT(status, 200);
    CHECK_EQ_INT(prompt_tokens(j), 5); /* shorter than max_model_len - max_tokens: kept whole */
    json_decref(j);

    /* Greedy decoding under allowed_token_ids picks only those ids; without them it picks others. */
    j = completion_reply("{\"prompt\":\"I am in the house\",\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true,"
                         "\"return_token_ids\":true}",
                         &status);
    json_t *free_ids = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "token_ids");
    size_t outside = 0;
    for (size_t i = 0; i < json_array_size(free_ids); i++) {
        json_int_t id = json_integer_value(json_array_get(free_ids, i));
        outside += id != 304 && id != 3753;
    }
    CHECK(outside > 0);
    json_decref(j);
    j = completion_reply("{\"prompt\":\"I am in the house\",\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true,"
                         "\"return_token_ids\":true,\"allowed_token_ids\":[304,3753]}",
                         &status);
    CHECK_EQ_INT(status, 200);
    json_t *ids = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "token_ids");
    CHECK_EQ_INT(json_array_size(ids), 6);
    for (size_t i = 0; i < json_array_size(ids); i++) {
        json_int_t id = json_integer_value(json_array_get(ids, i));
        CHECK_MSG(id == 304 || id == 3753, "token %zu is %lld, outside allowed_token_ids", i, (long long)id);
    }
    json_decref(j);

    const char *typed = "{\"prompt\":\"I am\",\"max_tokens\":\"many\"}";
    reply r = http(&ref_srv, "POST", "/v1/completions", typed);
    CHECK(is_error(&r, 400, "'type': 'int_parsing', 'loc': ('body', 'max_tokens')"));
    j = reply_json(&r);
    json_t *err = json_object_get(j, "error");
    CHECK_STR_EQ(json_string_value(json_object_get(err, "type")), "Bad Request");
    CHECK_STR_EQ(json_string_value(json_object_get(err, "param")), "body.max_tokens");
    json_decref(j);
    free(r.body);
    r = http(&ref_srv, "POST", "/v1/completions", "{\"prompt\":\"I am\",\"kv_transfer_params\":{\"do_remote_decode\":true}}");
    CHECK(is_error(&r, 400, "KV transfer connector"));
    free(r.body);
    r = http(&ref_srv, "GET", "/v1/completions", NULL);
    j = reply_json(&r);
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(j, "error"), "type")), "Method Not Allowed");
    json_decref(j);
    free(r.body);
}


/* ------------------------------------------------------------------------------------------------ */
/* Structured outputs                                                                                */

/* The texts of a reply's choices (completions: text; chat: message.content) and their finish
 * reasons, for n choices. Streaming replies are folded by parse_sse. */
static bool full_match(const char *pattern, const char *text) {
    regex_t re;
    CHECK(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB) == 0);
    bool ok = regexec(&re, text, 0, NULL, 0) == 0;
    regfree(&re);
    return ok;
}

/* A constrained completion, plain and streamed with n = 2: every text matches `pattern` (POSIX
 * ERE, anchored) and ends with "stop"; the stream's two choices each do too. */
static void expect_constrained_completion(const char *constraint, const char *pattern) {
    char *plain = cv_xasprintf("{\"prompt\":\"Pick one:\",\"max_tokens\":64,\"temperature\":0,%s}", constraint);
    char *streamed = cv_xasprintf("{\"prompt\":\"Pick one:\",\"max_tokens\":64,\"temperature\":1,\"seed\":7,\"n\":2,"
                                "\"stream\":true,%s}", constraint);
    reply r = http(&chat_srv, "POST", "/v1/completions", plain);
    CHECK_MSG(r.status == 200, "%s: %.300s", constraint, r.body);
    json_t *j = reply_json(&r);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    const char *text = json_string_value(json_object_get(c, "text"));
    CHECK_MSG(text && full_match(pattern, text), "%s: '%s'", constraint, text ? text : "(none)");
    CHECK_STR_EQ(json_string_value(json_object_get(c, "finish_reason")), "stop");
    json_decref(j);
    free(r.body);
    reply s = http(&chat_srv, "POST", "/v1/completions", streamed);
    stream_result sr = parse_sse(s.body, false);
    CHECK(sr.well_formed && sr.done_last);
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(full_match(pattern, sr.text[i]), "%s stream %d: '%s'", constraint, i, sr.text[i]);
        CHECK_STR_EQ(sr.finish[i], "stop");
    }
    free_stream(&sr);
    free(s.body);
    free(plain);
    free(streamed);
}

#define COLOR_SCHEMA                                                                                           \
    "{\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\"]},\"ok\":{\"type\":\"boolean\"}},"  \
    "\"required\":[\"color\",\"ok\"],\"additionalProperties\":false}"
#define UNIT_TOOL                                                                                              \
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","         \
    "\"properties\":{\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"unit\"],\"additionalProperties\":false}}}]"
#define NO_THINKING ",\"chat_template_kwargs\":{\"enable_thinking\":false}"

/* A parsed COLOR_SCHEMA object. */
static bool is_color(const char *text) {
    json_t *j = json_loads(text, 0, NULL);
    const char *color = json_string_value(json_object_get(j, "color"));
    bool ok = json_object_size(j) == 2 && color && (!strcmp(color, "red") || !strcmp(color, "green")) &&
              json_is_boolean(json_object_get(j, "ok"));
    json_decref(j);
    return ok;
}

/* The calls of a chat message or of a stream (index, id and name once, arguments in pieces), as
 * "name(arguments);" strings; *well_formed is cleared when a piece is out of place. */
static char *calls_of_message(const json_t *msg, bool *well_formed) {
    char *out = calloc(1, 1);
    const json_t *calls = json_object_get(msg, "tool_calls");
    *well_formed &= json_is_array(calls);
    for (size_t i = 0; i < json_array_size(calls); i++) {
        const json_t *call = json_array_get(calls, i), *fn = json_object_get(call, "function");
        const char *id = json_string_value(json_object_get(call, "id"));
        *well_formed &= id && !strncmp(id, "chatcmpl-tool-", 14) && json_is_string(json_object_get(fn, "arguments"));
        char *one = tu_strdupf("%s(%s);", json_string_value(json_object_get(fn, "name")), json_string_value(json_object_get(fn, "arguments")));
        append_str(&out, one);
        free(one);
    }
    return out;
}

static char *calls_of_stream(const char *body, int choice, bool *well_formed) {
    char *names[8] = {0}, *args[8] = {0}, *out = calloc(1, 1);
    size_t n = 0;
    for (const char *p = body; (p = strstr(p, "data: {")) != NULL; p += 6) {
        const char *end = strstr(p, "\n\n");
        json_t *j = end ? json_loadb(p + 6, (size_t)(end - p - 6), 0, NULL) : NULL;
        json_t *c = json_array_get(json_object_get(j, "choices"), 0);
        const json_t *calls = json_object_get(json_object_get(c, "delta"), "tool_calls");
        for (size_t i = 0; c && json_integer_value(json_object_get(c, "index")) == choice && i < json_array_size(calls); i++) {
            const json_t *call = json_array_get(calls, i), *fn = json_object_get(call, "function");
            size_t k = (size_t)json_integer_value(json_object_get(call, "index"));
            const char *name = json_string_value(json_object_get(fn, "name"));
            if (name && k == n && n < 8) {
                names[n] = strdup(name);
                args[n++] = calloc(1, 1);
            } else if (name || k + 1 != n) {
                *well_formed = false;
                continue;
            }
            const char *piece = json_string_value(json_object_get(fn, "arguments"));
            if (piece) append_str(&args[k], piece);
        }
        json_decref(j);
    }
    for (size_t k = 0; k < n; k++) {
        char *one = tu_strdupf("%s(%s);", names[k], args[k]);
        append_str(&out, one);
        free(one);
        free(names[k]);
        free(args[k]);
    }
    return out;
}

/* A chat request with a forced tool choice, plain and streamed (n = 2, greedy, so both choices equal
 * the plain one): its calls, each named get_weather with UNIT_TOOL's arguments; finish `finish`. */
static void expect_forced_calls(const char *choice, const char *finish) {
    char *plain = cv_xasprintf("{\"messages\":" MESSAGES ",\"tools\":" UNIT_TOOL ",\"tool_choice\":%s,\"max_tokens\":200,"
                             "\"temperature\":0" NO_THINKING "}", choice);
    char *streamed = cv_xasprintf("{\"messages\":" MESSAGES ",\"tools\":" UNIT_TOOL ",\"tool_choice\":%s,\"max_tokens\":200,"
                                "\"temperature\":0,\"n\":2,\"stream\":true" NO_THINKING "}", choice);
    reply r = http(&chat_srv, "POST", "/v1/chat/completions", plain);
    CHECK_MSG(r.status == 200, "%s: %.300s", choice, r.body);
    json_t *j = reply_json(&r);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0), *msg = json_object_get(c, "message");
    bool ok = true;
    char *calls = calls_of_message(msg, &ok);
    CHECK_MSG(ok && *calls, "%s: %.400s", choice, r.body);
    CHECK_STR_EQ(json_string_value(json_object_get(msg, "content")), "");
    CHECK_STR_EQ(json_string_value(json_object_get(c, "finish_reason")), finish);
    const json_t *list = json_object_get(msg, "tool_calls");
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *fn = json_object_get(json_array_get(list, i), "function");
        json_t *a = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
        const char *unit = json_string_value(json_object_get(a, "unit"));
        CHECK_MSG(unit && (!strcmp(unit, "c") || !strcmp(unit, "f")) && json_object_size(a) == 1, "%s: arguments %s", choice,
                  json_string_value(json_object_get(fn, "arguments")));
        CHECK_STR_EQ(json_string_value(json_object_get(fn, "name")), "get_weather");
        json_decref(a);
    }
    reply s = http(&chat_srv, "POST", "/v1/chat/completions", streamed);
    stream_result sr = parse_sse(s.body, true);
    CHECK(sr.well_formed && sr.done_last);
    for (int i = 0; i < 2; i++) {
        bool stream_ok = true;
        char *streamed_calls = calls_of_stream(s.body, i, &stream_ok);
        CHECK_MSG(stream_ok, "%s: stream %d malformed", choice, i);
        CHECK_STR_EQ(streamed_calls, calls);
        CHECK_STR_EQ(sr.finish[i], finish);
        CHECK_STR_EQ(sr.text[i], "");
        free(streamed_calls);
    }
    free_stream(&sr);
    free(s.body);
    free(calls);
    json_decref(j);
    free(r.body);
    free(plain);
    free(streamed);
}

static void test_structured_outputs(void) {
    /* Invalid constraints: the engine's message in vLLM's error shape. */
    static const char *const invalid[] = {
        "{\"prompt\":\"a\",\"structured_outputs\":{\"regex\":\"(ab\"}}",
        "{\"prompt\":\"a\",\"structured_outputs\":{\"grammar\":\"root ::= undefined_rule\"}}",
        "{\"prompt\":\"a\",\"structured_outputs\":{\"json\":\"{not json\"}}",
        "{\"messages\":" MESSAGES ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
        "\"schema\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"nonsense\"}}}}}}",
    };
    for (size_t i = 0; i < sizeof invalid / sizeof *invalid; i++) {
        reply r = http(&chat_srv, "POST", strstr(invalid[i], "messages") ? "/v1/chat/completions" : "/v1/completions", invalid[i]);
        CHECK_MSG(is_error(&r, 400, NULL), "%s", invalid[i]);
        json_t *j = reply_json(&r), *e = json_object_get(j, "error");
        CHECK_STR_EQ(json_string_value(json_object_get(e, "type")), "BadRequestError");
        CHECK(json_is_null(json_object_get(e, "param")));
        json_decref(j);
        free(r.body);
    }
    /* The protocol's own refusals come before any compiling. */
    reply r = http(&chat_srv, "POST", "/v1/completions", "{\"prompt\":\"a\",\"structured_outputs\":{\"regex\":\"a\",\"grammar\":\"b\"}}");
    CHECK(is_error(&r, 400, "You can only use one kind of structured outputs constraint"));
    free(r.body);

    /* Valid ones: every output is in the language. */
    expect_constrained_completion("\"structured_outputs\":{\"regex\":\"[a-z]{3}[0-9]\"}", "^[a-z]{3}[0-9]$");
    expect_constrained_completion("\"structured_outputs\":{\"choice\":[\"red\",\"green\",\"blue\"]}", "^(red|green|blue)$");
    expect_constrained_completion("\"structured_outputs\":{\"grammar\":\"root ::= (\\\"yes\\\" | \\\"no\\\") \\\"!\\\"\"}",
                                  "^(yes|no)!$");
    expect_constrained_completion("\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"c\",\"schema\":"
                                  COLOR_SCHEMA "}}",
                                  "^(\\{\"color\":\"(red|green)\",\"ok\":(true|false)\\}|"
                                  "\\{\"ok\":(true|false),\"color\":\"(red|green)\"\\})$");

    /* Chat: response_format, as the content. */
    r = http(&chat_srv, "POST", "/v1/chat/completions",
             "{\"messages\":" MESSAGES ",\"max_tokens\":100,\"temperature\":0,\"response_format\":{\"type\":\"json_schema\","
             "\"json_schema\":{\"name\":\"c\",\"schema\":" COLOR_SCHEMA "}}" NO_THINKING "}");
    json_t *j = reply_json(&r);
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    const char *content = json_string_value(json_object_get(json_object_get(c, "message"), "content"));
    CHECK_MSG(content && is_color(content), "%.300s", r.body);
    CHECK_STR_EQ(json_string_value(json_object_get(c, "finish_reason")), "stop");
    json_decref(j);
    free(r.body);

    /* Forced tool calls, without a tool-call parser being needed (this server has one, unused). */
    expect_forced_calls("\"required\"", "tool_calls");
    expect_forced_calls("{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}", "stop");
}

/* ---- X-Request-Id and /load ------------------------------------------------------------------------ */

static size_t header_line(char *data, size_t size, size_t n, void *user) {
    char *id = user;
    if (n * size > 14 && !strncasecmp(data, "x-request-id: ", 14)) {
        size_t len = n * size - 14;
        while (len && (data[14 + len - 1] == '\r' || data[14 + len - 1] == '\n')) len--;
        snprintf(id, 128, "%.*s", (int)len, data + 14);
    }
    return size * n;
}

/* POSTs body to f's completions with an optional X-Request-Id; echoed gets the reply's header ("" if none). */
static json_t *post_with_id(const fixture *f, const char *body, const char *request_id, char echoed[128]) {
    char hid[200];
    if (request_id) snprintf(hid, sizeof hid, "X-Request-Id: %s", request_id);
    post *p = post_new(f, body, request_id ? hid : NULL);
    echoed[0] = '\0';
    curl_easy_setopt(p->c, CURLOPT_HEADERFUNCTION, header_line);
    curl_easy_setopt(p->c, CURLOPT_HEADERDATA, echoed);
    CHECK_EQ_INT(curl_easy_perform(p->c), CURLE_OK);
    json_t *j = reply_json(&p->r);
    post_free(p);
    return j;
}

static json_int_t server_load(const fixture *f) {
    reply r = http(f, "GET", "/load", NULL);
    json_t *j = reply_json(&r);
    json_int_t n = json_integer_value(json_object_get(j, "server_load"));
    CHECK(r.status == 200 && json_is_integer(json_object_get(j, "server_load")));
    json_decref(j);
    free(r.body);
    return n;
}

/* /load once it is back to 0, polled for up to 3 s: a generation counts until its session is
 * released, a moment after its reply's last bytes reach the client (vLLM's count also drops only
 * after its response has gone out). */
static json_int_t settled_load(const fixture *f) {
    json_int_t n = server_load(f);
    for (int i = 0; i < 300 && n; i++) {
        usleep(10000);
        n = server_load(f);
    }
    return n;
}

static void test_request_ids_and_load(void) {
    char echoed[128];
    /* the header names the reply on either server (vLLM's _base_request_id), over the body's field */
    json_t *j = post_with_id(&ref_srv, "{\"prompt\":\"I am\",\"max_tokens\":1,\"request_id\":\"body-id\"}", "trace-7",
                             echoed);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "id")), "cmpl-trace-7");
    CHECK_STR_EQ(echoed, ""); /* no --enable-request-id-headers there */
    json_decref(j);
    j = post_with_id(&chat_srv, "{\"prompt\":\"I am\",\"max_tokens\":1}", "trace-8", echoed);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "id")), "cmpl-trace-8");
    CHECK_STR_EQ(echoed, "trace-8");
    json_decref(j);
    j = post_with_id(&chat_srv, "{\"prompt\":\"I am\",\"max_tokens\":1}", NULL, echoed);
    CHECK_MSG(strlen(echoed) == 32 && strspn(echoed, "0123456789abcdef") == 32, "a new id: '%s'", echoed);
    json_decref(j);

    /* /load: 0 idle; with tracking, 1 while a generation runs */
    CHECK_EQ_INT(server_load(&ref_srv), 0);
    CHECK_EQ_INT(settled_load(&chat_srv), 0);
    CURLM *m = curl_multi_init();
    post *p = post_new(&chat_srv, "{\"prompt\":\"I am\",\"max_tokens\":3000,\"ignore_eos\":true}", NULL);
    curl_multi_add_handle(m, p->c);
    json_int_t seen = 0;
    for (int i = 0; i < 200 && seen == 0; i++) { /* until the server has the request */
        int running;
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 10, NULL);
        seen = server_load(&chat_srv);
    }
    CHECK_EQ_INT(seen, 1);
    CHECK_EQ_INT(server_load(&ref_srv), 0);
    curl_multi_remove_handle(m, p->c); /* hangs up: the generation is aborted */
    post_free(p);
    curl_multi_cleanup(m);
    CHECK_EQ_INT(settled_load(&chat_srv), 0);
}

/* ---- beam search --------------------------------------------------------------------------------- */

typedef struct ref_beam {
    int32_t ids[16]; /* prompt then output */
    int n;
    double cum;
} ref_beam;

static int ref_beam_desc(const void *a, const void *b) {
    const ref_beam *x = a, *y = b;
    return x->cum > y->cum ? -1 : x->cum < y->cum;
}

static char *ids_text(const int32_t *ids, int n) {
    char *s = calloc(1, 16 * (size_t)n + 3);
    strcat(s, "[");
    for (int i = 0; i < n; i++) sprintf(s + strlen(s), "%s%d", i ? "," : "", ids[i]);
    strcat(s, "]");
    return s;
}


/* The greedy chat completion of MESSAGES in 12 tokens, which the other APIs' translations of the
 * same conversation must reproduce: its content and reasoning ("" when none), prompt tokens. */
typedef struct chat_reference {
    json_t *reply;
    const char *content, *reasoning;
    json_int_t prompt_tokens;
} chat_reference;

static chat_reference chat_of_messages(void) {
    reply r = http(&chat_srv, "POST", "/v1/chat/completions", "{\"messages\":" MESSAGES ",\"max_tokens\":12,\"temperature\":0}");
    CHECK_EQ_INT(r.status, 200);
    chat_reference ref = {.reply = reply_json(&r)};
    free(r.body);
    const json_t *msg = json_object_get(json_array_get(json_object_get(ref.reply, "choices"), 0), "message");
    ref.content = json_string_value(json_object_get(msg, "content"));
    ref.reasoning = json_string_value(json_object_get(msg, "reasoning"));
    if (!ref.content) ref.content = "";
    if (!ref.reasoning) ref.reasoning = "";
    ref.prompt_tokens = json_integer_value(json_object_get(json_object_get(ref.reply, "usage"), "prompt_tokens"));
    return ref;
}

/* A Responses API event stream as a client reads it: each record "event: TYPE\ndata: JSON" whose type
 * is TYPE and whose sequence_number counts from 0, response.created first and response.completed
 * last (its response returned); the output_text deltas joined in *text. */
static json_t *parse_responses_sse(const char *body, char **text, bool *well_formed) {
    *text = calloc(1, 1);
    *well_formed = true;
    json_t *completed = NULL;
    long seq = 0;
    const char *p = body;
    char first[64] = "", last[64] = "";
    for (const char *end; (end = strstr(p, "\n\n")) != NULL; p = end + 2) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (strncmp(p, "event: ", 7) || !nl || nl - p - 7 >= 64 || strncmp(nl + 1, "data: ", 6)) {
            *well_formed = false;
            break;
        }
        snprintf(last, sizeof last, "%.*s", (int)(nl - p - 7), p + 7);
        if (!*first) snprintf(first, sizeof first, "%s", last);
        json_t *d = json_loadb(nl + 7, (size_t)(end - nl - 7), 0, NULL);
        const char *type = json_string_value(json_object_get(d, "type"));
        *well_formed = *well_formed && type && !strcmp(type, last) &&
                       json_integer_value(json_object_get(d, "sequence_number")) == seq++;
        if (!strcmp(last, "response.output_text.delta")) append_str(text, json_string_value(json_object_get(d, "delta")));
        if (!strcmp(last, "response.completed")) completed = json_incref(json_object_get(d, "response"));
        json_decref(d);
    }
    *well_formed = *well_formed && !*p && !strcmp(first, "response.created") && !strcmp(last, "response.completed");
    return completed;
}

/* A list's first object whose "type" is `type`, or NULL. */
static const json_t *first_of_type(const json_t *list, const char *type) {
    size_t i;
    const json_t *item;
    json_array_foreach(list, i, item) {
        if (!strcmp(json_string_value(json_object_get(item, "type")), type)) return item;
    }
    return NULL;
}

/* The text of a response's first output item of `type` (the message's output_text, the reasoning's
 * reasoning_text), or "". */
static const char *output_text(const json_t *response, const char *type) {
    const json_t *item = first_of_type(json_object_get(response, "output"), type);
    const char *text = json_string_value(json_object_get(json_array_get(json_object_get(item, "content"), 0), "text"));
    return text ? text : "";
}

/* OpenAI's Responses API: a response equals the chat completion of the same conversation (text,
 * reasoning, usage, incomplete at max_output_tokens), streamed as the Responses events with the same
 * text and a response.completed equal to it; input items (a developer message, a function call and
 * its output) make the prompt /tokenize makes of their chat form; what needs a stored response, and
 * hosted tools, are refused. */
static void test_responses_api(void) {
    chat_reference ref = chat_of_messages();
    reply r;
    const char *base = "{\"model\":\"" NAME "\",\"instructions\":\"You are helpful.\",\"input\":\"What is the weather in "
                       "Paris?\",\"max_output_tokens\":12,\"temperature\":0";
    char *plain = tu_strdupf("%s%s", base, "}"), *streamed = tu_strdupf("%s%s", base, ",\"stream\":true}");
    r = http(&chat_srv, "POST", "/v1/responses", plain);
    CHECK_MSG(r.status == 200, "/v1/responses: %.300s", r.body);
    json_t *o = reply_json(&r);
    CHECK(!strncmp(json_string_value(json_object_get(o, "id")), "resp_", 5));
    CHECK_STR_EQ(json_string_value(json_object_get(o, "object")), "response");
    CHECK_STR_EQ(json_string_value(json_object_get(o, "status")), "incomplete");
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(o, "incomplete_details"), "reason")), "max_output_tokens");
    CHECK_STR_EQ(json_string_value(json_object_get(o, "instructions")), "You are helpful.");
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "max_output_tokens")), 12);
    CHECK_STR_EQ(output_text(o, "message"), ref.content);
    CHECK_STR_EQ(output_text(o, "reasoning"), ref.reasoning);
    const json_t *usage = json_object_get(o, "usage");
    CHECK_EQ_INT(json_integer_value(json_object_get(usage, "input_tokens")), ref.prompt_tokens);
    CHECK_EQ_INT(json_integer_value(json_object_get(usage, "output_tokens")), 12);
    CHECK_EQ_INT(json_integer_value(json_object_get(usage, "total_tokens")), ref.prompt_tokens + 12);
    free(r.body);
    r = http(&chat_srv, "POST", "/v1/responses", streamed);
    char *text;
    bool ok;
    json_t *done = parse_responses_sse(r.body, &text, &ok);
    CHECK_MSG(r.status == 200 && ok && done, "stream: %.600s", r.body);
    CHECK_STR_EQ(text, ref.content);
    CHECK_STR_EQ(output_text(done, "message"), ref.content);
    CHECK_STR_EQ(json_string_value(json_object_get(done, "status")), "incomplete");
    CHECK(json_equal(json_object_get(done, "usage"), usage));
    json_decref(done);
    free(text);
    free(r.body);
    json_decref(o);
    json_decref(ref.reply);
    free(plain);
    free(streamed);

    /* input items: the prompt of their chat form */
    const char *items =
        "{\"model\":\"" NAME "\",\"max_output_tokens\":1,\"input\":[{\"type\":\"message\",\"role\":\"developer\","
        "\"content\":\"You are helpful.\"},{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"What is the "
        "weather in Paris?\"}]},{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"get_weather\",\"arguments\":"
        "\"{\\\"city\\\": \\\"Paris\\\"}\"},{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"18 C\"}],"
        "\"tools\":[{\"type\":\"function\",\"name\":\"get_weather\",\"description\":\"Current weather\",\"parameters\":{"
        "\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}]}";
    r = http(&chat_srv, "POST", "/v1/responses", items);
    o = reply_json(&r);
    CHECK_MSG(r.status == 200, "items: %.300s", r.body);
    const json_int_t in = json_integer_value(json_object_get(json_object_get(o, "usage"), "input_tokens"));
    json_decref(o);
    free(r.body);
    const char *tokenize =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"You are helpful.\"},{\"role\":\"user\",\"content\":[{\"type\":"
        "\"text\",\"text\":\"What is the weather in Paris?\"}]},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{"
        "\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": "
        "\\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"18 C\"}],\"tools\":" TOOLS "}";
    r = http(&chat_srv, "POST", "/tokenize", tokenize);
    json_t *tk = reply_json(&r);
    CHECK_EQ_INT(json_integer_value(json_object_get(tk, "count")), in);
    json_decref(tk);
    free(r.body);

    static const struct {
        const char *body, *message;
    } bad[] = {
        {"{\"model\":\"" NAME "\",\"max_output_tokens\":5}", "Field required"},
        {"{\"model\":\"" NAME "\",\"input\":\"Hi\",\"previous_response_id\":\"abc\"}", "Expected an ID that begins with 'resp'"},
        {"{\"model\":\"" NAME "\",\"input\":\"Hi\",\"tools\":[{\"type\":\"web_search\"}]}", "only function tools"},
        {"{\"model\":\"" NAME "\",\"input\":[{\"type\":\"computer_call\"}]}", "input item of type 'computer_call'"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        r = http(&chat_srv, "POST", "/v1/responses", bad[k].body);
        CHECK_MSG(is_error(&r, 400, bad[k].message), "%s", bad[k].body);
        free(r.body);
    }
}

/* One /v1/responses request on the chat server: its reply (200 expected) as JSON. */
static json_t *respond(const char *body) {
    reply r = http(&chat_srv, "POST", "/v1/responses", body);
    CHECK_MSG(r.status == 200, "/v1/responses %s: %.300s", body, r.body);
    json_t *o = reply_json(&r);
    free(r.body);
    return o;
}

/* The stored responses (VLLM_ENABLE_RESPONSES_API_STORE; the chat server has the store): GET
 * /v1/responses/{id} returns a response as it was sent (streamed ones too, as response.completed
 * carried them), store false keeps nothing, previous_response_id continues the conversation as
 * vLLM does (the earlier messages, the earlier output as the assistant's turn, then the new input:
 * the prompt /tokenize makes of them), and the refusals: an unknown id (404, also on a server that
 * stores nothing), a cancel of a synchronous response. */
static void test_responses_store(void) {
    json_t *first = respond("{\"model\":\"" NAME "\",\"instructions\":\"You are helpful.\",\"input\":\"What is the weather "
                            "in Paris?\",\"max_output_tokens\":4,\"temperature\":0}");
    const char *id = json_string_value(json_object_get(first, "id"));
    char *path = tu_strdupf("/v1/responses/%s%s", id ? id : "", "");
    reply r = http(&chat_srv, "GET", path, NULL);
    json_t *got = reply_json(&r);
    CHECK_MSG(r.status == 200 && json_equal(got, first), "GET %s: %.300s", path, r.body);
    json_decref(got);
    free(r.body);
    char *cancel = tu_strdupf("%s%s", path, "/cancel");
    r = http(&chat_srv, "POST", cancel, NULL);
    CHECK(is_error(&r, 400, "Cannot cancel a synchronous response."));
    free(r.body);
    free(cancel);

    /* continued: the prompt of [system, user, assistant (the first output), user] */
    char *next = tu_strdupf("{\"model\":\"" NAME "\",\"previous_response_id\":\"%s\",\"input\":\"And tomorrow?\","
                            "\"max_output_tokens\":1,\"temperature\":0%s}", id ? id : "", "");
    json_t *second = respond(next);
    CHECK_STR_EQ(json_string_value(json_object_get(second, "previous_response_id")), id ? id : "");
    const char *answer = output_text(first, "message");
    json_t *tk = json_pack("{s:[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}, {s:s, s:s}]}", "messages", "role", "system", "content",
                           "You are helpful.", "role", "user", "content", "What is the weather in Paris?", "role",
                           "assistant", "content", answer ? answer : "", "role", "user", "content", "And tomorrow?");
    char *tk_body = json_dumps(tk, 0);
    r = http(&chat_srv, "POST", "/tokenize", tk_body);
    json_t *count = reply_json(&r);
    CHECK_EQ_INT(json_integer_value(json_object_get(count, "count")),
                 json_integer_value(json_object_get(json_object_get(second, "usage"), "input_tokens")));
    json_decref(count);
    free(r.body);
    free(tk_body);
    json_decref(tk);
    free(next);
    json_decref(second);

    /* streamed: stored as response.completed carried it */
    r = http(&chat_srv, "POST", "/v1/responses", "{\"model\":\"" NAME "\",\"input\":\"Hi\",\"max_output_tokens\":3,"
                                                 "\"temperature\":0,\"stream\":true}");
    char *text;
    bool ok;
    json_t *done = parse_responses_sse(r.body, &text, &ok);
    free(text);
    free(r.body);
    CHECK(ok && done);
    char *streamed_path = tu_strdupf("/v1/responses/%s%s", json_string_value(json_object_get(done, "id")), "");
    r = http(&chat_srv, "GET", streamed_path, NULL);
    got = reply_json(&r);
    CHECK_MSG(r.status == 200 && json_equal(got, done), "GET %s: %.300s", streamed_path, r.body);
    json_decref(got);
    free(r.body);
    free(streamed_path);
    json_decref(done);

    /* store false keeps nothing; unknown ids */
    json_t *unstored = respond("{\"model\":\"" NAME "\",\"input\":\"Hi\",\"max_output_tokens\":1,\"store\":false}");
    char *unstored_path = tu_strdupf("/v1/responses/%s%s", json_string_value(json_object_get(unstored, "id")), "");
    r = http(&chat_srv, "GET", unstored_path, NULL);
    CHECK(is_error(&r, 404, "not found"));
    free(r.body);
    free(unstored_path);
    json_decref(unstored);
    r = http(&chat_srv, "POST", "/v1/responses", "{\"model\":\"" NAME "\",\"input\":\"Hi\",\"previous_response_id\":\"resp_nope\"}");
    CHECK(is_error(&r, 404, "Response with id 'resp_nope' not found."));
    free(r.body);
    r = http(&ref_srv, "POST", "/v1/responses", "{\"model\":\"" NAME "\",\"input\":\"Hi\",\"previous_response_id\":\"resp_nope\"}");
    CHECK(is_error(&r, 404, "stored with VLLM_ENABLE_RESPONSES_API_STORE=1"));
    free(r.body);
    r = http(&ref_srv, "GET", path, NULL);
    CHECK(is_error(&r, 404, "not found"));
    free(r.body);
    free(path);
    json_decref(first);
}

/* The stored response of `id` once it is no longer queued or in progress, polled for up to 30 s. */
static json_t *settled_response(const char *id) {
    char *path = tu_strdupf("/v1/responses/%s%s", id, "");
    json_t *got = NULL;
    for (int i = 0; i < 3000; i++) {
        reply r = http(&chat_srv, "GET", path, NULL);
        json_decref(got);
        got = reply_json(&r);
        free(r.body);
        const char *status = json_string_value(json_object_get(got, "status"));
        if (r.status != 200 || !status || (strcmp(status, "queued") && strcmp(status, "in_progress"))) break;
        usleep(10000);
    }
    free(path);
    return got;
}

/* background (with the store): answered at once "queued" (no output, no usage), then GET
 * /v1/responses/{id} gives the finished response, equal to the same request answered while the client
 * waits but for its id, timestamps and background; a cancel while it runs makes it "cancelled" for
 * good and aborts the generation (the server's load drops back to 0 long before 3000 tokens); with
 * stream, the events, replayed from the store by GET ?stream=true&starting_after=N; and vLLM's
 * refusals: background without the store, with store false, a replay of a response without events. */
static void test_responses_background(void) {
    static const char body[] = "{\"model\":\"" NAME "\",\"input\":\"What is the weather in Paris?\","
                               "\"max_output_tokens\":5,\"temperature\":0%s}";
    char *bg_body = tu_strdupf(body, ",\"background\":true", ""), *sync_body = tu_strdupf(body, "", "");
    json_t *queued = respond(bg_body), *sync = respond(sync_body);
    CHECK_STR_EQ(json_string_value(json_object_get(queued, "status")), "queued");
    CHECK(json_array_size(json_object_get(queued, "output")) == 0 && json_is_null(json_object_get(queued, "usage")));
    CHECK(json_is_true(json_object_get(queued, "background")));
    const char *id = json_string_value(json_object_get(queued, "id"));
    json_t *done = settled_response(id ? id : "");
    CHECK_STR_EQ(json_string_value(json_object_get(done, "status")), json_string_value(json_object_get(sync, "status")));
    CHECK_STR_EQ(output_text(done, "message"), output_text(sync, "message"));
    CHECK_STR_EQ(output_text(done, "reasoning"), output_text(sync, "reasoning"));
    CHECK(json_equal(json_object_get(done, "usage"), json_object_get(sync, "usage")));
    CHECK_STR_EQ(json_string_value(json_object_get(done, "id")), id ? id : "");
    json_decref(done);
    json_decref(sync);
    json_decref(queued);
    free(bg_body);
    free(sync_body);

    /* cancelled while it runs: 3000 tokens, the end-of-text tokens barred */
    queued = respond("{\"model\":\"" NAME "\",\"input\":\"Count to ten thousand.\",\"max_output_tokens\":3000,"
                     "\"logit_bias\":{\"151643\":-100,\"151645\":-100},\"background\":true}");
    id = json_string_value(json_object_get(queued, "id"));
    char *cancel = tu_strdupf("/v1/responses/%s/cancel%s", id ? id : "", "");
    reply r = http(&chat_srv, "POST", cancel, NULL);
    json_t *cancelled = reply_json(&r);
    CHECK_MSG(r.status == 200, "cancel: %.300s", r.body);
    CHECK_STR_EQ(json_string_value(json_object_get(cancelled, "status")), "cancelled");
    free(r.body);
    json_decref(cancelled);
    CHECK_EQ_INT(settled_load(&chat_srv), 0);
    done = settled_response(id ? id : "");
    CHECK_STR_EQ(json_string_value(json_object_get(done, "status")), "cancelled");
    CHECK_EQ_INT(json_array_size(json_object_get(done, "output")), 0);
    json_decref(done);
    r = http(&chat_srv, "POST", cancel, NULL);
    CHECK(is_error(&r, 400, "Cannot cancel a synchronous response."));
    free(r.body);
    free(cancel);
    json_decref(queued);

    r = http(&ref_srv, "POST", "/v1/responses", "{\"model\":\"" NAME "\",\"input\":\"Hi\",\"background\":true}");
    CHECK(is_error(&r, 400, "does not support `store=True` and therefore does not support the background mode"));
    free(r.body);
    r = http(&chat_srv, "POST", "/v1/responses", "{\"model\":\"" NAME "\",\"input\":\"Hi\",\"background\":true,"
                                                 "\"store\":false}");
    CHECK(is_error(&r, 400, "background can only be used when `store` is true"));
    free(r.body);

    /* with stream: the POST gets the events, which stay in the store: GET ?stream=true&starting_after=2
     * replays those after the third, and the stored response is response.completed's */
    r = http(&chat_srv, "POST", "/v1/responses", "{\"model\":\"" NAME "\",\"input\":\"Hi\",\"max_output_tokens\":4,"
                                                 "\"temperature\":0,\"background\":true,\"stream\":true}");
    char *text;
    bool ok;
    json_t *completed = parse_responses_sse(r.body, &text, &ok);
    CHECK_MSG(r.status == 200 && ok && completed, "%.300s", r.body);
    const char *sid = json_string_value(json_object_get(completed, "id"));
    char *replay = tu_strdupf("/v1/responses/%s?stream=true&starting_after=2%s", sid ? sid : "", "");
    reply again = http(&chat_srv, "GET", replay, NULL);
    const char *tail = r.body;
    for (int k = 0; k < 3 && tail; k++) tail = strstr(tail, "\n\n") ? strstr(tail, "\n\n") + 2 : NULL;
    CHECK_MSG(again.status == 200 && tail && !strcmp(again.body, tail), "replay: %.300s", again.body);
    CHECK(strstr(again.body, "\"sequence_number\":3") != NULL);
    free(again.body);
    json_t *kept = settled_response(sid ? sid : "");
    CHECK(json_equal(kept, completed));
    json_decref(kept);
    free(replay);
    free(text);
    free(r.body);
    json_decref(completed);
    /* followed while it runs: the POST's stream and a GET joined after its first event get the same
     * events (the GET all but the first), a third GET that hangs up harms neither, and both end when
     * it is cancelled */
    static const char long_body[] = "{\"model\":\"" NAME "\",\"input\":\"Count to ten thousand.\",\"max_output_tokens\":3000,"
                                    "\"logit_bias\":{\"151643\":-100,\"151645\":-100},\"background\":true,\"stream\":true}";
    post *producer = post_new(&chat_srv, long_body, NULL);
    char url[256];
    snprintf(url, sizeof url, "%s/v1/responses", chat_srv.base);
    curl_easy_setopt(producer->c, CURLOPT_URL, url);
    CURLM *m = curl_multi_init();
    curl_multi_add_handle(m, producer->c);
    int running = 1;
    char *live_id = NULL;
    for (int spins = 0; running && !live_id && spins < 3000; spins++) { /* until response.created is in */
        curl_multi_perform(m, &running);
        const char *at = producer->r.body ? strstr(producer->r.body, "\"id\":\"resp_") : NULL;
        if (at && strstr(at, "\n\n")) live_id = cv_xstrndup(at + 6, strcspn(at + 6, "\""));
        else curl_multi_poll(m, NULL, 0, 10, NULL);
    }
    CHECK_MSG(live_id, "no response.created: %.300s", producer->r.body ? producer->r.body : "");
    post *follower = post_new(&chat_srv, "", NULL);
    snprintf(url, sizeof url, "%s/v1/responses/%s?stream=true&starting_after=0", chat_srv.base, live_id ? live_id : "");
    curl_easy_setopt(follower->c, CURLOPT_URL, url);
    curl_easy_setopt(follower->c, CURLOPT_HTTPGET, 1L);
    curl_multi_add_handle(m, follower->c);
    for (int spins = 0; spins < 3000 && !(follower->r.body && strstr(follower->r.body, "\n\n")); spins++) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 10, NULL);
    }
    /* a third follows a moment and hangs up: the stream goes on for the others */
    post *quitter = post_new(&chat_srv, "", NULL);
    curl_easy_setopt(quitter->c, CURLOPT_URL, url);
    curl_easy_setopt(quitter->c, CURLOPT_HTTPGET, 1L);
    curl_multi_add_handle(m, quitter->c);
    for (int spins = 0; spins < 3000 && !(quitter->r.body && strstr(quitter->r.body, "\n\n")); spins++) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 10, NULL);
    }
    curl_multi_remove_handle(m, quitter->c);
    post_free(quitter);
    const size_t before = follower->r.len;
    for (int spins = 0; spins < 3000 && follower->r.len == before; spins++) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 10, NULL);
    }
    char *stop = tu_strdupf("/v1/responses/%s/cancel%s", live_id ? live_id : "", "");
    r = http(&chat_srv, "POST", stop, NULL);
    CHECK_MSG(r.status == 200, "cancel: %.300s", r.body);
    free(r.body);
    free(stop);
    while (running) {
        curl_multi_perform(m, &running);
        if (running) curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    const char *produced = producer->r.body ? producer->r.body : "", *second = strstr(produced, "\n\n");
    CHECK(!strstr(produced, "response.completed"));
    CHECK_MSG(second && follower->r.body && !strcmp(follower->r.body, second + 2), "follower: %.200s",
              follower->r.body ? follower->r.body : "(nothing)");
    curl_multi_remove_handle(m, producer->c);
    curl_multi_remove_handle(m, follower->c);
    curl_multi_cleanup(m);
    post_free(producer);
    post_free(follower);
    CHECK_EQ_INT(settled_load(&chat_srv), 0);
    json_t *gone = settled_response(live_id ? live_id : "");
    CHECK_STR_EQ(json_string_value(json_object_get(gone, "status")), "cancelled");
    json_decref(gone);
    free(live_id);

    /* a non-streamed one has no events; starting_after must be a number */
    json_t *plain = respond("{\"model\":\"" NAME "\",\"input\":\"Hi\",\"max_output_tokens\":1,\"background\":true}");
    const char *pid = json_string_value(json_object_get(plain, "id"));
    char *events = tu_strdupf("/v1/responses/%s?stream=true%s", pid ? pid : "", "");
    r = http(&chat_srv, "GET", events, NULL);
    CHECK(is_error(&r, 400, "Unknown response_id"));
    free(r.body);
    free(events);
    events = tu_strdupf("/v1/responses/%s?stream=1&starting_after=x%s", pid ? pid : "", "");
    r = http(&chat_srv, "GET", events, NULL);
    CHECK(is_error(&r, 400, "starting_after: Input should be a valid integer"));
    free(r.body);
    free(events);
    json_decref(settled_response(pid ? pid : ""));
    json_decref(plain);
}

/* /tokenizer_info (--enable-tokenizer-info-endpoint): tokenizer_config.json as transformers holds it
 * (added tokens and special tokens as their strings), the fast tokenizer's class; 404 without the
 * flag. */
static void test_tokenizer_info(void) {
    reply r = http(&chat_srv, "GET", "/tokenizer_info", NULL);
    json_t *j = reply_json(&r);
    CHECK_MSG(r.status == 200, "/tokenizer_info: %.300s", r.body);
    CHECK_STR_EQ(json_string_value(json_object_get(j, "tokenizer_class")), "Qwen2TokenizerFast");
    CHECK_STR_EQ(json_string_value(json_object_get(j, "eos_token")), "<|im_end|>");
    CHECK_STR_EQ(json_string_value(json_object_get(json_object_get(j, "added_tokens_decoder"), "151643")), "<|endoftext|>");
    CHECK(json_is_string(json_object_get(j, "chat_template")) && !json_object_get(j, "vocab_file"));
    json_decref(j);
    free(r.body);
    r = http(&ref_srv, "GET", "/tokenizer_info", NULL);
    CHECK(is_error(&r, 404, "Not Found"));
    free(r.body);
}

/* An Anthropic event stream, as a client reads it: each record "event: NAME\ndata: JSON" whose type is
 * NAME, content blocks started, written to and stopped in order (deltas to the open block only), the
 * message framed by message_start ... message_delta, message_stop, and vLLM's "data: [DONE]" last. */
typedef struct anthropic_stream {
    bool well_formed;
    char *events;      /* the event names, space-separated */
    char *text, *thinking, *partial_json, *tool_name;
    json_t *inputs;    /* each tool_use block's input, its input_json_delta pieces parsed */
    char *stop_reason;
    long input_tokens, output_tokens;
} anthropic_stream;

static anthropic_stream parse_anthropic_sse(const char *body) {
    anthropic_stream a = {.well_formed = true, .events = calloc(1, 1), .text = calloc(1, 1), .thinking = calloc(1, 1),
                          .partial_json = calloc(1, 1), .inputs = json_array()};
    long open = -1, next = 0;
    const char *p = body;
    for (;;) {
        const char *end = strstr(p, "\n\n");
        if (!end) break;
        if (!strncmp(p, "data: [DONE]", 12)) {
            a.well_formed = a.well_formed && end[2] == 0 && strstr(a.events, "message_stop");
            p = end + 2;
            break;
        }
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        char name[64] = "";
        if (strncmp(p, "event: ", 7) || !nl || nl - p - 7 >= 64 || strncmp(nl + 1, "data: ", 6)) {
            a.well_formed = false;
            break;
        }
        memcpy(name, p + 7, (size_t)(nl - p - 7));
        json_t *d = json_loadb(nl + 7, (size_t)(end - nl - 7), 0, NULL);
        const char *type = json_string_value(json_object_get(d, "type"));
        a.well_formed = a.well_formed && type && !strcmp(type, name);
        append_str(&a.events, *a.events ? " " : "");
        append_str(&a.events, name);
        const long index = (long)json_integer_value(json_object_get(d, "index"));
        if (!strcmp(name, "message_start")) {
            a.input_tokens = (long)json_integer_value(json_object_get(json_object_get(json_object_get(d, "message"), "usage"),
                                                                      "input_tokens"));
        } else if (!strcmp(name, "content_block_start")) {
            a.well_formed = a.well_formed && open < 0 && index == next;
            open = index;
            const json_t *b = json_object_get(d, "content_block");
            if (json_object_get(b, "name")) {
                free(a.tool_name);
                a.tool_name = strdup(json_string_value(json_object_get(b, "name")));
            }
        } else if (!strcmp(name, "content_block_delta")) {
            a.well_formed = a.well_formed && index == open;
            const json_t *delta = json_object_get(d, "delta");
            const char *kind = json_string_value(json_object_get(delta, "type"));
            if (kind && !strcmp(kind, "text_delta")) append_str(&a.text, json_string_value(json_object_get(delta, "text")));
            if (kind && !strcmp(kind, "thinking_delta"))
                append_str(&a.thinking, json_string_value(json_object_get(delta, "thinking")));
            if (kind && !strcmp(kind, "input_json_delta"))
                append_str(&a.partial_json, json_string_value(json_object_get(delta, "partial_json")));
        } else if (!strcmp(name, "content_block_stop")) {
            a.well_formed = a.well_formed && index == open;
            open = -1;
            next++;
            if (*a.partial_json) {
                json_t *input = json_loads(a.partial_json, 0, NULL);
                a.well_formed = a.well_formed && json_is_object(input);
                json_array_append_new(a.inputs, input ? input : json_null());
                *a.partial_json = 0;
            }
        } else if (!strcmp(name, "message_delta")) {
            a.well_formed = a.well_formed && open < 0;
            const char *reason = json_string_value(json_object_get(json_object_get(d, "delta"), "stop_reason"));
            a.stop_reason = reason ? strdup(reason) : NULL;
            a.output_tokens = (long)json_integer_value(json_object_get(json_object_get(d, "usage"), "output_tokens"));
        }
        json_decref(d);
        p = end + 2;
    }
    a.well_formed = a.well_formed && !*p && !strncmp(a.events, "message_start", 13) &&
                    strstr(a.events, "message_delta message_stop") != NULL;
    return a;
}

static void free_anthropic_stream(anthropic_stream *a) {
    free(a->events);
    free(a->text);
    free(a->thinking);
    free(a->partial_json);
    free(a->tool_name);
    free(a->stop_reason);
    json_decref(a->inputs);
}

/* The `key` text of a message's first content block of `type`, or "". */
static const char *block_text(const json_t *msg, const char *type, const char *key) {
    const char *text = json_string_value(json_object_get(first_of_type(json_object_get(msg, "content"), type), key));
    return text ? text : "";
}

/* vLLM's Anthropic Messages API: a message equals the chat completion of the same conversation
 * (text, usage, stop reason), streamed as the event stream with the same text; count_tokens counts
 * the prompt /tokenize counts for the translated conversation (tool_use and tool_result turns
 * included); a forced tool choice gives a tool_use block, also streamed as input_json_delta; errors
 * come in Anthropic's shape. */
static void test_anthropic_messages(void) {
    chat_reference ref = chat_of_messages();
    reply r;
    const char *base = "{\"model\":\"" NAME "\",\"system\":\"You are helpful.\",\"messages\":[{\"role\":\"user\",\"content\":"
                       "[{\"type\":\"text\",\"text\":\"What is the weather in Paris?\"}]}],\"max_tokens\":12,\"temperature\":0";
    char *plain = tu_strdupf("%s%s", base, "}"), *streamed = tu_strdupf("%s%s", base, ",\"stream\":true}");
    r = http(&chat_srv, "POST", "/v1/messages", plain);
    CHECK_MSG(r.status == 200, "/v1/messages: %.300s", r.body);
    json_t *m = reply_json(&r);
    CHECK_STR_EQ(json_string_value(json_object_get(m, "type")), "message");
    CHECK_STR_EQ(json_string_value(json_object_get(m, "role")), "assistant");
    CHECK_STR_EQ(json_string_value(json_object_get(m, "model")), NAME);
    CHECK_STR_EQ(json_string_value(json_object_get(m, "stop_reason")), "max_tokens");
    CHECK_STR_EQ(block_text(m, "text", "text"), ref.content);
    CHECK_STR_EQ(block_text(m, "thinking", "thinking"), ref.reasoning);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(m, "usage"), "input_tokens")), ref.prompt_tokens);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(m, "usage"), "output_tokens")), 12);
    json_decref(m);
    free(r.body);
    r = http(&chat_srv, "POST", "/v1/messages", streamed);
    anthropic_stream a = parse_anthropic_sse(r.body);
    CHECK_MSG(r.status == 200 && a.well_formed, "stream: %.600s", r.body);
    CHECK_STR_EQ(a.text, ref.content);
    CHECK_STR_EQ(a.thinking, ref.reasoning);
    CHECK_STR_EQ(a.stop_reason ? a.stop_reason : "", "max_tokens");
    CHECK(a.input_tokens == ref.prompt_tokens && a.output_tokens == 12);
    free_anthropic_stream(&a);
    free(r.body);
    json_decref(ref.reply);
    free(plain);
    free(streamed);

    /* count_tokens of a conversation with a tool call and its result: /tokenize's count of the chat
     * form the translation gives (arguments as Python's json.dumps prints them). */
    const char *conversation =
        "\"system\":[{\"type\":\"text\",\"text\":\"You are \"},{\"type\":\"text\",\"text\":\"helpful.\"}],\"messages\":["
        "{\"role\":\"user\",\"content\":\"What is the weather in Paris?\"},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Let me look.\"},{\"type\":\"tool_use\","
        "\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\",\"unit\":\"c\"}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\",\"content\":[{\"type\":"
        "\"text\",\"text\":\"18 C\"}]},{\"type\":\"text\",\"text\":\"Thanks!\"}]}]";
    char *count = tu_strdupf("{\"model\":\"" NAME "\",%s,\"tools\":[{\"name\":\"get_weather\",\"description\":\"Current "
                             "weather\",\"input_schema\":{\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":"
                             "[\"city\"]}}]}", conversation, "");
    r = http(&chat_srv, "POST", "/v1/messages/count_tokens", count);
    json_t *cnt = reply_json(&r);
    const json_int_t counted = json_integer_value(json_object_get(cnt, "input_tokens"));
    CHECK_MSG(r.status == 200 && counted > 0, "count_tokens: %.300s", r.body);
    json_decref(cnt);
    free(r.body);
    const char *tokenize =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"You are helpful.\"},{\"role\":\"user\",\"content\":\"What is the "
        "weather in Paris?\"},{\"role\":\"assistant\",\"content\":\"Let me look.\",\"tool_calls\":[{\"id\":\"toolu_1\","
        "\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\", "
        "\\\"unit\\\": \\\"c\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"toolu_1\",\"content\":\"18 C\"},{\"role\":"
        "\"user\",\"content\":\"Thanks!\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"description\":\"Current weather\",\"parameters\":{\"properties\":{\"city\":{\"type\":\"string\"}},"
        "\"required\":[\"city\"],\"type\":\"object\"}}}]}";
    r = http(&chat_srv, "POST", "/tokenize", tokenize);
    json_t *tk = reply_json(&r);
    CHECK_EQ_INT(json_integer_value(json_object_get(tk, "count")), counted);
    json_decref(tk);
    free(r.body);
    free(count);

    /* tool_choice any (chat's "required"): the output is a call, a tool_use block */
    const char *forced = "{\"model\":\"" NAME "\",\"messages\":[{\"role\":\"user\",\"content\":\"What is the weather in "
                         "Paris?\"}],\"tools\":[{\"name\":\"get_weather\",\"input_schema\":{\"type\":\"object\",\"properties\":"
                         "{\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"unit\"],\"additionalProperties\":false}}],"
                         "\"tool_choice\":{\"type\":\"any\"},\"thinking\":{\"type\":\"disabled\"},\"max_tokens\":200,"
                         "\"temperature\":0";
    plain = tu_strdupf("%s%s", forced, "}");
    streamed = tu_strdupf("%s%s", forced, ",\"stream\":true}");
    r = http(&chat_srv, "POST", "/v1/messages", plain);
    m = reply_json(&r);
    CHECK_MSG(r.status == 200, "forced tool: %.300s", r.body);
    CHECK_STR_EQ(json_string_value(json_object_get(m, "stop_reason")), "tool_use");
    json_t *inputs = json_array(); /* the calls' inputs (the model may make several) */
    size_t i;
    const json_t *use;
    json_array_foreach(json_object_get(m, "content"), i, use) {
        CHECK_STR_EQ(json_string_value(json_object_get(use, "type")), "tool_use");
        CHECK_STR_EQ(json_string_value(json_object_get(use, "name")), "get_weather");
        const char *unit = json_string_value(json_object_get(json_object_get(use, "input"), "unit"));
        CHECK_MSG(unit && (!strcmp(unit, "c") || !strcmp(unit, "f")), "tool_use input: %.300s", r.body);
        json_array_append(inputs, json_object_get(use, "input"));
    }
    CHECK(json_array_size(inputs) > 0);
    reply s = http(&chat_srv, "POST", "/v1/messages", streamed);
    a = parse_anthropic_sse(s.body);
    CHECK_MSG(a.well_formed, "forced tool stream: %.600s", s.body);
    CHECK_MSG(json_equal(a.inputs, inputs), "streamed inputs differ: %.600s", s.body);
    CHECK_STR_EQ(a.tool_name ? a.tool_name : "", "get_weather");
    CHECK_STR_EQ(a.stop_reason ? a.stop_reason : "", "tool_use");
    json_decref(inputs);
    free_anthropic_stream(&a);
    free(s.body);
    json_decref(m);
    free(r.body);
    free(plain);
    free(streamed);

    /* Anthropic's clients send the key as x-api-key */
    const char *const good_key[] = {"x-api-key: " KEY, NULL}, *const bad_key[] = {"x-api-key: nope", NULL};
    const char *hi = "{\"model\":\"" NAME "\",\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}";
    r = http_with(&chat_srv, "POST", "/v1/messages", hi, NULL, good_key);
    CHECK_MSG(r.status == 200, "x-api-key: %ld %.200s", r.status, r.body);
    free_reply(&r);
    r = http_with(&chat_srv, "POST", "/v1/messages", hi, NULL, bad_key);
    CHECK_EQ_INT(r.status, 401);
    free_reply(&r);

    /* errors in Anthropic's shape */
    static const struct {
        const char *body;
        long status;
        const char *message;
    } bad[] = {
        {"{\"model\":\"" NAME "\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", 400, "Field required"},
        {"{\"model\":\"" NAME "\",\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", 400,
         "max_tokens must be positive"},
        {"{\"model\":\"" NAME "\",\"max_tokens\":5,\"messages\":[]}", 400, "messages must contain at least one item"},
        {"{\"model\":\"" NAME "\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[]}]}", 400,
         "message content must not be empty"},
        {"{\"model\":\"" NAME "\",\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"Hi\"}]}", 400,
         "Input should be 'user' or 'assistant'"},
        {"{\"model\":\"" NAME "\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tool_choice\":"
         "{\"type\":\"tool\"}}", 400, "tool_choice.name is required when tool_choice.type is 'tool'"},
        {"{\"model\":\"nope\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", 404,
         "The model `nope` does not exist."},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        r = http(&chat_srv, "POST", "/v1/messages", bad[k].body);
        json_t *e = reply_json(&r);
        const json_t *err = json_object_get(e, "error");
        const char *msg = json_string_value(json_object_get(err, "message"));
        CHECK_MSG(r.status == bad[k].status && !strcmp(json_string_value(json_object_get(e, "type")), "error") &&
                      json_is_string(json_object_get(err, "type")) && msg && strstr(msg, bad[k].message),
                  "%s: %ld %.300s", bad[k].body, r.status, r.body);
        json_decref(e);
        free(r.body);
    }
}

/* vLLM's beam search written again over the server's own single-token requests (greedy, so each
 * step's candidates are its top 2·width entries), for the reference checkpoint, whose 4,096-token
 * vocabulary holds no eos: width beams after `steps` steps, best first. */
static int reference_beams(const int32_t *prompt, int n_prompt, int width, int steps, ref_beam *out) {
    ref_beam live[8] = {0}, cand[64];
    memcpy(live[0].ids, prompt, (size_t)n_prompt * sizeof *prompt);
    live[0].n = n_prompt;
    int n_live = 1;
    for (int step = 0; step < steps; step++) {
        int n_cand = 0;
        for (int b = 0; b < n_live; b++) {
            char *ids = ids_text(live[b].ids, live[b].n), body[1024];
            snprintf(body, sizeof body,
                     "{\"prompt\":%s,\"max_tokens\":1,\"temperature\":0,\"logprobs\":%d,\"return_tokens_as_token_ids\":true}",
                     ids, 2 * width);
            free(ids);
            long status;
            json_t *j = completion_reply(body, &status);
            json_t *top = json_array_get(json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                                                         "logprobs"),
                                                         "top_logprobs"),
                                         0);
            CHECK_EQ_INT(status, 200);
            CHECK_EQ_INT(json_object_size(top), 2 * width); /* the greedy token is the first of its top entries */
            const char *key;
            json_t *v;
            json_object_foreach(top, key, v) {
                ref_beam *c = &cand[n_cand++];
                *c = live[b];
                c->ids[c->n++] = atoi(key + strlen("token_id:"));
                c->cum = live[b].cum + json_real_value(v);
            }
            json_decref(j);
        }
        qsort(cand, (size_t)n_cand, sizeof *cand, ref_beam_desc);
        n_live = n_cand < width ? n_cand : width;
        memcpy(live, cand, (size_t)n_live * sizeof *live);
    }
    memcpy(out, live, (size_t)n_live * sizeof *live);
    return n_live;
}

static bool same_output(const json_t *choice, const ref_beam *b, int n_prompt) {
    const json_t *ids = json_object_get(choice, "token_ids");
    bool same = (int)json_array_size(ids) == b->n - n_prompt;
    for (size_t i = 0; same && i < json_array_size(ids); i++)
        same = json_integer_value(json_array_get(ids, i)) == b->ids[n_prompt + (int)i];
    return same;
}

static void test_beam_search(void) {
    const int32_t prompt[] = {40, 1079, 304, 279, 3753};
    enum { N_PROMPT = 5, WIDTH = 3, STEPS = 4 };
    ref_beam expect[WIDTH];
    const int n_expect = reference_beams(prompt, N_PROMPT, WIDTH, STEPS, expect);
    CHECK_EQ_INT(n_expect, WIDTH);
    char *ids = ids_text(prompt, N_PROMPT), body[1024];
    snprintf(body, sizeof body,
             "{\"prompt\":%s,\"max_tokens\":%d,\"n\":%d,\"use_beam_search\":true,\"temperature\":0,"
             "\"return_token_ids\":true}",
             ids, STEPS, WIDTH);
    long status;
    json_t *j = completion_reply(body, &status);
    CHECK_EQ_INT(status, 200);
    json_t *choices = json_object_get(j, "choices");
    CHECK_EQ_INT(json_array_size(choices), WIDTH);
    for (int i = 0; i < n_expect && i < (int)json_array_size(choices); i++) {
        json_t *c = json_array_get(choices, (size_t)i);
        CHECK_MSG(same_output(c, &expect[i], N_PROMPT), "beam %d: %s", i, json_dumps(c, JSON_COMPACT));
        CHECK_STR_EQ(json_string_value(json_object_get(c, "finish_reason")), "length");
    }
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), WIDTH * STEPS);

    /* the C API's offline beam search: the same sequences, their cumulative logprobs the reference's */
    cvllm_engine_options o = engine_options(ref_srv.dir, NULL);
    cvllm_engine *e = NULL;
    CHECK_MSG(cvllm_engine_create(&o, &e) == 0, "%s", cvllm_last_error());
    const cvllm_prompt pr = {.token_ids = prompt, .n_token_ids = N_PROMPT};
    cvllm_beam_search_output out[1];
    const cvllm_beam_search_params bp = {.beam_width = WIDTH, .max_tokens = STEPS, .length_penalty = 1.0f};
    CHECK(e && cvllm_engine_beam_search(e, &pr, 1, &bp, out) == CVLLM_OK);
    CHECK_EQ_INT(out[0].n_sequences, WIDTH);
    for (int i = 0; i < out[0].n_sequences && i < WIDTH; i++) {
        const cvllm_beam_sequence *q = &out[0].sequences[i];
        bool same = (int)q->n_token_ids == STEPS;
        for (int t = 0; same && t < STEPS; t++) same = q->token_ids[t] == expect[i].ids[N_PROMPT + t];
        CHECK_MSG(same, "offline beam %d differs", i);
        CHECK(q->cumulative_logprob == expect[i].cum && q->finish_reason == CVLLM_FINISH_LENGTH);
        CHECK_STR_EQ(q->text, json_string_value(json_object_get(json_array_get(choices, (size_t)i), "text")));
    }
    cvllm_beam_search_output_free(out, 1);
    /* refused: no beams, and an engine with requests of its own in flight */
    const cvllm_beam_search_params none = {.beam_width = 0, .max_tokens = 1};
    CHECK(cvllm_engine_beam_search(e, &pr, 1, &none, out) == CVLLM_ERR_INVALID_ARGUMENT);
    cvllm_sampling_params sp;
    cvllm_sampling_params_default(e, &sp);
    sp.max_tokens = 2;
    CHECK(cvllm_engine_add_request(e, &pr, &sp, NULL) == CVLLM_OK);
    CHECK(cvllm_engine_beam_search(e, &pr, 1, &bp, out) == CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "no unfinished requests");
    cvllm_engine_destroy(e);

    /* streamed: the same texts, one chunk a choice, then [DONE] */
    snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":%d,\"n\":%d,\"use_beam_search\":true,\"temperature\":0,"
                                "\"stream\":true}", ids, STEPS, WIDTH);
    reply r = http(&ref_srv, "POST", "/v1/completions", body);
    stream_result s = parse_sse(r.body, false);
    CHECK(s.well_formed && s.done_last);
    for (int i = 0; i < WIDTH; i++) {
        CHECK_STR_EQ(s.text[i], json_string_value(json_object_get(json_array_get(choices, (size_t)i), "text")));
        CHECK_STR_EQ(s.finish[i], "length");
    }
    free_stream(&s);
    free(r.body);
    json_decref(j);

    /* width 1 is greedy decoding */
    snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":6,\"use_beam_search\":true,\"temperature\":0}", ids);
    j = completion_reply(body, &status);
    snprintf(body, sizeof body, "{\"prompt\":%s,\"max_tokens\":6,\"temperature\":0}", ids);
    json_t *greedy = completion_reply(body, &status);
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "text")),
                 json_string_value(json_object_get(json_array_get(json_object_get(greedy, "choices"), 0), "text")));
    json_decref(j);
    json_decref(greedy);
    free(ids);

    /* chat: n messages */
    r = http(&chat_srv, "POST", "/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3,\"n\":2,\"use_beam_search\":true,"
             "\"chat_template_kwargs\":{\"enable_thinking\":false}}");
    CHECK_EQ_INT(r.status, 200);
    j = reply_json(&r);
    CHECK_EQ_INT(json_array_size(json_object_get(j, "choices")), 2);
    CHECK(json_is_string(json_object_get(json_object_get(json_array_get(json_object_get(j, "choices"), 1), "message"),
                                         "content")));
    json_decref(j);
    free(r.body);

    /* a client that gives up: the step in flight is aborted, the server serves on. The search's
     * session (counted by /load on chat_srv) is released only once no step request of it is open and
     * none will follow, so that is when it is over (the engine alone can look idle between steps) */
    double aborted0 = aborted_total(&chat_srv);
    give_up_after_300ms(&chat_srv, "{\"prompt\":\"I am in the house\",\"max_tokens\":3000,\"n\":4,\"use_beam_search\":true}");
    CHECK_EQ_INT(settled_load(&chat_srv), 0);
    CHECK(wait_idle(&chat_srv, 3) < 3);
    /* a step request caught in flight ends "abort", one that had finished is not followed by another */
    const double ended = aborted_total(&chat_srv) + length_total(&chat_srv);
    usleep(300000);
    CHECK(aborted_total(&chat_srv) + length_total(&chat_srv) == ended);
    CHECK(ended > aborted0);
    j = completion_reply("{\"prompt\":\"I am in the house\",\"max_tokens\":2,\"n\":2,\"use_beam_search\":true}", &status);
    CHECK_EQ_INT(status, 200);
    json_decref(j);
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    easy = curl_easy_init();
    ref_srv.dir = tu_model_dir("qwen3-dense-f32");
    chat_srv.dir = full_vocab_model_dir();
    start_server(&ref_srv, NULL, (cv_api_structured_config){0});
    start_server(&chat_srv, "dummy", (cv_api_structured_config){.disable_any_whitespace = true});
    test_small_endpoints();
    test_port_in_use();
    test_tutorial_completions();
    test_concurrent_streams();
    test_disconnects();
    test_malformed_requests();
    test_metrics_families();
    test_loglikelihood_prefix_cache();
    test_chat();
    test_chat_prompt_endpoints();
    test_invocations();
    test_cors();
    test_unix_socket();
    test_chat_tools_and_reasoning();
    test_chat_content_parts();
    test_request_fields();
    test_structured_outputs();
    test_anthropic_messages();
    test_tokenizer_info();
    test_responses_api();
    test_responses_store();
    test_responses_background();
    test_beam_search();
    test_request_ids_and_load();
    curl_easy_cleanup(easy);
    stop_server(&ref_srv);
    stop_server(&chat_srv);
    curl_global_cleanup();
    return cv_check_summary("test_server");
}
