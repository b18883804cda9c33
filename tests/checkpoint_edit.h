/*
 * checkpoint_edit.h — edited copies of a reference checkpoint for the loading tests: some tensors
 * left out (a checkpoint stripped of its MTP module, of one tensor) or renamed (the same weights
 * under another architecture's names), the data copied byte for byte or rewritten (a changed
 * scale). Header-only (static functions), like testutil.h.
 */
#ifndef CV_CHECKPOINT_EDIT_H
#define CV_CHECKPOINT_EDIT_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "loader/safetensors.h"

/* Writes the name a tensor gets in the copy into out[cap]; returns false to leave it out. */
typedef bool (*ce_rename_fn)(const char *name, const void *ctx, char *out, size_t cap);
/* Rewrites the bytes a kept tensor gets in the copy (data: t->nbytes, a copy of the source's). */
typedef void (*ce_edit_fn)(const cv_tensor *t, void *data, const void *ctx);

/* The safetensors file `path`: the tensors of ck that `rename` keeps, under the names it gives, in
 * ck's order, their bytes passed through `edit` (NULL: copied as they are). Aborts when the file
 * cannot be written (a test bug). */
__attribute__((unused)) static void ce_write_tensors(const cv_checkpoint *ck, const char *path, ce_rename_fn rename,
                                                     ce_edit_fn edit, const void *ctx) {
    const size_t n = cv_checkpoint_count(ck);
    bool *kept = cv_xcalloc(n ? n : 1, sizeof *kept);
    json_t *header = json_object();
    size_t offset = 0;
    for (size_t i = 0; i < n; i++) {
        const cv_tensor *t = cv_checkpoint_tensor(ck, i);
        char name[256];
        if (!(kept[i] = rename(t->name, ctx, name, sizeof name))) continue;
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(header, name,
                            json_pack("{s:s, s:o, s:[I,I]}", "dtype", cv_dtype_name(t->dtype), "shape", shape,
                                      "data_offsets", (json_int_t)offset, (json_int_t)(offset + t->nbytes)));
        offset += t->nbytes;
    }
    char *text = json_dumps(header, JSON_COMPACT);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    uint64_t len = strlen(text);
    fwrite(&len, sizeof len, 1, f);
    fwrite(text, 1, len, f);
    for (size_t i = 0; i < n; i++) {
        if (!kept[i]) continue;
        const cv_tensor *t = cv_checkpoint_tensor(ck, i);
        void *copy = NULL;
        if (edit) {
            copy = cv_xmalloc(t->nbytes ? t->nbytes : 1);
            memcpy(copy, t->data, t->nbytes);
            edit(t, copy, ctx);
        }
        fwrite(copy ? copy : t->data, 1, t->nbytes, f);
        free(copy);
    }
    fclose(f);
    free(text);
    free(kept);
    json_decref(header);
}

/* dir/model.safetensors: the tensors of the checkpoint in `from` that `rename` keeps, under the
 * names it gives, in the source's order. Aborts when the source cannot be read (a test bug). */
__attribute__((unused)) static void ce_write_checkpoint(const char *from, const char *dir, ce_rename_fn rename,
                                                        const void *ctx) {
    cv_checkpoint *ck;
    if (cv_checkpoint_open(from, &ck)) abort();
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ce_write_tensors(ck, path, rename, NULL, ctx);
    cv_checkpoint_close(ck);
}

#endif
