/*
 * test_pack_cache.c — the packed-weight cache (loader/pack_cache.h): a miss is filled and published,
 * a hit maps the same bytes; a damaged, truncated or foreign entry is rebuilt, never trusted; a
 * changed checkpoint gets a new entry and its old one is swept, as are temporaries of dead
 * processes; turned off or unwritable, it steps aside. Then through a real model: the Qwen3 bf16
 * reference checkpoints (tied and untied) pass the Hugging Face logit checks cold (packing into
 * the cache), warm (mapped from it, not rewritten) and after the entry is damaged (rebuilt).
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loader/fileutil.h"
#include "loader/pack_cache.h"
#include "model_fixture.h"

static const size_t SIZES[] = {5000, 0, (9u << 20) + 17}; /* odd, empty, several 4 MiB hash chunks */
enum { N_SECTIONS = 3 };

static char *root, *files[2];

static void fill(cv_pack_cache *c, unsigned seed) {
    for (int i = 0; i < N_SECTIONS; i++) {
        uint8_t *p = cv_pack_cache_section(c, i);
        for (size_t k = 0; k < SIZES[i]; k++) p[k] = (uint8_t)(k * 131u + (unsigned)i * 7u + seed);
    }
}

static bool holds(const cv_pack_cache *c, unsigned seed) {
    for (int i = 0; i < N_SECTIONS; i++) {
        const uint8_t *p = cv_pack_cache_section(c, i);
        if ((uintptr_t)p % 4096) return false;
        for (size_t k = 0; k < SIZES[i]; k++)
            if (p[k] != (uint8_t)(k * 131u + (unsigned)i * 7u + seed)) return false;
    }
    return true;
}

static cv_pack_cache *open_entry(uint64_t layout, cv_threadpool *pool) {
    return cv_pack_cache_open((const char *const *)files, 2, layout, SIZES, N_SECTIONS, pool);
}

/* Opens, fills and commits a miss; returns the entry's path (caller frees). */
static char *make_entry(uint64_t layout, unsigned seed, cv_threadpool *pool) {
    cv_pack_cache *c = open_entry(layout, pool);
    CHECK(c != NULL);
    if (!c) exit(1);
    CHECK(!cv_pack_cache_hit(c));
    fill(c, seed);
    cv_pack_cache_commit(c, pool);
    char *path = cv_xstrdup(cv_pack_cache_path(c));
    cv_pack_cache_close(c);
    CHECK(cv_path_exists(path));
    return path;
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += e->d_name[0] != '.';
    if (d) closedir(d);
    return n;
}

/* Inverts the byte at `at` of the file. */
static void flip_byte(const char *path, off_t at) {
    int fd = open(path, O_RDWR);
    uint8_t b = 0;
    CHECK(fd >= 0 && pread(fd, &b, 1, at) == 1);
    b ^= 0xff;
    CHECK(pwrite(fd, &b, 1, at) == 1);
    close(fd);
}

static void test_hit_and_miss(cv_threadpool *pool) {
    char *path = make_entry(11, 1, pool);
    cv_pack_cache *c = open_entry(11, pool);
    CHECK(c && cv_pack_cache_hit(c) && holds(c, 1));
    CHECK_STR_EQ(cv_pack_cache_path(c), path);
    cv_pack_cache_close(c);

    /* another layout of the same files is another entry */
    c = open_entry(12, pool);
    CHECK(c && !cv_pack_cache_hit(c));
    CHECK(strcmp(cv_pack_cache_path(c), path) != 0);
    cv_pack_cache_close(c); /* never committed: nothing is left behind */
    char *dir = tu_strdupf("%s/%s", root, "packed");
    CHECK_EQ_INT(count_files(dir), 1);

    /* one flipped byte in the last section's last chunk (the header takes one page, the first
     * section two, the empty one none): rebuilt, not trusted */
    flip_byte(path, 4096 * 3 + (off_t)SIZES[2] - 1);
    c = open_entry(11, pool);
    CHECK(c && !cv_pack_cache_hit(c));
    fill(c, 2);
    cv_pack_cache_commit(c, pool);
    cv_pack_cache_close(c);
    c = open_entry(11, pool);
    CHECK(c && cv_pack_cache_hit(c) && holds(c, 2));
    cv_pack_cache_close(c);

    /* a damaged header and a truncated file are misses too */
    flip_byte(path, 20); /* in the layout word */
    c = open_entry(11, pool);
    CHECK(c && !cv_pack_cache_hit(c));
    fill(c, 3);
    cv_pack_cache_commit(c, pool);
    cv_pack_cache_close(c);
    CHECK(truncate(path, 8192) == 0);
    c = open_entry(11, pool);
    CHECK(c && !cv_pack_cache_hit(c));
    cv_pack_cache_close(c);
    free(dir);
    free(path);
}

