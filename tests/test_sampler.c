/*
 * test_sampler.c — the sampler against expectations the test computes on its own: processed logits
 * and kept sets exactly (small rows, values chosen away from every threshold), the draw's empirical
 * distribution with a chi-square bound (fixed seeds, so the result is deterministic, and each bound
 * is also shown to reject a wrong distribution), raw logprobs against a double-precision
 * log-softmax and a full sort, including one 151936-wide row like Qwen3's vocabulary.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "check.h"
#include "sample/sampler.h"

#define QWEN_VOCAB 151936

/* ---- helpers ---------------------------------------------------------------------------------- */

static cv_sampler_params neutral_params(void) {
    return (cv_sampler_params){.temperature = 1.0f, .top_p = 1.0f, .top_k = 0, .min_p = 0.0f,
                               .repetition_penalty = 1.0f, .logprobs = -1};
}

/* A sampling context: state + scratch + a working copy of the row, since cv_sample clobbers it. */
typedef struct sampler_fixture {
    cv_sampler_state st;
    int32_t vocab;
    void *scratch;
    float *work;
} sampler_fixture;

static void fixture_init(sampler_fixture *f, const cv_sampler_params *p, int32_t vocab, uint64_t seed,
                         const int32_t *prompt, size_t n_prompt) {
    cv_sampler_state_init(&f->st, p, vocab, seed, prompt, n_prompt);
    f->vocab = vocab;
    f->scratch = malloc(2 * (size_t)vocab * sizeof(float));
    f->work = malloc((size_t)vocab * sizeof(float));
}

static void fixture_free(sampler_fixture *f) {
    cv_sampler_state_free(&f->st);
    free(f->scratch);
    free(f->work);
}

static int32_t sample_once(sampler_fixture *f, const cv_sampler_params *p, const float *logits) {
    memcpy(f->work, logits, (size_t)f->vocab * sizeof(float));
    return cv_sample(p, &f->st, f->work, f->scratch, NULL);
}

/* Draw counts over `draws` samples of the same row (no accept: the row never changes). */
static void histogram(sampler_fixture *f, const cv_sampler_params *p, const float *logits, int draws,
                      int *counts) {
    memset(counts, 0, (size_t)f->vocab * sizeof *counts);
    for (int i = 0; i < draws; i++) {
        int32_t t = sample_once(f, p, logits);
        if (t >= 0 && t < f->vocab) counts[t]++;
    }
}

static void softmax_scaled(const float *logits, int n, double temperature, double *probs) {
    double max = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) max = fmax(max, logits[i] / temperature);
    for (int i = 0; i < n; i++) {
        probs[i] = isinf(logits[i]) ? 0 : exp(logits[i] / temperature - max);
        sum += probs[i];
    }
    for (int i = 0; i < n; i++) probs[i] /= sum;
}

/* Pearson's statistic over the tokens with expected probability > 0; any draw of a token with
 * probability 0 makes it infinite. */
static double chi_square(const int *counts, const double *probs, int n, int draws) {
    double stat = 0;
    for (int i = 0; i < n; i++) {
        if (probs[i] == 0) {
            if (counts[i]) return INFINITY;
            continue;
        }
        double e = probs[i] * draws, d = counts[i] - e;
        stat += d * d / e;
    }
    return stat;
}

/* A generous bound for dof degrees of freedom (mean dof, sd sqrt(2 dof)): about 6 sd above. For
 * 4 dof it is 21.0, around the 99.97th percentile. */
static double chi_square_bound(int dof) { return dof + 6.0 * sqrt(2.0 * dof); }

/* Deterministic test data, independent of the sampler's own RNG. */
static uint64_t lcg_state;
static double lcg_uniform(void) {
    lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(lcg_state >> 11) * 0x1.0p-53;
}
/* Roughly normal (sum of uniforms), scaled like real LLM logits. */
static float fake_logit(double scale) {
    double s = 0;
    for (int i = 0; i < 4; i++) s += lcg_uniform();
    return (float)((s - 2.0) * scale);
}

static bool finite_mask_equals(const float *logits, const bool *expected, int n) {
    for (int i = 0; i < n; i++)
        if ((logits[i] > -INFINITY) != expected[i]) return false;
    return true;
}

static bool ids_are_set(const int32_t *ids, int32_t n_ids, const bool *expected, int n) {
    int expected_count = 0;
    for (int i = 0; i < n; i++) expected_count += expected[i];
    if (n_ids != expected_count) return false;
    for (int32_t j = 0; j < n_ids; j++)
        if (ids[j] < 0 || ids[j] >= n || !expected[ids[j]]) return false;
    return true; /* right count, all distinct members (a repeat would leave one member out) */
}

/* (logit desc, id asc) order for qsort over ids, on the row in `sort_row`. */
static const float *sort_row;
static int by_logit_desc(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (sort_row[x] != sort_row[y]) return sort_row[x] > sort_row[y] ? -1 : 1;
    return x < y ? -1 : 1;
}

static int32_t *ids_sorted_by_logit(const float *logits, int n) {
    int32_t *order = malloc((size_t)n * sizeof *order);
    for (int i = 0; i < n; i++) order[i] = i;
    sort_row = logits;
    qsort(order, (size_t)n, sizeof *order, by_logit_desc);
    return order;
}

/* The nucleus by definition: walk in (logit desc, id asc) order, keep a token while the mass
 * before it is < top_p; at least one. */
static void expected_nucleus(const float *logits, int n, double top_p, bool *keep) {
    double *probs = malloc((size_t)n * sizeof *probs);
    softmax_scaled(logits, n, 1.0, probs);
    int32_t *order = ids_sorted_by_logit(logits, n);
    double before = 0;
    for (int j = 0; j < n; j++) {
        int32_t id = order[j];
        keep[id] = probs[id] > 0 && (j == 0 || before < top_p);
        before += probs[id];
    }
    free(order);
    free(probs);
}

/* ---- RNG ---------------------------------------------------------------------------------------- */

