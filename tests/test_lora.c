/*
 * test_lora.c — LoRA adapters (vLLM's --enable-lora --lora-modules) through the C API.
 *
 * The reference is the merged model: a random PEFT adapter over the f32 Qwen3 test checkpoint, and a
 * copy of that checkpoint whose adapted weights are W + s·B·A. A request naming the adapter must
 * match the merged model (f32 compute, prompt logprobs to 1e-4, the same greedy ids), alone, batched
 * with requests of the base model and of another adapter, and after the same prompt ran on the base
 * model (the prefix cache keeps them apart); the base model's requests must be untouched. max_loras
 * holds a second adapter back until the first one's requests are through. In bf16 compute the
 * adapter still reaches every linear (its inputs there exist as bf16 rows only). `cvllm serve
 * --enable-lora --lora-modules` lists the adapters in /v1/models and runs a request whose "model"
 * names one with it (a beam search too). Adapters loaded, replaced and unloaded while the engine
 * runs (cvllm_engine_load_lora; vLLM's /v1/load_lora_adapter routes) serve as those given at start,
 * and requests in flight keep theirs. Malformed adapters and options fail in one line naming what
 * is wrong.
 */
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "checkpoint_edit.h"
#include "cvllm.h"
#include "loader/safetensors.h"
#include "serve_process.h"
#include "testutil.h"

enum { RANK = 8, N_PROMPT = 24, N_GEN = 6, MAX_STEPS = 400 };

/* The modules adapted, by the ends of their names: k_proj and up_proj left out, so that stacked
 * projections (q|k|v, gate|up) have parts with and without an adapter. */
static const char *const DENSE_TARGETS[] = {"self_attn.q_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                                            "mlp.down_proj", NULL};

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float uniform(float scale) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return scale * ((float)(rng >> 40) / (float)(1 << 24) * 2.0f - 1.0f);
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* One adapted module's weights, kept to merge them. */
typedef struct module {
    char name[128];
    int64_t in, out;
    float *a, *b; /* as the adapter stores them (bf16 values), B not scaled */
} module;

typedef struct adapter {
    char *dir;
    module mods[64];
    int n;
    float scaling;
} adapter;

/* A tensor to write: 1-D or 2-D, its bytes as they go to the file. */
typedef struct st_tensor {
    const char *name, *dtype;
    int ndim;
    int64_t shape[2];
    const void *data;
    size_t nbytes;
} st_tensor;

static void write_safetensors(const char *path, const st_tensor *t, int n) {
    json_t *h = json_object();
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++) json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_object_set_new(h, t[i].name, json_pack("{s:s, s:o, s:[I,I]}", "dtype", t[i].dtype, "shape", shape,
                                                    "data_offsets", (json_int_t)off, (json_int_t)(off + t[i].nbytes)));
        off += t[i].nbytes;
    }
    char *text = json_dumps(h, JSON_COMPACT);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    uint64_t len = strlen(text);
    fwrite(&len, 8, 1, f);
    fwrite(text, 1, len, f);
    for (int i = 0; i < n; i++) fwrite(t[i].data, 1, t[i].nbytes, f);
    fclose(f);
    free(text);
    json_decref(h);
}

/* A rank-8 adapter (alpha 16) on `targets` of every layer of the checkpoint in base_dir, with
 * `extra` (a module name, or NULL) adapted too; config_extra is added to adapter_config.json. */
static adapter make_adapter(const char *base_dir, const char *const *targets, float scale, const char *extra,
                            const char *config_extra) {
    adapter ad = {.dir = tu_make_temp_dir(), .scaling = 16.0f / RANK};
    cv_checkpoint *ck = NULL;
    CHECK(cv_checkpoint_open(base_dir, &ck) == 0);
    const char *names[130];
    int64_t shapes[130][2];
    uint16_t *data[130];
    char *owned[130];
    int n = 0;
    for (size_t i = 0; i < cv_checkpoint_count(ck) && ad.n < 64; i++) {
        const cv_tensor *t = cv_checkpoint_tensor(ck, i);
        char module_name[128] = "";
        for (size_t k = 0; targets[k] && strncmp(t->name, "mtp.", 4); k++) { /* PEFT adapts the model, not its MTP */
            char suffix[64];
            snprintf(suffix, sizeof suffix, "%s.weight", targets[k]);
            size_t ln = strlen(t->name), ls = strlen(suffix);
            if (ln > ls && !strcmp(t->name + ln - ls, suffix)) snprintf(module_name, sizeof module_name, "%.*s", (int)(ln - 7), t->name);
        }
        if (!*module_name) continue;
        module *m = &ad.mods[ad.n++];
        snprintf(m->name, sizeof m->name, "%s", module_name);
        m->out = t->shape[0], m->in = t->shape[1];
        m->a = malloc((size_t)(RANK * m->in) * sizeof(float));
        m->b = malloc((size_t)(m->out * RANK) * sizeof(float));
        uint16_t *a16 = malloc((size_t)(RANK * m->in) * 2), *b16 = malloc((size_t)(m->out * RANK) * 2);
        for (int64_t k = 0; k < RANK * m->in; k++) {
            a16[k] = to_bf16(uniform(scale));
            m->a[k] = cv_bf16_to_f32(a16[k]);
        }
        for (int64_t k = 0; k < m->out * RANK; k++) {
            b16[k] = to_bf16(uniform(scale));
            m->b[k] = cv_bf16_to_f32(b16[k]);
        }
        owned[n] = tu_strdupf("base_model.model.%s%s", m->name, ".lora_A.weight");
        names[n] = owned[n], shapes[n][0] = RANK, shapes[n][1] = m->in, data[n++] = a16;
        owned[n] = tu_strdupf("base_model.model.%s%s", m->name, ".lora_B.weight");
        names[n] = owned[n], shapes[n][0] = m->out, shapes[n][1] = RANK, data[n++] = b16;
    }
    if (extra) {
        static uint16_t small[RANK * 64];
        owned[n] = tu_strdupf("base_model.model.%s%s", extra, ".lora_A.weight");
        names[n] = owned[n], shapes[n][0] = RANK, shapes[n][1] = 64, data[n++] = small;
        owned[n] = tu_strdupf("base_model.model.%s%s", extra, ".lora_B.weight");
        names[n] = owned[n], shapes[n][0] = 64, shapes[n][1] = RANK, data[n++] = small;
    }
    cv_checkpoint_close(ck);
    char *st = tu_strdupf("%s/%s", ad.dir, "adapter_model.safetensors");
    st_tensor out[130];
    for (int i = 0; i < n; i++)
        out[i] = (st_tensor){names[i], "BF16", 2, {shapes[i][0], shapes[i][1]}, data[i],
                             (size_t)(shapes[i][0] * shapes[i][1]) * 2};
    write_safetensors(st, out, n);
    free(st);
    for (int i = 0; i < n; i++) {
        free(owned[i]);
        if (!extra || i < n - 2) free(data[i]);
    }
    char *cfg = tu_strdupf("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"bias\": \"none\", "
                           "\"target_modules\": [\"q_proj\"]%s%s}", config_extra ? config_extra : "", "");
    tu_write_file(ad.dir, "adapter_config.json", cfg, strlen(cfg));
    free(cfg);
    return ad;
}

static void adapter_free(adapter *ad) {
    for (int i = 0; i < ad->n; i++) {
        free(ad->mods[i].a);
        free(ad->mods[i].b);
    }
    tu_remove_tree(ad->dir);
    free(ad->dir);
}

