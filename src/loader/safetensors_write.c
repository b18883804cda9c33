/*
 * safetensors_write.c — see safetensors_write.h. The header is built with jansson (names are JSON
 * strings, so any byte a name holds is escaped properly) and written before the data; each tensor is
 * written straight from its borrowed bytes or from a buffer its fill function filled, then freed.
 */
#include "loader/safetensors_write.h"

#include <assert.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "loader/fileutil.h"
#include "loader/safetensors.h"

typedef struct st_entry {
    char *name;
    cv_dtype dtype;
    int ndim;
    int64_t shape[CV_MAX_DIMS];
    uint64_t nbytes;
    const void *data;
    cv_st_fill_fn fill;
    void *ctx;
    int shard;
} st_entry;

struct cv_st_writer {
    st_entry *entries;
    size_t n, cap;
    uint64_t total;
};

cv_st_writer *cv_st_writer_create(void) { return cv_xcalloc(1, sizeof(cv_st_writer)); }

void cv_st_writer_free(cv_st_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n; i++) free(w->entries[i].name);
    free(w->entries);
    free(w);
}

void cv_st_writer_add(cv_st_writer *w, const char *name, cv_dtype dtype, int ndim, const int64_t *shape,
                      const void *data, cv_st_fill_fn fill, void *ctx) {
    assert(ndim >= 0 && ndim <= CV_MAX_DIMS && (data || fill) && cv_dtype_size(dtype) > 0);
    if (w->n == w->cap) w->entries = cv_xrealloc(w->entries, (w->cap = w->cap ? 2 * w->cap : 64) * sizeof *w->entries);
    st_entry *e = &w->entries[w->n++];
    *e = (st_entry){.name = cv_xstrdup(name), .dtype = dtype, .ndim = ndim, .data = data, .fill = fill, .ctx = ctx};
    e->nbytes = cv_dtype_size(dtype);
    for (int d = 0; d < ndim; d++) {
        assert(shape[d] >= 0);
        e->shape[d] = shape[d];
        e->nbytes *= (uint64_t)shape[d];
    }
    w->total += e->nbytes;
}

size_t cv_st_writer_count(const cv_st_writer *w) { return w->n; }

uint64_t cv_st_writer_total_bytes(const cv_st_writer *w) { return w->total; }

static int by_name(const void *a, const void *b) {
    return strcmp((*(const st_entry *const *)a)->name, (*(const st_entry *const *)b)->name);
}

static int check_unique(const cv_st_writer *w) {
    const st_entry **sorted = cv_xmalloc((w->n ? w->n : 1) * sizeof *sorted);
    for (size_t i = 0; i < w->n; i++) sorted[i] = &w->entries[i];
    qsort(sorted, w->n, sizeof *sorted, by_name);
    int rc = 0;
    for (size_t i = 1; i < w->n && !rc; i++)
        if (!strcmp(sorted[i - 1]->name, sorted[i]->name))
            rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "tensor '%s' would be written twice", sorted[i]->name);
    free(sorted);
    return rc;
}

/* Hugging Face's split; returns the number of shards. */
static int assign_shards(cv_st_writer *w, uint64_t max_bytes) {
    int shard = -1;
    uint64_t filled = 0;
    bool open = false; /* the current shard holds a tensor and may take more */
    for (size_t i = 0; i < w->n; i++) {
        st_entry *e = &w->entries[i];
        if (e->nbytes > max_bytes) {
            e->shard = ++shard;
            open = false;
            continue;
        }
        if (!open || filled + e->nbytes > max_bytes) {
            shard++;
            filled = 0;
            open = true;
        }
        e->shard = shard;
        filled += e->nbytes;
    }
    return shard + 1;
}

/* The entries of one shard in data order: decreasing element size, then as added (stable). */
static size_t shard_order(const cv_st_writer *w, int shard, const st_entry **out) {
    size_t n = 0;
    for (size_t size = 8; size >= 1; size /= 2)
        for (size_t i = 0; i < w->n; i++)
            if (w->entries[i].shard == shard && cv_dtype_size(w->entries[i].dtype) == size) out[n++] = &w->entries[i];
    return n;
}

