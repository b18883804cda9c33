/*
 * prompts_file.h — the prompts files the commands read (`cvllm quantize --calibration FILE`; the
 * format of `cvllm generate --prompts-file`): one prompt per line, empty lines skipped, a line that
 * starts with '"' read as a JSON string so a prompt can hold newlines. Trailing "\n" / "\r\n" are
 * not part of a prompt.
 */
#ifndef CV_CLI_PROMPTS_FILE_H
#define CV_CLI_PROMPTS_FILE_H

#include <stddef.h>

/* *prompts: cv_xmalloc'd array of *n cv_xmalloc'd strings (free with cv_free_prompts). Errors:
 * CVLLM_ERR_IO "cannot read PATH: reason", CVLLM_ERR_INVALID_ARGUMENT "PATH:LINE: not a JSON
 * string". A file without prompts is not an error (*n = 0). */
int cv_read_prompts_file(const char *path, char ***prompts, size_t *n);
void cv_free_prompts(char **prompts, size_t n);

#endif
