/*
 * test_quant_model.c — the models on quantized checkpoints (layers/linear.h), around the reference
 * comparison that test_quant_ref.c makes scenario by scenario.
 *
 * - The five quantized reference folders load, give finite logits within their folder's top-5
 *   log-prob bound one-shot, and pack each linear in its format: the packed-weight cache entry
 *   holds exactly the packed bytes of the checkpoint's formats (int8 and e4m3 at one byte a weight
 *   plus scales, bf16 panels; f16 stays a view), and a second load maps it and gives the same bits.
 * - Stacked parts of two schemes (q_proj W8A8 next to a W8A8_DYNAMIC k_proj, gate_proj W8A8 next to
 *   a FLOAT up_proj) are refused in one line naming both tensors and schemes.
 * - One linear part by part (layers/linear.h): q|k|v of the static and the dynamic folder, stacked,
 *   and of a static folder whose k_proj has an input quantization of its own, packed apart, equal
 *   the definition bit for bit, on f32 rows and on rows handed over quantized for q_proj.
 * - The calibration observer hears the quantized linears with f32 rows, and observing (which
 *   quantizes down_proj's input apart from the SwiGLU) changes no logit bit.
 * - FP8 linears split for tensor parallelism (rows starting inside a scale block, columns in
 *   128-column groups) compute what the whole linear does; a split through a scale group is refused.
 * - Made-up weights in each folder's format (every static linear with its own input scale) run.
 */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint_edit.h"
#include "loader/quant.h"
#include "model_fixture.h"
#include "models/layers/linear.h"

/* Each folder's accept bound: max top-5 |Δ log-prob| of a row (tests/data/vectors/README.md). */
static const struct {
    const char *folder;
    double bound;
    bool dense; /* Qwen3ForCausalLM: its packed bytes are counted below */
} FOLDERS[] = {
    {"qwen3-dense-w8a8", 6e-3, true},         {"qwen3-dense-w8a8-fp16", 6e-3, true},
    {"qwen3-dense-w8a8-dynamic", 2e-2, true}, {"qwen3.5-moe-w8a8-dynamic", 2e-3, false},
    {"qwen3-dense-fp8", 2e-3, true},
};

static char *tmp;

static char *vector_dir(const char *name) { return tu_strdupf("%s/vectors/%s", CVLLM_TEST_DATA, name); }

/* ---- loading and running ------------------------------------------------------------------------ */

typedef struct loaded {
    cv_model_config cfg;
    cv_weight_source *src;
    cv_model *model;
} loaded;

/* dir's model, from its checkpoint or (dummy) made-up weights in its format; rc as loading says. */
static int load(const char *dir, bool dummy, cv_threadpool *pool, cv_linear_observer observe, void *ctx, loaded *out) {
    *out = (loaded){0};
    int rc = cv_model_config_load(dir, NULL, &out->cfg);
    if (rc) return rc;
    const cv_weight_source_params sp = {.dir = dir, .dummy = dummy, .dtype = CV_DTYPE_BF16, .seed = 11};
    rc = cv_weight_source_create(&sp, &out->src);
    cv_model_load_params p = {.config = &out->cfg, .weights = out->src, .pool = pool, .max_num_batched_tokens = 32,
                              .observe = observe, .observe_ctx = ctx};
    if (!rc) rc = cv_model_load(&p, &out->model);
    if (rc) {
        cv_weight_source_free(out->src);
        cv_model_config_free(&out->cfg);
        *out = (loaded){0};
    }
    return rc;
}

static void unload(loaded *l) {
    cv_model_free(l->model);
    cv_weight_source_free(l->src);
    cv_model_config_free(&l->cfg);
}

