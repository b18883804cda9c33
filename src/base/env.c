/*
 * env.c — see env.h.
 */
#include "base/env.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

bool cv_vllm_env_true(const char *name) {
    const char *v = getenv(name);
    if (!v) return false;
    while (isspace((unsigned char)*v)) v++;
    size_t n = strlen(v);
    while (n && isspace((unsigned char)v[n - 1])) n--;
    return (n == 1 && *v == '1') || (n == 4 && !strncasecmp(v, "true", 4));
}
