/*
 * kv_cache.c — the memory plan: does the model fit, how big are the KV cache and the state pool.
 *
 * The budget for the KV cache is, in vLLM's order of precedence: --kv-cache-memory-bytes;
 * VLLM_CPU_KVCACHE_SPACE (GiB, vLLM's CPU knob); else gpu_memory_utilization × this machine's RAM
 * minus the weights and the activations (forward scratch and logits). A data-parallel replica
 * (data_parallel_size N) plans with 1/N of whichever it is, as the ranks of a tensor-parallel job on
 * one machine share its RAM: each replica holds its own weights and KV cache. Models with recurrent
 * state take their state slots out of the same budget first: one per running sequence, the
 * speculative-decoding scratch, and, for prefix caching, checkpoints worth up to a quarter of what
 * one max_model_len request leaves over. What is left becomes whole blocks, capped at what max_num_seqs requests of max_model_len
 * tokens could ever use, so a small model on a big machine does not reserve RAM it cannot use.
 * A block's bytes are those of its dtype (--kv-cache-dtype, resolved by the engine): a bf16 cache
 * holds twice the tokens of an f32 one in the same budget.
 *
 * The plan is made twice from the same function. First from config.json alone (models/footprint.c),
 * before any weight is allocated, so that a model that cannot fit is refused at once with vLLM's
 * message and the numbers instead of after a minute of filling memory; then, once the model is
 * loaded, with its own KV and state sizes, to size what the runner allocates (executor/runner.h) and
 * the block and state-slot bookkeeping over it.
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "engine/engine.h"
#include "executor/comm.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

typedef struct memory_plan {
    double budget;                 /* bytes for the KV cache and the recurrent state */
    char source[160];              /* where the budget came from, for messages */
    int32_t state_running, state_spec, state_ckpt;
    double state_bytes;            /* the whole state pool */
    size_t block_bytes;
    int64_t kv_blocks;             /* usable blocks (the pool's reserved block 0 comes on top) */
    int64_t computed_blocks;       /* with num_gpu_blocks_override: what the budget gave */
} memory_plan;

static double machine_ram_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (double)pages * (double)page : 0.0;
}

/* The engines that share this machine's memory: a tensor-parallel job's model shards on it (with
 * data parallelism, rank 0 holds one of every replica), or the replicas of data parallelism. */
static int sharers(const cvllm_engine *e) {
    const cvllm_engine_options *o = &e->opts;
    if (o->tensor_parallel_size > 1) return cv_comm_local_shards(o->tensor_parallel_size, o->data_parallel_size);
    return o->data_parallel_size > 1 ? o->data_parallel_size : 1;
}

/* The explicit budgets, when one is set: *set = false leaves gpu_memory_utilization to decide. A
 * data-parallel replica takes its share of them. */
static int explicit_budget(const cvllm_engine *e, memory_plan *plan, bool *set) {
    const char *space = getenv("VLLM_CPU_KVCACHE_SPACE");
    const int replicas = e->opts.data_parallel_size > 1 ? e->opts.data_parallel_size : 1;
    *set = true;
    if (e->opts.kv_cache_memory_bytes > 0) {
        plan->budget = (double)e->opts.kv_cache_memory_bytes / replicas;
        snprintf(plan->source, sizeof plan->source, "kv_cache_memory_bytes=%llu",
                 (unsigned long long)e->opts.kv_cache_memory_bytes);
    } else if (space && *space) {
        char *end;
        double gib = strtod(space, &end);
        if (*end || !(gib > 0))
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "VLLM_CPU_KVCACHE_SPACE must be a positive number of GiB, got '%s'", space);
        plan->budget = gib * GIB / replicas;
        snprintf(plan->source, sizeof plan->source, "VLLM_CPU_KVCACHE_SPACE=%s", space);
    } else {
        *set = false;
    }
    if (*set && replicas > 1) {
        size_t len = strlen(plan->source);
        snprintf(plan->source + len, sizeof plan->source - len, " / %d data-parallel replicas", replicas);
    }
    return 0;
}

/* The advice for a model whose weights and activations (`fixed`) leave too little of the RAM: only
 * what could work on this machine. `least` is the state and KV of one request of one block, `full`
 * of one request of max_model_len. */
static const char *ram_advice(double fixed, double least, double full, double ram, bool utilization) {
    if (fixed + full <= ram && utilization) return "Try increasing `gpu_memory_utilization` when initializing the engine.";
    if (fixed + least <= ram)
        return utilization ? "Try increasing `gpu_memory_utilization` and decreasing `max_model_len` when "
                             "initializing the engine."
                           : "Try decreasing `max_model_len` when initializing the engine.";
    return "It does not fit in this machine's RAM.";
}