/* ---- the merged checkpoint ------------------------------------------------------------------- */

static bool keep_name(const char *name, const void *ctx, char *out, size_t cap) {
    (void)ctx;
    snprintf(out, cap, "%s", name);
    return true;
}

static void merge(const cv_tensor *t, void *data, const void *ctx) {
    const adapter *ad = ctx;
    for (int i = 0; i < ad->n; i++) {
        const module *m = &ad->mods[i];
        char w[160];
        snprintf(w, sizeof w, "%s.weight", m->name);
        if (strcmp(t->name, w)) continue;
        CHECK(t->dtype == CV_DTYPE_F32);
        float *x = data;
        for (int64_t o = 0; o < m->out; o++)
            for (int64_t k = 0; k < m->in; k++) {
                double s = 0;
                for (int r = 0; r < RANK; r++) s += (double)m->b[o * RANK + r] * m->a[r * m->in + k];
                x[o * m->in + k] += (float)(ad->scaling * s);
            }
    }
}

static char *merged_dir(const char *vector, const char *base_dir, const adapter *ad) {
    char *dir = tu_model_dir(vector);
    char *st = tu_strdupf("%s/%s", dir, "model.safetensors");
    unlink(st);
    cv_checkpoint *ck = NULL;
    CHECK(cv_checkpoint_open(base_dir, &ck) == 0);
    ce_write_tensors(ck, st, keep_name, merge, ad);
    cv_checkpoint_close(ck);
    free(st);
    return dir;
}

/* ---- running requests ------------------------------------------------------------------------ */

static cvllm_engine *make_engine(const char *dir, const cvllm_lora_module *mods, int n, int max_loras,
                                 const char *dtype) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = dir;
    o.num_threads = 2;
    o.dtype = dtype;
    o.max_model_len = 256;
    o.kv_cache_memory_bytes = 16 << 20;
    o.enable_lora = n > 0 || max_loras > 0; /* LoRA on without adapters: they come later */
    o.lora_modules = mods;
    o.n_lora_modules = n;
    o.max_loras = max_loras;
    cvllm_engine *e = NULL;
    const int rc = cvllm_engine_create(&o, &e);
    CHECK_MSG(rc == 0, "engine create: %s", cvllm_last_error());
    return e;
}

typedef struct run {
    const char *lora;
    int32_t prompt[N_PROMPT];
    uint64_t id;
    float prompt_lp[N_PROMPT];
    int32_t ids[N_GEN];
    size_t cached;
    int first_step, done_step; /* engine steps at the first generated token and at the end */
} run;

static void fill_prompt(run *r, int seed) {
    for (int i = 0; i < N_PROMPT; i++) r->prompt[i] = 100 + (seed * 7919 + i * 104729) % 3900; /* inside the 4096-token vocabulary */
}

/* Submits the request; its status. */
static int submit(cvllm_engine *e, run *r) {
    cvllm_sampling_params p;
    cvllm_sampling_params_default(e, &p);
    p.temperature = 0;
    p.max_tokens = N_GEN;
    p.ignore_eos = true;
    p.prompt_logprobs = 0;
    cvllm_prompt pr = {.token_ids = r->prompt, .n_token_ids = N_PROMPT, .lora_name = r->lora};
    r->first_step = r->done_step = -1;
    return cvllm_engine_add_request(e, &pr, &p, &r->id);
}

/* Steps the engine until the submitted requests are through. */
static void finish_all(cvllm_engine *e, run *runs, int n) {
    for (int step = 0; step < MAX_STEPS && cvllm_engine_has_unfinished(e); step++) {
        const cvllm_request_output *const *outs;
        size_t n_out;
        CHECK(cvllm_engine_step(e, &outs, &n_out) == 0);
        for (size_t k = 0; k < n_out; k++)
            for (int i = 0; i < n; i++) {
                if (outs[k]->request_id != runs[i].id) continue;
                const cvllm_completion_output *c = &outs[k]->outputs[0];
                if (c->n_token_ids && runs[i].first_step < 0) runs[i].first_step = step;
                if (outs[k]->prompt_logprobs)
                    for (int t = 1; t < N_PROMPT; t++) runs[i].prompt_lp[t] = outs[k]->prompt_logprobs[t].chosen.logprob;
                runs[i].cached = outs[k]->n_cached_tokens;
                if (outs[k]->finished) {
                    runs[i].done_step = step;
                    CHECK_EQ_INT((int)c->n_token_ids, N_GEN);
                    memcpy(runs[i].ids, c->token_ids, N_GEN * sizeof(int32_t));
                }
            }
    }
    for (int i = 0; i < n; i++) CHECK_MSG(runs[i].done_step >= 0, "request %d did not finish", i);
}

/* Runs the requests together (submitted at once) to the end. */
static void run_all(cvllm_engine *e, run *runs, int n) {
    for (int i = 0; i < n; i++) CHECK_MSG(submit(e, &runs[i]) == 0, "add: %s", cvllm_last_error());
    finish_all(e, runs, n);
}

static double max_diff(const run *a, const run *b) {
    double d = 0;
    for (int t = 1; t < N_PROMPT; t++) d = fmax(d, fabs((double)a->prompt_lp[t] - b->prompt_lp[t]));
    return d;
}

static void check_same(const run *got, const run *want, double tol, const char *what) {
    const double d = max_diff(got, want);
    CHECK_MSG(d <= tol, "%s: prompt logprobs differ by %g (bound %g)", what, d, tol);
    CHECK_MSG(!memcmp(got->ids, want->ids, sizeof got->ids), "%s: greedy ids differ", what);
}

/* ---- the tests ------------------------------------------------------------------------------- */

static void test_serve(const char *base, const adapter *ad, const run *want, const run *plain);
static void test_runtime(const char *base, const adapter *ad, const adapter *ad2, const run *want, const run *plain);
static void test_serve_runtime(const char *base, const adapter *ad, const run *want);
static void test_bench_throughput(const char *base, const adapter *ad);
static void expect_refused(const char *base, const cvllm_lora_module *mods, int n, bool enable, int32_t max_rank,
                           cvllm_status status, const char *needle);

/* An adapter named by hub id comes from the Hugging Face cache (offline here), as vLLM fetches one. */
static void test_hub_adapter(const char *base, const adapter *ad, const run *want) {
    char *cache = tu_make_temp_dir();
    static const char commit[] = "0123456789abcdef0123456789abcdef01234567";
    char *snap = tu_strdupf("%s/models--org--tuned/snapshots/%s", cache, commit);
    char *refs = tu_strdupf("%s/models--org--tuned/%s", cache, "refs");
    char *mk = tu_strdupf("mkdir -p %s %s", snap, refs);
    CHECK(system(mk) == 0);
    tu_write_file(refs, "main", commit, sizeof commit - 1);
    static const char *const files[] = {"adapter_config.json", "adapter_model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char *t = tu_strdupf("%s/%s", ad->dir, files[i]);
        tu_link(t, snap, files[i]);
        free(t);
    }
    setenv("HF_HUB_CACHE", cache, 1);
    setenv("HF_HUB_OFFLINE", "1", 1);
    const cvllm_lora_module mods[] = {{"tuned", "org/tuned"}};
    cvllm_engine *e = make_engine(base, mods, 1, 1, "float32");
    run r = {.lora = "tuned"};
    memcpy(r.prompt, want->prompt, sizeof r.prompt);
    if (e) run_all(e, &r, 1);
    check_same(&r, want, 1e-4, "adapter from the hub cache");
    cvllm_engine_destroy(e);
    const cvllm_lora_module missing[] = {{"gone", "org/absent"}};
    expect_refused(base, missing, 1, true, 0, CVLLM_ERR_NETWORK, "LoRA adapter gone: cannot download org/absent: HF_HUB_OFFLINE");
    unsetenv("HF_HUB_CACHE");
    unsetenv("HF_HUB_OFFLINE");
    tu_remove_tree(cache);
    free(cache);
    free(snap);
    free(refs);
    free(mk);
}

