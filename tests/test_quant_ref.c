/*
 * test_quant_ref.c — quantized checkpoints against Hugging Face's logits on their dequantized weights.
 *
 * The references in tests/data/vectors/{qwen3-dense-w8a8, -w8a8-fp16, -w8a8-dynamic,
 * qwen3.5-moe-w8a8-dynamic, qwen3-dense-fp8} are Hugging Face's model code run in f32 on the
 * dequantized weights, with the runtime's activation quantization applied to the input of every
 * quantized linear (msModelSlim W8A8 static, W8A8_DYNAMIC per token; FP8 weight-only). Int8
 * activation codes flip at .5 boundaries under f32 rounding differences and the flips propagate, so
 * a correct engine is not within the f32 models' 1e-4: the measure is max |Δ log-prob| over the
 * reference's top-5 ids per row (a prompt position or greedy step), and each folder has a bound
 * for every row and for the median row of each scenario (BOUNDS below, a few times the spread that
 * 1e-6 relative noise on the activations produces; the mistakes one can make — an ignored
 * input_offset or quant_bias, scales rounded to bf16, FP8 blocks indexed wrongly — move them by far
 * more).
 *
 * Every scenario of model_fixture.h under that measure (one-shot, chunks of 1/5/64/100 over the
 * prompt and the greedy continuation, batched mixed prefill/decode, a decode batch of both prompts,
 * prefill + teacher-forced decode against gen_logits with greedy ids checked where the reference's
 * margin exceeds twice the bound, and the hybrid model's state copy, checkpoints and verify calls)
 * on every kernel path the CPU has: scalar, AVX2, AVX-512 with its VNNI kernels switched off, AVX-512
 * with VNNI, and AMX tile products (tdpbssd) for the batches of two tokens or more (the first two
 * with AMX switched off, so each column names the kernels that ran; a path the CPU lacks is skipped
 * with a printed reason).
 * The measure itself: blind to a shift of the row, ranks ties by id, reads the reference's top ids
 * only, fails on NaN.
 * The int8 arithmetic end to end: int8 × int8 sums are exact integers and the I8 epilogue runs in one
 * order on every path, so the model's logits with AMX's tile products, with the VNNI kernels and with
 * the plain AVX-512 ones (everything else the same code) must be equal bit for bit, prefill and
 * decode, on each pair of those the CPU has.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/formats.h"
#include "model_fixture.h"

/* The accept bounds per folder: max |Δ log-prob| over the reference's top-5 ids, every row and the
 * median row. `int8`: the folder has int8 linears (the VNNI comparison applies). */
static const struct {
    const char *folder;
    double max, median;
    bool int8;
} BOUNDS[] = {
    {"qwen3-dense-w8a8", 6e-3, 5e-4, true},
    {"qwen3-dense-w8a8-fp16", 6e-3, 5e-4, true},
    {"qwen3-dense-w8a8-dynamic", 2e-2, 3e-3, true},
    {"qwen3.5-moe-w8a8-dynamic", 2e-3, 5e-4, true},
    {"qwen3-dense-fp8", 2e-3, 5e-4, false},
};
enum { N_FOLDERS = CV_ARRAY_LEN(BOUNDS) };
static const int32_t CHUNKS[] = {1, 5, 64, 100};

/* Folder f's measure: its bounds, and every greedy step decided that a model within them cannot
 * flip (a reference margin above twice the row bound). */
static mf_metric folder_metric(int f) {
    return (mf_metric){"top-5 |Δ log-prob|", mf_top_logprob_error, BOUNDS[f].max, BOUNDS[f].median, 2 * BOUNDS[f].max};
}

typedef struct kernel_path {
    const char *name;
    cv_isa isa;
    bool vnni, amx;
} kernel_path;

static const kernel_path PATHS[] = {
    {"scalar", CV_ISA_SCALAR, false, false},
    {"avx2", CV_ISA_AVX2, false, false},
    {"avx512", CV_ISA_AVX512, false, false},
    {"avx512-vnni", CV_ISA_AVX512, true, false},
    {"avx512-amx", CV_ISA_AVX512, true, true},
};
enum { N_PATHS = CV_ARRAY_LEN(PATHS) };

/* Makes p the active path; false (with the reason printed) when the CPU lacks it. */
static bool select_path(const kernel_path *p) {
    if (cv_isa_force(p->isa)) {
        printf("test_quant_ref: %s path skipped: the CPU (or this build) has no %s\n", p->name, cv_isa_name(p->isa));
        return false;
    }
    if (cv_cpu_vnni_enable(p->vnni)) {
        printf("test_quant_ref: %s path skipped: the CPU has no AVX512-VNNI\n", p->name);
        return false;
    }
    if (cv_cpu_amx_enable(p->amx)) {
        printf("test_quant_ref: %s path skipped: %s\n", p->name, cv_error_message());
        return false;
    }
    return true;
}

