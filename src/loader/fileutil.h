/*
 * fileutil.h — the few file-system helpers the loader's files share (internal to src/loader and the
 * tokenizer above it).
 */
#ifndef CV_LOADER_FILEUTIL_H
#define CV_LOADER_FILEUTIL_H

#include <stdbool.h>
#include <stddef.h>

/* The whole file in a cv_xmalloc'd buffer (NUL-terminated, *len excludes the NUL); NULL with errno
 * set when it cannot be opened or read. */
char *cv_read_file(const char *path, size_t *len);
/* The whole file mapped read-only, *len bytes (a static "" for an empty file); NULL with errno set
 * when it cannot be opened or mapped. cv_unmap_file releases it. */
const char *cv_map_file(const char *path, size_t *len);
void cv_unmap_file(const char *p, size_t len);
bool cv_path_exists(const char *path);
bool cv_is_dir(const char *path);
/* The names of the entries of dir that begin with prefix and end with suffix, sorted, in a
 * cv_xmalloc'd NULL-ended array (cv_free_names); *n of them. An unreadable dir has none. */
char **cv_list_names(const char *dir, const char *prefix, const char *suffix, size_t *n);
void cv_free_names(char **names);
/* cvllm's cache folder `name` ($CVLLM_CACHE_ROOT/name, else $XDG_CACHE_HOME/cvllm/name, else
 * ~/.cache/cvllm/name), cv_xmalloc'd; NULL when none of the three variables is set. */
char *cv_cache_dir(const char *name);
/* mkdir -p; 0 or -1 with errno set. */
int cv_mkdirs(const char *path);
/* j written to path with jansson's dump flags; CVLLM_ERR_IO "cannot write PATH: reason". */
typedef struct json_t json_t;
int cv_write_json_file(const json_t *j, const char *path, size_t flags);

#endif