static int make_plan(const cvllm_engine *e, const cv_footprint *fp, bool state_prefix_caching, memory_plan *plan) {
    *plan = (memory_plan){0};
    const int32_t bs = e->opts.block_size, running = e->opts.max_num_seqs;
    const int32_t spec = e->spec.method != CV_SPEC_NONE ? e->spec.num_speculative_tokens : 0;
    const double ram = machine_ram_bytes() / sharers(e);
    const double gib_ram = ram / GIB;
    char share[48] = ""; /* for messages: whose RAM `ram` is */
    if (sharers(e) > 1) snprintf(share, sizeof share, " (this engine's 1/%d share)", sharers(e));
    const double weights = (double)fp->weight_bytes, activations = (double)fp->activation_bytes;
    const double fixed = weights + activations;
    plan->block_bytes = fp->kv_bytes_per_token * (size_t)bs;
    const int64_t need_blocks = ((int64_t)e->max_model_len + bs - 1) / bs;
    const double need_kv = (double)need_blocks * (double)plan->block_bytes;
    const double state_fixed =
        fp->state_bytes_per_seq ? (double)cv_state_pool_bytes(fp->state_bytes_per_seq, running, spec, 0) : 0;
    bool is_explicit;
    int rc = explicit_budget(e, plan, &is_explicit);
    if (rc) return rc;
    const double least = state_fixed + (double)plan->block_bytes, full = state_fixed + need_kv;
    if (!is_explicit) {
        const double util = e->opts.gpu_memory_utilization;
        plan->budget = util * ram - fixed;
        snprintf(plan->source, sizeof plan->source,
                 "gpu_memory_utilization %.2f × %.2f GiB RAM%s, less %.2f GiB of weights and %.2f GiB of activations",
                 util, gib_ram, share, weights / GIB, activations / GIB);
        if (plan->budget <= 0)
            return cv_fail(CVLLM_ERR_NO_MEMORY,
                           "No available memory for the cache blocks: %s takes %.2f GiB of weights and %.2f GiB of "
                           "activations, more than gpu_memory_utilization %.2f × %.2f GiB RAM%s = %.2f GiB. %s",
                           e->opts.model, weights / GIB, activations / GIB, util, gib_ram, share, util * gib_ram,
                           ram_advice(fixed, least, full, ram, true));
    }
    if (state_fixed >= plan->budget && state_fixed > 0)
        return cv_fail(CVLLM_ERR_NO_MEMORY,
                       "the recurrent state of %d sequences (%.2f GiB) does not fit in the KV cache budget (%.2f GiB: "
                       "%s); lower --max-num-seqs or raise the budget",
                       running, state_fixed / GIB, plan->budget / GIB, plan->source);
    const double available = plan->budget - state_fixed;
    const int64_t available_blocks = plan->block_bytes ? (int64_t)floor(available / (double)plan->block_bytes) : 0;
    if (available_blocks < need_blocks)
        return cv_fail(CVLLM_ERR_CAPACITY,
                       "To serve at least one request with the models's max seq len (%d), (%.2f GiB KV cache is "
                       "needed, which is larger than the available KV cache memory (%.2f GiB). Based on the "
                       "available memory, the estimated maximum model length is %lld. Try %s or decreasing "
                       "`max_model_len` when initializing the engine. (Budget: %s.)",
                       e->max_model_len, need_kv / GIB, available / GIB, (long long)(available_blocks * bs),
                       is_explicit ? "raising the KV cache budget" : "increasing `gpu_memory_utilization`",
                       plan->source);
    /* The KV budget is the user's; the weights must still fit in RAM next to one request. */
    if (is_explicit && fixed + full > ram)
        return cv_fail(CVLLM_ERR_NO_MEMORY,
                       "%s needs %.2f GiB of weights and %.2f GiB of activations, plus %.2f GiB of KV cache and "
                       "state for one request of max_model_len %d: more than the %.2f GiB of RAM%s. %s",
                       e->opts.model, weights / GIB, activations / GIB, full / GIB, e->max_model_len, gib_ram,
                       *share ? share : " this machine has", ram_advice(fixed, least, full, ram, false));
    if (fp->state_bytes_per_seq) {
        /* Prefix checkpoints take up to a quarter of what one max-length request leaves over. */
        if (state_prefix_caching) {
            double per = (double)cv_state_pool_bytes(fp->state_bytes_per_seq, 0, 0, 1);
            double most = floor(0.25 * (available - need_kv) / per);
            plan->state_ckpt = most > 2.0 * running ? 2 * running : most > 0 ? (int32_t)most : 0;
        }
        plan->state_running = running;
        plan->state_spec = spec;
        plan->state_bytes = (double)cv_state_pool_bytes(fp->state_bytes_per_seq, running, spec, plan->state_ckpt);
    }
    plan->kv_blocks = plan->block_bytes ? (int64_t)floor((plan->budget - plan->state_bytes) / (double)plan->block_bytes) : 0;
    int64_t most_useful = (int64_t)running * need_blocks;
    if (plan->kv_blocks > most_useful) plan->kv_blocks = most_useful;
    if (plan->kv_blocks > INT32_MAX - 1) plan->kv_blocks = INT32_MAX - 1;
    const int32_t override = e->opts.num_gpu_blocks_override;
    if (override) {
        /* the scheduler assumes one request of max_model_len fits, as the budget check above ensures */
        if (override < need_blocks)
            return cv_fail(CVLLM_ERR_CAPACITY, "num_gpu_blocks_override %d holds %lld tokens, fewer than one request "
                           "of max_model_len %d needs (%lld blocks of %d)", override, (long long)override * bs,
                           e->max_model_len, (long long)need_blocks, bs);
        plan->computed_blocks = plan->kv_blocks;
        plan->kv_blocks = override;
    }
    return 0;
}

