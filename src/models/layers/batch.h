/*
 * batch.h — the one check of a cv_batch that every model runs before its forward pass (internal to
 * src/models).
 *
 * The kernels trust their indices, so a bad token id, KV slot, block id or state slot would be a
 * wild memory access; every model validates the batch here, up front, with one message naming what
 * is wrong.
 *
 * Positions: each sequence's run must be consecutive (p, p+1, ...) and inside its context. That is
 * what the engine sends in every case — a prefill chunk, a decode token, a speculative verify run
 * (the last token then the drafts), the MTP proposer's catch-up and draft steps, and a request
 * starting after a prefix-cache hit all run num_computed, num_computed+1, ... — and what both kinds
 * of layer need: a recurrent state advances one token at a time, and attention reads the K/V of
 * every position before a token, so a gap would read K/V this batch never wrote.
 */
#ifndef CV_LAYERS_BATCH_H
#define CV_LAYERS_BATCH_H

#include <stddef.h>
#include <stdint.h>

#include "models/model.h"

/* Everything the kernels trust: counts, seq_start, positions, slot mapping, block tables, token ids
 * (< vocab), LoRA adapters (only where the model has LoRA on, `lora`, and bound to sites laid out
 * as its), logit rows; the KV cache has kv_layers layers; when state_bytes > 0, each sequence has
 * its own state slot of at least that size and the checkpoints are valid (sorted, inside their
 * sequence's run, written to slots nothing else in the batch uses); when state_bytes is 0 there
 * are no checkpoints. */
int nn_check_batch(const cv_batch *b, const cv_kv_cache *kv, int32_t vocab, int32_t kv_layers, const cv_lora_sites *lora,
                   const cv_state_cache *state, size_t state_bytes);

#endif
