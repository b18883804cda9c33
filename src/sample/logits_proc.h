/*
 * logits_proc.h — per-sequence logits processors: the open end of the sampler.
 *
 * The sampler's own steps (sampler.h) are fixed and driven by plain parameters. A constraint that
 * carries state of its own — a grammar's position, today — is a processor instead: an object each
 * sequence owns, with the interface of llama.cpp's llama_sampler_i cut to what a sequence needs:
 *
 *   apply   sets the logits of the tokens it forbids at the next position to -inf;
 *   accept  records the token chosen there (false: it forbids that token, and nothing changed);
 *   free    releases it.
 *
 * The sampler runs every processor of a sequence first, before its own steps, so what a processor
 * forbids is gone from the logprobs, from top-k/top-p and from the draw alike (vLLM applies its
 * structured-output bitmask to the logits before its sampler sees them, the same place).
 *
 * There is no rollback: speculative decoding here verifies position d only after the drafts before
 * it were accepted (engine.c, process_samples), so a processor only ever sees accepted tokens, and a
 * rejected draft never reaches it. There is no "done" either: a processor that allows only eos says
 * so through apply, and the sampler's draw makes it the token.
 */
#ifndef CV_SAMPLE_LOGITS_PROC_H
#define CV_SAMPLE_LOGITS_PROC_H

#include <stdbool.h>
#include <stdint.h>

typedef struct cv_logits_proc cv_logits_proc;

typedef struct cv_logits_proc_i {
    void (*apply)(cv_logits_proc *p, float *logits, int32_t vocab_size);
    bool (*accept)(cv_logits_proc *p, int32_t token);
    void (*free)(cv_logits_proc *p);
} cv_logits_proc_i;

/* Implementations embed this as their first member; a sequence chains its processors through next. */
struct cv_logits_proc {
    const cv_logits_proc_i *i;
    cv_logits_proc *next;
};

#endif
