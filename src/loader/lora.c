/*
 * lora.c — see lora.h.
 */
#include "loader/lora.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/error.h"
#include "loader/fileutil.h"
#include "loader/hub.h"
#include "loader/safetensors.h"

static const int32_t allowed_ranks[] = {1, 8, 16, 32, 64, 128, 256, 320, 512};

int cv_lora_check_max_rank(int32_t r) {
    for (size_t i = 0; i < sizeof allowed_ranks / sizeof *allowed_ranks; i++)
        if (r == allowed_ranks[i]) return 0;
    return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "--max-lora-rank %d is not one of 1, 8, 16, 32, 64, 128, 256, 320, 512",
                   r);
}

static const char PREFIX[] = "base_model.model.";

/* The settings of adapter_config.json cvllm needs, after refusing those it does not run. */
static int read_config(const char *dir, int32_t *rank, float *scaling) {
    char *path = cv_xasprintf("%s/adapter_config.json", dir);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    int rc = 0;
    if (!root) {
        rc = cv_path_exists(path) ? cv_fail(CVLLM_ERR_FORMAT, "%s: %s (line %d)", path, jerr.text, jerr.line)
                                  : cv_fail(CVLLM_ERR_NOT_FOUND, "%s: no adapter_config.json: not a PEFT LoRA adapter",
                                            dir);
        free(path);
        return rc;
    }
    const json_t *type = json_object_get(root, "peft_type"), *r = json_object_get(root, "r");
    const json_t *alpha = json_object_get(root, "lora_alpha"), *rs = json_object_get(root, "use_rslora");
    const json_t *bias = json_object_get(root, "bias"), *save = json_object_get(root, "modules_to_save");
    const json_t *ranks = json_object_get(root, "rank_pattern"), *alphas = json_object_get(root, "alpha_pattern");
    if (!json_is_object(root))
        rc = cv_fail(CVLLM_ERR_FORMAT, "%s: not a JSON object", path);
    else if (type && !(json_is_string(type) && strcmp(json_string_value(type), "LORA") == 0))
        rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: peft_type %s is not supported; only LORA adapters are served", path,
                     json_is_string(type) ? json_string_value(type) : "(not a string)");
    else if (!json_is_integer(r) || json_integer_value(r) <= 0 || json_integer_value(r) > 1 << 20)
        rc = cv_fail(CVLLM_ERR_FORMAT, "%s: \"r\" must be a positive integer", path);
    else if (!json_is_number(alpha))
        rc = cv_fail(CVLLM_ERR_FORMAT, "%s: \"lora_alpha\" must be a number", path);
    else if (rs && !json_is_boolean(rs) && !json_is_null(rs))
        rc = cv_fail(CVLLM_ERR_FORMAT, "%s: \"use_rslora\" must be true or false", path);
    else if (json_is_true(json_object_get(root, "use_dora")))
        rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: use_dora (DoRA) adapters are not supported", path);
    else if (json_is_true(json_object_get(root, "fan_in_fan_out")))
        rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: fan_in_fan_out adapters are not supported", path);
    else if (bias && !json_is_null(bias) && !(json_is_string(bias) && strcmp(json_string_value(bias), "none") == 0))
        rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: bias %s is not supported; only \"none\"", path,
                     json_is_string(bias) ? json_string_value(bias) : "(not a string)");
    else if (save && !json_is_null(save) && !(json_is_array(save) && json_array_size(save) == 0))
        rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: modules_to_save is not supported", path);
    else if ((ranks && json_object_size(ranks)) || (alphas && json_object_size(alphas)))
        rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: per-module rank_pattern or alpha_pattern is not supported", path);
    if (!rc) {
        *rank = (int32_t)json_integer_value(r);
        const double a = json_number_value(alpha);
        *scaling = (float)(json_is_true(rs) ? a / sqrt((double)*rank) : a / (double)*rank);
    }
    json_decref(root);
    free(path);
    return rc;
}

static int by_name(const void *x, const void *y) {
    return strcmp(((const cv_lora_module *)x)->name, ((const cv_lora_module *)y)->name);
}

/* The module a tensor belongs to and which of the pair it is ('A' or 'B'), or 0 when its name is
 * not "base_model.model.<module>.lora_{A,B}.weight". */
static char tensor_role(const char *name, size_t *module_len) {
    static const char A[] = ".lora_A.weight", B[] = ".lora_B.weight";
    const size_t n = strlen(name), p = sizeof PREFIX - 1, s = sizeof A - 1;
    if (n <= p + s || strncmp(name, PREFIX, p) != 0) return 0;
    *module_len = n - p - s;
    return strcmp(name + n - s, A) == 0 ? 'A' : strcmp(name + n - s, B) == 0 ? 'B' : 0;
}

/* t as a new f32 [rows][cols] array after checking its shape; the message names the tensor. */
static int widen(const char *dir, const cv_tensor *t, int64_t rows, int64_t cols, int32_t rank, float **out) {
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return cv_fail(CVLLM_ERR_FORMAT, "%s: tensor %s has %d dimension(s) [%lld, ...], expected [%lld, %lld] (r=%d)",
                       dir, t->name, t->ndim, (long long)(t->ndim ? t->shape[0] : 0), (long long)rows,
                       (long long)cols, rank);
    if (t->dtype != CV_DTYPE_F32 && t->dtype != CV_DTYPE_BF16 && t->dtype != CV_DTYPE_F16)
        return cv_fail(CVLLM_ERR_FORMAT, "%s: tensor %s has dtype %s; LoRA weights must be F32, BF16 or F16", dir,
                       t->name, cv_dtype_name(t->dtype));
    const size_t n = (size_t)rows * (size_t)cols;
    *out = cv_xmalloc(n * sizeof **out);
    /* through an aligned copy: a header of any length may put the data at an odd offset */
    void *raw = cv_xmalloc(t->nbytes ? t->nbytes : 1);
    memcpy(raw, t->data, t->nbytes);
    cv_convert_to_f32(*out, raw, t->dtype, n);
    free(raw);
    return 0;
}

