/*
 * test_data_parallel.c — `cvllm serve -dp N` (engine/engine_group.h) and its router (engine/router.h).
 *
 * The router alone: the least loaded replica (requests, then KV-cache usage, then index), the
 * longest prefix match, the balance guard that lets a clearly busier holder lose a request, an LRU
 * record that forgets a prompt's tail before its head, and cache_salt keeping prefixes apart.
 *
 * The server as a process, on the small reference checkpoint: 64 concurrent greedy completions (16
 * prompts × 4) give the same texts under -dp 1 and -dp 2; under -dp 2 both replicas served some
 * (/metrics, engine="0" and engine="1"), each vllm:* family is listed once with a series per engine;
 * a request goes to the less loaded replica; a stream aborted on each replica ends there as
 * "abort" (its id reached the replica that holds it); and a prompt repeated when both replicas are
 * idle goes back to the replica that served it, whose prefix-cache hits rise while the other's do
 * not (load alone would pick replica 0). -dp 2 -tp 2 (three OpenMPI ranks that cvllm starts: rank
 * 0 holds both replicas' first shards) gives the same texts again, both replicas serving. Then the
 * flags: -dp 0 a usage error, more replicas than threads warned about once, generate -dp 2 running
 * one engine. Last, -dp 2 -tp 2 over weights that fail to load exits 1, saying why once.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/block_pool.h"
#include "engine/router.h"
#include "serve_process.h"
#include "testutil.h"

#define NAME "dp-test"
enum { N_PROMPTS = 16, N_COPIES = 4, N_REQUESTS = N_PROMPTS * N_COPIES, BLOCK = 16 };

/* How long a server may take to say it is ready: a guard against a hang, not a speed. Under ASan a
 * -dp 3 start beside the suite's mpirun jobs on 2 cores once took over a minute (it is seconds
 * alone). */
enum { READY_SECONDS = 300 };

static char *model_dir;

/* ------------------------------------------------------------------------------------------------ */
/* The router                                                                                        */

/* The chained block hashes of n blocks of 4 tokens starting at token value `first` (the block hashes
 * the engine would file them under). */
static void chain(int32_t first, int32_t n, const char *salt, cv_block_hash *out) {
    int32_t tokens[64];
    for (int32_t i = 0; i < 4 * n; i++) tokens[i] = first + i;
    cv_block_hash_chain(tokens, 4, salt, 0, 0, n, out);
}

static cv_replica_load load(size_t requests, double usage) { return (cv_replica_load){requests, usage}; }

static void test_least_loaded(void) {
    cv_router *r = cv_router_new(3, 64);
    cv_replica_load l[3] = {load(2, 0), load(0, 0.5), load(0, 0.1)};
    CHECK_EQ_INT(cv_router_route(r, NULL, 0, l), 2); /* fewest requests, then lowest KV usage */
    l[2] = load(0, 0.5);
    CHECK_EQ_INT(cv_router_route(r, NULL, 0, l), 1); /* then the lowest index */
    cv_router_free(r);
}

static void test_prefix_match(void) {
    cv_block_hash a[4], salted[4];
    chain(100, 4, NULL, a);
    chain(100, 4, "tenant", salted);
    cv_router *r = cv_router_new(2, 64);
    cv_replica_load idle[2] = {load(0, 0), load(0, 0)};
    CHECK_EQ_INT(cv_router_route(r, a, 4, idle), 0);
    CHECK_EQ_INT(cv_router_match(r, 0, a, 4), 4);
    CHECK_EQ_INT(cv_router_match(r, 1, a, 4), 0);
    CHECK_EQ_INT(cv_router_match(r, 0, salted, 4), 0); /* another salt, another prefix */
    /* the holder wins over a less loaded replica while it is not clearly busier */
    CHECK_EQ_INT(cv_router_route(r, a, 4, (cv_replica_load[]){load(4, 0.9), load(0, 0)}), 0);
    /* ... and loses when it is: then the other replica holds the prefix too */
    CHECK_EQ_INT(cv_router_route(r, a, 4, (cv_replica_load[]){load(5, 0), load(0, 0)}), 1);
    CHECK_EQ_INT(cv_router_match(r, 1, a, 4), 4);
    /* equal matches: the less loaded */
    CHECK_EQ_INT(cv_router_route(r, a, 4, (cv_replica_load[]){load(2, 0), load(1, 0)}), 1);
    CHECK_EQ_INT(cv_router_route(r, a, 4, (cv_replica_load[]){load(1, 0), load(2, 0)}), 0);
    cv_router_free(r);

    /* the longest match wins: replica 0 holds two blocks of `a`, replica 1 all four */
    r = cv_router_new(2, 64);
    CHECK_EQ_INT(cv_router_route(r, a, 2, idle), 0);
    CHECK_EQ_INT(cv_router_route(r, a, 4, (cv_replica_load[]){load(9, 0), load(0, 0)}), 1);
    CHECK_EQ_INT(cv_router_route(r, a, 4, (cv_replica_load[]){load(0, 0), load(3, 0)}), 1);
    CHECK_EQ_INT(cv_router_match(r, 0, a, 4), 2);
    cv_router_free(r);
}

