/*
 * sampler.c — one row of logits to one token, in vLLM v1's order (see sampler.h for the steps).
 *
 * Everything here is a pass over one row of up to ~150k floats, so the design is about doing few
 * passes, each one vectorizable (the library is built for baseline x86-64-v2 without -ffast-math):
 *
 *   - Reductions (max, sums) run in eight independent lanes, and exp() is an inline polynomial
 *     (~2 ulp) instead of glibc's expf, which the compiler cannot vectorize; scans that look for
 *     the rare token above a threshold (top_k, top-N, argmax) test eight tokens with one vector
 *     compare. Measured on the 151936-wide row this took greedy from ~230 to ~30 µs.
 *   - Raw logprobs need the unprocessed row after the token is known (its rank counts the whole
 *     row), so the row is copied to scratch first, and only when logprobs were requested. The top-N
 *     is a size-N min-heap kept in the caller's `top` array.
 *   - allowed_token_ids is kept as an ascending list, so masking the rest fills the runs between
 *     allowed ids: one store per token, vectorizable, and nothing to allocate per step.
 *   - bad_words compares each word's prefix with a ring of the last generated tokens in the state,
 *     so a step costs the total length of the words, however long the output is.
 *   - min_tokens, logit_bias and the penalties are sparse: they touch the stop ids, the bias ids and
 *     the distinct ids seen in the prompt/output (kept as a list in the state), never the whole row.
 *   - top_k finds the k-th largest logit with a size-k heap of ids (one comparison per block) and
 *     keeps every logit >= it, ties included, as vLLM's masking `logits < kth_value` does.
 *   - top_p keeps, in the order (logit desc, id asc), each token whose preceding probability mass is
 *     < top_p (the smallest prefix reaching top_p; ties therefore favour lower ids). Instead of
 *     sorting, a quickselect that carries the mass of the partition above its pivot finds that
 *     prefix in expected linear time. Without top_k it runs on a pre-filtered candidate list: a token
 *     with weight < (1 - top_p)·W / n can never be kept, because it and everything ranked below it
 *     together weigh less than (1 - top_p)·W (a factor 1/2 of margin absorbs rounding).
 *   - The draw over a restricted set is the exponential race argmax(w_i / q_i), q_i ~ Exp(1), one
 *     RNG draw per survivor, with unnormalised weights w_i = exp(l_i - max) (the argmax does not
 *     care about the normalisation). Over the full vocabulary (no top_k/top_p) it is inverse-CDF with
 *     a single uniform instead: the same distribution (P(i) = w_i / W for both), O(V) additions
 *     rather than O(V) logarithms. Neither is sample-identical to vLLM, which draws from torch's
 *     generator; what holds is that one seed gives one token sequence for the same logits.
 *
 * min_p is applied in logit space: p_i < min_p · p_max  <=>  l_i - l_max < log(min_p).
 *
 * NaN logits count as -inf and +inf as FLT_MAX wherever they are read, so a broken row degrades to
 * a valid token id instead of NaN arithmetic. When steps 2-6 leave no finite logit, the result is
 * the stop id that min_tokens masked with the best logit steps 2-3 left it (finite biases and
 * penalties keep a finite logit finite, so that is the one soft rule to break), or token 0 when
 * there is none (torch's argmax of an all -inf row): then allowed_token_ids and bad_words left
 * nothing, or the raw row was all -inf.
 */
#include "sample/sampler.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* vLLM's _SAMPLING_EPS: below it a temperature means greedy. */
#define CV_GREEDY_TEMPERATURE 1e-5f

static inline float clean_logit(float x) {
    float capped = x > FLT_MAX ? FLT_MAX : x;
    return isnan(x) ? -INFINITY : capped;
}

static bool repetition_active(const cv_sampler_params *p) { return p->repetition_penalty != 1.0f; }