/* The modules of checkpoint ck, each with both tensors, B scaled. */
static int read_modules(const char *dir, const cv_checkpoint *ck, cv_lora_adapter *a) {
    const size_t n = cv_checkpoint_count(ck);
    a->modules = cv_xcalloc(n ? n : 1, sizeof *a->modules);
    for (size_t i = 0; i < n; i++) {
        const cv_tensor *t = cv_checkpoint_tensor(ck, i);
        size_t len;
        const char role = tensor_role(t->name, &len);
        if (!role)
            return cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: tensor %s is not a LoRA A or B weight "
                           "(base_model.model.<module>.lora_A.weight / .lora_B.weight); embedding LoRA, DoRA "
                           "magnitudes and biases are not supported", dir, t->name);
        const char other = role == 'A' ? 'B' : 'A';
        char *pair_name = cv_xasprintf("%s%.*s.lora_%c.weight", PREFIX, (int)len, t->name + sizeof PREFIX - 1, other);
        const cv_tensor *pair = cv_checkpoint_find(ck, pair_name);
        free(pair_name);
        if (!pair)
            return cv_fail(CVLLM_ERR_FORMAT, "%s: tensor %s has no lora_%c.weight beside it", dir, t->name, other);
        if (role == 'B') continue; /* its module is read from its A */
        const cv_tensor *tb = pair;
        cv_lora_module *m = &a->modules[a->n_modules++];
        m->name = cv_xasprintf("%.*s", (int)len, t->name + sizeof PREFIX - 1);
        m->rank = a->rank;
        m->in = t->ndim == 2 ? t->shape[1] : 0;
        m->out = tb->ndim == 2 ? tb->shape[0] : 0;
        float *b = NULL;
        int rc = widen(dir, t, a->rank, m->in, a->rank, &m->a);
        if (!rc) rc = widen(dir, tb, m->out, a->rank, a->rank, &b);
        if (rc) return rc;
        m->bt = cv_xmalloc((size_t)(m->out * a->rank) * sizeof *m->bt);
        for (int64_t o = 0; o < m->out; o++)
            for (int64_t r = 0; r < a->rank; r++) m->bt[r * m->out + o] = b[o * a->rank + r] * a->scaling;
        free(b);
    }
    if (!a->n_modules) return cv_fail(CVLLM_ERR_FORMAT, "%s: adapter_model.safetensors holds no LoRA weights", dir);
    qsort(a->modules, a->n_modules, sizeof *a->modules, by_name);
    return 0;
}

/* The adapter in folder dir (path as given: a folder, or the hub id dir was resolved from). */
static int load_dir(const char *name, const char *path, const char *dir, int32_t max_rank, cv_lora_adapter **out) {
    int32_t rank = 0;
    float scaling = 0;
    int rc = read_config(dir, &rank, &scaling);
    if (rc) return rc;
    if (rank > max_rank)
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "LoRA adapter %s: LoRA rank %d is greater than max_lora_rank %d",
                       name, rank, max_rank);
    char *file = cv_xasprintf("%s/adapter_model.safetensors", dir);
    const bool have = cv_path_exists(file);
    free(file);
    if (!have) {
        char *bin = cv_xasprintf("%s/adapter_model.bin", dir);
        const bool pickled = cv_path_exists(bin);
        free(bin);
        return pickled ? cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: adapter_model.bin (a pickle) is not read; save the "
                                 "adapter as adapter_model.safetensors", dir)
                       : cv_fail(CVLLM_ERR_NOT_FOUND, "%s: no adapter_model.safetensors", dir);
    }
    cv_checkpoint *ck = NULL;
    if ((rc = cv_checkpoint_open_prefix(dir, "adapter_model", &ck))) return rc;
    cv_lora_adapter *a = cv_xcalloc(1, sizeof *a);
    a->name = cv_xstrdup(name);
    a->path = cv_xstrdup(path);
    a->rank = rank;
    a->scaling = scaling;
    rc = read_modules(dir, ck, a);
    cv_checkpoint_close(ck);
    if (rc) {
        cv_lora_adapter_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

int cv_lora_adapter_load(const char *name, const char *path, int32_t max_rank, cv_lora_adapter **out) {
    *out = NULL;
    /* vLLM's get_adapter_absolute_path: a folder, else a hub id (the cache, else a download) */
    char *dir = NULL;
    const cv_hub_options hub = {.allow_download = true, .weights = true, .adapter = true};
    int rc = cv_hub_resolve(path, &hub, &dir);
    if (rc) return cv_fail_prefix(rc, "LoRA adapter %s", name);
    rc = load_dir(name, path, dir, max_rank, out);
    free(dir);
    return rc;
}

const cv_lora_module *cv_lora_adapter_find(const cv_lora_adapter *a, const char *name) {
    const cv_lora_module key = {.name = (char *)name};
    return a->n_modules ? bsearch(&key, a->modules, a->n_modules, sizeof key, by_name) : NULL;
}

void cv_lora_adapter_free(cv_lora_adapter *a) {
    if (!a) return;
    for (size_t i = 0; i < a->n_modules; i++) {
        free(a->modules[i].name);
        free(a->modules[i].a);
        free(a->modules[i].bt);
    }
    free(a->modules);
    free(a->name);
    free(a->path);
    free(a);
}