static void test_matches_merged(const char *base, const adapter *ad, const adapter *ad2) {
    char *merged = merged_dir("qwen3-dense-f32", base, ad);
    run want[3] = {0};
    for (int i = 0; i < 3; i++) fill_prompt(&want[i], i);
    cvllm_engine *m = make_engine(merged, NULL, 0, 0, "float32");
    run_all(m, want, 3);
    cvllm_engine_destroy(m);
    run plain[3] = {0};
    for (int i = 0; i < 3; i++) fill_prompt(&plain[i], i);
    cvllm_engine *b = make_engine(base, NULL, 0, 0, "float32");
    run_all(b, plain, 3);
    cvllm_engine_destroy(b);
    /* the adapter changes the model by far more than the bound */
    CHECK_MSG(max_diff(&want[0], &plain[0]) > 0.2, "the adapter barely changes the model (%g)",
              max_diff(&want[0], &plain[0]));

    const cvllm_lora_module mods[] = {{"ad", ad->dir}, {"other", ad2->dir}};
    cvllm_engine *e = make_engine(base, mods, 2, 2, "float32");
    /* alone; the base model first, so that the adapter's request finds its prompt's blocks cached
     * under the base model's keys only */
    run r[6] = {0};
    fill_prompt(&r[0], 0);
    run_all(e, &r[0], 1);
    check_same(&r[0], &plain[0], 1e-4, "base model, LoRA enabled");
    fill_prompt(&r[1], 0);
    r[1].lora = "ad";
    run_all(e, &r[1], 1);
    check_same(&r[1], &want[0], 1e-4, "adapter after the base model on the same prompt");
    CHECK_EQ_INT((int)r[1].cached, 0);
    fill_prompt(&r[2], 0);
    r[2].lora = "ad";
    run_all(e, &r[2], 1);
    check_same(&r[2], &want[0], 1e-4, "adapter, prefix cached");
    CHECK_MSG(r[2].cached > 0, "the adapter's own blocks were not reused");
    /* batched: the adapter, the base model and another adapter in the same steps */
    run mix[3] = {0};
    for (int i = 0; i < 3; i++) fill_prompt(&mix[i], i + 3);
    mix[0].lora = "ad", mix[1].lora = NULL, mix[2].lora = "other";
    memcpy(mix[0].prompt, want[1].prompt, sizeof mix[0].prompt);
    memcpy(mix[1].prompt, plain[2].prompt, sizeof mix[1].prompt);
    run_all(e, mix, 3);
    check_same(&mix[0], &want[1], 1e-4, "adapter batched with the base model and another adapter");
    check_same(&mix[1], &plain[2], 1e-4, "base model batched with two adapters");
    run other = {.lora = "other"};
    memcpy(other.prompt, mix[2].prompt, sizeof other.prompt);
    run_all(e, &other, 1);
    check_same(&mix[2], &other, 1e-4, "second adapter batched, against it alone");
    /* unknown adapter */
    cvllm_sampling_params p;
    cvllm_sampling_params_default(e, &p);
    const cvllm_prompt bad = {.token_ids = r[0].prompt, .n_token_ids = N_PROMPT, .lora_name = "nope"};
    uint64_t id;
    CHECK_EQ_INT(cvllm_engine_add_request(e, &bad, &p, &id), CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cvllm_last_error(), "LoRA adapter nope is not loaded");
    cvllm_engine_destroy(e);

    /* max_loras 1: "other" waits until "ad" is through; the base model runs beside either */
    e = make_engine(base, mods, 2, 1, "float32");
    run q[3] = {0};
    for (int i = 0; i < 3; i++) fill_prompt(&q[i], i);
    q[0].lora = "ad", q[1].lora = "other", q[2].lora = NULL;
    run_all(e, q, 3);
    CHECK_MSG(q[1].first_step > q[0].done_step, "max_loras 1: the second adapter ran at step %d, the first ended at %d",
              q[1].first_step, q[0].done_step);
    CHECK_MSG(q[2].first_step <= q[0].done_step, "the base model's request waited for the adapters");
    check_same(&q[0], &want[0], 1e-4, "adapter under max_loras 1");
    check_same(&q[2], &plain[2], 1e-4, "base model under max_loras 1");
    cvllm_engine_destroy(e);
    /* max_loras 2: they overlap */
    e = make_engine(base, mods, 2, 2, "float32");
    run_all(e, q, 3);
    CHECK_MSG(q[1].first_step <= q[0].done_step, "max_loras 2: the second adapter waited");
    cvllm_engine_destroy(e);

    /* bf16 compute: the adapter reaches linears whose inputs are bf16 rows only */
    e = make_engine(base, mods, 1, 1, "bfloat16");
    run h = {0};
    fill_prompt(&h, 0);
    h.lora = "ad";
    run_all(e, &h, 1);
    CHECK_MSG(max_diff(&h, &want[0]) < 0.02, "bf16 compute: the adapter's logprobs are %g off the merged model's",
              max_diff(&h, &want[0]));
    cvllm_engine_destroy(e);
    test_serve(base, ad, want, plain);
    test_runtime(base, ad, ad2, &want[0], &plain[0]);
    test_serve_runtime(base, ad, &want[0]);
    test_bench_throughput(base, ad);
    test_hub_adapter(base, ad, &want[0]);
    tu_remove_tree(merged);
    free(merged);
}

/* token_ids of choice 0 of a completion reply into ids; false when there are not N_GEN. */
static bool reply_ids(const sp_call *c, int32_t *ids) {
    json_t *j = json_loads(c->reply ? c->reply : "", 0, NULL);
    const json_t *t = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "token_ids");
    const bool ok = json_array_size(t) == N_GEN;
    for (size_t i = 0; ok && i < N_GEN; i++) ids[i] = (int32_t)json_integer_value(json_array_get(t, i));
    json_decref(j);
    return ok;
}