/* ---- the measure ------------------------------------------------------------------------------ */

/* max |Δ log-prob| over want's MF_TOP_IDS highest ids, from a full sort (ties: lower id first). */
static double sorted_top_error(const float *got, const float *want, int n) {
    int ids[16];
    for (int i = 0; i < n; i++) ids[i] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && want[ids[j]] > want[ids[j - 1]]; j--) {
            int t = ids[j];
            ids[j] = ids[j - 1], ids[j - 1] = t;
        }
    double worst = 0, lg = mf_logsumexp(got, n), lw = mf_logsumexp(want, n);
    for (int k = 0; k < MF_TOP_IDS; k++) worst = fmax(worst, fabs((got[ids[k]] - lg) - (want[ids[k]] - lw)));
    return worst;
}

static void test_metric(void) {
    enum { V = 12 };
    float want[V], got[V];
    for (int i = 0; i < V; i++) want[i] = (float)((i * 7) % V) * 0.3f - 1.0f;
    want[6] = want[1]; /* a tie between the 5th and 6th highest: id 1 is in, id 6 is out */
    for (int i = 0; i < V; i++) got[i] = want[i] + 2.5f;
    CHECK(mf_top_logprob_error(got, want, V) < 1e-6); /* a shifted row has the same log-probs */
    memcpy(got, want, sizeof got);
    got[6] += 0.5f; /* outside the top 5: seen only through the normaliser */
    double e = mf_top_logprob_error(got, want, V);
    CHECK_MSG(fabs(e - sorted_top_error(got, want, V)) < 1e-12 && e > 0 && e < 0.1, "tail id moved: %.3g", e);
    got[1] += 0.5f; /* inside: its own log-prob moves */
    e = mf_top_logprob_error(got, want, V);
    CHECK_MSG(fabs(e - sorted_top_error(got, want, V)) < 1e-12 && e > 0.3, "top id moved: %.3g", e);
    got[0] = NAN;
    CHECK(isnan(mf_top_logprob_error(got, want, V)));
    CHECK_MSG(fabs(mf_margin(want, V) - 0.3) < 1e-6, "margin %.9g", mf_margin(want, V));
}

/* ---- the int8 kernels' exactness, end to end ------------------------------------------------- */

enum { DECODE_STEPS = 4 };

/* Rows of logits from one model on the active path: long150 + greedy (less its last DECODE_STEPS
 * tokens) and the short prompt prefilled in one call, then DECODE_STEPS calls decoding one token
 * of each. Returns the number of rows written to out. */
static int64_t logits_on_path(cv_model *m, const mf_reference *refs, float *out) {
    mf_cache c;
    mf_cache_init(&c, m);
    int32_t streams[2][MF_MAX_TOKENS + 8];
    mf_sequence seqs[2];
    for (int k = 0; k < 2; k++)
        seqs[k] = (mf_sequence){.tokens = streams[k], .n_total = mf_full_stream(&refs[k], streams[k]), .state_slot = k};
    int64_t rows = 0;
    for (int step = 0; step <= DECODE_STEPS; step++) {
        mf_step st;
        mf_step_begin(&st);
        for (int k = 0; k < 2; k++) mf_step_add(&st, &c, &seqs[k], step ? 1 : seqs[k].n_total - DECODE_STEPS);
        int rc = m->ops->forward(m, &st.batch, &c.kv, c.state.num_slots ? &c.state : NULL,
                                 out + rows * m->vocab_size);
        CHECK_MSG(rc == 0, "forward failed: %s", cv_error_message());
        if (rc) break;
        rows += st.batch.n_logits;
    }
    mf_cache_free(&c);
    return rows;
}

/* The int8 kernel sets a CPU can have, each switching the next one off: their logits must agree. */
static const struct {
    const char *name;
    bool vnni, amx;
} EXACT_KERNELS[] = {{"AMX", true, true}, {"VNNI", true, false}, {"plain AVX-512", false, false}};
enum { N_EXACT = CV_ARRAY_LEN(EXACT_KERNELS) };

