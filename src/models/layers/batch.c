/*
 * batch.c — validation of a forward call's batch (see batch.h for why the positions must be
 * consecutive).
 *
 * Two sequences sharing a state slot would race on (and corrupt) one recurrent state, so slots must
 * be distinct within a batch; so must the slots that state checkpoints are copied into, from each
 * other and from the running ones.
 */
#include "models/layers/batch.h"

#include <stdlib.h>

#include "base/error.h"
#include "models/layers/lora.h"

static int check_sequence(const cv_batch *b, const cv_kv_cache *kv, int32_t vocab, const cv_lora_sites *lora, int32_t s) {
    const int32_t begin = b->seq_start[s], end = b->seq_start[s + 1];
    if (begin > end) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: seq_start is not ascending at sequence %d", s);
    const cv_lora_binding *a = b->loras ? b->loras[s] : NULL;
    if (a && !lora)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: sequence %d asks for LoRA adapter %s; the model was "
                       "loaded without LoRA", s, a->adapter->name);
    if (a && a->n_sites != lora->n_on)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: sequence %d's LoRA adapter %s was bound to a model of %d "
                       "adapted linears; this one has %d", s, a->adapter->name, a->n_sites, lora->n_on);
    const int32_t ctx = b->context_lens[s];
    const int64_t n_blocks = ((int64_t)ctx + kv->block_size - 1) / kv->block_size;
    for (int64_t j = 0; j < n_blocks; j++)
        if (b->block_tables[s][j] < 0 || b->block_tables[s][j] >= kv->num_blocks)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: sequence %d block %lld is %d, outside [0, %d)", s,
                           (long long)j, b->block_tables[s][j], kv->num_blocks);
    for (int32_t t = begin; t < end; t++) {
        int32_t p = b->positions[t];
        if (p < 0 || p >= ctx)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: token %d has position %d outside its context of %d",
                           t, p, ctx);
        if (t > begin && p != b->positions[t - 1] + 1)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: positions of sequence %d are not consecutive", s);
        int64_t slot = (int64_t)b->block_tables[s][p / kv->block_size] * kv->block_size + p % kv->block_size;
        if (b->slot_mapping[t] != slot)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                           "batch: token %d (position %d) maps to slot %lld but its block table says %lld", t, p,
                           (long long)b->slot_mapping[t], (long long)slot);
        if (b->token_ids[t] < 0 || b->token_ids[t] >= vocab)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: token id %d is outside the vocabulary [0, %d)",
                           b->token_ids[t], vocab);
    }
    return 0;
}

static int check_state(const cv_batch *b, const cv_state_cache *state, size_t state_bytes) {
    if (!state || !state->data || !b->state_slots)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: this model keeps recurrent state but no state cache or "
                                                   "state slots were given");
    if (state->slot_bytes < state_bytes)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "state cache slots hold %zu bytes; the model needs %zu",
                       state->slot_bytes, state_bytes);
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int32_t slot = b->state_slots[s];
        if (slot < 0 || slot >= state->num_slots)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: sequence %d has state slot %d, outside [0, %d)", s, slot,
                           state->num_slots);
        for (int32_t r = 0; r < s; r++)
            if (b->state_slots[r] == slot)
                return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: sequences %d and %d share state slot %d", r, s, slot);
    }
    return 0;
}

/* Checkpoints: sorted by (seq, position), inside their sequence's tokens of this batch, written to
 * slots that no sequence of the batch runs in and no other checkpoint writes (either would make
 * the copy race with, or clobber, a state being computed). */
static int check_checkpoints(const cv_batch *b, const cv_state_cache *state) {
    if (b->n_checkpoints < 0 || (b->n_checkpoints > 0 && !b->checkpoints))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: n_checkpoints=%d without a checkpoint list",
                       b->n_checkpoints);
    int rc = 0;
    uint8_t *taken = cv_xcalloc((size_t)state->num_slots, 1);
    for (int32_t s = 0; s < b->n_seqs; s++) taken[b->state_slots[s]] = 1;
    for (int32_t i = 0; i < b->n_checkpoints && !rc; i++) {
        const cv_state_checkpoint *c = &b->checkpoints[i];
        if (c->seq < 0 || c->seq >= b->n_seqs)
            rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: checkpoint %d names sequence %d, outside [0, %d)", i,
                         c->seq, b->n_seqs);
        else if (i > 0 && (c->seq < c[-1].seq || (c->seq == c[-1].seq && c->position < c[-1].position)))
            rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: checkpoints are not sorted by (sequence, position) at "
                                                     "entry %d", i);
        else if (b->seq_start[c->seq] == b->seq_start[c->seq + 1] ||
                 c->position < b->positions[b->seq_start[c->seq]] ||
                 c->position > b->positions[b->seq_start[c->seq + 1] - 1])
            rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: checkpoint %d at position %d is not among the tokens of "
                                                     "sequence %d in this batch", i, c->position, c->seq);
        else if (c->slot < 0 || c->slot >= state->num_slots)
            rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: checkpoint %d has state slot %d, outside [0, %d)", i,
                         c->slot, state->num_slots);
        else if (taken[c->slot])
            rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: checkpoint %d writes state slot %d, which a sequence of "
                                                     "the batch or another checkpoint uses", i, c->slot);
        else
            taken[c->slot] = 1;
    }
    free(taken);
    return rc;
}

int nn_check_batch(const cv_batch *b, const cv_kv_cache *kv, int32_t vocab, int32_t kv_layers, const cv_lora_sites *lora,
                   const cv_state_cache *state, size_t state_bytes) {
    if (b->n_tokens < 0 || b->n_seqs < 0 || b->n_logits < 0 || (b->n_tokens > 0 && b->n_seqs == 0))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: negative counts or tokens without sequences");
    if (kv->block_size <= 0 || kv->num_blocks <= 0) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "KV cache has no blocks");
    if (kv->dtype != CV_DTYPE_F32 && kv->dtype != CV_DTYPE_BF16)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "KV cache dtype %s: the kernels keep K and V in F32 or BF16",
                       cv_dtype_name(kv->dtype));
    for (int l = 0; l < kv_layers; l++)
        if (!kv->k[l] || !kv->v[l]) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "KV cache layer %d is missing", l);
    if (b->n_seqs > 0 && (b->seq_start[0] != 0 || b->seq_start[b->n_seqs] != b->n_tokens))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: seq_start must run from 0 to n_tokens=%d", b->n_tokens);
    for (int32_t s = 0; s < b->n_seqs; s++) {
        int rc = check_sequence(b, kv, vocab, lora, s);
        if (rc) return rc;
    }
    if (state_bytes > 0) {
        int rc = check_state(b, state, state_bytes);
        if (!rc) rc = check_checkpoints(b, state);
        if (rc) return rc;
    } else if (b->n_checkpoints != 0) {
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: state checkpoints asked of a model without recurrent state");
    }
    for (int32_t i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n_tokens)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "batch: logit row %d is outside [0, %d)", b->logit_rows[i],
                           b->n_tokens);
    return 0;
}
