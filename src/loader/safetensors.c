/*
 * safetensors.c — validating reader for safetensors checkpoints, single-file or sharded.
 *
 * File layout (little-endian):
 *
 *   +----------+---------------------------+------------------------------------------+
 *   | u64 N    | N bytes of JSON header    | data section: tensors back to back       |
 *   +----------+---------------------------+------------------------------------------+
 *                {"name": {"dtype": "BF16", "shape": [r, c], "data_offsets": [b, e]}, ...,
 *                 "__metadata__": {...}}      offsets are relative to the data section
 *
 * Every file is mmap'd read-only whole and its header checked before anything is handed out, so a
 * tensor view can never point outside its mapping: offsets lie inside the data section, each
 * tensor's byte length equals numel × dtype size (computed with overflow checks), and no two tensors
 * overlap (checked by sorting on the start offset). Holes between tensors are tolerated — they waste
 * bytes but cannot make a view wrong.
 *
 * A sharded checkpoint is described by model.safetensors.index.json ("weight_map": name → file);
 * every shard it names is opened, every name it lists must be found in the shard it points to, and a
 * tensor name may appear only once across shards. msModelSlim's exports name their files
 * quant_model_weights*.safetensors (an index of that prefix, or just the files: its V1 saver shards
 * even one file, its older one writes quant_model_weight_w8a8.safetensors); cv_checkpoint_open_prefix
 * opens the index of a name prefix, or every file with it. Lookup is a binary search over the tensors
 * sorted by name — even an MoE stored per expert has only ~10^5 tensors and lookups happen once at load
 * time, so a hash table would buy nothing.
 *
 * Errors carry the file path and, where one is involved, the tensor name, so a user can tell a
 * truncated download from a checkpoint that does not belong to the config.
 */
#include "loader/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "loader/fileutil.h"

/* The reference implementation refuses headers above 100 MB; a real one is well under 10 MB. */
#define MAX_HEADER_BYTES (100u << 20)

/* ------------------------------------------------------------------------------------------------ */
/* Header parsing                                                                                    */

static int parse_shape(json_t *shape, const char *name, cv_tensor *t) {
    if (!json_is_array(shape))
        return cv_fail(CVLLM_ERR_FORMAT, "tensor '%s': \"shape\" is not an array", name);
    size_t ndim = json_array_size(shape);
    if (ndim > CV_MAX_DIMS)
        return cv_fail(CVLLM_ERR_FORMAT, "tensor '%s': %zu dimensions (at most %d supported)", name,
                       ndim, CV_MAX_DIMS);
    t->ndim = (int)ndim;
    for (size_t i = 0; i < ndim; i++) {
        json_t *d = json_array_get(shape, i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return cv_fail(CVLLM_ERR_FORMAT, "tensor '%s': shape[%zu] is not a non-negative integer",
                           name, i);
        t->shape[i] = (int64_t)json_integer_value(d);
    }
    return 0;
}

/* numel × element size, or -1 when it does not fit in 63 bits. */
static int64_t checked_nbytes(const cv_tensor *t) {
    int64_t n = (int64_t)cv_dtype_size(t->dtype);
    for (int i = 0; i < t->ndim; i++)
        if (__builtin_mul_overflow(n, t->shape[i], &n)) return -1;
    return n;
}

static int parse_offsets(json_t *offsets, const char *name, uint64_t data_len, cv_tensor *t) {
    if (!json_is_array(offsets) || json_array_size(offsets) != 2)
        return cv_fail(CVLLM_ERR_FORMAT, "tensor '%s': \"data_offsets\" is not a [begin, end] pair",
                       name);
    json_t *jb = json_array_get(offsets, 0), *je = json_array_get(offsets, 1);
    if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
        json_integer_value(je) < 0)
        return cv_fail(CVLLM_ERR_FORMAT, "tensor '%s': data_offsets are not non-negative integers",
                       name);
    uint64_t begin = (uint64_t)json_integer_value(jb), end = (uint64_t)json_integer_value(je);
    if (begin > end)
        return cv_fail(CVLLM_ERR_FORMAT, "tensor '%s': data_offsets [%llu, %llu) end before they begin",
                       name, (unsigned long long)begin, (unsigned long long)end);
    if (end > data_len)
        return cv_fail(CVLLM_ERR_FORMAT,
                       "tensor '%s': data_offsets [%llu, %llu) out of range (data section is %llu "
                       "bytes; file truncated?)",
                       name, (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)data_len);
    int64_t want = checked_nbytes(t);
    if (want < 0) return cv_fail(CVLLM_ERR_FORMAT, "tensor '%s': shape is too large", name);
    if ((uint64_t)want != end - begin)
        return cv_fail(CVLLM_ERR_FORMAT,
                       "tensor '%s': data_offsets span %llu bytes but dtype %s and its shape need %lld",
                       name, (unsigned long long)(end - begin), cv_dtype_name(t->dtype),
                       (long long)want);
    t->data = (const void *)(uintptr_t)begin;
    t->nbytes = (size_t)(end - begin);
    return 0;
}

