/*
 * safetensors_write.h — writing tensors as safetensors shards plus their index, one tensor in memory
 * at a time.
 *
 * A writer first collects what it will write (name, dtype, shape, and where the bytes come from:
 * a borrowed buffer, e.g. a view into a mapped checkpoint, or a function that fills them when their
 * turn comes), so a derived checkpoint larger than memory (int8 codes computed from a 70 GB bf16
 * model) streams through one tensor's buffer. Knowing every size in advance is also what names the
 * shards: PREFIX-0000i-of-0000n.safetensors needs n before the first file is opened.
 *
 * Sharding is Hugging Face's (huggingface_hub's split of a state dict): tensors in the order they
 * were added; a new shard starts when the next tensor would take the current one past the limit; a
 * tensor larger than the limit gets a shard of its own. One shard is still written as
 * PREFIX-00001-of-00001 with an index, as msModelSlim's saver does, so a reader needs one code path.
 *
 * Inside a file the data section holds the tensors by decreasing element size (then in the order
 * added), and the header is padded with spaces to a multiple of 8, as the reference safetensors
 * library lays files out: every tensor then starts aligned to its element size in a mapping.
 */
#ifndef CV_SAFETENSORS_WRITE_H
#define CV_SAFETENSORS_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

/* Writes a tensor's nbytes bytes at dst; 0, or a cv_fail status whose message names what failed (the
 * writer passes it on as it is). */
typedef int (*cv_st_fill_fn)(void *ctx, void *dst, size_t nbytes);

typedef struct cv_st_writer cv_st_writer;

cv_st_writer *cv_st_writer_create(void);
void cv_st_writer_free(cv_st_writer *w);

/* Adds a tensor (name copied). Its bytes are `data` (borrowed until the write) when not NULL, else
 * fill(ctx, ...) makes them at write time. ndim ≤ CV_MAX_DIMS. */
void cv_st_writer_add(cv_st_writer *w, const char *name, cv_dtype dtype, int ndim, const int64_t *shape,
                      const void *data, cv_st_fill_fn fill, void *ctx);

/* Tensors added so far and their bytes together. */
size_t cv_st_writer_count(const cv_st_writer *w);
uint64_t cv_st_writer_total_bytes(const cv_st_writer *w);

/* Writes DIR/PREFIX-0000i-of-0000n.safetensors and DIR/PREFIX.safetensors.index.json
 * ({"metadata": {"total_size": bytes}, "weight_map": {name: file}}); *n_shards gets n. A name
 * added twice is CVLLM_ERR_INVALID_ARGUMENT naming it (nothing written); a file that cannot be
 * written is CVLLM_ERR_IO naming it; a fill error is returned as it is. Files already
 * written stay: the caller owns DIR. */
int cv_st_writer_write(cv_st_writer *w, const char *dir, const char *prefix, uint64_t max_shard_bytes,
                       int *n_shards);

#endif