static void test_rng(void) {
    cv_rng a, b, c;
    cv_rng_seed(&a, 42);
    cv_rng_seed(&b, 42);
    cv_rng_seed(&c, 43);
    int same = 0, differ = 0;
    for (int i = 0; i < 100; i++) {
        uint64_t x = cv_rng_next(&a), y = cv_rng_next(&b), z = cv_rng_next(&c);
        same += x == y;
        differ += x != z;
    }
    CHECK_EQ_INT(same, 100);
    CHECK_EQ_INT(differ, 100);

    cv_rng zero;
    cv_rng_seed(&zero, 0);
    CHECK(zero.s[0] | zero.s[1] | zero.s[2] | zero.s[3]); /* xoshiro's forbidden state */

    const int n = 200000;
    double sum_u = 0, sum_e = 0, min_u = 1, max_u = 0, min_e = INFINITY;
    int low_quarter = 0;
    for (int i = 0; i < n; i++) {
        double u = cv_rng_uniform(&a), e = cv_rng_exponential(&a);
        sum_u += u;
        sum_e += e;
        min_u = fmin(min_u, u);
        max_u = fmax(max_u, u);
        min_e = fmin(min_e, e);
        low_quarter += u < 0.25;
    }
    CHECK(min_u >= 0 && max_u < 1);
    CHECK(min_e > 0);
    /* means: sd of the mean is 0.00065 (uniform) and 0.0022 (Exp(1)) */
    CHECK_MSG(fabs(sum_u / n - 0.5) < 0.004, "uniform mean %f", sum_u / n);
    CHECK_MSG(fabs(sum_e / n - 1.0) < 0.013, "exponential mean %f", sum_e / n);
    CHECK_MSG(abs(low_quarter - n / 4) < 6 * 194, "P(u < 1/4) count %d", low_quarter);
}

/* ---- greedy --------------------------------------------------------------------------------------- */

static void test_greedy(void) {
    cv_sampler_params p = neutral_params();
    p.temperature = 0.0f;
    sampler_fixture f;
    const float row[8] = {0.5f, 2.0f, -1.0f, 3.5f, 3.5f, -7.0f, 1.0f, 3.4f};
    fixture_init(&f, &p, 8, 1, NULL, 0);
    CHECK_EQ_INT(sample_once(&f, &p, row), 3); /* tie at 3.5: lowest id */

    p.temperature = 9e-6f; /* still below vLLM's epsilon */
    CHECK_EQ_INT(sample_once(&f, &p, row), 3);

    float with_nan[8];
    memcpy(with_nan, row, sizeof row);
    with_nan[0] = NAN;
    with_nan[7] = 100.0f;
    CHECK_EQ_INT(sample_once(&f, &p, with_nan), 7);
    with_nan[7] = NAN;
    with_nan[3] = NAN;
    CHECK_EQ_INT(sample_once(&f, &p, with_nan), 4);
    fixture_free(&f);
}

/* ---- temperature and the two draws ---------------------------------------------------------------- */

static void test_temperature_distribution(void) {
    const float row[5] = {1.0f, 2.0f, 0.0f, 2.5f, -1.0f};
    const int draws = 20000;
    int counts[5];
    double probs_cold[5], probs_hot[5];
    softmax_scaled(row, 5, 0.5, probs_cold);
    softmax_scaled(row, 5, 2.0, probs_hot);
    sampler_fixture f;
    cv_sampler_params p = neutral_params();
    fixture_init(&f, &p, 5, 12345, NULL, 0);

    p.temperature = 0.5f;
    histogram(&f, &p, row, draws, counts);
    double fit = chi_square(counts, probs_cold, 5, draws), misfit = chi_square(counts, probs_hot, 5, draws);
    CHECK_MSG(fit < chi_square_bound(4), "T=0.5 chi2 %f", fit);
    CHECK_MSG(misfit > chi_square_bound(4), "T=0.5 draws fit T=2 too well: %f", misfit);

    p.temperature = 2.0f;
    histogram(&f, &p, row, draws, counts);
    fit = chi_square(counts, probs_hot, 5, draws);
    misfit = chi_square(counts, probs_cold, 5, draws);
    CHECK_MSG(fit < chi_square_bound(4), "T=2 chi2 %f", fit);
    CHECK_MSG(misfit > chi_square_bound(4), "T=2 draws fit T=0.5 too well: %f", misfit);
    fixture_free(&f);
}

/* top_k = vocab - 1 goes through the exponential race instead of the inverse CDF. */
static void test_race_distribution(void) {
    const float row[6] = {0.3f, 1.2f, -0.4f, 0.9f, -3.0f, 0.0f};
    const int draws = 20000;
    int counts[6];
    float kept[6];
    memcpy(kept, row, sizeof row);
    kept[4] = -INFINITY; /* the one token top_k = 5 removes */
    double probs[6];
    softmax_scaled(kept, 6, 0.8, probs);
    sampler_fixture f;
    cv_sampler_params p = neutral_params();
    p.temperature = 0.8f;
    p.top_k = 5;
    fixture_init(&f, &p, 6, 777, NULL, 0);
    histogram(&f, &p, row, draws, counts);
    CHECK_EQ_INT(counts[4], 0);
    double fit = chi_square(counts, probs, 6, draws);
    CHECK_MSG(fit < chi_square_bound(4), "race chi2 %f", fit);
    double uniform[6] = {0.2, 0.2, 0.2, 0.2, 0, 0.2};
    CHECK(chi_square(counts, uniform, 6, draws) > chi_square_bound(4));
    fixture_free(&f);
}

static void test_top_k_one_is_greedy(void) {
    enum { V = 50 };
    float row[V];
    cv_sampler_params p = neutral_params();
    p.temperature = 1.5f;
    p.top_k = 1;
    cv_sampler_params greedy = neutral_params();
    greedy.temperature = 0;
    sampler_fixture f;
    fixture_init(&f, &p, V, 99, NULL, 0);
    lcg_state = 5;
    int agree = 0;
    for (int trial = 0; trial < 200; trial++) {
        for (int i = 0; i < V; i++) row[i] = fake_logit(3.0);
        agree += sample_once(&f, &p, row) == sample_once(&f, &greedy, row);
    }
    CHECK_EQ_INT(agree, 200);
    fixture_free(&f);
}

/* ---- filters ------------------------------------------------------------------------------------- */