int cv_kv_cache_check_fit(const cvllm_engine *e, const cv_footprint *estimate) {
    memory_plan plan;
    return make_plan(e, estimate, e->opts.enable_prefix_caching, &plan);
}

int cv_kv_cache_create(cvllm_engine *e, const cv_footprint *estimate) {
    const cv_kv_spec *spec = &e->model->kv_spec;
    assert(e->kv_dtype == CV_DTYPE_F32 || e->kv_dtype == CV_DTYPE_BF16);
    cv_footprint fp = *estimate;
    fp.kv_bytes_per_token = (size_t)spec->num_layers * 2 * (size_t)spec->num_kv_heads * (size_t)spec->head_dim *
                            cv_dtype_size(e->kv_dtype);
    fp.state_bytes_per_seq = e->model->state_bytes_per_seq;
    memory_plan plan;
    int rc = make_plan(e, &fp, e->state_prefix_caching, &plan);
    if (rc) return rc;
    if (fp.state_bytes_per_seq) {
        if (e->state_prefix_caching && plan.state_ckpt == 0)
            cv_warn("kv_cache", "no memory left for recurrent-state checkpoints: prefix caching will not hit");
        cv_state_pool_init(&e->states, plan.state_running, plan.state_spec, plan.state_ckpt);
    }
    const int32_t bs = e->opts.block_size;
    if (e->opts.num_gpu_blocks_override)
        cv_info("kv_cache", "Overriding num_gpu_blocks=%lld with num_gpu_blocks_override=%d",
                (long long)plan.computed_blocks, e->opts.num_gpu_blocks_override);
    e->kv_blocks = (int32_t)plan.kv_blocks + 1; /* block 0 is reserved by the pool */
    if ((rc = cv_runner_alloc_cache(e->runner, e->kv_blocks, bs, e->kv_dtype, e->states.num_slots))) return rc;
    if (fp.state_bytes_per_seq)
        cv_info("kv_cache", "Recurrent state: %d running + %d speculative + %d checkpoint slots of %.2f MiB (%.2f GiB)",
                plan.state_running, plan.state_running * plan.state_spec, plan.state_ckpt,
                (double)fp.state_bytes_per_seq / (1 << 20), plan.state_bytes / GIB);
    cv_block_pool_init(&e->blocks, e->kv_blocks);
    int64_t tokens = plan.kv_blocks * bs;
    cv_info("kv_cache", "KV cache dtype: %s", e->kv_dtype == CV_DTYPE_BF16 ? "bfloat16" : "float32");
    cv_info("kv_cache", "Available KV cache memory: %.2f GiB", (double)plan.kv_blocks * (double)plan.block_bytes / GIB);
    cv_info("kv_cache", "KV cache size: %lld tokens", (long long)tokens);
    cv_info("kv_cache", "Maximum concurrency for %d tokens per request: %.2fx", e->max_model_len,
            (double)tokens / e->max_model_len);
    return 0;
}