static bool output_penalties_active(const cv_sampler_params *p) {
    return p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

/* ---- per-sequence state ---------------------------------------------------------------------- */

static void remember_seen(cv_sampler_state *st, int32_t id) {
    if (st->n_seen == st->cap_seen) {
        st->cap_seen = st->cap_seen ? 2 * st->cap_seen : 64;
        st->seen = cv_xrealloc(st->seen, (size_t)st->cap_seen * sizeof *st->seen);
    }
    st->seen[st->n_seen++] = id;
}

static int32_t longest_bad_prefix(const cv_token_seqs *words) {
    int32_t longest = 0;
    for (size_t w = 0; words && w < words->n; w++) {
        int32_t prefix = words->starts[w + 1] - words->starts[w] - 1;
        assert(prefix >= 0);
        if (prefix > longest) longest = prefix;
    }
    return longest;
}

void cv_sampler_state_init(cv_sampler_state *st, const cv_sampler_params *p, int32_t vocab_size,
                           uint64_t seed, const int32_t *prompt, size_t n_prompt) {
    assert(vocab_size > 0);
    memset(st, 0, sizeof *st);
    cv_rng_seed(&st->rng, seed);
    st->vocab_size = vocab_size;
    st->cap_recent = longest_bad_prefix(p->bad_words);
    if (st->cap_recent) st->recent = cv_xmalloc((size_t)st->cap_recent * sizeof *st->recent);
    bool repetition = repetition_active(p);
    if (!repetition && !output_penalties_active(p)) return;
    st->out_count = cv_xcalloc((size_t)vocab_size, sizeof *st->out_count);
    if (!repetition) return; /* frequency/presence look at the output only */
    st->in_prompt = cv_xcalloc((size_t)vocab_size, 1);
    for (size_t i = 0; i < n_prompt; i++) {
        int32_t t = prompt[i];
        assert(t >= 0 && t < vocab_size);
        if (!st->in_prompt[t]) {
            st->in_prompt[t] = 1;
            remember_seen(st, t);
        }
    }
}

void cv_sampler_add_proc(cv_sampler_state *st, cv_logits_proc *proc) {
    cv_logits_proc **tail = &st->procs;
    while (*tail) tail = &(*tail)->next;
    proc->next = NULL;
    *tail = proc;
}

void cv_sampler_state_free(cv_sampler_state *st) {
    for (cv_logits_proc *p = st->procs, *next; p; p = next) {
        next = p->next;
        p->i->free(p);
    }
    free(st->in_prompt);
    free(st->out_count);
    free(st->seen);
    free(st->recent);
    memset(st, 0, sizeof *st);
}

bool cv_sampler_accept(cv_sampler_state *st, int32_t token_id) {
    assert(token_id >= 0 && token_id < st->vocab_size);
    bool allowed = true;
    for (cv_logits_proc *p = st->procs; p; p = p->next) allowed &= p->i->accept(p, token_id);
    if (st->recent) st->recent[st->n_generated % st->cap_recent] = token_id;
    st->n_generated++;
    if (!st->out_count) return allowed;
    bool known = st->out_count[token_id] > 0 || (st->in_prompt && st->in_prompt[token_id]);
    st->out_count[token_id]++;
    if (!known) remember_seen(st, token_id);
    return allowed;
}

/* ---- steps 2-6: allowed_token_ids, bad_words, min_tokens, logit_bias, penalties ----------------- */

static void mask_disallowed(const cv_sampler_params *p, int32_t vocab_size, float *logits) {
    if (!p->n_allowed) return;
    int32_t from = 0;
    for (size_t i = 0; i <= p->n_allowed; i++) {
        int32_t to = i < p->n_allowed ? p->allowed_ids[i] : vocab_size;
        assert(to >= from && to <= vocab_size); /* ascending, distinct, in the vocabulary */
        for (int32_t t = from; t < to; t++) logits[t] = -INFINITY;
        from = to + 1;
    }
}

/* The token generated `back` places before the next one (back = 1: the last one). */
static inline int32_t recent_token(const cv_sampler_state *st, int32_t back) {
    return st->recent[(st->n_generated - back) % st->cap_recent];
}

/* vLLM's apply_bad_words: only the output counts, never the prompt. */
static void mask_bad_words(const cv_sampler_params *p, const cv_sampler_state *st, float *logits) {
    const cv_token_seqs *words = p->bad_words;
    for (size_t w = 0; words && w < words->n; w++) {
        const int32_t *ids = words->ids + words->starts[w];
        int32_t prefix = words->starts[w + 1] - words->starts[w] - 1, last = ids[prefix];
        if (prefix > st->n_generated || last < 0 || last >= st->vocab_size) continue;
        assert(prefix <= st->cap_recent); /* state made with other params */
        int32_t k = 0;
        while (k < prefix && recent_token(st, prefix - k) == ids[k]) k++;
        if (k == prefix) logits[last] = -INFINITY;
    }
}

/* Masks the stop ids while min_tokens is not reached and returns the one with the best logit
 * (lowest id on ties; token 0 when none is finite): the fallback when nothing else survives. Ids
 * outside the vocabulary can never be sampled, so they are skipped rather than trusted. */
static int32_t mask_stop_ids(const cv_sampler_params *p, const cv_sampler_state *st, float *logits) {
    int32_t best = 0;
    float best_logit = -INFINITY;
    if (st->n_generated >= p->min_tokens) return best;
    for (size_t i = 0; i < p->n_stop_ids; i++) {
        int32_t id = p->stop_ids[i];
        if (id < 0 || id >= st->vocab_size) continue;
        float x = clean_logit(logits[id]);
        if (x > best_logit || (x == best_logit && x > -INFINITY && id < best)) {
            best_logit = x;
            best = id;
        }
        logits[id] = -INFINITY;
    }
    return best;
}

static void add_logit_bias(const cv_sampler_params *p, int32_t vocab_size, float *logits) {
    for (size_t i = 0; i < p->n_bias; i++) {
        int32_t id = p->bias_ids[i];
        if (id >= 0 && id < vocab_size) logits[id] += p->bias_values[i];
    }
}

/* vLLM's apply_penalties: repetition over prompt ∪ output (divide positive logits, multiply the
 * others), then frequency · count and presence · [count > 0] over the output. */
static void apply_penalties(const cv_sampler_params *p, const cv_sampler_state *st, float *logits) {
    bool repetition = repetition_active(p);
    if (!repetition && !output_penalties_active(p)) return;
    assert(st->out_count && (!repetition || st->in_prompt)); /* state made with other params */
    float r = p->repetition_penalty;
    for (int32_t j = 0; j < st->n_seen; j++) {
        int32_t id = st->seen[j];
        int32_t count = st->out_count[id];
        float x = logits[id];
        if (repetition) x = x > 0 ? x / r : x * r;
        x -= p->frequency_penalty * (float)count;
        if (count > 0) x -= p->presence_penalty;
        logits[id] = x;
    }
}

/* Returns the token to fall back on when no logit stays finite (see mask_stop_ids). */
static int32_t process_logits(const cv_sampler_params *p, const cv_sampler_state *st, float *logits) {
    mask_disallowed(p, st->vocab_size, logits);
    mask_bad_words(p, st, logits);
    int32_t fallback = mask_stop_ids(p, st, logits);
    add_logit_bias(p, st->vocab_size, logits);
    apply_penalties(p, st, logits);
    return fallback;
}

void cv_sampler_process_logits(const cv_sampler_params *p, const cv_sampler_state *st, float *logits) {
    process_logits(p, st, logits);
}

/* ---- vectorizable row passes ------------------------------------------------------------------ */

/* A single running maximum or sum is one long dependency chain (about 4 cycles per element); eight
 * independent lanes, combined at the end, let the compiler keep vector registers busy instead. The
 * lanes fix the order of operations, so results do not depend on whether it vectorizes. */
#define LANES 8

/* Maximum of a row, NaN ignored; -inf for an empty or all -inf/NaN row. */
static float row_max(const float *x, int32_t n) {
    float m[LANES];
    for (int j = 0; j < LANES; j++) m[j] = -INFINITY;
    int32_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    for (; i < n; i++) m[0] = x[i] > m[0] ? x[i] : m[0];
    float r = m[0];
    for (int j = 1; j < LANES; j++) r = m[j] > r ? m[j] : r;
    return r;
}

/* Whether any of x[0..LANES) is > t (resp. >= t); NaN never is. The scans below go a block at a
 * time and look at single tokens only in the rare blocks where this says so. GNU vector types
 * (GCC and Clang) make the test two SSE compares; as plain C the compiler keeps it scalar. */
typedef float cv_f32x4 __attribute__((vector_size(16)));
typedef int32_t cv_i32x4 __attribute__((vector_size(16)));
_Static_assert(LANES == 8, "the block tests read two 4-float vectors");

static inline bool mask_any(cv_i32x4 m) {
    uint64_t w[2];
    memcpy(w, &m, sizeof w);
    return (w[0] | w[1]) != 0;
}

static inline bool block_any_above(const float *x, float t) {
    cv_f32x4 a, b;
    memcpy(&a, x, sizeof a);
    memcpy(&b, x + 4, sizeof b);
    return mask_any((a > t) | (b > t));
}

static inline bool block_any_at_least(const float *x, float t) {
    cv_f32x4 a, b;
    memcpy(&a, x, sizeof a);
    memcpy(&b, x + 4, sizeof b);
    return mask_any((a >= t) | (b >= t));
}

/* a where x > threshold, else b (so b for a NaN x). Written with integer masks because under the
 * default -ftrapping-math GCC keeps a floating-point ?: whose result feeds arithmetic as a branch,
 * and these selects sit in row-wide loops that must vectorize. */
static inline float select_above(float x, float threshold, float a, float b) {
    int32_t mask = -(int32_t)(x > threshold), ia, ib;
    memcpy(&ia, &a, sizeof ia);
    memcpy(&ib, &b, sizeof ib);
    int32_t bits = (ia & mask) | (ib & ~mask);
    float r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

/* exp(min(x, 0)) as 2^k · e^r with k = round(x / ln 2), |r| <= ln(2)/2, and e^r from its Taylor
 * polynomial to degree 7 (truncation ~6e-9 relative; ~2 ulp overall). glibc's expf is a call the
 * compiler cannot vectorize, and exp over the whole vocabulary is the sampler's largest cost.
 * Arguments are logit - max, so <= 0 except for +inf logits (which count as the maximum: 1).
 * Results that would be subnormal (x <= -87) are flushed to 0, as are -inf and NaN. */
static inline float exp_nonpositive(float x) {
    const float log2e = 1.44269504f, ln2_hi = 0.693145751953125f, ln2_lo = 1.42860677e-06f;
    const float round_magic = 12582912.0f; /* 1.5 · 2^23: adding it rounds to an integer */
    float xc = select_above(x, -87.0f, x, -87.0f);
    xc = select_above(xc, 0.0f, 0.0f, xc);
    float k = (xc * log2e + round_magic) - round_magic;
    float r = (xc - k * ln2_hi) - k * ln2_lo; /* ln2_hi has few bits, so k · ln2_hi is exact */
    float p = 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return select_above(x, -87.0f, p * scale, 0.0f);
}

static inline float weight_of(const float *logits, int32_t id, float max) {
    return exp_nonpositive(logits[id] - max);
}

/* sum exp(x_i - max) over a row that is left alone. NaN weighs 0 and +inf 1 (exp_nonpositive), the
 * same as cleaning the row first when max is the cleaned maximum. */
static double sum_exp(const float *x, int32_t n, float max) {
    double acc[LANES] = {0};
    int32_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += exp_nonpositive(x[i + j] - max);
    for (; i < n; i++) acc[0] += exp_nonpositive(x[i] - max);
    double total = 0;
    for (int j = 0; j < LANES; j++) total += acc[j];
    return total;
}

/* Replaces each logit by its weight exp(x - max) and returns the sum. */
static double to_weights(float *x, int32_t n, float max) {
    double acc[LANES] = {0};
    int32_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int j = 0; j < LANES; j++) {
            x[i + j] = exp_nonpositive(x[i + j] - max);
            acc[j] += x[i + j];
        }
    }
    for (; i < n; i++) {
        x[i] = exp_nonpositive(x[i] - max);
        acc[0] += x[i];
    }
    double total = 0;
    for (int j = 0; j < LANES; j++) total += acc[j];
    return total;
}