static void test_top_k_set(void) {
    const float row[10] = {1.0f, 5.0f, 3.0f, 3.0f, -2.0f, 4.0f, 3.0f, 0.0f, 2.9f, 6.0f};
    int32_t ids[10];
    float work[10];
    cv_sampler_params p = neutral_params();

    p.top_k = 3; /* 6, 5, 4 */
    memcpy(work, row, sizeof row);
    int32_t n = cv_sampler_filter(&p, work, 10, ids);
    const bool top3[10] = {[9] = true, [1] = true, [5] = true};
    CHECK(finite_mask_equals(work, top3, 10));
    CHECK(ids_are_set(ids, n, top3, 10));

    p.top_k = 4; /* the 4th largest is 3.0, held by three tokens: vLLM keeps all ties */
    memcpy(work, row, sizeof row);
    n = cv_sampler_filter(&p, work, 10, ids);
    const bool top4[10] = {[9] = true, [1] = true, [5] = true, [2] = true, [3] = true, [6] = true};
    CHECK(finite_mask_equals(work, top4, 10));
    CHECK(ids_are_set(ids, n, top4, 10));

    /* surviving logits are the temperature-scaled originals */
    p.temperature = 0.5f;
    memcpy(work, row, sizeof row);
    cv_sampler_filter(&p, work, 10, ids);
    CHECK(work[9] == 12.0f && work[2] == 6.0f);

    /* off: top_k >= vocab, <= 0; top_p = 1 */
    p.temperature = 1.0f;
    for (int k = -1; k <= 12; k += 13) {
        p.top_k = k;
        memcpy(work, row, sizeof row);
        CHECK_EQ_INT(cv_sampler_filter(&p, work, 10, ids), -1);
        CHECK(memcmp(work, row, sizeof row) == 0);
    }
    p.top_k = 10;
    memcpy(work, row, sizeof row);
    CHECK_EQ_INT(cv_sampler_filter(&p, work, 10, ids), -1);

    /* empirically only survivors come out */
    p.top_k = 3;
    p.temperature = 3.0f;
    sampler_fixture f;
    fixture_init(&f, &p, 10, 2024, NULL, 0);
    int counts[10];
    histogram(&f, &p, row, 5000, counts);
    int outside = 0, inside_hits = 0;
    for (int i = 0; i < 10; i++) {
        if (!top3[i]) outside += counts[i];
        else inside_hits += counts[i] > 0;
    }
    CHECK_EQ_INT(outside, 0);
    CHECK_EQ_INT(inside_hits, 3);
    fixture_free(&f);
}

static void test_top_p_set(void) {
    /* probs ~ {0.096, 0.432, 0.262, 0.159, 0.035, 0.016}; by rank 1, 2, 3, 0, 4, 5 the mass before
     * each is 0, 0.432, 0.694, 0.852, 0.949, 0.984 */
    const float row[6] = {-0.5f, 1.0f, 0.5f, 0.0f, -1.5f, -2.3f};
    const int32_t by_rank[6] = {1, 2, 3, 0, 4, 5};
    int32_t ids[6];
    float work[6];
    cv_sampler_params p = neutral_params();
    const float top_ps[] = {0.3f, 0.5f, 0.68f, 0.70f, 0.9f, 0.97f, 0.99f};
    const int expected_sizes[] = {1, 2, 2, 3, 4, 5, 6};
    for (size_t t = 0; t < CV_ARRAY_LEN(top_ps); t++) {
        p.top_p = top_ps[t];
        bool keep[6] = {false};
        for (int j = 0; j < expected_sizes[t]; j++) keep[by_rank[j]] = true;
        bool reference[6];
        expected_nucleus(row, 6, top_ps[t], reference);
        CHECK(memcmp(keep, reference, sizeof keep) == 0); /* the hand-made table matches the definition */
        memcpy(work, row, sizeof row);
        int32_t n = cv_sampler_filter(&p, work, 6, ids);
        CHECK_MSG(finite_mask_equals(work, keep, 6), "top_p %.2f", top_ps[t]);
        CHECK_MSG(ids_are_set(ids, n, keep, 6), "top_p %.2f", top_ps[t]);
    }

    /* ties: three equal logits, top_p that needs two of them keeps the two lowest ids */
    const float ties[4] = {0.0f, 0.0f, 0.0f, -10.0f};
    p.top_p = 0.5f;
    memcpy(work, ties, sizeof ties);
    int32_t n = cv_sampler_filter(&p, work, 4, ids);
    const bool two_lowest[4] = {true, true, false, false};
    CHECK(finite_mask_equals(work, two_lowest, 4));
    CHECK(ids_are_set(ids, n, two_lowest, 4));

    /* a tiny top_p keeps exactly the most likely token */
    p.top_p = 1e-6f;
    memcpy(work, row, sizeof row);
    n = cv_sampler_filter(&p, work, 6, ids);
    CHECK(n == 1 && ids[0] == 1);

    /* top_k then top_p: the nucleus is measured within the top-k renormalised distribution.
     * top_k=3 keeps {1,2,3}, renormalised 0.507, 0.307, 0.186: the mass before each 0, 0.507, 0.814 */
    p.top_k = 3;
    p.top_p = 0.8f;
    memcpy(work, row, sizeof row);
    n = cv_sampler_filter(&p, work, 6, ids);
    const bool k3p8[6] = {[1] = true, [2] = true};
    CHECK(finite_mask_equals(work, k3p8, 6));
    CHECK(ids_are_set(ids, n, k3p8, 6));
    p.top_p = 0.85f;
    memcpy(work, row, sizeof row);
    n = cv_sampler_filter(&p, work, 6, ids);
    const bool k3p85[6] = {[1] = true, [2] = true, [3] = true};
    CHECK(ids_are_set(ids, n, k3p85, 6));

    /* empirically: draws land only on the nucleus, in proportion to the renormalised probs */
    p.top_k = 0;
    p.top_p = 0.77f;
    sampler_fixture f;
    fixture_init(&f, &p, 6, 31337, NULL, 0);
    int counts[6];
    histogram(&f, &p, row, 20000, counts);
    float nucleus_row[6] = {-INFINITY, 1.0f, 0.5f, 0.0f, -INFINITY, -INFINITY};
    double probs[6];
    softmax_scaled(nucleus_row, 6, 1.0, probs);
    double fit = chi_square(counts, probs, 6, 20000);
    CHECK_MSG(fit < chi_square_bound(2), "top_p chi2 %f", fit);
    fixture_free(&f);
}

/* The pre-filter + quickselect path on a vocabulary-sized row, against a full sort. */
static void test_top_p_wide(void) {
    float *row = malloc(QWEN_VOCAB * sizeof *row), *work = malloc(QWEN_VOCAB * sizeof *work);
    int32_t *ids = malloc(QWEN_VOCAB * sizeof *ids);
    bool *keep = malloc(QWEN_VOCAB * sizeof *keep);
    lcg_state = 17;
    for (int i = 0; i < QWEN_VOCAB; i++) row[i] = fake_logit(6.0);
    row[4242] = 14.0f; /* a clear favourite, as in real rows */
    cv_sampler_params p = neutral_params();
    const float top_ps[] = {0.5f, 0.9f, 0.95f};
    for (size_t t = 0; t < CV_ARRAY_LEN(top_ps); t++) {
        p.top_p = top_ps[t];
        expected_nucleus(row, QWEN_VOCAB, top_ps[t], keep);
        memcpy(work, row, QWEN_VOCAB * sizeof *row);
        int32_t n = cv_sampler_filter(&p, work, QWEN_VOCAB, ids);
        CHECK_MSG(n > 1, "nucleus of %d tokens", n);
        CHECK_MSG(finite_mask_equals(work, keep, QWEN_VOCAB), "top_p %.2f", top_ps[t]);
        CHECK_MSG(ids_are_set(ids, n, keep, QWEN_VOCAB), "top_p %.2f", top_ps[t]);
    }
    free(row);
    free(work);
    free(ids);
    free(keep);
}

