/*
 * engine.c — the public engine API: create, add requests, step, abort, destroy.
 *
 * A step is three phases, in the order nano-vllm made famous:
 *   1. schedule: the scheduler picks sequences and token counts under the budget;
 *   2. run: the scheduled tokens are flattened into one cv_batch (positions, KV slots, block tables)
 *      and the runner (executor/runner.h) computes logits only for the rows that need them (the last
 *      token of a sequence that is ready to sample, and every prompt row when prompt_logprobs is
 *      asked for);
 *   3. post-process: sample and record logprobs here; detokenizing, stop conditions and publishing
 *      the changed requests' outputs are output.c's.
 * Finished requests stay alive until the start of the next step so their outputs remain readable.
 */
#include <assert.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/utf8.h"
#include "engine/engine.h"
#include "engine/output.h"
#include "sample/grammar_proc.h"
#include "loader/quant.h"
#include "loader/resolve.h"

#define DEFAULT_MAX_NUM_SEQS 256
#define DEFAULT_MAX_NUM_BATCHED_TOKENS 4096
#define DEFAULT_BLOCK_SIZE 16
#define DEFAULT_MAX_LOGPROBS 20
#define MAX_BAD_WORDS 128 /* vLLM's VLLM_MAX_NUM_BAD_WORDS: token sequences a request's bad_words give */

void cvllm_engine_options_default(cvllm_engine_options *o) {
    memset(o, 0, sizeof *o);
    o->max_num_seqs = DEFAULT_MAX_NUM_SEQS;
    o->max_num_batched_tokens = DEFAULT_MAX_NUM_BATCHED_TOKENS;
    o->block_size = DEFAULT_BLOCK_SIZE;
    o->gpu_memory_utilization = 0.9;
    o->max_logprobs = DEFAULT_MAX_LOGPROBS;
    o->enable_prefix_caching = true;
}

/* ------------------------------------------------------------------------------------------------ */
/* Creation                                                                                          */

static int check_lora_options(const cvllm_engine_options *o) {
    if (o->n_lora_modules < 0 || (o->n_lora_modules && !o->lora_modules))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "n_lora_modules must be >= 0 and lora_modules given with it");
    if (o->n_lora_modules && !o->enable_lora)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "LoRA modules need LoRA enabled (--enable-lora)");
    if (o->max_loras < 0) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "max_loras must be >= 1, got %d", o->max_loras);
    if (o->max_lora_rank && cv_lora_check_max_rank(o->max_lora_rank)) return CVLLM_ERR_INVALID_ARGUMENT;
    if (o->n_lora_modules > CV_MAX_LORA_MODULES)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "%d LoRA modules: one engine serves at most %d", o->n_lora_modules,
                       CV_MAX_LORA_MODULES);
    if (o->enable_lora && o->tensor_parallel_size > 1)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "LoRA adapters with tensor_parallel_size %d are not supported; serve "
                       "them on one rank", o->tensor_parallel_size);
    for (int32_t i = 0; i < o->n_lora_modules; i++) {
        const cvllm_lora_module *m = &o->lora_modules[i];
        if (!m->name || !*m->name || !m->path || !*m->path)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "LoRA module %d needs a name and a path", i);
        for (int32_t j = 0; j < i; j++)
            if (!strcmp(o->lora_modules[j].name, m->name))
                return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "LoRA module name %s is given twice", m->name);
    }
    return 0;
}

static int check_options(const cvllm_engine_options *o) {
    if (!o->model || !*o->model) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "no model given");
    if (o->max_model_len < 0) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "max_model_len must be positive, got %d", o->max_model_len);
    if (o->max_num_seqs < 0) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "max_num_seqs must be positive, got %d", o->max_num_seqs);
    if (o->max_num_batched_tokens < 0)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "max_num_batched_tokens must be positive, got %d", o->max_num_batched_tokens);
    if (o->block_size < 0 || (o->block_size & (o->block_size - 1)))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "block_size must be a power of two, got %d", o->block_size);
    if (o->gpu_memory_utilization < 0 || o->gpu_memory_utilization > 1)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "gpu_memory_utilization must be in (0, 1], got %g", o->gpu_memory_utilization);
    if (o->num_threads < 0) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "num_threads must be >= 0, got %d", o->num_threads);
    if (o->tensor_parallel_size < 0)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "tensor_parallel_size must be >= 1, got %d", o->tensor_parallel_size);
    if (o->data_parallel_size < 0)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "data_parallel_size must be >= 1, got %d", o->data_parallel_size);
    if (o->data_parallel_rank < 0 || o->data_parallel_rank >= (o->data_parallel_size > 1 ? o->data_parallel_size : 1))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "data_parallel_rank must be in [0, data_parallel_size), got %d",
                       o->data_parallel_rank);
    if (o->max_logprobs < 0) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "max_logprobs must be >= 0, got %d", o->max_logprobs);
    const char *mode = o->logprobs_mode;
    if (mode && strcmp(mode, "raw_logprobs") && strcmp(mode, "raw_logits") && strcmp(mode, "processed_logprobs") &&
        strcmp(mode, "processed_logits"))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "invalid logprobs_mode '%s'; choose from raw_logprobs, raw_logits, "
                       "processed_logprobs, processed_logits", mode);
    const char *runner = o->runner;
    if (runner && strcmp(runner, "auto") && strcmp(runner, "generate") && strcmp(runner, "pooling"))
        return !strcmp(runner, "draft")
                   ? cv_fail(CVLLM_ERR_UNSUPPORTED, "runner draft is not supported: cvllm runs a draft model's "
                             "speculation through speculative_config")
                   : cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "invalid runner '%s'; choose from auto, draft, generate, pooling",
                             runner);
    const char *convert = o->convert;
    if (convert && strcmp(convert, "auto") && strcmp(convert, "none") && strcmp(convert, "embed") &&
        strcmp(convert, "classify"))
        return !strcmp(convert, "reward") || !strcmp(convert, "mm_encoder_only")
                   ? cv_fail(CVLLM_ERR_UNSUPPORTED, "convert %s is not supported: cvllm's pooling runner embeds or "
                             "classifies", convert)
                   : cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "invalid convert '%s'; choose from auto, classify, embed, "
                             "mm_encoder_only, none, reward", convert);
    const char *cache_mode = o->mamba_cache_mode;
    if (cache_mode && strcmp(cache_mode, "all") && strcmp(cache_mode, "align") && strcmp(cache_mode, "none"))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "invalid mamba_cache_mode '%s'; choose from align, all, none",
                       cache_mode);
    if (o->num_gpu_blocks_override < 0 || o->num_gpu_blocks_override == INT32_MAX)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "num_gpu_blocks_override must be in [1, %d], got %d", INT32_MAX - 1,
                       o->num_gpu_blocks_override);
    if (o->mamba_block_size < 0)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "mamba_block_size must be positive, got %d", o->mamba_block_size);
    const char *policy = o->scheduling_policy;
    if (policy && strcmp(policy, "fcfs") && strcmp(policy, "priority"))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "invalid scheduling_policy '%s'; choose from fcfs, priority", policy);
    return check_lora_options(o);
}

static void apply_option_defaults(cvllm_engine_options *o) {
    cvllm_engine_options d;
    cvllm_engine_options_default(&d);
    if (!o->max_num_seqs) o->max_num_seqs = d.max_num_seqs;
    if (!o->max_num_batched_tokens) o->max_num_batched_tokens = d.max_num_batched_tokens;
    if (!o->block_size) o->block_size = d.block_size;
    if (o->gpu_memory_utilization == 0) o->gpu_memory_utilization = d.gpu_memory_utilization;
    if (!o->max_logprobs) o->max_logprobs = d.max_logprobs;
    if (!o->max_loras) o->max_loras = 1;
    if (!o->max_lora_rank) o->max_lora_rank = CV_LORA_DEFAULT_MAX_RANK;
}

/* Reads the adapters of lora_modules, which the caller's options hold only while create runs: before
 * the model, so that a bad adapter is said before minutes of loading. */
static int read_lora_modules(cvllm_engine *e) {
    const cvllm_engine_options *o = &e->opts;
    if (!o->n_lora_modules) return 0;
    e->lora_modules = cv_xcalloc((size_t)o->n_lora_modules, sizeof *e->lora_modules);
    for (; e->n_lora_modules < o->n_lora_modules; e->n_lora_modules++) {
        const cvllm_lora_module *m = &o->lora_modules[e->n_lora_modules];
        int rc = cv_lora_adapter_load(m->name, m->path, o->max_lora_rank, &e->lora_modules[e->n_lora_modules]);
        if (rc) return rc;
    }
    e->opts.lora_modules = NULL;
    return 0;
}

/* Binds an adapter to the model and lists it (taking it over, also on failure). */
static int serve_lora(cvllm_engine *e, cv_lora_adapter *a, bool replace) {
    cv_lora_binding *b = NULL;
    int rc = cv_runner_lora_bind(e->runner, a, &b);
    if (rc) {
        cv_lora_adapter_free(a);
        return rc;
    }
    const int32_t rank = a->rank;
    const size_t n_modules = a->n_modules;
    char *name = cv_xstrdup(a->name), *path = cv_xstrdup(a->path);
    if (!(rc = cv_lora_registry_add(e->loras, a, b, replace)))
        cv_info("engine", "LoRA adapter %s: %s, rank %d, %zu modules (max_loras %d)", name, path, rank, n_modules,
                e->opts.max_loras);
    free(name);
    free(path);
    return rc;
}

/* With LoRA on, the table of served adapters, with lora_modules in it. */
static int serve_lora_modules(cvllm_engine *e) {
    if (!e->opts.enable_lora) return 0;
    e->loras = cv_lora_registry_new();
    int rc = 0;
    for (int32_t i = 0; i < e->n_lora_modules; i++) {
        cv_lora_adapter *a = e->lora_modules[i];
        e->lora_modules[i] = NULL;
        if (!rc) rc = serve_lora(e, a, false);
        else cv_lora_adapter_free(a);
    }
    return rc;
}

