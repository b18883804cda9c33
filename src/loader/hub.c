/*
 * hub.c — MODEL argument → local folder: a folder as is, else the Hugging Face cache, else a download.
 *
 * Cache layout (huggingface_hub's, so both tools share one cache):
 *
 *   $HF_HUB_CACHE/models--ORG--NAME/
 *       refs/main                    "COMMIT" (the commit a branch or tag pointed to when fetched)
 *       snapshots/COMMIT/config.json, model.safetensors, ...   (files or symlinks into blobs/)
 *       blobs/...                    (written by huggingface_hub; we only read through snapshots)
 *
 * The cache root is $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 * ~/.cache/huggingface/hub. A cached snapshot is used when it holds config.json and, when weights
 * are wanted, the whole checkpoint (model.safetensors, or the index and every shard it names).
 *
 * Downloads (allowed by the caller and not forbidden by HF_HUB_OFFLINE, which fails like an
 * unreachable hub: CVLLM_ERR_NETWORK) ask the hub which commit
 * the revision names and which files it has, then fetch only what serving needs — configs,
 * tokenizer files, the chat template and (when wanted) safetensors files — into snapshots/COMMIT/
 * directly, each via FILE.incomplete (see download.c), and finally write refs/REVISION. Files are
 * requested by commit, not by branch, so a push during the download cannot mix two versions.
 * With VLLM_USE_MODELSCOPE=True the file list and files come from ModelScope's API instead; it has
 * no cheap "which commit" call, so the snapshot folder is named after the revision ("master").
 *
 * Not done: the cross-process lock huggingface_hub takes per blob (two processes downloading the
 * same model at once may both write FILE.incomplete), and reading a token from $HF_HOME/token.
 */
#include "loader/hub.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <curl/curl.h>

#include "base/error.h"
#include "base/log.h"
#include "loader/download.h"
#include "loader/fileutil.h"

#define MAX_API_RESPONSE (64u << 20)

/* ------------------------------------------------------------------------------------------------ */
/* Names and environment                                                                             */

static bool env_true(const char *name) {
    const char *v = getenv(name);
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
                 !strcasecmp(v, "on"));
}