static void test_min_p(void) {
    /* relative probs exp(l - 3): 1, 0.368, 0.135, 0.0498, 0.0067 */
    const float row[5] = {2.0f, 3.0f, 1.0f, 0.0f, -2.0f};
    int32_t ids[5];
    float work[5];
    cv_sampler_params p = neutral_params();
    p.min_p = 0.1f;
    memcpy(work, row, sizeof row);
    CHECK_EQ_INT(cv_sampler_filter(&p, work, 5, ids), -1); /* min_p alone does not list survivors */
    const bool keep[5] = {true, true, true, false, false};
    CHECK(finite_mask_equals(work, keep, 5));

    /* applied after temperature: at T = 0.5 the ratios square (0.135, 0.018, ...) */
    p.temperature = 0.5f;
    memcpy(work, row, sizeof row);
    cv_sampler_filter(&p, work, 5, ids);
    const bool keep_cold[5] = {true, true, false, false, false};
    CHECK(finite_mask_equals(work, keep_cold, 5));

    /* min_p = 0 is off; min_p = 1 keeps only the maximum */
    p.temperature = 1.0f;
    p.min_p = 0.0f;
    memcpy(work, row, sizeof row);
    cv_sampler_filter(&p, work, 5, ids);
    CHECK(memcmp(work, row, sizeof row) == 0);
    p.min_p = 1.0f;
    memcpy(work, row, sizeof row);
    cv_sampler_filter(&p, work, 5, ids);
    const bool only_max[5] = {false, true, false, false, false};
    CHECK(finite_mask_equals(work, only_max, 5));

    /* empirically */
    p.min_p = 0.1f;
    sampler_fixture f;
    fixture_init(&f, &p, 5, 5, NULL, 0);
    int counts[5];
    histogram(&f, &p, row, 20000, counts);
    float kept_row[5] = {2.0f, 3.0f, 1.0f, -INFINITY, -INFINITY};
    double probs[5];
    softmax_scaled(kept_row, 5, 1.0, probs);
    double fit = chi_square(counts, probs, 5, 20000);
    CHECK_MSG(fit < chi_square_bound(2), "min_p chi2 %f", fit);
    fixture_free(&f);
}

/* ---- processing: penalties, bias, min_tokens ------------------------------------------------------- */

static void test_repetition_penalty(void) {
    const float row[8] = {2.0f, -1.0f, 0.0f, 4.0f, -3.0f, 1.0f, 5.0f, -0.5f};
    const int32_t prompt[3] = {0, 1, 1};
    cv_sampler_params p = neutral_params();
    p.repetition_penalty = 2.0f;
    cv_sampler_state st;
    cv_sampler_state_init(&st, &p, 8, 1, prompt, 3);
    CHECK(st.in_prompt && st.out_count);
    cv_sampler_accept(&st, 3);
    cv_sampler_accept(&st, 4);
    cv_sampler_accept(&st, 3);
    cv_sampler_accept(&st, 0); /* in the prompt and the output: penalised once */
    float work[8];
    memcpy(work, row, sizeof row);
    cv_sampler_process_logits(&p, &st, work);
    const float expected[8] = {1.0f, -2.0f, 0.0f, 2.0f, -6.0f, 1.0f, 5.0f, -0.5f};
    CHECK(memcmp(work, expected, sizeof expected) == 0);
    CHECK_EQ_INT(st.n_generated, 4);
    CHECK_EQ_INT(st.out_count[3], 2);
    cv_sampler_state_free(&st);

    /* a penalty below 1 rewards repeats instead */
    p.repetition_penalty = 0.5f;
    cv_sampler_state_init(&st, &p, 8, 1, prompt, 3);
    memcpy(work, row, sizeof row);
    cv_sampler_process_logits(&p, &st, work);
    CHECK(work[0] == 4.0f && work[1] == -0.5f && work[3] == 4.0f);
    cv_sampler_state_free(&st);
}

static void test_frequency_presence(void) {
    const float row[6] = {1.0f, 2.0f, 3.0f, -1.0f, 0.5f, 0.0f};
    const int32_t prompt[2] = {4, 5}; /* prompt tokens are not output: untouched here */
    cv_sampler_params p = neutral_params();
    p.frequency_penalty = 0.5f;
    cv_sampler_state st;
    cv_sampler_state_init(&st, &p, 6, 1, prompt, 2);
    CHECK(st.in_prompt == NULL); /* no repetition penalty, no prompt bookkeeping */
    const int32_t out[5] = {2, 2, 2, 3, 0};
    for (int i = 0; i < 5; i++) cv_sampler_accept(&st, out[i]);
    float work[6];
    memcpy(work, row, sizeof row);
    cv_sampler_process_logits(&p, &st, work);
    const float freq_expected[6] = {0.5f, 2.0f, 1.5f, -1.5f, 0.5f, 0.0f};
    CHECK(memcmp(work, freq_expected, sizeof work) == 0);
    cv_sampler_state_free(&st);

    p.frequency_penalty = 0.0f;
    p.presence_penalty = 0.75f;
    cv_sampler_state_init(&st, &p, 6, 1, prompt, 2);
    for (int i = 0; i < 5; i++) cv_sampler_accept(&st, out[i]);
    memcpy(work, row, sizeof row);
    cv_sampler_process_logits(&p, &st, work);
    const float presence_expected[6] = {0.25f, 2.0f, 2.25f, -1.75f, 0.5f, 0.0f};
    CHECK(memcmp(work, presence_expected, sizeof work) == 0);
    cv_sampler_state_free(&st);

    /* all three: repetition first (prompt 4,5 and output), then frequency, then presence;
     * negative values reward tokens the same way */
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.25f;
    p.presence_penalty = -1.0f;
    cv_sampler_state_init(&st, &p, 6, 1, prompt, 2);
    for (int i = 0; i < 5; i++) cv_sampler_accept(&st, out[i]);
    memcpy(work, row, sizeof row);
    cv_sampler_process_logits(&p, &st, work);
    /* 0: 1/2 - .25 + 1; 1: untouched; 2: 3/2 - .75 + 1; 3: -1*2 - .25 + 1; 4: .5/2; 5: 0*2 */
    const float all_expected[6] = {1.25f, 2.0f, 1.75f, -1.25f, 0.25f, 0.0f};
    CHECK(memcmp(work, all_expected, sizeof work) == 0);
    cv_sampler_state_free(&st);

    /* no penalty: no bookkeeping at all, and processing leaves the row alone */
    p = neutral_params();
    cv_sampler_state_init(&st, &p, 6, 1, prompt, 2);
    CHECK(st.out_count == NULL && st.in_prompt == NULL && st.seen == NULL);
    cv_sampler_accept(&st, 2);
    CHECK_EQ_INT(st.n_generated, 1);
    memcpy(work, row, sizeof row);
    cv_sampler_process_logits(&p, &st, work);
    CHECK(memcmp(work, row, sizeof row) == 0);
    cv_sampler_state_free(&st);
}

