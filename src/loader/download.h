/*
 * download.h — the HTTP transfers behind hub.c (internal to src/loader): small GETs into memory and
 * resumable file downloads, both over libcurl. What a status code means for a repository is hub.c's
 * business; these functions report transport failures only.
 */
#ifndef CV_LOADER_DOWNLOAD_H
#define CV_LOADER_DOWNLOAD_H

#include <stdbool.h>
#include <stddef.h>

typedef struct cv_http_options {
    const char *token;      /* "Authorization: Bearer <token>" when non-NULL */
    bool progress;          /* progress bar on stderr (callers check isatty) */
    long timeout_s;         /* connect timeout and the longest stall tolerated mid-transfer */
} cv_http_options;

/*
 * GETs url into a cv_xmalloc'd, NUL-terminated buffer (at most max_bytes). *status is the HTTP
 * status. Returns 0, or CVLLM_ERR_NETWORK when no response came (message: curl's reason, with
 * *no_network set when the host could not be resolved or reached at all).
 */
int cv_http_get(const char *url, const cv_http_options *opts, size_t max_bytes, long *status,
                char **body, size_t *len, bool *no_network);

/*
 * Downloads url into path. Bytes go to path.incomplete first; when that file already exists the
 * transfer resumes from its end with a Range request (and starts over if the server ignores it).
 * A transfer cut short is retried a few times, each retry resuming. On a 2xx response that completes
 * the file, path.incomplete is renamed to path. Any other status leaves path untouched and is
 * returned in *status with 0; transport failures are as for cv_http_get.
 */
int cv_http_download(const char *url, const char *path, const char *label, const cv_http_options *opts,
                     long *status, bool *no_network);

#endif