static void test_int8_exact(cv_threadpool *pool, const char *folder) {
    bool has[N_EXACT];
    int n_has = 0;
    for (int k = 0; k < N_EXACT; k++) {
        has[k] = !cv_isa_force(CV_ISA_AVX512) && !cv_cpu_vnni_enable(EXACT_KERNELS[k].vnni) &&
                 !cv_cpu_amx_enable(EXACT_KERNELS[k].amx);
        if (!has[k]) printf("test_quant_ref: %s: the %s int8 kernels not compared: %s\n", folder, EXACT_KERNELS[k].name, cv_error_message());
        n_has += has[k];
    }
    if (n_has < 2) return;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/%s", CVLLM_TEST_DATA, folder);
    mf_reference refs[2] = {0};
    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *m;
    bool refs_ok = !mf_load_reference(dir, "long150", &refs[0]) && !mf_load_reference(dir, "short", &refs[1]);
    CHECK_MSG(refs_ok, "cannot read the references in %s", dir);
    int rc = refs_ok ? mf_load_model(dir, &cfg, &src, pool, &m) : -1;
    if (refs_ok) CHECK_MSG(rc == 0, "loading %s: %s", dir, cv_error_message());
    if (rc == 0) {
        size_t cap = (size_t)2 * (MF_MAX_TOKENS + 8) * (size_t)m->vocab_size;
        float *first = NULL, *other = cv_xmalloc(cap * sizeof(float));
        int64_t n_first = 0;
        const char *first_name = NULL;
        for (int k = 0; k < N_EXACT; k++) {
            if (!has[k]) continue;
            CHECK_EQ_INT(cv_cpu_vnni_enable(EXACT_KERNELS[k].vnni), 0);
            CHECK_EQ_INT(cv_cpu_amx_enable(EXACT_KERNELS[k].amx), 0);
            if (!first) {
                first = cv_xmalloc(cap * sizeof(float));
                n_first = logits_on_path(m, refs, first);
                first_name = EXACT_KERNELS[k].name;
                continue;
            }
            int64_t n = logits_on_path(m, refs, other);
            CHECK_EQ_INT(n_first, n);
            int64_t differ = -1;
            for (int64_t r = 0; r < n_first && r < n && differ < 0; r++)
                if (memcmp(first + r * m->vocab_size, other + r * m->vocab_size, (size_t)m->vocab_size * sizeof(float)))
                    differ = r;
            CHECK_MSG(differ < 0, "%s: logits row %lld of %lld differ between the %s and the %s int8 kernels", folder,
                      (long long)differ, (long long)n_first, first_name, EXACT_KERNELS[k].name);
            if (differ < 0)
                printf("test_quant_ref: %s: %s and %s int8 kernels give logits equal bit for bit (%lld rows)\n", folder,
                       first_name, EXACT_KERNELS[k].name, (long long)n_first);
        }
        free(first);
        free(other);
        cv_model_free(m);
        cv_weight_source_free(src);
        cv_model_config_free(&cfg);
    }
    for (int k = 0; k < 2; k++) mf_free_reference(&refs[k]);
}

/* How many of the references' greedy steps (both prompts) have a margin that the bound decides. */
static int decided_greedy_steps(const char *folder, double margin) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/vectors/%s", CVLLM_TEST_DATA, folder);
    int decided = 0;
    for (int p = 0; p < 2; p++) {
        mf_reference ref = {0};
        if (mf_load_reference(dir, MF_PROMPTS[p], &ref) == 0)
            for (int i = 0; i < 8; i++) decided += mf_margin(ref.gen_logits + (int64_t)i * ref.vocab, ref.vocab) > margin;
        mf_free_reference(&ref);
    }
    return decided;
}

/* ---- the reference scenarios on every path --------------------------------------------------- */

int main(void) {
    cv_threadpool *pool = cv_threadpool_create(2);
    test_metric();
    mf_result results[N_FOLDERS][N_PATHS];
    bool ran[N_PATHS] = {0};
    for (int p = 0; p < N_PATHS; p++) {
        if (!(ran[p] = select_path(&PATHS[p]))) continue;
        for (int f = 0; f < N_FOLDERS; f++) {
            const mf_metric metric = folder_metric(f);
            results[f][p] = (mf_result){NAN, NAN};
            mf_test_folder_with(BOUNDS[f].folder, &metric, PATHS[p].name, false, pool, CHUNKS, (int)CV_ARRAY_LEN(CHUNKS),
                                &results[f][p]);
        }
    }
    for (int f = 0; f < N_FOLDERS; f++)
        if (BOUNDS[f].int8) test_int8_exact(pool, BOUNDS[f].folder);

    printf("test_quant_ref: max |Δ log-prob| over the reference's top-5 ids, worst row / worst scenario median\n");
    printf("  %-26s", "folder");
    for (int p = 0; p < N_PATHS; p++)
        if (ran[p]) printf(" %-19s", PATHS[p].name);
    printf(" bound               greedy ids checked\n");
    for (int f = 0; f < N_FOLDERS; f++) {
        printf("  %-26s", BOUNDS[f].folder);
        for (int p = 0; p < N_PATHS; p++)
            if (ran[p]) printf(" %8.2g / %-8.2g", results[f][p].max, results[f][p].median);
        printf(" %8.2g / %-8.2g %d of 16\n", BOUNDS[f].max, BOUNDS[f].median,
               decided_greedy_steps(BOUNDS[f].folder, folder_metric(f).greedy_margin));
    }
    cv_threadpool_free(pool);
    return cv_check_summary("test_quant_ref");
}