static void test_logit_bias(void) {
    const float row[5] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
    const int32_t ids[3] = {0, 3, 0};
    const float bias[3] = {10.0f, -100.0f, 0.5f}; /* a repeated id adds up */
    cv_sampler_params p = neutral_params();
    p.bias_ids = ids;
    p.bias_values = bias;
    p.n_bias = 3;
    cv_sampler_state st;
    cv_sampler_state_init(&st, &p, 5, 1, NULL, 0);
    float work[5];
    memcpy(work, row, sizeof row);
    cv_sampler_process_logits(&p, &st, work);
    const float expected[5] = {11.5f, 2.0f, 3.0f, -96.0f, 5.0f};
    CHECK(memcmp(work, expected, sizeof work) == 0);

    /* the bias decides greedy, and it runs before the repetition penalty: (5 + 1) / 2 = 3 < 4 */
    p.temperature = 0;
    sampler_fixture f;
    fixture_init(&f, &p, 5, 1, NULL, 0);
    CHECK_EQ_INT(sample_once(&f, &p, row), 0);
    fixture_free(&f);
    const int32_t prompt[1] = {4};
    const int32_t plus_ids[1] = {4};
    const float plus_one[1] = {1.0f};
    p.bias_ids = plus_ids;
    p.bias_values = plus_one;
    p.n_bias = 1;
    p.repetition_penalty = 2.0f;
    fixture_init(&f, &p, 5, 1, prompt, 1);
    CHECK_EQ_INT(sample_once(&f, &p, row), 3);
    fixture_free(&f);
    cv_sampler_state_free(&st);
}

static void test_min_tokens(void) {
    const float row[6] = {0.0f, 1.0f, 2.0f, 9.0f, 3.0f, 8.0f};
    const int32_t stops[3] = {3, 5, 1000000}; /* an id outside the vocabulary is ignored */
    cv_sampler_params p = neutral_params();
    p.temperature = 0;
    p.min_tokens = 2;
    p.stop_ids = stops;
    p.n_stop_ids = 3;
    sampler_fixture f;
    fixture_init(&f, &p, 6, 1, NULL, 0);
    memcpy(f.work, row, sizeof row);
    cv_sampler_process_logits(&p, &f.st, f.work);
    CHECK(isinf(f.work[3]) && f.work[3] < 0 && isinf(f.work[5]) && f.work[4] == 3.0f);

    CHECK_EQ_INT(sample_once(&f, &p, row), 4);
    cv_sampler_accept(&f.st, 4);
    CHECK_EQ_INT(sample_once(&f, &p, row), 4);
    cv_sampler_accept(&f.st, 4);
    CHECK_EQ_INT(sample_once(&f, &p, row), 3); /* two tokens generated: eos allowed again */

    /* sampling never draws a masked stop id while masked */
    cv_sampler_params hot = p;
    hot.temperature = 5.0f;
    hot.min_tokens = 1000;
    int counts[6];
    histogram(&f, &hot, row, 3000, counts);
    CHECK_EQ_INT(counts[3] + counts[5], 0);
    fixture_free(&f);
}

/* ---- allowed_token_ids, bad_words -------------------------------------------------------------- */

static bool is_neg_inf(float x) { return isinf(x) && x < 0; }

static void test_allowed_ids(void) {
    const float row[8] = {7.0f, 1.0f, 6.0f, 2.0f, 3.0f, 9.0f, 0.5f, 8.0f};
    const int32_t allowed[3] = {1, 4, 6};
    cv_sampler_params p = neutral_params();
    p.allowed_ids = allowed;
    p.n_allowed = 3;
    sampler_fixture f;
    fixture_init(&f, &p, 8, 1, NULL, 0);
    memcpy(f.work, row, sizeof row);
    cv_sampler_process_logits(&p, &f.st, f.work);
    for (int i = 0; i < 8; i++)
        CHECK_MSG(i == 1 || i == 4 || i == 6 ? f.work[i] == row[i] : is_neg_inf(f.work[i]), "id %d: %g", i, f.work[i]);

    /* the draw stays inside the set, in proportion to the allowed tokens' own weights */
    int counts[8];
    histogram(&f, &p, row, 6000, counts);
    double probs[8];
    float masked[8];
    for (int i = 0; i < 8; i++) masked[i] = i == 1 || i == 4 || i == 6 ? row[i] : -INFINITY;
    softmax_scaled(masked, 8, 1.0, probs);
    CHECK_MSG(chi_square(counts, probs, 8, 6000) < chi_square_bound(2), "allowed set draw is off");

    /* greedy: the best allowed logit, not the best logit; the bias cannot bring a masked id back,
     * and min_tokens masks an allowed stop id on top of the set */
    cv_sampler_params g = p;
    g.temperature = 0;
    CHECK_EQ_INT(sample_once(&f, &g, row), 4);
    const int32_t bias_ids[2] = {5, 1};
    const float bias[2] = {100.0f, 1.5f};
    g.bias_ids = bias_ids;
    g.bias_values = bias;
    g.n_bias = 2;
    CHECK_EQ_INT(sample_once(&f, &g, row), 4); /* 1 + 1.5 = 2.5 < 3 */
    memcpy(f.work, row, sizeof row);
    cv_sampler_process_logits(&g, &f.st, f.work);
    CHECK(is_neg_inf(f.work[5]) && f.work[1] == 2.5f && f.work[4] == 3.0f);
    fixture_free(&f);
}

