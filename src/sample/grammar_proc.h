/*
 * grammar_proc.h — structured outputs as a logits processor: a sequence's matcher in its grammar
 * (grammar/grammar.h) masks every token that would leave the grammar, and eos until the output is a
 * complete sentence.
 */
#ifndef CV_SAMPLE_GRAMMAR_PROC_H
#define CV_SAMPLE_GRAMMAR_PROC_H

#include <stddef.h>
#include <stdint.h>

#include "sample/grammar/grammar.h"
#include "sample/logits_proc.h"

/* `g` must outlive the processor; vocab_size is the one its cv_vocab was built with. after_token >= 0 delays the constraint until that token has been
 * accepted once (the end of a reasoning section); -1 constrains from the first token. `eos` are the
 * ids that end a sentence (the grammar's vocabulary allows them exactly when it is complete). */
cv_logits_proc *cv_grammar_proc_new(const cv_grammar *g, int32_t vocab_size, int32_t after_token, const int32_t *eos,
                                    size_t n_eos);

#endif
