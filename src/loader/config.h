/*
 * config.h — what a model folder's config.json and generation_config.json say.
 *
 * The fields every Qwen3-family architecture shares are parsed here into cv_model_config; anything
 * one architecture alone needs (MoE widths, linear-attention shapes) its model file reads from
 * `text`, the JSON object that holds the text model's fields (the root, or a nested "text_config").
 * Both RoPE spellings are accepted: top-level rope_theta/rope_scaling, and the newer
 * rope_parameters {rope_theta, rope_type, ...}.
 */
#ifndef CV_CONFIG_H
#define CV_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"

#define CV_MAX_EOS 16

typedef enum cv_rope_type { CV_ROPE_DEFAULT = 0, CV_ROPE_LINEAR, CV_ROPE_DYNAMIC, CV_ROPE_YARN } cv_rope_type;

typedef struct cv_rope_config {
    cv_rope_type type;
    double theta;
    double factor;                  /* scaling factor (linear, dynamic, yarn); 1 when none */
    int32_t original_max_position;  /* yarn / dynamic */
    double beta_fast, beta_slow;    /* yarn, defaults 32 and 1 */
    double attention_factor;        /* yarn; 0 = derived (0.1 ln(factor) + 1) */
    double partial_rotary_factor;   /* fraction of head_dim that rotates, 1 when absent */
} cv_rope_config;

typedef struct cv_model_config {
    char architecture[128];         /* architectures[0] */
    char model_type[64];
    int32_t hidden_size;
    int32_t num_hidden_layers;
    int32_t num_attention_heads;
    int32_t num_key_value_heads;    /* defaults to num_attention_heads */
    int32_t head_dim;               /* explicit, else hidden_size / num_attention_heads */
    int32_t intermediate_size;
    int32_t vocab_size;
    int32_t max_position_embeddings;
    double rms_norm_eps;
    bool tie_word_embeddings;
    bool attention_bias;
    cv_rope_config rope;
    cv_dtype torch_dtype;           /* "torch_dtype" or "dtype"; bf16 when absent */
    int32_t bos_token_id;           /* -1 when absent */
    int32_t eos_token_ids[CV_MAX_EOS];
    int n_eos_token_ids;
    json_t *root;                   /* the whole config.json (owned) */
    json_t *text;                   /* root or root.text_config (borrowed from root) */
} cv_model_config;

/* Reads DIR/config.json, with `overrides` (JSON object text, or NULL) laid over it as vLLM's
 * --hf-overrides are: each key replaces the config's, except that an object given for text_config
 * replaces the keys it names in the config's text_config (the language model's settings in Qwen's
 * multimodal configs) and leaves the rest. Errors name the file (and the overrides) and the field. */
int cv_model_config_load(const char *dir, const char *overrides, cv_model_config *cfg);
/* Parses config.json text (for tests and the fuzzer); `origin` names it in messages. */
int cv_model_config_parse(const char *json, size_t len, const char *origin, cv_model_config *cfg);
void cv_model_config_free(cv_model_config *cfg);

typedef struct cv_generation_config {
    int32_t eos_token_ids[CV_MAX_EOS];
    int n_eos_token_ids;
    /* Sampling defaults; has_* says whether the file set them. */
    bool has_temperature, has_top_k, has_top_p, has_min_p, has_repetition_penalty, has_max_new_tokens;
    float temperature, top_p, min_p, repetition_penalty;
    int32_t top_k, max_new_tokens;
} cv_generation_config;

/* Reads DIR/generation_config.json; a missing file yields an empty config (not an error). */
int cv_generation_config_load(const char *dir, cv_generation_config *gen);
int cv_generation_config_parse(const char *json, size_t len, const char *origin,
                               cv_generation_config *gen);

#endif