/* ---- step 7: temperature, min_p, top_k, top_p ------------------------------------------------- */

/* Divides by the temperature, cleans NaN/inf, and returns the new maximum. */
static float scale_by_temperature(float *logits, int32_t n, float temperature) {
    for (int32_t i = 0; i < n; i++) logits[i] = clean_logit(logits[i] / temperature);
    return row_max(logits, n);
}

static void apply_min_p(float *logits, int32_t n, float max, float min_p) {
    /* The cap keeps the most likely token even for a (rejected upstream) min_p > 1. */
    float cut = fminf(max + logf(min_p), max);
    for (int32_t i = 0; i < n; i++) logits[i] = logits[i] < cut ? -INFINITY : logits[i];
}

/* Min-heap of token ids keyed by logit. */
static void id_heap_sift_down(int32_t *heap, int32_t n, int32_t i, const float *logits) {
    for (;;) {
        int32_t smallest = i, l = 2 * i + 1, r = l + 1;
        if (l < n && logits[heap[l]] < logits[heap[smallest]]) smallest = l;
        if (r < n && logits[heap[r]] < logits[heap[smallest]]) smallest = r;
        if (smallest == i) return;
        int32_t t = heap[i];
        heap[i] = heap[smallest];
        heap[smallest] = t;
        i = smallest;
    }
}

