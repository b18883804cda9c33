/*
 * quant_export.c — see quant_export.h. Two stages: a plan (every output tensor with its name,
 * dtype, shape and where its bytes come from, checked whole), then the writer streams it. A
 * quantized linear's weight scales (and, for W8A8, its code sums) are computed the first time one
 * of its tensors is written and kept, so each is computed once whichever of its tensors a shard
 * holds first; the codes themselves are computed only into the writer's buffer.
 */
#include "loader/quant_export.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "loader/fileutil.h"
#include "loader/safetensors_write.h"

/* Files copied from the source folder when present. */
static const char *const side_files[] = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
    "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "preprocessor_config.json", "video_preprocessor_config.json",
};

typedef struct qx_linear {
    char *name;                 /* the weight's prefix */
    cv_quant_matrix w;
    float input_scale, input_offset; /* W8A8 */
    float *scale;               /* [rows], computed on first use */
    int32_t *sums;              /* [rows], W8A8, computed on first use */
} qx_linear;

typedef enum qx_kind {
    QX_FLOAT, QX_WEIGHT, QX_WEIGHT_SCALE, QX_WEIGHT_OFFSET,
    QX_INPUT_SCALE, QX_INPUT_OFFSET, QX_DEQ_SCALE, QX_QUANT_BIAS
} qx_kind;

typedef struct qx_out {
    char *name;
    qx_kind kind;
    cv_dtype dtype;
    int ndim;
    int64_t shape[2];           /* quantized tensors; FLOAT ones take the source's */
    const cv_tensor *src;       /* QX_FLOAT */
    size_t lin;                 /* index of the linear, the others */
    struct qx_plan *plan;
} qx_out;

typedef struct qx_plan {
    const cv_quant_export_options *o;
    qx_linear *lins;
    size_t n_lins, cap_lins;
    qx_out *outs;
    size_t n_outs, cap_outs;
    size_t n_group_ranges;      /* routed experts calibrated with their group's range */
} qx_plan;

static const char *const suffix_of[] = {
    [QX_WEIGHT] = "weight", [QX_WEIGHT_SCALE] = "weight_scale", [QX_WEIGHT_OFFSET] = "weight_offset",
    [QX_INPUT_SCALE] = "input_scale", [QX_INPUT_OFFSET] = "input_offset", [QX_DEQ_SCALE] = "deq_scale",
    [QX_QUANT_BIAS] = "quant_bias",
};

static void plan_free(qx_plan *p) {
    for (size_t i = 0; i < p->n_lins; i++) {
        free(p->lins[i].name);
        free(p->lins[i].scale);
        free(p->lins[i].sums);
    }
    for (size_t i = 0; i < p->n_outs; i++) free(p->outs[i].name);
    free(p->lins);
    free(p->outs);
}

static qx_out *add_out(qx_plan *p, char *name, qx_kind kind) {
    if (p->n_outs == p->cap_outs) p->outs = cv_xrealloc(p->outs, (p->cap_outs = p->cap_outs ? 2 * p->cap_outs : 256) * sizeof *p->outs);
    qx_out *o = &p->outs[p->n_outs++];
    *o = (qx_out){.name = name, .kind = kind, .plan = p};
    return o;
}

