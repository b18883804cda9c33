/*
 * weights.c — the two weight sources behind weights.h: checkpoint views and dummy random weights.
 *
 * A checkpoint source hands out cv_tensor views straight into the mmap'd files after checking
 * dtype and shape; nothing is copied except the f32 copies asked for with cv_weights_get_f32 and
 * tensors a writer left misaligned for their dtype (never the case for files written by the
 * safetensors library, which pads the header to 8 bytes). What the folder declares about
 * quantization (quant.c) is read first: an msModelSlim folder's weights are its
 * quant_model_weight*.safetensors, and a float read of a tensor it stores quantized is refused.
 *
 * A dummy source makes every tensor on request. Values are uniform in [-1e-3, 1e-3] (vLLM's dummy
 * loader range) and come from a counter-based generator: element i of tensor NAME is
 * hash32(i, key(seed, NAME)). Two consequences, both deliberate:
 *   - a tensor's values depend only on the seed and its name, not on the order the model asks for
 *     tensors, so two model files binding the same names see the same weights;
 *   - filling is embarrassingly parallel and vectorizes (32-bit multiplies only), which is what
 *     makes a 0.6B-parameter dummy model appear in about a second. Large tensors are split over a
 *     few short-lived pthreads; kernel thread pools are not available at load time.
 * The generator is not a good PRNG for statistics, only a fast source of decorrelated noise. The
 * codes of quantized dummy weights (qlinear.c) come from it too: int8 uniform in [-127, 127], e4m3
 * from a random byte.
 *
 * Every buffer a source makes (dummy tensors, f32 copies) is kept on a list and freed with it.
 */
#include "loader/weights.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "loader/weights_internal.h"

/* msModelSlim's weight files: quant_model_weights*.safetensors, quant_model_weight_w8a8.safetensors. */
#define MSMODELSLIM_WEIGHTS_PREFIX "quant_model_weight"

/* ------------------------------------------------------------------------------------------------ */
/* Creation                                                                                          */

static bool is_weight_dtype(cv_dtype t) {
    return t == CV_DTYPE_BF16 || t == CV_DTYPE_F16 || t == CV_DTYPE_F32;
}

/* A checkpoint of the inner Qwen3Model rather than Qwen3ForCausalLM, as sentence-transformers saves
 * embedding models (Qwen3-Embedding): embed_tokens, layers.* and norm at the top level, no "model."
 * anywhere. vLLM's pooling adapter loads both layouts; so does every source here. */
static bool is_bare_model(const cv_checkpoint *ck) {
    if (!cv_checkpoint_find(ck, "embed_tokens.weight")) return false;
    for (size_t i = 0; i < cv_checkpoint_count(ck); i++)
        if (!strncmp(cv_checkpoint_tensor(ck, i)->name, "model.", 6)) return false;
    return true;
}

int cv_weight_source_create(const cv_weight_source_params *p, cv_weight_source **out) {
    *out = NULL;
    if (p->dummy && !is_weight_dtype(p->dtype))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "dummy weights must be bf16, f16 or f32, not %s",
                       cv_dtype_name(p->dtype));
    cv_quant_config *quant = NULL;
    int rc = p->dir ? cv_quant_config_load(p->dir, p->quantization, &quant) : 0;
    cv_checkpoint *ck = NULL;
    if (!rc && !p->dummy)
        rc = cv_quant_config_method(quant) == CV_QUANT_ASCEND
                 ? cv_checkpoint_open_prefix(p->dir, MSMODELSLIM_WEIGHTS_PREFIX, &ck)
                 : cv_checkpoint_open(p->dir, &ck);
    if (rc) {
        cv_quant_config_free(quant);
        return rc;
    }
    cv_weight_source *src = cv_xcalloc(1, sizeof *src);
    src->ck = ck;
    src->bare = ck && is_bare_model(ck);
    src->dir = cv_xstrdup(p->dummy ? "(dummy weights)" : p->dir);
    src->dummy = p->dummy;
    src->dtype = p->dtype;
    src->seed = p->seed;
    src->quant = quant;
    *out = src;
    return 0;
}

int cv_weight_source_checkpoint(const char *dir, cv_weight_source **out) {
    return cv_weight_source_create(&(cv_weight_source_params){.dir = dir}, out);
}