static int parse_entry(const char *name, json_t *desc, uint64_t data_len, cv_tensor *t) {
    if (!json_is_object(desc))
        return cv_fail(CVLLM_ERR_FORMAT, "tensor '%s': entry is not an object", name);
    json_t *dtype = json_object_get(desc, "dtype");
    if (!json_is_string(dtype))
        return cv_fail(CVLLM_ERR_FORMAT, "tensor '%s': missing \"dtype\"", name);
    int dt = cv_dtype_from_safetensors(json_string_value(dtype));
    if (dt < 0)
        return cv_fail(CVLLM_ERR_FORMAT, "tensor '%s': unknown dtype \"%s\"", name,
                       json_string_value(dtype));
    t->dtype = (cv_dtype)dt;
    int rc = parse_shape(json_object_get(desc, "shape"), name, t);
    if (rc) return rc;
    return parse_offsets(json_object_get(desc, "data_offsets"), name, data_len, t);
}

static int by_offset(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const cv_tensor *)a)->data, y = (uintptr_t)((const cv_tensor *)b)->data;
    return x < y ? -1 : x > y;
}

/* Overlap check on a scratch copy sorted by start offset; zero-byte tensors overlap nothing. */
static int check_no_overlap(const cv_tensor *tensors, size_t n) {
    cv_tensor *sorted = cv_xmalloc((n ? n : 1) * sizeof *sorted);
    memcpy(sorted, tensors, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, by_offset);
    const cv_tensor *prev = NULL;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const cv_tensor *t = &sorted[i];
        if (t->nbytes == 0) continue;
        if (prev && (uintptr_t)t->data < (uintptr_t)prev->data + prev->nbytes)
            rc = cv_fail(CVLLM_ERR_FORMAT, "tensors '%s' and '%s' overlap in the data section",
                         prev->name, t->name);
        prev = t;
    }
    free(sorted);
    return rc;
}

int cv_safetensors_parse_header(const char *json, size_t json_len, uint64_t data_len,
                                cv_tensor **tensors, size_t *n) {
    *tensors = NULL;
    *n = 0;
    json_error_t jerr;
    json_t *root = json_loadb(json, json_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return cv_fail(CVLLM_ERR_FORMAT, "header is not valid JSON (line %d column %d: %s)", jerr.line,
                       jerr.column, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return cv_fail(CVLLM_ERR_FORMAT, "header is not a JSON object");
    }
    cv_tensor *ts = cv_xcalloc(json_object_size(root) + 1, sizeof *ts);
    size_t count = 0;
    int rc = 0;
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (!strcmp(key, "__metadata__")) continue;
        cv_tensor *t = &ts[count++];
        t->name = cv_xstrdup(key);
        rc = parse_entry(key, value, data_len, t);
        if (rc) break;
    }
    json_decref(root);
    if (rc == 0) rc = check_no_overlap(ts, count);
    if (rc) {
        cv_safetensors_free_tensors(ts, count);
        return rc;
    }
    *tensors = ts;
    *n = count;
    return 0;
}

void cv_safetensors_free_tensors(cv_tensor *tensors, size_t n) {
    if (!tensors) return;
    for (size_t i = 0; i < n; i++) free((char *)tensors[i].name);
    free(tensors);
}

/* ------------------------------------------------------------------------------------------------ */
/* One mapped file                                                                                   */

typedef struct st_file {
    char *path;
    void *map;
    size_t size;
} st_file;