/* The one-shot logits [n][vocab] of tokens[0..n) (a fresh sequence), NULL when the forward fails. */
static float *run_prompt(cv_model *m, const int32_t *tokens, int32_t n) {
    mf_cache c;
    mf_cache_init(&c, m);
    mf_sequence s = {.tokens = tokens, .n_total = n};
    mf_step st;
    mf_step_begin(&st);
    mf_step_add(&st, &c, &s, n);
    float *logits = cv_xmalloc((size_t)n * (size_t)m->vocab_size * sizeof(float));
    int rc = m->ops->forward(m, &st.batch, &c.kv, c.state.num_slots ? &c.state : NULL, logits);
    CHECK_MSG(rc == 0, "forward: %s", cv_error_message());
    mf_cache_free(&c);
    if (rc) free(logits);
    return rc ? NULL : logits;
}

static bool all_finite(const float *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return false;
    return true;
}

/* The worst top-5 |Δ log-prob| of logits [n][vocab] against the reference rows. */
static double worst_row(const float *logits, const mf_reference *ref) {
    double worst = 0;
    for (int32_t i = 0; i < ref->n_prompt; i++) {
        double e = mf_top_logprob_error(logits + (int64_t)i * ref->vocab, ref->logits + (int64_t)i * ref->vocab,
                                        ref->vocab);
        if (!(e <= worst)) worst = e;
    }
    return worst;
}

/* ---- the packed bytes a dense Qwen3 checkpoint should take ---------------------------------------- */

/* Bytes of the stacked parts prefixes[0..n) ([rows[j]][cols]) packed in the format of their dtype
 * (0 when they stay a view). */
static size_t group_bytes(cv_weight_source *src, const char *const *prefixes, const int64_t *rows, int n, int64_t cols) {
    int64_t total = 0;
    cv_dtype dtype = CV_DTYPE_F32;
    for (int j = 0; j < n; j++) {
        cv_qlinear q;
        CHECK_EQ_INT(cv_weights_get_qlinear(src, prefixes[j], rows[j], cols, "", &q), 0);
        dtype = q.weight.dtype;
        total += rows[j];
    }
    const int f = dtype == CV_DTYPE_F32 || dtype == CV_DTYPE_F16 ? -1 : cv_wformat_for_dtype(dtype);
    return f < 0 ? 0 : cv_weight_packed_bytes((cv_wformat)f, total, cols);
}

/* The packed bytes of a dense Qwen3 model: lm_head, then per layer q|k|v, o, gate|up, down. */
static size_t dense_packed_bytes(const loaded *l, int *n_packed) {
    const cv_model_config *c = &l->cfg;
    const int64_t H = c->hidden_size, qd = (int64_t)c->num_attention_heads * c->head_dim,
                  kvd = (int64_t)c->num_key_value_heads * c->head_dim, I = c->intermediate_size;
    size_t total = 0, b;
    *n_packed = 0;
#define GROUP(cols, ...)                                                                             \
    do {                                                                                             \
        const char *const names[] = {__VA_ARGS__};                                                   \
        b = group_bytes(l->src, names, rows, (int)CV_ARRAY_LEN(names), (cols));                      \
        total += b, *n_packed += b > 0;                                                              \
    } while (0)
    {
        const int64_t rows[] = {c->vocab_size};
        GROUP(H, "lm_head");
    }
    for (int layer = 0; layer < c->num_hidden_layers; layer++) {
        char p[6][96];
        static const char *const proj[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                           "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj"};
        for (int i = 0; i < 6; i++) snprintf(p[i], sizeof p[i], "model.layers.%d.%s", layer, proj[i]);
        char down[96];
        snprintf(down, sizeof down, "model.layers.%d.mlp.down_proj", layer);
        {
            const int64_t rows[] = {qd, kvd, kvd};
            GROUP(H, p[0], p[1], p[2]);
        }
        {
            const int64_t rows[] = {H};
            GROUP(qd, p[3]);
        }
        {
            const int64_t rows[] = {I, I};
            GROUP(H, p[4], p[5]);
        }
        {
            const int64_t rows[] = {H};
            GROUP(I, down);
        }
    }
#undef GROUP
    return total;
}

