/*
 * lora_registry.c — see lora_registry.h.
 *
 * The table lists at most CV_MAX_LORA_MODULES entries, in slots[]: an entry keeps its slot while it
 * lives, listed or only held by requests, so `listed` marks which live entries still answer to their
 * name (at most one per name).
 */
#include "engine/lora_registry.h"

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

struct cv_lora_registry {
    pthread_mutex_t mu;
    cv_lora_entry *slots[CV_MAX_LORA_MODULES]; /* live entries; NULL: free */
    bool listed[CV_MAX_LORA_MODULES];
    int32_t next_id;
};

cv_lora_registry *cv_lora_registry_new(void) {
    cv_lora_registry *r = cv_xcalloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    return r;
}

static void entry_free(cv_lora_entry *e) {
    cv_lora_binding_free(e->binding);
    cv_lora_adapter_free(e->adapter);
    free(e);
}

/* Drops one reference under r->mu; the entry leaves its slot with the last. */
static void unref_locked(cv_lora_registry *r, cv_lora_entry *e) {
    assert(e->refs > 0 && r->slots[e->slot] == e);
    if (--e->refs) return;
    r->slots[e->slot] = NULL;
    entry_free(e);
}

void cv_lora_registry_free(cv_lora_registry *r) {
    if (!r) return;
    for (int32_t i = 0; i < CV_MAX_LORA_MODULES; i++)
        if (r->listed[i]) {
            r->listed[i] = false;
            unref_locked(r, r->slots[i]);
        }
    for (int32_t i = 0; i < CV_MAX_LORA_MODULES; i++) assert(!r->slots[i]); /* a request still holds one */
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* The slot listed under name, or -1; under r->mu. */
static int32_t find_listed(const cv_lora_registry *r, const char *name) {
    for (int32_t i = 0; i < CV_MAX_LORA_MODULES; i++)
        if (r->listed[i] && !strcmp(r->slots[i]->adapter->name, name)) return i;
    return -1;
}

int cv_lora_registry_add(cv_lora_registry *r, cv_lora_adapter *a, cv_lora_binding *b, bool replace) {
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    const int32_t old = find_listed(r, a->name);
    int32_t slot = 0;
    while (slot < CV_MAX_LORA_MODULES && r->slots[slot]) slot++;
    if (old >= 0 && !replace)
        rc = cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "LoRA adapter %s is loaded already", a->name);
    else if (slot == CV_MAX_LORA_MODULES)
        rc = cv_fail(CVLLM_ERR_CAPACITY, "LoRA adapter %s: %d adapters are loaded or in use, the most one engine "
                     "serves", a->name, CV_MAX_LORA_MODULES);
    if (rc) {
        pthread_mutex_unlock(&r->mu);
        cv_lora_binding_free(b);
        cv_lora_adapter_free(a);
        return rc;
    }
    cv_lora_entry *e = cv_xcalloc(1, sizeof *e);
    *e = (cv_lora_entry){.adapter = a, .binding = b, .id = ++r->next_id, .slot = slot, .refs = 1, .owner = r};
    r->slots[slot] = e;
    r->listed[slot] = true;
    if (old >= 0) {
        r->listed[old] = false;
        unref_locked(r, r->slots[old]);
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int cv_lora_registry_remove(cv_lora_registry *r, const char *name) {
    pthread_mutex_lock(&r->mu);
    const int32_t i = find_listed(r, name);
    if (i >= 0) {
        r->listed[i] = false;
        unref_locked(r, r->slots[i]);
    }
    pthread_mutex_unlock(&r->mu);
    return i >= 0 ? 0 : cv_fail(CVLLM_ERR_NOT_FOUND, "LoRA adapter %s is not loaded", name);
}

cv_lora_entry *cv_lora_registry_acquire(cv_lora_registry *r, const char *name) {
    pthread_mutex_lock(&r->mu);
    const int32_t i = find_listed(r, name);
    cv_lora_entry *e = i >= 0 ? r->slots[i] : NULL;
    if (e) e->refs++;
    pthread_mutex_unlock(&r->mu);
    return e;
}

void cv_lora_entry_release(cv_lora_entry *e) {
    if (!e) return;
    cv_lora_registry *r = e->owner;
    pthread_mutex_lock(&r->mu);
    unref_locked(r, e);
    pthread_mutex_unlock(&r->mu);
}

void cv_lora_registry_slot_names(cv_lora_registry *r, char **names) {
    pthread_mutex_lock(&r->mu);
    for (int32_t i = 0; i < CV_MAX_LORA_MODULES; i++)
        names[i] = r->slots[i] ? cv_xstrdup(r->slots[i]->adapter->name) : NULL;
    pthread_mutex_unlock(&r->mu);
}