static uint64_t read_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static int map_file(const char *path, st_file *f) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cv_fail(errno == ENOENT ? CVLLM_ERR_NOT_FOUND : CVLLM_ERR_IO, "%s: %s", path,
                       strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return cv_fail(CVLLM_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return cv_fail(CVLLM_ERR_FORMAT, "%s: truncated safetensors file (%lld bytes, need at least 8)",
                       path, (long long)st.st_size);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int saved = errno;
    close(fd);
    if (map == MAP_FAILED) return cv_fail(CVLLM_ERR_IO, "%s: mmap failed: %s", path, strerror(saved));
    f->path = cv_xstrdup(path);
    f->map = map;
    f->size = (size_t)st.st_size;
    return 0;
}

static void unmap_file(st_file *f) {
    if (f->map) munmap(f->map, f->size);
    free(f->path);
}

int cv_safetensors_parse_buffer(const void *buf, size_t size, cv_tensor **tensors, size_t *n) {
    *tensors = NULL;
    *n = 0;
    if (size < 8)
        return cv_fail(CVLLM_ERR_FORMAT, "truncated safetensors file (%zu bytes, need at least 8)", size);
    const unsigned char *base = buf;
    uint64_t header_len = read_le64(base);
    if (header_len > size - 8)
        return cv_fail(CVLLM_ERR_FORMAT,
                       "header length %llu past the end of the file (%zu bytes; truncated or not a "
                       "safetensors file)",
                       (unsigned long long)header_len, size);
    if (header_len > MAX_HEADER_BYTES)
        return cv_fail(CVLLM_ERR_FORMAT, "header length %llu is implausibly large",
                       (unsigned long long)header_len);
    const unsigned char *data = base + 8 + header_len;
    uint64_t data_len = size - 8 - header_len;
    int rc = cv_safetensors_parse_header((const char *)base + 8, header_len, data_len, tensors, n);
    if (rc) return rc;
    for (size_t i = 0; i < *n; i++) (*tensors)[i].data = data + (uintptr_t)(*tensors)[i].data;
    return 0;
}

static int read_tensors(const st_file *f, cv_tensor **tensors, size_t *n) {
    int rc = cv_safetensors_parse_buffer(f->map, f->size, tensors, n);
    return rc ? cv_fail_prefix(rc, "%s", f->path) : 0;
}

/* ------------------------------------------------------------------------------------------------ */
/* Checkpoint (all shards)                                                                           */

struct cv_checkpoint {
    st_file *files;
    size_t n_files;
    cv_tensor *tensors;  /* sorted by name; names owned */
    size_t n_tensors;
};

static int by_name(const void *a, const void *b) {
    return strcmp(((const cv_tensor *)a)->name, ((const cv_tensor *)b)->name);
}

static int add_file(cv_checkpoint *ck, const char *path) {
    st_file f;
    int rc = map_file(path, &f);
    if (rc) return rc;
    cv_tensor *ts;
    size_t n;
    rc = read_tensors(&f, &ts, &n);
    if (rc) {
        unmap_file(&f);
        return rc;
    }
    ck->files = cv_xrealloc(ck->files, (ck->n_files + 1) * sizeof *ck->files);
    ck->files[ck->n_files++] = f;
    ck->tensors = cv_xrealloc(ck->tensors, (ck->n_tensors + n + 1) * sizeof *ck->tensors);
    memcpy(ck->tensors + ck->n_tensors, ts, n * sizeof *ts);
    ck->n_tensors += n;
    free(ts); /* the names moved into ck->tensors */
    return 0;
}

static int sort_and_check_unique(cv_checkpoint *ck) {
    qsort(ck->tensors, ck->n_tensors, sizeof *ck->tensors, by_name);
    for (size_t i = 1; i < ck->n_tensors; i++)
        if (!strcmp(ck->tensors[i - 1].name, ck->tensors[i].name))
            return cv_fail(CVLLM_ERR_FORMAT, "tensor '%s' appears in more than one shard",
                           ck->tensors[i].name);
    return 0;
}

/* Shard names come from a downloaded file: refuse anything that could leave the folder. */
static bool plain_file_name(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/');
}

/* Loads the index and checks its weight_map (tensor name → shard file name). */
static int read_index(const char *index_path, json_t **weight_map_out, json_t **root_out) {
    size_t len;
    char *text = cv_read_file(index_path, &len);
    if (!text) return cv_fail(CVLLM_ERR_IO, "%s: %s", index_path, strerror(errno));
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!root)
        return cv_fail(CVLLM_ERR_FORMAT, "%s: invalid JSON (line %d column %d: %s)", index_path,
                       jerr.line, jerr.column, jerr.text);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        json_decref(root);
        return cv_fail(CVLLM_ERR_FORMAT, "%s: missing \"weight_map\" object", index_path);
    }
    const char *name;
    json_t *file;
    json_object_foreach(wm, name, file) {
        if (!json_is_string(file) || !plain_file_name(json_string_value(file))) {
            int rc = cv_fail(CVLLM_ERR_FORMAT, "%s: tensor '%s' maps to an invalid shard name",
                             index_path, name);
            json_decref(root);
            return rc;
        }
    }
    *weight_map_out = wm;
    *root_out = root;
    return 0;
}

