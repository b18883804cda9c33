/*
 * resolve.c — from the MODEL argument to a folder of files.
 *
 * Folders and the Hugging Face cache (and downloads) are the loader's job (loader/hub.c). The engine
 * adds one rule of its own: `--load-format dummy` needs only config.json and the tokenizer, and cvllm
 * ships those for the Qwen3 sizes (models/ORG/NAME in the source tree), so a benchmark of the real
 * shapes runs on a machine that has never seen the weights and has no network.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/log.h"
#include "engine/engine.h"
#include "loader/hub.h"

#ifndef CVLLM_DATA_DIR
#error "CVLLM_DATA_DIR must name the folder that holds the shipped model configs"
#endif

static char *shipped_config_dir(const char *model) {
    char *dir = cv_xasprintf("%s/models/%s", CVLLM_DATA_DIR, model);
    char *cfg = cv_xasprintf("%s/config.json", dir);
    struct stat st;
    bool ok = stat(cfg, &st) == 0 && S_ISREG(st.st_mode);
    free(cfg);
    if (ok) return dir;
    free(dir);
    return NULL;
}

int cv_engine_resolve_model(const char *model, const char *revision, bool need_weights, char **dir) {
    const char *offline = getenv("HF_HUB_OFFLINE");
    bool offline_set = offline && (!strcmp(offline, "1") || !strcasecmp(offline, "true"));
    cv_hub_options opts = {
        .revision = revision,
        .allow_download = !offline_set,
        .weights = need_weights,
        .progress = true,
    };
    if (!need_weights) {
        /* Prefer what is on disk; never download just for a dummy run. */
        opts.allow_download = false;
        if (cv_hub_resolve(model, &opts, dir) == 0) return 0;
        char *shipped = shipped_config_dir(model);
        if (shipped) {
            cv_info("engine", "Using the config shipped with cvllm for %s (%s)", model, shipped);
            *dir = shipped;
            return 0;
        }
        opts.allow_download = !offline_set;
    }
    return cv_hub_resolve(model, &opts, dir);
}
