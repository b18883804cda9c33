/*
 * pyrandom.h — the few draws of Python's `random` module that vLLM's benchmark datasets make
 * (random.seed(int), shuffle, choices) and `vllm bench serve` its LoRA choice, bit for bit: a dataset file then yields the same requests
 * in the same order as `vllm bench` with the same --seed.
 */
#ifndef CV_BENCH_PYRANDOM_H
#define CV_BENCH_PYRANDOM_H

#include <stddef.h>
#include <stdint.h>

typedef struct cv_pyrandom {
    uint32_t mt[624];
    int index;
} cv_pyrandom;

/* random.seed(seed) for a non-negative int. */
void cv_pyrandom_seed(cv_pyrandom *r, uint64_t seed);
/* random.getrandbits(k), 1 <= k <= 32. */
uint32_t cv_pyrandom_bits(cv_pyrandom *r, int k);
/* random.random(). */
double cv_pyrandom_double(cv_pyrandom *r);
/* random.randrange(n), which random.choice(seq) indexes seq with (its _randbelow); 0 < n < 2^32. */
size_t cv_pyrandom_below(cv_pyrandom *r, size_t n);
/* random.shuffle of the n indices in idx. */
void cv_pyrandom_shuffle(cv_pyrandom *r, size_t *idx, size_t n);
/* random.choices(range(n), k=1)[0]. */
size_t cv_pyrandom_choice(cv_pyrandom *r, size_t n);

#endif
