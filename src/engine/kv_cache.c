/*
 * kv_cache.c — sizing and allocating the paged KV cache from the memory budget.
 *
 * The budget is, in vLLM's order of precedence: --kv-cache-memory-bytes; VLLM_CPU_KVCACHE_SPACE (GiB,
 * vLLM's CPU knob); else gpu_memory_utilization × this machine's RAM minus the weights and the
 * logits buffer. Models with recurrent state take their state slots out of the same budget first:
 * one per running sequence, the speculative-decoding scratch, and, for prefix caching, checkpoints
 * worth up to a quarter of the budget. The budget becomes whole blocks. It is capped at what max_num_seqs requests of
 * max_model_len tokens could ever use, so a small model on a big machine does not reserve RAM it
 * cannot use. The memory is calloc'd: the kernel hands out zero pages lazily, so resident memory
 * grows with the tokens actually cached.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "engine/engine.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static size_t kv_bytes_per_token(const cv_kv_spec *spec) {
    return (size_t)spec->num_layers * 2 * (size_t)spec->num_kv_heads * (size_t)spec->head_dim * sizeof(float);
}

static double machine_ram_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (double)pages * (double)page : 0.0;
}

static int kv_budget_bytes(const cvllm_engine *e, double *budget) {
    const char *space = getenv("VLLM_CPU_KVCACHE_SPACE");
    if (e->opts.kv_cache_memory_bytes > 0) {
        *budget = (double)e->opts.kv_cache_memory_bytes;
    } else if (space && *space) {
        char *end;
        double gib = strtod(space, &end);
        if (*end || gib <= 0)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "VLLM_CPU_KVCACHE_SPACE must be a positive number of GiB, got '%s'", space);
        *budget = gib * GIB;
    } else {
        double util = e->opts.gpu_memory_utilization;
        double logits = (double)e->opts.max_num_seqs * e->vocab_size * sizeof(float);
        *budget = util * machine_ram_bytes() - (double)e->model->weight_bytes - logits;
        if (*budget <= 0)
            return cv_fail(CVLLM_ERR_NO_MEMORY,
                           "no memory left for the KV cache: gpu_memory_utilization %.2f of %.2f GiB RAM is "
                           "less than the weights (%.2f GiB); raise --gpu-memory-utilization or set "
                           "--kv-cache-memory-bytes",
                           util, machine_ram_bytes() / GIB, (double)e->model->weight_bytes / GIB);
    }
    return 0;
}

static int check_fits_one_request(const cvllm_engine *e, int64_t usable_blocks, size_t block_bytes) {
    int32_t bs = e->opts.block_size;
    int64_t need = ((int64_t)e->max_model_len + bs - 1) / bs;
    if (usable_blocks >= need) return 0;
    return cv_fail(CVLLM_ERR_CAPACITY,
                   "To serve at least one request with the model's max seq len (%d), (%.2f GiB KV cache is "
                   "needed, which is larger than the available KV cache memory (%.2f GiB). Based on the "
                   "available memory, the estimated maximum model length is %lld. Try increasing "
                   "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.",
                   e->max_model_len, (double)need * block_bytes / GIB, (double)usable_blocks * block_bytes / GIB,
                   (long long)(usable_blocks * bs));
}

/* Sizes and allocates the state pool from the budget; returns what is left for the KV cache. */
static int create_state_pool(cvllm_engine *e, double *budget) {
    size_t bytes = e->model->state_bytes_per_seq;
    if (bytes == 0) return 0;
    int32_t running = e->opts.max_num_seqs;
    int32_t spec = e->spec.method != CV_SPEC_NONE ? e->spec.num_speculative_tokens : 0;
    double fixed = (double)cv_state_pool_bytes(bytes, running, spec, 0);
    int32_t ckpt = 0;
    if (e->state_prefix_caching) {
        double per = (double)cv_state_pool_bytes(bytes, 0, 0, 1);
        double most = floor(0.25 * (*budget - fixed) / per);
        ckpt = most > 2.0 * running ? 2 * running : most > 0 ? (int32_t)most : 0;
        if (ckpt == 0) cv_warn("kv_cache", "no memory left for recurrent-state checkpoints: prefix caching will not hit");
    }
    double total = (double)cv_state_pool_bytes(bytes, running, spec, ckpt);
    if (total >= *budget)
        return cv_fail(CVLLM_ERR_NO_MEMORY,
                       "the recurrent state of %d sequences (%.2f GiB) does not fit in the KV cache budget (%.2f GiB); "
                       "lower --max-num-seqs or raise the budget",
                       running, total / GIB, *budget / GIB);
    int rc = cv_state_pool_init(&e->states, bytes, running, spec, ckpt);
    if (rc) return rc;
    *budget -= total;
    cv_info("kv_cache", "Recurrent state: %d running + %d speculative + %d checkpoint slots of %.2f MiB (%.2f GiB)",
            running, running * spec, ckpt, (double)bytes / (1 << 20), total / GIB);
    return 0;
}

int cv_kv_cache_create(cvllm_engine *e) {
    const cv_kv_spec *spec = &e->model->kv_spec;
    int32_t bs = e->opts.block_size;
    size_t block_bytes = kv_bytes_per_token(spec) * (size_t)bs;
    double budget = 0;
    int rc = kv_budget_bytes(e, &budget);
    if (!rc) rc = create_state_pool(e, &budget);
    if (rc) return rc;
    int64_t usable = block_bytes ? (int64_t)floor(budget / (double)block_bytes) : 0;
    rc = check_fits_one_request(e, usable, block_bytes);
    if (rc) return rc;
    int64_t most_useful = (int64_t)e->opts.max_num_seqs * ((e->max_model_len + bs - 1) / bs);
    if (usable > most_useful) usable = most_useful;
    if (usable > INT32_MAX - 1) usable = INT32_MAX - 1;

    e->kv.num_blocks = (int32_t)usable + 1; /* block 0 is reserved by the pool */
    e->kv.block_size = bs;
    e->kv.k = cv_xcalloc((size_t)spec->num_layers, sizeof(float *));
    e->kv.v = cv_xcalloc((size_t)spec->num_layers, sizeof(float *));
    size_t floats = (size_t)e->kv.num_blocks * (size_t)bs * (size_t)spec->num_kv_heads * (size_t)spec->head_dim;
    for (int32_t l = 0; l < spec->num_layers; l++) {
        e->kv.k[l] = calloc(floats, sizeof(float));
        e->kv.v[l] = calloc(floats, sizeof(float));
        if (!e->kv.k[l] || !e->kv.v[l])
            return cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate the KV cache (%.2f GiB)",
                           (double)floats * 2 * sizeof(float) * spec->num_layers / GIB);
    }
    cv_block_pool_init(&e->blocks, e->kv.num_blocks);
    int64_t tokens = usable * bs;
    cv_info("kv_cache", "Available KV cache memory: %.2f GiB", (double)usable * block_bytes / GIB);
    cv_info("kv_cache", "KV cache size: %lld tokens", (long long)tokens);
    cv_info("kv_cache", "Maximum concurrency for %d tokens per request: %.2fx", e->max_model_len,
            (double)tokens / e->max_model_len);
    return 0;
}

void cv_kv_cache_destroy(cvllm_engine *e) {
    if (e->kv.k) {
        for (int32_t l = 0; l < e->model->kv_spec.num_layers; l++) {
            free(e->kv.k[l]);
            free(e->kv.v[l]);
        }
    }
    free(e->kv.k);
    free(e->kv.v);
    e->kv.k = e->kv.v = NULL;
    if (e->blocks.blocks) cv_block_pool_free(&e->blocks);
}