static bool is_dummy_format(const char *load_format, int *rc) {
    *rc = 0;
    if (!load_format || !strcmp(load_format, "auto") || !strcmp(load_format, "safetensors")) return false;
    if (!strcmp(load_format, "dummy")) return true;
    *rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "invalid load format '%s'; choose from auto, safetensors, dummy", load_format);
    return false;
}

/* model_loader_extra_config as vLLM's loaders take it: DefaultModelLoader's keys for safetensors,
 * none at all for dummy (DummyModelLoader). The keys change nothing here. */
static int check_loader_extra_config(const cvllm_engine_options *o, bool dummy) {
    static const char *const default_keys[] = {"enable_multithread_load", "num_threads", "enable_weights_track"};
    if (!o->model_loader_extra_config) return 0;
    const char *format = o->load_format ? o->load_format : "auto";
    json_t *extra = json_loads(o->model_loader_extra_config, 0, NULL);
    int rc = 0;
    if (!json_is_object(extra))
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "model_loader_extra_config must be a JSON object: %s",
                     o->model_loader_extra_config);
    else if (dummy && json_object_size(extra))
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Model loader extra config is not supported for load format %s", format);
    else {
        char unexpected[512] = "";
        size_t used = 0;
        const char *key;
        json_t *value;
        json_object_foreach(extra, key, value) {
            bool known = false;
            for (size_t i = 0; i < CV_ARRAY_LEN(default_keys); i++) known = known || !strcmp(key, default_keys[i]);
            if (!known && used < sizeof unexpected)
                used += (size_t)snprintf(unexpected + used, sizeof unexpected - used, "%s'%s'", used ? ", " : "", key);
        }
        if (used)
            rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Unexpected extra config keys for load format %s: {%s}", format,
                         unexpected);
    }
    json_decref(extra);
    return rc;
}

static int weight_dtype(const char *dtype, cv_dtype config_dtype, cv_dtype *out) {
    if (!dtype || !strcmp(dtype, "auto")) *out = config_dtype;
    else if (!strcmp(dtype, "bfloat16")) *out = CV_DTYPE_BF16;
    else if (!strcmp(dtype, "float16") || !strcmp(dtype, "half")) *out = CV_DTYPE_F16;
    else if (!strcmp(dtype, "float32") || !strcmp(dtype, "float")) *out = CV_DTYPE_F32;
    else
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "invalid dtype '%s'; choose from auto, bfloat16, float16, float32", dtype);
    return 0;
}

/* The compute dtype (--dtype): the checkpoint's for auto; bf16 for float16, since the CPU kernels
 * have no f16 arithmetic (the nearest 16-bit mode, with f32's range); and the KV cache's
 * (--kv-cache-dtype), the compute dtype's for auto. Quantized checkpoints say their float dtype in
 * torch_dtype too: their float layers follow it, their int8 ones are int8 × int8 in every mode. */
static int resolve_dtypes(cvllm_engine *e) {
    cv_dtype t;
    int rc = weight_dtype(e->opts.dtype, e->config.torch_dtype, &t);
    if (rc) return rc;
    e->compute_dtype = t == CV_DTYPE_F32 ? CV_DTYPE_F32 : CV_DTYPE_BF16;
    if (t == CV_DTYPE_F16) cv_info("engine", "float16 compute runs as bfloat16 on the CPU kernels");
    const char *kv = e->opts.kv_cache_dtype;
    if (!kv || !strcmp(kv, "auto")) e->kv_dtype = e->compute_dtype;
    else if (!strcmp(kv, "bfloat16")) e->kv_dtype = CV_DTYPE_BF16;
    else if (!strcmp(kv, "float32") || !strcmp(kv, "float")) e->kv_dtype = CV_DTYPE_F32;
    else if (!strncmp(kv, "fp8", 3))
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "kv_cache_dtype '%s' is not supported on the CPU backend; choose from "
                                              "auto, bfloat16, float32", kv);
    else
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "invalid kv_cache_dtype '%s'; choose from auto, bfloat16, float32", kv);
    return 0;
}

/* vLLM's get_diff_sampling_param: the sampling fields of --override-generation-config go over the
 * file's (or, with "vllm", over none); its eos ids are not read. */
static int apply_generation_override(cvllm_engine *e) {
    const char *json = e->opts.override_generation_config;
    if (!json) return 0;
    cv_generation_config o;
    int rc = cv_generation_config_parse(json, strlen(json), "--override-generation-config", &o);
    if (rc) return rc;
    cv_generation_config *g = &e->gen;
#define OVERRIDE(field)                                                                                      \
    if (o.has_##field) g->has_##field = true, g->field = o.field;
    OVERRIDE(temperature) OVERRIDE(top_p) OVERRIDE(top_k) OVERRIDE(min_p) OVERRIDE(repetition_penalty)
    OVERRIDE(max_new_tokens)
#undef OVERRIDE
    if (o.has_temperature || o.has_top_p || o.has_top_k || o.has_min_p || o.has_repetition_penalty ||
        o.has_max_new_tokens)
        e->use_generation_defaults = true;
    return 0;
}

static int load_generation_config(cvllm_engine *e) {
    const char *which = e->opts.generation_config;
    memset(&e->gen, 0, sizeof e->gen);
    int rc = 0;
    if (!which || strcmp(which, "vllm") != 0) {
        e->use_generation_defaults = true;
        rc = cv_generation_config_load(!which || !strcmp(which, "auto") ? e->model_dir : which, &e->gen);
    }
    return rc ? rc : apply_generation_override(e);
}

/* hf_overrides with rope_scaling and rope_theta over it, as vLLM folds its --rope-* flags into
 * --hf-overrides (JSON object text, or NULL when there is nothing to lay over config.json). */
static int config_overrides(const cvllm_engine_options *o, char **out) {
    *out = NULL;
    if (!o->hf_overrides && !o->rope_scaling && !o->rope_theta) return 0;
    json_error_t err;
    json_t *over = o->hf_overrides ? json_loads(o->hf_overrides, 0, &err) : json_object();
    json_t *scaling = o->rope_scaling ? json_loads(o->rope_scaling, 0, &err) : NULL;
    int rc = 0;
    if (!json_is_object(over))
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "hf_overrides must be a JSON object: %s", o->hf_overrides);
    else if (o->rope_scaling && !json_is_object(scaling))
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "rope_scaling must be a JSON object: %s", o->rope_scaling);
    else if (o->rope_theta < 0 || !isfinite(o->rope_theta))
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "rope_theta must be positive, got %g", o->rope_theta);
    if (!rc && scaling) json_object_set(over, "rope_scaling", scaling);
    if (!rc && o->rope_theta > 0) json_object_set_new(over, "rope_theta", json_real(o->rope_theta));
    if (!rc) *out = json_dumps(over, JSON_COMPACT);
    json_decref(over);
    json_decref(scaling);
    return rc;
}

/* vLLM's derived max_model_len (_get_and_verify_max_len): max_position_embeddings, stretched by the
 * RoPE scaling factor (YaRN: from its original_max_position_embeddings). */
static int32_t derived_max_model_len(const cv_model_config *c) {
    const cv_rope_config *r = &c->rope;
    double len = (r->type == CV_ROPE_YARN ? r->original_max_position : c->max_position_embeddings) * r->factor;
    return len > INT32_MAX ? INT32_MAX : (int32_t)len;
}

/* A longer max_model_len than the config allows is vLLM's error, or with VLLM_ALLOW_LONG_MAX_MODEL_LEN
 * its warning, word for word; a config's own model_max_length may allow it. */
static int resolve_max_model_len(cvllm_engine *e) {
    const int32_t derived = derived_max_model_len(&e->config), asked = e->opts.max_model_len;
    e->max_model_len = asked ? asked : derived;
    json_t *mml = json_object_get(e->config.text, "model_max_length");
    if (asked > derived && !(json_is_integer(mml) && asked <= json_integer_value(mml))) {
        char limit[32] = "None";
        if (json_is_integer(mml)) snprintf(limit, sizeof limit, "%lld", (long long)json_integer_value(mml));
        char msg[256];
        snprintf(msg, sizeof msg,
                 "User-specified max_model_len (%d) is greater than the derived max_model_len "
                 "(max_position_embeddings=%d or model_max_length=%s in model's config.json).",
                 asked, derived, limit);
        static const char warning[] =
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative position "
            "encoding (RoPE), positions exceeding derived_max_model_len lead to nan. If the model uses absolute "
            "position encoding, positions exceeding derived_max_model_len will cause a CUDA array out-of-bounds "
            "error.";
        if (!cv_vllm_env_true("VLLM_ALLOW_LONG_MAX_MODEL_LEN"))
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                           "%s To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. %s",
                           msg, warning);
        cv_warn("engine", "%s %s", msg, warning);
    }
    if (e->max_model_len <= 1) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "max_model_len must be at least 2");
    return 0;
}

/* The weights: the checkpoint's views, or dummy weights in its format. The folder and
 * --quantization decide the quantization here (loader/quant.h: an msModelSlim description, an FP8
 * quantization_config, the refusals of what cvllm does not run), before the memory check counts
 * the weights' bytes in their format. */
static int open_weights(cvllm_engine *e, bool dummy) {
    cv_weight_source_params p = {.dir = e->model_dir, .quantization = e->opts.quantization, .dummy = dummy,
                                 .seed = e->opts.seed};
    int rc = weight_dtype(e->opts.dtype, e->config.torch_dtype, &p.dtype);
    return rc ? rc : cv_weight_source_create(&p, &e->weights);
}

/* The footprint from config.json, and the refusal of a model that cannot fit, before anything big
 * is allocated. The float weights' dtype is --dtype's for dummy weights, the config's for a
 * checkpoint; quantized linears count in their scheme. */