static char *completion_body(const char *model, const run *r, const char *extra) {
    char ids[512] = "";
    for (int i = 0; i < N_PROMPT; i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%d", i ? "," : "", r->prompt[i]);
    char *body = malloc(1024);
    snprintf(body, 1024, "{\"model\": \"%s\", \"prompt\": [%s], \"max_tokens\": %d, \"temperature\": 0, "
             "\"ignore_eos\": true, \"return_token_ids\": true%s}", model, ids, N_GEN, extra);
    return body;
}

/* Whether the server came up; if not, the failure is reported with its log and it is gone. */
static bool serve_ready(sp_proc *p) {
    if (sp_wait_ready(p, 60)) return true;
    char *log = tu_read_text(p->log);
    CHECK_MSG(false, "serve did not start: %s", log);
    free(log);
    kill(p->pid, SIGKILL);
    sp_wait_exit(p, 10);
    return false;
}

static void test_serve(const char *base, const adapter *ad, const run *want, const run *plain) {
    char *tmp = tu_make_temp_dir();
    char *named = tu_strdupf("ad=%s%s", ad->dir, "");
    char *json = tu_strdupf("{\"name\": \"j\", \"path\": \"%s\", \"base_model_name\": \"%s\"}", ad->dir, "hf-base");
    const char *args[] = {"--host", "127.0.0.1", "--port", "0", "--served-model-name", "m", "--enable-lora", "--lora-modules", named, json,
                          "--max-lora-rank", "8", "--max-loras", "2", "--dtype", "float32", "--max-model-len", "256",
                          "--kv-cache-memory-bytes", "16777216", "--num-threads", "1"};
    sp_proc p = sp_spawn(base, tmp, "lora", args, sizeof args / sizeof *args);
    if (serve_ready(&p)) {
        sp_call models = {.port = p.port, .path = "/v1/models"};
        sp_post(&models);
        json_t *j = json_loads(models.reply ? models.reply : "", 0, NULL);
        const json_t *data = json_object_get(j, "data");
        CHECK_EQ_INT((int)json_array_size(data), 3);
        const char *ids[3] = {"m", "ad", "j"}, *parents[3] = {NULL, "m", "hf-base"};
        for (size_t i = 0; i < 3 && json_array_size(data) == 3; i++) {
            const json_t *card = json_array_get(data, i);
            CHECK_STR_EQ(json_string_value(json_object_get(card, "id")), ids[i]);
            CHECK_STR_EQ(json_string_value(json_object_get(card, "root")), i ? ad->dir : base);
            CHECK(parents[i] ? !strcmp(json_string_value(json_object_get(card, "parent")), parents[i])
                             : json_is_null(json_object_get(card, "parent")));
            CHECK(i ? json_is_null(json_object_get(card, "max_model_len"))
                    : json_integer_value(json_object_get(card, "max_model_len")) == 256);
        }
        json_decref(j);
        free(models.reply);
        /* the adapter by either name, the base model, a beam search of width 1 (greedy) with the adapter */
        const char *models_asked[] = {"ad", "j", "m", "ad"};
        const char *extras[] = {"", "", "", ", \"use_beam_search\": true, \"n\": 1"};
        for (int k = 0; k < 4; k++) {
            char *body = completion_body(models_asked[k], k == 2 ? &plain[0] : &want[0], extras[k]);
            sp_call c = {.port = p.port, .body = body};
            sp_post(&c);
            CHECK_MSG(c.status == 200, "model %s: %ld %s", models_asked[k], c.status, c.reply ? c.reply : "");
            int32_t got[N_GEN];
            CHECK_MSG(reply_ids(&c, got) && !memcmp(got, k == 2 ? plain[0].ids : want[0].ids, sizeof got),
                      "model %s%s: not the %s's greedy ids: %s", models_asked[k], extras[k],
                      k == 2 ? "base model" : "merged model", c.reply ? c.reply : "");
            char model_field[32];
            snprintf(model_field, sizeof model_field, "\"model\":\"%s\"", k == 2 ? "m" : models_asked[k]);
            CHECK_CONTAINS(c.reply ? c.reply : "", model_field);
            free(c.reply);
            free(body);
        }
        sp_call metrics = {.port = p.port, .path = "/metrics"};
        sp_post(&metrics);
        CHECK_CONTAINS(metrics.reply ? metrics.reply : "",
                       "vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"\",running_lora_adapters=\"\"} ");
        free(metrics.reply);
        char *body = completion_body("nope", &want[0], "");
        sp_call c = {.port = p.port, .body = body};
        sp_post(&c);
        CHECK_EQ_INT((int)c.status, 404);
        CHECK_CONTAINS(c.reply ? c.reply : "", "The model `nope` does not exist.");
        free(c.reply);
        free(body);
        kill(p.pid, SIGTERM);
        CHECK_EQ_INT(sp_wait_exit(&p, 30), 0);
    }
    /* the flags' refusals: one line, a non-zero status */
    const char *const refusals[][3] = {
        {"--lora-modules", named, "LoRA modules need LoRA enabled (--enable-lora)"},
        {"--lora-modules", "bad", "Invalid JSON format for --lora-modules: bad"},
        {"--lora-modules", "{\"name\": \"x\"}", "missing the required name and path"},
        {"--max-lora-rank", "7", "--max-lora-rank 7 is not one of"},
    };
    for (size_t k = 0; k < sizeof refusals / sizeof *refusals; k++) {
        const char *a[] = {"--port", "0", "--enable-lora", refusals[k][0], refusals[k][1], "--max-model-len", "256"};
        /* the first case is the one without --enable-lora */
        const char *const *argv = k == 0 ? (const char *const[]){"--port", "0", refusals[k][0], refusals[k][1]} : a;
        sp_proc q = sp_spawn(base, tmp, "lora-refused", argv, k == 0 ? 4 : sizeof a / sizeof *a);
        CHECK_MSG(sp_wait_exit(&q, 60) > 0, "%s %s: not refused", refusals[k][0], refusals[k][1]);
        char *log = tu_read_text(q.log);
        CHECK_CONTAINS(log, refusals[k][2]);
        free(log);
    }
    free(named);
    free(json);
    tu_remove_tree(tmp);
    free(tmp);
}

/* A POST to `path` of the server on `port`: its status, and its reply contains `needle`. */
static void expect_post(int port, const char *path, const char *body, long status, const char *needle) {
    sp_call c = {.port = port, .path = path, .body = body};
    sp_post(&c);
    CHECK_MSG(c.status == status, "%s %s: %ld, not %ld: %s", path, body, c.status, status, c.reply ? c.reply : "");
    CHECK_MSG(c.reply && strstr(c.reply, needle), "%s %s: no '%s' in %s", path, body, needle, c.reply ? c.reply : "");
    free(c.reply);
}

/* The ids of the adapter's model on its cards in /v1/models, comma-separated, into out. */
static void model_ids(int port, char *out, size_t cap) {
    sp_call c = {.port = port, .path = "/v1/models"};
    sp_post(&c);
    json_t *j = json_loads(c.reply ? c.reply : "", 0, NULL);
    const json_t *data = json_object_get(j, "data"), *card;
    size_t i;
    out[0] = '\0';
    json_array_foreach(data, i, card)
        snprintf(out + strlen(out), cap - strlen(out), "%s%s:%s:%s", i ? "," : "",
                 json_string_value(json_object_get(card, "id")), json_string_value(json_object_get(card, "root")),
                 json_is_null(json_object_get(card, "parent")) ? "-" : json_string_value(json_object_get(card, "parent")));
    json_decref(j);
    free(c.reply);
}

/* vLLM's runtime routes, /v1/load_lora_adapter and /v1/unload_lora_adapter: absent without
 * VLLM_ALLOW_RUNTIME_LORA_UPDATING; with it, as vLLM answers them, over two data-parallel replicas
 * (the adapter serves requests on either). */
static void test_serve_runtime(const char *base, const adapter *ad, const run *want) {
    char *tmp = tu_make_temp_dir();
    char *load = tu_strdupf("{\"lora_name\": \"x\", \"lora_path\": \"%s\"%s}", ad->dir, "");
    char *inplace = tu_strdupf("{\"lora_name\": \"x\", \"lora_path\": \"%s\", \"load_inplace\": %s}", ad->dir, "true");
    /* the resolver's directory: fsres (ad's weights, for this base), foreign (another base), broken */
    char *resolver = tu_make_temp_dir();
    static const char *const folders[] = {"fsres", "foreign", "broken"};
    for (int k = 0; k < 3; k++) {
        char *dir = tu_strdupf("%s/%s", resolver, folders[k]), *mk = tu_strdupf("mkdir -p %s%s", dir, "");
        CHECK(system(mk) == 0);
        char *cfg = tu_strdupf("{\"peft_type\": \"LORA\", \"r\": 8, \"lora_alpha\": 16, \"target_modules\": "
                               "[\"q_proj\"], \"base_model_name_or_path\": \"%s\"%s}", k == 1 ? "Qwen/Qwen3-0.6B" : base, "");
        tu_write_file(dir, "adapter_config.json", cfg, strlen(cfg));
        if (k == 0) {
            char *st = tu_strdupf("%s/%s", ad->dir, "adapter_model.safetensors");
            tu_link(st, dir, "adapter_model.safetensors");
            free(st);
        }
        free(cfg);
        free(mk);
        free(dir);
    }
    const char *args[] = {"--host", "127.0.0.1", "--port", "0", "--served-model-name", "m", "--enable-lora",
                          "--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory-bytes", "16777216",
                          "--num-threads", "2", "-dp", "2", "--no-enable-prefix-caching"};
    for (int allowed = 0; allowed < 2; allowed++) {
        if (allowed) {
            setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", " True", 1);
            setenv("VLLM_LORA_RESOLVER_CACHE_DIR", resolver, 1);
        }
        sp_proc p = sp_spawn(base, tmp, allowed ? "lora-runtime" : "lora-no-runtime", args, sizeof args / sizeof *args);
        if (!serve_ready(&p)) continue;
        if (!allowed) {
            expect_post(p.port, "/v1/load_lora_adapter", load, 404, "Not Found");
        } else {
            char *log = tu_read_text(p.log);
            CHECK_CONTAINS(log, "LoRA dynamic loading & unloading is enabled in the API server");
            free(log);
            expect_post(p.port, "/v1/load_lora_adapter", load, 200, "Success: LoRA adapter 'x' added successfully.");
            char ids[1024], expect[1024];
            model_ids(p.port, ids, sizeof ids);
            snprintf(expect, sizeof expect, "m:%s:-,x:%s:m", base, ad->dir);
            CHECK_STR_EQ(ids, expect);
            /* two at once: one on each replica, the router weighing their loads alone */
            char *body = completion_body("x", want, "");
            sp_call c[2] = {{.port = p.port, .body = body}, {.port = p.port, .body = body}};
            pthread_t t[2];
            for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, sp_post, &c[i]);
            for (int i = 0; i < 2; i++) {
                pthread_join(t[i], NULL);
                int32_t got[N_GEN];
                CHECK_MSG(c[i].status == 200 && reply_ids(&c[i], got) && !memcmp(got, want->ids, sizeof got),
                          "request %d with the loaded adapter: %ld %s", i, c[i].status, c[i].reply ? c[i].reply : "");
                free(c[i].reply);
            }
            expect_post(p.port, "/v1/load_lora_adapter", load, 400,
                        "\"message\":\"The lora adapter 'x' has already been loaded. If you want to load the adapter "
                        "in place, set 'load_inplace' to True.\",\"type\":\"InvalidUserInput\"");
            expect_post(p.port, "/v1/load_lora_adapter", inplace, 200, "Success: LoRA adapter 'x' added successfully.");
            expect_post(p.port, "/v1/load_lora_adapter", "{\"lora_name\": \"\", \"lora_path\": \"p\"}", 400,
                        "Both 'lora_name' and 'lora_path' must be provided.");
            expect_post(p.port, "/v1/load_lora_adapter", "{\"lora_name\": 3}", 400,
                        "2 validation errors:\\n  {'type': 'string_type', 'loc': ('body', 'lora_name')");
            expect_post(p.port, "/v1/load_lora_adapter", "{\"lora_name\": \"z\", \"lora_path\": \"/nonexistent\"}", 404,
                        "Loading lora z failed: No adapter found for /nonexistent");
            expect_post(p.port, "/v1/unload_lora_adapter", "{\"lora_name\": \"x\", \"lora_int_id\": 1}", 200,
                        "Success: LoRA adapter 'x' removed successfully.");
            expect_post(p.port, "/v1/completions", body, 404, "The model `x` does not exist.");
            expect_post(p.port, "/v1/unload_lora_adapter", "{\"lora_name\": \"x\"}", 404,
                        "The lora adapter 'x' cannot be found.");
            model_ids(p.port, ids, sizeof ids);
            snprintf(expect, sizeof expect, "m:%s:-", base);
            CHECK_STR_EQ(ids, expect);
            free(body);
            /* vLLM's filesystem resolver: an unknown name that is an adapter of this base model in
             * VLLM_LORA_RESOLVER_CACHE_DIR is loaded on first use; another model's is not; one that
             * cannot load is vLLM's 400 */
            body = completion_body("fsres", want, "");
            sp_call r = {.port = p.port, .body = body};
            sp_post(&r);
            int32_t got[N_GEN];
            CHECK_MSG(r.status == 200 && reply_ids(&r, got) && !memcmp(got, want->ids, sizeof got),
                      "resolved adapter: %ld %s", r.status, r.reply ? r.reply : "");
            free(r.reply);
            free(body);
            model_ids(p.port, ids, sizeof ids);
            snprintf(expect, sizeof expect, "m:%s:-,fsres:%s/fsres:m", base, resolver);
            CHECK_STR_EQ(ids, expect);
            body = completion_body("foreign", want, "");
            expect_post(p.port, "/v1/completions", body, 404, "The model `foreign` does not exist.");
            free(body);
            body = completion_body("broken", want, "");
            expect_post(p.port, "/v1/completions", body, 400, "LoRA adapter 'broken' was found but could not be loaded.");
            free(body);
            unsetenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING");
            unsetenv("VLLM_LORA_RESOLVER_CACHE_DIR");
        }
        kill(p.pid, SIGTERM);
        CHECK_EQ_INT(sp_wait_exit(&p, 30), 0);
    }
    /* a resolver directory that is not there stops startup, as vLLM's plugin registration does */
    const char *const env[] = {"VLLM_LORA_RESOLVER_CACHE_DIR=/nonexistent/loras", NULL};
    const char *const argv[] = {"serve", base, "--port", "0", NULL};
    tu_run bad = tu_run_exec(tmp, NULL, env, CVLLM_BINARY, argv);
    CHECK_EQ_INT(bad.status, 2);
    CHECK_CONTAINS(bad.err ? bad.err : "", "VLLM_LORA_RESOLVER_CACHE_DIR must be set to a valid directory");
    tu_run_free(&bad);
    free(load);
    free(inplace);
    tu_remove_tree(resolver);
    free(resolver);
    tu_remove_tree(tmp);
    free(tmp);
}

