/*
 * mtp.c — draft tokens from the model's multi-token-prediction module (vLLM's MTP proposer).
 *
 * After the main forward pass and the verification of last step's drafts, every sequence in the
 * batch has K/V valid for positions [before, after). The MTP layer keeps its own KV cache at the same
 * positions, so it first catches up over exactly those positions: row i pairs the main model's
 * hidden state at position i with the token at i+1 (which is known now: a prompt token, an accepted
 * draft, or the token just sampled). The last row of a sequence that is decoding predicts the token
 * after the newest one: draft 1. Each further draft feeds the MTP's own output hidden back in with
 * the previous draft, one position later. Drafts are the MTP's argmax, so the rejection sampler treats
 * them as point masses (as vLLM does).
 *
 * The MTP writes K/V one position past the sequence's newest token per extra draft; the blocks for
 * that are reserved here (fewer drafts when the cache is full). Rejected drafts' MTP K/V is simply
 * overwritten by the next catch-up.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "engine/engine.h"

/* Row arrays hold one entry per catch-up row (or per drafting sequence), sequence arrays one per
 * sequence; both only grow. */
static void ensure(cv_mtp_work *w, size_t rows, size_t seqs, size_t hidden) {
    if (rows > w->cap_rows) {
        w->cap_rows = rows * 2;
        w->token_ids = cv_xrealloc(w->token_ids, w->cap_rows * sizeof *w->token_ids);
        w->positions = cv_xrealloc(w->positions, w->cap_rows * sizeof *w->positions);
        w->slot_mapping = cv_xrealloc(w->slot_mapping, w->cap_rows * sizeof *w->slot_mapping);
        w->hidden_in = cv_xrealloc(w->hidden_in, w->cap_rows * hidden * sizeof *w->hidden_in);
        w->hidden_out = cv_xrealloc(w->hidden_out, w->cap_rows * hidden * sizeof *w->hidden_out);
    }
    if (seqs > w->cap_seqs) {
        w->cap_seqs = seqs * 2;
        w->seq_start = cv_xrealloc(w->seq_start, (w->cap_seqs + 1) * sizeof *w->seq_start);
        w->context_lens = cv_xrealloc(w->context_lens, w->cap_seqs * sizeof *w->context_lens);
        w->block_tables = cv_xrealloc(w->block_tables, w->cap_seqs * sizeof *w->block_tables);
        w->logit_rows = cv_xrealloc(w->logit_rows, w->cap_seqs * sizeof *w->logit_rows);
        w->drafting = cv_xrealloc(w->drafting, w->cap_seqs * sizeof *w->drafting);
        w->logits = cv_xrealloc(w->logits, w->cap_seqs * w->vocab * sizeof *w->logits);
    }
}

void cv_mtp_work_free(cv_mtp_work *w) {
    free(w->token_ids);
    free(w->positions);
    free(w->slot_mapping);
    free(w->hidden_in);
    free(w->hidden_out);
    free(w->seq_start);
    free(w->context_lens);
    free(w->block_tables);
    free(w->logit_rows);
    free(w->drafting);
    free(w->logits);
    memset(w, 0, sizeof *w);
}