static void test_record_forgets_tails_first(void) {
    cv_block_hash a[4], c[2];
    chain(100, 4, NULL, a);
    chain(900, 2, NULL, c);
    cv_router *r = cv_router_new(2, 4); /* room for four blocks per replica */
    cv_replica_load idle[2] = {load(0, 0), load(0, 0)};
    CHECK_EQ_INT(cv_router_route(r, a, 4, idle), 0);
    CHECK_EQ_INT(cv_router_route(r, c, 2, (cv_replica_load[]){load(0, 0), load(1, 0)}), 0);
    CHECK_EQ_INT(cv_router_match(r, 0, c, 2), 2);
    CHECK_EQ_INT(cv_router_match(r, 0, a, 4), 2); /* a's last two blocks made room */
    /* a repeated prompt refreshes its blocks, so the next newcomer evicts c instead */
    CHECK_EQ_INT(cv_router_route(r, a, 2, idle), 0);
    cv_block_hash d[1];
    chain(500, 1, NULL, d);
    CHECK_EQ_INT(cv_router_route(r, d, 1, (cv_replica_load[]){load(0, 0), load(1, 0)}), 0);
    CHECK_EQ_INT(cv_router_match(r, 0, a, 4), 2);
    CHECK_EQ_INT(cv_router_match(r, 0, c, 2), 1);
    cv_router_free(r);
}

/* ------------------------------------------------------------------------------------------------ */
/* The server                                                                                        */

/* A completion request for reference prompt p (token ids below the checkpoint's vocabulary of 4096,
 * 24 to 99 tokens, so that most span several 16-token blocks). */
static char *prompt_body(int p, int max_tokens, const char *extra) {
    char *body = malloc(4096), *w = body;
    w += sprintf(w, "{\"model\":\"" NAME "\",\"prompt\":[");
    for (int k = 0; k < 24 + 5 * p; k++) w += sprintf(w, "%s%d", k ? "," : "", (p * 131 + k * 17 + 3) % 4000 + 50);
    sprintf(w, "],\"max_tokens\":%d,\"temperature\":0%s}", max_tokens, extra);
    return body;
}

static const char *const common_flags[] = {"--host", "127.0.0.1", "--port", "0", "--served-model-name", NAME,
                                           "--num-threads", "2", "--kv-cache-memory-bytes", "256M",
                                           "--max-model-len", "32768", "--seed", "7", "--disable-log-stats"};

/* A server of `dp` replicas, each sharded over `tp` ranks. */
static sp_proc start(const char *dp, const char *tp) {
    const char *args[32];
    size_t n = 0;
    for (size_t i = 0; i < sizeof common_flags / sizeof *common_flags; i++) args[n++] = common_flags[i];
    args[n++] = "-dp";
    args[n++] = dp;
    args[n++] = "-tp";
    args[n++] = tp;
    char tag[16];
    snprintf(tag, sizeof tag, "dp%s-tp%s", dp, tp);
    sp_proc p = sp_spawn(model_dir, model_dir, tag, args, n);
    CHECK_MSG(sp_wait_ready(&p, READY_SECONDS), "cvllm serve -dp %s -tp %s did not start", dp, tp);
    return p;
}

