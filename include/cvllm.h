/*
 * cvllm.h — the public C API of cvllm, an LLM serving engine for Qwen3-family models.
 *
 * Design (after llama.h): every object is an opaque handle created and destroyed in pairs
 * (cvllm_engine_create / cvllm_engine_destroy, cvllm_tokenizer_create / cvllm_tokenizer_destroy).
 * Every call that can fail returns a cvllm_status; on failure a one-line, human-readable reason is
 * available from cvllm_last_error() on the same thread until the next failing call there.
 *
 * Ownership is explicit:
 *   - strings and arrays passed in are copied before the call returns; the caller keeps them;
 *   - memory returned through an out-pointer of type `T **` (ids, text) belongs to the caller and is
 *     released with cvllm_free();
 *   - outputs returned by cvllm_engine_step() belong to the engine and stay valid until the next
 *     cvllm_engine_step() or cvllm_engine_destroy() on that engine.
 *
 * An engine is not thread-safe: drive it from one thread (the server wraps it in its own loop).
 */
#ifndef CVLLM_H
#define CVLLM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CVLLM_VERSION "0.1.0"

typedef enum cvllm_status {
    CVLLM_OK = 0,
    CVLLM_ERR_INVALID_ARGUMENT = -1, /* a parameter is out of range or malformed */
    CVLLM_ERR_IO = -2,               /* a file could not be opened, read or mapped */
    CVLLM_ERR_FORMAT = -3,           /* a file is corrupt or disagrees with its config */
    CVLLM_ERR_NOT_FOUND = -4,        /* a model, file or tensor does not exist */
    CVLLM_ERR_UNSUPPORTED = -5,      /* valid input that this build does not handle */
    CVLLM_ERR_NO_MEMORY = -6,        /* an allocation or a memory budget failed */
    CVLLM_ERR_NETWORK = -7,          /* a download failed or no network is reachable */
    CVLLM_ERR_CAPACITY = -8,         /* the request cannot fit (context length, KV cache) */
    CVLLM_ERR_INTERNAL = -9,         /* a bug: please report it */
    CVLLM_ERR_UNAVAILABLE = -10,     /* the engine is shutting down */
} cvllm_status;

/* The reason for the last failure on this thread (never NULL; "" when none). */
const char *cvllm_last_error(void);

/* Releases memory that the API handed to the caller (token arrays, strings). NULL is allowed. */
void cvllm_free(void *ptr);

/* ------------------------------------------------------------------------------------------------ */
/* Tokenizer                                                                                         */

typedef struct cvllm_tokenizer cvllm_tokenizer;

/* `model` is a model folder or a hub id: from the Hugging Face cache, else the tokenizer cvllm ships
 * for that id, else downloaded (see cvllm_engine_options). */
cvllm_status cvllm_tokenizer_create(const char *model, cvllm_tokenizer **out);
void cvllm_tokenizer_destroy(cvllm_tokenizer *tok);

/* Encodes UTF-8 text (invalid UTF-8 is an error). Special tokens written in the text are matched as
 * single tokens, as Hugging Face does. *ids is the caller's (cvllm_free). */
cvllm_status cvllm_tokenize(const cvllm_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                            size_t *n_ids);

/* Decodes ids to UTF-8 text (a NUL-terminated string, cvllm_free). Invalid byte sequences produced by
 * partial tokens are replaced by U+FFFD, as Hugging Face does. */
cvllm_status cvllm_detokenize(const cvllm_tokenizer *tok, const int32_t *ids, size_t n_ids,
                              bool skip_special_tokens, char **text);

/* The ids the tokenizer's post-processor puts around a prompt when Hugging Face's add_special_tokens is
 * true (tokenizer.json's TemplateProcessing, e.g. Qwen3-Embedding's trailing <|endoftext|>), added to
 * *ids (cvllm_free'd array, grown in place); none for a tokenizer without one (the Qwen3 chat models). */
cvllm_status cvllm_tokenizer_add_special_tokens(const cvllm_tokenizer *tok, int32_t **ids, size_t *n_ids);

/* Number of ids the tokenizer knows (base vocabulary plus added tokens). */
int32_t cvllm_tokenizer_vocab_size(const cvllm_tokenizer *tok);
/* The tokenizer's tokenizer_config.json as read (compact JSON text of its object; owned by the
 * tokenizer), or NULL when the folder has none. */