static int64_t slot_of(const cv_seq *seq, size_t pos, int32_t bs) {
    return (int64_t)seq->block_table[pos / (size_t)bs] * bs + (int64_t)(pos % (size_t)bs);
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static int run(cvllm_engine *e, cv_mtp_work *w, int32_t n_rows, int32_t n_seqs, int32_t n_logits) {
    cv_batch b = {
        .n_tokens = n_rows,
        .token_ids = w->token_ids,
        .positions = w->positions,
        .slot_mapping = w->slot_mapping,
        .n_seqs = n_seqs,
        .seq_start = w->seq_start,
        .context_lens = w->context_lens,
        .block_tables = (const int32_t *const *)w->block_tables,
        .n_logits = n_logits,
        .logit_rows = w->logit_rows,
        .hidden_out = w->hidden_out,
    };
    return cv_runner_execute_mtp(e->runner, &b, w->hidden_in, w->logits);
}

/* Catch-up over the positions each sequence computed in this step; first drafts from the last rows. */
static int catch_up(cvllm_engine *e, cv_mtp_work *w, const cv_mtp_seq *in, int32_t n, const float *main_hidden,
                    int32_t *n_drafting) {
    size_t H = (size_t)e->config.hidden_size;
    int32_t bs = e->opts.block_size, rows = 0, seqs = 0, logits = 0;
    for (int32_t s = 0; s < n; s++) rows += (int32_t)(in[s].seq->num_computed - in[s].before);
    ensure(w, (size_t)rows, (size_t)n, H);
    rows = 0;
    for (int32_t s = 0; s < n; s++) {
        cv_seq *seq = in[s].seq;
        size_t after = seq->num_computed;
        if (after == in[s].before || seq->status == CV_SEQ_FINISHED) continue;
        w->seq_start[seqs] = rows;
        for (size_t pos = in[s].before; pos < after; pos++, rows++) {
            w->token_ids[rows] = seq->tokens[pos + 1];
            w->positions[rows] = (int32_t)pos;
            w->slot_mapping[rows] = slot_of(seq, pos, bs);
            memcpy(w->hidden_in + (size_t)rows * H, main_hidden + (size_t)(in[s].main_row + (int32_t)(pos - in[s].before)) * H,
                   H * sizeof(float));
        }
        w->context_lens[seqs] = (int32_t)after;
        w->block_tables[seqs] = seq->block_table;
        w->drafting[seqs] = seq->n_tokens == after + 1 ? seq : NULL; /* decoding: its newest token is last */
        if (w->drafting[seqs]) w->logit_rows[logits++] = rows - 1;
        seqs++;
    }
    w->seq_start[seqs] = rows;
    if (rows == 0) return 0;
    int rc = run(e, w, rows, seqs, logits);
    if (rc) return rc;
    /* Keep only the drafting sequences, with their last hidden row, for the next draft steps. */
    int32_t k = 0;
    for (int32_t s = 0; s < seqs; s++) {
        cv_seq *seq = w->drafting[s];
        if (!seq) continue;
        seq->draft[0] = argmax(w->logits + (size_t)k * (size_t)e->vocab_size, e->vocab_size);
        seq->n_draft = 1;
        memmove(w->hidden_in + (size_t)k * H, w->hidden_out + (size_t)(w->seq_start[s + 1] - 1) * H, H * sizeof(float));
        w->drafting[k++] = seq;
    }
    *n_drafting = k;
    return 0;
}

/* One more draft for every sequence still drafting: the previous draft at the next position. */
static int draft_step(cvllm_engine *e, cv_mtp_work *w, int32_t n, int32_t j) {
    size_t H = (size_t)e->config.hidden_size;
    int32_t bs = e->opts.block_size;
    for (int32_t s = 0; s < n; s++) {
        cv_seq *seq = w->drafting[s];
        size_t pos = seq->n_tokens - 1 + (size_t)(j - 1);
        w->token_ids[s] = seq->draft[j - 1];
        w->positions[s] = (int32_t)pos;
        w->slot_mapping[s] = slot_of(seq, pos, bs);
        w->seq_start[s] = s;
        w->context_lens[s] = (int32_t)pos + 1;
        w->block_tables[s] = seq->block_table;
        w->logit_rows[s] = s;
    }
    w->seq_start[n] = n;
    int rc = run(e, w, n, n, n);
    if (rc) return rc;
    for (int32_t s = 0; s < n; s++) {
        cv_seq *seq = w->drafting[s];
        seq->draft[j] = argmax(w->logits + (size_t)s * (size_t)e->vocab_size, e->vocab_size);
        seq->n_draft = j + 1;
    }
    memcpy(w->hidden_in, w->hidden_out, (size_t)n * H * sizeof(float));
    return 0;
}

/* How many drafts a sequence may take: within max_model_len and max_tokens, and with K/V blocks for
 * the MTP's extra positions (n_tokens - 1 + j - 1 for draft j). */
static int32_t draft_budget(cvllm_engine *e, cv_seq *seq) {
    int32_t room = e->max_model_len - (int32_t)seq->n_tokens;
    int32_t left = seq->req->max_tokens - (int32_t)cv_seq_num_output(seq) - 1;
    int32_t k = e->spec.num_speculative_tokens;
    if (k > room) k = room;
    if (k > left) k = left;
    while (k > 1 && !cv_scheduler_reserve(&e->sched, seq, seq->n_tokens + (size_t)k - 2)) k--;
    return k;
}

/* Keeps the drafting sequences that may take more than `j` drafts (their hidden rows move along);
 * the others keep the drafts they have. */
static int32_t keep_drafting(cvllm_engine *e, cv_mtp_work *w, int32_t n, int32_t j) {
    size_t H = (size_t)e->config.hidden_size;
    int32_t kept = 0;
    for (int32_t s = 0; s < n; s++) {
        cv_seq *seq = w->drafting[s];
        if (draft_budget(e, seq) <= j) {
            if (j == 0) seq->n_draft = 0;
            continue;
        }
        memmove(w->hidden_in + (size_t)kept * H, w->hidden_in + (size_t)s * H, H * sizeof(float));
        w->drafting[kept++] = seq;
    }
    return kept;
}

int cv_mtp_propose(cvllm_engine *e, cv_mtp_work *w, const cv_mtp_seq *seqs, int32_t n, const float *main_hidden) {
    w->vocab = (size_t)e->vocab_size;
    int32_t drafting = 0;
    int rc = catch_up(e, w, seqs, n, main_hidden, &drafting);
    if (rc) return rc;
    drafting = keep_drafting(e, w, drafting, 0);
    for (int32_t j = 1; j < e->spec.num_speculative_tokens && drafting > 0; j++) {
        drafting = keep_drafting(e, w, drafting, j);
        if (drafting > 0 && (rc = draft_step(e, w, drafting, j))) return rc;
    }
    return 0;
}
