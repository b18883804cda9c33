/*
 * rng.c — xoshiro256** (Blackman & Vigna) seeded through splitmix64.
 *
 * xoshiro256** is fast (a few shifts, rotations and one multiply per 64 bits), passes the usual
 * statistical batteries and has a 2^256 − 1 period, which is plenty for per-request streams. Its
 * state must not be all zero; splitmix64 spreads any 64-bit seed (0 included) over the four words,
 * and since splitmix64's output function is a bijection of distinct counters, four consecutive
 * outputs are never all zero. Every generator is seeded independently, so two requests with the
 * same seed see the same stream whatever else runs.
 */
#include "base/rng.h"

#include <math.h>

static uint64_t splitmix64_next(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void cv_rng_seed(cv_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64_next(&x);
}

uint64_t cv_rng_next(cv_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* The top 53 bits fill a double's mantissa exactly, so every value k·2^-53 is equally likely. */
double cv_rng_uniform(cv_rng *r) { return (double)(cv_rng_next(r) >> 11) * 0x1.0p-53; }

/* Inversion: −log(1 − u) with u in [0, 1). u = 0 would give exactly 0, which the exponential race
 * (p / q) cannot divide by; it is replaced by a value below the smallest other outcome (≈ 2^-53). */
double cv_rng_exponential(cv_rng *r) {
    double e = -log1p(-cv_rng_uniform(r));
    return e > 0 ? e : 0x1.0p-54;
}
