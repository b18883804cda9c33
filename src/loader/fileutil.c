/*
 * fileutil.c — see fileutil.h. Config files and index files are small (kilobytes to a few
 * megabytes), so they are read whole with stdio; tensor data never goes through here (it is mmap'd),
 * nor does tokenizer.json (mapped: a copy of its megabytes was fresh memory, slow to touch on a VM).
 */
#include "loader/fileutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "base/error.h"

char *cv_read_file(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    size_t cap = 1 << 14, n = 0, got;
    char *buf = cv_xmalloc(cap);
    while ((got = fread(buf + n, 1, cap - n - 1, fp)) > 0) {
        n += got;
        if (n == cap - 1) buf = cv_xrealloc(buf, cap *= 2);
    }
    int err = ferror(fp) ? EIO : 0;
    fclose(fp);
    if (err) {
        free(buf);
        errno = err;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

const char *cv_map_file(const char *path, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st;
    void *map = MAP_FAILED;
    int err = fstat(fd, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : 0;
    if (!err && st.st_size > 0) {
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) err = errno;
    }
    close(fd);
    if (err) {
        errno = err;
        return NULL;
    }
    *len = (size_t)st.st_size;
    return st.st_size > 0 ? map : "";
}

void cv_unmap_file(const char *p, size_t len) {
    if (p && len) munmap((void *)p, len);
}

bool cv_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

bool cv_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static int by_string(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

char **cv_list_names(const char *dir, const char *prefix, const char *suffix, size_t *n) {
    char **names = cv_xmalloc(sizeof *names);
    *n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) || !has_suffix(e->d_name, suffix)) continue;
        names = cv_xrealloc(names, (*n + 2) * sizeof *names);
        names[(*n)++] = cv_xstrdup(e->d_name);
    }
    if (d) closedir(d);
    names[*n] = NULL;
    qsort(names, *n, sizeof *names, by_string);
    return names;
}

void cv_free_names(char **names) {
    for (char **p = names; *p; p++) free(*p);
    free(names);
}

char *cv_cache_dir(const char *name) {
    const char *root = getenv("CVLLM_CACHE_ROOT"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (root && *root) return cv_xasprintf("%s/%s", root, name);
    if (xdg && *xdg) return cv_xasprintf("%s/cvllm/%s", xdg, name);
    if (home && *home) return cv_xasprintf("%s/.cache/cvllm/%s", home, name);
    return NULL;
}

int cv_mkdirs(const char *path) {
    char *p = cv_xstrdup(path);
    int rc = 0;
    for (char *s = p + 1; rc == 0; s++) {
        bool end = *s == '\0';
        if (*s != '/' && !end) continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) rc = -1;
        else if (!cv_is_dir(p)) rc = (errno = ENOTDIR, -1);
        if (end) break;
        *s = '/';
    }
    free(p);
    return rc;
}

int cv_write_json_file(const json_t *j, const char *path, size_t flags) {
    if (json_dump_file(j, path, flags) == 0) return 0;
    return cv_fail(CVLLM_ERR_IO, "cannot write %s: %s", path, strerror(errno));
}