static void test_allowed_ids_min_tokens(void) {
    const float row[6] = {0.0f, 1.0f, 2.0f, 9.0f, 3.0f, 8.0f};
    const int32_t allowed[2] = {2, 3}, stops[2] = {3, 5};
    cv_sampler_params p = neutral_params();
    p.temperature = 0;
    p.allowed_ids = allowed;
    p.n_allowed = 2;
    p.min_tokens = 1;
    p.stop_ids = stops;
    p.n_stop_ids = 2;
    sampler_fixture f;
    fixture_init(&f, &p, 6, 1, NULL, 0);
    CHECK_EQ_INT(sample_once(&f, &p, row), 2); /* eos 3 waits for min_tokens; 5 is not allowed */
    cv_sampler_accept(&f.st, 2);
    CHECK_EQ_INT(sample_once(&f, &p, row), 3);

    /* only stop ids allowed while min_tokens holds: nothing survives, and the fallback is the
     * allowed stop id, never the better one outside the set */
    const int32_t only_eos[1] = {3};
    cv_sampler_params q = p;
    q.allowed_ids = only_eos;
    q.n_allowed = 1;
    q.min_tokens = 5;
    CHECK_EQ_INT(sample_once(&f, &q, row), 3);
    q.temperature = 1.0f;
    CHECK_EQ_INT(sample_once(&f, &q, row), 3);
    fixture_free(&f);
}

static void test_bad_words(void) {
    /* words: [4] (one token: always banned), [1 2] (2 after a 1), [3 1 0] (0 after 3 1) */
    int32_t ids[6] = {4, 1, 2, 3, 1, 0}, starts[4] = {0, 1, 3, 6};
    cv_token_seqs words = {ids, starts, 3};
    const float row[6] = {9.0f, 1.0f, 8.0f, 2.0f, 10.0f, 3.0f};
    cv_sampler_params p = neutral_params();
    p.temperature = 0;
    p.bad_words = &words;
    sampler_fixture f;
    fixture_init(&f, &p, 6, 1, NULL, 0);
    CHECK_EQ_INT(f.st.cap_recent, 2);
    memcpy(f.work, row, sizeof row);
    cv_sampler_process_logits(&p, &f.st, f.work);
    for (int i = 0; i < 6; i++) CHECK(i == 4 ? is_neg_inf(f.work[i]) : f.work[i] == row[i]);
    CHECK_EQ_INT(sample_once(&f, &p, row), 0);

    /* output ... 3 1: both [1 2] and [3 1 0] are completed by the next token */
    cv_sampler_accept(&f.st, 5);
    cv_sampler_accept(&f.st, 3);
    cv_sampler_accept(&f.st, 1);
    memcpy(f.work, row, sizeof row);
    cv_sampler_process_logits(&p, &f.st, f.work);
    for (int i = 0; i < 6; i++) CHECK(i == 4 || i == 2 || i == 0 ? is_neg_inf(f.work[i]) : f.work[i] == row[i]);
    CHECK_EQ_INT(sample_once(&f, &p, row), 5);
    /* ... 1 1: only [1 2] (the ring has wrapped several times by now) */
    cv_sampler_accept(&f.st, 1);
    CHECK_EQ_INT(sample_once(&f, &p, row), 0);
    cv_sampler_accept(&f.st, 0);
    CHECK_EQ_INT(sample_once(&f, &p, row), 0);

    /* the ban is hard: a bias cannot undo it, and sampling never draws a banned token */
    const int32_t bias_id[1] = {4};
    const float bias[1] = {1000.0f};
    cv_sampler_params hot = p;
    hot.temperature = 3.0f;
    hot.bias_ids = bias_id;
    hot.bias_values = bias;
    hot.n_bias = 1;
    cv_sampler_accept(&f.st, 1);
    int counts[6];
    histogram(&f, &hot, row, 2000, counts);
    CHECK_EQ_INT(counts[4] + counts[2], 0);
    CHECK(counts[0] > 0 && counts[1] > 0 && counts[3] > 0 && counts[5] > 0);
    fixture_free(&f);

    /* the prompt is not the output: a prompt ending in 1 bans nothing, and one-token words alone
     * need no ring */
    const int32_t prompt[2] = {3, 1};
    starts[1] = 1;
    words.n = 1;
    fixture_init(&f, &p, 6, 1, prompt, 2);
    CHECK(f.st.recent == NULL && f.st.cap_recent == 0);
    fixture_free(&f);
    words.n = 2;
    fixture_init(&f, &p, 6, 1, prompt, 2);
    CHECK_EQ_INT(sample_once(&f, &p, row), 0);
    memcpy(f.work, row, sizeof row);
    cv_sampler_process_logits(&p, &f.st, f.work);
    CHECK(f.work[2] == row[2]);
    fixture_free(&f);
}

/* min_tokens masks the stop ids the bad words left: the fallback is the best of those, and with
 * everything banned it is token 0 */
static void test_bad_words_min_tokens(void) {
    int32_t ids[1] = {3}, starts[2] = {0, 1};
    cv_token_seqs words = {ids, starts, 1};
    const float only_stops[4] = {-INFINITY, 2.0f, -INFINITY, 3.0f};
    const int32_t stops[2] = {1, 3};
    cv_sampler_params p = neutral_params();
    p.temperature = 0;
    p.bad_words = &words;
    p.min_tokens = 5;
    p.stop_ids = stops;
    p.n_stop_ids = 2;
    sampler_fixture f;
    fixture_init(&f, &p, 4, 1, NULL, 0);
    CHECK_EQ_INT(sample_once(&f, &p, only_stops), 1);
    ids[0] = 1;
    const int32_t allowed[1] = {3};
    p.allowed_ids = allowed;
    p.n_allowed = 1;
    CHECK_EQ_INT(sample_once(&f, &p, only_stops), 3);
    ids[0] = 3;
    CHECK_EQ_INT(sample_once(&f, &p, only_stops), 0);
    fixture_free(&f);
}

/* ---- logprobs --------------------------------------------------------------------------------------- */

static void reference_logprobs(const float *row, int n, double *lp) {
    double max = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) max = fmax(max, row[i]);
    for (int i = 0; i < n; i++) sum += exp(row[i] - max);
    for (int i = 0; i < n; i++) lp[i] = row[i] - max - log(sum);
}

