/*
 * output.c — stop conditions, visible text and published outputs (design in output.h).
 */
#include "engine/output.h"

#include <stdint.h>
#include <string.h>

#include "base/error.h"

/* ---- stop conditions and text ------------------------------------------------------------------- */

static bool contains_id(const int32_t *ids, size_t n, int32_t id) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id) return true;
    return false;
}

/* vLLM's check_stop: stop tokens count only once min_tokens are out; then the length limits. */
cvllm_finish_reason cv_output_stop_token(const cv_seq *seq, int32_t token, int32_t *stop_token) {
    const cv_request *req = seq->req;
    size_t n_out = cv_seq_num_output(seq);
    *stop_token = -1;
    if (n_out >= (size_t)req->params.min_tokens) {
        if (contains_id(req->eos_ids, req->n_eos_ids, token)) return CVLLM_FINISH_STOP;
        if (contains_id(req->params.stop_token_ids, req->params.n_stop_token_ids, token)) {
            *stop_token = token;
            return CVLLM_FINISH_STOP;
        }
    }
    if (n_out >= (size_t)req->max_tokens) return CVLLM_FINISH_LENGTH;
    return CVLLM_FINISH_NONE;
}

/* Looks for a stop string in the text that the last token could have completed; trims the text. */
static const char *check_stop_strings(cv_seq *seq, size_t old_len) {
    const cv_request *req = seq->req;
    if (!req->params.n_stop || cv_seq_num_output(seq) <= (size_t)req->params.min_tokens) return NULL;
    size_t from = old_len + 1 > req->max_stop_len ? old_len + 1 - req->max_stop_len : 0;
    const char *best = NULL;
    size_t best_at = SIZE_MAX;
    for (size_t i = 0; i < req->params.n_stop; i++) {
        const char *hit = strstr(seq->text + from, req->stop[i]);
        if (hit && (size_t)(hit - seq->text) < best_at) {
            best_at = (size_t)(hit - seq->text);
            best = req->stop[i];
        }
    }
    if (!best) return NULL;
    seq->text_len = req->params.include_stop_str_in_output ? best_at + strlen(best) : best_at;
    seq->text[seq->text_len] = '\0';
    return best;
}

static bool utf8_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

/* While a request has stop strings, its last max_stop_len-1 bytes are held back so a stop string
 * that is still forming is never shown; the cut never splits a UTF-8 character. */
void cv_output_update_visible(cv_seq *seq, bool finished) {
    size_t hold = seq->req->max_stop_len > 0 ? seq->req->max_stop_len - 1 : 0;
    size_t visible = finished || seq->text_len < hold ? (finished ? seq->text_len : 0) : seq->text_len - hold;
    while (visible > 0 && visible < seq->text_len && utf8_continuation((unsigned char)seq->text[visible])) visible--;
    if (visible > seq->visible_len || finished) seq->visible_len = visible;
}

void cv_output_append_text(cv_seq *seq, int32_t token, bool finished) {
    size_t old_len = seq->text_len;
    cv_detok_push(&seq->detok, token, &seq->text, &seq->text_len, &seq->text_cap);
    if (finished) cv_detok_flush(&seq->detok, &seq->text, &seq->text_len, &seq->text_cap);
    const char *stop = check_stop_strings(seq, old_len);
    if (stop && seq->out.finish_reason != CVLLM_FINISH_STOP) {
        seq->out.finish_reason = CVLLM_FINISH_STOP;
        seq->out.stop_str = stop;
    }
}

/* ---- publishing ---------------------------------------------------------------------------------- */
/* The text view must end at visible_len, which may be short of the decoded text while a stop string
 * could still be forming: the byte there is swapped for a NUL and put back before the text grows. */
static void hide_text_tail(cv_seq *seq) {
    if (seq->visible_len < seq->text_len) {
        seq->hidden_byte = seq->text[seq->visible_len];
        seq->text[seq->visible_len] = '\0';
        seq->has_hidden_byte = true;
    }
}

static void restore_text_tail(cv_seq *seq) {
    if (seq->has_hidden_byte) seq->text[seq->visible_len] = seq->hidden_byte;
    seq->has_hidden_byte = false;
}

static void fill_completion_output(cv_seq *seq) {
    cvllm_completion_output *o = &seq->out;
    size_t n_out = cv_seq_num_output(seq);
    o->index = seq->index;
    o->token_ids = seq->tokens + seq->req->n_prompt;
    o->n_token_ids = n_out;
    hide_text_tail(seq);
    o->text = seq->text;
    o->text_len = seq->visible_len;
    o->logprobs = seq->req->params.logprobs >= 0 ? seq->logprobs : NULL;
    o->n_new_token_ids = n_out - seq->reported_tokens;
    o->new_text_offset = seq->reported_text;
    seq->reported_tokens = n_out;
    seq->reported_text = seq->visible_len;
}

static void publish(cvllm_engine *e, cv_request *req) {
    for (int32_t i = 0; i < req->n_seqs; i++) {
        cv_seq *seq = &req->seqs[i];
        if (seq->touched || !req->out.outputs) {
            fill_completion_output(seq);
        } else {
            seq->out.n_new_token_ids = 0;
            seq->out.new_text_offset = seq->visible_len;
        }
        req->outs[i] = seq->out;
        seq->touched = false;
    }
    req->out = (cvllm_request_output){
        .request_id = req->id,
        .prompt_token_ids = req->prompt,
        .n_prompt_token_ids = req->n_prompt,
        .prompt_logprobs = req->prompt_logprobs,
        .n_cached_tokens = req->n_cached_tokens,
        .outputs = req->outs,
        .n_outputs = req->n_seqs,
        .finished = req->n_finished == req->n_seqs,
        .embedding = req->n_pooled ? req->pooled : NULL,
        .n_embedding = req->n_pooled,
    };
    req->touched = false;
    if (e->n_outputs == e->cap_outputs) {
        e->cap_outputs = e->cap_outputs ? e->cap_outputs * 2 : 16;
        e->outputs = cv_xrealloc(e->outputs, e->cap_outputs * sizeof *e->outputs);
    }
    e->outputs[e->n_outputs++] = &req->out;
}

static void retire(cvllm_engine *e, cv_request *req) {
    if (e->n_finished == e->cap_finished) {
        e->cap_finished = e->cap_finished ? e->cap_finished * 2 : 16;
        e->finished = cv_xrealloc(e->finished, e->cap_finished * sizeof *e->finished);
    }
    e->finished[e->n_finished++] = req;
}

void cv_output_collect(cvllm_engine *e) {
    size_t kept = 0;
    for (size_t i = 0; i < e->n_requests; i++) {
        cv_request *req = e->requests[i];
        if (req->touched) publish(e, req);
        if (req->n_finished == req->n_seqs) retire(e, req);
        else e->requests[kept++] = req;
    }
    e->n_requests = kept;
}

void cv_output_restore_views(cvllm_engine *e) {
    for (size_t i = 0; i < e->n_requests; i++)
        for (int32_t s = 0; s < e->requests[i]->n_seqs; s++) restore_text_tail(&e->requests[i]->seqs[s]);
}