/* The k-th largest logit (counting duplicates), with `heap` (k entries) as workspace. */
static float kth_largest_logit(const float *logits, int32_t n, int32_t k, int32_t *heap) {
    assert(k > 0 && k <= n);
    for (int32_t i = 0; i < k; i++) heap[i] = i;
    for (int32_t i = k / 2 - 1; i >= 0; i--) id_heap_sift_down(heap, k, i, logits);
    float root = logits[heap[0]];
    for (int32_t block = k; block < n; block += LANES) {
        int32_t end = n - block > LANES ? block + LANES : n;
        if (end - block == LANES && !block_any_above(logits + block, root)) continue;
        for (int32_t i = block; i < end; i++) {
            if (logits[i] > root) {
                heap[0] = i;
                id_heap_sift_down(heap, k, 0, logits);
                root = logits[heap[0]];
            }
        }
    }
    return root;
}

/* Keeps the finite logits >= cut (their ids go to `ids`, ascending) and masks the rest. */
static int32_t keep_at_least(float *logits, int32_t n, float cut, int32_t *ids) {
    int32_t kept = 0;
    for (int32_t block = 0; block < n; block += LANES) {
        int32_t end = n - block > LANES ? block + LANES : n;
        if (end - block == LANES && !block_any_at_least(logits + block, cut)) {
            for (int32_t i = block; i < end; i++) logits[i] = -INFINITY;
            continue;
        }
        for (int32_t i = block; i < end; i++) {
            if (logits[i] >= cut && logits[i] > -INFINITY)
                ids[kept++] = i;
            else
                logits[i] = -INFINITY;
        }
    }
    return kept;
}

