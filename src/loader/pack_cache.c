/*
 * pack_cache.c — the packed-weight cache (design in pack_cache.h).
 *
 * File: a header, then the sections at 4 KiB-aligned offsets. The header is
 *   magic "CVPACK01", version, layout, key (2 × u64), n_sections, n_files, header_bytes, file_bytes
 *   n_sections × {offset, bytes, xxh3 of the section}
 *   n_files × {size, mtime_ns, inode, device, path length}, then the paths
 *   xxh3 of everything above
 * all u64 in the machine's byte order (an entry never leaves the machine that wrote it). The file
 * records let a sweep tell a stale entry from a live one with nothing but stat().
 *
 * A section's hash is the hash of its 4 MiB chunks' hashes, so verification splits evenly over
 * the pool whatever the section sizes, and the result does not depend on the thread count.
 */
#define _GNU_SOURCE
#include "loader/pack_cache.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t for streaming */
#include <xxhash.h>

#include "base/error.h"
#include "base/log.h"
#include "base/timeutil.h"
#include "loader/fileutil.h"

enum { VERSION = 1, PAGE = 4096, FIXED_WORDS = 10, SECTION_WORDS = 3, FILE_WORDS = 5 };
enum { MAX_HEADER_BYTES = 64 << 20 };
#define CHUNK_BYTES ((size_t)4 << 20)
static const char MAGIC[8] = {'C', 'V', 'P', 'A', 'C', 'K', '0', '1'};

typedef struct file_id {
    char *path;
    uint64_t size, mtime_ns, ino, dev;
} file_id;

struct cv_pack_cache {
    char *path;     /* the entry */
    char *tmp;      /* the unpublished file of a miss; NULL once committed (or on a hit) */
    uint8_t *map;
    size_t map_bytes, header_bytes;
    bool hit;
    int n;
    size_t *offset, *bytes;
    uint64_t layout;
    XXH128_hash_t key;
    file_id *files;
    size_t n_files;
};

static size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

/* ---- source identity ---------------------------------------------------------------------------- */

static int stat_id(const char *path, file_id *out) {
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    out->size = (uint64_t)st.st_size;
    out->mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
    out->ino = (uint64_t)st.st_ino;
    out->dev = (uint64_t)st.st_dev;
    return 0;
}

static void free_ids(file_id *ids, size_t n) {
    for (size_t i = 0; ids && i < n; i++) free(ids[i].path);
    free(ids);
}

static file_id *identify(const char *const *files, size_t n) {
    file_id *ids = cv_xcalloc(n ? n : 1, sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        char real[PATH_MAX];
        if (!realpath(files[i], real) || stat_id(real, &ids[i]) != 0) {
            cv_warn("loader", "packed-weight cache off: cannot stat %s: %s", files[i], strerror(errno));
            free_ids(ids, n);
            return NULL;
        }
        ids[i].path = cv_xstrdup(real);
    }
    return ids;
}

static XXH128_hash_t entry_key(const file_id *ids, size_t n, uint64_t layout) {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    const uint64_t head[2] = {VERSION, layout};
    XXH3_128bits_update(&st, head, sizeof head);
    for (size_t i = 0; i < n; i++) {
        const uint64_t words[4] = {ids[i].size, ids[i].mtime_ns, ids[i].ino, ids[i].dev};
        XXH3_128bits_update(&st, ids[i].path, strlen(ids[i].path) + 1);
        XXH3_128bits_update(&st, words, sizeof words);
    }
    return XXH3_128bits_digest(&st);
}

/* ---- header ------------------------------------------------------------------------------------- */

typedef struct header {
    uint64_t version, layout, n_sections, n_files, header_bytes, file_bytes;
    XXH128_hash_t key;
    uint64_t *sections; /* SECTION_WORDS per section */
    file_id *files;
} header;

static void free_header(header *h) {
    free(h->sections);
    free_ids(h->files, h->n_files);
    memset(h, 0, sizeof *h);
}

static size_t paths_bytes(const file_id *ids, size_t n) {
    size_t b = 0;
    for (size_t i = 0; i < n; i++) b += strlen(ids[i].path);
    return b;
}

/* Bytes the header needs before rounding (the trailing hash included). */
static size_t header_size(int n_sections, const file_id *ids, size_t n_files) {
    return 8 * (FIXED_WORDS + SECTION_WORDS * (size_t)n_sections + FILE_WORDS * n_files + 1) +
           paths_bytes(ids, n_files);
}