static char *shard_name(const char *prefix, int i, int n) {
    return cv_xasprintf("%s-%05d-of-%05d.safetensors", prefix, i + 1, n);
}

static char *header_json(const st_entry *const *order, size_t n) {
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"));
    uint64_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const st_entry *e = order[i];
        json_t *shape = json_array();
        for (int d = 0; d < e->ndim; d++) json_array_append_new(shape, json_integer(e->shape[d]));
        json_object_set_new(h, e->name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", cv_dtype_name(e->dtype), "shape", shape,
                                      "data_offsets", (json_int_t)offset, (json_int_t)(offset + e->nbytes)));
        offset += e->nbytes;
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    return text;
}

static int write_tensor(FILE *f, const st_entry *e, const char *path) {
    if (e->data) return fwrite(e->data, 1, e->nbytes, f) == e->nbytes ? 0 : cv_fail(CVLLM_ERR_IO, "%s: %s", path, strerror(errno));
    void *buf = e->nbytes ? malloc(e->nbytes) : NULL;
    if (e->nbytes && !buf)
        return cv_fail(CVLLM_ERR_NO_MEMORY, "no memory for tensor '%s' (%llu bytes)", e->name,
                       (unsigned long long)e->nbytes);
    int rc = e->fill(e->ctx, buf, e->nbytes);
    if (!rc && fwrite(buf, 1, e->nbytes, f) != e->nbytes) rc = cv_fail(CVLLM_ERR_IO, "%s: %s", path, strerror(errno));
    free(buf);
    return rc;
}

static int write_shard(const cv_st_writer *w, const char *path, int shard, const st_entry **order) {
    size_t n = shard_order(w, shard, order);
    char *header = header_json(order, n);
    size_t len = strlen(header);
    uint64_t padded = (len + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    int rc = 0;
    if (!f) rc = cv_fail(CVLLM_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    if (!rc && (fwrite(&padded, sizeof padded, 1, f) != 1 || fwrite(header, 1, len, f) != len ||
                fwrite("       ", 1, padded - len, f) != padded - len))
        rc = cv_fail(CVLLM_ERR_IO, "%s: %s", path, strerror(errno));
    for (size_t i = 0; i < n && !rc; i++) rc = write_tensor(f, order[i], path);
    if (f && fclose(f) != 0 && !rc) rc = cv_fail(CVLLM_ERR_IO, "%s: %s", path, strerror(errno));
    free(header);
    return rc;
}

static int write_index(const cv_st_writer *w, const char *dir, const char *prefix, int n_shards) {
    json_t *map = json_object();
    for (size_t i = 0; i < w->n; i++) {
        char *file = shard_name(prefix, w->entries[i].shard, n_shards);
        json_object_set_new(map, w->entries[i].name, json_string(file));
        free(file);
    }
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)w->total, "weight_map", map);
    char *path = cv_xasprintf("%s/%s.safetensors.index.json", dir, prefix);
    int rc = cv_write_json_file(root, path, JSON_INDENT(2) | JSON_SORT_KEYS);
    free(path);
    json_decref(root);
    return rc;
}

int cv_st_writer_write(cv_st_writer *w, const char *dir, const char *prefix, uint64_t max_shard_bytes,
                       int *n_shards) {
    assert(max_shard_bytes > 0);
    int rc = check_unique(w);
    if (rc) return rc;
    int n = assign_shards(w, max_shard_bytes);
    const st_entry **order = cv_xmalloc((w->n ? w->n : 1) * sizeof *order);
    for (int s = 0; s < n && !rc; s++) {
        char *name = shard_name(prefix, s, n);
        char *path = cv_xasprintf("%s/%s", dir, name);
        rc = write_shard(w, path, s, order);
        free(path);
        free(name);
    }
    free(order);
    if (!rc) rc = write_index(w, dir, prefix, n);
    if (!rc) *n_shards = n;
    return rc;
}