/* ---- adapters loaded while the engine runs ----------------------------------------------------- */

typedef struct loader_arg {
    cvllm_engine *e;
    cvllm_lora_module m;
    int rc;
} loader_arg;

static void *load_in_thread(void *arg) {
    loader_arg *l = arg;
    l->rc = cvllm_engine_load_lora(l->e, &l->m, false);
    return NULL;
}

/* cvllm_engine_load_lora / cvllm_engine_unload_lora (vLLM's /v1/load_lora_adapter): an adapter
 * loaded later serves as one given at create; one replaced under its name serves the new weights at
 * once, and none of the old one's cached blocks; one unloaded is refused to new requests while those
 * already in flight finish with it; a load from another thread while the engine steps is safe; bad
 * adapters fail in one line and leave the engine serving. `want` is ad's merged model on prompt 0,
 * plain the base model's. */
static void test_runtime(const char *base, const adapter *ad, const adapter *ad2, const run *want, const run *plain) {
    const cvllm_lora_module second[] = {{"other", ad2->dir}};
    cvllm_engine *e = make_engine(base, second, 1, 1, "float32");
    run want2 = {.lora = "other"};
    fill_prompt(&want2, 0);
    run_all(e, &want2, 1);
    const cvllm_lora_module off = {"x", ad->dir};
    CHECK_EQ_INT(cvllm_engine_load_lora(e, &(cvllm_lora_module){"other", ad->dir}, false), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "LoRA adapter other is loaded already");
    cvllm_engine_destroy(e);
    e = make_engine(base, NULL, 0, 0, "float32");
    CHECK_EQ_INT(cvllm_engine_load_lora(e, &off, false), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_CONTAINS(cvllm_last_error(), "LoRA adapter x: LoRA is off (enable_lora)");
    cvllm_engine_destroy(e);

    e = make_engine(base, NULL, 0, 2, "float32");
    run r = {.lora = "x"};
    fill_prompt(&r, 0);
    CHECK_EQ_INT(submit(e, &r), CVLLM_ERR_NOT_FOUND);
    CHECK_EQ_INT(cvllm_engine_load_lora(e, &(cvllm_lora_module){"x", ad->dir}, false), 0);
    run_all(e, &r, 1);
    check_same(&r, want, 1e-4, "adapter loaded at run time");
    /* replaced in place: the new weights at once, none of the old one's blocks */
    CHECK_EQ_INT(cvllm_engine_load_lora(e, &(cvllm_lora_module){"x", ad2->dir}, true), 0);
    run_all(e, &r, 1);
    check_same(&r, &want2, 1e-4, "adapter replaced under its name");
    CHECK_EQ_INT((int)r.cached, 0);
    /* unloaded with a request in flight, and the name loaded again meanwhile */
    run flying = r, late = r;
    CHECK_EQ_INT(submit(e, &flying), 0);
    CHECK_EQ_INT(cvllm_engine_unload_lora(e, "x"), 0);
    CHECK_EQ_INT(submit(e, &late), CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cvllm_last_error(), "LoRA adapter x is not loaded");
    CHECK_EQ_INT(cvllm_engine_unload_lora(e, "x"), CVLLM_ERR_NOT_FOUND);
    CHECK_EQ_INT(cvllm_engine_load_lora(e, &(cvllm_lora_module){"x", ad->dir}, false), 0);
    late.lora = "x";
    CHECK_EQ_INT(submit(e, &late), 0);
    run both[2] = {flying, late};
    finish_all(e, both, 2);
    check_same(&both[0], &want2, 1e-4, "a request in flight when its adapter was unloaded");
    check_same(&both[1], want, 1e-4, "the name loaded again beside it");
    /* bad adapters, then the engine serves on */
    CHECK_EQ_INT(cvllm_engine_load_lora(e, &(cvllm_lora_module){"bad", "/nonexistent/adapter"}, false), CVLLM_ERR_NOT_FOUND);
    CHECK_CONTAINS(cvllm_last_error(), "LoRA adapter bad: model /nonexistent/adapter: no such folder");
    adapter foreign = make_adapter(base, DENSE_TARGETS, 0.05f, "model.layers.0.self_attn.rotary", NULL);
    CHECK_EQ_INT(cvllm_engine_load_lora(e, &(cvllm_lora_module){"bad", foreign.dir}, false), CVLLM_ERR_UNSUPPORTED);
    CHECK_CONTAINS(cvllm_last_error(), "targets model.layers.0.self_attn.rotary, which is not");
    adapter_free(&foreign);
    CHECK_EQ_INT(cvllm_engine_load_lora(e, &(cvllm_lora_module){"", ad->dir}, false), CVLLM_ERR_INVALID_ARGUMENT);
    /* a load on another thread while the engine steps the base model */
    loader_arg l = {e, {"y", ad->dir}, -1};
    pthread_t t;
    run b = {0};
    fill_prompt(&b, 0);
    CHECK_EQ_INT(submit(e, &b), 0);
    pthread_create(&t, NULL, load_in_thread, &l);
    finish_all(e, &b, 1);
    pthread_join(t, NULL);
    CHECK_EQ_INT(l.rc, 0);
    check_same(&b, plain, 1e-4, "the base model while an adapter loads");
    run y = {.lora = "y"};
    fill_prompt(&y, 0);
    run_all(e, &y, 1);
    check_same(&y, want, 1e-4, "adapter loaded on another thread");
    cvllm_engine_destroy(e);
}

/* `bench throughput --enable-lora --lora-path P --max-loras 2`: the adapter loaded as "1" and "2" and
 * the run through; vLLM's refusal without a path; an adapter that is not there named in one line. */
static void test_bench_throughput(const char *base, const adapter *ad) {
    char *tmp = tu_make_temp_dir();
    const char *const common[] = {"bench", "throughput", "--model", base, "--input-len", "16", "--output-len", "4",
                                  "--num-prompts", "6", "--max-model-len", "64", "--num-threads", "1",
                                  "--kv-cache-memory-bytes", "8388608", "--enable-lora"};
    const size_t n_common = sizeof common / sizeof *common;
    const char *const tails[][5] = {{"--lora-path", ad->dir, "--max-loras", "2", NULL},
                                    {NULL},
                                    {"--lora-path", "/nonexistent/adapter", NULL}};
    const int status[] = {0, 2, 1};
    const char *const needles[] = {"LoRA adapter 2: ", "LoRA path must be provided when enable_lora is True",
                                   "LoRA adapter 1: model /nonexistent/adapter: no such folder"};
    for (size_t k = 0; k < 3; k++) {
        const char *argv[32];
        size_t n = 0;
        for (; n < n_common; n++) argv[n] = common[n];
        for (size_t i = 0; tails[k][i]; i++) argv[n++] = tails[k][i];
        argv[n] = NULL;
        tu_run r = tu_run_exec(tmp, NULL, NULL, CVLLM_BINARY, argv);
        CHECK_MSG(r.status == status[k], "case %zu: status %d: %s", k, r.status, r.err ? r.err : "");
        CHECK_CONTAINS(r.err ? r.err : "", needles[k]);
        if (k == 0) {
            CHECK_CONTAINS(r.err ? r.err : "", "LoRA adapter 1: ");
            CHECK_CONTAINS(r.out ? r.out : "", "\nTotal num prompt tokens:  96\nTotal num output tokens:  24\n");
        }
        tu_run_free(&r);
    }
    tu_remove_tree(tmp);
    free(tmp);
}

/* Creation fails in one line naming the problem. */
static void expect_refused(const char *base, const cvllm_lora_module *mods, int n, bool enable, int32_t max_rank,
                           cvllm_status status, const char *needle) {
    cvllm_engine_options o;
    cvllm_engine_options_default(&o);
    o.model = base;
    o.num_threads = 1;
    o.max_model_len = 256;
    o.kv_cache_memory_bytes = 4 << 20;
    o.enable_lora = enable;
    o.lora_modules = mods;
    o.n_lora_modules = n;
    o.max_lora_rank = max_rank;
    cvllm_engine *e = NULL;
    const int rc = cvllm_engine_create(&o, &e);
    CHECK_MSG(rc == status, "expected status %d for '%s', got %d: %s", status, needle, rc, cvllm_last_error());
    CHECK_CONTAINS(cvllm_last_error(), needle);
    CHECK(!strchr(cvllm_last_error(), '\n'));
    cvllm_engine_destroy(e);
}

static void test_refusals(const char *base, const adapter *good) {
    const cvllm_lora_module one[] = {{"ad", good->dir}};
    expect_refused(base, one, 1, false, 0, CVLLM_ERR_INVALID_ARGUMENT, "need LoRA enabled (--enable-lora)");
    expect_refused(base, one, 1, true, 7, CVLLM_ERR_INVALID_ARGUMENT, "--max-lora-rank 7 is not one of");
    expect_refused(base, one, 1, true, 1, CVLLM_ERR_INVALID_ARGUMENT, "LoRA rank 8 is greater than max_lora_rank 1");
    const cvllm_lora_module twice[] = {{"ad", good->dir}, {"ad", good->dir}};
    expect_refused(base, twice, 2, true, 0, CVLLM_ERR_INVALID_ARGUMENT, "LoRA module name ad is given twice");
    const cvllm_lora_module missing[] = {{"ad", "/nonexistent/adapter"}};
    expect_refused(base, missing, 1, true, 0, CVLLM_ERR_NOT_FOUND, "LoRA adapter ad: model /nonexistent/adapter: no such folder");

    adapter foreign = make_adapter(base, DENSE_TARGETS, 0.05f, "model.layers.0.self_attn.rotary", NULL);
    const cvllm_lora_module f[] = {{"x", foreign.dir}};
    expect_refused(base, f, 1, true, 0, CVLLM_ERR_UNSUPPORTED, "targets model.layers.0.self_attn.rotary, which is not");
    adapter_free(&foreign);
    adapter head = make_adapter(base, DENSE_TARGETS, 0.05f, "lm_head", NULL);
    const cvllm_lora_module hd[] = {{"x", head.dir}};
    expect_refused(base, hd, 1, true, 0, CVLLM_ERR_UNSUPPORTED, "targets lm_head: adapters on routed experts, the lm_head");
    adapter_free(&head);
    adapter dora = make_adapter(base, DENSE_TARGETS, 0.05f, NULL, ", \"use_dora\": true");
    const cvllm_lora_module d[] = {{"x", dora.dir}};
    expect_refused(base, d, 1, true, 0, CVLLM_ERR_UNSUPPORTED, "use_dora (DoRA) adapters are not supported");
    adapter_free(&dora);
    adapter saved = make_adapter(base, DENSE_TARGETS, 0.05f, NULL, ", \"modules_to_save\": [\"lm_head\"]");
    const cvllm_lora_module s[] = {{"x", saved.dir}};
    expect_refused(base, s, 1, true, 0, CVLLM_ERR_UNSUPPORTED, "modules_to_save is not supported");
    adapter_free(&saved);
    /* a lone lora_A */
    adapter lone = make_adapter(base, DENSE_TARGETS, 0.05f, NULL, NULL);
    char *st = tu_strdupf("%s/%s", lone.dir, "adapter_model.safetensors");
    static uint16_t zeros[RANK * 64];
    const st_tensor a = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "BF16", 2, {RANK, 64},
                         zeros, sizeof zeros};
    write_safetensors(st, &a, 1);
    const cvllm_lora_module l[] = {{"x", lone.dir}};
    expect_refused(base, l, 1, true, 0, CVLLM_ERR_FORMAT, "has no lora_B.weight beside it");
    /* an adapter of another model's shapes: q_proj from 32 inputs where this model's has 64 */
    static uint16_t b16[128 * RANK];
    const st_tensor other[] = {
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "BF16", 2, {RANK, 32}, zeros, RANK * 32 * 2},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", "BF16", 2, {128, RANK}, b16, sizeof b16},
    };
    write_safetensors(st, other, 2);
    expect_refused(base, l, 1, true, 0, CVLLM_ERR_FORMAT,
                   "model.layers.0.self_attn.q_proj maps 32 inputs to 128 outputs, but the model's "
                   "model.layers.0.self_attn.q_proj.weight maps 64 to 128");
    free(st);
    adapter_free(&lone);
}

