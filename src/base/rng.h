/*
 * rng.h — a small, fast, seedable PRNG (xoshiro256**, seeded through splitmix64) so each request
 * carries its own reproducible random stream.
 */
#ifndef CV_RNG_H
#define CV_RNG_H

#include <stdint.h>

typedef struct cv_rng {
    uint64_t s[4];
} cv_rng;

void cv_rng_seed(cv_rng *r, uint64_t seed);
uint64_t cv_rng_next(cv_rng *r);
/* Uniform in [0, 1) with 53 random bits... as a double. */
double cv_rng_uniform(cv_rng *r);
/* Exp(1) variate, > 0. */
double cv_rng_exponential(cv_rng *r);

#endif