const char *cvllm_tokenizer_config(const cvllm_tokenizer *tok);

/* ------------------------------------------------------------------------------------------------ */
/* Engine                                                                                            */

typedef struct cvllm_engine cvllm_engine;

/* A LoRA adapter served beside the base model: vLLM's --lora-modules NAME=PATH. PATH is a PEFT
 * adapter folder (adapter_config.json, adapter_model.safetensors). */
typedef struct cvllm_lora_module {
    const char *name;           /* what prompts name it by (cvllm_prompt.lora_name; the server's "model") */
    const char *path;
} cvllm_lora_module;

typedef struct cvllm_engine_options {
    const char *model;          /* folder or hub id (ORG/NAME), required */
    const char *tokenizer;      /* folder or hub id of the tokenizer; NULL = model */
    const char *revision;       /* hub revision for downloads; NULL = "main" */
    const char *tokenizer_revision; /* the tokenizer's (vLLM's --tokenizer-revision); NULL = revision */
    const char *download_dir;   /* vLLM's --download-dir: the Hugging Face cache folder models are looked
                                 * up in and downloaded into; NULL = $HF_HUB_CACHE, $HF_HOME/hub, ... */
    const char *hf_token;       /* vLLM's --hf-token: the bearer token for downloads; NULL = $HF_TOKEN,
                                 * else the token `huggingface-cli login` stored */
    const char *load_format;    /* "auto" (safetensors) or "dummy" (random weights); NULL = auto */
    const char *model_loader_extra_config; /* vLLM's --model-loader-extra-config, a JSON object: with
                                 * safetensors the keys vLLM's default loader takes (enable_multithread_load,
                                 * num_threads, enable_weights_track; no effect, the files are mapped),
                                 * with dummy none; another key fails create with vLLM's error */
    const char *dtype;          /* the compute dtype, vLLM's --dtype: "auto" (the checkpoint's torch_dtype),
                                 * "bfloat16" (GEMM inputs bf16, accumulation, norms, softmax, RoPE and the
                                 * residual stream f32), "float16" (runs as bfloat16: the CPU kernels have no
                                 * f16 arithmetic), "float32" (exact f32 on the stored weights); also the
                                 * storage of --load-format dummy weights; NULL = auto */
    const char *kv_cache_dtype; /* "auto" (the compute dtype), "bfloat16", "float32"; NULL = auto */
    const char *generation_config; /* "auto" (model folder), "vllm" (none), or a folder; NULL = auto */
    const char *override_generation_config; /* vLLM's --override-generation-config: a JSON object of
                                 * temperature, top_p, top_k, min_p, repetition_penalty and max_new_tokens
                                 * set over generation_config (also over "vllm"); NULL = none */
    int32_t max_model_len;      /* 0 = max_position_embeddings from config.json */
    int32_t max_num_seqs;       /* 0 = default (256) */
    int32_t max_num_batched_tokens; /* 0 = default (max(max_model_len, 2048) capped at 8192) */
    int32_t block_size;         /* KV cache block size in tokens, 0 = 16 */
    uint64_t kv_cache_memory_bytes; /* 0 = derived from gpu_memory_utilization */
    int32_t num_gpu_blocks_override; /* vLLM's --num-gpu-blocks-override: the KV cache's blocks whatever
                                 * the budget (vLLM's knob for testing preemption); at least one
                                 * max_model_len request's; 0 = from the budget */
    double gpu_memory_utilization;  /* fraction of RAM for weights + KV + activations, 0 = 0.9 */
    int32_t num_threads;        /* kernel threads, 0 = all online CPUs (divided among the job's ranks on
                                 * this machine under tensor parallelism; see data_parallel_size) */
    int32_t tensor_parallel_size; /* 0 or 1: one process. N > 1: the model is sharded over the N ranks of
                                 * the OpenMPI job this process belongs to (mpirun -np N), every rank
                                 * calling cvllm_engine_create with the same options. Rank 0 gets the
                                 * engine; on the other ranks the call serves rank 0's engine as its
                                 * worker until rank 0 destroys it, then ends the process (exit status
                                 * 0, or 1 if it failed). A step every rank takes together (loading
                                 * the model, allocating the caches) that fails on any rank ends the
                                 * workers without a word (status 0): rank 0's call returns the first
                                 * failing rank's error, and its caller reports it and sets the job's
                                 * status. Every architecture; the heads (attention and
                                 * linear-attention key heads) must split evenly over N. */
    bool enable_expert_parallel; /* with tensor_parallel_size N > 1: MoE routed experts placed whole,
                                 * num_experts / N on each rank, instead of split within each expert
                                 * (vLLM's --enable-expert-parallel); no effect on one rank */
    int32_t data_parallel_size; /* 0 or 1: this engine has the machine to itself. N > 1: it is one of N
                                 * replicas on this machine, each created with the same options (`cvllm
                                 * serve -dp N` runs them in one process behind one server): it takes 1/N
                                 * of the memory budget (of the RAM that gpu_memory_utilization counts,
                                 * or of kv_cache_memory_bytes / VLLM_CPU_KVCACHE_SPACE when given) and
                                 * 1/N of num_threads (of all online CPUs when 0), at least one thread.
                                 * With tensor_parallel_size T > 1 too, every replica is sharded: the
                                 * OpenMPI job has 1 + N·(T−1) ranks, rank 0 holds group rank 0 of
                                 * every replica (the replicas' engines) and the others are the
                                 * replicas' workers, replica d's at world ranks 1 + d·(T−1) on. */
    int32_t data_parallel_rank; /* which replica this engine is, 0 … data_parallel_size−1 (the
                                 * engine group sets it; 0 = the first) */
    int32_t max_logprobs;       /* largest logprobs / prompt_logprobs a request may ask for, 0 = 20 */
    uint64_t seed;              /* seeds dummy weights and requests without their own seed */
    bool enable_prefix_caching;
    const char *mamba_cache_mode; /* vLLM's --mamba-cache-mode: which block boundaries of a hybrid model's
                                 * prompts keep their recurrent state for prefix-cache hits: "all" (each
                                 * boundary a step's tokens complete, as many as the checkpoint slots
                                 * take), "align" (the last one a step completes: one checkpoint a
                                 * sequence a step), "none" or NULL (with prefix caching on: all, as vLLM
                                 * picks a mode then, with its warning). No effect without recurrent state */
    int32_t mamba_block_size;   /* vLLM's --mamba-block-size: tokens between those boundaries, a multiple
                                 * of block_size; 0 = block_size. Given with prefix caching off (and not
                                 * equal to max_model_len), create fails with vLLM's error */
    const char *scheduling_policy; /* vLLM's --scheduling-policy: "fcfs" or "priority"; NULL = fcfs */
    const char *speculative_config; /* vLLM's JSON, e.g. {"method":"ngram","num_speculative_tokens":3}; NULL = off */
    const char *quantization;   /* vLLM's --quantization method name; NULL = as the checkpoint says.
                                 * "ascend": an msModelSlim W8A8/W8A8_DYNAMIC checkpoint (detected by its
                                 * quant_model_description.json anyway); "fp8": a block-wise FP8 checkpoint
                                 * (detected by config.json's quantization_config). Another method, or one
                                 * the checkpoint does not match, fails the load in one line. */
    const char *logprobs_mode;  /* vLLM's --logprobs-mode, what a sampled token's logprobs are: "raw_logprobs"
                                 * (NULL; the log-softmax of the logits before any processing), "raw_logits"
                                 * (those logits), "processed_logprobs" / "processed_logits" (of the logits
                                 * the token was drawn from: after penalties, logit_bias and the masks, and
                                 * for random sampling temperature, min_p, top_k and top_p, removed tokens at
                                 * -inf). Prompt logprobs are always raw logprobs, as in vLLM. */
    const char *hf_overrides;   /* vLLM's --hf-overrides: a JSON object laid over config.json (each key
                                 * replaces the config's; text_config's keys one by one), e.g.
                                 * '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                 * "original_max_position_embeddings": 32768}}'; NULL = none */
    const char *rope_scaling;   /* vLLM's --rope-scaling (JSON object) and --rope-theta (> 0; 0 = none):
                                 * config.json's rope_scaling and rope_theta, over hf_overrides */
    double rope_theta;
    bool enable_lora;           /* vLLM's --enable-lora: serve lora_modules, and those loaded later
                                 * (cvllm_engine_load_lora), beside the base model */
    const cvllm_lora_module *lora_modules; /* [n_lora_modules], read at create (names unique); only with
                                 * enable_lora and without tensor parallelism. Adapters may target the
                                 * linears of attention, the dense MLP or shared expert, the linear-
                                 * attention projections and the MoE router, float or quantized (W8A8,
                                 * FP8: the adapter reads the unquantized input); anything else fails
                                 * create in one line */
    int32_t n_lora_modules;
    int32_t max_loras;          /* vLLM's --max-loras: distinct adapters in one batch, 0 = 1 */
    int32_t max_lora_rank;      /* vLLM's --max-lora-rank (1, 8, 16, 32, 64, 128, 256, 320 or 512): the
                                 * largest r an adapter may have, 0 = 16 */
    const char *runner;         /* vLLM's --runner: "generate" (the engine generates text), "pooling" (it
                                 * embeds prompts, cvllm_engine_add_pooling_request, and generates nothing:
                                 * vLLM's --convert embed of a *ForCausalLM model, as Qwen3-Embedding is
                                 * served), or "auto" (NULL): pooling for a sentence-transformers folder
                                 * (modules.json with a Pooling module) or a *ForSequenceClassification
                                 * architecture (a classifier or reranker, cvllm_engine_pooling_task),
                                 * else generate */
    const char *convert;        /* vLLM's --convert: "embed" or "classify" makes the pooling runner embed
                                 * or classify whatever the architecture says; NULL, "auto" or "none":
                                 * classify a *ForSequenceClassification architecture, else embed */
    const char *pooler_config;  /* vLLM's --pooler-config, a JSON object: "pooling_type" (or
                                 * "seq_pooling_type") "LAST", "CLS" or "MEAN", "use_activation" (L2-
                                 * normalize, or a classifier's activation), "dimensions" (the default of
                                 * requests), "task" (the model's own, or "token_embed" / "token_classify":
                                 * ALL pooling, one result a prompt token), "logit_mean" and "logit_sigma"
                                 * (a classifier's scores become (x − mean) / sigma),
                                 * "enable_chunked_processing" and "max_embed_len" (long embedding inputs:
                                 * cvllm_engine_embed_chunking); NULL = the folder's
                                 * sentence-transformers files, else LAST, normalized */
} cvllm_engine_options;

