/*
 * env.h — vLLM's boolean environment switches (vllm/envs.py), read as vLLM reads them.
 */
#ifndef CV_BASE_ENV_H
#define CV_BASE_ENV_H

#include <stdbool.h>

/* Whether `name` is "1" or "true" (any case), around blanks: os.environ.get(name, "0").strip().lower()
 * in ("1", "true"). */
bool cv_vllm_env_true(const char *name);

#endif