/* Parses and checks a header of `len` bytes; false when it is not a sound header of this version. */
static bool parse_header(const uint8_t *buf, size_t len, header *h) {
    memset(h, 0, sizeof *h);
    uint64_t w[FIXED_WORDS];
    if (len < sizeof MAGIC + 8 * (FIXED_WORDS - 1) || memcmp(buf, MAGIC, sizeof MAGIC)) return false;
    memcpy(w, buf, sizeof w);
    h->version = w[1], h->layout = w[2], h->key.low64 = w[3], h->key.high64 = w[4];
    h->n_sections = w[5], h->n_files = w[6], h->header_bytes = w[7], h->file_bytes = w[8];
    if (h->version != VERSION || h->header_bytes > len || h->n_sections > (1u << 20) || h->n_files > (1u << 20))
        return false;
    size_t at = 8 * FIXED_WORDS;
    const size_t records = 8 * (SECTION_WORDS * h->n_sections + FILE_WORDS * h->n_files);
    if (records + at + 8 > h->header_bytes) return false;
    h->sections = cv_xmalloc(8 * SECTION_WORDS * (h->n_sections ? h->n_sections : 1));
    memcpy(h->sections, buf + at, 8 * SECTION_WORDS * h->n_sections);
    at += 8 * SECTION_WORDS * h->n_sections;
    h->files = cv_xcalloc(h->n_files ? h->n_files : 1, sizeof *h->files);
    size_t path_at = at + 8 * FILE_WORDS * h->n_files;
    for (size_t i = 0; i < h->n_files; i++, at += 8 * FILE_WORDS) {
        uint64_t f[FILE_WORDS];
        memcpy(f, buf + at, sizeof f);
        if (f[4] > h->header_bytes || path_at + f[4] + 8 > h->header_bytes) {
            h->n_files = i;
            free_header(h);
            return false;
        }
        h->files[i] = (file_id){cv_xstrndup((const char *)buf + path_at, f[4]), f[0], f[1], f[2], f[3]};
        path_at += f[4];
    }
    uint64_t stored;
    memcpy(&stored, buf + path_at, 8);
    if (stored != XXH3_64bits(buf, path_at)) {
        free_header(h);
        return false;
    }
    return true;
}

static void write_header(const cv_pack_cache *c, const uint64_t *hashes) {
    uint8_t *p = c->map;
    memcpy(p, MAGIC, sizeof MAGIC);
    const uint64_t w[FIXED_WORDS - 1] = {VERSION, c->layout, c->key.low64, c->key.high64, (uint64_t)c->n,
                                         c->n_files, c->header_bytes, c->map_bytes, 0};
    memcpy(p + 8, w, sizeof w);
    size_t at = 8 * FIXED_WORDS;
    for (int i = 0; i < c->n; i++, at += 8 * SECTION_WORDS) {
        const uint64_t s[SECTION_WORDS] = {c->offset[i], c->bytes[i], hashes[i]};
        memcpy(p + at, s, sizeof s);
    }
    for (size_t i = 0; i < c->n_files; i++, at += 8 * FILE_WORDS) {
        const file_id *f = &c->files[i];
        const uint64_t r[FILE_WORDS] = {f->size, f->mtime_ns, f->ino, f->dev, strlen(f->path)};
        memcpy(p + at, r, sizeof r);
    }
    for (size_t i = 0; i < c->n_files; i++) {
        memcpy(p + at, c->files[i].path, strlen(c->files[i].path));
        at += strlen(c->files[i].path);
    }
    const uint64_t h = XXH3_64bits(p, at);
    memcpy(p + at, &h, 8);
}

/* ---- section hashes ----------------------------------------------------------------------------- */

typedef struct hash_job {
    const cv_pack_cache *c;
    const int64_t *first; /* first chunk of each section; first[n] = total */
    uint64_t *chunk;
} hash_job;

static int64_t chunks_of(size_t bytes) { return (int64_t)((bytes + CHUNK_BYTES - 1) / CHUNK_BYTES); }

static void hash_chunks(const void *arg, int64_t b, int64_t e) {
    const hash_job *j = arg;
    int s = 0;
    for (int64_t k = b; k < e; k++) {
        while (k >= j->first[s + 1]) s++;
        const size_t at = (size_t)(k - j->first[s]) * CHUNK_BYTES;
        const size_t len = j->c->bytes[s] - at < CHUNK_BYTES ? j->c->bytes[s] - at : CHUNK_BYTES;
        j->chunk[k] = XXH3_64bits(j->c->map + j->c->offset[s] + at, len);
    }
}

/* hashes[i] = the hash of section i (see the top of the file). */
static void hash_sections(const cv_pack_cache *c, cv_threadpool *pool, uint64_t *hashes) {
    int64_t *first = cv_xmalloc(sizeof *first * (size_t)(c->n + 1));
    first[0] = 0;
    for (int i = 0; i < c->n; i++) first[i + 1] = first[i] + chunks_of(c->bytes[i]);
    hash_job job = {c, first, cv_xmalloc(sizeof(uint64_t) * (size_t)(first[c->n] ? first[c->n] : 1))};
    cv_threadpool_run_range(pool, hash_chunks, &job, first[c->n], true);
    for (int i = 0; i < c->n; i++)
        hashes[i] = XXH3_64bits(job.chunk + first[i], sizeof(uint64_t) * (size_t)(first[i + 1] - first[i]));
    free(job.chunk);
    free(first);
}