static int open_shards(cv_checkpoint *ck, const char *dir, const char *index_path) {
    json_t *wm, *root;
    int rc = read_index(index_path, &wm, &root);
    if (rc) return rc;
    json_t *opened = json_object(); /* shard name → true */
    const char *name;
    json_t *file;
    json_object_foreach(wm, name, file) {
        const char *shard = json_string_value(file);
        if (json_object_get(opened, shard)) continue;
        json_object_set_new(opened, shard, json_true());
        char *path = cv_xasprintf("%s/%s", dir, shard);
        rc = add_file(ck, path);
        free(path);
        if (rc) break;
    }
    json_decref(opened);
    if (rc == 0) rc = sort_and_check_unique(ck);
    json_object_foreach(wm, name, file) {
        if (rc) break;
        if (!cv_checkpoint_find(ck, name))
            rc = cv_fail(CVLLM_ERR_FORMAT, "%s lists tensor '%s' but %s/%s does not contain it",
                         index_path, name, dir, json_string_value(file));
    }
    json_decref(root);
    return rc;
}

static int open_single(cv_checkpoint *ck, const char *path) {
    int rc = add_file(ck, path);
    return rc ? rc : sort_and_check_unique(ck);
}

static int finish_open(cv_checkpoint *ck, int rc, cv_checkpoint **out) {
    if (rc) {
        cv_checkpoint_close(ck);
        return rc;
    }
    *out = ck;
    return 0;
}

int cv_checkpoint_open(const char *dir, cv_checkpoint **out) {
    *out = NULL;
    cv_checkpoint *ck = cv_xcalloc(1, sizeof *ck);
    char *index_path = cv_xasprintf("%s/model.safetensors.index.json", dir);
    char *single_path = cv_xasprintf("%s/model.safetensors", dir);
    int rc;
    if (cv_path_exists(index_path))
        rc = open_shards(ck, dir, index_path);
    else if (cv_path_exists(single_path))
        rc = open_single(ck, single_path);
    else
        rc = cv_fail(CVLLM_ERR_NOT_FOUND, "no model.safetensors or model.safetensors.index.json in %s", dir);
    free(index_path);
    free(single_path);
    return finish_open(ck, rc, out);
}

/* Every PREFIX*.safetensors of dir, as one checkpoint. */
static int open_all_like(cv_checkpoint *ck, const char *dir, const char *prefix) {
    size_t n;
    char **files = cv_list_names(dir, prefix, ".safetensors", &n);
    int rc = n ? 0 : cv_fail(CVLLM_ERR_NOT_FOUND, "no %s*.safetensors in %s", prefix, dir);
    for (size_t i = 0; i < n && !rc; i++) {
        char *path = cv_xasprintf("%s/%s", dir, files[i]);
        rc = add_file(ck, path);
        free(path);
    }
    cv_free_names(files);
    return rc ? rc : sort_and_check_unique(ck);
}

int cv_checkpoint_open_prefix(const char *dir, const char *prefix, cv_checkpoint **out) {
    *out = NULL;
    cv_checkpoint *ck = cv_xcalloc(1, sizeof *ck);
    size_t n;
    char **indexes = cv_list_names(dir, prefix, ".safetensors.index.json", &n);
    int rc;
    if (n > 1) {
        rc = cv_fail(CVLLM_ERR_FORMAT, "%s holds two indexes of one checkpoint, %s and %s", dir, indexes[0],
                     indexes[1]);
    } else if (n == 1) {
        char *index_path = cv_xasprintf("%s/%s", dir, indexes[0]);
        rc = open_shards(ck, dir, index_path);
        free(index_path);
    } else {
        rc = open_all_like(ck, dir, prefix);
    }
    cv_free_names(indexes);
    return finish_open(ck, rc, out);
}

void cv_checkpoint_close(cv_checkpoint *ck) {
    if (!ck) return;
    for (size_t i = 0; i < ck->n_tensors; i++) free((char *)ck->tensors[i].name);
    free(ck->tensors);
    for (size_t i = 0; i < ck->n_files; i++) unmap_file(&ck->files[i]);
    free(ck->files);
    free(ck);
}

const cv_tensor *cv_checkpoint_find(const cv_checkpoint *ck, const char *name) {
    cv_tensor key = {.name = name};
    return bsearch(&key, ck->tensors, ck->n_tensors, sizeof key, by_name);
}

size_t cv_checkpoint_count(const cv_checkpoint *ck) { return ck->n_tensors; }

const cv_tensor *cv_checkpoint_tensor(const cv_checkpoint *ck, size_t i) {
    return i < ck->n_tensors ? &ck->tensors[i] : NULL;
}

size_t cv_checkpoint_n_files(const cv_checkpoint *ck) { return ck->n_files; }

const char *cv_checkpoint_file_path(const cv_checkpoint *ck, size_t i) {
    return i < ck->n_files ? ck->files[i].path : NULL;
}
