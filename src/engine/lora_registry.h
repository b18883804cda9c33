/*
 * lora_registry.h — the LoRA adapters an engine serves, by name: those of lora_modules, read at
 * create, and those loaded and unloaded while it runs (vLLM's /v1/load_lora_adapter).
 *
 * An entry holds an adapter (loader/lora.h) and its binding to the model (models/model.h) under the
 * name requests ask for. A request takes a reference on its entry when it is prepared and drops it
 * when it is freed, so unloading an adapter, or replacing it under its name (vLLM's load_inplace),
 * only takes the name away: requests that hold it run to their end with it, and the last of them
 * frees it. Each load gets an id never used before, the key that block hashes and the data-parallel
 * router mix in, so no block one adapter computed is served to another under the same name; and a
 * slot, below CV_MAX_LORA_MODULES, free again once the entry is freed, which the metrics index by.
 *
 * One mutex guards the table and the counts: requests are prepared on the server's threads while
 * the engine steps on its own, and loads may come from any thread. It is never held while an adapter
 * is read or a batch runs.
 */
#ifndef CV_ENGINE_LORA_REGISTRY_H
#define CV_ENGINE_LORA_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>

#include "loader/lora.h"
#include "models/model.h"

typedef struct cv_lora_registry cv_lora_registry;

typedef struct cv_lora_entry {
    cv_lora_adapter *adapter;   /* adapter->name is the name it is (or was) listed under */
    cv_lora_binding *binding;
    int32_t id;                 /* 1, 2, …: per load, never reused */
    int32_t slot;               /* [0, CV_MAX_LORA_MODULES): unique among the live entries */
    int32_t refs;               /* the table's while listed, plus one per request holding it */
    cv_lora_registry *owner;
} cv_lora_entry;

cv_lora_registry *cv_lora_registry_new(void);
/* Frees the table; every request must have released its entry. NULL is allowed. */
void cv_lora_registry_free(cv_lora_registry *r);
/* Lists the adapter under its name, taking over it and its binding (also on failure). A name listed
 * already: CVLLM_ERR_INVALID_ARGUMENT, unless `replace`, which unlists the old entry first. No free
 * slot (CV_MAX_LORA_MODULES entries live): CVLLM_ERR_CAPACITY. */
int cv_lora_registry_add(cv_lora_registry *r, cv_lora_adapter *a, cv_lora_binding *b, bool replace);
/* Unlists `name`: CVLLM_ERR_NOT_FOUND when it is not listed. */
int cv_lora_registry_remove(cv_lora_registry *r, const char *name);
/* The entry listed under `name`, with a reference taken; NULL when none is. */
cv_lora_entry *cv_lora_registry_acquire(cv_lora_registry *r, const char *name);
/* Drops a reference (NULL is allowed); the last one frees the entry. */
void cv_lora_entry_release(cv_lora_entry *e);
/* Copies of the names of the live entries by slot (names[slot]; NULL where the slot is free), into
 * names[CV_MAX_LORA_MODULES]; the caller frees each. */
void cv_lora_registry_slot_names(cv_lora_registry *r, char **names);

#endif
