/*
 * safetensors.h — read-only, zero-copy access to a checkpoint's tensors.
 *
 * A checkpoint is one model.safetensors or several shards listed in model.safetensors.index.json
 * (or, for quantized exports, the files of another name prefix: cv_checkpoint_open_prefix).
 * Each file is mmap'd whole; a tensor is a pointer into the mapping plus dtype and shape, so the
 * weights are never copied (the page cache holds them once, however many engines map them).
 * The header of every file is validated completely before any tensor is handed out: JSON shape,
 * known dtypes, offsets in range, data length equal to the product of the shape, no overlap between
 * tensors. Any violation is CVLLM_ERR_FORMAT with a message naming the file and the tensor.
 */
#ifndef CV_SAFETENSORS_H
#define CV_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

#define CV_MAX_DIMS 8

typedef struct cv_tensor {
    const char *name;
    cv_dtype dtype;
    int ndim;
    int64_t shape[CV_MAX_DIMS];
    const void *data;  /* into the mapping (or into owned memory for dummy/converted weights) */
    size_t nbytes;
} cv_tensor;

static inline int64_t cv_tensor_numel(const cv_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/*
 * Parses one safetensors header (the JSON after the 8-byte length) describing a data section of
 * data_len bytes. On success *tensors is a cv_xmalloc'd array of *n tensors whose `data` field holds
 * the byte offset from the start of the data section cast to a pointer, and whose names are
 * cv_xmalloc'd. Exposed separately from the file reader so that it can be fuzzed.
 */
int cv_safetensors_parse_header(const char *json, size_t json_len, uint64_t data_len,
                                cv_tensor **tensors, size_t *n);
void cv_safetensors_free_tensors(cv_tensor *tensors, size_t n);

/*
 * Validates a whole safetensors file held in memory (8-byte header length, header, data) and
 * returns its tensors as cv_safetensors_parse_header does, but with `data` pointing into buf.
 * Messages do not name the file; callers prefix it.
 */
int cv_safetensors_parse_buffer(const void *buf, size_t size, cv_tensor **tensors, size_t *n);

/* All tensors of a checkpoint folder (single file or sharded), name-indexed. */
typedef struct cv_checkpoint cv_checkpoint;

int cv_checkpoint_open(const char *dir, cv_checkpoint **out);
/* The checkpoint whose files in DIR are named PREFIX*.safetensors: the shards that the one index
 * PREFIX*.safetensors.index.json lists when there is one, else every such file (msModelSlim's
 * exports: quant_model_weights.safetensors, its quant_model_weights-0000i-of-0000n shards, the older
 * quant_model_weight_w8a8.safetensors). Two indexes, or a tensor in two files, are CVLLM_ERR_FORMAT. */
int cv_checkpoint_open_prefix(const char *dir, const char *prefix, cv_checkpoint **out);
void cv_checkpoint_close(cv_checkpoint *ck);
/* NULL when absent. */
const cv_tensor *cv_checkpoint_find(const cv_checkpoint *ck, const char *name);
size_t cv_checkpoint_count(const cv_checkpoint *ck);
const cv_tensor *cv_checkpoint_tensor(const cv_checkpoint *ck, size_t i);
/* The safetensors files mapped (paths as opened), e.g. to key caches derived from them. */
size_t cv_checkpoint_n_files(const cv_checkpoint *ck);
const char *cv_checkpoint_file_path(const cv_checkpoint *ck, size_t i);

#endif