static int32_t keep_top_k(float *logits, int32_t n, int32_t k, int32_t *ids) {
    float kth = kth_largest_logit(logits, n, k, ids);
    return keep_at_least(logits, n, kth, ids);
}

/* Pre-filters the whole row for top_p (see the file comment; the vocabulary size stands in for the
 * number of finite logits, which only makes the cut more conservative) and returns the candidate
 * count; *total gets the weight of the whole row, which the nucleus is measured against. */
static int32_t top_p_candidates(float *logits, int32_t n, float max, float top_p, int32_t *ids,
                                double *total) {
    *total = sum_exp(logits, n, max);
    double negligible = 0.5 * (1.0 - (double)top_p) * *total / n;
    return keep_at_least(logits, n, (float)(max + log(negligible)), ids);
}

/* top_p's order: higher logit first, lower id first among equal logits. */
static inline bool ranks_before(const float *logits, int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
}

static inline void swap_ids(int32_t *ids, int32_t a, int32_t b) {
    int32_t t = ids[a];
    ids[a] = ids[b];
    ids[b] = t;
}

static int32_t median_of_three(const float *logits, const int32_t *ids, int32_t a, int32_t b, int32_t c) {
    if (ranks_before(logits, ids[a], ids[b])) {
        if (ranks_before(logits, ids[b], ids[c])) return b;
        return ranks_before(logits, ids[a], ids[c]) ? c : a;
    }
    if (ranks_before(logits, ids[a], ids[c])) return a;
    return ranks_before(logits, ids[b], ids[c]) ? c : b;
}

/* Reorders ids[0..n) so that the top_p nucleus is a prefix and returns its length (>= 1): a token is
 * kept when the weight ranked before it is < target. Quickselect with the invariant: ids[0..lo) are
 * kept and weigh `before`, ids[hi..n) are dropped, [lo, hi) is undecided and ranks between them. */
static int32_t nucleus_size(const float *logits, float max, int32_t *ids, int32_t n, double target) {
    assert(n > 0);
    int32_t lo = 0, hi = n;
    double before = 0;
    while (lo < hi) {
        int32_t last = hi - 1;
        swap_ids(ids, median_of_three(logits, ids, lo, lo + (hi - lo) / 2, last), last);
        int32_t pivot = ids[last], store = lo;
        double above = 0;
        for (int32_t j = lo; j < last; j++) {
            if (ranks_before(logits, ids[j], pivot)) {
                above += weight_of(logits, ids[j], max);
                swap_ids(ids, j, store++);
            }
        }
        swap_ids(ids, store, last);
        if (before + above >= target) {
            hi = store; /* the pivot is preceded by enough mass: it and all below it go */
        } else {
            before += above + weight_of(logits, pivot, max);
            lo = store + 1;
        }
    }
    return lo > 0 ? lo : 1;
}