static const char *env_nonempty(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

static char *hub_cache_dir(const cv_hub_options *opts) {
    const char *v;
    if (opts->cache_dir) return cv_xstrdup(opts->cache_dir);
    if ((v = env_nonempty("HF_HUB_CACHE")) || (v = env_nonempty("HUGGINGFACE_HUB_CACHE")))
        return cv_xstrdup(v);
    if ((v = env_nonempty("HF_HOME"))) return cv_xasprintf("%s/hub", v);
    if ((v = env_nonempty("XDG_CACHE_HOME"))) return cv_xasprintf("%s/huggingface/hub", v);
    return cv_xasprintf("%s/.cache/huggingface/hub", env_nonempty("HOME") ? getenv("HOME") : "/tmp");
}

/* One path component: no separators, not "." or "..", nothing hidden. */
static bool plain_name(const char *s) {
    return s[0] && s[0] != '.' && !strchr(s, '/');
}

/* huggingface_hub's rule: [ORG/]NAME of [A-Za-z0-9_.-], no "--" or "..", not starting or ending
 * with '-' or '.'. */
static bool valid_repo_id(const char *id) {
    const char *slash = strchr(id, '/');
    if (slash && strchr(slash + 1, '/')) return false;
    if (strstr(id, "--") || strstr(id, "..")) return false;
    size_t n = strlen(id);
    if (n == 0 || n > 96) return false;
    for (const char *p = id; *p; p++) {
        bool edge = p == id || p[-1] == '/' || p[1] == '\0' || p[1] == '/';
        if (*p == '/') {
            if (p == id || p[1] == '\0') return false;
        } else if (!isalnum((unsigned char)*p) && !strchr("_.-", *p)) {
            return false;
        } else if (edge && (*p == '-' || *p == '.')) {
            return false;
        }
    }
    return true;
}

/* A branch, tag or commit: may contain '/' (refs/pr/1) but never climb out of refs/. */
static bool valid_revision(const char *rev) {
    return rev[0] && rev[0] != '/' && !strstr(rev, "..") && rev[strlen(rev) - 1] != '/';
}

static bool is_commit_hash(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (!isxdigit((unsigned char)s[n]) || isupper((unsigned char)s[n])) return false;
    return n == 40;
}

/* cache/models--ORG--NAME */
static char *repo_folder(const char *cache, const char *id) {
    char *name = cv_xasprintf("models--%s", id);
    size_t len = strlen(name);
    char *out = cv_xmalloc(len * 2 + 1), *o = out;
    for (const char *p = name; *p; p++) {
        if (*p == '/') *o++ = '-', *o++ = '-';
        else *o++ = *p;
    }
    *o = '\0';
    char *path = cv_xasprintf("%s/%s", cache, out);
    free(out);
    free(name);
    return path;
}

/* ------------------------------------------------------------------------------------------------ */
/* Cache lookup                                                                                      */

/* The snapshot folder the revision names, or NULL when the cache has none. */
static char *find_snapshot(const char *repo, const char *rev) {
    char *commit = NULL;
    if (is_commit_hash(rev)) {
        commit = cv_xstrdup(rev);
    } else {
        char *ref = cv_xasprintf("%s/refs/%s", repo, rev);
        size_t len;
        commit = cv_read_file(ref, &len);
        free(ref);
        if (!commit) return NULL;
        while (len > 0 && isspace((unsigned char)commit[len - 1])) commit[--len] = '\0';
        if (!plain_name(commit)) {
            free(commit);
            return NULL;
        }
    }
    char *snap = cv_xasprintf("%s/snapshots/%s", repo, commit);
    free(commit);
    if (cv_is_dir(snap)) return snap;
    free(snap);
    return NULL;
}

static bool has_file(const char *dir, const char *name) {
    char *path = cv_xasprintf("%s/%s", dir, name);
    bool ok = cv_path_exists(path);
    free(path);
    return ok;
}

/* model.safetensors, or the index and every shard it names. */
static bool has_checkpoint(const char *snap) {
    if (has_file(snap, "model.safetensors")) return true;
    char *index = cv_xasprintf("%s/model.safetensors.index.json", snap);
    json_t *root = json_load_file(index, 0, NULL);
    free(index);
    json_t *wm = json_object_get(root, "weight_map");
    bool ok = json_is_object(wm);
    const char *name;
    json_t *file;
    json_object_foreach(wm, name, file) {
        if (!ok) break;
        ok = json_is_string(file) && plain_name(json_string_value(file)) &&
             has_file(snap, json_string_value(file));
    }
    json_decref(root);
    return ok;
}

/* An msModelSlim checkpoint (quant_model_description.json beside quant_model_weights*.safetensors)
 * counts as complete: it is the engine that names what it cannot load, not a download retried on
 * every start. */
static bool snapshot_complete(const char *snap, const cv_hub_options *opts) {
    if (opts->adapter) return has_file(snap, "adapter_config.json") && has_file(snap, "adapter_model.safetensors");
    return has_file(snap, "config.json") &&
           (!opts->weights || has_checkpoint(snap) || has_file(snap, "quant_model_description.json"));
}

/* ------------------------------------------------------------------------------------------------ */
/* Remote listing                                                                                    */

typedef struct hub_remote {
    bool modelscope;
    char *endpoint;          /* no trailing '/' */
    const char *revision;
    cv_http_options http;
    char *stored_token;      /* read from the token file; http.token points here */
} hub_remote;

/* The token `huggingface-cli login` stored ($HF_TOKEN_PATH, else $HF_HOME/token, else
 * ~/.cache/huggingface/token): its first line, or NULL. */
static char *stored_token(void) {
    const char *v;
    char *path = (v = env_nonempty("HF_TOKEN_PATH")) ? cv_xstrdup(v)
                 : (v = env_nonempty("HF_HOME"))    ? cv_xasprintf("%s/token", v)
                                                    : cv_xasprintf("%s/.cache/huggingface/token",
                                                                   env_nonempty("HOME") ? getenv("HOME") : "/tmp");
    size_t len = 0;
    char *text = cv_read_file(path, &len);
    free(path);
    if (!text) return NULL;
    text[strcspn(text, "\r\n")] = '\0';
    if (!*text) {
        free(text);
        return NULL;
    }
    return text;
}

static void remote_init(hub_remote *r, const cv_hub_options *opts) {
    memset(r, 0, sizeof *r);
    r->modelscope = env_true("VLLM_USE_MODELSCOPE");
    const char *ep;
    if (r->modelscope) {
        ep = env_nonempty("MODELSCOPE_DOMAIN");
        ep = ep ? ep : "https://www.modelscope.cn";
        r->endpoint = strstr(ep, "://") ? cv_xstrdup(ep) : cv_xasprintf("https://%s", ep);
        r->revision = opts->revision ? opts->revision : "master";
    } else {
        ep = env_nonempty("HF_ENDPOINT");
        r->endpoint = cv_xstrdup(ep ? ep : "https://huggingface.co");
        r->revision = opts->revision ? opts->revision : "main";
        const char *token = opts->token ? opts->token : env_nonempty("HF_TOKEN");
        r->http.token = token ? token : env_nonempty("HUGGING_FACE_HUB_TOKEN");
        if (!r->http.token) r->http.token = r->stored_token = stored_token();
    }
    size_t n = strlen(r->endpoint);
    while (n > 0 && r->endpoint[n - 1] == '/') r->endpoint[--n] = '\0';
    const char *t = env_nonempty("HF_HUB_DOWNLOAD_TIMEOUT");
    r->http.timeout_s = t && atol(t) > 0 ? atol(t) : 10;
    r->http.progress = opts->progress && isatty(2);
}

static char *escape(const char *s) {
    char *e = curl_easy_escape(NULL, s, 0);
    char *out = cv_xstrdup(e ? e : "");
    curl_free(e);
    return out;
}

/* One line for a response that is not 2xx. */
static int http_status_error(const hub_remote *r, const char *id, long status, const char *url) {
    if (status == 401 || status == 403)
        return cv_fail(CVLLM_ERR_NOT_FOUND, "cannot download %s: HTTP %ld from %s (%s)", id, status, url,
                       r->modelscope ? "access denied"
                       : r->http.token ? "HF_TOKEN was not accepted"
                                       : "private or gated repository? set HF_TOKEN");
    if (status == 404)
        return cv_fail(CVLLM_ERR_NOT_FOUND, "cannot download %s: HTTP 404 from %s (no such repository, "
                       "revision or file)", id, url);
    return cv_fail(CVLLM_ERR_NETWORK, "cannot download %s: HTTP %ld from %s", id, status, url);
}

static int transport_failure(int rc, const char *id, bool no_network) {
    char reason[512];
    snprintf(reason, sizeof reason, "%s", cv_error_message());
    return no_network ? cv_fail(rc, "cannot download %s: no network (%s)", id, reason)
                      : cv_fail(rc, "cannot download %s: %s", id, reason);
}

/* GETs and parses a JSON API response. */
static int get_json(const hub_remote *r, const char *id, const char *url, json_t **out) {
    long status;
    char *body;
    size_t len;
    bool no_network;
    int rc = cv_http_get(url, &r->http, MAX_API_RESPONSE, &status, &body, &len, &no_network);
    if (rc) return transport_failure(rc, id, no_network);
    if (status / 100 != 2) rc = http_status_error(r, id, status, url);
    json_error_t jerr;
    if (!rc && !(*out = json_loadb(body, len, 0, &jerr)))
        rc = cv_fail(CVLLM_ERR_NETWORK, "cannot download %s: %s answered with invalid JSON (%s)", id, url,
                     jerr.text);
    free(body);
    return rc;
}

/* Appends each string found at `key` in the objects of `array` to `names`. */
static void collect_names(json_t *array, const char *key, const char *skip_type, json_t *names) {
    size_t i;
    json_t *e;
    json_array_foreach(array, i, e) {
        json_t *name = json_object_get(e, key);
        json_t *type = json_object_get(e, "Type");
        if (skip_type && json_is_string(type) && !strcmp(json_string_value(type), skip_type)) continue;
        if (json_is_string(name)) json_array_append(names, name);
    }
}

/* Hugging Face: GET /api/models/ID/revision/REV → {"sha": ..., "siblings": [{"rfilename": ...}]}. */
static int list_hf(const hub_remote *r, const char *id, char **sha, json_t *names) {
    char *rev = escape(r->revision);
    char *url = cv_xasprintf("%s/api/models/%s/revision/%s", r->endpoint, id, rev);
    free(rev);
    json_t *root = NULL;
    int rc = get_json(r, id, url, &root);
    if (!rc) {
        json_t *s = json_object_get(root, "sha");
        json_t *siblings = json_object_get(root, "siblings");
        if (!json_is_string(s) || !plain_name(json_string_value(s)) || !json_is_array(siblings))
            rc = cv_fail(CVLLM_ERR_NETWORK, "cannot download %s: unexpected answer from %s (no sha or "
                         "siblings)", id, url);
        else {
            *sha = cv_xstrdup(json_string_value(s));
            collect_names(siblings, "rfilename", NULL, names);
        }
    }
    json_decref(root);
    free(url);
    return rc;
}

/* ModelScope: GET /api/v1/models/ID/repo/files?Revision=REV&Recursive=true → {"Data": {"Files":
 * [{"Path": ..., "Type": "blob"|"tree"}]}}. The snapshot is named after the revision. */
static int list_modelscope(const hub_remote *r, const char *id, char **sha, json_t *names) {
    if (!plain_name(r->revision))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "ModelScope revision \"%s\" cannot name a folder",
                       r->revision);
    char *rev = escape(r->revision);
    char *url = cv_xasprintf("%s/api/v1/models/%s/repo/files?Revision=%s&Recursive=true", r->endpoint, id,
                             rev);
    free(rev);
    json_t *root = NULL;
    int rc = get_json(r, id, url, &root);
    if (!rc) {
        json_t *files = json_object_get(json_object_get(root, "Data"), "Files");
        if (!json_is_array(files))
            rc = cv_fail(CVLLM_ERR_NETWORK, "cannot download %s: unexpected answer from %s (no "
                         "Data.Files)", id, url);
        else {
            *sha = cv_xstrdup(r->revision);
            collect_names(files, "Path", "tree", names);
        }
    }
    json_decref(root);
    free(url);
    return rc;
}

