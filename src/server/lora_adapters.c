/*
 * lora_adapters.c — the LoRA adapters a server serves by name: their /v1/models cards, the names a
 * request's "model" may give, and vLLM's routes that load and unload adapters while it runs
 * (/v1/load_lora_adapter, /v1/unload_lora_adapter; only with VLLM_ALLOW_RUNTIME_LORA_UPDATING, as
 * vLLM, whose log calls them a development feature).
 *
 * The engine group keeps the adapters themselves (engine/lora_registry.h); the server keeps what
 * vLLM's OpenAIServingModels keeps: a card per name, with the path it was loaded from and its parent
 * model. The cards change under lora_mu while requests read them; loads and unloads take
 * lora_admin_mu as well, so that the check of a name, the engine's load and the card's change happen
 * as one (vLLM locks per name), while requests only wait for the short card updates, never for an
 * adapter being read.
 *
 * Replies are vLLM's: "Success: LoRA adapter 'NAME' added successfully." (or "removed") as plain
 * text, its 400 InvalidUserInput for an empty name or path and for a name loaded already (unless
 * load_inplace), its 404 for an adapter folder that is not there and for unloading a name it does
 * not serve. An adapter that is there but cannot be served (malformed, rank above --max-lora-rank,
 * modules the model has no linear for) is a 400 naming what is wrong, where vLLM answers 500 for
 * the exception its engine raised: the fault is the request's, not the server's.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <jansson.h>

#include "base/error.h"
#include "base/log.h"
#include "server/server_internal.h"

struct cv_lora_card {
    char *name, *root, *parent;
};

static void add_card(cv_server *s, const char *name, const char *root, const char *parent) {
    if (s->n_loras == s->cap_loras) {
        s->cap_loras = s->cap_loras ? 2 * s->cap_loras : 8;
        s->loras = cv_xrealloc(s->loras, s->cap_loras * sizeof *s->loras);
    }
    s->loras[s->n_loras++] = (cv_lora_card){cv_xstrdup(name), cv_xstrdup(root), cv_xstrdup(parent)};
}

static void free_card(cv_lora_card *c) {
    free(c->name);
    free(c->root);
    free(c->parent);
}

/* The card named `name`, or -1; under lora_mu. */
static ssize_t find_card(const cv_server *s, const char *name) {
    for (size_t i = 0; i < s->n_loras; i++)
        if (!strcmp(s->loras[i].name, name)) return (ssize_t)i;
    return -1;
}

void cv_server_loras_init(cv_server *s, const cv_server_options *o) {
    pthread_mutex_init(&s->lora_mu, NULL);
    pthread_mutex_init(&s->lora_admin_mu, NULL);
    for (size_t i = 0; i < o->n_loras; i++)
        add_card(s, o->loras[i].name, o->loras[i].path,
                 o->loras[i].base_model_name ? o->loras[i].base_model_name : s->names[0]);
    s->runtime_lora = o->runtime_lora_updating;
    s->lora_resolver_dir = o->lora_resolver_dir ? cv_xstrdup(o->lora_resolver_dir) : NULL;
    if (s->runtime_lora)
        cv_warn("server", "LoRA dynamic loading & unloading is enabled in the API server. This should ONLY be used "
                "for local development!");
}

void cv_server_loras_free(cv_server *s) {
    free(s->lora_resolver_dir);
    for (size_t i = 0; i < s->n_loras; i++) free_card(&s->loras[i]);
    free(s->loras);
    pthread_mutex_destroy(&s->lora_mu);
    pthread_mutex_destroy(&s->lora_admin_mu);
}

bool cv_server_lora_listed(cv_server *s, const char *name) {
    pthread_mutex_lock(&s->lora_mu);
    const bool found = find_card(s, name) >= 0;
    pthread_mutex_unlock(&s->lora_mu);
    return found;
}

void cv_server_lora_cards(cv_server *s, json_t *data) {
    pthread_mutex_lock(&s->lora_mu);
    for (size_t i = 0; i < s->n_loras; i++) {
        const cv_lora_card *c = &s->loras[i];
        json_array_append_new(data, cv_server_model_card(s, c->name, c->root, c->parent, 0, s->n_names + i));
    }
    pthread_mutex_unlock(&s->lora_mu);
}

static void reply_text(cv_http_req *r, const char *fmt, const char *name) {
    char *text = cv_xasprintf(fmt, name);
    cv_http_respond(r, 200, "text/plain; charset=utf-8", text, strlen(text));
    free(text);
}

/* The card of an adapter the engines have just loaded, in place of one of the same name. */
static void put_card(cv_server *s, const char *name, const char *path) {
    pthread_mutex_lock(&s->lora_mu);
    const ssize_t old = find_card(s, name);
    if (old >= 0) {
        free_card(&s->loras[old]);
        s->loras[old] = s->loras[--s->n_loras];
    }
    add_card(s, name, path, s->names[0]);
    pthread_mutex_unlock(&s->lora_mu);
}

/* Whether DIR/adapter_config.json is a LoRA adapter of base model `base` (its peft_type and
 * base_model_name_or_path), as vLLM's FilesystemResolver checks. */