static int check_memory_fit(cvllm_engine *e, bool dummy, cv_footprint *fp, bool *known) {
    cv_footprint_params p = {.weight_dtype = e->config.torch_dtype,
                             .kv_dtype = e->kv_dtype,
                             .quant = cv_weight_source_quant(e->weights),
                             .with_mtp = e->spec.method == CV_SPEC_MTP,
                             .max_num_batched_tokens = e->opts.max_num_batched_tokens,
                             .max_num_seqs = e->opts.max_num_seqs};
    int rc = dummy ? weight_dtype(e->opts.dtype, e->config.torch_dtype, &p.weight_dtype) : 0;
    if (rc) return rc;
    /* A config whose dimensions the footprint cannot read is named by its model loader, later. */
    *known = cv_model_footprint(&e->config, &p, fp);
    const int tp = e->opts.tensor_parallel_size;
    if (*known && tp > 1) { /* this rank's shard: the embedding whole, the rest split; its KV and GDN heads */
        const cv_model_config *c = &e->config;
        const uint64_t embed = (uint64_t)c->vocab_size * (uint64_t)c->hidden_size * cv_dtype_size(p.weight_dtype);
        if (fp->weight_bytes > embed) fp->weight_bytes = (fp->weight_bytes - embed) / (uint64_t)tp + embed;
        const int32_t kv = c->num_key_value_heads > 0 ? c->num_key_value_heads : 1;
        fp->kv_bytes_per_token /= (uint64_t)(kv % tp ? kv : tp);
        fp->state_bytes_per_seq /= (uint64_t)tp;
    }
    return *known ? cv_kv_cache_check_fit(e, fp) : 0;
}

/* Where the tokenizer comes from, and that its file is there: a check, so that under tensor
 * parallelism the launcher refuses a model without one once, rather than every rank at load. */
static int find_tokenizer(cvllm_engine *e) {
    if (!e->opts.tokenizer) e->tokenizer_dir = cv_xstrdup(e->model_dir);
    else {
        const cv_hub_options access = {.revision = e->opts.tokenizer_revision ? e->opts.tokenizer_revision
                                                                               : e->opts.revision,
                                       .cache_dir = e->opts.download_dir, .token = e->opts.hf_token};
        const int rc = cv_resolve_model(e->opts.tokenizer, &access, false, &e->tokenizer_dir);
        if (rc) return rc;
    }
    return cv_tokenizer_check(e->tokenizer_dir);
}

/* The kernel threads of one data-parallel replica: its share of num_threads, or of the machine's CPUs,
 * and at least one. Alone (or under tensor parallelism, whose runner shares the cores out itself)
 * num_threads as given. */
/* vLLM's --runner: auto pools for a sentence-transformers folder (its modules.json has a Pooling
 * module), which is how Qwen3-Embedding ships under its *ForCausalLM architecture, for a classifier's
 * architecture, and when --convert asks for a pooling task. */
static int resolve_runner(cvllm_engine *e) {
    const char *runner = e->opts.runner, *arch = e->config.architecture, *convert = e->opts.convert;
    const bool is_auto = !runner || !strcmp(runner, "auto");
    const bool converts = convert && (!strcmp(convert, "embed") || !strcmp(convert, "classify"));
    const bool classifier = converts ? !strcmp(convert, "classify") : cv_pooler_config_classifies(&e->config);
    if ((classifier || converts) && !is_auto && strcmp(runner, "pooling"))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, classifier ? "%s is a classification model: it runs on the pooling "
                       "runner, not runner %s" : "%s converted to embed runs on the pooling runner, not runner %s",
                       arch, runner);
    e->pooling = is_auto ? classifier || converts || cv_pooler_folder_pools(e->model_dir) : !strcmp(runner, "pooling");
    if (is_auto) cv_info("engine", "Resolved `--runner auto` to `--runner %s`", e->pooling ? "pooling" : "generate");
    if (!e->pooling) {
        if (e->opts.pooler_config)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "pooler_config needs the pooling runner (runner pooling)");
        return 0;
    }
    if (e->spec.method != CV_SPEC_NONE)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "speculative decoding does not apply to the pooling runner: it generates "
                                              "no tokens");
    int rc = cv_pooler_init(&e->pooler, e->model_dir, e->opts.pooler_config, &e->config, classifier);
    if (rc) return rc;
    const char *token_task = e->pooler.tokenwise ? cv_pooler_task_name(&e->pooler) : NULL;
    if (e->pooler.task == CV_TASK_CLASSIFY)
        cv_info("engine", "pooling runner (--convert classify): %d label%s from %s, %s pooling%s%s", e->pooler.num_labels,
                e->pooler.num_labels == 1 ? "" : "s", e->pooler.method ? e->pooler.method : "score.weight",
                cv_pooling_type_name(e->pooler.type), token_task ? ", task " : "", token_task ? token_task : "");
    else
        cv_info("engine", "pooling runner (--convert embed): %s pooling, %s%s%s", cv_pooling_type_name(e->pooler.type),
                e->pooler.normalize ? "normalized" : "not normalized", token_task ? ", task " : "",
                token_task ? token_task : "");
    /* CLS and MEAN read prompt positions a prefix-cache hit would skip. */
    if (e->pooler.type != CV_POOL_LAST && e->opts.enable_prefix_caching) {
        cv_info("engine", "prefix caching disabled: %s pooling reads every prompt token", cv_pooling_type_name(e->pooler.type));
        e->opts.enable_prefix_caching = false;
    }
    return 0;
}

static int replica_threads(const cvllm_engine_options *o) {
    if (o->data_parallel_size <= 1 || o->tensor_parallel_size > 1) return o->num_threads;
    long total = o->num_threads ? o->num_threads : sysconf(_SC_NPROCESSORS_ONLN);
    return total / o->data_parallel_size > 1 ? (int)(total / o->data_parallel_size) : 1;
}

static int load_model(cvllm_engine *e) {
    cv_runner_options o = {
        .config = &e->config,
        .weights = e->weights,
        .num_threads = replica_threads(&e->opts),
        .max_num_batched_tokens = e->opts.max_num_batched_tokens,
        .load_mtp = e->spec.method == CV_SPEC_MTP,
        .bf16_compute = e->compute_dtype == CV_DTYPE_BF16,
        .tp_size = e->opts.tensor_parallel_size,
        .expert_parallel = e->opts.enable_expert_parallel,
        .dp_size = e->opts.data_parallel_size,
        .dp_rank = e->opts.data_parallel_rank,
        .lora = e->opts.enable_lora,
        .pooling = e->pooling,
    };
    int rc = cv_runner_create(&o, &e->runner);
    if (rc) return rc;
    e->model = cv_runner_get_info(e->runner);
    if (e->spec.method == CV_SPEC_MTP && !e->model->has_mtp)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "speculative method MTP needs the model's multi-token-prediction module "
                                              "(mtp.* weights); %s has none", e->config.architecture);
    e->vocab_size = e->model->vocab_size;
    return 0;
}

static void release_state_slot(cvllm_engine *e, cv_seq *seq) {
    if (seq->state_slot < 0) return;
    cv_state_pool_release(&e->states, seq->state_slot);
    seq->state_slot = -1;
}

/* mamba_cache_mode and mamba_block_size, as vLLM checks them (VllmConfig.validate_mamba_block_size),
 * into the checkpoint spacing; a spacing that is not whole KV blocks cannot be hashed. Before the
 * weights: the mode is kept (it is a caller's string) as state_ckpt_align. */
static int resolve_state_checkpoints(cvllm_engine *e) {
    const cvllm_engine_options *o = &e->opts;
    const int32_t every = o->mamba_block_size ? o->mamba_block_size : o->block_size;
    if (o->mamba_block_size && o->mamba_block_size != e->max_model_len && !o->enable_prefix_caching)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--mamba-block-size can only be set with --enable-prefix-caching");
    if (every % o->block_size)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "mamba_block_size %d is not a multiple of block_size %d: the "
                       "recurrent state is checkpointed at KV-cache block boundaries", every, o->block_size);
    e->state_ckpt_blocks = every / o->block_size;
    e->state_ckpt_align = o->mamba_cache_mode && !strcmp(o->mamba_cache_mode, "align");
    return 0;
}

/* Models with recurrent state need the model's state checkpoints for prefix caching (restoring a
 * prefix's state) and for speculative decoding (rolling the state back to the last accepted token). */
static int check_state_support(cvllm_engine *e) {
    const cv_runner_info *m = e->model;
    if (m->state_bytes_per_seq == 0) return 0;
    e->state_prefix_caching = e->opts.enable_prefix_caching && m->state_checkpoints;
    if (e->opts.enable_prefix_caching && !m->state_checkpoints) {
        cv_warn("engine", "%s cannot checkpoint its recurrent state: prefix caching disabled", e->config.architecture);
        e->opts.enable_prefix_caching = false;
    }
    if (e->state_prefix_caching)
        cv_info("engine", "prefix caching on %s: the recurrent state is kept at %s %d-token boundary %s "
                "(mamba_cache_mode %s)", e->config.architecture, e->state_ckpt_align ? "the last" : "every",
                e->state_ckpt_blocks * e->opts.block_size, e->state_ckpt_align ? "each step reaches" : "of a prompt",
                e->state_ckpt_align ? "align" : "all");
    if (e->spec.method != CV_SPEC_NONE && !m->state_checkpoints)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "speculative decoding on %s needs recurrent-state checkpoints, which "
                                              "this model does not provide", e->config.architecture);
    return 0;
}

/* The ids that end a sequence: generation_config.json's eos_token_id, else config.json's. */
static const int32_t *model_eos(const cvllm_engine *e, size_t *n) {
    const cv_generation_config *g = &e->gen;
    *n = g->n_eos_token_ids ? (size_t)g->n_eos_token_ids : (size_t)e->config.n_eos_token_ids;
    return g->n_eos_token_ids ? g->eos_token_ids : e->config.eos_token_ids;
}

/* Everything that can refuse the options before anything big is read or made: the model at hand,
 * its config files, the speculative method, max_model_len, the dtypes, the quantization, the
 * tensor-parallel split and the memory fit. cvllm_engine_check stops here. */