/* ---- opening ------------------------------------------------------------------------------------ */

static char *cache_dir(void) {
    const char *off = getenv("CVLLM_PACKED_WEIGHTS_CACHE");
    if (off && (!strcmp(off, "0") || !strcasecmp(off, "false") || !strcasecmp(off, "off"))) return NULL;
    char *dir = cv_cache_dir("packed");
    if (!dir) cv_warn("loader", "packed-weight cache off: neither CVLLM_CACHE_ROOT, XDG_CACHE_HOME nor HOME is set");
    return dir;
}

/* Offsets of the sections after a header of `header_bytes`; returns the file size. */
static size_t place_sections(cv_pack_cache *c, size_t header_bytes) {
    size_t at = header_bytes;
    for (int i = 0; i < c->n; i++) {
        c->offset[i] = at;
        at = round_up(at + c->bytes[i], PAGE);
    }
    return at;
}

static bool header_matches(const cv_pack_cache *c, const header *h) {
    if (h->layout != c->layout || h->key.low64 != c->key.low64 || h->key.high64 != c->key.high64 ||
        h->n_sections != (uint64_t)c->n || h->file_bytes != c->map_bytes)
        return false;
    for (int i = 0; i < c->n; i++)
        if (h->sections[SECTION_WORDS * i] != c->offset[i] || h->sections[SECTION_WORDS * i + 1] != c->bytes[i])
            return false;
    return true;
}

/* Maps an existing entry and checks every byte; false (nothing mapped) when it is absent or bad. */
static bool open_hit(cv_pack_cache *c, cv_threadpool *pool) {
    int fd = open(c->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st;
    void *map = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size == c->map_bytes)
        map = mmap(NULL, c->map_bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    bool ok = false;
    header h = {0};
    if (map != MAP_FAILED) {
        c->map = map;
        ok = parse_header(c->map, c->header_bytes, &h) && h.header_bytes == c->header_bytes && header_matches(c, &h);
        if (ok) {
            uint64_t *hashes = cv_xmalloc(sizeof *hashes * (size_t)(c->n ? c->n : 1));
            hash_sections(c, pool, hashes);
            for (int i = 0; ok && i < c->n; i++) ok = hashes[i] == h.sections[SECTION_WORDS * i + 2];
            free(hashes);
        }
        free_header(&h);
        if (!ok) {
            munmap(c->map, c->map_bytes);
            c->map = NULL;
        }
    }
    if (!ok) {
        cv_warn("loader", "packed-weight cache entry %s is damaged or does not match; rebuilding it", c->path);
        unlink(c->path);
    }
    return ok;
}

/* True when the entry at `path` was made from files that are gone or changed (or is unreadable). */
static bool entry_is_stale(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    uint64_t fixed[FIXED_WORDS];
    bool stale = true;
    if (pread(fd, fixed, sizeof fixed, 0) == (ssize_t)sizeof fixed && fixed[7] <= MAX_HEADER_BYTES) {
        uint8_t *buf = cv_xmalloc(fixed[7] ? fixed[7] : 1);
        header h;
        if (pread(fd, buf, fixed[7], 0) == (ssize_t)fixed[7] && parse_header(buf, fixed[7], &h)) {
            stale = false;
            for (size_t i = 0; !stale && i < h.n_files; i++) {
                file_id now;
                stale = stat_id(h.files[i].path, &now) != 0 || now.size != h.files[i].size ||
                        now.mtime_ns != h.files[i].mtime_ns || now.ino != h.files[i].ino || now.dev != h.files[i].dev;
            }
            free_header(&h);
        }
        free(buf);
    }
    close(fd);
    return stale;
}

/* `NAME.tmp.PID` of a process that no longer exists. */
static bool is_orphan_tmp(const char *name) {
    const char *t = strstr(name, ".tmp.");
    if (!t) return false;
    char *end;
    long pid = strtol(t + 5, &end, 10);
    return *end == '\0' && pid > 0 && pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Deletes entries of vanished or changed checkpoints and temporaries of dead processes. */
static void sweep(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        bool entry = len > 5 && !strcmp(e->d_name + len - 5, ".pack");
        if (!entry && !is_orphan_tmp(e->d_name)) continue;
        char *path = cv_xasprintf("%s/%s", dir, e->d_name);
        if (!entry || entry_is_stale(path)) {
            cv_info("loader", "packed-weight cache: removing %s (%s)", path,
                    entry ? "its checkpoint changed or is gone" : "left by a process that died");
            unlink(path);
        }
        free(path);
    }
    closedir(d);
}

/* Creates the temporary file of a miss with its blocks reserved and maps it writable. */
static bool open_miss(cv_pack_cache *c, const char *dir) {
    if (cv_mkdirs(dir) != 0) {
        cv_warn("loader", "packed-weight cache off: cannot create %s: %s", dir, strerror(errno));
        return false;
    }
    sweep(dir);
    c->tmp = cv_xasprintf("%s.tmp.%ld", c->path, (long)getpid());
    int fd = open(c->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        cv_warn("loader", "packed-weight cache off: cannot create %s: %s", c->tmp, strerror(errno));
        free(c->tmp);
        c->tmp = NULL;
        return false;
    }
    int err = posix_fallocate(fd, 0, (off_t)c->map_bytes);
    void *map = err ? MAP_FAILED : mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!err && map == MAP_FAILED) err = errno;
    close(fd);
    if (err) {
        cv_warn("loader", "packed-weight cache off: cannot reserve %.2f GiB in %s: %s", c->map_bytes / 1073741824.0,
                dir, strerror(err));
        unlink(c->tmp);
        free(c->tmp);
        c->tmp = NULL;
        return false;
    }
    c->map = map;
    return true;
}