void cvllm_engine_options_default(cvllm_engine_options *opts);

cvllm_status cvllm_engine_create(const cvllm_engine_options *opts, cvllm_engine **out);

/* The checks cvllm_engine_create makes before it reads or makes any weight, without creating the
 * engine: the options, the model at hand (its weights too, unless load_format is "dummy"), its
 * config files, that its tokenizer's file is there, the speculative method, max_model_len, the dtypes, the quantization, that its heads
 * (and experts, with enable_expert_parallel) split over tensor_parallel_size ranks, and that the
 * model fits in memory. Returns the error create would return for them (cvllm_last_error), else
 * CVLLM_OK. Needs no MPI job: with tensor_parallel_size N > 1 outside one, it checks a shard as the
 * ranks of the job cvllm's launcher would start on this machine (1 + data_parallel_size·(N−1) of
 * them) would. A launcher calls it to refuse a job once and at once, before starting its ranks. */
cvllm_status cvllm_engine_check(const cvllm_engine_options *opts);
void cvllm_engine_destroy(cvllm_engine *engine);

/* On rank 0 of a tensor-parallel job: true once the group of ranks of every replica of the job
 * (data_parallel_size of them) has let its workers go, because a step they took together failed
 * (cvllm_engine_create returned its error) or its engine was destroyed; the workers then end by
 * themselves, with status 0. So the process may end too, and a launcher need not end the job's
 * other ranks: cvllm's own passes rank 0's status outside MPI's, as mpirun waits out its grace for
 * them on a failing one (cli/launch.c). False anywhere else, and while a worker may still wait for
 * this process (a replica not created because an earlier one failed). */