/* The one entry in the cache folder, and its size and modification time; NULL unless exactly one. */
static char *only_cache_entry(const char *cache, off_t *size, struct timespec *mtime) {
    char *dir = tu_strdupf("%s/packed%s", cache, "");
    DIR *d = opendir(dir);
    char *found = NULL;
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        const size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".pack")) continue;
        free(found);
        found = tu_strdupf("%s/%s", dir, e->d_name);
        n++;
    }
    if (d) closedir(d);
    free(dir);
    struct stat st;
    if (n != 1 || stat(found, &st)) {
        free(found);
        return NULL;
    }
    *size = st.st_size;
    *mtime = st.st_mtim;
    return found;
}

/* ---- the reference folders ---------------------------------------------------------------------- */

static void test_folder(size_t f, cv_threadpool *pool) {
    char *dir = vector_dir(FOLDERS[f].folder);
    char *cache = tu_strdupf("%s/cache-%s", tmp, FOLDERS[f].folder);
    setenv("CVLLM_CACHE_ROOT", cache, 1);
    mf_reference refs[2] = {0};
    for (int p = 0; p < 2; p++) CHECK_EQ_INT(mf_load_reference(dir, MF_PROMPTS[p], &refs[p]), 0);
    loaded l;
    int rc = load(dir, false, pool, NULL, NULL, &l);
    CHECK_MSG(rc == 0, "%s: %s", FOLDERS[f].folder, cv_error_message());
    float *first[2] = {0};
    for (int p = 0; !rc && p < 2; p++) {
        first[p] = run_prompt(l.model, refs[p].prompt, refs[p].n_prompt);
        if (!first[p]) continue;
        const size_t n = (size_t)refs[p].n_prompt * (size_t)refs[p].vocab;
        CHECK_MSG(all_finite(first[p], n), "%s %s: non-finite logits", FOLDERS[f].folder, MF_PROMPTS[p]);
        const double worst = worst_row(first[p], &refs[p]);
        printf("%-26s %-7s one-shot: top-5 |Δ log-prob| %.3g (bound %.0e)\n", FOLDERS[f].folder, MF_PROMPTS[p], worst,
               FOLDERS[f].bound);
        CHECK_MSG(worst <= FOLDERS[f].bound, "%s %s one-shot: top-5 |Δ log-prob| %.3g above %.3g", FOLDERS[f].folder,
                  MF_PROMPTS[p], worst, FOLDERS[f].bound);
    }
    /* The entry holds the packed weights at their formats' sizes (each section 4 KiB aligned). */
    off_t size = 0;
    struct timespec mtime = {0};
    char *entry = only_cache_entry(cache, &size, &mtime);
    CHECK_MSG(entry != NULL, "%s: one packed-weight cache entry expected", FOLDERS[f].folder);
    if (!rc && entry && FOLDERS[f].dense) {
        int sections;
        const size_t want = dense_packed_bytes(&l, &sections);
        CHECK_MSG((size_t)size >= want && (size_t)size <= want + 4096 * (size_t)(sections + 2),
                  "%s: cache entry of %lld bytes for %zu packed bytes in %d sections", FOLDERS[f].folder,
                  (long long)size, want, sections);
    }
    if (!rc) unload(&l);
    /* A second load maps the entry (not rewritten) and computes the same bits. */
    rc = load(dir, false, pool, NULL, NULL, &l);
    CHECK_EQ_INT(rc, 0);
    for (int p = 0; !rc && p < 2; p++) {
        float *again = run_prompt(l.model, refs[p].prompt, refs[p].n_prompt);
        const size_t bytes = (size_t)refs[p].n_prompt * (size_t)refs[p].vocab * sizeof(float);
        CHECK_MSG(again && first[p] && !memcmp(again, first[p], bytes), "%s %s: logits from the cached packing differ",
                  FOLDERS[f].folder, MF_PROMPTS[p]);
        free(again);
    }
    off_t size2 = 0;
    struct timespec mtime2 = {0};
    char *entry2 = only_cache_entry(cache, &size2, &mtime2);
    CHECK_MSG(entry && entry2 && !strcmp(entry, entry2) && size2 == size && mtime2.tv_sec == mtime.tv_sec &&
                  mtime2.tv_nsec == mtime.tv_nsec,
              "%s: the second load rewrote the cache", FOLDERS[f].folder);
    if (!rc) unload(&l);
    free(entry);
    free(entry2);
    for (int p = 0; p < 2; p++) {
        free(first[p]);
        mf_free_reference(&refs[p]);
    }
    unsetenv("CVLLM_CACHE_ROOT");
    free(cache);
    free(dir);
}

