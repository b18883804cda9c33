/*
 * pooler.h — how a pooling engine turns a prompt's hidden states into one vector (vLLM's pooling
 * runner with --convert embed, as it serves Qwen3-Embedding).
 *
 * The model runs its ordinary forward pass and hands back the final-normed hidden state of every
 * token of the batch (cv_batch.hidden_out); the pooler keeps what its type needs of each step's rows
 * for a sequence — the last prompt token's (LAST), the first's (CLS) or the running sum (MEAN) — so
 * chunked prefill pools as one pass does. At the end it takes the first `dimensions` values
 * (matryoshka) and L2-normalizes them when asked, in vLLM's order: truncate, then normalize.
 *
 * Configuration, highest first, as vLLM resolves it: --pooler-config's JSON; the model folder's
 * sentence-transformers files (modules.json: a Normalize module means normalize; the Pooling
 * module's config.json: pooling_mode_lasttoken / _cls_token / _mean_tokens); else LAST, normalized.
 * Whether `dimensions` may be asked for is config.json's is_matryoshka / matryoshka_dimensions.
 */
#ifndef CV_ENGINE_POOLER_H
#define CV_ENGINE_POOLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cvllm.h"
#include "loader/config.h"
#include "tokenizer/tokenizer.h"

typedef enum cv_pooling_type { CV_POOL_LAST, CV_POOL_CLS, CV_POOL_MEAN } cv_pooling_type;

/* What the pooler makes: a vector (vLLM's embed task), or a relevance score (its classify task as it
 * runs the original Qwen3-Reranker: config.json's classifier_from_token [no, yes] turns the lm_head's
 * two rows into one label, logit(yes) − logit(no) of the last token, through a sigmoid). */
typedef enum cv_pooling_task { CV_TASK_EMBED, CV_TASK_CLASSIFY } cv_pooling_task;

typedef struct cv_pooler {
    cv_pooling_task task;
    char *label_tokens[2];       /* classify: classifier_from_token (no, yes) */
    int32_t label_ids[2];        /* their ids, set by the engine once the tokenizer is loaded */
    cv_pooling_type type;
    bool normalize;              /* default of requests that do not say */
    int32_t dimensions;          /* --pooler-config's default for requests that do not say; 0: none */
    int32_t hidden;              /* width of the hidden states pooled */
    bool matryoshka;             /* requests may ask for fewer dimensions */
    int32_t *matryoshka_dims;    /* the only ones allowed when the model lists them; NULL: any in [1, hidden] */
    int32_t n_matryoshka_dims;
} cv_pooler;

/* True for a *ForSequenceClassification architecture: vLLM's classify task, on the pooling runner
 * whatever --runner auto would pick otherwise. */
bool cv_pooler_config_classifies(const cv_model_config *cfg);

/* True when the folder is a sentence-transformers model with a Pooling module (vLLM's --runner auto
 * picks pooling for it). */
bool cv_pooler_folder_pools(const char *model_dir);

/* Resolves the pooler of the model in model_dir (cfg its config) with --pooler-config's JSON
 * (NULL: none). Errors name the file or key: a malformed file, an unknown key, a pooling type cvllm
 * does not run (ALL, STEP, MAX, ...). */
int cv_pooler_init(cv_pooler *p, const char *model_dir, const char *pooler_config, const cv_model_config *cfg);
void cv_pooler_free(cv_pooler *p);
const char *cv_pooling_type_name(cv_pooling_type t);

/* The ids of the classify task's label tokens from the tokenizer (vLLM's convert_tokens_to_ids). */
int cv_pooler_bind_labels(cv_pooler *p, const cv_tokenizer *tok);
/* The classify task's score from the logits of a prompt's last token (normalize: the sigmoid). */
float cv_pooler_score(const cv_pooler *p, const float *logits, bool normalize);

/* Checks a request's parameters against the pooler (vLLM's messages, `model` the served name) and
 * resolves its defaults into *out. */
int cv_pooler_resolve(const cv_pooler *p, const cvllm_pooling_params *in, const char *model, cvllm_pooling_params *out);

/* Folds rows [0, n) of one step — the hidden states of prompt positions [first, first + n) of a
 * prompt of n_prompt tokens — into acc[hidden] (zeroed by the caller before position 0). */
void cv_pooler_take(const cv_pooler *p, float *acc, const float *rows, size_t first, size_t n, size_t n_prompt);
/* Turns acc into the request's vector in place (MEAN's division, truncation, normalization); returns
 * its length. */
size_t cv_pooler_finish(const cv_pooler *p, float *acc, size_t n_prompt, const cvllm_pooling_params *params);

#endif