bool cvllm_job_workers_released(void);

/* The engine's tokenizer; owned by the engine. */
const cvllm_tokenizer *cvllm_engine_tokenizer(const cvllm_engine *engine);

/* Effective limits after defaults and config were applied. */
int32_t cvllm_engine_max_model_len(const cvllm_engine *engine);
/* generation_config.json's max_new_tokens (which caps every request, as in vLLM), or -1. */
int32_t cvllm_engine_generation_max_tokens(const cvllm_engine *engine);
int32_t cvllm_engine_vocab_size(const cvllm_engine *engine); /* rows of the logits */

/* Speculative decoding counters since the engine started (vLLM's vllm:spec_decode_* metrics). */
typedef struct cvllm_spec_decode_stats {
    uint64_t num_drafts;          /* verification passes that carried drafts */
    uint64_t num_draft_tokens;
    uint64_t num_accepted_tokens;
} cvllm_spec_decode_stats;

void cvllm_engine_spec_decode_stats(const cvllm_engine *engine, cvllm_spec_decode_stats *stats);

/* ------------------------------------------------------------------------------------------------ */
/* Structured outputs                                                                                */

/* A constraint on a request's output: vLLM's structured_outputs, one kind per request. */
typedef enum cvllm_constraint_kind {
    CVLLM_CONSTRAINT_JSON = 1,    /* spec: a JSON schema, as JSON text */
    CVLLM_CONSTRAINT_JSON_OBJECT, /* any JSON object or array (vLLM's json_object); spec unused */
    CVLLM_CONSTRAINT_REGEX,       /* spec: a regular expression the whole output matches */
    CVLLM_CONSTRAINT_CHOICE,      /* the output is exactly one of `choices` */
    CVLLM_CONSTRAINT_GRAMMAR,     /* spec: an EBNF grammar (GBNF syntax, as llama.cpp and xgrammar read
                                   * it) whose start rule is "root" */
    CVLLM_CONSTRAINT_STRUCTURAL_TAG, /* spec: a structural tag as JSON text (vLLM's structural_tag):
                                      * {"type": "structural_tag", "format": ...}, or the legacy
                                      * {"structures": [{"begin", "schema", "end"}], "triggers": [...]} */
} cvllm_constraint_kind;