static int32_t filter_row(const cv_sampler_params *p, float *logits, int32_t n, int32_t *ids, float *max_out) {
    assert(p->temperature >= CV_GREEDY_TEMPERATURE);
    float max = scale_by_temperature(logits, n, p->temperature);
    *max_out = max;
    if (max == -INFINITY) return 0;
    if (p->min_p > 0) apply_min_p(logits, n, max, p->min_p);
    bool use_top_k = p->top_k > 0 && p->top_k < n;
    bool use_top_p = p->top_p < 1.0f;
    if (!use_top_k && !use_top_p) return -1;

    int32_t kept;
    double total = 0;
    if (use_top_k) {
        kept = keep_top_k(logits, n, p->top_k, ids);
        if (!use_top_p) return kept;
        for (int32_t j = 0; j < kept; j++) total += weight_of(logits, ids[j], max);
    } else {
        kept = top_p_candidates(logits, n, max, p->top_p, ids, &total);
    }
    int32_t nucleus = nucleus_size(logits, max, ids, kept, (double)p->top_p * total);
    for (int32_t j = nucleus; j < kept; j++) logits[ids[j]] = -INFINITY;
    return nucleus;
}

int32_t cv_sampler_filter(const cv_sampler_params *p, float *logits, int32_t vocab_size, int32_t *ids) {
    float max;
    return filter_row(p, logits, vocab_size, ids, &max);
}

/* ---- the draw ---------------------------------------------------------------------------------- */

/* First index of the maximum (the lowest id wins ties; NaN never wins), or `fallback` when no
 * logit is above -inf. Two passes, because the maximum vectorizes and the search stops early. */
static int32_t argmax_or(const float *logits, int32_t n, int32_t fallback) {
    float max = row_max(logits, n);
    if (max == -INFINITY) return fallback;
    int32_t i = 0;
    while (i + LANES <= n && !block_any_at_least(logits + i, max)) i += LANES;
    while (logits[i] != max) i++;
    return i;
}

static int32_t exponential_race(const float *logits, float max, const int32_t *ids, int32_t n, cv_rng *rng) {
    int32_t best = ids[0];
    double best_score = -1;
    for (int32_t j = 0; j < n; j++) {
        double score = weight_of(logits, ids[j], max) / cv_rng_exponential(rng);
        if (score > best_score) {
            best_score = score;
            best = ids[j];
        }
    }
    return best;
}

/* Walking the cumulative sum element by element is a chain of dependent additions; per-block sums
 * let the walk skip to the right block first. */
#define CDF_BLOCK 1024

/* Turns the row into weights in place and finds where one uniform draw lands in their cumulative
 * sum. `block_sums` holds ceil(n / CDF_BLOCK) doubles. */
static int32_t inverse_cdf(float *logits, int32_t n, float max, double *block_sums, cv_rng *rng) {
    int32_t n_blocks = (n + CDF_BLOCK - 1) / CDF_BLOCK;
    double total = 0;
    for (int32_t b = 0; b < n_blocks; b++) {
        int32_t lo = b * CDF_BLOCK, len = n - lo < CDF_BLOCK ? n - lo : CDF_BLOCK;
        block_sums[b] = to_weights(logits + lo, len, max);
        total += block_sums[b];
    }
    double target = cv_rng_uniform(rng) * total, acc = 0;
    for (int32_t b = 0; b < n_blocks; b++) {
        if (acc + block_sums[b] <= target) {
            acc += block_sums[b];
            continue;
        }
        int32_t lo = b * CDF_BLOCK, hi = n - lo < CDF_BLOCK ? n : lo + CDF_BLOCK, last = -1;
        for (int32_t i = lo; i < hi; i++) {
            if (logits[i] > 0) {
                acc += logits[i];
                last = i;
                if (acc > target) return i;
            }
        }
        assert(last >= 0); /* the block's sum exceeded 0 */
        return last;       /* the element-wise sum rounded below the block sum */
    }
    /* Rounding put the target at the very end: the last token with weight. */
    int32_t i = n - 1;
    while (logits[i] == 0) i--; /* the maximum has weight 1, so this stops */
    return i;
}