/* ---- edited folders ----------------------------------------------------------------------------- */

/* A tensor moved in from another checkpoint: names starting with one of `take` come from there. */
typedef struct splice {
    const char *const *take; /* NULL-ended */
    bool from_other;         /* this file is written from the other checkpoint */
} splice;

static bool taken(const char *name, const char *const *take) {
    for (; *take; take++)
        if (!strncmp(name, *take, strlen(*take))) return true;
    return false;
}

static bool splice_rename(const char *name, const void *ctx, char *out, size_t cap) {
    const splice *s = ctx;
    snprintf(out, cap, "%s", name);
    return taken(name, s->take) == s->from_other;
}

static cv_checkpoint *open_vector(const char *folder) {
    char *dir = vector_dir(folder);
    cv_checkpoint *ck = NULL;
    const bool msmodelslim = strstr(folder, "w8a8") != NULL;
    const int rc = msmodelslim ? cv_checkpoint_open_prefix(dir, "quant_model_weights", &ck) : cv_checkpoint_open(dir, &ck);
    CHECK_EQ_INT(rc, 0);
    free(dir);
    return ck;
}

/* Folder NAME: qwen3-dense-w8a8 with the tensors named by `take` from folder `other` instead (two
 * shards), and its description's entries for them set to `type` (per tensor of the other folder). */
static char *spliced_folder(const char *name, const char *other, const char *const *take, const char *type) {
    char *dir = tu_strdupf("%s/%s", tmp, name), *base = vector_dir("qwen3-dense-w8a8");
    CHECK(mkdir(dir, 0755) == 0);
    char *config = tu_strdupf("%s/config.json%s", base, "");
    tu_link(config, dir, "config.json");
    cv_checkpoint *ck = open_vector("qwen3-dense-w8a8"), *ck_other = open_vector(other);
    char *path = tu_strdupf("%s/%s", dir, "quant_model_weights-00001-of-00002.safetensors");
    ce_write_tensors(ck, path, splice_rename, NULL, &(splice){take, false});
    free(path);
    path = tu_strdupf("%s/%s", dir, "quant_model_weights-00002-of-00002.safetensors");
    ce_write_tensors(ck_other, path, splice_rename, NULL, &(splice){take, true});
    free(path);
    char *desc_path = tu_strdupf("%s/%s", base, "quant_model_description.json");
    json_t *desc = json_load_file(desc_path, 0, NULL);
    CHECK(desc != NULL);
    const char *key;
    json_t *value, *tmp_iter;
    json_object_foreach_safe(desc, tmp_iter, key, value) {
        if (taken(key, take)) json_object_del(desc, key);
    }
    for (size_t i = 0; i < cv_checkpoint_count(ck_other); i++) {
        const cv_tensor *t = cv_checkpoint_tensor(ck_other, i);
        if (taken(t->name, take)) json_object_set_new(desc, t->name, json_string(type));
    }
    char *out = tu_strdupf("%s/%s", dir, "quant_model_description.json");
    CHECK(json_dump_file(desc, out, JSON_INDENT(1)) == 0);
    json_decref(desc);
    free(out);
    free(desc_path);
    cv_checkpoint_close(ck);
    cv_checkpoint_close(ck_other);
    free(config);
    free(base);
    return dir;
}