/* The output tensors of linear `name` over matrix w. */
static int add_linear(qx_plan *p, const char *name, cv_quant_matrix w) {
    float in_scale = 0, in_offset = 0;
    if (p->o->scheme == CV_SCHEME_W8A8) {
        const cv_act_range *r = p->o->ranges ? cv_act_ranges_find(p->o->ranges, name) : NULL;
        char *group = r ? NULL : cv_quant_recipe_expert_group(name);
        if (group && p->o->ranges && (r = cv_act_ranges_find(p->o->ranges, group))) p->n_group_ranges++;
        free(group);
        if (!r || r->rows == 0)
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT,
                           "%s: no calibration input reached this linear; W8A8 needs its activation range "
                           "(more or longer calibration prompts, or --scheme w8a8_dynamic)", name);
        int rc = cv_act_static_params(r, &in_scale, &in_offset);
        if (rc) return cv_fail_prefix(rc, "%s", name);
    }
    if (p->n_lins == p->cap_lins) p->lins = cv_xrealloc(p->lins, (p->cap_lins = p->cap_lins ? 2 * p->cap_lins : 64) * sizeof *p->lins);
    const size_t li = p->n_lins++;
    p->lins[li] = (qx_linear){.name = cv_xstrdup(name), .w = w, .input_scale = in_scale, .input_offset = in_offset};
    static const qx_kind dynamic[] = {QX_WEIGHT, QX_WEIGHT_SCALE, QX_WEIGHT_OFFSET};
    static const qx_kind fixed[] = {QX_WEIGHT, QX_INPUT_SCALE, QX_INPUT_OFFSET, QX_DEQ_SCALE, QX_QUANT_BIAS};
    const bool is_static = p->o->scheme == CV_SCHEME_W8A8;
    const qx_kind *kinds = is_static ? fixed : dynamic;
    const size_t n_kinds = is_static ? CV_ARRAY_LEN(fixed) : CV_ARRAY_LEN(dynamic);
    for (size_t i = 0; i < n_kinds; i++) {
        qx_out *o = add_out(p, cv_xasprintf("%s.%s", name, suffix_of[kinds[i]]), kinds[i]);
        o->lin = li;
        switch (kinds[i]) {
        case QX_WEIGHT: o->dtype = CV_DTYPE_I8, o->ndim = 2, o->shape[0] = w.rows, o->shape[1] = w.cols; break;
        case QX_WEIGHT_SCALE:
        case QX_WEIGHT_OFFSET: o->dtype = CV_DTYPE_F32, o->ndim = 2, o->shape[0] = w.rows, o->shape[1] = 1; break;
        case QX_INPUT_SCALE:
        case QX_INPUT_OFFSET: o->dtype = CV_DTYPE_F32, o->ndim = 1, o->shape[0] = 1; break;
        case QX_DEQ_SCALE:
            o->dtype = p->o->deq_scale_i64 ? CV_DTYPE_I64 : CV_DTYPE_F32, o->ndim = 1, o->shape[0] = w.rows;
            break;
        case QX_QUANT_BIAS: o->dtype = CV_DTYPE_I32, o->ndim = 1, o->shape[0] = w.rows; break;
        case QX_FLOAT: assert(0);
        }
    }
    return 0;
}

static int check_float(const cv_tensor *t, int ndim) {
    if (!cv_quant_dtype_supported(t->dtype))
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: dtype %s cannot be quantized (F32, BF16 or F16 expected)", t->name,
                       cv_dtype_name(t->dtype));
    if (t->ndim != ndim)
        return cv_fail(CVLLM_ERR_FORMAT, "%s: %d dimensions, expected %d", t->name, t->ndim, ndim);
    return 0;
}

static int plan_linear(qx_plan *p, const cv_checkpoint *src, const cv_tensor *t) {
    int rc = check_float(t, 2);
    if (rc) return rc;
    char *name = cv_xstrndup(t->name, strlen(t->name) - strlen(".weight"));
    char *bias = cv_xasprintf("%s.bias", name);
    if (cv_checkpoint_find(src, bias))
        rc = cv_fail(CVLLM_ERR_UNSUPPORTED, "%s: quantizing a linear with a bias is not supported", bias);
    else
        rc = add_linear(p, name, (cv_quant_matrix){t->data, t->dtype, t->shape[0], t->shape[1]});
    free(bias);
    free(name);
    return rc;
}

