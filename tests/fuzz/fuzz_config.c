/*
 * fuzz_config.c — libFuzzer target for the config.json and generation_config.json parsers.
 *
 * The same input goes to both. An accepted config.json must satisfy what the model files rely on
 * without re-checking: positive sizes, a head_dim, heads divisible by KV heads, a positive RoPE
 * theta, at most CV_MAX_EOS eos ids; a rejected one leaves a message and nothing to free.
 */
#include <stdint.h>
#include <stdlib.h>

#include "base/error.h"
#include "loader/config.h"

static void require(int cond) {
    if (!cond) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cv_model_config cfg;
    if (cv_model_config_parse((const char *)data, size, "fuzz/config.json", &cfg) == 0) {
        require(cfg.hidden_size > 0 && cfg.num_hidden_layers > 0 && cfg.vocab_size > 0);
        require(cfg.head_dim > 0 && cfg.num_key_value_heads > 0);
        require(cfg.num_attention_heads % cfg.num_key_value_heads == 0);
        require(cfg.rope.theta > 0 && cfg.rope.factor > 0);
        require(cfg.rope.partial_rotary_factor > 0 && cfg.rope.partial_rotary_factor <= 1);
        require(cfg.n_eos_token_ids >= 0 && cfg.n_eos_token_ids <= CV_MAX_EOS);
        require(cfg.root != NULL && cfg.text != NULL);
        cv_model_config_free(&cfg);
    } else {
        require(cfg.root == NULL && cv_error_message()[0] != '\0');
    }
    cv_generation_config gen;
    if (cv_generation_config_parse((const char *)data, size, "fuzz/generation_config.json", &gen) == 0)
        require(gen.n_eos_token_ids >= 0 && gen.n_eos_token_ids <= CV_MAX_EOS);
    return 0;
}