/* ---- quantized bases ---------------------------------------------------------------------------- */

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* A model folder over every file of the test vector (its quantization files too), and the tokenizer. */
static char *vector_dir(const char *vector) {
    char *dir = tu_make_temp_dir(), *src = tu_strdupf("%s/vectors/%s", CVLLM_TEST_DATA, vector);
    DIR *d = opendir(src);
    CHECK(d != NULL);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.' || !strncmp(e->d_name, "ref.", 4)) continue;
        char *t = tu_strdupf("%s/%s", src, e->d_name);
        tu_link(t, dir, e->d_name);
        free(t);
    }
    if (d) closedir(d);
    tu_link_tokenizer(dir);
    free(src);
    return dir;
}

/* The f32 values of quantized weight t: e4m3 codes times their 128×128 block scales (`scale`, the
 * weight_scale_inv), int8 codes times their row scales (weight_scale; the offsets are zero). */
static float *dequantize(const cv_tensor *t, const cv_tensor *scale) {
    const int64_t rows = t->shape[0], cols = t->shape[1];
    float *w = malloc((size_t)(rows * cols) * sizeof *w), *sc = malloc((size_t)cv_tensor_numel(scale) * sizeof *sc);
    cv_convert_to_f32(sc, scale->data, scale->dtype, (size_t)cv_tensor_numel(scale));
    const uint8_t *q = t->data;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            w[r * cols + c] = t->dtype == CV_DTYPE_F8_E4M3
                                  ? cv_fp8_e4m3_to_f32(q[r * cols + c]) * sc[(r / 128) * scale->shape[1] + c / 128]
                                  : (float)(int8_t)q[r * cols + c] * sc[r];
    free(sc);
    return w;
}