int cv_weight_source_dummy(cv_dtype dtype, uint64_t seed, cv_weight_source **out) {
    return cv_weight_source_create(&(cv_weight_source_params){.dummy = true, .dtype = dtype, .seed = seed}, out);
}

void cv_weight_source_free(cv_weight_source *src) {
    if (!src) return;
    for (cv_owned_buffer *b = src->owned, *next; b; b = next) {
        next = b->next;
        free(b->data);
        free(b->name);
        free(b);
    }
    cv_checkpoint_close(src->ck);
    cv_quant_config_free(src->quant);
    free(src->dir);
    free(src);
}

bool cv_weight_source_is_dummy(const cv_weight_source *src) { return src->dummy; }

size_t cv_weight_source_n_files(const cv_weight_source *src) { return src->ck ? cv_checkpoint_n_files(src->ck) : 0; }

const char *cv_weight_source_file(const cv_weight_source *src, size_t i) {
    return src->ck ? cv_checkpoint_file_path(src->ck, i) : NULL;
}

const char *cv_weights_own(cv_weight_source *src, const char *name, void *data) {
    cv_owned_buffer *b = cv_xmalloc(sizeof *b);
    b->next = src->owned;
    b->name = cv_xstrdup(name);
    b->data = data;
    src->owned = b;
    return b->name;
}

/* ------------------------------------------------------------------------------------------------ */
/* Shape checks                                                                                      */

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

int cv_weights_shape_mismatch(const cv_weight_source *src, const char *name, const cv_tensor *t, int ndim,
                              const int64_t *shape, const char *hint) {
    char have[160], want[160];
    format_shape(have, sizeof have, t->ndim, t->shape);
    format_shape(want, sizeof want, ndim, shape);
    return cv_fail(CVLLM_ERR_FORMAT, "tensor %s in %s has shape %s but config.json implies %s%s%s%s",
                   name, src->dir, have, want, hint ? " (" : "", hint ? hint : "", hint ? ")" : "");
}

static bool same_shape(const cv_tensor *t, int ndim, const int64_t *shape) {
    if (t->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) return false;
    return true;
}

static int check_request(const char *name, int ndim, const int64_t *shape) {
    if (ndim < 0 || ndim > CV_MAX_DIMS)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "tensor %s: %d dimensions requested", name, ndim);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "tensor %s: negative dimension requested", name);
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Dummy values                                                                                      */

static inline uint32_t hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t name_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return splitmix64(seed ^ h);
}

typedef struct fill_job {
    void *data;
    cv_dtype dtype;
    uint64_t key;
    int64_t begin, end;  /* element range */
} fill_job;

/* Uniform in [-1e-3, 1e-3): 24 random bits (all an f32 mantissa holds) scaled and shifted. */
static inline float noise(uint32_t i, uint32_t k) {
    return (float)(hash32(i ^ k) >> 8) * (2e-3f / 16777216.0f) - 1e-3f;
}

/* An int8 code uniform in [-127, 127] (msModelSlim's symmetric range). */
static inline int8_t noise_i8(uint32_t i, uint32_t k) { return (int8_t)((int)((hash32(i ^ k) >> 8) % 255u) - 127); }

/* An e4m3 code from a random byte; the NaN patterns S.1111.111 become the largest finite, ±448. */
static inline uint8_t noise_e4m3(uint32_t i, uint32_t k) {
    uint8_t b = (uint8_t)(hash32(i ^ k) >> 24);
    return (b & 0x7fu) == 0x7fu ? (uint8_t)(b - 1) : b;
}

static void fill_range(const fill_job *job) {
    /* Elements are keyed by their index's low 32 bits and a per-2^32-block key, so tensors above
     * 4G elements do not repeat. */
    for (int64_t block = job->begin; block < job->end;) {
        int64_t block_end = ((block >> 32) + 1) << 32;
        if (block_end > job->end) block_end = job->end;
        uint32_t k = (uint32_t)splitmix64(job->key + (uint64_t)(block >> 32));
        uint32_t lo = (uint32_t)block, count = (uint32_t)(block_end - block);
        switch (job->dtype) {
        case CV_DTYPE_F32: {
            float *d = (float *)job->data + block;
            for (uint32_t j = 0; j < count; j++) d[j] = noise(lo + j, k);
            break;
        }
        case CV_DTYPE_BF16: {
            uint16_t *d = (uint16_t *)job->data + block;
            for (uint32_t j = 0; j < count; j++) d[j] = cv_f32_to_bf16(noise(lo + j, k));
            break;
        }
        case CV_DTYPE_F16: {
            uint16_t *d = (uint16_t *)job->data + block;
            for (uint32_t j = 0; j < count; j++) d[j] = cv_f32_to_f16(noise(lo + j, k));
            break;
        }
        case CV_DTYPE_I8: {
            int8_t *d = (int8_t *)job->data + block;
            for (uint32_t j = 0; j < count; j++) d[j] = noise_i8(lo + j, k);
            break;
        }
        default: {
            assert(job->dtype == CV_DTYPE_F8_E4M3);
            uint8_t *d = (uint8_t *)job->data + block;
            for (uint32_t j = 0; j < count; j++) d[j] = noise_e4m3(lo + j, k);
            break;
        }
        }
        block = block_end;
    }
}