static int check_engine(cvllm_engine *e, cv_footprint *fp, bool *known) {
    int rc;
    const bool dummy = is_dummy_format(e->opts.load_format, &rc);
    if (rc || (rc = check_loader_extra_config(&e->opts, dummy))) return rc;
    const cv_hub_options access = {.revision = e->opts.revision, .cache_dir = e->opts.download_dir,
                                   .token = e->opts.hf_token};
    if ((rc = cv_resolve_model(e->opts.model, &access, !dummy, &e->model_dir))) return rc;
    if ((rc = cv_spec_config_parse(e->opts.speculative_config, &e->spec))) return rc;
    char *overrides = NULL;
    if ((rc = config_overrides(&e->opts, &overrides))) return rc;
    rc = cv_model_config_load(e->model_dir, overrides, &e->config);
    free(overrides);
    if (rc) return rc;
    if ((rc = find_tokenizer(e))) return rc;
    if ((rc = cv_model_check_architecture(e->config.architecture))) return rc;
    if ((rc = load_generation_config(e))) return rc;
    if ((rc = resolve_max_model_len(e))) return rc;
    if ((rc = resolve_state_checkpoints(e))) return rc;
    if ((rc = resolve_runner(e))) return rc;
    if ((rc = resolve_dtypes(e))) return rc;
    if ((rc = open_weights(e, dummy))) return rc;
    if ((rc = read_lora_modules(e))) return rc;
    if ((rc = cv_model_check_split(&e->config, e->opts.tensor_parallel_size, e->opts.enable_expert_parallel)))
        return rc;
    return check_memory_fit(e, dummy, fp, known);
}

static int create_engine(cvllm_engine *e) {
    cv_footprint fp;
    bool known;
    int rc = check_engine(e, &fp, &known);
    if (rc) return rc;
    cv_info("engine", "Initializing engine: model=%s (%s), load_format=%s", e->opts.model, e->model_dir,
            cv_weight_source_is_dummy(e->weights) ? "dummy" : "safetensors");
    if ((rc = cv_tokenizer_load(e->tokenizer_dir, &e->tokenizer))) return rc;
    if ((rc = load_model(e))) return rc;
    if (e->pooling && (rc = cv_pooler_load_head(&e->pooler, e->weights, e->model->head_tensor, e->tokenizer))) return rc;
    if ((rc = serve_lora_modules(e))) return rc;
    if (!known)
        return cv_fail(CVLLM_ERR_INTERNAL, "no memory footprint for architecture %s (models/footprint.c lacks it)",
                       e->config.architecture);
    if ((rc = check_state_support(e))) return rc;
    if ((rc = cv_kv_cache_create(e, &fp))) return rc;
    bool priority = e->opts.scheduling_policy && !strcmp(e->opts.scheduling_policy, "priority");
    cv_scheduler_init(&e->sched, &e->blocks, e->opts.max_num_seqs, e->opts.max_num_batched_tokens,
                      e->opts.block_size, e->max_model_len, e->opts.enable_prefix_caching, priority,
                      e->states.num_slots ? &e->states : NULL);
    e->sched.max_loras = e->loras ? e->opts.max_loras : 0;
    if (priority) cv_info("engine", "scheduling policy priority: lower priority values are scheduled first");
    e->max_logprobs = e->opts.max_logprobs;
    const char *mode = e->opts.logprobs_mode;
    e->logprobs_as_logits = mode && (!strcmp(mode, "raw_logits") || !strcmp(mode, "processed_logits"));
    e->logprobs_processed = mode && !strncmp(mode, "processed_", 10);
    e->sample_scratch = cv_xmalloc(2 * (size_t)e->vocab_size * sizeof(float));
    e->top_scratch = cv_xmalloc(((size_t)e->max_logprobs + 1) * sizeof *e->top_scratch);
    size_t n_eos;
    const int32_t *eos = model_eos(e, &n_eos);
    e->grammars = cv_grammar_cache_new(e->tokenizer, e->vocab_size, eos, n_eos);
    cv_info("engine", "%s: %d layers, hidden %d, vocab %d, max_model_len %d, %d threads, weights %.2f GiB",
            e->config.architecture, e->config.num_hidden_layers, e->config.hidden_size, e->vocab_size,
            e->max_model_len, e->model->threads, (double)e->model->weight_bytes / (1 << 30));
    /* which kernels bf16 compute runs on, and why, the kernels log when the model first asks */
    cv_info("engine", "compute dtype %s, KV cache %s", cv_dtype_name(e->compute_dtype), cv_dtype_name(e->kv_dtype));
    return 0;
}

/* An engine holding the options with their defaults applied, nothing else yet. */
static int new_engine(const cvllm_engine_options *opts, cvllm_engine **out) {
    *out = NULL;
    int rc = check_options(opts);
    if (rc) return rc;
    cvllm_engine *e = cv_xcalloc(1, sizeof *e);
    e->opts = *opts;
    apply_option_defaults(&e->opts);
    *out = e;
    return 0;
}

/* Destroys an engine that failed to be made and returns its error, which the teardown could
 * overwrite. */
static int discard_engine(cvllm_engine *e, int rc) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", cv_error_message());
    cvllm_engine_destroy(e);
    return cv_fail(rc, "%s", msg);
}

cvllm_status cvllm_engine_check(const cvllm_engine_options *opts) {
    cvllm_engine *e;
    int rc = new_engine(opts, &e);
    if (rc) return rc;
    cv_footprint fp;
    bool known;
    if ((rc = check_engine(e, &fp, &known))) return discard_engine(e, rc);
    cvllm_engine_destroy(e);
    return CVLLM_OK;
}

cvllm_status cvllm_engine_create(const cvllm_engine_options *opts, cvllm_engine **out) {
    *out = NULL;
    cvllm_engine *e;
    int rc = new_engine(opts, &e);
    if (rc) return rc;
    if ((rc = create_engine(e))) {
        /* A worker of a group that failed to start: rank 0 reports why, once for the job, and its
         * status is the job's. A failing status here would make mpirun end rank 0 at once, maybe
         * before it has said why. */
        if (rc == CV_RUNNER_GROUP_FAILED) {
            cvllm_engine_destroy(e);
            exit(0);
        }
        return discard_engine(e, rc);
    }
    if (cv_runner_is_worker(e->runner)) { /* a tensor-parallel worker: serve rank 0 until it stops */
        /* mpirun forwards SIGTERM and SIGINT to every rank: rank 0 drains and then stops the workers,
         * which must still be there to finish its last batches */
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        signal(SIGUSR2, SIG_IGN); /* cvllm's launcher forwards SIGTERM as SIGUSR2 */
        rc = cv_runner_serve(e->runner);
        if (rc) cv_error_log("engine", "tensor-parallel worker: %s", cv_error_message());
        cvllm_engine_destroy(e);
        exit(rc ? 1 : 0);
    }
    *out = e;
    return CVLLM_OK;
}

bool cvllm_job_workers_released(void) { return cv_runner_workers_released(); }

static void free_finished(cvllm_engine *e) {
    for (size_t i = 0; i < e->n_finished; i++) cv_request_free(e->finished[i]);
    e->n_finished = 0;
}

void cvllm_engine_destroy(cvllm_engine *e) {
    if (!e) return;
    free_finished(e);
    for (size_t i = 0; i < e->n_requests; i++) cv_request_free(e->requests[i]);
    free(e->requests);
    free(e->finished);
    free(e->outputs);
    cv_schedule_free(&e->schedule);
    cv_scheduler_free(&e->sched);
    if (e->blocks.blocks) cv_block_pool_free(&e->blocks);
    cv_runner_free(e->runner);
    cv_weight_source_free(e->weights);
    cv_grammar_cache_free(e->grammars);
    cv_pooler_free(&e->pooler);
    for (int32_t i = 0; i < e->n_lora_modules; i++) cv_lora_adapter_free(e->lora_modules[i]);
    free(e->lora_modules);
    cv_lora_registry_free(e->loras); /* the requests, freed above, held their adapters */
    cv_tokenizer_free(e->tokenizer);
    cv_model_config_free(&e->config);
    free(e->batch.token_ids);
    free(e->batch.positions);
    free(e->batch.seq_start);
    free(e->batch.context_lens);
    free(e->batch.logit_rows);
    free(e->batch.slot_mapping);
    free(e->batch.block_tables);
    free(e->batch.state_slots);
    free(e->batch.loras);
    free(e->batch.logits);
    free(e->sample_scratch);
    free(e->top_scratch);
    cv_state_pool_free(&e->states);
    cv_mtp_work_free(&e->mtp);
    free(e->mtp_seqs);
    free(e->hidden);
    free(e->batch.checkpoints);
    free(e->batch.new_ckpt_hashes);
    free(e->model_dir);
    free(e->tokenizer_dir);
    free(e);
}

const cvllm_tokenizer *cvllm_engine_tokenizer(const cvllm_engine *e) { return (const cvllm_tokenizer *)e->tokenizer; }
int32_t cvllm_engine_max_model_len(const cvllm_engine *e) { return e->max_model_len; }
int32_t cvllm_engine_generation_max_tokens(const cvllm_engine *e) {
    return e->use_generation_defaults && e->gen.has_max_new_tokens ? e->gen.max_new_tokens : -1;
}
int32_t cvllm_engine_vocab_size(const cvllm_engine *e) { return e->vocab_size; }

