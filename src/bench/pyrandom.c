/*
 * pyrandom.c — see pyrandom.h. Python's generator is MT19937 (Matsumoto and Nishimura's reference
 * algorithm) seeded with init_by_array over the seed's 32-bit words, low word first (CPython's
 * random_seed); getrandbits(k) keeps the top k bits of one output, random() joins 27 and 26 bits into
 * a double, _randbelow(n) draws bit_length(n) bits until they fall below n, and shuffle swaps each
 * position i from the end with _randbelow(i + 1).
 */
#include "bench/pyrandom.h"

#include <assert.h>

enum { N = 624, M = 397 };

static void init_genrand(cv_pyrandom *r, uint32_t s) {
    r->mt[0] = s;
    for (int i = 1; i < N; i++) r->mt[i] = 1812433253u * (r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) + (uint32_t)i;
    r->index = N;
}

static void init_by_array(cv_pyrandom *r, const uint32_t *key, int len) {
    init_genrand(r, 19650218u);
    int i = 1, j = 0;
    for (int k = N > len ? N : len; k; k--) {
        r->mt[i] = (r->mt[i] ^ ((r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) * 1664525u)) + key[j] + (uint32_t)j;
        i++, j++;
        if (i >= N) r->mt[0] = r->mt[N - 1], i = 1;
        if (j >= len) j = 0;
    }
    for (int k = N - 1; k; k--) {
        r->mt[i] = (r->mt[i] ^ ((r->mt[i - 1] ^ (r->mt[i - 1] >> 30)) * 1566083941u)) - (uint32_t)i;
        i++;
        if (i >= N) r->mt[0] = r->mt[N - 1], i = 1;
    }
    r->mt[0] = 0x80000000u;
}

void cv_pyrandom_seed(cv_pyrandom *r, uint64_t seed) {
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    init_by_array(r, key, seed >> 32 ? 2 : 1);
}

static uint32_t next32(cv_pyrandom *r) {
    if (r->index >= N) {
        for (int i = 0; i < N; i++) {
            const uint32_t y = (r->mt[i] & 0x80000000u) | (r->mt[(i + 1) % N] & 0x7fffffffu);
            r->mt[i] = r->mt[(i + M) % N] ^ (y >> 1) ^ (y & 1 ? 0x9908b0dfu : 0);
        }
        r->index = 0;
    }
    uint32_t y = r->mt[r->index++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    return y ^ (y >> 18);
}

uint32_t cv_pyrandom_bits(cv_pyrandom *r, int k) {
    assert(k >= 1 && k <= 32);
    return next32(r) >> (32 - k);
}

double cv_pyrandom_double(cv_pyrandom *r) {
    const uint32_t a = next32(r) >> 5, b = next32(r) >> 6;
    return ((double)a * 67108864.0 + (double)b) * (1.0 / 9007199254740992.0);
}

size_t cv_pyrandom_below(cv_pyrandom *r, size_t n) {
    assert(n > 0 && n <= UINT32_MAX);
    int k = 0;
    while (k < 32 && ((size_t)1 << k) <= n) k++;
    size_t v;
    do v = cv_pyrandom_bits(r, k);
    while (v >= n);
    return v;
}

void cv_pyrandom_shuffle(cv_pyrandom *r, size_t *idx, size_t n) {
    for (size_t i = n; i-- > 1;) {
        const size_t j = cv_pyrandom_below(r, i + 1), t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

size_t cv_pyrandom_choice(cv_pyrandom *r, size_t n) { return (size_t)(cv_pyrandom_double(r) * (double)n); }