static void *fill_thread(void *arg) {
    fill_range(arg);
    return NULL;
}

#define FILL_MAX_THREADS 16
#define FILL_MIN_PER_THREAD (1 << 20)

static void fill_dummy(void *data, cv_dtype dtype, uint64_t key, int64_t numel) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t n = numel / FILL_MIN_PER_THREAD;
    if (n > cpus) n = cpus;
    if (n > FILL_MAX_THREADS) n = FILL_MAX_THREADS;
    if (n < 1) n = 1;
    fill_job jobs[FILL_MAX_THREADS];
    pthread_t tids[FILL_MAX_THREADS];
    bool started[FILL_MAX_THREADS] = {false};
    for (int64_t i = 0; i < n; i++)
        jobs[i] = (fill_job){data, dtype, key, numel * i / n, numel * (i + 1) / n};
    /* Thread 0's share runs on the caller; a thread that fails to start has its share run here too. */
    for (int64_t i = 1; i < n; i++) started[i] = pthread_create(&tids[i], NULL, fill_thread, &jobs[i]) == 0;
    fill_range(&jobs[0]);
    for (int64_t i = 1; i < n; i++) {
        if (started[i]) pthread_join(tids[i], NULL);
        else fill_range(&jobs[i]);
    }
}

/* MemAvailable from /proc/meminfo in bytes, read once; 0 when unknown. */
static size_t available_memory(void) {
    static size_t cached = SIZE_MAX;
    if (cached != SIZE_MAX) return cached;
    cached = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) cached = (size_t)kib * 1024;
    fclose(f);
    return cached;
}

int cv_weights_make_dummy(cv_weight_source *src, const char *name, cv_dtype dtype, int ndim, const int64_t *shape,
                          cv_tensor *out) {
    cv_tensor t = {.dtype = dtype, .ndim = ndim};
    memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(numel, shape[i], &numel))
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "tensor %s: shape too large", name);
    size_t nbytes;
    if (__builtin_mul_overflow((size_t)numel, cv_dtype_size(dtype), &nbytes))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "tensor %s: shape too large", name);
    /* Random weights are real memory: fail with a clear message before the kernel's OOM killer. */
    size_t avail = available_memory();
    if (avail && src->dummy_bytes + nbytes > avail - avail / 20)
        return cv_fail(CVLLM_ERR_NO_MEMORY,
                       "dummy weights need more than the %.1f GiB of memory available (%.1f GiB made when tensor %s "
                       "did not fit); the model is too large for this machine",
                       (double)avail / (1 << 30), (double)src->dummy_bytes / (1 << 30), name);
    void *data = cv_aligned_alloc(nbytes);
    if (!data)
        return cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate %zu bytes for dummy tensor %s", nbytes, name);
    src->dummy_bytes += nbytes;
    fill_dummy(data, dtype, name_key(src->seed, name), numel);
    t.name = cv_weights_own(src, name, data);
    t.data = data;
    t.nbytes = nbytes;
    *out = t;
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Binding                                                                                           */

/* Writers pad the header so tensors start 8-byte aligned, but the format does not require it; a
 * misaligned tensor gets an aligned copy so kernels may use typed loads on every view. */
static int copy_aligned(cv_weight_source *src, cv_tensor *t) {
    void *data = cv_aligned_alloc(t->nbytes);
    if (!data)
        return cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate %zu bytes to align tensor %s", t->nbytes,
                       t->name);
    memcpy(data, t->data, t->nbytes);
    t->name = cv_weights_own(src, t->name, data);
    t->data = data;
    return 1;
}

