/*
 * resolve.c — see resolve.h.
 *
 * Where the shipped files are: a build-tree binary reads them from the source tree; an installed
 * one from PREFIX/share/cvllm, found beside the running program (bin/cvllm) or library
 * (lib/libcvllm.so) itself, so that `cmake --install --prefix ANYWHERE` works without a rebuild.
 * The relative paths from bindir and libdir to the data folder, the configured install folder and
 * the source tree come from CMake (CVLLM_*_DATA below).
 */
#define _GNU_SOURCE /* dladdr1, RTLD_DL_LINKMAP, strverscmp */
#include "loader/resolve.h"

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "loader/fileutil.h"
#include "loader/hub.h"

#if !defined(CVLLM_SOURCE_DATA_DIR) || !defined(CVLLM_INSTALL_DATA_DIR) || !defined(CVLLM_BIN_TO_DATA) || \
    !defined(CVLLM_LIB_TO_DATA)
#error "CMake defines where the shipped model files are (CVLLM_SOURCE_DATA_DIR, CVLLM_INSTALL_DATA_DIR, ...)"
#endif

/* ------------------------------------------------------------------------------------------------ */
/* The data folder                                                                                   */

static char *data_dir_path;
static pthread_once_t data_dir_once = PTHREAD_ONCE_INIT;

static bool has_models(const char *dir) {
    char *models = cv_xasprintf("%s/models", dir);
    bool ok = cv_is_dir(models);
    free(models);
    return ok;
}

