/*
 * pack_cache.h — a file-backed cache of weights repacked at load (the kernels' panel layout).
 *
 * Repacking a bf16 checkpoint costs a pass over the weights and, above all, fresh memory for the
 * packed copy: the kernel must hand out and zero every page of it, which dominates start-up on a
 * virtual machine whose host backs guest memory on first touch (~3 s per GiB measured here). The
 * packed bytes depend only on the checkpoint files and the layout, so the first load writes them
 * into a file in the cache and later loads map that file: already in the page cache, nothing to
 * allocate, zero, or pack. The entry is shared, clean page cache, so it also costs no more resident
 * memory than the anonymous copy it replaces, and can be paged out under pressure instead of OOM.
 *
 * Keys: an entry is named by a hash of the checkpoint files' identity (real path, size, mtime,
 * inode, device) and of the caller's `layout` hash (its format version and every shape it packs),
 * so a changed checkpoint or a new packing code never reads an old entry. Every section carries an
 * XXH3 hash that a hit re-checks (on the pool, ~0.1 s per GiB) before use: a torn or damaged file
 * — a crash between writing and write-back, a full disk — is detected and rebuilt, never trusted,
 * which is why commit needs no fsync.
 *
 * Writing: a miss creates `<key>.tmp.<pid>`, reserves its blocks with posix_fallocate (a mapping
 * of a sparse file on a full disk would SIGBUS on write), hands out its sections to be filled, and
 * commit writes the hashes and header and renames it into place; two processes racing on the same
 * entry both succeed, the last rename wins, and both hold valid bytes.
 *
 * Size: one entry per checkpoint in use. Each miss sweeps the folder: entries whose source files
 * are gone or changed, and temporary files of processes that died, are deleted.
 *
 * Where: $CVLLM_CACHE_ROOT/packed (default $XDG_CACHE_HOME/cvllm or ~/.cache/cvllm).
 * CVLLM_PACKED_WEIGHTS_CACHE=0 turns it off. Any failure (read-only or full disk, no home) logs a
 * warning and the load packs into anonymous memory as before: the cache never fails a load.
 */
#ifndef CV_PACK_CACHE_H
#define CV_PACK_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/threadpool.h"

typedef struct cv_pack_cache cv_pack_cache;

/* The entry for `layout` of files[0..n_files) with sections of sizes[0..n_sections) bytes, or NULL
 * when caching is off or unavailable (a warning says why, except when turned off). A hit has been
 * verified; a miss has writable sections to fill before cv_pack_cache_commit. */
cv_pack_cache *cv_pack_cache_open(const char *const *files, size_t n_files, uint64_t layout, const size_t *sizes,
                                  int n_sections, cv_threadpool *pool);
bool cv_pack_cache_hit(const cv_pack_cache *c);
/* Section i: 4 KiB aligned; read-only on a hit. Valid until cv_pack_cache_close. */
void *cv_pack_cache_section(const cv_pack_cache *c, int i);
/* After a miss's sections are filled: hashes them and publishes the entry. On failure a warning
 * is logged and the sections stay valid for this process (the entry is just not kept). */
void cv_pack_cache_commit(cv_pack_cache *c, cv_threadpool *pool);
const char *cv_pack_cache_path(const cv_pack_cache *c);
/* Unmaps the sections. */
void cv_pack_cache_close(cv_pack_cache *c);

#endif