/* gate_up [E][2I][H] → per expert gate (rows 0..I) and up (rows I..2I); down [E][H][I] → per expert. */
static int plan_fused(qx_plan *p, const cv_tensor *t, bool gate_up) {
    int rc = check_float(t, 3);
    if (rc) return rc;
    const int64_t experts = t->shape[0], rows = t->shape[1], cols = t->shape[2];
    if (gate_up && rows % 2)
        return cv_fail(CVLLM_ERR_FORMAT, "%s: %lld rows per expert, expected an even number (gate, then up)", t->name,
                       (long long)rows);
    char *prefix = cv_xstrndup(t->name, (size_t)(strrchr(t->name, '.') - t->name));
    const size_t esize = cv_dtype_size(t->dtype), block = (size_t)rows * (size_t)cols * esize;
    for (int64_t e = 0; e < experts && !rc; e++) {
        const char *base = (const char *)t->data + (size_t)e * block;
        char *name;
        if (gate_up) {
            const int64_t half = rows / 2;
            name = cv_xasprintf("%s.%lld.gate_proj", prefix, (long long)e);
            rc = add_linear(p, name, (cv_quant_matrix){base, t->dtype, half, cols});
            free(name);
            name = cv_xasprintf("%s.%lld.up_proj", prefix, (long long)e);
            if (!rc) rc = add_linear(p, name, (cv_quant_matrix){base + block / 2, t->dtype, half, cols});
        } else {
            name = cv_xasprintf("%s.%lld.down_proj", prefix, (long long)e);
            rc = add_linear(p, name, (cv_quant_matrix){base, t->dtype, rows, cols});
        }
        free(name);
    }
    free(prefix);
    return rc;
}

static int build_plan(qx_plan *p, const cv_checkpoint *src) {
    int rc = 0;
    for (size_t i = 0; i < cv_checkpoint_count(src) && !rc; i++) {
        const cv_tensor *t = cv_checkpoint_tensor(src, i);
        switch (cv_quant_recipe_action(p->o->recipe, t->name)) {
        case CV_QACT_FLOAT: {
            qx_out *o = add_out(p, cv_xstrdup(t->name), QX_FLOAT);
            o->src = t;
            o->dtype = t->dtype;
            break;
        }
        case CV_QACT_LINEAR: rc = plan_linear(p, src, t); break;
        case CV_QACT_FUSED_GATE_UP: rc = plan_fused(p, t, true); break;
        case CV_QACT_FUSED_DOWN: rc = plan_fused(p, t, false); break;
        }
    }
    if (!rc && p->n_lins == 0)
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "the %s recipe quantizes no tensor of this checkpoint",
                     cv_quant_recipe_name(p->o->recipe));
    return rc;
}

/* ---- filling the tensors ------------------------------------------------------------------------- */

static int need_scales(const qx_plan *p, qx_linear *l) {
    if (l->scale) return 0;
    l->scale = cv_xmalloc((size_t)(l->w.rows ? l->w.rows : 1) * sizeof *l->scale);
    int rc = cv_quant_weight_scales(p->o->pool, &l->w, l->scale);
    if (rc) {
        free(l->scale);
        l->scale = NULL;
        return cv_fail_prefix(rc, "%s.weight", l->name);
    }
    return 0;
}

static int fill(void *ctx, void *dst, size_t nbytes) {
    qx_out *o = ctx;
    qx_plan *p = o->plan;
    qx_linear *l = &p->lins[o->lin];
    int rc = need_scales(p, l);
    if (rc) return rc;
    const int64_t n = l->w.rows;
    switch (o->kind) {
    case QX_WEIGHT: cv_quant_weight_codes(p->o->pool, &l->w, l->scale, dst); break;
    case QX_WEIGHT_SCALE: memcpy(dst, l->scale, nbytes); break;
    case QX_WEIGHT_OFFSET: memset(dst, 0, nbytes); break; /* +0.0f is all zero bits */
    case QX_INPUT_SCALE: memcpy(dst, &l->input_scale, sizeof(float)); break;
    case QX_INPUT_OFFSET: memcpy(dst, &l->input_offset, sizeof(float)); break;
    case QX_DEQ_SCALE: {
        float *deq = cv_xmalloc((size_t)(n ? n : 1) * sizeof *deq);
        cv_quant_deq_scale(l->input_scale, l->scale, n, deq);
        if (o->dtype == CV_DTYPE_I64) cv_quant_deq_scale_i64(deq, n, dst);
        else memcpy(dst, deq, nbytes);
        free(deq);
        break;
    }
    case QX_QUANT_BIAS:
        if (!l->sums) {
            l->sums = cv_xmalloc((size_t)(n ? n : 1) * sizeof *l->sums);
            cv_quant_weight_code_sums(p->o->pool, &l->w, l->scale, l->sums);
        }
        rc = cv_quant_bias(l->input_offset, l->sums, n, dst);
        if (rc) rc = cv_fail_prefix(rc, "%s", l->name);
        break;
    case QX_FLOAT: assert(0);
    }
    return rc;
}

