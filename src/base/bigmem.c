/*
 * bigmem.c — anonymous mappings advised for transparent huge pages (see bigmem.h for why).
 *
 * MADV_HUGEPAGE is advice: with THP off it changes nothing and the memory is still valid, so its
 * result is not checked. The mapping is private and anonymous, hence zero-filled.
 */
#include "base/bigmem.h"

#include <sys/mman.h>

void *cv_big_alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

void cv_big_free(void *p, size_t bytes) {
    if (p) munmap(p, bytes ? bytes : 1);
}