/* The filtered row, for the processed logprobs modes (keep NULL: not wanted). */
static void keep_processed(const float *logits, int32_t n, float *keep) {
    if (keep) memcpy(keep, logits, (size_t)n * sizeof *keep);
}

static int32_t draw(const cv_sampler_params *p, cv_sampler_state *st, float *logits, int32_t *ids,
                    int32_t fallback, float *keep) {
    float max;
    int32_t n = filter_row(p, logits, st->vocab_size, ids, &max);
    keep_processed(logits, st->vocab_size, keep);
    if (n == 0) return fallback;
    if (n < 0) return inverse_cdf(logits, st->vocab_size, max, (double *)ids, &st->rng);
    return exponential_race(logits, max, ids, n, &st->rng);
}

/* Speculative decoding's rejection step for a draft token proposed with certainty (ngram and greedy
 * MTP drafts are point masses): accept it with probability p(draft) under the filtered target
 * distribution; otherwise draw from that distribution with the draft removed (renormalised). The
 * token this returns is distributed exactly as a plain draw would be. */
static int32_t draw_or_accept(const cv_sampler_params *p, cv_sampler_state *st, float *logits, int32_t *ids,
                              int32_t fallback, int32_t draft, float *keep) {
    float max;
    int32_t n = filter_row(p, logits, st->vocab_size, ids, &max);
    keep_processed(logits, st->vocab_size, keep);
    if (n == 0) return fallback;
    double total = n < 0 ? sum_exp(logits, st->vocab_size, max) : 0;
    for (int32_t j = 0; j < n; j++) total += weight_of(logits, ids[j], max);
    double p_draft = total > 0 ? weight_of(logits, draft, max) / total : 0;
    if (cv_rng_uniform(&st->rng) < p_draft) return draft;
    logits[draft] = -INFINITY;
    if (n < 0) {
        if (p_draft >= 1.0) return draft; /* nothing else has weight: cannot reject */
        return inverse_cdf(logits, st->vocab_size, max, (double *)ids, &st->rng);
    }
    int32_t kept = 0;
    for (int32_t j = 0; j < n; j++)
        if (ids[j] != draft) ids[kept++] = ids[j];
    return kept ? exponential_race(logits, max, ids, kept, &st->rng) : draft;
}

static int32_t sample_row(const cv_sampler_params *p, cv_sampler_state *st, float *logits, void *scratch,
                          int32_t draft, cv_sample_result *res) {
    int32_t n = st->vocab_size;
    int32_t *ids = scratch;
    float *row = (float *)scratch + n; /* the row the logprobs are of: raw, or processed */
    bool want_logprobs = p->logprobs >= 0;
    assert(res || !want_logprobs);
    for (cv_logits_proc *proc = st->procs; proc; proc = proc->next) proc->i->apply(proc, logits, n);
    if (want_logprobs && !p->processed) memcpy(row, logits, (size_t)n * sizeof *row);
    float *keep = want_logprobs && p->processed ? row : NULL;

    int32_t fallback = process_logits(p, st, logits), token;
    if (p->temperature < CV_GREEDY_TEMPERATURE) {
        keep_processed(logits, n, keep); /* greedy: no temperature or filters, as in vLLM */
        token = argmax_or(logits, n, fallback);
    } else if (draft >= 0 && draft < n) {
        token = draw_or_accept(p, st, logits, ids, fallback, draft, keep);
    } else {
        token = draw(p, st, logits, ids, fallback, keep);
    }
    if (!res) return token;
    res->token_id = token;
    if (want_logprobs) {
        res->n_top = p->logprobs < n ? p->logprobs : n;
        cv_logprobs_of(row, n, res->n_top, token, p->logits, res->top, &res->chosen);
    } else {
        res->n_top = 0;
        res->chosen = (cv_logprob_entry){.token_id = token, .logprob = 0, .rank = 0};
    }
    return token;
}

int32_t cv_sample(const cv_sampler_params *p, cv_sampler_state *st, float *logits, void *scratch,
                  cv_sample_result *res) {
    return sample_row(p, st, logits, scratch, -1, res);
}

int32_t cv_sample_verify(const cv_sampler_params *p, cv_sampler_state *st, float *logits, void *scratch,
                         int32_t draft, cv_sample_result *res) {
    return sample_row(p, st, logits, scratch, draft, res);
}

