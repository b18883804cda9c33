/*
 * config.h — config.json fields that only some architectures have, read from the text model's
 * object (cfg->text, which is text_config for the multimodal wrappers), and RoPE from the parsed
 * config (internal to src/models).
 *
 * The loader parses the fields every architecture shares (loader/config.h); a model file reads its
 * own here, each with one error naming the field when it is missing or of the wrong type.
 */
#ifndef CV_LAYERS_CONFIG_H
#define CV_LAYERS_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "loader/config.h"

/* A positive integer; absent: `def`, or an error naming the field when def < 0. */
int nn_cfg_int(const cv_model_config *cfg, const char *key, int32_t def, int32_t *out);
int nn_cfg_bool(const cv_model_config *cfg, const char *key, bool def, bool *out);
/* A list of layer indices < n_layers (absent: empty) as flags in[n_layers]. */
int nn_cfg_layer_list(const cv_model_config *cfg, const char *key, int32_t n_layers, bool *in);

/* RoPE from the parsed config; rot_dim = int(head_dim · partial_rotary_factor) as Hugging Face. */
int nn_init_rope(cv_rope *r, const cv_rope_config *rc, int32_t head_dim);

#endif