void cvllm_engine_spec_decode_stats(const cvllm_engine *e, cvllm_spec_decode_stats *st) {
    *st = (cvllm_spec_decode_stats){e->spec_stats.num_drafts, e->spec_stats.num_draft_tokens,
                                    e->spec_stats.num_accepted_tokens};
}
bool cvllm_engine_has_unfinished(const cvllm_engine *e) { return e->n_requests > 0; }
bool cvllm_engine_is_pooling(const cvllm_engine *e) { return e->pooling; }
int32_t cvllm_engine_embedding_size(const cvllm_engine *e) {
    return e->pooling ? cv_pooler_width(&e->pooler) : e->config.hidden_size;
}
const char *cvllm_engine_input_type(const cvllm_engine *e, int32_t i, const char **prompt) {
    const cv_pooler *p = &e->pooler;
    if (!e->pooling || i < 0 || i >= p->n_prompts) return NULL;
    *prompt = p->prompt_texts[i];
    return p->prompt_names[i];
}
const char *cvllm_engine_class_label(const cvllm_engine *e, int32_t i) {
    const cv_pooler *p = &e->pooler;
    return e->pooling && p->task == CV_TASK_CLASSIFY && i >= 0 && i < p->num_labels ? p->labels[i] : NULL;
}
bool cvllm_engine_embed_chunking(const cvllm_engine *e, int64_t *max_embed_len) {
    if (max_embed_len) *max_embed_len = e->pooling ? e->pooler.max_embed_len : 0;
    return e->pooling && e->pooler.chunked;
}

const char *cvllm_engine_pooling_task(const cvllm_engine *e) { return e->pooling ? cv_pooler_task_name(&e->pooler) : NULL; }
void cvllm_pooling_params_default(cvllm_pooling_params *p) {
    *p = (cvllm_pooling_params){.dimensions = 0, .normalize = -1, .task = NULL};
}

/* ------------------------------------------------------------------------------------------------ */
/* Requests                                                                                          */

void cvllm_sampling_params_default(const cvllm_engine *e, cvllm_sampling_params *p) {
    memset(p, 0, sizeof *p);
    p->n = 1;
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
    p->max_tokens = 16;
    p->skip_special_tokens = true;
    p->spaces_between_special_tokens = true;
    p->logprobs = -1;
    p->prompt_logprobs = -1;
    p->grammar_after_token_id = -1;
    if (!e || !e->use_generation_defaults) return;
    const cv_generation_config *g = &e->gen;
    if (g->has_temperature) p->temperature = g->temperature;
    if (g->has_top_k) p->top_k = g->top_k;
    if (g->has_top_p) p->top_p = g->top_p;
    if (g->has_min_p) p->min_p = g->min_p;
    if (g->has_repetition_penalty) p->repetition_penalty = g->repetition_penalty;
    if (g->has_max_new_tokens) p->max_tokens = g->max_new_tokens;
}

const char *cvllm_finish_reason_name(cvllm_finish_reason r) {
    switch (r) {
    case CVLLM_FINISH_STOP: return "stop";
    case CVLLM_FINISH_LENGTH: return "length";
    case CVLLM_FINISH_ABORT: return "abort";
    case CVLLM_FINISH_ERROR: return "error";
    default: return NULL;
    }
}

/* The checks and messages of vLLM's SamplingParams._verify_args. */
static int check_sampling_params(const cvllm_engine *e, const cvllm_sampling_params *p) {
    const int bad = CVLLM_ERR_INVALID_ARGUMENT;
    if (p->n < 1) return cv_fail(bad, "n must be at least 1, got %d.", p->n);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return cv_fail(bad, "presence_penalty must be in [-2, 2], got %g.", p->presence_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return cv_fail(bad, "frequency_penalty must be in [-2, 2], got %g.", p->frequency_penalty);
    if (!(p->repetition_penalty > 0))
        return cv_fail(bad, "repetition_penalty must be greater than zero, got %g.", p->repetition_penalty);
    if (!(p->temperature >= 0) || isinf(p->temperature))
        return cv_fail(bad, "temperature must be non-negative, got %g.", p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1)) return cv_fail(bad, "top_p must be in (0, 1], got %g.", p->top_p);
    if (p->top_k < -1) return cv_fail(bad, "top_k must be 0 (disable), or at least 1, got %d.", p->top_k);
    if (!(p->min_p >= 0 && p->min_p <= 1)) return cv_fail(bad, "min_p must be in [0, 1], got %g.", p->min_p);
    if (p->max_tokens != -1 && p->max_tokens < 1)
        return cv_fail(bad, "max_tokens must be at least 1, got %d.", p->max_tokens);
    if (p->min_tokens < 0) return cv_fail(bad, "min_tokens must be greater than or equal to 0, got %d.", p->min_tokens);
    if (p->max_tokens != -1 && p->min_tokens > p->max_tokens)
        return cv_fail(bad, "min_tokens must be less than or equal to max_tokens=%d, got %d.", p->max_tokens, p->min_tokens);
    if (p->logprobs < -1) return cv_fail(bad, "logprobs must be non-negative, got %d.", p->logprobs);
    if (p->prompt_logprobs < -1) return cv_fail(bad, "prompt_logprobs must be non-negative, got %d.", p->prompt_logprobs);
    if (p->logprobs > e->max_logprobs)
        return cv_fail(bad, "Requested sample logprobs of %d, which is greater than max allowed: %d", p->logprobs, e->max_logprobs);
    if (p->prompt_logprobs > e->max_logprobs)
        return cv_fail(bad, "Requested prompt logprobs of %d, which is greater than max allowed: %d", p->prompt_logprobs,
                       e->max_logprobs);
    for (size_t i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !*p->stop[i]) return cv_fail(bad, "stop strings must not be empty.");
    for (size_t i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias_ids[i] < 0 || p->logit_bias_ids[i] >= e->vocab_size)
            return cv_fail(bad, "token_id(s) [%d] in logit_bias contain out-of-vocab token ids. Vocabulary size: %d",
                           p->logit_bias_ids[i], e->vocab_size);
    /* vLLM's _validate_allowed_token_ids: bounded by the logits' width, as logit_bias is */
    if (p->allowed_token_ids && !p->n_allowed_token_ids) return cv_fail(bad, "allowed_token_ids is not None and empty!");
    for (size_t i = 0; p->allowed_token_ids && i < p->n_allowed_token_ids; i++)
        if (p->allowed_token_ids[i] < 0 || p->allowed_token_ids[i] >= e->vocab_size)
            return cv_fail(bad, "allowed_token_ids contains out-of-vocab token id!");
    if (p->priority != 0 && !e->sched.priority_policy)
        return cv_fail(bad, "Got priority %d but Priority scheduling is not enabled.", p->priority);
    if (p->grammar && !cv_grammar_belongs_to(p->grammar, e->grammars))
        return cv_fail(bad, "the grammar was compiled by another engine");
    if (p->grammar && (p->grammar_after_token_id < -1 || p->grammar_after_token_id >= e->vocab_size))
        return cv_fail(bad, "grammar_after_token_id %d is not a token id of this model (vocabulary size %d)",
                       p->grammar_after_token_id, e->vocab_size);
    return 0;
}

static int tokenize_prompt(const cvllm_engine *e, const cvllm_prompt *prompt, int32_t **ids, size_t *n) {
    bool has_text = prompt->text != NULL, has_ids = prompt->token_ids != NULL;
    if (has_text == has_ids)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "a prompt must have either text or token ids");
    if (has_ids) {
        *n = prompt->n_token_ids;
        *ids = cv_xmalloc((*n ? *n : 1) * sizeof(int32_t));
        memcpy(*ids, prompt->token_ids, *n * sizeof(int32_t));
        return 0;
    }
    size_t len = prompt->text_len ? prompt->text_len : strlen(prompt->text);
    int rc = cv_tokenizer_encode(e->tokenizer, prompt->text, len, ids, n);
    if (!rc && prompt->add_special_tokens) rc = cv_tokenizer_add_special_tokens(e->tokenizer, ids, n);
    return rc;
}

/* Bytes of Python's str.lstrip() at the start of s: str.isspace() is Unicode's White_Space plus the
 * information separators U+001C..U+001F. */
static size_t python_leading_space(const char *s, size_t len) {
    size_t at = 0, n;
    uint32_t cp;
    while (at < len && cv_utf8_decode(s + at, len - at, &cp, &n) == CV_UTF8_OK &&
           (cv_unicode_is_white_space(cp) || (cp >= 0x1C && cp <= 0x1F)))
        at += n;
    return at;
}

/* Adds one tokenized bad word, counted against vLLM's limit. A sequence with an id past the logits'
 * width (a tokenizer larger than the model's vocabulary) is counted but not kept: the model can
 * never produce that id, so the word can never be completed, and no mask is needed for it. */
static int keep_bad_word(const cvllm_engine *e, const int32_t *ids, size_t n, size_t *count, cv_token_seqs *out) {
    if (++*count > MAX_BAD_WORDS)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Too many bad words after tokenization: %zu. The max number is %d.",
                       *count, MAX_BAD_WORDS);
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= e->vocab_size) return 0;
    int32_t at = out->n ? out->starts[out->n] : 0;
    out->ids = cv_xrealloc(out->ids, ((size_t)at + n) * sizeof *out->ids);
    memcpy(out->ids + at, ids, n * sizeof *ids);
    out->starts = cv_xrealloc(out->starts, (out->n + 2) * sizeof *out->starts);
    out->starts[out->n] = at;
    out->starts[++out->n] = at + (int32_t)n;
    return 0;
}

/* vLLM's SamplingParams.update_from_tokenizer: each word, its leading whitespace stripped, is
 * tokenized as it is and with one space in front (the form it takes inside a text, where the space
 * is part of the word's first token). The spaced form is kept only when it starts with another
 * token and has as many tokens; an entry that tokenizes to nothing is an error. */