const cv_tensor *cv_weights_stored(const cv_weight_source *src, const char *name) {
    if (src->bare && !strncmp(name, "model.", 6)) name += 6;
    return cv_checkpoint_find(src->ck, name);
}

int cv_weights_find(cv_weight_source *src, const char *name, cv_tensor *out) {
    const cv_tensor *t = cv_weights_stored(src, name);
    if (!t) return 0;
    *out = *t;
    return (uintptr_t)t->data % cv_dtype_size(t->dtype) ? copy_aligned(src, out) : 1;
}

/* A float weight asked for where the folder stores a quantized one: the model runs that layer only
 * unquantized. t is the stored tensor (NULL for dummy weights, which the description alone decides). */
static int refuse_quantized(const cv_weight_source *src, const char *name, const cv_tensor *t) {
    const char *type = cv_quant_config_tensor_type(src->quant, name);
    if (type && strcmp(type, "FLOAT"))
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "tensor %s is %s in %s, but cvllm runs that layer only unquantized (FLOAT)",
                       name, type, cv_quant_config_origin(src->quant));
    if (!t || is_weight_dtype(t->dtype)) return 0;
    if (t->dtype == CV_DTYPE_I8 || t->dtype == CV_DTYPE_F8_E4M3)
        return cv_fail(CVLLM_ERR_UNSUPPORTED,
                       "tensor %s in %s is quantized (%s), but cvllm runs that layer only unquantized (BF16, F16 or F32)",
                       name, src->dir, cv_dtype_name(t->dtype));
    return cv_fail(CVLLM_ERR_FORMAT, "tensor %s in %s has dtype %s; weights must be BF16, F16 or F32", name, src->dir,
                   cv_dtype_name(t->dtype));
}

/* 1 found (and checked), 0 absent, < 0 error. */
static int lookup(cv_weight_source *src, const char *name, int ndim, const int64_t *shape,
                  const char *hint, bool dummy_makes_it, cv_tensor *out) {
    int rc = check_request(name, ndim, shape);
    if (rc) return rc;
    if (src->dummy) {
        /* An msModelSlim description lists every tensor its export holds: those exist. */
        if (!dummy_makes_it && !cv_quant_config_tensor_type(src->quant, name)) return 0;
        if ((rc = refuse_quantized(src, name, NULL))) return rc;
        rc = cv_weights_make_dummy(src, name, src->dtype, ndim, shape, out);
        return rc ? rc : 1;
    }
    const cv_tensor *t = cv_weights_stored(src, name);
    if (!t) return 0;
    if ((rc = refuse_quantized(src, name, t))) return rc;
    if (!same_shape(t, ndim, shape)) return cv_weights_shape_mismatch(src, name, t, ndim, shape, hint);
    return cv_weights_find(src, name, out);
}

int cv_weights_get(cv_weight_source *src, const char *name, int ndim, const int64_t *shape,
                   const char *config_hint, cv_tensor *out) {
    int rc = lookup(src, name, ndim, shape, config_hint, true, out);
    if (rc == 0) return cv_fail(CVLLM_ERR_NOT_FOUND, "missing tensor %s in %s", name, src->dir);
    return rc < 0 ? rc : 0;
}

/* Dummy sources report optional tensors absent — whether a checkpoint carries one (a bias, an untied
 * lm_head, fused experts) is not something config.json decides, and absent is the choice every model
 * must handle — unless an msModelSlim description lists the tensor: then it is made. */
int cv_weights_get_optional(cv_weight_source *src, const char *name, int ndim, const int64_t *shape,
                            const char *config_hint, cv_tensor *out) {
    return lookup(src, name, ndim, shape, config_hint, false, out);
}

int cv_weights_get_f32(cv_weight_source *src, const char *name, int ndim, const int64_t *shape,
                       const char *config_hint, const float **out) {
    cv_tensor t;
    int rc = cv_weights_get(src, name, ndim, shape, config_hint, &t);
    if (rc) return rc;
    size_t numel = (size_t)cv_tensor_numel(&t);
    float *f = cv_aligned_alloc(numel * sizeof *f);
    if (!f) return cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate an f32 copy of tensor %s", name);
    cv_convert_to_f32(f, t.data, t.dtype, numel);
    cv_weights_own(src, name, f);
    *out = f;
    return 0;
}