static void test_logprobs_small(void) {
    const float row[7] = {0.5f, 3.0f, -1.0f, 3.0f, 2.0f, -4.0f, 1.0f};
    double lp[7];
    reference_logprobs(row, 7, lp);
    cv_logprob_entry top[7], chosen;

    cv_logprobs_of(row, 7, 3, 6, false, top, &chosen);
    const int32_t order[3] = {1, 3, 4}; /* tie 1/3: lower id first */
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(top[i].token_id, order[i]);
        CHECK_EQ_INT(top[i].rank, i + 1);
        CHECK_MSG(fabs(top[i].logprob - lp[order[i]]) < 1e-6, "%f vs %f", top[i].logprob, lp[order[i]]);
    }
    CHECK_EQ_INT(chosen.token_id, 6); /* not in the top 3 */
    CHECK_EQ_INT(chosen.rank, 4);
    CHECK(fabs(chosen.logprob - lp[6]) < 1e-6);

    /* logprobs_mode raw_logits: the logits themselves, in the same order, with the same ranks */
    cv_logprob_entry top_logits[3], chosen_logit;
    cv_logprobs_of(row, 7, 3, 6, true, top_logits, &chosen_logit);
    for (int i = 0; i < 3; i++)
        CHECK(top_logits[i].token_id == order[i] && top_logits[i].rank == i + 1 && top_logits[i].logprob == row[order[i]]);
    CHECK(chosen_logit.token_id == 6 && chosen_logit.rank == 4 && chosen_logit.logprob == 1.0f);

    /* vLLM's rank counts ties: both tokens at 3.0 have rank 2 */
    cv_logprobs_of(row, 7, 0, 1, false, NULL, &chosen);
    CHECK_EQ_INT(chosen.rank, 2);
    cv_logprobs_of(row, 7, 0, 5, false, NULL, &chosen);
    CHECK_EQ_INT(chosen.rank, 7);

    /* n_top beyond the vocabulary is clamped: everything, sorted, probabilities summing to 1 */
    cv_logprobs_of(row, 7, 7, 0, false, top, &chosen);
    double total = 0;
    for (int i = 0; i < 7; i++) {
        total += exp(top[i].logprob);
        if (i) CHECK(top[i - 1].logprob >= top[i].logprob);
    }
    CHECK(fabs(total - 1) < 1e-5);

    /* through cv_sample: raw logprobs, untouched by temperature, bias and min_tokens */
    const int32_t bias_id[1] = {5};
    const float bias_v[1] = {50.0f};
    cv_sampler_params p = neutral_params();
    p.temperature = 0;
    p.bias_ids = bias_id;
    p.bias_values = bias_v;
    p.n_bias = 1;
    p.logprobs = 2;
    sampler_fixture f;
    fixture_init(&f, &p, 7, 1, NULL, 0);
    memcpy(f.work, row, sizeof row);
    cv_sample_result res = {.top = top};
    int32_t t = cv_sample(&p, &f.st, f.work, f.scratch, &res);
    CHECK_EQ_INT(t, 5);
    CHECK_EQ_INT(res.token_id, 5);
    CHECK_EQ_INT(res.n_top, 2);
    CHECK(top[0].token_id == 1 && top[1].token_id == 3);
    CHECK_EQ_INT(res.chosen.rank, 7);
    CHECK(fabs(res.chosen.logprob - lp[5]) < 1e-6);

    p.logprobs = 0; /* only the chosen entry */
    memcpy(f.work, row, sizeof row);
    res = (cv_sample_result){.top = NULL, .n_top = -1};
    cv_sample(&p, &f.st, f.work, f.scratch, &res);
    CHECK_EQ_INT(res.n_top, 0);
    CHECK(res.chosen.token_id == 5 && res.chosen.rank == 7);
    fixture_free(&f);
}

static void test_logprobs_wide(void) {
    float *row = malloc(QWEN_VOCAB * sizeof *row);
    lcg_state = 99;
    for (int i = 0; i < QWEN_VOCAB; i++) row[i] = fake_logit(5.0);
    row[100] = row[150000] = 20.0f; /* a tie at the top */
    row[7] = NAN;                   /* counts as -inf */
    float *clean = malloc(QWEN_VOCAB * sizeof *clean);
    memcpy(clean, row, QWEN_VOCAB * sizeof *row);
    clean[7] = -INFINITY;
    double *lp = malloc(QWEN_VOCAB * sizeof *lp);
    reference_logprobs(clean, QWEN_VOCAB, lp);
    int32_t *order = ids_sorted_by_logit(clean, QWEN_VOCAB);

    enum { N = 20 };
    cv_logprob_entry top[N], chosen;
    int32_t pick = order[5000]; /* far outside the top-N */
    cv_logprobs_of(row, QWEN_VOCAB, N, pick, false, top, &chosen);
    int order_ok = 0;
    for (int i = 0; i < N; i++)
        order_ok += top[i].token_id == order[i] && top[i].rank == i + 1 && fabs(top[i].logprob - lp[order[i]]) < 1e-5;
    CHECK_EQ_INT(order_ok, N);
    CHECK(top[0].token_id == 100 && top[1].token_id == 150000);
    int32_t at_least = 0;
    for (int i = 0; i < QWEN_VOCAB; i++) at_least += clean[i] >= clean[pick];
    CHECK_EQ_INT(chosen.rank, at_least);
    CHECK(fabs(chosen.logprob - lp[pick]) < 1e-5);

    cv_logprobs_of(row, QWEN_VOCAB, 0, 7, false, NULL, &chosen);
    CHECK(isinf(chosen.logprob) && chosen.logprob < 0);
    CHECK_EQ_INT(chosen.rank, QWEN_VOCAB);
    free(order);
    free(lp);
    free(clean);
    free(row);
}

/* ---- reproducibility -------------------------------------------------------------------------------- */

static void draw_sequence(const cv_sampler_params *p, uint64_t seed, const float *row, int n, int32_t *out) {
    sampler_fixture f;
    fixture_init(&f, p, 30, seed, NULL, 0);
    for (int i = 0; i < n; i++) out[i] = sample_once(&f, p, row);
    fixture_free(&f);
}