static int tokenize_bad_words(const cvllm_engine *e, const cvllm_sampling_params *p, cv_token_seqs *out) {
    *out = (cv_token_seqs){0};
    size_t count = 0;
    int rc = 0;
    for (size_t w = 0; p->bad_words && w < p->n_bad_words && !rc; w++) {
        const char *word = p->bad_words[w] ? p->bad_words[w] : "";
        size_t len = strlen(word), skip = python_leading_space(word, len);
        char *spaced_text = cv_xasprintf(" %s", word + skip);
        int32_t *plain = NULL, *spaced = NULL;
        size_t n_plain = 0, n_spaced = 0;
        rc = cv_tokenizer_encode(e->tokenizer, word + skip, len - skip, &plain, &n_plain);
        if (!rc && !n_plain)
            rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "bad_words entries must tokenize to at least one token.");
        if (!rc) rc = keep_bad_word(e, plain, n_plain, &count, out);
        if (!rc) rc = cv_tokenizer_encode(e->tokenizer, spaced_text, len - skip + 1, &spaced, &n_spaced);
        if (!rc && n_spaced == n_plain && spaced[0] != plain[0]) rc = keep_bad_word(e, spaced, n_spaced, &count, out);
        free(spaced_text);
        free(plain);
        free(spaced);
    }
    if (rc) cv_token_seqs_free(out);
    return rc;
}

static int check_prompt(const cvllm_engine *e, const int32_t *ids, size_t n) {
    if (n == 0) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "The decoder prompt cannot be empty");
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= e->vocab_size)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "Token id %d is out of vocabulary", ids[i]);
    if (e->pooling && n > (size_t)e->max_model_len) /* no output token to leave room for */
        return cv_fail(CVLLM_ERR_CAPACITY,
                       "You passed %zu input tokens and requested 0 output tokens. However, the model's context length "
                       "is only %d tokens, resulting in a maximum input length of %d tokens. Please reduce the length "
                       "of the input prompt.", n, e->max_model_len, e->max_model_len);
    if (!e->pooling && n >= (size_t)e->max_model_len)
        return cv_fail(CVLLM_ERR_CAPACITY,
                       "The decoder prompt (length %zu) is longer than the maximum model length of %d. Make sure "
                       "that `max_model_len` is no smaller than the number of text tokens (plus one for the output).",
                       n, e->max_model_len);
    return 0;
}

static uint64_t request_seed(cvllm_engine *e, const cvllm_sampling_params *p, int32_t index) {
    if (p->has_seed) return (uint64_t)p->seed + (uint64_t)index;
    return e->opts.seed ^ (0x9E3779B97F4A7C15ull * ++e->seed_counter);
}

static void push_request(cvllm_engine *e, cv_request *req) {
    if (e->n_requests == e->cap_requests) {
        e->cap_requests = e->cap_requests ? e->cap_requests * 2 : 16;
        e->requests = cv_xrealloc(e->requests, e->cap_requests * sizeof *e->requests);
    }
    e->requests[e->n_requests++] = req;
}

/* The request's adapter, a reference taken: NULL for none. */
static int find_lora(cvllm_engine *e, const char *name, cv_lora_entry **out) {
    *out = NULL;
    if (!name) return 0;
    if (e->loras && (*out = cv_lora_registry_acquire(e->loras, name))) return 0;
    return cv_fail(CVLLM_ERR_NOT_FOUND, "LoRA adapter %s is not loaded%s", name,
                   e->loras ? "" : " (LoRA is off: enable_lora)");
}

cvllm_status cvllm_engine_load_lora(cvllm_engine *e, const cvllm_lora_module *m, bool replace) {
    if (!e || !m) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "no engine or LoRA module given");
    if (!m->name || !*m->name || !m->path || !*m->path)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "a LoRA adapter needs a name and a path");
    if (!e->loras) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "LoRA adapter %s: LoRA is off (enable_lora)", m->name);
    cv_lora_adapter *a = NULL;
    int rc = cv_lora_adapter_load(m->name, m->path, e->opts.max_lora_rank, &a);
    return rc ? rc : serve_lora(e, a, replace);
}

cvllm_status cvllm_engine_unload_lora(cvllm_engine *e, const char *name) {
    if (!e || !name) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "no engine or LoRA adapter name given");
    if (!e->loras) return cv_fail(CVLLM_ERR_NOT_FOUND, "LoRA adapter %s is not loaded (LoRA is off: enable_lora)", name);
    int rc = cv_lora_registry_remove(e->loras, name);
    if (!rc) cv_info("engine", "LoRA adapter %s unloaded", name);
    return rc;
}

/* The request's prompt and adapter, checked, for either kind of request; params are the sampling ones
 * (neutral ones for a pooling request). */
static int make_request(cvllm_engine *e, const cvllm_prompt *prompt, const cvllm_sampling_params *params,
                        cv_request **out) {
    int rc;
    cv_lora_entry *lora = NULL;
    if ((rc = find_lora(e, prompt->lora_name, &lora))) return rc;
    int32_t *ids = NULL;
    size_t n = 0;
    cv_token_seqs bad_words = {0};
    rc = tokenize_prompt(e, prompt, &ids, &n);
    if (!rc) rc = check_prompt(e, ids, n);
    if (!rc) rc = tokenize_bad_words(e, params, &bad_words);
    if (rc) {
        cv_lora_entry_release(lora);
        free(ids);
        return rc;
    }
    int32_t room = e->max_model_len - (int32_t)n;
    int32_t max_tokens = params->max_tokens == -1 || params->max_tokens > room ? room : params->max_tokens;
    if (max_tokens < 0) max_tokens = 0; /* a pooling prompt may fill the context */
    size_t n_eos;
    const int32_t *eos = model_eos(e, &n_eos);
    uint64_t id = ++e->next_request_id;
    *out = cv_request_create(id, ids, n, prompt->cache_salt, params, max_tokens, eos, n_eos, &bad_words);
    (*out)->lora = lora;
    (*out)->sampler_params.logits = e->logprobs_as_logits;
    (*out)->sampler_params.processed = e->logprobs_processed;
    free(ids);
    return 0;
}

int cv_engine_prepare_request(cvllm_engine *e, const cvllm_prompt *prompt, const cvllm_sampling_params *params,
                              cv_request **out) {
    *out = NULL;
    if (e->pooling)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "this engine pools prompts (runner pooling): it generates nothing; "
                       "use cvllm_engine_add_pooling_request");
    int rc = check_sampling_params(e, params);
    return rc ? rc : make_request(e, prompt, params, out);
}

int cv_engine_prepare_pooling(cvllm_engine *e, const cvllm_prompt *prompt, const cvllm_pooling_params *params,
                              cv_request **out) {
    *out = NULL;
    if (!e->pooling)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "this engine generates (runner generate): pooling requests need "
                       "runner pooling");
    cvllm_pooling_params resolved, defaults;
    cvllm_pooling_params_default(&defaults);
    int rc = cv_pooler_resolve(&e->pooler, params ? params : &defaults, e->opts.model, &resolved);
    if (rc) return rc;
    cvllm_sampling_params neutral;
    cvllm_sampling_params_default(e, &neutral);
    neutral.max_tokens = 0;
    if ((rc = make_request(e, prompt, &neutral, out))) return rc;
    (*out)->pooling = true;
    (*out)->pool = resolved;
    (*out)->pooled = cv_xcalloc(cv_pooler_acc_size(&e->pooler, (*out)->n_prompt), sizeof(float));
    return 0;
}

void cv_engine_enqueue_request(cvllm_engine *e, cv_request *req) {
    for (int32_t i = 0; i < req->n_seqs; i++) {
        cv_seq *s = &req->seqs[i];
        cv_sampler_state_init(&s->sampler, &req->sampler_params, e->vocab_size, request_seed(e, &req->params, i),
                              req->prompt, req->n_prompt);
        if (req->grammar) {
            size_t n_eos;
            const int32_t *eos = model_eos(e, &n_eos);
            cv_sampler_add_proc(&s->sampler, cv_grammar_proc_new(cv_grammar_of(req->grammar), e->vocab_size,
                                                                 req->params.grammar_after_token_id, eos, n_eos));
        }
        cv_detok_init(&s->detok, e->tokenizer, req->params.skip_special_tokens);
        cv_scheduler_add(&e->sched, s);
    }
    push_request(e, req);
    e->prompt_tokens_total += req->n_prompt;
}

/* Queues a request prepare returned with rc (0: prepared). */
static cvllm_status enqueue_prepared(cvllm_engine *e, int rc, cv_request *req, uint64_t *request_id) {
    if (rc) return rc;
    cv_engine_enqueue_request(e, req);
    if (request_id) *request_id = req->id;
    return CVLLM_OK;
}

cvllm_status cvllm_engine_add_request(cvllm_engine *e, const cvllm_prompt *prompt,
                                      const cvllm_sampling_params *params, uint64_t *request_id) {
    cv_request *req;
    int rc = cv_engine_prepare_request(e, prompt, params, &req);
    return enqueue_prepared(e, rc, req, request_id);
}

cvllm_status cvllm_engine_add_pooling_request(cvllm_engine *e, const cvllm_prompt *prompt,
                                              const cvllm_pooling_params *params, uint64_t *request_id) {
    cv_request *req;
    int rc = cv_engine_prepare_pooling(e, prompt, params, &req);
    return enqueue_prepared(e, rc, req, request_id);
}

/* ------------------------------------------------------------------------------------------------ */
/* Finishing                                                                                         */

static void finish_seq(cvllm_engine *e, cv_seq *seq, cvllm_finish_reason reason) {
    assert(seq->status != CV_SEQ_FINISHED);
    cv_scheduler_finish(&e->sched, seq);
    release_state_slot(e, seq);
    seq->out.finish_reason = reason;
    seq->req->n_finished++;
    seq->touched = seq->req->touched = true;
}

void cv_engine_fail_all(cvllm_engine *e) {
    for (size_t i = 0; i < e->n_requests; i++) {
        cv_request *req = e->requests[i];
        for (int32_t s = 0; s < req->n_seqs; s++)
            if (req->seqs[s].status != CV_SEQ_FINISHED) finish_seq(e, &req->seqs[s], CVLLM_FINISH_ERROR);
    }
}

