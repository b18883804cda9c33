/*
 * prompts_file.c — see prompts_file.h.
 */
#include "cli/prompts_file.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

static void push(char ***prompts, size_t *n, char *p) {
    *prompts = cv_xrealloc(*prompts, (*n + 1) * sizeof **prompts);
    (*prompts)[(*n)++] = p;
}

int cv_read_prompts_file(const char *path, char ***prompts, size_t *n) {
    *prompts = NULL;
    *n = 0;
    FILE *f = fopen(path, "r");
    if (!f) return cv_fail(CVLLM_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    for (int lineno = 1; !rc && (len = getline(&line, &cap, f)) >= 0; lineno++) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (len == 0) continue;
        if (line[0] != '"') {
            push(prompts, n, cv_xstrndup(line, (size_t)len));
            continue;
        }
        json_error_t err;
        json_t *j = json_loadb(line, (size_t)len, JSON_DECODE_ANY, &err);
        if (json_is_string(j)) push(prompts, n, cv_xstrdup(json_string_value(j)));
        else rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "%s:%d: not a JSON string", path, lineno);
        json_decref(j);
    }
    if (!rc && ferror(f)) rc = cv_fail(CVLLM_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    free(line);
    fclose(f);
    if (rc) {
        cv_free_prompts(*prompts, *n);
        *prompts = NULL;
        *n = 0;
    }
    return rc;
}

void cv_free_prompts(char **prompts, size_t n) {
    for (size_t i = 0; i < n; i++) free(prompts[i]);
    free(prompts);
}
