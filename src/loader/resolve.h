/*
 * resolve.h — from a MODEL (or --tokenizer) argument to a local folder, with the model files cvllm
 * ships.
 *
 * Folders, the Hugging Face cache and downloads are hub.c's job. On top of that cvllm ships the
 * config.json, generation_config.json and tokenizer files of the Qwen3-family ids it targets
 * (models/ORG/NAME in the source tree, share/cvllm/models/ORG/NAME once installed), so that
 * everything that needs no weights — `--load-format dummy`, `cvllm tokenize`, the benchmark
 * clients' tokenizer — works for those ids with no download and no network. Weights always come
 * from a folder or the cache.
 *
 * When a hub id cannot be fetched (no network, HF_HUB_OFFLINE=1), the status says whether a dummy
 * run of it could still work: CVLLM_ERR_NETWORK when cvllm ships its config or the cache holds one
 * (so a caller may suggest --load-format dummy), CVLLM_ERR_NOT_FOUND otherwise, with a message that
 * lists the ids cvllm ships.
 */
#ifndef CV_LOADER_RESOLVE_H
#define CV_LOADER_RESOLVE_H

#include <stdbool.h>

#include "loader/hub.h"

/* need_weights = false: the folder only needs config.json and the tokenizer; what is on disk (a
 * folder, the cache, then the shipped configs) wins over a download. `access` gives the revision, the
 * cache folder and the token (hub.h; NULL: main, and the environment's). On success *dir is a
 * cv_xmalloc'd path. */
int cv_resolve_model(const char *model, const cv_hub_options *access, bool need_weights, char **dir);

/* The folder of the files shipped for hub id `model`, or NULL (cv_xmalloc'd). */
char *cv_shipped_model_dir(const char *model);

/* The shipped hub ids, sorted, as "A, B, C" (cv_xmalloc'd; "" when none is installed). */
char *cv_shipped_model_ids(void);

/* The folder that holds models/ (the shipped files), or NULL when none was found. In order: the
 * CVLLM_DATA_DIR environment variable; share/cvllm beside the installed program or libcvllm.so that
 * is running; the install prefix cvllm was configured with; the source tree it was built from. */
const char *cv_data_dir(void);

#endif