static void free_cache(cv_pack_cache *c) {
    free(c->path);
    free(c->tmp);
    free(c->offset);
    free(c->bytes);
    free_ids(c->files, c->n_files);
    free(c);
}

cv_pack_cache *cv_pack_cache_open(const char *const *files, size_t n_files, uint64_t layout, const size_t *sizes,
                                  int n_sections, cv_threadpool *pool) {
    assert(n_sections >= 0);
    char *dir = cache_dir();
    if (!dir) return NULL;
    file_id *ids = identify(files, n_files);
    if (!ids) {
        free(dir);
        return NULL;
    }
    cv_pack_cache *c = cv_xcalloc(1, sizeof *c);
    c->files = ids;
    c->n_files = n_files;
    c->layout = layout;
    c->key = entry_key(ids, n_files, layout);
    c->n = n_sections;
    c->offset = cv_xmalloc(sizeof *c->offset * (size_t)(n_sections ? n_sections : 1));
    c->bytes = cv_xmalloc(sizeof *c->bytes * (size_t)(n_sections ? n_sections : 1));
    if (n_sections) memcpy(c->bytes, sizes, sizeof *sizes * (size_t)n_sections);
    c->path = cv_xasprintf("%s/%016llx%016llx.pack", dir, (unsigned long long)c->key.high64,
                           (unsigned long long)c->key.low64);
    c->header_bytes = round_up(header_size(n_sections, ids, n_files), PAGE);
    c->map_bytes = place_sections(c, c->header_bytes);

    const double t0 = cv_now();
    if (cv_path_exists(c->path) && open_hit(c, pool)) {
        c->hit = true;
        cv_info("loader", "packed weights mapped from the cache %s (%.2f GiB, verified in %.2f s)", c->path,
                c->map_bytes / 1073741824.0, cv_now() - t0);
    } else if (!open_miss(c, dir)) {
        free_cache(c);
        c = NULL;
    }
    free(dir);
    if (c) madvise(c->map, c->map_bytes, MADV_HUGEPAGE); /* large folios where the file system has them */
    return c;
}

bool cv_pack_cache_hit(const cv_pack_cache *c) { return c->hit; }

void *cv_pack_cache_section(const cv_pack_cache *c, int i) {
    assert(i >= 0 && i < c->n);
    return c->map + c->offset[i];
}

const char *cv_pack_cache_path(const cv_pack_cache *c) { return c->path; }

void cv_pack_cache_commit(cv_pack_cache *c, cv_threadpool *pool) {
    assert(!c->hit && c->tmp);
    uint64_t *hashes = cv_xmalloc(sizeof *hashes * (size_t)(c->n ? c->n : 1));
    hash_sections(c, pool, hashes);
    write_header(c, hashes);
    free(hashes);
    if (rename(c->tmp, c->path) != 0) {
        cv_warn("loader", "packed-weight cache: cannot publish %s: %s", c->path, strerror(errno));
        unlink(c->tmp);
    } else {
        cv_info("loader", "packed weights saved to the cache %s (%.2f GiB; later loads map it)", c->path,
                c->map_bytes / 1073741824.0);
    }
    free(c->tmp);
    c->tmp = NULL;
}

void cv_pack_cache_close(cv_pack_cache *c) {
    if (!c) return;
    if (c->map) munmap(c->map, c->map_bytes);
    if (c->tmp) unlink(c->tmp); /* a miss the load gave up on */
    free_cache(c);
}