static void stop(sp_proc *p) {
    kill(p->pid, SIGTERM);
    CHECK_EQ_INT(sp_wait_exit(p, 30), 0);
}

/* 64 concurrent greedy completions, request i of prompt i % 16; their texts. */
static char **burst(int port) {
    sp_call calls[N_REQUESTS] = {0};
    pthread_t threads[N_REQUESTS];
    char **texts = calloc(N_REQUESTS, sizeof *texts);
    for (int i = 0; i < N_REQUESTS; i++) {
        calls[i] = (sp_call){.port = port, .body = prompt_body(i % N_PROMPTS, 8, "")};
        pthread_create(&threads[i], NULL, sp_post, &calls[i]);
    }
    for (int i = 0; i < N_REQUESTS; i++) {
        pthread_join(threads[i], NULL);
        CHECK_MSG(calls[i].status == 200, "request %d: status %ld: %s", i, calls[i].status,
                  calls[i].reply ? calls[i].reply : "");
        json_t *j = json_loads(calls[i].reply ? calls[i].reply : "", 0, NULL);
        json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
        const char *text = json_string_value(json_object_get(choice, "text"));
        texts[i] = strdup(text ? text : "(none)");
        CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 8);
        json_decref(j);
        free((char *)calls[i].body);
        free(calls[i].reply);
    }
    return texts;
}

/* One engine's sample of a vllm:* family, `labels` being those after engine and before model_name. */
static double engine_metric(int port, const char *family, int engine, const char *labels) {
    char series[256];
    snprintf(series, sizeof series, "%s{engine=\"%d\",%smodel_name=\"" NAME "\"}", family, engine, labels);
    return sp_metric(port, series);
}

static double finished(int port, int engine, const char *reason) {
    char labels[64];
    snprintf(labels, sizeof labels, "finished_reason=\"%s\",", reason);
    return engine_metric(port, "vllm:request_success_total", engine, labels);
}

static double running(int port, int engine) { return engine_metric(port, "vllm:num_requests_running", engine, ""); }
static double hits(int port, int engine) { return engine_metric(port, "vllm:prefix_cache_hits_total", engine, ""); }

static size_t count(const char *s, const char *needle) {
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* A stream the client hangs up on when told to. */
typedef struct stream {
    int port;
    char *body;
    atomic_bool hang_up;
} stream;

static size_t stream_write(char *data, size_t size, size_t n, void *user) {
    (void)data;
    stream *s = user;
    return atomic_load(&s->hang_up) ? 0 : size * n; /* 0: libcurl aborts and closes the connection */
}

static void *run_stream(void *arg) {
    stream *s = arg;
    CURL *h = curl_easy_init();
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/completions", s->port);
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, s->body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, stream_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 120L);
    curl_easy_perform(h);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return NULL;
}

/* Waits until `engine` runs at least one request; false after `seconds`. */
static bool wait_running_on(int port, int engine, double seconds) {
    for (double t0 = sp_now(); sp_now() - t0 < seconds; usleep(20000))
        if (running(port, engine) >= 1) return true;
    return false;
}

static bool wait_idle(int port, double seconds) {
    for (double t0 = sp_now(); sp_now() - t0 < seconds; usleep(20000))
        if (running(port, 0) == 0 && running(port, 1) == 0 &&
            engine_metric(port, "vllm:num_requests_waiting", 0, "") == 0 &&
            engine_metric(port, "vllm:num_requests_waiting", 1, "") == 0)
            return true;
    return false;
}

/* Both replicas served the burst, and /metrics lists each family once with both engines. */
static void check_burst_metrics(int port) {
    double served[2];
    for (int e = 0; e < 2; e++) served[e] = finished(port, e, "length") + finished(port, e, "stop");
    CHECK_MSG(served[0] > 0 && served[1] > 0, "replica 0 served %g, replica 1 %g", served[0], served[1]);
    CHECK_EQ_INT((int)(served[0] + served[1]), N_REQUESTS);
    sp_call m = {.port = port, .path = "/metrics"};
    sp_post(&m);
    const char *text = m.reply ? m.reply : "";
    CHECK_EQ_INT(count(text, "# TYPE vllm:num_requests_running gauge\n"), 1);
    CHECK_EQ_INT(count(text, "# TYPE vllm:e2e_request_latency_seconds histogram\n"), 1);
    CHECK_EQ_INT(count(text, "vllm:cache_config_info{block_size=\"16\",engine=\"1\","), 1);
    CHECK_EQ_INT(count(text, "vllm:e2e_request_latency_seconds_count{engine=\"1\",model_name=\"" NAME "\"} "), 1);
    CHECK(!strstr(text, "engine=\"2\""));
    free(m.reply);
}