static void test_seeds(void) {
    enum { V = 30, N = 64 };
    float row[V];
    lcg_state = 3;
    for (int i = 0; i < V; i++) row[i] = fake_logit(1.0);
    cv_sampler_params variants[3] = {neutral_params(), neutral_params(), neutral_params()};
    variants[1].top_k = 10; /* the race */
    variants[2].top_p = 0.9f;
    for (int v = 0; v < 3; v++) {
        int32_t a[N], b[N], c[N];
        draw_sequence(&variants[v], 1234, row, N, a);
        /* another stream running in between does not matter: the state owns its generator */
        draw_sequence(&variants[v], 999, row, N, c);
        draw_sequence(&variants[v], 1234, row, N, b);
        CHECK_MSG(memcmp(a, b, sizeof a) == 0, "variant %d not reproducible", v);
        int differ = 0;
        for (int i = 0; i < N; i++) differ += a[i] != c[i];
        CHECK_MSG(differ > N / 4, "variant %d: seeds 1234 and 999 agree on %d of %d", v, N - differ, N);
    }
}

/* ---- edge cases ---------------------------------------------------------------------------------------- */

static void test_edge_cases(void) {
    const float inf_row[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    const float nan_row[4] = {NAN, NAN, -INFINITY, NAN};
    cv_sampler_params greedy = neutral_params(), hot = neutral_params();
    greedy.temperature = 0;
    hot.top_k = 2;
    hot.top_p = 0.5f;
    hot.min_p = 0.1f;
    cv_sampler_params plain = neutral_params();
    const cv_sampler_params *all[3] = {&greedy, &hot, &plain};
    sampler_fixture f;
    fixture_init(&f, &plain, 4, 1, NULL, 0);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(sample_once(&f, all[i], inf_row), 0);
        CHECK_EQ_INT(sample_once(&f, all[i], nan_row), 0);
    }

    /* NaN among finite values is never drawn */
    const float some_nan[4] = {NAN, 1.0f, NAN, 0.5f};
    int counts[4];
    histogram(&f, &plain, some_nan, 2000, counts);
    CHECK(counts[0] == 0 && counts[2] == 0 && counts[1] > counts[3] && counts[3] > 0);

    /* +inf behaves as the largest finite value: always chosen, no NaN arithmetic */
    const float pos_inf[4] = {0.0f, INFINITY, 1.0f, 2.0f};
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(sample_once(&f, all[i], pos_inf), 1);

    /* min_tokens masks the only finite logits: fall back to the raw argmax among them */
    const float only_stops[4] = {-INFINITY, 2.0f, -INFINITY, 3.0f};
    const int32_t stops[2] = {1, 3};
    for (int i = 0; i < 3; i++) {
        cv_sampler_params q = *all[i];
        q.min_tokens = 5;
        q.stop_ids = stops;
        q.n_stop_ids = 2;
        CHECK_EQ_INT(sample_once(&f, &q, only_stops), 3);
    }
    fixture_free(&f);

    /* a vocabulary of one */
    const float one[1] = {-3.0f};
    cv_sampler_params wide = hot;
    wide.top_k = 5;
    wide.logprobs = 3;
    fixture_init(&f, &wide, 1, 1, NULL, 0);
    cv_logprob_entry top[1];
    cv_sample_result res = {.top = top};
    memcpy(f.work, one, sizeof one);
    CHECK_EQ_INT(cv_sample(&wide, &f.st, f.work, f.scratch, &res), 0);
    CHECK(res.n_top == 1 && top[0].token_id == 0 && top[0].logprob == 0.0f && res.chosen.rank == 1);
    CHECK_EQ_INT(sample_once(&f, &greedy, one), 0);
    CHECK_EQ_INT(sample_once(&f, &plain, one), 0);
    fixture_free(&f);
}

/* A processor that allows one parity at a time and flips it with every accepted token. */
typedef struct parity_proc {
    cv_logits_proc base;
    int parity;
    int *freed;
} parity_proc;

static void parity_apply(cv_logits_proc *p, float *logits, int32_t vocab) {
    parity_proc *pp = (parity_proc *)p;
    for (int32_t t = 0; t < vocab; t++)
        if (t % 2 != pp->parity) logits[t] = -INFINITY;
}

static bool parity_accept(cv_logits_proc *p, int32_t token) {
    parity_proc *pp = (parity_proc *)p;
    if (token % 2 != pp->parity) return false;
    pp->parity ^= 1;
    return true;
}

static void parity_free(cv_logits_proc *p) {
    (*((parity_proc *)p)->freed)++;
    free(p);
}

static const cv_logits_proc_i PARITY = {parity_apply, parity_accept, parity_free};

/* Processors run before every step: their mask shows in the logprobs, holds for greedy and random
 * draws, and follows the accepted tokens; a refused token is reported; the state frees them. */
static void test_logits_procs(void) {
    const float row[8] = {7.0f, 1.0f, 6.0f, 2.0f, 3.0f, 9.0f, 0.5f, 8.0f};
    int freed = 0;
    parity_proc *pp = calloc(1, sizeof *pp);
    pp->base.i = &PARITY;
    pp->freed = &freed;
    cv_sampler_params p = neutral_params();
    p.temperature = 0;
    p.logprobs = 2;
    sampler_fixture f;
    fixture_init(&f, &p, 8, 1, NULL, 0);
    cv_sampler_add_proc(&f.st, &pp->base);
    cv_logprob_entry top[2];
    cv_sample_result res = {.top = top};
    memcpy(f.work, row, sizeof row);
    CHECK_EQ_INT(cv_sample(&p, &f.st, f.work, f.scratch, &res), 0); /* the best even id, not id 5 (9.0) */
    CHECK_EQ_INT(res.n_top, 2);
    CHECK(res.top[0].token_id == 0 && res.top[1].token_id == 2); /* logprobs see the masked row */
    CHECK(cv_sampler_accept(&f.st, 0));
    p.logprobs = -1;
    CHECK_EQ_INT(sample_once(&f, &p, row), 5);                  /* odd now: 9.0 at id 5 */
    CHECK(!cv_sampler_accept(&f.st, 2));                        /* refused: the wrong parity */
    p.temperature = 1;
    for (int i = 0; i < 200; i++) CHECK(sample_once(&f, &p, row) % 2 == 1);
    fixture_free(&f);
    CHECK_EQ_INT(freed, 1);
}

int main(void) {
    test_rng();
    test_greedy();
    test_temperature_distribution();
    test_race_distribution();
    test_top_k_one_is_greedy();
    test_top_k_set();
    test_top_p_set();
    test_top_p_wide();
    test_min_p();
    test_repetition_penalty();
    test_frequency_presence();
    test_logit_bias();
    test_min_tokens();
    test_allowed_ids();
    test_allowed_ids_min_tokens();
    test_bad_words();
    test_bad_words_min_tokens();
    test_logprobs_small();
    test_logprobs_wide();
    test_seeds();
    test_edge_cases();
    test_logits_procs();
    return cv_check_summary("test_sampler");
}