static bool resolvable(const char *dir, const char *base) {
    char *path = cv_xasprintf("%s/adapter_config.json", dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    free(path);
    const char *type = json_string_value(json_object_get(cfg, "peft_type"));
    const char *model = json_string_value(json_object_get(cfg, "base_model_name_or_path"));
    const bool ok = type && model && !strcmp(type, "LORA") && !strcmp(model, base);
    json_decref(cfg);
    return ok;
}

int cv_server_lora_resolve(cv_server *s, const char *name, cv_api_error *err) {
    if (!s->runtime_lora || !s->lora_resolver_dir) return 0;
    /* a folder of the resolver's directory, never a path out of it */
    if (!*name || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..")) return 0;
    char *dir = cv_xasprintf("%s/%s", s->lora_resolver_dir, name);
    int rc = 0;
    if (resolvable(dir, s->root)) {
        pthread_mutex_lock(&s->lora_admin_mu);
        if (cv_server_lora_listed(s, name)) {
            rc = 1; /* another request resolved it meanwhile */
        } else if (cv_engine_group_load_lora(s->group, &(cvllm_lora_module){name, dir}, false)) {
            cv_warn("server", "Failed to load LoRA '%s' resolved by FilesystemResolver: %s", name, cvllm_last_error());
            cv_api_fail(err, 400, NULL, "LoRA adapter '%s' was found but could not be loaded.", name);
            rc = -1;
        } else {
            put_card(s, name, dir);
            cv_info("server", "Resolved and loaded LoRA adapter '%s' using FilesystemResolver", name);
            rc = 1;
        }
        pthread_mutex_unlock(&s->lora_admin_mu);
    }
    free(dir);
    return rc;
}

/* vLLM's 400 for what its serving layer refuses before the engine sees it. */
#define INVALID_INPUT(err, ...) (cv_api_fail(err, 400, NULL, __VA_ARGS__), (err)->type = "InvalidUserInput", -1)

/* The engine group's load as vLLM answers it. */
static int load(cv_server *s, const cv_api_lora_request *q, cv_api_error *err) {
    if (!*q->lora_name || !*q->lora_path)
        return INVALID_INPUT(err, "Both 'lora_name' and 'lora_path' must be provided.");
    pthread_mutex_lock(&s->lora_mu);
    const bool loaded = find_card(s, q->lora_name) >= 0;
    pthread_mutex_unlock(&s->lora_mu);
    if (loaded && !q->load_inplace)
        return INVALID_INPUT(err, "The lora adapter '%s' has already been loaded. If you want to load the adapter in "
                             "place, set 'load_inplace' to True.", q->lora_name);
    const cvllm_lora_module m = {q->lora_name, q->lora_path};
    const int rc = cv_engine_group_load_lora(s->group, &m, q->load_inplace);
    if (rc == CVLLM_ERR_NOT_FOUND || rc == CVLLM_ERR_NETWORK) {
        cv_warn("server", "%s", cvllm_last_error());
        return cv_api_fail(err, 404, NULL, "Loading lora %s failed: No adapter found for %s", q->lora_name,
                           q->lora_path);
    }
    if (rc) return cv_api_fail(err, rc == CVLLM_ERR_INTERNAL || rc == CVLLM_ERR_IO ? 500 : 400, NULL, "%s",
                               cvllm_last_error());
    put_card(s, q->lora_name, q->lora_path);
    cv_info("server", "Loaded new LoRA adapter: name '%s', path '%s'", q->lora_name, q->lora_path);
    return 0;
}

static int unload(cv_server *s, const cv_api_lora_request *q, cv_api_error *err) {
    if (!*q->lora_name)
        return INVALID_INPUT(err, "'lora_name' needs to be provided to unload a LoRA adapter.");
    pthread_mutex_lock(&s->lora_mu);
    const ssize_t i = find_card(s, q->lora_name);
    if (i >= 0) {
        free_card(&s->loras[i]);
        s->loras[i] = s->loras[--s->n_loras];
    }
    pthread_mutex_unlock(&s->lora_mu);
    if (i < 0) return cv_api_fail(err, 404, NULL, "The lora adapter '%s' cannot be found.", q->lora_name);
    /* the card goes first: no request names the adapter once the engine has let it go */
    const int rc = cv_engine_group_unload_lora(s->group, q->lora_name);
    if (rc) return cv_api_fail(err, 500, NULL, "Failed to remove lora adapter '%s' from the engine.", q->lora_name);
    cv_info("server", "Removed LoRA adapter: name '%s'", q->lora_name);
    return 0;
}

void cv_server_lora_route(cv_server *s, cv_http_req *r, const char *body, size_t len, bool load_it) {
    cv_api_lora_request q;
    cv_api_error err;
    int rc = cv_api_parse_lora_adapter(body, len, load_it, &q, &err);
    if (!rc) {
        pthread_mutex_lock(&s->lora_admin_mu);
        rc = load_it ? load(s, &q, &err) : unload(s, &q, &err);
        pthread_mutex_unlock(&s->lora_admin_mu);
    }
    if (rc) cv_server_reply_error(r, &err);
    else reply_text(r, load_it ? "Success: LoRA adapter '%s' added successfully." : "Success: LoRA adapter '%s' "
                    "removed successfully.", q.lora_name);
    cv_api_lora_request_free(&q);
}