typedef struct cvllm_constraint {
    cvllm_constraint_kind kind;
    const char *spec;
    size_t spec_len;              /* 0 = strlen(spec) */
    const char *const *choices;
    size_t n_choices;
    bool disable_any_whitespace;  /* JSON: no whitespace between tokens */
    bool disable_additional_properties; /* JSON schema: an object schema that does not mention
                                         * additionalProperties admits no other properties. cvllm always
                                         * does so (as xgrammar's strict mode, vLLM's default backend); the
                                         * field is accepted for vLLM's spelling */
    const char *whitespace_pattern; /* JSON: a regex for the whitespace between tokens; NULL = default */
} cvllm_constraint;

/* A compiled constraint: immutable, shared by every request that uses it, reference-counted. */
typedef struct cvllm_grammar cvllm_grammar;

/* Compiles a constraint against the engine's vocabulary. Unlike the rest of the engine API this may
 * be called from any thread while another thread drives the engine: compiling a large schema takes
 * time, and the server does it on its request threads so that no step waits for it. Compilations
 * are cached per engine by constraint, so a repeated constraint costs a lookup. *out is a reference
 * for the caller (cvllm_grammar_release). An invalid constraint, or one past the engine's limits
 * (size, nesting depth), fails with CVLLM_ERR_INVALID_ARGUMENT and a message saying what is wrong and
 * where. */
cvllm_status cvllm_grammar_compile(const cvllm_engine *engine, const cvllm_constraint *constraint, cvllm_grammar **out);
void cvllm_grammar_release(cvllm_grammar *grammar); /* NULL is allowed */

/* ------------------------------------------------------------------------------------------------ */
/* Requests                                                                                          */

