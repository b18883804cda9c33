/*
 * pooler.h — how a pooling engine turns a prompt's hidden states into one result (vLLM's pooling
 * runner): a vector (--convert embed, as it serves Qwen3-Embedding) or one score a label (classify,
 * as it serves sequence classifiers and the Qwen3-Reranker).
 *
 * The model runs its ordinary forward pass and hands back the final-normed hidden state of every
 * token of the batch (cv_batch.hidden_out); the pooler keeps what its type needs of each step's rows
 * for a sequence — the last prompt token's (LAST), the first's (CLS) or the running sum (MEAN) — so
 * chunked prefill pools as one pass does. At the end an embedder takes the first `dimensions` values
 * (matryoshka) and L2-normalizes them when asked, in vLLM's order: truncate, then normalize; a
 * classifier multiplies the pooled state by its head and applies the task's activation.
 *
 * Configuration, highest first, as vLLM resolves it: --pooler-config's JSON; the model folder's
 * sentence-transformers files (modules.json: a Normalize module means normalize; the Pooling
 * module's config.json: pooling_mode_lasttoken / _cls_token / _mean_tokens); else LAST, normalized.
 * Whether `dimensions` may be asked for is config.json's is_matryoshka / matryoshka_dimensions; a
 * classifier's labels, head and activations come from config.json (see cv_pooler).
 */
#ifndef CV_ENGINE_POOLER_H
#define CV_ENGINE_POOLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cvllm.h"
#include "loader/config.h"
#include "loader/weights.h"
#include "tokenizer/tokenizer.h"

/* ALL keeps every prompt token's row: the token tasks' pooling. */
typedef enum cv_pooling_type { CV_POOL_LAST, CV_POOL_CLS, CV_POOL_MEAN, CV_POOL_ALL } cv_pooling_type;

/* What the pooler makes: a vector (vLLM's embed task), or class scores (its classify task): a head of
 * num_labels rows over the pooled hidden state, then an activation. The head is the checkpoint's
 * score.weight (a *ForSequenceClassification conversion such as the Qwen3-Reranker-seq-cls ones), or
 * rows of the output head picked by config.json's classifier_from_token, as vLLM converts a causal
 * LM: method "from_2_way_softmax" (what is_original_qwen3_reranker sets) makes one label,
 * row(yes) − row(no); "no_post_processing" one label a token. */
typedef enum cv_pooling_task { CV_TASK_EMBED, CV_TASK_CLASSIFY } cv_pooling_task;

/* A classifier's activations (vLLM's pooler activations): CLASSIFY is a sigmoid for one label and a
 * softmax over several. */
typedef enum cv_pool_act { CV_ACT_CLASSIFY, CV_ACT_SIGMOID, CV_ACT_IDENTITY, CV_ACT_TANH } cv_pool_act;

typedef struct cv_pooler {
    cv_pooling_task task;
    bool tokenwise;              /* vLLM's token_embed / token_classify (--pooler-config task): one result a
                                  * prompt token, ALL pooling */
    cv_pooling_type type;
    bool normalize;              /* default of requests that do not say (for classify: the activation) */
    int32_t dimensions;          /* --pooler-config's default for requests that do not say; 0: none */
    int32_t hidden;              /* width of the hidden states pooled */
    int32_t vocab;               /* rows of the model's output head */
    bool matryoshka;             /* requests may ask for fewer dimensions */
    int32_t *matryoshka_dims;    /* the only ones allowed when the model lists them; NULL: any in [1, hidden] */
    int32_t n_matryoshka_dims;
    char **prompt_names, **prompt_texts; /* an embedder's input types and their prompt prefixes */
    int32_t n_prompts;
    /* classify */
    int32_t num_labels;
    char **labels;               /* [num_labels]: config.json's id2label, else LABEL_i as transformers names them */
    float *head;                 /* [num_labels][hidden], set by cv_pooler_load_head */
    char *method;                /* "from_2_way_softmax", "no_post_processing", or NULL: score.weight */
    char **label_tokens;         /* classifier_from_token, for a method */
    int32_t n_label_tokens;
    cv_pool_act act_classify;    /* the classify task's activation (config.json's problem_type) */
    cv_pool_act act_score;       /* the score task's (a cross-encoder's sentence-transformers activation_fn) */
    float logit_mean, logit_sigma; /* --pooler-config's: scores become (x − mean) / sigma first (0, 1: none) */
    /* --pooler-config's enable_chunked_processing and max_embed_len, which the server applies to
     * embedding requests (cvllm_engine_embed_chunking): the pooler itself never sees a chunk */
    bool chunked;
    int64_t max_embed_len;       /* 0: not set */
} cv_pooler;

/* True for a *ForSequenceClassification architecture: vLLM's classify task, on the pooling runner
 * whatever --runner auto would pick otherwise. */
bool cv_pooler_config_classifies(const cv_model_config *cfg);

/* True when the folder is a sentence-transformers model with a Pooling module (vLLM's --runner auto
 * picks pooling for it). */
bool cv_pooler_folder_pools(const char *model_dir);

/* Resolves the pooler of the model in model_dir (cfg its config) with --pooler-config's JSON
 * (NULL: none), as a classifier or an embedder. Errors name the file or key: a malformed file, an
 * unknown key, a pooling type cvllm does not run (ALL, STEP, MAX, ...). */
int cv_pooler_init(cv_pooler *p, const char *model_dir, const char *pooler_config, const cv_model_config *cfg,
                   bool classify);
void cv_pooler_free(cv_pooler *p);
const char *cv_pooling_type_name(cv_pooling_type t);

/* A classifier's head, read from the weights: score.weight, or the rows of head_tensor (the model's
 * output head: lm_head.weight, or its token embedding when tied) for the label tokens, looked up in
 * the tokenizer. Errors name the tensor or token. Nothing to do for an embedder. */
int cv_pooler_load_head(cv_pooler *p, cv_weight_source *weights, const char *head_tensor, const cv_tokenizer *tok);

/* The task's name: "embed", "classify", "token_embed" or "token_classify". */
const char *cv_pooler_task_name(const cv_pooler *p);
/* Width of one result row: the hidden size, or the label count for classify. */
int32_t cv_pooler_width(const cv_pooler *p);
/* Floats a request's accumulator holds for a prompt of n_prompt tokens. */
size_t cv_pooler_acc_size(const cv_pooler *p, size_t n_prompt);

/* Checks a request's parameters against the pooler (vLLM's messages, `model` the served name) and
 * resolves its defaults into *out (its task one of the static names "embed", "classify", "score"). */
int cv_pooler_resolve(const cv_pooler *p, const cvllm_pooling_params *in, const char *model, cvllm_pooling_params *out);

/* Folds rows [0, n) of one step — the hidden states of prompt positions [first, first + n) of a
 * prompt of n_prompt tokens — into acc[hidden] (zeroed by the caller before position 0). */
void cv_pooler_take(const cv_pooler *p, float *acc, const float *rows, size_t first, size_t n, size_t n_prompt);
/* Turns acc (cv_pooler_acc_size floats) into the request's result in place: for embed MEAN's
 * division, truncation and normalization; for classify the head's scores and their activation; for
 * a token task that for every prompt token, rows of cv_pooler_width one after the other. Returns
 * its length. */
size_t cv_pooler_finish(const cv_pooler *p, float *acc, size_t n_prompt, const cvllm_pooling_params *params);

#endif