static char *file_url(const hub_remote *r, const char *id, const char *commit, const char *file) {
    char *f = escape(file), *c = escape(commit);
    char *url = r->modelscope
                    ? cv_xasprintf("%s/api/v1/models/%s/repo?Revision=%s&FilePath=%s", r->endpoint, id, c, f)
                    : cv_xasprintf("%s/%s/resolve/%s/%s", r->endpoint, id, c, f);
    free(f);
    free(c);
    return url;
}

/* Serving needs configs, tokenizer files, the chat template and the safetensors checkpoint (of a
 * LoRA adapter too: its adapter_config.json and adapter_model.safetensors); everything else in a
 * repository (other weight formats, READMEs, images) is skipped. */
static bool wanted(const char *file, bool weights) {
    static const char *const always[] = {"config.json", "generation_config.json", "tokenizer.json",
                                         "tokenizer_config.json", "chat_template.jinja",
                                         "quant_model_description.json", "adapter_config.json"};
    if (!plain_name(file)) return false;
    for (size_t i = 0; i < CV_ARRAY_LEN(always); i++)
        if (!strcmp(file, always[i])) return true;
    if (!weights) return false;
    size_t n = strlen(file);
    return !strcmp(file, "model.safetensors.index.json") ||
           (n > 12 && !strcmp(file + n - 12, ".safetensors"));
}

