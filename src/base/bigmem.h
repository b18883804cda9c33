/*
 * bigmem.h — zeroed, page-aligned allocations of the engine's large arrays (packed weights, the KV
 * cache, recurrent-state slots), backed by transparent huge pages where the kernel offers them.
 *
 * Why not calloc: a 4 KiB-page array is faulted in one page at a time on first touch, and a KV
 * cache row of one token is about one page, so every decoded token of a fresh sequence paid a page
 * fault per layer (measured at tens of microseconds each on a virtual machine, ~10 % of a decode
 * step). Huge pages take one fault per 2 MiB and fewer TLB misses while streaming weights.
 */
#ifndef CV_BASE_BIGMEM_H
#define CV_BASE_BIGMEM_H

#include <stddef.h>

/* Returns `bytes` of zeroed memory, or NULL when the system has none (the caller reports it). */
void *cv_big_alloc(size_t bytes);

/* Releases a cv_big_alloc() block of the same size; NULL is a no-op. */
void cv_big_free(void *p, size_t bytes);

#endif