typedef struct cvllm_sampling_params {
    int32_t n;                   /* completions per prompt (>= 1) */
    float temperature;           /* 0 = greedy */
    float top_p;                 /* (0, 1] */
    int32_t top_k;               /* 0 or -1 = off */
    float min_p;                 /* [0, 1] */
    float repetition_penalty;    /* > 0, 1 = off */
    float presence_penalty;      /* [-2, 2] */
    float frequency_penalty;     /* [-2, 2] */
    int32_t max_tokens;          /* -1 = until max_model_len */
    int32_t min_tokens;
    bool ignore_eos;
    bool has_seed;
    int64_t seed;
    const int32_t *stop_token_ids; /* in addition to the model's eos ids */
    size_t n_stop_token_ids;
    const char *const *stop;     /* stop strings */
    size_t n_stop;
    bool include_stop_str_in_output;
    bool skip_special_tokens;
    bool spaces_between_special_tokens;
    int32_t logprobs;            /* -1 = none; N >= 0: top-N of the raw logits plus the sampled token */
    int32_t prompt_logprobs;     /* -1 = none; N >= 0 as above for each prompt position */
    const int32_t *logit_bias_ids;
    const float *logit_bias_values;
    size_t n_logit_bias;
    const int32_t *allowed_token_ids; /* vLLM's allowed_token_ids: only these ids can be sampled; NULL = any
                                       * (non-NULL with no entries is an error, as in vLLM) */
    size_t n_allowed_token_ids;
    const char *const *bad_words; /* vLLM's bad_words: token sequences that are never generated (each word
                                   * tokenized as given and with a leading space, as vLLM does); a word's
                                   * last token is banned where the output (not the prompt) ends with its
                                   * other tokens */
    size_t n_bad_words;
    int32_t priority;            /* vLLM's priority: with scheduling policy "priority" a lower value is
                                  * scheduled first (ties by arrival); must be 0 under "fcfs" */
    const cvllm_grammar *grammar; /* structured outputs: every token keeps the output a prefix of a
                                   * sentence of the grammar, and eos comes exactly when it is complete
                                   * (a finished sentence forces eos); NULL = none. The request holds its
                                   * own reference. */
    int32_t grammar_after_token_id; /* -1: the grammar applies from the first output token; else from the
                                     * token after the first output of this id (the end of a reasoning
                                     * section, such as </think>) */
} cvllm_sampling_params;

/* vLLM's neutral defaults, overridden by the model's generation_config.json (temperature, top_k,
 * top_p, min_p, repetition_penalty) unless the engine was created with generation_config "vllm". */
void cvllm_sampling_params_default(const cvllm_engine *engine, cvllm_sampling_params *params);

/* A prompt is text or token ids (exactly one of them). */
typedef struct cvllm_prompt {
    const char *text;
    size_t text_len;             /* 0 = strlen(text) */
    const int32_t *token_ids;
    size_t n_token_ids;
    const char *cache_salt;      /* isolates this prompt's prefix-cache entries (vLLM's cache_salt); NULL = none */
    const char *lora_name;       /* runs with this adapter of the engine's (lora_modules, or loaded with
                                  * cvllm_engine_load_lora; vLLM's LoRARequest); NULL = the base model */
    bool add_special_tokens;     /* text: with the special tokens of the tokenizer's post-processor
                                  * (cvllm_tokenizer_add_special_tokens), as vLLM's add_special_tokens */
} cvllm_prompt;

/* Queues a request. *request_id receives an engine-unique id. Fails (and queues nothing) when the
 * prompt or the parameters are invalid or the prompt cannot fit in max_model_len. */
cvllm_status cvllm_engine_add_request(cvllm_engine *engine, const cvllm_prompt *prompt,
                                      const cvllm_sampling_params *params, uint64_t *request_id);

/* What a pooling request returns (vLLM's PoolingParams). */
typedef struct cvllm_pooling_params {
    int32_t dimensions;          /* 0 = the engine's default (pooler_config's, else the whole vector); else
                                  * the first `dimensions` values, for a model config.json says was trained
                                  * for it (is_matryoshka, matryoshka_dimensions) */
    int32_t normalize;           /* -1 = the engine's default; 0 = as pooled; 1 = the activation (vLLM's
                                  * use_activation): an embedding L2-normalized, class scores through the
                                  * task's activation (a sigmoid for one label, a softmax over several) */
    const char *task;            /* NULL = the engine's (cvllm_engine_pooling_task); on a classifier also
                                  * "score", the same scores through a cross-encoder's activation (the
                                  * folder's sentence-transformers activation_fn), for one-label models */
} cvllm_pooling_params;

void cvllm_pooling_params_default(cvllm_pooling_params *params); /* {0, -1, NULL} */

/* True for an engine created with runner "pooling" (or "auto" on a sentence-transformers folder). */
bool cvllm_engine_is_pooling(const cvllm_engine *engine);
/* What a pooling engine returns: "embed" (a vector), "classify" (one score a label: a sequence
 * classification model — a score.weight head, or the original Qwen3-Reranker with config.json's
 * classifier_from_token), their token-level forms "token_embed" and "token_classify" (pooler_config's
 * task: one row a prompt token), or NULL for an engine that generates. */