/* ------------------------------------------------------------------------------------------------ */
/* Download                                                                                          */

static int fetch_file(const hub_remote *r, const char *id, const char *commit, const char *snap,
                      const char *file) {
    char *path = cv_xasprintf("%s/%s", snap, file);
    int rc = 0;
    if (!cv_path_exists(path)) {
        char *url = file_url(r, id, commit, file);
        long status;
        bool no_network;
        rc = cv_http_download(url, path, file, &r->http, &status, &no_network);
        if (rc == CVLLM_ERR_NETWORK) rc = transport_failure(rc, id, no_network);
        else if (rc == 0 && status / 100 != 2) rc = http_status_error(r, id, status, url);
        free(url);
    }
    free(path);
    return rc;
}

/* refs/REV ← commit, written through a temporary file so a reader never sees half of it. */
static int write_ref(const char *repo, const char *rev, const char *commit) {
    char *path = cv_xasprintf("%s/refs/%s", repo, rev);
    char *tmp = cv_xasprintf("%s.tmp", path);
    char *dir = cv_xstrdup(path);
    *strrchr(dir, '/') = '\0';
    int rc = 0;
    FILE *fp = NULL;
    if (cv_mkdirs(dir) != 0 || !(fp = fopen(tmp, "w")) || fputs(commit, fp) < 0 || fclose(fp) != 0 ||
        rename(tmp, path) != 0)
        rc = cv_fail(CVLLM_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    free(dir);
    free(tmp);
    free(path);
    return rc;
}

static int download(const char *id, const cv_hub_options *opts, const hub_remote *r, const char *repo,
                    char **dir) {
    json_t *names = json_array();
    char *commit = NULL, *snap = NULL;
    int rc = r->modelscope ? list_modelscope(r, id, &commit, names) : list_hf(r, id, &commit, names);
    if (!rc) {
        snap = cv_xasprintf("%s/snapshots/%s", repo, commit);
        if (cv_mkdirs(snap) != 0) rc = cv_fail(CVLLM_ERR_IO, "cannot create %s: %s", snap, strerror(errno));
    }
    if (!rc)
        cv_info("hub", "downloading %s (revision %s, commit %s) from %s into %s", id, r->revision, commit,
                r->endpoint, snap);
    size_t i;
    json_t *name;
    json_array_foreach(names, i, name) {
        if (rc) break;
        const char *file = json_string_value(name);
        if (wanted(file, opts->weights)) rc = fetch_file(r, id, commit, snap, file);
    }
    if (!rc && !is_commit_hash(r->revision)) rc = write_ref(repo, r->revision, commit);
    json_decref(names);
    free(commit);
    if (rc) {
        free(snap);
        return rc;
    }
    *dir = snap;
    return 0;
}

/* ------------------------------------------------------------------------------------------------ */

int cv_hub_resolve(const char *model, const cv_hub_options *opts, char **dir) {
    *dir = NULL;
    if (cv_is_dir(model)) {
        *dir = cv_xstrdup(model);
        return 0;
    }
    if (cv_path_exists(model))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "model %s is a file; give its folder or a hub id", model);
    if (!valid_repo_id(model))
        return cv_fail(CVLLM_ERR_NOT_FOUND, "model %s: no such folder, and not a hub id (ORG/NAME)", model);
    hub_remote remote;
    remote_init(&remote, opts);
    char *cache = hub_cache_dir(opts);
    char *repo = repo_folder(cache, model);
    int rc = 0;
    char *snap = NULL;
    if (!valid_revision(remote.revision)) {
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "invalid revision \"%s\"", remote.revision);
    } else {
        snap = find_snapshot(repo, remote.revision);
        bool offline = env_true("HF_HUB_OFFLINE");
        if (snap && (snapshot_complete(snap, opts) || !opts->allow_download || offline)) {
            /* Complete, or the best there is: a missing file is then named by whoever opens it. */
            *dir = snap;
            snap = NULL;
        } else if (offline) {
            /* The same status as an unreachable hub: either way the model cannot be fetched. */
            rc = cv_fail(CVLLM_ERR_NETWORK, "cannot download %s: HF_HUB_OFFLINE is set, and it is not in the "
                         "Hugging Face cache (%s)", model, cache);
        } else if (!opts->allow_download) {
            rc = cv_fail(CVLLM_ERR_NOT_FOUND, "model %s: no such folder, and not in the Hugging Face cache (%s); "
                         "downloads are disabled", model, cache);
        } else {
            rc = download(model, opts, &remote, repo, dir);
        }
    }
    free(snap);
    free(repo);
    free(cache);
    free(remote.endpoint);
    free(remote.stored_token);
    return rc;
}