/* Where requests go when it matters: by load, aborts to their replica, and back to a cached prefix. */
static void check_routing(int port) {
    /* L0, a stream of up to 32000 tokens: replica 0 (both idle, the lower index). */
    stream l0 = {.port = port, .body = prompt_body(20, 32000, ",\"ignore_eos\":true,\"stream\":true")};
    pthread_t t0, t1;
    pthread_create(&t0, NULL, run_stream, &l0);
    CHECK_MSG(wait_running_on(port, 0, 30), "the first stream never ran on replica 0");
    /* Q: the less loaded replica 1. */
    double before1 = finished(port, 1, "length");
    char *q = prompt_body(21, 4, ""); /* 129 tokens: 8 blocks a hit can cover */
    sp_call c = {.port = port, .body = q};
    sp_post(&c);
    CHECK_EQ_INT(c.status, 200);
    free(c.reply);
    CHECK(finished(port, 1, "length") == before1 + 1);
    /* L1: replica 1 again, the less loaded while L0 runs. */
    stream l1 = {.port = port, .body = prompt_body(22, 32000, ",\"ignore_eos\":true,\"stream\":true")};
    pthread_create(&t1, NULL, run_stream, &l1);
    CHECK_MSG(wait_running_on(port, 1, 30), "the second stream never ran on replica 1");
    /* Both clients hang up: each abort must reach the replica that runs its stream. */
    atomic_store(&l0.hang_up, true);
    atomic_store(&l1.hang_up, true);
    pthread_join(t0, NULL);
    pthread_join(t1, NULL);
    CHECK_MSG(wait_idle(port, 20), "the aborted streams kept running");
    CHECK(finished(port, 0, "abort") == 1);
    CHECK(finished(port, 1, "abort") == 1);
    /* Q again, both idle: back to replica 1, which has its prefix; replica 0 sees nothing of it. */
    double hits0 = hits(port, 0), hits1 = hits(port, 1);
    sp_call again = {.port = port, .body = q};
    sp_post(&again);
    CHECK_EQ_INT(again.status, 200);
    free(again.reply);
    CHECK(finished(port, 1, "length") == before1 + 2);
    CHECK_MSG(hits(port, 1) >= hits1 + 8 * BLOCK, "replica 1's prefix hits went from %g to %g", hits1, hits(port, 1));
    CHECK(hits(port, 0) == hits0);
    free(q);
    free(l0.body);
    free(l1.body);
}

static void test_serve(void) {
    sp_proc one = start("1", "1");
    char **expect = burst(one.port);
    stop(&one);
    for (int i = N_PROMPTS; i < N_REQUESTS; i++)
        CHECK_MSG(!strcmp(expect[i], expect[i % N_PROMPTS]), "-dp 1: copies of prompt %d differ", i % N_PROMPTS);

    sp_proc two = start("2", "1");
    char *log = tu_read_text(two.log);
    CHECK_CONTAINS(log, "data parallelism: 2 engine replicas in this process");
    free(log);
    char **got = burst(two.port);
    for (int i = 0; i < N_REQUESTS; i++) {
        CHECK_MSG(!strcmp(got[i], expect[i]), "request %d: -dp 2 wrote '%s', -dp 1 '%s'", i, got[i], expect[i]);
        free(got[i]);
    }
    free(got);
    check_burst_metrics(two.port);
    check_routing(two.port);
    stop(&two);

    /* each replica sharded over 2 ranks: 1 + 2·1 = 3 OpenMPI ranks, started by cvllm */
    sp_proc sharded = start("2", "2");
    log = tu_read_text(sharded.log);
    CHECK_CONTAINS(log, "tensor_parallel_size 2, data_parallel_size 2: starting 3 ranks under mpirun");
    free(log);
    got = burst(sharded.port);
    for (int i = 0; i < N_REQUESTS; i++) {
        CHECK_MSG(!strcmp(got[i], expect[i]), "request %d: -dp 2 -tp 2 wrote '%s', -dp 1 '%s'", i, got[i], expect[i]);
        free(got[i]);
        free(expect[i]);
    }
    free(got);
    free(expect);
    check_burst_metrics(sharded.port);
    stop(&sharded);
}