static void expect_refused(const char *dir, cv_threadpool *pool, int want, const char *needle) {
    loaded l;
    const int rc = load(dir, false, pool, NULL, NULL, &l);
    CHECK_EQ_INT(rc, want);
    CHECK_CONTAINS(cv_error_message(), needle);
    CHECK(strchr(cv_error_message(), '\n') == NULL);
    if (!rc) unload(&l);
}

static void test_mixed_schemes(cv_threadpool *pool) {
    static const char *const k_dynamic[] = {"model.layers.0.self_attn.k_proj.", NULL};
    char *dir = spliced_folder("mixed-qkv", "qwen3-dense-w8a8-dynamic", k_dynamic, "W8A8_DYNAMIC");
    expect_refused(dir, pool, CVLLM_ERR_FORMAT,
                   "model.layers.0.self_attn.q_proj.weight is W8A8 but model.layers.0.self_attn.k_proj.weight is "
                   "W8A8_DYNAMIC");
    free(dir);
    static const char *const up_float[] = {"model.layers.1.mlp.up_proj.", NULL};
    dir = spliced_folder("mixed-gate-up", "qwen3-dense-bf16", up_float, "FLOAT");
    expect_refused(dir, pool, CVLLM_ERR_FORMAT,
                   "model.layers.1.mlp.gate_proj.weight is W8A8 but model.layers.1.mlp.up_proj.weight is FLOAT");
    free(dir);
}

/* ---- one linear, part by part ------------------------------------------------------------------ */

static bool keep_all(const char *name, const void *ctx, char *out, size_t cap) {
    (void)ctx;
    snprintf(out, cap, "%s", name);
    return true;
}

/* k_proj of layer 0 with an input quantization of its own: input_scale × 1.5, input_offset + 2. */
static void requantize_k(const cv_tensor *t, void *data, const void *ctx) {
    (void)ctx;
    if (!strcmp(t->name, "model.layers.0.self_attn.k_proj.input_scale")) *(float *)data *= 1.5f;
    if (!strcmp(t->name, "model.layers.0.self_attn.k_proj.input_offset")) *(float *)data += 2.0f;
}

/* y [T][rows] of part `prefix` by the definition, from the checkpoint's own tensors: x quantized
 * as the part's scheme says (static, or per token), int32 sums, then (acc + quant_bias) · deq_scale
 * or acc · weight_scale · the token's scale, in the I8 epilogue's order. */
static void reference_part(cv_weight_source *src, const char *prefix, int64_t rows, int64_t cols, const float *x,
                           int64_t T, float *y) {
    cv_qlinear q;
    CHECK_EQ_INT(cv_weights_get_qlinear(src, prefix, rows, cols, "", &q), 0);
    const int8_t *w = q.weight.data;
    for (int64_t t = 0; t < T; t++) {
        const float *xt = x + t * cols;
        float div = q.input_scale, offset = q.input_offset, x_scale = 1.0f;
        if (q.scheme == CV_SCHEME_W8A8_DYNAMIC) {
            float amax = 0.0f;
            for (int64_t k = 0; k < cols; k++) amax = fmaxf(amax, fabsf(xt[k]));
            div = x_scale = amax / 127.0f, offset = 0.0f;
        }
        for (int64_t n = 0; n < rows; n++) {
            int32_t acc = q.row_bias ? q.row_bias[n] : 0;
            for (int64_t k = 0; k < cols; k++) {
                float v = rintf(xt[k] / div + offset);
                v = v < -128.0f ? -128.0f : v > 127.0f ? 127.0f : v;
                acc += (int32_t)v * w[n * cols + k];
            }
            y[t * rows + n] = (float)acc * q.row_scale[n] * x_scale;
        }
    }
}

/* q|k|v of layer 0 as one nn_linear over folder dir, run on f32 rows and on rows handed over
 * quantized for q_proj (as the norm before it does), against the definition bit for bit. */