const char *cvllm_engine_pooling_task(const cvllm_engine *engine);
/* Length of the vectors a pooling engine returns by default: the model's hidden size, for classify
 * the number of labels (1 for a reranker); for a token task, the width of each prompt token's row. */
int32_t cvllm_engine_embedding_size(const cvllm_engine *engine);
/* An embedding model's input type i (Cohere's input_type: config.json's task_instructions, else the
 * prompts of config_sentence_transformers.json, such as Qwen3-Embedding's "query") and, in *prompt, the
 * prefix its texts take; NULL past the last one. Owned by the engine. */
const char *cvllm_engine_input_type(const cvllm_engine *engine, int32_t i, const char **prompt);
/* vLLM's chunked processing of long embedding inputs (--pooler-config enable_chunked_processing and
 * max_embed_len), which a server applies to its embedding requests: true when an input longer than
 * max_model_len is to be embedded in chunks of max_model_len tokens, each a pooling request, whose
 * vectors are averaged weighted by their lengths. *max_embed_len (may be NULL) is the longest input
 * an embedding request may have, or 0 when the config sets none (with chunking: no limit; without:
 * max_model_len). False and 0 on an engine that generates. */
bool cvllm_engine_embed_chunking(const cvllm_engine *engine, int64_t *max_embed_len);
/* A classifier's name for label i (config.json's id2label, else "LABEL_i"); NULL when the engine
 * does not classify or i is out of range. Owned by the engine. */
const char *cvllm_engine_class_label(const cvllm_engine *engine, int32_t i);

/* Queues a pooling request on a pooling engine (params NULL: the defaults): the prompt runs through the model (chunked as any
 * prefill, sharing the prefix cache) and its finished output carries the pooled vector
 * (cvllm_request_output.embedding); nothing is generated. Fails as cvllm_engine_add_request does,
 * with CVLLM_ERR_INVALID_ARGUMENT on an engine that generates (and add_request fails on one that
 * pools), and for dimensions the model does not support. A prompt may be max_model_len tokens long. */
cvllm_status cvllm_engine_add_pooling_request(cvllm_engine *engine, const cvllm_prompt *prompt,
                                              const cvllm_pooling_params *params, uint64_t *request_id);

/* Loads a LoRA adapter while the engine runs (vLLM's /v1/load_lora_adapter): prompts may name it
 * once this returns. With `replace`, an adapter of the same name is replaced (vLLM's load_inplace);
 * otherwise that name fails with CVLLM_ERR_INVALID_ARGUMENT. Requests already running keep the
 * adapter they started with, and the prefix cache never mixes the two. The adapter is read (from a
 * folder or the hub, as lora_modules are) and checked against the model as create checks them, with
 * the same errors; CVLLM_ERR_INVALID_ARGUMENT without enable_lora. Thread-safe: any thread, also
 * while another steps the engine or adds requests. */
cvllm_status cvllm_engine_load_lora(cvllm_engine *engine, const cvllm_lora_module *module, bool replace);
/* Unloads an adapter: prompts naming it fail from then on (CVLLM_ERR_NOT_FOUND), requests already
 * running finish with it, and its memory goes with the last of them. CVLLM_ERR_NOT_FOUND when no
 * adapter of that name is loaded. Thread-safe as cvllm_engine_load_lora. */
cvllm_status cvllm_engine_unload_lora(cvllm_engine *engine, const char *name);

/* Stops a request at once and frees its cache; its last output reports finish reason "abort". */
cvllm_status cvllm_engine_abort_request(cvllm_engine *engine, uint64_t request_id);

bool cvllm_engine_has_unfinished(const cvllm_engine *engine);

typedef enum cvllm_finish_reason {
    CVLLM_FINISH_NONE = 0,       /* still running */
    CVLLM_FINISH_STOP,           /* eos, a stop token id or a stop string */
    CVLLM_FINISH_LENGTH,         /* max_tokens or max_model_len */
    CVLLM_FINISH_ABORT,
    CVLLM_FINISH_ERROR,          /* the engine failed while running it */
} cvllm_finish_reason;

const char *cvllm_finish_reason_name(cvllm_finish_reason reason); /* "stop", "length", "abort", "error", NULL */