static int by_name(const void *a, const void *b) { return strcmp(((const qx_out *)a)->name, ((const qx_out *)b)->name); }

static int write_description(const qx_plan *p, const char *dir) {
    json_t *d = json_object();
    const char *scheme = cv_linear_scheme_name(p->o->scheme);
    for (size_t i = 0; i < p->n_outs; i++)
        json_object_set_new(d, p->outs[i].name, json_string(p->outs[i].kind == QX_FLOAT ? "FLOAT" : scheme));
    json_object_set_new(d, "model_quant_type", json_string(scheme));
    json_object_set_new(d, "version", json_string("1.0.0"));
    json_object_set_new(d, "group_size", json_integer(0));
    json_object_set_new(d, "metadata", json_object());
    json_object_set_new(d, "optional", json_object());
    char *path = cv_xasprintf("%s/%s", dir, CV_QUANT_DESCRIPTION_FILE);
    int rc = cv_write_json_file(d, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    free(path);
    json_decref(d);
    return rc;
}

static int copy_file(const char *from, const char *to) {
    int in = open(from, O_RDONLY), out = in < 0 ? -1 : open(to, O_WRONLY | O_CREAT | O_EXCL, 0644);
    int rc = in < 0    ? cv_fail(CVLLM_ERR_IO, "cannot read %s: %s", from, strerror(errno))
             : out < 0 ? cv_fail(CVLLM_ERR_IO, "cannot create %s: %s", to, strerror(errno))
                       : 0;
    char buf[1 << 16];
    for (ssize_t n; !rc && (n = read(in, buf, sizeof buf)) != 0;)
        if (n < 0 || write(out, buf, (size_t)n) != n)
            rc = cv_fail(CVLLM_ERR_IO, "cannot copy %s to %s: %s", from, to, strerror(errno));
    if (out >= 0 && close(out) != 0 && !rc) rc = cv_fail(CVLLM_ERR_IO, "cannot write %s: %s", to, strerror(errno));
    if (in >= 0) close(in);
    return rc;
}

static int copy_side_files(const char *src_dir, const char *dir) {
    int rc = 0;
    for (size_t i = 0; i < CV_ARRAY_LEN(side_files) && !rc; i++) {
        char *from = cv_xasprintf("%s/%s", src_dir, side_files[i]), *to = cv_xasprintf("%s/%s", dir, side_files[i]);
        if (cv_path_exists(from)) rc = copy_file(from, to);
        free(from);
        free(to);
    }
    return rc;
}

int cv_quant_export(const char *src_dir, const cv_checkpoint *src, const cv_quant_export_options *o, const char *dir,
                    cv_quant_export_stats *stats) {
    qx_plan p = {.o = o};
    int rc = build_plan(&p, src);
    if (!rc && cv_mkdirs(dir) != 0) rc = cv_fail(CVLLM_ERR_IO, "cannot create %s: %s", dir, strerror(errno));
    cv_st_writer *w = cv_st_writer_create();
    if (!rc) {
        qsort(p.outs, p.n_outs, sizeof *p.outs, by_name);
        for (size_t i = 0; i < p.n_outs; i++) {
            qx_out *out = &p.outs[i];
            if (out->kind == QX_FLOAT)
                cv_st_writer_add(w, out->name, out->dtype, out->src->ndim, out->src->shape, out->src->data, NULL, NULL);
            else
                cv_st_writer_add(w, out->name, out->dtype, out->ndim, out->shape, NULL, fill, out);
        }
        *stats = (cv_quant_export_stats){.n_tensors = p.n_outs, .n_linears = p.n_lins,
                                         .n_group_ranges = p.n_group_ranges, .bytes = cv_st_writer_total_bytes(w)};
        rc = cv_st_writer_write(w, dir, CV_QUANT_WEIGHTS_PREFIX, o->max_shard_bytes, &stats->n_shards);
    }
    if (!rc) rc = write_description(&p, dir);
    if (!rc) rc = copy_side_files(src_dir, dir);
    cv_st_writer_free(w);
    plan_free(&p);
    return rc;
}
