/*
 * tok_internal.h — the tokenizer object shared by tok_load.c (building it from tokenizer.json),
 * tok_encode.c (text → ids) and tok_decode.c (ids → text).
 *
 * Every token, base or added, is kept as the raw bytes the ByteLevel decoder turns it into; encode
 * works on raw bytes too, so the byte-level alphabet (Ġ for a space, …) exists only while loading.
 * BPE needs two lookups, both open-addressing hash tables sized to a power of two at most half full:
 *   - bytes → id over the base vocabulary (for merges, token_to_id and ignore_merges);
 *   - (left id, right id) → (rank, merged id) over model.merges.
 * The object is immutable after loading, so any number of threads may encode and decode at once.
 */
#ifndef CV_TOK_INTERNAL_H
#define CV_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "tokenizer/tokenizer.h"

typedef struct tok_added {
    char *content;       /* as matched: NFC-normalised when `normalized` and the tokenizer has NFC */
    size_t len;
    int32_t id;
    bool special, lstrip, rstrip, normalized, single_word;
} tok_added;

/* One set of added tokens matched together (HF matches non-normalised ones on the raw text, then
 * normalised ones on the normalised pieces). For leftmost-longest matching `tokens` is sorted by
 * first byte and, within one first byte, longest first. */
typedef struct tok_added_set {
    tok_added **tokens;
    size_t n;
    uint32_t first[257];  /* tokens starting with byte b are tokens[first[b] .. first[b + 1]) */
} tok_added_set;

typedef struct tok_merge_slot {
    uint64_t key;         /* (left << 32) | right; UINT64_MAX = empty */
    int32_t rank, merged;
} tok_merge_slot;

struct cv_tokenizer {
    int32_t vocab_size;           /* max id + 1 over base and added tokens */
    /* Per id: raw bytes are arena[off[id] .. off[id] + len[id]); len -1 = no token with that id. */
    uint32_t *off;
    int32_t *len;
    uint8_t *is_special;          /* per id: an added token with "special": true */
    char *arena;

    int32_t byte_id[256];         /* the base token of each single byte */
    int32_t *vocab_slots;         /* bytes → id (base vocabulary), -1 = empty */
    size_t vocab_mask;
    tok_merge_slot *merge_slots;
    size_t merge_mask;
    bool ignore_merges;           /* BPE "ignore_merges": a piece that is a whole token stays whole */

    tok_added *added;             /* every added token */
    size_t n_added;
    tok_added_set raw_set, norm_set;

    bool nfc;                     /* normalizer NFC (else none) */
    pcre2_code *split_re;         /* the Split pre-tokenizer's regex, JIT-compiled when possible */
    pcre2_code *word_re;          /* \w for single_word tokens, NULL when none needs it */

    char *eos_token, *pad_token, *bos_token, *unk_token; /* from tokenizer_config.json */
    char *config_json;            /* tokenizer_config.json's object as compact JSON, NULL without one */

    /* post_processor's single template with add_special_tokens: post_ids[0 .. n_post_before) go
     * before the sequence, the next n_post_after after it (NULL and 0 when it adds nothing). */
    int32_t *post_ids;
    size_t n_post_before, n_post_after;

    /* The cache entry that off, len, arena, vocab_slots and merge_slots point into (tok_cache.c),
     * read-only; NULL when they were built here and are the tokenizer's own. */
    const char *map;
    size_t map_bytes;
};

/* Hash-table lookups (tok_load.c). */
int32_t tok_vocab_find(const cv_tokenizer *tok, const char *bytes, size_t len);
const tok_merge_slot *tok_merge_find(const cv_tokenizer *tok, int32_t left, int32_t right);

#define TOK_MAX_ID (1 << 24) /* far above any real vocabulary; guards the per-id tables */
/* The cache's entries (tok_cache.c) hold tok_load.c's tables as they are built: a change to their
 * hashing, sizes or layout takes a new version, or old entries would be read as the new tables. */
#define TOK_TABLES_VERSION 1

/* The large tables on disk (tok_cache.c): the key of a tokenizer.json's bytes; a valid entry of the
 * key read into tok's vocab_size, off, len, arena, byte_id, vocabulary and merge tables (is_special
 * zeroed), false and tok untouched without one; tok's tables written under key (best effort). */
XXH128_hash_t tok_cache_key(const char *json, size_t len);
bool tok_cache_read(XXH128_hash_t key, cv_tokenizer *tok);
void tok_cache_write(XXH128_hash_t key, const cv_tokenizer *tok);
/* A cv_xmalloc'd copy of tokenizer.json's text with model.vocab made {} and model.merges []
 * (*out_len bytes and a NUL); NULL when the text does not have both where a root object's "model"
 * holds them. */
char *tok_blank_tables(const char *json, size_t len, size_t *out_len);

/* NFC of valid UTF-8 into a malloc'd, NUL-terminated *out (tok_load.c). */
int tok_nfc(const char *s, size_t len, char **out, size_t *out_len);

#endif