/* ------------------------------------------------------------------------------------------------ */
/* The flags                                                                                         */

static void test_flags(void) {
    const char *zero[] = {"--port", "0", "-dp", "0"};
    sp_proc p = sp_spawn(model_dir, model_dir, "dp0", zero, sizeof zero / sizeof *zero);
    CHECK_EQ_INT(sp_wait_exit(&p, 30), 2);
    char *log = tu_read_text(p.log);
    CHECK_CONTAINS(log, "--data-parallel-size must be in [1,");
    free(log);

    /* three replicas on two threads: each gets one, and it is said once */
    const char *three[] = {"--host", "127.0.0.1", "--port", "0", "-dp", "3", "--num-threads", "2",
                           "--kv-cache-memory-bytes", "48M", "--max-model-len", "1024"};
    p = sp_spawn(model_dir, model_dir, "dp3", three, sizeof three / sizeof *three);
    CHECK_MSG(sp_wait_ready(&p, READY_SECONDS), "cvllm serve -dp 3 did not start");
    stop(&p);
    log = tu_read_text(p.log);
    CHECK_EQ_INT(count(log, "data_parallel_size 3 with 2 kernel threads: each replica runs on 1 thread"), 1);
    free(log);

    char *gen = tu_strdupf("generate %s %s", model_dir,
                           "--prompt-token-ids 40,1079,304 --max-tokens 2 -dp 2 --kv-cache-memory-bytes 16M "
                           "--max-model-len 1024 --num-threads 1");
    tu_run r = tu_run_cvllm(model_dir, "", gen);
    CHECK_EQ_INT(r.status, 0);
    CHECK_CONTAINS(r.err, "--data-parallel-size 2: running in one process");
    CHECK(!strstr(r.err, "data parallelism: 2 engine replicas"));
    tu_run_free(&r);
    free(gen);
}

/* A -dp 2 -tp 2 job whose first replica fails to load (a dense config over MoE weights) exits 1 and
 * says why once. The second replica's workers wait for rank 0 to form their group: rank 0 forms it
 * only to let them go, so every rank ends by itself (without it the job hung, and then ended by
 * MPI_Abort after mpirun's kill sequence). */
static void test_load_failure(void) {
    char *bad = tu_model_dir_over("qwen3-dense-f32", "qwen3-moe-f32");
    const char *args[] = {"--host", "127.0.0.1", "--port", "0", "-dp", "2", "-tp", "2", "--num-threads", "2",
                          "--dtype", "float32", "--max-model-len", "1024"};
    sp_proc p = sp_spawn(bad, model_dir, "dp2-tp2-bad", args, sizeof args / sizeof *args);
    CHECK_EQ_INT(sp_wait_exit(&p, READY_SECONDS), 1);
    char *log = tu_read_text(p.log);
    CHECK_MSG(count(log, "cvllm serve: missing tensor model.layers.0.") == 1, "%s", log);
    CHECK_MSG(count(log, "data-parallel replica 1 of 2: its workers let go before it started") == 1, "%s", log);
    free(log);
    tu_remove_tree(bad);
    free(bad);
}

int main(void) {
    test_least_loaded();
    test_prefix_match();
    test_record_forgets_tails_first();
    curl_global_init(CURL_GLOBAL_DEFAULT);
    model_dir = tu_model_dir("qwen3-dense-f32");
    test_serve();
    test_flags();
    test_load_failure();
    tu_remove_tree(model_dir);
    free(model_dir);
    curl_global_cleanup();
    return cv_check_summary("test_data_parallel");
}