static void test_sweep(cv_threadpool *pool) {
    char *dir = tu_strdupf("%s/%s", root, "packed");
    char *old = make_entry(21, 1, pool);
    /* a temporary of a process that is gone */
    pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0);
    char name[64];
    snprintf(name, sizeof name, "x.pack.tmp.%d", (int)child);
    tu_write_file(dir, name, "partial", 7);
    tu_write_file(dir, "garbage.pack", "not a cache entry", 17);
    /* the checkpoint changes: a new key, and the next miss sweeps the old entry */
    tu_write_file(root, "model-00002.safetensors", "changed weights", 15);
    char *fresh = make_entry(21, 4, pool);
    CHECK(strcmp(old, fresh) != 0);
    CHECK(!cv_path_exists(old));
    char *tmp = tu_strdupf("%s/%s", dir, name);
    CHECK(!cv_path_exists(tmp));
    char *garbage = tu_strdupf("%s/%s", dir, "garbage.pack");
    CHECK(!cv_path_exists(garbage));
    CHECK(cv_path_exists(fresh));
    free(garbage);
    free(tmp);
    free(old);
    free(fresh);
    free(dir);
}

static void test_off_and_unavailable(cv_threadpool *pool) {
    setenv("CVLLM_PACKED_WEIGHTS_CACHE", "0", 1);
    CHECK(open_entry(31, pool) == NULL);
    unsetenv("CVLLM_PACKED_WEIGHTS_CACHE");
    /* a cache root below a regular file cannot be created */
    char *bad = tu_strdupf("%s/%s", files[0], "cache");
    setenv("CVLLM_CACHE_ROOT", bad, 1);
    CHECK(open_entry(31, pool) == NULL);
    setenv("CVLLM_CACHE_ROOT", root, 1);
    free(bad);
    /* source files that cannot be stat'ed */
    const char *missing[] = {"/nonexistent/model.safetensors"};
    CHECK(cv_pack_cache_open(missing, 1, 31, SIZES, N_SECTIONS, pool) == NULL);
}

/* ---- through the model ------------------------------------------------------------------------ */

static char *only_entry(const char *dir) {
    DIR *d = opendir(dir);
    char *path = NULL;
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strstr(e->d_name, ".pack")) {
            free(path);
            path = tu_strdupf("%s/%s", dir, e->d_name);
            n++;
        }
    if (d) closedir(d);
    CHECK_EQ_INT(n, 1);
    return path;
}

/* Inode and modification time: what changes when the entry is written again. */
static uint64_t version_of(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_ino * 1000003u ^ (uint64_t)st.st_mtim.tv_nsec ^
                                      (uint64_t)st.st_mtim.tv_sec << 30
                                : 0;
}

static int byte_at(const char *path, off_t at) {
    int fd = open(path, O_RDONLY);
    uint8_t b = 0;
    const bool ok = fd >= 0 && pread(fd, &b, 1, at) == 1;
    close(fd);
    return ok ? b : -1;
}

static void test_model(const char *folder, cv_threadpool *pool) {
    char *model_root = tu_make_temp_dir();
    setenv("CVLLM_CACHE_ROOT", model_root, 1);
    char *dir = tu_strdupf("%s/%s", model_root, "packed");
    static const int32_t chunks[] = {7};
    mf_test_folder(folder, pool, chunks, 1); /* cold: packs into the cache */
    char *entry = only_entry(dir);
    const uint64_t cold = version_of(entry);
    CHECK(cold != 0);
    mf_test_folder(folder, pool, chunks, 1); /* warm: mapped, not rewritten */
    CHECK(version_of(entry) == cold);
    const int first = byte_at(entry, 4096); /* the first packed byte, after the one-page header */
    flip_byte(entry, 4096);
    mf_test_folder(folder, pool, chunks, 1); /* damaged: rebuilt */
    CHECK(first >= 0 && byte_at(entry, 4096) == first);
    free(entry);
    free(dir);
    tu_remove_tree(model_root);
    free(model_root);
    setenv("CVLLM_CACHE_ROOT", root, 1);
}

int main(void) {
    cv_threadpool *pool = cv_threadpool_create(2);
    root = tu_make_temp_dir();
    setenv("CVLLM_CACHE_ROOT", root, 1);
    unsetenv("CVLLM_PACKED_WEIGHTS_CACHE");
    tu_write_file(root, "model-00001.safetensors", "weights one", 11);
    tu_write_file(root, "model-00002.safetensors", "weights two", 11);
    files[0] = tu_strdupf("%s/%s", root, "model-00001.safetensors");
    files[1] = tu_strdupf("%s/%s", root, "model-00002.safetensors");

    test_hit_and_miss(pool);
    test_sweep(pool);
    test_off_and_unavailable(pool);
    test_model("qwen3-dense-bf16", pool);
    test_model("qwen3-dense-tied-bf16", pool);
    CHECK(mf_worst_overall <= MF_TOLERANCE);

    tu_remove_tree(root);
    free(root);
    free(files[0]);
    free(files[1]);
    cv_threadpool_free(pool);
    return cv_check_summary("test_pack_cache");
}
