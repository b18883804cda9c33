/*
 * grammar_cache.h — compiled constraints (cvllm_grammar) and the engine's cache of them.
 *
 * Compiling turns a constraint into EBNF (sample/grammar converters), the EBNF into an automaton bound
 * to the engine's vocabulary, and is done on the caller's thread: the server's request threads, never
 * the engine's. The vocabulary trie is built once, at the first compile. The cache keeps the last
 * CV_GRAMMAR_CACHE_SIZE constraints by their exact content (kind, options, text), each holding one
 * reference; a request holds another for as long as it lives, so eviction never frees a grammar in use.
 */
#ifndef CV_ENGINE_GRAMMAR_CACHE_H
#define CV_ENGINE_GRAMMAR_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "cvllm.h"
#include "sample/grammar/grammar.h"

#define CV_GRAMMAR_CACHE_SIZE 64

typedef struct cv_grammar_cache cv_grammar_cache;

/* `eos` are the ids that end a sentence (copied); vocab_size the model's logit rows. */
cv_grammar_cache *cv_grammar_cache_new(const cv_tokenizer *tok, int32_t vocab_size, const int32_t *eos, size_t n_eos);
/* Drops the cache's references and the vocabulary; every other reference must be gone. */
void cv_grammar_cache_free(cv_grammar_cache *c);

/* The automaton of a compiled constraint, and whether it was compiled by this cache's engine. */
const cv_grammar *cv_grammar_of(const cvllm_grammar *g);
bool cv_grammar_belongs_to(const cvllm_grammar *g, const cv_grammar_cache *c);
/* Another reference, released with cvllm_grammar_release. */
cvllm_grammar *cv_grammar_retain(const cvllm_grammar *g);

#endif