static void check_qkv(const char *dir, int want_weights, cv_threadpool *pool) {
    cv_weight_source *src;
    CHECK_EQ_INT(cv_weight_source_checkpoint(dir, &src), 0);
    nn_binder b = {.src = src};
    nn_linear l = {0};
    static const char *const names[] = {"model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                                        "model.layers.0.self_attn.v_proj"};
    const int64_t rows[] = {128, 64, 64}, H = 64;
    enum { T = 9 };
    for (int j = 0; j < 3; j++) nn_bind_linear(&b, &l, names[j], rows[j], H, "");
    CHECK_EQ_INT(b.rc, 0);
    CHECK_EQ_INT(l.n_weights, want_weights);
    nn_linear_list list = {0};
    nn_linear_list_add(&list, &l);
    cv_pack_cache *cache;
    CHECK_EQ_INT(nn_pack_linears(pool, src, "test", &list, &cache), 0);
    nn_qrows given;
    nn_arena measure = {0};
    nn_linear_scratch_take(&b, &measure, T);
    nn_qrows_take(&given, &measure, T, H);
    void *mem = cv_aligned_alloc(measure.size);
    nn_arena arena = {.base = mem};
    nn_linear_scratch_take(&b, &arena, T);
    nn_qrows_take(&given, &arena, T, H);
    float x[T * H], got[256 * T], want[256 * T];
    for (int i = 0; i < T * H; i++) x[i] = sinf(0.37f * (float)i) * (1.0f + (float)(i % 7));
    float *ys[] = {got, got + T * 128, got + T * 192};
    float *expect[] = {want, want + T * 128, want + T * 192};
    for (int j = 0; j < 3; j++) reference_part(src, names[j], rows[j], H, x, T, expect[j]);
    const cv_act_quant *q = nn_linear_input_quant(&l);
    CHECK(q != NULL);
    cv_quantize_rows(NULL, q, x, H, T, H, given.codes, given.scale);
    const nn_input inputs[] = {nn_f32(x), {.f32 = x, .i8 = given.codes, .i8_scale = given.scale, .quant = *q}};
    for (size_t i = 0; i < CV_ARRAY_LEN(inputs); i++) {
        memset(got, 0, sizeof got);
        nn_linear_forward(pool, &l, inputs[i], T, ys);
        CHECK_MSG(!memcmp(got, want, (size_t)T * 256 * sizeof(float)), "%s q|k|v (%s rows) differ from the definition",
                  dir, i ? "quantized" : "f32");
    }
    free(mem);
    nn_linear_release(&l);
    nn_linear_list_free(&list);
    nn_binder_free(&b);
    cv_pack_cache_close(cache);
    cv_weight_source_free(src);
}

/* out [T][rows of l] = x [T][cols of l] · l, l packed first. */
static void run_linear(cv_threadpool *pool, nn_binder *b, nn_linear *l, const float *x, int64_t T, float *out) {
    nn_linear_list list = {0};
    nn_linear_list_add(&list, l);
    cv_pack_cache *cache;
    CHECK_EQ_INT(nn_pack_linears(pool, b->src, "test", &list, &cache), 0);
    nn_linear_forward(pool, l, nn_f32(x), T, &out);
    nn_linear_list_free(&list);
    cv_pack_cache_close(cache);
}

/* FP8 block-scaled linears split for tensor parallelism (layers/linear.h take_shard): gate_proj's
 * rows in 2 pieces — rank 1's 192 start 64 rows into a scale block and end in the next — give the
 * whole linear's outputs bit for bit; down_proj's columns in 3 pieces of 128 add up to its outputs;
 * pieces of 192 columns, which would split a 128-column scale, are refused in one line. */
static void test_fp8_shards(cv_threadpool *pool) {
    char *dir = tu_strdupf("%s/vectors/%s", CVLLM_TEST_DATA, "qwen3-dense-fp8");
    cv_weight_source *src;
    CHECK_EQ_INT(cv_weight_source_checkpoint(dir, &src), 0);
    enum { T = 5, H = 192, I = 384 };
    static const char gate[] = "model.layers.0.mlp.gate_proj", down[] = "model.layers.0.mlp.down_proj";
    static float x[T * I], whole[T * I], piece[T * I], sum[T * H];
    for (int i = 0; i < T * I; i++) x[i] = sinf(0.37f * (float)i) * (1.0f + (float)(i % 7));
    for (int pass = 0; pass < 2; pass++) { /* gate_proj by rows, then down_proj by columns */
        const bool rows = pass == 0;
        const int n = rows ? 2 : 3;
        const int64_t out = rows ? I : H, in = rows ? H : I;
        nn_binder b = {.src = src, .tp = {.rank = 0, .size = 1}};
        nn_linear l = {0};
        nn_bind_linear(&b, &l, rows ? gate : down, out, in, "");
        CHECK_EQ_INT(b.rc, 0);
        run_linear(pool, &b, &l, x, T, whole);
        nn_linear_release(&l);
        nn_binder_free(&b);
        memset(sum, 0, sizeof sum);
        for (int r = 0; r < n; r++) {
            nn_binder s = {.src = src, .tp = {.rank = r, .size = n}};
            nn_linear p = {0};
            nn_bind_linear_split(&s, &p, rows ? gate : down, out, in, "", rows ? NN_SPLIT_ROWS : NN_SPLIT_COLS);
            CHECK_MSG(s.rc == 0, "%s piece %d of %d: %s", rows ? gate : down, r, n, cv_error_message());
            if (s.rc) continue;
            const int64_t w = rows ? out / n : out, k = rows ? in : in / n;
            static float xs[T * I]; /* a column piece reads its columns of x */
            for (int64_t t = 0; t < T; t++) memcpy(xs + t * k, x + t * in + (rows ? 0 : r * k), (size_t)k * sizeof *xs);
            run_linear(pool, &s, &p, xs, T, piece);
            for (int64_t t = 0; t < T; t++)
                for (int64_t j = 0; j < w; j++) {
                    if (rows) {
                        CHECK_MSG(piece[t * w + j] == whole[t * out + r * w + j], "%s rank %d row %lld: %g, whole %g",
                                  gate, r, (long long)(r * w + j), piece[t * w + j], whole[t * out + r * w + j]);
                    } else {
                        sum[t * H + j] += piece[t * w + j];
                    }
                }
            nn_linear_release(&p);
            nn_binder_free(&s);
        }
        if (!rows)
            CHECK_MSG(mf_row_error(sum, whole, T * H) <= 1e-6, "%s: the column pieces add up to %.3g off the whole", down,
                      mf_row_error(sum, whole, T * H));
    }
    nn_binder s = {.src = src, .tp = {.rank = 1, .size = 2}};
    nn_linear p = {0};
    nn_bind_linear_split(&s, &p, down, H, I, "", NN_SPLIT_COLS);
    CHECK_EQ_INT(s.rc, CVLLM_ERR_UNSUPPORTED);
    CHECK_CONTAINS(cv_error_message(), "an FP8 tensor-parallel shard must be whole columns in groups of 128 (192 per rank)");
    nn_binder_free(&s);
    cv_weight_source_free(src);
    free(dir);
}

static void test_linear_parts(cv_threadpool *pool) {
    char *w8a8 = vector_dir("qwen3-dense-w8a8"), *dynamic = vector_dir("qwen3-dense-w8a8-dynamic");
    check_qkv(w8a8, 1, pool);    /* one input quantization: stacked */
    check_qkv(dynamic, 1, pool);
    /* k_proj quantized its own way: q, k and v packed apart, the input quantized twice. */
    char *dir = tu_strdupf("%s/%s", tmp, "k-requantized");
    CHECK(mkdir(dir, 0755) == 0);
    static const char *const linked[] = {"config.json", "quant_model_description.json"};
    for (size_t i = 0; i < CV_ARRAY_LEN(linked); i++) {
        char *target = tu_strdupf("%s/%s", w8a8, linked[i]);
        tu_link(target, dir, linked[i]);
        free(target);
    }
    cv_checkpoint *ck = open_vector("qwen3-dense-w8a8");
    char *path = tu_strdupf("%s/%s", dir, "quant_model_weights.safetensors");
    ce_write_tensors(ck, path, keep_all, requantize_k, NULL);
    free(path);
    cv_checkpoint_close(ck);
    check_qkv(dir, 3, pool);
    free(dir);
    free(w8a8);
    free(dynamic);
}

/* ---- the observer ------------------------------------------------------------------------------- */

typedef struct heard {
    int calls, quantized_calls;
    bool finite;
    const cv_quant_config *quant;
} heard;

static void hear(void *ctx, const char *linear, const float *x, int64_t rows, int64_t cols) {
    heard *h = ctx;
    h->calls++;
    h->finite = h->finite && all_finite(x, (size_t)(rows * cols));
    cv_linear_scheme s = CV_SCHEME_FLOAT;
    if (!cv_quant_config_scheme(h->quant, linear, &s) && s != CV_SCHEME_FLOAT) h->quantized_calls++;
}

static void test_observer(const char *folder, cv_threadpool *pool) {
    char *dir = vector_dir(folder);
    mf_reference ref;
    CHECK_EQ_INT(mf_load_reference(dir, "short", &ref), 0);
    loaded plain, observed;
    heard h = {.finite = true};
    CHECK_EQ_INT(load(dir, false, pool, NULL, NULL, &plain), 0);
    CHECK_EQ_INT(load(dir, false, pool, hear, &h, &observed), 0);
    h.quant = cv_weight_source_quant(observed.src);
    float *want = run_prompt(plain.model, ref.prompt, ref.n_prompt);
    float *got = run_prompt(observed.model, ref.prompt, ref.n_prompt);
    const size_t bytes = (size_t)ref.n_prompt * (size_t)ref.vocab * sizeof(float);
    CHECK_MSG(got && want && !memcmp(got, want, bytes), "%s: observing changed the logits", folder);
    CHECK_MSG(h.quantized_calls > 0 && h.finite, "%s: observer heard %d linears, %d quantized, finite %d", folder,
              h.calls, h.quantized_calls, h.finite);
    free(want);
    free(got);
    unload(&plain);
    unload(&observed);
    mf_free_reference(&ref);
    free(dir);
}

/* ---- made-up weights ---------------------------------------------------------------------------- */

static void test_dummy(const char *folder, cv_threadpool *pool) {
    char *dir = vector_dir(folder);
    loaded l;
    const int rc = load(dir, true, pool, NULL, NULL, &l);
    CHECK_MSG(rc == 0, "%s, dummy weights: %s", folder, cv_error_message());
    if (!rc) {
        static const int32_t ids[] = {1, 2, 3, 4, 5};
        float *logits = run_prompt(l.model, ids, 5);
        CHECK_MSG(logits && all_finite(logits, 5 * (size_t)l.model->vocab_size), "%s, dummy weights: logits", folder);
        free(logits);
        unload(&l);
    }
    free(dir);
}

int main(void) {
    cv_threadpool *pool = cv_threadpool_create(2);
    tmp = tu_make_temp_dir();
    for (size_t f = 0; f < CV_ARRAY_LEN(FOLDERS); f++) test_folder(f, pool);
    setenv("CVLLM_PACKED_WEIGHTS_CACHE", "0", 1); /* the edited folders pack into memory */
    test_mixed_schemes(pool);
    test_linear_parts(pool);
    test_fp8_shards(pool);
    test_observer("qwen3-dense-w8a8", pool);
    test_observer("qwen3-dense-w8a8-dynamic", pool);
    test_observer("qwen3.5-moe-w8a8-dynamic", pool);
    for (size_t f = 0; f < CV_ARRAY_LEN(FOLDERS); f++) test_dummy(FOLDERS[f].folder, pool);
    tu_remove_tree(tmp);
    free(tmp);
    cv_threadpool_free(pool);
    return cv_check_summary("test_quant_model");
}