cvllm_status cvllm_engine_abort_request(cvllm_engine *e, uint64_t id) {
    for (size_t i = 0; i < e->n_requests; i++) {
        cv_request *req = e->requests[i];
        if (req->id != id) continue;
        for (int32_t s = 0; s < req->n_seqs; s++)
            if (req->seqs[s].status != CV_SEQ_FINISHED) finish_seq(e, &req->seqs[s], CVLLM_FINISH_ABORT);
        return CVLLM_OK;
    }
    return cv_fail(CVLLM_ERR_NOT_FOUND, "no running request with id %llu", (unsigned long long)id);
}

/* ------------------------------------------------------------------------------------------------ */
/* Building the batch                                                                                */

static void ensure_batch_capacity(cv_batch_buf *b, int32_t n_tokens, int32_t n_seqs) {
    if (n_tokens > b->cap_tokens) {
        b->cap_tokens = n_tokens;
        b->token_ids = cv_xrealloc(b->token_ids, (size_t)n_tokens * sizeof(int32_t));
        b->positions = cv_xrealloc(b->positions, (size_t)n_tokens * sizeof(int32_t));
        b->slot_mapping = cv_xrealloc(b->slot_mapping, (size_t)n_tokens * sizeof(int64_t));
        b->logit_rows = cv_xrealloc(b->logit_rows, (size_t)n_tokens * sizeof(int32_t));
    }
    if (n_seqs > b->cap_seqs) {
        b->cap_seqs = n_seqs;
        b->seq_start = cv_xrealloc(b->seq_start, (size_t)(n_seqs + 1) * sizeof(int32_t));
        b->context_lens = cv_xrealloc(b->context_lens, (size_t)n_seqs * sizeof(int32_t));
        b->block_tables = cv_xrealloc(b->block_tables, (size_t)n_seqs * sizeof(int32_t *));
        b->state_slots = cv_xrealloc(b->state_slots, (size_t)n_seqs * sizeof(int32_t));
        b->loras = cv_xrealloc(b->loras, (size_t)n_seqs * sizeof *b->loras);
    }
}

/* Prompt rows t whose logits give the distribution of prompt token t+1 (prompt_logprobs). Only the
 * first completion computes them, and each only once, even if the sequence is preempted and
 * recomputed: entry t+1 exists once n_prompt_logprobs_done > t+1. */
static void prompt_logprob_rows(const cv_seq *seq, size_t *first, size_t *count) {
    const cv_request *req = seq->req;
    *first = *count = 0;
    if (!cv_request_wants_prompt_logprobs(req) || seq->index != 0) return;
    size_t done = req->n_prompt_logprobs_done;
    size_t begin = seq->num_computed, end = seq->num_computed + (size_t)seq->num_scheduled;
    if (done > 0 && begin < done - 1) begin = done - 1;
    if (end > req->n_prompt - 1) end = req->n_prompt - 1;
    if (end > begin) {
        *first = begin;
        *count = end - begin;
    }
}

static bool seq_samples_this_step(const cv_seq *seq) {
    return seq->num_computed + (size_t)(seq->num_scheduled - seq->n_draft) == seq->n_tokens;
}

/* A sequence that starts running gets a state slot: zero state when it starts at position 0 (the
 * model clears it), or the checkpoint of the cached prefix the scheduler matched. */
static void attach_state_slot(cvllm_engine *e, cv_seq *seq) {
    if (seq->state_slot >= 0) return;
    seq->state_slot = cv_state_pool_acquire(&e->states);
    assert(seq->state_slot >= 0);
    assert(seq->num_computed == 0 || seq->restore_slot >= 0);
    if (seq->restore_slot >= 0) cv_state_pool_copy(&e->states, seq->state_slot, seq->restore_slot);
    seq->restore_slot = -1;
}

static void push_checkpoint(cv_batch_buf *b, int32_t seq_index, size_t position, int32_t slot) {
    if (b->n_checkpoints == b->cap_checkpoints) {
        b->cap_checkpoints = b->cap_checkpoints ? b->cap_checkpoints * 2 : 64;
        b->checkpoints = cv_xrealloc(b->checkpoints, (size_t)b->cap_checkpoints * sizeof *b->checkpoints);
        b->new_ckpt_hashes = cv_xrealloc(b->new_ckpt_hashes, (size_t)b->cap_checkpoints * sizeof *b->new_ckpt_hashes);
    }
    b->checkpoints[b->n_checkpoints++] = (cv_state_checkpoint){seq_index, (int32_t)position, slot};
}

/* Checkpoints of this step for one sequence, in position order: the state at the boundaries (every
 * state_ckpt_blocks blocks; with align the last only) its real tokens complete (prefix caching), and
 * after each position of a speculative verify pass (rollback). When the pool cannot take them all in
 * one step (none may be evicted before it is written), the last boundaries win: they cover the
 * longest prefixes. */
static void request_checkpoints(cvllm_engine *e, cv_seq *seq, int32_t seq_index) {
    cv_batch_buf *b = &e->batch;
    const size_t span = (size_t)e->opts.block_size * (size_t)e->state_ckpt_blocks, every = (size_t)e->state_ckpt_blocks;
    const size_t from = seq->num_computed, to = seq->num_computed + (size_t)(seq->num_scheduled - seq->n_draft);
    if (e->state_prefix_caching && to / span > from / span) {
        cv_scheduler_hash_blocks(&e->sched, seq);
        /* in blocks: the boundaries from + 1 … to reach, every `every` blocks */
        size_t first = (from / span + 1) * every, last = to / span * every;
        const size_t room = (size_t)(e->states.n_ckpt - b->n_new_ckpts);
        if (e->state_ckpt_align) first = last;
        if ((last - first) / every + 1 > room) first = room ? last - (room - 1) * every : last + 1;
        for (size_t blk = first; blk <= last; blk += every) {
            cv_block_hash h = seq->block_hashes[blk - 1];
            if (cv_state_pool_has(&e->states, h)) continue;
            push_checkpoint(b, seq_index, blk * (size_t)e->opts.block_size - 1, cv_state_pool_checkpoint(&e->states, h));
            b->new_ckpt_hashes[b->n_new_ckpts++] = h; /* fits: there are at least as many checkpoints */
        }
    }
    for (int32_t i = 0; i < seq->n_draft; i++)
        push_checkpoint(b, seq_index, to - 1 + (size_t)i, cv_state_pool_spec_slot(&e->states, seq->state_slot, i));
}