/* A float copy of the quantized test checkpoint `vector`: its FP8 or int8 weights dequantized to
 * f32, their scales dropped, the rest as stored, config.json without its quantization_config; with
 * `ad` (else NULL) merged into the weights it adapts. */
static char *float_copy(const char *vector, const adapter *ad) {
    char *src = tu_strdupf("%s/vectors/%s", CVLLM_TEST_DATA, vector), *dir = tu_make_temp_dir();
    cv_checkpoint *ck = NULL;
    if (cv_checkpoint_open(src, &ck)) CHECK(cv_checkpoint_open_prefix(src, "quant_model_weights", &ck) == 0);
    const size_t n = cv_checkpoint_count(ck);
    st_tensor *out = calloc(n, sizeof *out);
    float **owned = calloc(n, sizeof *owned);
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        const cv_tensor *t = cv_checkpoint_tensor(ck, i);
        if (ends_with(t->name, "_scale_inv") || ends_with(t->name, ".weight_scale") || ends_with(t->name, ".weight_offset"))
            continue;
        out[k] = (st_tensor){t->name, cv_dtype_name(t->dtype), t->ndim, {t->shape[0], t->ndim > 1 ? t->shape[1] : 0},
                             t->data, t->nbytes};
        if (t->dtype == CV_DTYPE_F8_E4M3 || t->dtype == CV_DTYPE_I8) {
            char *scale_name = tu_strdupf("%s%s", t->name, t->dtype == CV_DTYPE_I8 ? "_scale" : "_scale_inv");
            const cv_tensor *scale = cv_checkpoint_find(ck, scale_name);
            CHECK(scale != NULL);
            free(scale_name);
            owned[k] = dequantize(t, scale);
            const cv_tensor f = {t->name, CV_DTYPE_F32, 2, {t->shape[0], t->shape[1]}, owned[k],
                                 (size_t)(t->shape[0] * t->shape[1]) * 4};
            if (ad) merge(&f, owned[k], ad);
            out[k].dtype = "F32", out[k].data = owned[k], out[k].nbytes = f.nbytes;
        }
        k++;
    }
    char *st = tu_strdupf("%s/%s", dir, "model.safetensors");
    write_safetensors(st, out, k);
    free(st);
    for (size_t i = 0; i < n; i++) free(owned[i]);
    free(owned);
    free(out);
    cv_checkpoint_close(ck);
    char *cfg_path = tu_strdupf("%s/%s", src, "config.json");
    json_t *cfg = json_load_file(cfg_path, 0, NULL);
    json_object_del(cfg, "quantization_config");
    char *cfg_text = json_dumps(cfg, JSON_INDENT(2));
    tu_write_file(dir, "config.json", cfg_text, strlen(cfg_text));
    free(cfg_text);
    json_decref(cfg);
    free(cfg_path);
    char *gen = tu_strdupf("%s/%s", src, "generation_config.json");
    tu_link(gen, dir, "generation_config.json");
    free(gen);
    tu_link_tokenizer(dir);
    free(src);
    return dir;
}