/* ---- raw logprobs ------------------------------------------------------------------------------ */

/* log_softmax as vLLM computes it in f32: (x - max) - log(sum exp(x - max)). */
typedef struct log_normaliser {
    float max;
    float log_sum;
} log_normaliser;

static log_normaliser log_normaliser_of(const float *logits, int32_t n) {
    log_normaliser z = {.max = clean_logit(row_max(logits, n)), .log_sum = 0};
    if (z.max > -INFINITY) z.log_sum = (float)log(sum_exp(logits, n, z.max));
    return z;
}

static inline float logprob_of(log_normaliser z, float logit) {
    if (z.max == -INFINITY) return -INFINITY; /* an all -inf row: nothing is possible */
    return (clean_logit(logit) - z.max) - z.log_sum;
}

/* vLLM's rank: how many tokens have a logprob >= `mine`. */
static int32_t count_at_least(const float *logits, int32_t n, log_normaliser z, float mine) {
    if (z.max == -INFINITY) return n;
    int32_t count = 0;
    for (int32_t i = 0; i < n; i++) count += (clean_logit(logits[i]) - z.max) - z.log_sum >= mine;
    return count;
}

/* While selecting, entry.logprob holds the cleaned logit. "Worse" = lower logit, or the same logit
 * and a higher id; the heap's root is the worst entry kept. */
static inline bool entry_worse(const cv_logprob_entry *a, const cv_logprob_entry *b) {
    return a->logprob < b->logprob || (a->logprob == b->logprob && a->token_id > b->token_id);
}

static void entry_heap_sift_down(cv_logprob_entry *heap, int32_t n, int32_t i) {
    for (;;) {
        int32_t worst = i, l = 2 * i + 1, r = l + 1;
        if (l < n && entry_worse(&heap[l], &heap[worst])) worst = l;
        if (r < n && entry_worse(&heap[r], &heap[worst])) worst = r;
        if (worst == i) return;
        cv_logprob_entry t = heap[i];
        heap[i] = heap[worst];
        heap[worst] = t;
        i = worst;
    }
}

/* Leaves top[0..k) holding the k best (logit desc, id asc), best first. */
static void select_top(const float *logits, int32_t n, int32_t k, cv_logprob_entry *top) {
    for (int32_t i = 0; i < k; i++) top[i] = (cv_logprob_entry){.token_id = i, .logprob = clean_logit(logits[i])};
    for (int32_t i = k / 2 - 1; i >= 0; i--) entry_heap_sift_down(top, k, i);
    for (int32_t block = k; block < n; block += LANES) {
        int32_t end = n - block > LANES ? block + LANES : n;
        if (end - block == LANES && !block_any_above(logits + block, top[0].logprob)) continue;
        for (int32_t i = block; i < end; i++) {
            /* ids arrive in increasing order, so a tie with the root is never better than it */
            float x = clean_logit(logits[i]);
            if (x > top[0].logprob) {
                top[0] = (cv_logprob_entry){.token_id = i, .logprob = x};
                entry_heap_sift_down(top, k, 0);
            }
        }
    }
    /* Heap sort: moving the worst to the end each time leaves the array best first. */
    for (int32_t end = k - 1; end > 0; end--) {
        cv_logprob_entry t = top[0];
        top[0] = top[end];
        top[end] = t;
        entry_heap_sift_down(top, end, 0);
    }
}

void cv_logprobs_of(const float *logits, int32_t vocab_size, int32_t n_top, int32_t token_id, bool as_logits,
                    cv_logprob_entry *top, cv_logprob_entry *chosen) {
    assert(token_id >= 0 && token_id < vocab_size);
    /* a zero normaliser leaves each value its cleaned logit; the order and the ranks are the same */
    log_normaliser z = as_logits ? (log_normaliser){.max = 0, .log_sum = 0} : log_normaliser_of(logits, vocab_size);
    int32_t k = n_top < vocab_size ? n_top : vocab_size;
    if (k > 0) {
        select_top(logits, vocab_size, k, top);
        for (int32_t i = 0; i < k; i++) {
            top[i].logprob = logprob_of(z, top[i].logprob);
            top[i].rank = i + 1;
        }
    }
    float mine = logprob_of(z, logits[token_id]);
    *chosen = (cv_logprob_entry){.token_id = token_id, .logprob = mine,
                                 .rank = count_at_least(logits, vocab_size, z, mine)};
}