static int32_t build_batch(cvllm_engine *e, cv_batch *batch) {
    const cv_seq_list *list = &e->schedule.seqs;
    cv_batch_buf *b = &e->batch;
    int32_t bs = e->opts.block_size;
    ensure_batch_capacity(b, e->schedule.total_tokens, list->n);
    b->n_checkpoints = b->n_new_ckpts = 0;
    int32_t t = 0, n_logits = 0;
    for (int32_t s = 0; s < list->n; s++) {
        cv_seq *seq = list->items[s];
        b->seq_start[s] = t;
        size_t first, count;
        prompt_logprob_rows(seq, &first, &count);
        int32_t n_real = seq->num_scheduled - seq->n_draft;
        for (int32_t i = 0; i < seq->num_scheduled; i++, t++) {
            size_t pos = seq->num_computed + (size_t)i;
            b->token_ids[t] = i < n_real ? seq->tokens[pos] : seq->draft[i - n_real];
            b->positions[t] = (int32_t)pos;
            b->slot_mapping[t] = (int64_t)seq->block_table[pos / (size_t)bs] * bs + (int64_t)(pos % (size_t)bs);
            if (pos >= first && pos < first + count) b->logit_rows[n_logits++] = t;
        }
        if (seq_samples_this_step(seq) && !seq->req->pooling)
            for (int32_t d = seq->n_draft; d >= 0; d--) b->logit_rows[n_logits++] = t - 1 - d;
        b->context_lens[s] = (int32_t)(seq->num_computed + (size_t)seq->num_scheduled);
        b->block_tables[s] = seq->block_table;
        b->loras[s] = seq->req->lora ? seq->req->lora->binding : NULL;
        if (e->states.num_slots) {
            attach_state_slot(e, seq);
            b->state_slots[s] = seq->state_slot;
            request_checkpoints(e, seq, s);
        }
    }
    b->seq_start[list->n] = t;
    const bool hidden = e->spec.method == CV_SPEC_MTP || e->pooling;
    if (hidden && (size_t)t > e->cap_hidden) {
        e->cap_hidden = (size_t)t;
        free(e->hidden);
        e->hidden = cv_xmalloc(e->cap_hidden * (size_t)e->config.hidden_size * sizeof(float));
    }
    if (e->spec.method == CV_SPEC_MTP) e->mtp_seqs = cv_xrealloc(e->mtp_seqs, (size_t)list->n * sizeof *e->mtp_seqs);
    *batch = (cv_batch){
        .n_tokens = t,
        .token_ids = b->token_ids,
        .positions = b->positions,
        .slot_mapping = b->slot_mapping,
        .n_seqs = list->n,
        .seq_start = b->seq_start,
        .context_lens = b->context_lens,
        .block_tables = b->block_tables,
        .hidden_out = hidden ? e->hidden : NULL,
        .state_slots = e->states.num_slots ? b->state_slots : NULL,
        .checkpoints = b->checkpoints,
        .n_checkpoints = b->n_checkpoints,
        .n_logits = n_logits,
        .logit_rows = b->logit_rows,
        .loras = e->loras ? b->loras : NULL,
    };
    if ((size_t)n_logits > b->cap_logits) {
        b->cap_logits = (size_t)n_logits;
        free(b->logits);
        b->logits = cv_aligned_alloc(b->cap_logits * (size_t)e->vocab_size * sizeof(float));
        if (!b->logits) {
            b->cap_logits = 0;
            return cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate logits for %d rows", n_logits);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Post-processing                                                                                   */

static cvllm_position_logprobs make_position_logprobs(const cv_logprob_entry *top, int32_t n_top,
                                                      cv_logprob_entry chosen) {
    cvllm_logprob *copy = NULL;
    if (n_top > 0) {
        copy = cv_xmalloc((size_t)n_top * sizeof *copy);
        for (int32_t i = 0; i < n_top; i++) copy[i] = (cvllm_logprob){top[i].token_id, top[i].logprob, top[i].rank};
    }
    return (cvllm_position_logprobs){
        .chosen = {chosen.token_id, chosen.logprob, chosen.rank},
        .top = copy,
        .n_top = n_top,
    };
}

static void record_prompt_logprobs(cvllm_engine *e, cv_seq *seq, size_t first, size_t count, const float *rows) {
    cv_request *req = seq->req;
    if (req->n_prompt_logprobs_done == 0) {
        req->prompt_logprobs[0] = (cvllm_position_logprobs){.chosen = {req->prompt[0], 0.0f, 0}};
        req->n_prompt_logprobs_done = 1;
    }
    for (size_t i = 0; i < count; i++) {
        size_t t = first + i; /* row t predicts prompt token t + 1 */
        cv_logprob_entry chosen;
        /* log-softmax of the raw logits whatever the logprobs_mode, as vLLM's prompt logprobs are */
        cv_logprobs_of(rows + i * (size_t)e->vocab_size, e->vocab_size, req->params.prompt_logprobs, req->prompt[t + 1],
                       false, e->top_scratch, &chosen);
        req->prompt_logprobs[t + 1] = make_position_logprobs(e->top_scratch, req->params.prompt_logprobs, chosen);
        req->n_prompt_logprobs_done = t + 2;
    }
    req->touched = true;
}

/* Samples one token from `row` (verifying `draft` when >= 0), appends it and checks the stop
 * conditions; returns true while the sequence goes on. */
static bool sample_token(cvllm_engine *e, cv_seq *seq, float *row, int32_t draft) {
    cv_request *req = seq->req;
    cv_sample_result res = {.top = e->top_scratch};
    int32_t token = cv_sample_verify(&req->sampler_params, &seq->sampler, row, e->sample_scratch, draft, &res);
    /* A processor refuses the token only when the mask and the request's own rules (allowed_token_ids,
     * bad_words) together left nothing and the sampler fell back: the output can no longer follow its
     * grammar, so it ends there as an error, without the token, rather than as an invalid answer. */
    if (!cv_sampler_accept(&seq->sampler, token)) {
        cv_warn("engine", "request %llu: token %d breaks its structured output constraint (nothing else was allowed); "
                "the sequence ends with an error", (unsigned long long)req->id, token);
        cv_detok_flush(&seq->detok, &seq->text, &seq->text_len, &seq->text_cap);
        seq->touched = req->touched = true;
        finish_seq(e, seq, CVLLM_FINISH_ERROR);
        return false;
    }
    cv_seq_append_token(seq, token);
    if (req->params.logprobs >= 0)
        seq->logprobs[cv_seq_num_output(seq) - 1] = make_position_logprobs(res.top, res.n_top, res.chosen);
    e->generation_tokens_total++;

    int32_t stop_token;
    cvllm_finish_reason reason = cv_output_stop_token(seq, token, &stop_token);
    if (seq->n_tokens >= (size_t)e->max_model_len && reason == CVLLM_FINISH_NONE) reason = CVLLM_FINISH_LENGTH;
    seq->out.finish_reason = reason;
    seq->out.stop_token_id = stop_token;
    bool stopped_by_token = reason == CVLLM_FINISH_STOP;
    if (!stopped_by_token || req->params.include_stop_str_in_output)
        cv_output_append_text(seq, token, reason != CVLLM_FINISH_NONE);
    else
        cv_detok_flush(&seq->detok, &seq->text, &seq->text_len, &seq->text_cap);
    seq->touched = req->touched = true;
    if (seq->out.finish_reason == CVLLM_FINISH_NONE) return true;
    cvllm_finish_reason r = seq->out.finish_reason;
    seq->out.finish_reason = CVLLM_FINISH_NONE;
    finish_seq(e, seq, r);
    return false;
}

/* Drafts for the next step: never past max_model_len, never more than the output still allowed. */
static void propose_drafts(cvllm_engine *e, cv_seq *seq) {
    seq->n_draft = 0;
    if (e->spec.method != CV_SPEC_NGRAM || seq->status == CV_SEQ_FINISHED) return;
    int32_t room = e->max_model_len - (int32_t)seq->n_tokens;
    int32_t left = seq->req->max_tokens - (int32_t)cv_seq_num_output(seq) - 1;
    int32_t k = e->spec.num_speculative_tokens;
    if (k > room) k = room;
    if (k > left) k = left;
    seq->n_draft = cv_ngram_propose(&e->spec, seq->tokens, seq->n_tokens, k, seq->draft);
}

/* Rows [0, n_draft] belong to the last real token and each draft: accept drafts while the
 * rejection sampler keeps them, then one more token (a correction or the bonus). */
static void process_samples(cvllm_engine *e, cv_seq *seq, float *rows, size_t n_before) {
    int32_t n_draft = seq->n_draft, accepted = 0;
    bool going = true;
    for (int32_t d = 0; d <= n_draft && going; d++) {
        int32_t draft = d < n_draft ? seq->draft[d] : -1;
        size_t n_tokens = seq->n_tokens;
        going = sample_token(e, seq, rows + (size_t)d * (size_t)e->vocab_size, draft);
        if (draft < 0 || seq->n_tokens == n_tokens || seq->tokens[seq->n_tokens - 1] != draft) break;
        accepted++;
    }
    if (n_draft > 0) {
        cv_spec_stats *st = &e->spec_stats;
        st->num_drafts++;
        st->num_draft_tokens += (uint64_t)n_draft;
        st->num_accepted_tokens += (uint64_t)accepted;
        for (int32_t d = 0; d < accepted; d++) st->accepted_per_pos[d]++;
    }
    /* K/V is valid for the tokens before the newest one: the rejected drafts' slots get overwritten.
     * Recurrent state cannot be overwritten that way: take the checkpoint after the last accepted. */
    seq->num_computed = n_before + (size_t)accepted;
    if (accepted < n_draft && seq->state_slot >= 0)
        cv_state_pool_copy(&e->states, seq->state_slot, cv_state_pool_spec_slot(&e->states, seq->state_slot, accepted));
    seq->n_draft = 0;
    cv_output_update_visible(seq, seq->status == CV_SEQ_FINISHED);
    if (going) propose_drafts(e, seq);
}

/* A pooling sequence's rows of this step go to the pooler; the last step finishes it with its vector. */
static void pool_rows(cvllm_engine *e, cv_seq *seq, int32_t first_row) {
    cv_request *req = seq->req;
    const size_t H = (size_t)e->pooler.hidden;
    if (seq->num_computed == 0) /* also after a preemption */
        memset(req->pooled, 0, cv_pooler_acc_size(&e->pooler, req->n_prompt) * sizeof *req->pooled);
    cv_pooler_take(&e->pooler, req->pooled, e->hidden + (size_t)first_row * H, seq->num_computed,
                   (size_t)seq->num_scheduled, req->n_prompt);
    seq->num_computed += (size_t)seq->num_scheduled;
    if (seq->num_computed < req->n_prompt) return;
    req->n_pooled = cv_pooler_finish(&e->pooler, req->pooled, req->n_prompt, &req->pool);
    finish_seq(e, seq, CVLLM_FINISH_STOP);
}

static int postprocess(cvllm_engine *e, const float *logits) {
    const cv_seq_list *list = &e->schedule.seqs;
    size_t row = 0;
    bool mtp = e->spec.method == CV_SPEC_MTP;
    for (int32_t s = 0; s < list->n; s++) {
        cv_seq *seq = list->items[s];
        if (mtp) e->mtp_seqs[s] = (cv_mtp_seq){seq, seq->num_computed, e->batch.seq_start[s]};
        size_t first, count;
        prompt_logprob_rows(seq, &first, &count);
        if (count) record_prompt_logprobs(e, seq, first, count, logits + row * (size_t)e->vocab_size);
        row += count;
        /* The K/V of this step's real tokens exist now: their full blocks are shared from here on,
         * also when the sequence finishes below and releases them (every max_tokens=1 request). */
        cv_scheduler_cache_full_blocks(&e->sched, seq, seq->num_computed + (size_t)(seq->num_scheduled - seq->n_draft));
        if (seq->req->pooling) {
            pool_rows(e, seq, e->batch.seq_start[s]);
        } else if (seq_samples_this_step(seq)) {
            size_t rows_used = (size_t)seq->n_draft + 1;
            process_samples(e, seq, (float *)logits + row * (size_t)e->vocab_size, seq->n_tokens);
            row += rows_used;
        } else {
            seq->num_computed += (size_t)seq->num_scheduled;
        }
    }
    return mtp ? cv_mtp_propose(e, &e->mtp, e->mtp_seqs, list->n, e->hidden) : 0;
}

cvllm_status cvllm_engine_step(cvllm_engine *e, const cvllm_request_output *const **outputs, size_t *n_outputs) {
    free_finished(e);
    cv_output_restore_views(e);
    e->n_outputs = 0;
    cv_scheduler_schedule(&e->sched, &e->schedule);
    for (int32_t i = 0; i < e->schedule.preempted.n; i++) release_state_slot(e, e->schedule.preempted.items[i]);
    if (e->schedule.seqs.n > 0) {
        cv_batch batch;
        int rc = build_batch(e, &batch);
        if (!rc) {
            int32_t n_copies;
            const cv_state_copy *copies = cv_state_pool_copies(&e->states, &n_copies);
            rc = cv_runner_execute(e->runner, &batch, copies, n_copies, e->batch.logits);
            cv_state_pool_copies_done(&e->states);
        }
        if (rc) {
            for (int32_t i = 0; i < e->batch.n_new_ckpts; i++) cv_state_pool_forget(&e->states, e->batch.new_ckpt_hashes[i]);
            return rc;
        }
        if ((rc = postprocess(e, e->batch.logits))) return rc;
    }
    cv_output_collect(e);
    *outputs = e->outputs;
    *n_outputs = e->n_outputs;
    return CVLLM_OK;
}
