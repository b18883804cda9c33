/*
 * fileutil.h — the few file-system helpers the loader's files share (internal to src/loader).
 */
#ifndef CV_LOADER_FILEUTIL_H
#define CV_LOADER_FILEUTIL_H

#include <stdbool.h>
#include <stddef.h>

/* The whole file in a cv_xmalloc'd buffer (NUL-terminated, *len excludes the NUL); NULL with errno
 * set when it cannot be opened or read. */
char *cv_read_file(const char *path, size_t *len);
bool cv_path_exists(const char *path);
bool cv_is_dir(const char *path);
/* mkdir -p; 0 or -1 with errno set. */
int cv_mkdirs(const char *path);

#endif