/* The file this code was loaded from: the executable, or libcvllm.so when linked dynamically. */
static char *running_module(void) {
    Dl_info info;
    struct link_map *map = NULL;
    if (!dladdr1((void *)running_module, &info, (void **)&map, RTLD_DL_LINKMAP) || !map) return NULL;
    /* The main program's link-map name is empty (and dli_fname is only its argv[0]). */
    if (!map->l_name[0]) {
        char exe[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (n <= 0) return NULL;
        exe[n] = '\0';
        return cv_xstrdup(exe);
    }
    return realpath(map->l_name, NULL);
}

/* DIR_OF_MODULE/relative without its "..", when it holds models/. */
static char *beside_module(const char *module, const char *relative) {
    char *dir = cv_xstrdup(module);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    char *candidate = cv_xasprintf("%s/%s", dir, relative);
    char *real = realpath(candidate, NULL);
    free(dir);
    free(candidate);
    if (real && has_models(real)) return real;
    free(real);
    return NULL;
}

static void find_data_dir(void) {
    const char *env = getenv("CVLLM_DATA_DIR");
    if (env && *env) {
        data_dir_path = cv_xstrdup(env);
        return;
    }
    char *module = running_module();
    if (module) {
        data_dir_path = beside_module(module, CVLLM_BIN_TO_DATA);
        if (!data_dir_path) data_dir_path = beside_module(module, CVLLM_LIB_TO_DATA);
        free(module);
        if (data_dir_path) return;
    }
    if (has_models(CVLLM_INSTALL_DATA_DIR)) data_dir_path = cv_xstrdup(CVLLM_INSTALL_DATA_DIR);
    else if (has_models(CVLLM_SOURCE_DATA_DIR)) data_dir_path = cv_xstrdup(CVLLM_SOURCE_DATA_DIR);
}

const char *cv_data_dir(void) {
    pthread_once(&data_dir_once, find_data_dir);
    return data_dir_path;
}

/* ------------------------------------------------------------------------------------------------ */
/* Shipped models                                                                                    */

/* ORG/NAME, each a plain path component: nothing else may be looked up under models/. */
static bool plain_hub_id(const char *id) {
    const char *slash = strchr(id, '/');
    return slash && slash != id && id[0] != '.' && slash[1] && slash[1] != '.' && !strchr(slash + 1, '/');
}

char *cv_shipped_model_dir(const char *model) {
    const char *data = cv_data_dir();
    if (!data || !plain_hub_id(model)) return NULL;
    char *dir = cv_xasprintf("%s/models/%s", data, model);
    char *cfg = cv_xasprintf("%s/config.json", dir);
    bool ok = cv_path_exists(cfg);
    free(cfg);
    if (ok) return dir;
    free(dir);
    return NULL;
}

/* Qwen3-0.6B, 1.7B, 4B, ... 32B: numbers in names compare as numbers. */
static int compare_ids(const void *a, const void *b) { return strverscmp(*(char *const *)a, *(char *const *)b); }

/* Appends "ORG/NAME" for every models/ORG/NAME/config.json. */
static void collect_ids(const char *models, const char *org, char ***ids, size_t *n, size_t *cap) {
    char *path = cv_xasprintf("%s/%s", models, org);
    DIR *d = opendir(path);
    struct dirent *ent;
    while (d && (ent = readdir(d))) {
        if (ent->d_name[0] == '.') continue;
        char *cfg = cv_xasprintf("%s/%s/config.json", path, ent->d_name);
        if (cv_path_exists(cfg)) {
            if (*n == *cap) *ids = cv_xrealloc(*ids, (*cap = *cap ? *cap * 2 : 16) * sizeof **ids);
            (*ids)[(*n)++] = cv_xasprintf("%s/%s", org, ent->d_name);
        }
        free(cfg);
    }
    if (d) closedir(d);
    free(path);
}

char *cv_shipped_model_ids(void) {
    const char *data = cv_data_dir();
    if (!data) return cv_xstrdup("");
    char *models = cv_xasprintf("%s/models", data);
    char **ids = NULL;
    size_t n = 0, cap = 0, len = 1;
    DIR *d = opendir(models);
    struct dirent *ent;
    while (d && (ent = readdir(d)))
        if (ent->d_name[0] != '.') collect_ids(models, ent->d_name, &ids, &n, &cap);
    if (d) closedir(d);
    free(models);
    qsort(ids, n, sizeof *ids, compare_ids);
    for (size_t i = 0; i < n; i++) len += strlen(ids[i]) + 2;
    char *out = cv_xmalloc(len), *o = out;
    *o = '\0';
    for (size_t i = 0; i < n; i++) {
        o += sprintf(o, "%s%s", i ? ", " : "", ids[i]);
        free(ids[i]);
    }
    free(ids);
    return out;
}

/* ------------------------------------------------------------------------------------------------ */
/* Resolution                                                                                        */

/* Whether a run without weights could use `model` anyway: cvllm ships its config, or the cache holds
 * a snapshot with one. */
static bool config_available(const char *model, const cv_hub_options *access) {
    char *dir = cv_shipped_model_dir(model);
    if (!dir) {
        cv_hub_options cache_only = {.revision = access->revision, .cache_dir = access->cache_dir};
        if (cv_hub_resolve(model, &cache_only, &dir) != 0) dir = NULL;
    }
    bool found = dir != NULL;
    free(dir);
    return found;
}

int cv_resolve_model(const char *model, const cv_hub_options *access, bool need_weights, char **dir) {
    const cv_hub_options none = {0};
    if (!access) access = &none;
    cv_hub_options opts = {.revision = access->revision, .cache_dir = access->cache_dir, .token = access->token,
                           .allow_download = false, .weights = need_weights, .progress = true};
    if (!need_weights) {
        /* Never download what is already here just to read a config and a tokenizer. */
        if (cv_hub_resolve(model, &opts, dir) == 0) return 0;
        if ((*dir = cv_shipped_model_dir(model))) {
            cv_info("resolve", "Using the config and tokenizer shipped with cvllm for %s (%s)", model, *dir);
            return 0;
        }
    }
    opts.allow_download = true; /* hub.c still honours HF_HUB_OFFLINE */
    int rc = cv_hub_resolve(model, &opts, dir);
    if (rc != CVLLM_ERR_NETWORK) return rc;
    /* It cannot be fetched. The reason stays; what else could run decides the status. */
    char *reason = cv_xstrdup(cv_error_message());
    if (need_weights && config_available(model, access)) {
        rc = cv_fail(CVLLM_ERR_NETWORK, "%s", reason);
    } else {
        char *ids = cv_shipped_model_ids();
        rc = cv_fail(CVLLM_ERR_NOT_FOUND, "%s; cvllm ships configs (for --load-format dummy) only for: %s", reason,
                     *ids ? ids : "none (no models/ folder was found)");
        free(ids);
    }
    free(reason);
    return rc;
}
