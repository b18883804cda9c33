/*
 * engine_group.c — see engine_group.h for the design.
 *
 * The lock `mu` covers only the routing of a submit (reading the loads, the router's record, the
 * push into the chosen inbox); it is taken before a loop's own locks and never by a loop, so it
 * cannot deadlock with them, and it is never held across a forward pass.
 */
#include "engine/engine_group.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "engine/engine.h"
#include "engine/router.h"
#include "executor/runner.h"

struct cv_engine_group {
    int n;
    cv_engine_loop **loops;
    pthread_mutex_t mu;          /* routing (N > 1 only) */
    cv_router *router;           /* N > 1 */
    cv_replica_load *loads;      /* scratch for one routing, under mu */
    int32_t block_size;
    bool prefix_caching;         /* route by prefix too (the replicas cache prefixes) */
};

/* Replica 0 goes last: it prepared every request, and the grammars of structured outputs that the
 * other replicas' requests hold were compiled into its cache. */
static void stop_loops(cv_engine_loop **loops, int n) {
    for (int i = n - 1; i >= 0; i--) cv_engine_loop_stop(loops[i]);
}

/* One warning for the whole group, where each replica's engine quietly takes its one thread. */
static void warn_threads(const cvllm_engine_options *o, int n) {
    long total = o->num_threads ? o->num_threads : sysconf(_SC_NPROCESSORS_ONLN);
    if (total < n)
        cv_warn("engine_group", "data_parallel_size %d with %ld kernel thread%s: each replica runs on 1 thread", n,
                total, total == 1 ? "" : "s");
}

int cv_engine_group_start(const cvllm_engine_options *options, const cv_loop_options *loop_options,
                          cv_engine_group **out) {
    const int n = options->data_parallel_size > 1 ? options->data_parallel_size : 1;
    cv_engine_loop **loops = cv_xcalloc((size_t)n, sizeof *loops);
    for (int i = 0; i < n; i++) {
        /* Said once replica 0 exists: its creation is what checks the options. */
        if (i == 1) {
            cv_info("engine_group", "data parallelism: %d engine replicas in this process, each with 1/%d of the "
                    "memory budget and of the kernel threads", n, n);
            warn_threads(options, n);
        }
        if (i > 0) cv_info("engine_group", "data-parallel replica %d of %d", i, n);
        cvllm_engine_options o = *options;
        o.data_parallel_rank = i;
        if (i > 0) { /* replica 0 prepares every request: its LoRA table serves them all */
            o.lora_modules = NULL;
            o.n_lora_modules = 0;
        }
        cvllm_engine *e = NULL;
        int rc = cvllm_engine_create(&o, &e);
        cv_loop_options lo = *loop_options;
        lo.engine_index = i;
        if (!rc && (rc = cv_engine_loop_start(e, &lo, &loops[i]))) cvllm_engine_destroy(e);
        if (rc) {
            stop_loops(loops, i);
            free(loops);
            cv_runner_release_unstarted(options->tensor_parallel_size, n);
            return rc;
        }
    }
    cv_engine_group *g = cv_xcalloc(1, sizeof *g);
    g->n = n;
    g->loops = loops;
    if (n > 1) {
        const cvllm_engine *e = cv_engine_loop_engine(loops[0]);
        pthread_mutex_init(&g->mu, NULL);
        g->router = cv_router_new(n, e->kv_blocks - 1);
        g->loads = cv_xcalloc((size_t)n, sizeof *g->loads);
        g->block_size = e->opts.block_size;
        g->prefix_caching = e->opts.enable_prefix_caching; /* as the engine resolved it (hybrid models) */
    }
    *out = g;
    return 0;
}

void cv_engine_group_stop(cv_engine_group *g) {
    if (!g) return;
    stop_loops(g->loops, g->n);
    free(g->loops);
    if (g->n > 1) {
        cv_router_free(g->router);
        free(g->loads);
        pthread_mutex_destroy(&g->mu);
    }
    free(g);
}

bool cv_engine_group_drain(cv_engine_group *g, double seconds) {
    const double end = cv_now() + seconds;
    bool empty = true;
    for (int i = 0; i < g->n; i++) {
        double left = end - cv_now();
        empty = cv_engine_loop_drain(g->loops[i], left > 0 ? left : 0) && empty;
    }
    return empty;
}

int cv_engine_group_submit(cv_engine_group *g, const cv_submit *s, uint64_t *request_id) {
    if (g->n == 1) return cv_engine_loop_submit(g->loops[0], s, request_id);
    cv_request *req;
    int rc = cv_engine_loop_prepare(g->loops[0], s, &req);
    if (rc) return rc;
    /* The blocks a prefix-cache hit can cover: never the one holding the last prompt token, which is
     * always computed (scheduler.h). */
    const int32_t n = g->prefix_caching ? (int32_t)((req->n_prompt - 1) / (size_t)g->block_size) : 0;
    cv_block_hash *hashes = cv_xmalloc((n ? (size_t)n : 1) * sizeof *hashes);
    cv_block_hash_chain(req->prompt, g->block_size, req->cache_salt, cv_request_lora_id(req), 0, n, hashes);
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < g->n; i++)
        cv_engine_loop_load(g->loops[i], &g->loads[i].requests, &g->loads[i].kv_cache_usage);
    const int r = cv_router_route(g->router, hashes, n, g->loads);
    req->id = req->id * (uint64_t)g->n + (uint64_t)r;
    rc = cv_engine_loop_enqueue(g->loops[r], req, s, request_id);
    pthread_mutex_unlock(&g->mu);
    free(hashes);
    return rc;
}

void cv_engine_group_abort(cv_engine_group *g, uint64_t request_id) {
    cv_engine_loop_abort(g->loops[request_id % (uint64_t)g->n], request_id);
}

int cv_engine_group_size(const cv_engine_group *g) { return g->n; }

const cvllm_engine *cv_engine_group_engine(const cv_engine_group *g) { return cv_engine_loop_engine(g->loops[0]); }

int cv_engine_group_load_lora(cv_engine_group *g, const cvllm_lora_module *m, bool replace) {
    return cv_engine_loop_load_lora(g->loops[0], m, replace);
}

int cv_engine_group_unload_lora(cv_engine_group *g, const char *name) {
    return cv_engine_loop_unload_lora(g->loops[0], name);
}

void cv_engine_group_lora_slot_names(cv_engine_group *g, char **names) {
    cv_lora_registry *r = cv_engine_loop_engine(g->loops[0])->loras;
    if (r) cv_lora_registry_slot_names(r, names);
    else memset(names, 0, CV_MAX_LORA_MODULES * sizeof *names);
}

void cv_engine_group_stats(cv_engine_group *g, int replica, cv_engine_stats *out) {
    cv_engine_loop_stats(g->loops[replica], out);
}