/* Adapters on FP8 and W8A8_DYNAMIC bases. FP8 runs weight-only, so in f32 compute it computes what
 * its dequantized weights compute: with the adapter it must match the dequantized weights with the
 * adapter merged, to the float bound. W8A8 quantizes its activations, which the float copy does not:
 * there the adapter's requests must stay as close to the merged float copy as the base model's stay
 * to the plain one (the activations' rounding), while the adapter moves the model by far more. */
static void test_quantized_bases(void) {
    const char *const vectors[] = {"qwen3-dense-fp8", "qwen3-dense-w8a8-dynamic"};
    for (size_t k = 0; k < 2; k++) {
        char *quant = vector_dir(vectors[k]), *plain = float_copy(vectors[k], NULL);
        adapter ad = make_adapter(plain, DENSE_TARGETS, 0.2f, NULL, NULL);
        char *merged = float_copy(vectors[k], &ad);
        run q = {.lora = "ad"}, qb = {0}, m = {0}, pb = {0};
        fill_prompt(&q, 7);
        qb = m = pb = q;
        qb.lora = m.lora = pb.lora = NULL;
        const cvllm_lora_module mods[] = {{"ad", ad.dir}};
        cvllm_engine *e = make_engine(quant, mods, 1, 1, "float32");
        run_all(e, &q, 1);
        run_all(e, &qb, 1);
        cvllm_engine_destroy(e);
        e = make_engine(merged, NULL, 0, 0, "float32");
        run_all(e, &m, 1);
        cvllm_engine_destroy(e);
        e = make_engine(plain, NULL, 0, 0, "float32");
        run_all(e, &pb, 1);
        cvllm_engine_destroy(e);
        const double noise = max_diff(&qb, &pb), off = max_diff(&q, &m), effect = max_diff(&m, &pb);
        printf("%s: adapter vs merged %g, base vs float base %g, adapter effect %g\n", vectors[k], off, noise, effect);
        if (k == 0) {
            check_same(&q, &m, 1e-4, "FP8 base with the adapter against the merged dequantized weights");
        } else {
            CHECK_MSG(off <= 2 * noise + 0.02, "W8A8 base with the adapter is %g off the merged float copy (the base "
                      "model %g off its own)", off, noise);
        }
        CHECK_MSG(effect > 10 * (2 * noise + 0.02), "%s: the adapter barely changes the model (%g)", vectors[k], effect);
        tu_remove_tree(merged);
        tu_remove_tree(plain);
        tu_remove_tree(quant);
        free(merged);
        free(plain);
        free(quant);
        adapter_free(&ad);
    }
}

/* The hybrid and MoE architectures: their attention, linear-attention and shared-expert linears
 * take adapters (matching the merged model alone and batched with the base model); routed experts
 * are refused. */
static void test_other_models(void) {
    static const char *const hybrid[] = {"self_attn.q_proj", "self_attn.o_proj", "linear_attn.in_proj_qkv",
                                         "linear_attn.in_proj_z", "linear_attn.out_proj", "mlp.shared_expert.up_proj",
                                         "mlp.shared_expert.down_proj", NULL};
    static const char *const moe[] = {"self_attn.k_proj", "self_attn.o_proj", NULL};
    const struct {
        const char *vector;
        const char *const *targets;
    } models[] = {{"qwen3.5-moe-f32", hybrid}, {"qwen3-moe-f32", moe}};
    for (size_t k = 0; k < sizeof models / sizeof *models; k++) {
        char *base = tu_model_dir(models[k].vector);
        adapter ad = make_adapter(base, models[k].targets, 0.2f, NULL, NULL);
        CHECK(ad.n > 0);
        char *merged = merged_dir(models[k].vector, base, &ad);
        run want = {0}, plain = {0};
        fill_prompt(&want, 1);
        fill_prompt(&plain, 2);
        cvllm_engine *m = make_engine(merged, NULL, 0, 0, "float32");
        run_all(m, &want, 1);
        cvllm_engine_destroy(m);
        run unadapted = {0};
        fill_prompt(&unadapted, 1);
        m = make_engine(base, NULL, 0, 0, "float32");
        run_all(m, &plain, 1);
        run_all(m, &unadapted, 1);
        cvllm_engine_destroy(m);
        CHECK_MSG(max_diff(&want, &unadapted) > 0.05, "%s: the adapter barely changes the model (%g)", models[k].vector,
                  max_diff(&want, &unadapted));
        const cvllm_lora_module mods[] = {{"ad", ad.dir}};
        cvllm_engine *e = make_engine(base, mods, 1, 1, "float32");
        run r[2] = {{.lora = "ad"}, {.lora = NULL}};
        memcpy(r[0].prompt, want.prompt, sizeof want.prompt);
        memcpy(r[1].prompt, plain.prompt, sizeof plain.prompt);
        run_all(e, r, 2);
        check_same(&r[0], &want, 1e-4, models[k].vector);
        check_same(&r[1], &plain, 1e-4, models[k].vector);
        cvllm_engine_destroy(e);
        tu_remove_tree(merged);
        free(merged);
        adapter_free(&ad);
        tu_remove_tree(base);
        free(base);
    }
    char *base = tu_model_dir("qwen3-moe-f32");
    adapter expert = make_adapter(base, moe, 0.05f, "model.layers.0.mlp.experts.3.down_proj", NULL);
    const cvllm_lora_module x[] = {{"x", expert.dir}};
    expect_refused(base, x, 1, true, 0, CVLLM_ERR_UNSUPPORTED,
                   "targets model.layers.0.mlp.experts.3.down_proj: adapters on routed experts");
    adapter_free(&expert);
    tu_remove_tree(base);
    free(base);
}

int main(void) {
    char *base = tu_model_dir("qwen3-dense-f32");
    /* the test model's weights have a standard deviation of 0.02; s·B·A's are about 0.075 */
    adapter ad = make_adapter(base, DENSE_TARGETS, 0.2f, NULL, NULL);
    adapter ad2 = make_adapter(base, DENSE_TARGETS, 0.2f, NULL, NULL);
    test_refusals(base, &ad);
    test_matches_merged(base, &ad, &ad2);
    test_other_models();
    test_quantized_bases();
    adapter_free(&ad);
    adapter_free(&ad2);
    tu_remove_tree(base);
    free(base);
    return cv_check_summary("test_lora");
}