typedef struct cvllm_logprob {
    int32_t token_id;
    float logprob;
    int32_t rank;                /* 1 = most likely */
} cvllm_logprob;

/* Logprobs at one position: the top-N entries (most likely first) and, separately, the token that
 * was actually sampled or given there (it may or may not also be among the top-N). */
typedef struct cvllm_position_logprobs {
    cvllm_logprob chosen;
    const cvllm_logprob *top;
    int32_t n_top;
} cvllm_position_logprobs;

typedef struct cvllm_completion_output {
    int32_t index;
    const int32_t *token_ids;    /* all tokens generated so far */
    size_t n_token_ids;
    const char *text;            /* all text so far (NUL-terminated), stop string trimmed per params */
    size_t text_len;
    const cvllm_position_logprobs *logprobs; /* n_token_ids entries, or NULL when not requested */
    size_t n_new_token_ids;      /* how many of token_ids arrived in this step */
    size_t new_text_offset;      /* text[new_text_offset..] arrived in this step */
    cvllm_finish_reason finish_reason;
    int32_t stop_token_id;       /* the stop/eos id that finished it, or -1 */
    const char *stop_str;        /* the stop string that finished it, or NULL */
} cvllm_completion_output;

typedef struct cvllm_request_output {
    uint64_t request_id;
    const int32_t *prompt_token_ids;
    size_t n_prompt_token_ids;
    /* n_prompt_token_ids entries or NULL; entry 0 has no distribution (n_top = 0, chosen.rank = 0). */
    const cvllm_position_logprobs *prompt_logprobs;
    size_t n_cached_tokens;      /* prompt tokens served from the prefix cache */
    const cvllm_completion_output *outputs;
    int32_t n_outputs;
    bool finished;               /* all completions finished; the request is gone after this step */
    const float *embedding;      /* a finished pooling request's vector (n_embedding floats; for classify
                                  * one score a label; for a token task one row a prompt token, each
                                  * cvllm_engine_embedding_size wide), else NULL */
    size_t n_embedding;
} cvllm_request_output;

/* Runs one scheduling step (one forward pass over a batch of requests). On return *outputs points to
 * *n_outputs request outputs that changed in this step; they belong to the engine (see top). */
cvllm_status cvllm_engine_step(cvllm_engine *engine, const cvllm_request_output *const **outputs,
                               size_t *n_outputs);

/* Beam search as vLLM's LLM.beam_search runs it: each step asks the engine for one token of every
 * live beam of every prompt (one batch), with the top 2 × beam_width logprobs; eos ends a hypothesis
 * unless ignore_eos; the best beam_width by cumulative logprob over (prompt + output length) **
 * length_penalty come back, best first. Prompts are token ids. The call steps the engine itself, so
 * the engine must have no unfinished requests; with prefix caching on, a step costs about one token
 * a beam. */
typedef struct cvllm_beam_search_params {
    int32_t beam_width;          /* >= 1 */
    int32_t max_tokens;          /* >= 1 */
    bool ignore_eos;
    float temperature;           /* of each step's sampled candidate (vLLM's offline default: 0) */
    float length_penalty;        /* vLLM's default: 1 */
    bool include_stop_str_in_output; /* an eos-finished sequence keeps eos in token_ids (never in text) */
} cvllm_beam_search_params;

typedef struct cvllm_beam_sequence {
    int32_t *token_ids;          /* output tokens */
    size_t n_token_ids;
    char *text;                  /* decoded with special tokens kept, a final eos left out */
    double cumulative_logprob;
    cvllm_finish_reason finish_reason; /* STOP (eos) or LENGTH */
} cvllm_beam_sequence;

typedef struct cvllm_beam_search_output {
    cvllm_beam_sequence *sequences; /* at most beam_width, best first */
    int32_t n_sequences;
} cvllm_beam_search_output;

/* outputs[i] is prompt i's (caller's array of n_prompts; free with cvllm_beam_search_output_free).
 * On failure the outputs are empty. */
cvllm_status cvllm_engine_beam_search(cvllm_engine *engine, const cvllm_prompt *prompts, size_t n_prompts,
                                      const cvllm_beam_search_params *params, cvllm_beam_search_output *outputs);
void cvllm_beam_search_output_free(cvllm_beam_search_output *outputs, size_t n_prompts);

#ifdef __cplusplus
}
#endif

#endif /* CVLLM_H */
