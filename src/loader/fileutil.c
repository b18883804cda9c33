/*
 * fileutil.c — see fileutil.h. Config files and index files are small (kilobytes to a few
 * megabytes), so they are read whole with stdio; tensor data never goes through here (it is mmap'd).
 */
#include "loader/fileutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

bool cv_path_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

bool cv_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
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
