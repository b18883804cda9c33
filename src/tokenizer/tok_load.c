/*
 * tok_load.c — building a cv_tokenizer from tokenizer.json (+ tokenizer_config.json).
 *
 * Only the pipeline that Qwen2Tokenizer-style files describe is accepted, and everything else is
 * refused by name rather than half-supported: normalizer NFC or none; pre_tokenizer
 * Sequence[Split{Regex|String, Isolated, invert false}, ByteLevel{use_regex false,
 * add_prefix_space false}]; model BPE without dropout, byte fallback or subword affixes; decoder
 * ByteLevel. Merges come in both spellings ("a b" and ["a", "b"]). Added tokens keep all five HF
 * flags (special, lstrip, rstrip, normalized, single_word). post_processor: none, ByteLevel (it only
 * trims offsets, which cvllm has none of), TemplateProcessing (its single template, the special ids
 * add_special_tokens puts around one sequence, as Qwen3-Embedding's appended <|endoftext|>), or a
 * Sequence of these.
 *
 * Regex dialect: HF runs the Split regex with Oniguruma, whose \s is Unicode's White_Space; PCRE2's
 * \s under UCP also matches U+180E. So \s and \S are rewritten to \p{White_Space} / \P{White_Space}
 * before compiling, and the rest (\p{L}, \p{N}, (?i:...), lookahead) means the same in both.
 *
 * Vocabulary strings are turned into raw bytes with GPT-2's byte-to-character table (printable
 * Latin-1 stands for itself, the other 68 bytes for U+0100..U+0143). A token that is not spelled in
 * that alphabet keeps its UTF-8 bytes, as HF's ByteLevel decoder does.
 */
#include <assert.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include <xxhash.h>

#include "base/error.h"
#include "base/log.h"
#include "base/utf8.h"
#include "loader/fileutil.h"
#include "tokenizer/tok_internal.h"

/* ---- byte-level alphabet ------------------------------------------------------------------- */

#define BYTE_CHAR_LIMIT 324 /* the alphabet's characters are all below U+0144 */

/* char_byte[c] = the byte that character c stands for, or -1. */
static void build_char_to_byte(int16_t char_byte[BYTE_CHAR_LIMIT]) {
    for (int c = 0; c < BYTE_CHAR_LIMIT; c++) char_byte[c] = -1;
    int next = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        char_byte[printable ? b : next++] = (int16_t)b;
    }
    assert(next == BYTE_CHAR_LIMIT);
}

/* Raw bytes of a token string into out (capacity >= len); returns their count. */
static size_t token_to_bytes(const int16_t *char_byte, const char *s, size_t len, char *out) {
    size_t n_out = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t n;
        if (cv_utf8_decode(s + i, len - i, &cp, &n) != CV_UTF8_OK || cp >= BYTE_CHAR_LIMIT ||
            char_byte[cp] < 0) {
            memcpy(out, s, len); /* not byte-level: the decoder keeps the text itself */
            return len;
        }
        out[n_out++] = (char)char_byte[cp];
        i += n;
    }
    return n_out;
}

/* ---- hash tables (kept by tok_cache.c: a change here takes a new TOK_TABLES_VERSION) ---------- */

static size_t table_size_for(size_t n) {
    size_t size = 16;
    while (size < 2 * n) size *= 2;
    return size;
}

static size_t hash_bytes(const char *s, size_t len) { return (size_t)XXH3_64bits(s, len); }

static size_t hash_pair(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key;
}

int32_t tok_vocab_find(const cv_tokenizer *tok, const char *bytes, size_t len) {
    for (size_t i = hash_bytes(bytes, len) & tok->vocab_mask;; i = (i + 1) & tok->vocab_mask) {
        int32_t id = tok->vocab_slots[i];
        if (id < 0) return -1;
        if ((size_t)tok->len[id] == len && memcmp(tok->arena + tok->off[id], bytes, len) == 0)
            return id;
    }
}

/* Inserts a base token already stored in the arena; false when its bytes are already taken. */
static bool vocab_insert(cv_tokenizer *tok, int32_t id) {
    const char *bytes = tok->arena + tok->off[id];
    size_t len = (size_t)tok->len[id];
    if (tok_vocab_find(tok, bytes, len) >= 0) return false;
    size_t i = hash_bytes(bytes, len) & tok->vocab_mask;
    while (tok->vocab_slots[i] >= 0) i = (i + 1) & tok->vocab_mask;
    tok->vocab_slots[i] = id;
    return true;
}

const tok_merge_slot *tok_merge_find(const cv_tokenizer *tok, int32_t left, int32_t right) {
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    for (size_t i = hash_pair(key) & tok->merge_mask;; i = (i + 1) & tok->merge_mask) {
        const tok_merge_slot *s = &tok->merge_slots[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}

/* A repeated pair takes the later rank, as HF's HashMap collect does. */
static void merge_insert(cv_tokenizer *tok, int32_t left, int32_t right, int32_t rank,
                         int32_t merged) {
    uint64_t key = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
    size_t i = hash_pair(key) & tok->merge_mask;
    while (tok->merge_slots[i].key != UINT64_MAX && tok->merge_slots[i].key != key)
        i = (i + 1) & tok->merge_mask;
    tok->merge_slots[i] = (tok_merge_slot){key, rank, merged};
}

/* ---- JSON helpers ---------------------------------------------------------------------------- */

/* *f is NULL, with 0, when the file is not there and not required. */
static int open_file(const char *path, bool required, FILE **f) {
    *f = fopen(path, "rb");
    if (*f || (!required && errno == ENOENT)) return 0;
    return cv_fail(errno == ENOENT ? CVLLM_ERR_NOT_FOUND : CVLLM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
}

static int load_json(const char *path, bool required, json_t **out) {
    *out = NULL;
    FILE *f;
    int rc = open_file(path, required, &f);
    if (rc || !f) return rc;
    json_error_t err;
    *out = json_loadf(f, JSON_ALLOW_NUL, &err);
    fclose(f);
    if (!*out)
        return cv_fail(CVLLM_ERR_FORMAT, "%s: line %d column %d: %s", path, err.line, err.column,
                       err.text);
    return 0;
}

static const char *type_of(const json_t *obj) {
    const char *t = json_string_value(json_object_get(obj, "type"));
    return t ? t : "(none)";
}

static bool flag(const json_t *obj, const char *key, bool dflt) {
    const json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* ---- model ----------------------------------------------------------------------------------- */

static int check_model_options(const json_t *model) {
    if (!json_is_object(model)) return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: no \"model\"");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE") != 0)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "tokenizer.json: model type \"%s\" is not supported "
                       "(only BPE)", type);
    const json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "tokenizer.json: BPE dropout is not supported");
    if (flag(model, "byte_fallback", false))
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "tokenizer.json: BPE byte_fallback is not supported");
    const char *affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < CV_ARRAY_LEN(affixes); i++) {
        const char *a = json_string_value(json_object_get(model, affixes[i]));
        if (a && *a)
            return cv_fail(CVLLM_ERR_UNSUPPORTED, "tokenizer.json: BPE %s is not supported",
                           affixes[i]);
    }
    if (!json_is_object(json_object_get(model, "vocab")))
        return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: model.vocab is not an object");
    if (!json_is_array(json_object_get(model, "merges")))
        return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: model.merges is not an array");
    return 0;
}

static int checked_id(const json_t *v, const char *what, const char *name, int32_t *id) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TOK_MAX_ID)
        return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: %s \"%s\" has no valid id", what, name);
    *id = (int32_t)json_integer_value(v);
    return 0;
}

/* Every added token has content and a valid id; raises *max_id to theirs and adds their lengths to
 * *bytes. */
static int check_added(const json_t *added, int32_t *max_id, size_t *bytes) {
    size_t i;
    json_t *v;
    json_array_foreach(added, i, v) {
        const char *content = json_string_value(json_object_get(v, "content"));
        if (!content || !*content)
            return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: added_tokens[%zu] has no content", i);
        int32_t id = 0;
        if (checked_id(json_object_get(v, "id"), "added token", content, &id))
            return CVLLM_ERR_FORMAT;
        if (id > *max_id) *max_id = id;
        *bytes += json_string_length(json_object_get(v, "content"));
    }
    return 0;
}

/* Sizes the per-id tables from the largest id and the total text length. */
static int size_tables(cv_tokenizer *tok, const json_t *vocab, const json_t *added,
                       size_t *arena_bytes) {
    int32_t max_id = -1;
    size_t bytes = 0;
    const char *key;
    size_t key_len;
    json_t *v;
    json_object_keylen_foreach((json_t *)vocab, key, key_len, v) {
        int32_t id = 0;
        if (checked_id(v, "vocab token", key, &id)) return CVLLM_ERR_FORMAT;
        if (id > max_id) max_id = id;
        bytes += key_len;
    }
    if (check_added(added, &max_id, &bytes)) return CVLLM_ERR_FORMAT;
    if (max_id < 0) return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: the vocabulary is empty");
    tok->vocab_size = max_id + 1;
    tok->off = cv_xcalloc((size_t)tok->vocab_size, sizeof *tok->off);
    tok->len = cv_xmalloc((size_t)tok->vocab_size * sizeof *tok->len);
    for (int32_t id = 0; id < tok->vocab_size; id++) tok->len[id] = -1;
    tok->is_special = cv_xcalloc((size_t)tok->vocab_size, 1);
    tok->arena = cv_xmalloc(bytes + 1);
    *arena_bytes = bytes;
    return 0;
}

static void store_bytes(cv_tokenizer *tok, size_t *used, int32_t id, const int16_t *char_byte,
                        const char *s, size_t len) {
    tok->off[id] = (uint32_t)*used;
    tok->len[id] = (int32_t)token_to_bytes(char_byte, s, len, tok->arena + *used);
    *used += (size_t)tok->len[id];
}

static int load_vocab(cv_tokenizer *tok, const json_t *vocab, const int16_t *char_byte,
                      size_t *used) {
    size_t n = json_object_size(vocab);
    tok->vocab_mask = table_size_for(n) - 1;
    tok->vocab_slots = cv_xmalloc((tok->vocab_mask + 1) * sizeof *tok->vocab_slots);
    memset(tok->vocab_slots, 0xff, (tok->vocab_mask + 1) * sizeof *tok->vocab_slots);
    const char *key;
    size_t key_len;
    json_t *v;
    json_object_keylen_foreach((json_t *)vocab, key, key_len, v) {
        int32_t id = (int32_t)json_integer_value(v);
        if (tok->len[id] >= 0)
            return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: vocab id %d is used twice", id);
        store_bytes(tok, used, id, char_byte, key, key_len);
        if (!vocab_insert(tok, id))
            return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: vocab token \"%s\" (id %d) decodes "
                           "to the same bytes as another token", key, id);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        tok->byte_id[b] = tok_vocab_find(tok, &c, 1);
        if (tok->byte_id[b] < 0)
            return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: the vocabulary has no token for "
                           "byte 0x%02x (byte-level BPE needs all 256)", b);
    }
    return 0;
}

/* Splits one merges entry into its two token strings. */
static int merge_parts(const json_t *m, size_t i, const char **a, size_t *a_len, const char **b,
                       size_t *b_len) {
    if (json_is_string(m)) {
        const char *s = json_string_value(m), *sp = strchr(s, ' ');
        if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' '))
            return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: merges[%zu] \"%s\" is not two tokens "
                           "separated by one space", i, s);
        *a = s, *a_len = (size_t)(sp - s), *b = sp + 1, *b_len = strlen(sp + 1);
        return 0;
    }
    if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
        json_is_string(json_array_get(m, 1))) {
        *a = json_string_value(json_array_get(m, 0));
        *a_len = json_string_length(json_array_get(m, 0));
        *b = json_string_value(json_array_get(m, 1));
        *b_len = json_string_length(json_array_get(m, 1));
        return 0;
    }
    return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: merges[%zu] is neither \"a b\" nor [a, b]", i);
}

static int load_merges(cv_tokenizer *tok, const json_t *merges, const int16_t *char_byte) {
    size_t n = json_array_size(merges);
    if (n >= (size_t)INT32_MAX) return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: too many merges");
    tok->merge_mask = table_size_for(n) - 1;
    tok->merge_slots = cv_xmalloc((tok->merge_mask + 1) * sizeof *tok->merge_slots);
    for (size_t i = 0; i <= tok->merge_mask; i++) tok->merge_slots[i].key = UINT64_MAX;
    size_t cap = 64;
    char *buf = cv_xmalloc(cap);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *a = NULL, *b = NULL;
        size_t a_len = 0, b_len = 0;
        if ((rc = merge_parts(json_array_get(merges, i), i, &a, &a_len, &b, &b_len))) break;
        if (a_len + b_len > cap) buf = cv_xrealloc(buf, cap = 2 * (a_len + b_len));
        size_t na = token_to_bytes(char_byte, a, a_len, buf);
        size_t nb = token_to_bytes(char_byte, b, b_len, buf + na);
        int32_t left = tok_vocab_find(tok, buf, na), right = tok_vocab_find(tok, buf + na, nb);
        int32_t merged = tok_vocab_find(tok, buf, na + nb);
        if (left < 0 || right < 0 || merged < 0) {
            const char *missing = left < 0 ? "first token" : right < 0 ? "second token" : "result";
            rc = cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: merges[%zu]: the %s is not in the "
                         "vocabulary", i, missing);
            break;
        }
        merge_insert(tok, left, right, (int32_t)i, merged);
    }
    free(buf);
    return rc;
}

/* ---- added tokens ---------------------------------------------------------------------------- */

/* The added tokens' entries; their bytes go into the arena at *used, unless used is NULL (tables
 * read from the cache already hold them). */
static int load_added(cv_tokenizer *tok, const json_t *added, const int16_t *char_byte,
                      size_t *used) {
    tok->n_added = json_array_size(added);
    tok->added = cv_xcalloc(tok->n_added ? tok->n_added : 1, sizeof *tok->added);
    size_t i;
    json_t *v;
    json_array_foreach(added, i, v) {
        tok_added *a = &tok->added[i];
        const json_t *content = json_object_get(v, "content");
        a->id = (int32_t)json_integer_value(json_object_get(v, "id"));
        a->special = flag(v, "special", false);
        a->lstrip = flag(v, "lstrip", false);
        a->rstrip = flag(v, "rstrip", false);
        a->single_word = flag(v, "single_word", false);
        a->normalized = flag(v, "normalized", !a->special);
        const char *s = json_string_value(content);
        size_t len = json_string_length(content);
        if (a->normalized && tok->nfc) {
            int rc = tok_nfc(s, len, &a->content, &a->len);
            if (rc) return cv_fail_prefix(rc, "tokenizer.json: added token \"%s\"", s);
        } else {
            a->content = cv_xstrndup(s, len);
            a->len = len;
        }
        /* HF looks added tokens up before the model, so their text wins for decoding. */
        if (used) store_bytes(tok, used, a->id, char_byte, s, len);
        tok->is_special[a->id] = a->special;
    }
    return 0;
}

static int cmp_added_longest_first(const void *pa, const void *pb) {
    const tok_added *a = *(const tok_added *const *)pa, *b = *(const tok_added *const *)pb;
    uint8_t fa = (uint8_t)a->content[0], fb = (uint8_t)b->content[0];
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static void build_added_set(tok_added_set *set, tok_added *added, size_t n_added, bool normalized) {
    set->tokens = cv_xmalloc((n_added ? n_added : 1) * sizeof *set->tokens);
    set->n = 0;
    for (size_t i = 0; i < n_added; i++)
        if (added[i].normalized == normalized) set->tokens[set->n++] = &added[i];
    qsort(set->tokens, set->n, sizeof *set->tokens, cmp_added_longest_first);
    size_t j = 0;
    for (int b = 0; b <= 256; b++) {
        set->first[b] = (uint32_t)j;
        while (j < set->n && (uint8_t)set->tokens[j]->content[0] == b) j++;
    }
}

/* ---- normalizer, pre-tokenizer, decoder ------------------------------------------------------ */

int tok_nfc(const char *s, size_t len, char **out, size_t *out_len) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (n < 0) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "NFC failed: %s", utf8proc_errmsg(n));
    *out = (char *)dst;
    *out_len = (size_t)n;
    return 0;
}

static int load_normalizer(cv_tokenizer *tok, const json_t *root) {
    const json_t *norm = json_object_get(root, "normalizer");
    if (!norm || json_is_null(norm)) return 0;
    if (strcmp(type_of(norm), "NFC") != 0)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "tokenizer.json: normalizer \"%s\" is not supported "
                       "(only NFC or none)", type_of(norm));
    tok->nfc = true;
    return 0;
}

/* Oniguruma's \s is White_Space; PCRE2's UCP \s adds U+180E. Rewrite outside escapes only. */
static char *translate_regex(const char *pat, size_t len) {
    static const char ws[] = "\\p{White_Space}", not_ws[] = "\\P{White_Space}";
    char *out = NULL;
    size_t n = 0, cap = 0;
    for (size_t i = 0; i < len; i++) {
        if (pat[i] == '\\' && i + 1 < len) {
            char c = pat[++i];
            if (c == 's' || c == 'S') {
                cv_buf_append(&out, &n, &cap, c == 's' ? ws : not_ws, sizeof ws - 1);
            } else {
                cv_buf_append(&out, &n, &cap, pat + i - 1, 2);
            }
        } else {
            cv_buf_append(&out, &n, &cap, pat + i, 1);
        }
    }
    if (!out) cv_buf_append(&out, &n, &cap, "", 0);
    return out;
}

static int compile_regex(const char *pat, size_t len, uint32_t extra, pcre2_code **out) {
    int err;
    PCRE2_SIZE err_off;
    uint32_t unicode = PCRE2_UTF | (extra & PCRE2_LITERAL ? 0 : PCRE2_UCP); /* LITERAL refuses UCP */
    *out = pcre2_compile((PCRE2_SPTR)pat, len, unicode | extra, &err, &err_off, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: the Split regex does not compile at "
                       "offset %zu: %s", (size_t)err_off, (const char *)msg);
    }
    int jrc = pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE);
    if (jrc != 0) cv_debug("tokenizer", "PCRE2 JIT unavailable (%d), using the interpreter", jrc);
    return 0;
}

static int load_split(cv_tokenizer *tok, const json_t *split) {
    const char *behavior = json_string_value(json_object_get(split, "behavior"));
    if (!behavior || strcmp(behavior, "Isolated") != 0)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "tokenizer.json: Split behavior \"%s\" is not "
                       "supported (only Isolated)", behavior ? behavior : "(none)");
    if (flag(split, "invert", false))
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "tokenizer.json: Split with invert is not supported");
    const json_t *pattern = json_object_get(split, "pattern");
    const json_t *re = json_object_get(pattern, "Regex"), *lit = json_object_get(pattern, "String");
    if (json_is_string(re)) {
        char *pat = translate_regex(json_string_value(re), json_string_length(re));
        int rc = compile_regex(pat, strlen(pat), 0, &tok->split_re);
        free(pat);
        return rc;
    }
    if (json_is_string(lit))
        return compile_regex(json_string_value(lit), json_string_length(lit), PCRE2_LITERAL,
                             &tok->split_re);
    return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: Split pattern is neither Regex nor String");
}

static int check_byte_level(const json_t *bl, const char *where) {
    if (flag(bl, "add_prefix_space", false))
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "tokenizer.json: %s ByteLevel add_prefix_space is "
                       "not supported", where);
    if (flag(bl, "use_regex", true) && strcmp(where, "pre_tokenizer") == 0)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "tokenizer.json: pre_tokenizer ByteLevel use_regex "
                       "is not supported (use a Split pre-tokenizer)");
    return 0;
}

static int load_pre_tokenizer(cv_tokenizer *tok, const json_t *root) {
    const json_t *pre = json_object_get(root, "pre_tokenizer");
    const json_t *list = json_object_get(pre, "pretokenizers");
    const json_t *split = json_array_get(list, 0), *bl = json_array_get(list, 1);
    if (strcmp(type_of(pre), "Sequence") != 0 || json_array_size(list) != 2 ||
        strcmp(type_of(split), "Split") != 0 || strcmp(type_of(bl), "ByteLevel") != 0)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "tokenizer.json: pre_tokenizer must be "
                       "Sequence[Split, ByteLevel] (got %s)", type_of(pre));
    int rc = check_byte_level(bl, "pre_tokenizer");
    return rc ? rc : load_split(tok, split);
}

static int check_decoder(const json_t *root) {
    const json_t *dec = json_object_get(root, "decoder");
    if (strcmp(type_of(dec), "ByteLevel") != 0)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "tokenizer.json: decoder \"%s\" is not supported "
                       "(only ByteLevel)", type_of(dec));
    return 0;
}

/* ---- post-processor -------------------------------------------------------------------------- */

/* The ids gathered from the post-processors seen so far: those before the sequence and after it. */
typedef struct post_ids {
    int32_t *before, *after;
    size_t n_before, n_after;
} post_ids;

/* Inserts k ids at position `at` of the array *arr of *n. */
static void ids_insert(int32_t **arr, size_t *n, size_t at, const int32_t *ids, size_t k) {
    if (!k) return;
    *arr = cv_xrealloc(*arr, (*n + k) * sizeof **arr);
    memmove(*arr + at + k, *arr + at, (*n - at) * sizeof **arr);
    memcpy(*arr + at, ids, k * sizeof **arr);
    *n += k;
}

/* TemplateProcessing's single template into t: every SpecialToken piece's ids (all of them, as HF
 * adds them), before or after the one Sequence A. The pair template is never used (cvllm encodes one
 * sequence at a time). */
static int load_template(const cv_tokenizer *tok, const json_t *proc, post_ids *t) {
    const json_t *single = json_object_get(proc, "single");
    const json_t *specials = json_object_get(proc, "special_tokens");
    if (!json_is_array(single))
        return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: post_processor TemplateProcessing has no "
                       "\"single\" template");
    size_t n_seq = 0, i;
    json_t *piece;
    json_array_foreach(single, i, piece) {
        const json_t *seq = json_object_get(piece, "Sequence"), *sp = json_object_get(piece, "SpecialToken");
        if (json_is_object(seq)) {
            const char *id = json_string_value(json_object_get(seq, "id"));
            if (!id || strcmp(id, "A") != 0)
                return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: post_processor TemplateProcessing's "
                               "single template holds Sequence \"%s\" (only A)", id ? id : "(none)");
            n_seq++;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        if (!name)
            return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: post_processor TemplateProcessing's "
                           "single[%zu] is neither a Sequence nor a SpecialToken", i);
        const json_t *ids = json_object_get(json_object_get(specials, name), "ids");
        if (!json_is_array(ids))
            return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: post_processor TemplateProcessing "
                           "names special token \"%s\", which its special_tokens does not define",
                           name);
        size_t j;
        json_t *v;
        json_array_foreach(ids, j, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) >= tok->vocab_size)
                return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: post_processor special token "
                               "\"%s\": ids[%zu] is not an id of the vocabulary", name, j);
            const int32_t id = (int32_t)json_integer_value(v);
            if (n_seq) ids_insert(&t->after, &t->n_after, t->n_after, &id, 1);
            else ids_insert(&t->before, &t->n_before, t->n_before, &id, 1);
        }
    }
    if (n_seq != 1)
        return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: post_processor TemplateProcessing's single "
                       "template must hold Sequence A once (it does %zu times)", n_seq);
    return 0;
}

/* One post-processor, applied after those already in p (a Sequence runs its processors in order,
 * each on the previous one's output, so a later template wraps the earlier ones' result). */
static int load_processor(const cv_tokenizer *tok, const json_t *proc, post_ids *p) {
    const char *type = type_of(proc);
    if (strcmp(type, "ByteLevel") == 0) return 0; /* offsets only */
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(proc, "processors");
        if (!json_is_array(list))
            return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: post_processor Sequence has no "
                           "\"processors\" array");
        size_t i;
        json_t *v;
        json_array_foreach(list, i, v) {
            const int rc = load_processor(tok, v, p);
            if (rc) return rc;
        }
        return 0;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return cv_fail(CVLLM_ERR_UNSUPPORTED, "tokenizer.json: post_processor \"%s\" is not "
                       "supported (only TemplateProcessing, ByteLevel or a Sequence of them)", type);
    post_ids t = {0};
    const int rc = load_template(tok, proc, &t);
    if (!rc) {
        ids_insert(&p->before, &p->n_before, 0, t.before, t.n_before);
        ids_insert(&p->after, &p->n_after, p->n_after, t.after, t.n_after);
    }
    free(t.before);
    free(t.after);
    return rc;
}

/* Needs vocab_size (ids are checked against it). */
static int load_post_processor(cv_tokenizer *tok, const json_t *root) {
    const json_t *proc = json_object_get(root, "post_processor");
    if (!proc || json_is_null(proc)) return 0;
    post_ids p = {0};
    const int rc = load_processor(tok, proc, &p);
    if (!rc && p.n_before + p.n_after) {
        tok->post_ids = cv_xmalloc((p.n_before + p.n_after) * sizeof *tok->post_ids);
        if (p.n_before) memcpy(tok->post_ids, p.before, p.n_before * sizeof *p.before);
        if (p.n_after) memcpy(tok->post_ids + p.n_before, p.after, p.n_after * sizeof *p.after);
        tok->n_post_before = p.n_before;
        tok->n_post_after = p.n_after;
    }
    free(p.before);
    free(p.after);
    return rc;
}

/* \w as Rust's regex crate (and so HF's single_word check) defines it. */
static int compile_word_re(cv_tokenizer *tok) {
    for (size_t i = 0; i < tok->n_added; i++) {
        if (!tok->added[i].single_word) continue;
        static const char word[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";
        return compile_regex(word, sizeof word - 1, PCRE2_ANCHORED, &tok->word_re);
    }
    return 0;
}

/* ---- tokenizer_config.json ------------------------------------------------------------------- */

static int config_token(const json_t *cfg, const char *key, char **out) {
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return cv_fail(CVLLM_ERR_FORMAT, "tokenizer_config.json: \"%s\" is not a string", key);
    *out = cv_xstrdup(json_string_value(v));
    return 0;
}

static int load_config(cv_tokenizer *tok, const char *dir) {
    char *path = cv_xasprintf("%s/tokenizer_config.json", dir);
    json_t *cfg;
    int rc = load_json(path, false, &cfg);
    free(path);
    if (rc || !cfg) return rc;
    if (!json_is_object(cfg)) rc = cv_fail(CVLLM_ERR_FORMAT, "tokenizer_config.json: not an object");
    if (!rc) rc = config_token(cfg, "eos_token", &tok->eos_token);
    if (!rc) rc = config_token(cfg, "pad_token", &tok->pad_token);
    if (!rc) rc = config_token(cfg, "bos_token", &tok->bos_token);
    if (!rc) rc = config_token(cfg, "unk_token", &tok->unk_token);
    if (!rc) tok->config_json = json_dumps(cfg, JSON_COMPACT);
    json_decref(cfg);
    return rc;
}

/* ---- queries that need the alphabet ---------------------------------------------------------- */

int32_t cv_tokenizer_token_to_id(const cv_tokenizer *tok, const char *token) {
    size_t len = strlen(token);
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].len == len && memcmp(tok->added[i].content, token, len) == 0)
            return tok->added[i].id;
    int16_t char_byte[BYTE_CHAR_LIMIT];
    build_char_to_byte(char_byte);
    char *bytes = cv_xmalloc(len + 1);
    int32_t id = tok_vocab_find(tok, bytes, token_to_bytes(char_byte, token, len, bytes));
    free(bytes);
    return id;
}

/* ---- entry points ---------------------------------------------------------------------------- */

/* With tables from the cache: the text they came from had its vocab and merges emptied, and its
 * added tokens' ids are inside the cached tables. Anything else: a full load decides. */
static int check_cached(const cv_tokenizer *tok, const json_t *model, const json_t *added) {
    int32_t max_id = -1;
    size_t bytes = 0;
    if (json_object_size(json_object_get(model, "vocab")) || json_array_size(json_object_get(model, "merges")) ||
        check_added(added, &max_id, &bytes) || max_id >= tok->vocab_size)
        return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: the cached tables do not fit this file");
    return 0;
}

/* From tokenizer.json's root; `cached`: tok already holds the cache's tables and root is the text
 * with vocab and merges emptied (tok_cache.c). */
static int build(cv_tokenizer *tok, const json_t *root, bool cached) {
    if (!json_is_object(root)) return cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: not an object");
    const json_t *model = json_object_get(root, "model");
    const json_t *added = json_object_get(root, "added_tokens");
    if (!added || json_is_null(added)) added = json_array();
    else json_incref((json_t *)added);
    int rc = check_model_options(model);
    if (!rc && !json_is_array(added))
        rc = cv_fail(CVLLM_ERR_FORMAT, "tokenizer.json: added_tokens is not an array");
    if (!rc) rc = load_normalizer(tok, root);
    if (!rc) rc = load_pre_tokenizer(tok, root);
    if (!rc) rc = check_decoder(root);
    int16_t char_byte[BYTE_CHAR_LIMIT];
    build_char_to_byte(char_byte);
    size_t arena_bytes = 0, used = 0;
    if (cached) {
        if (!rc) rc = check_cached(tok, model, added);
    } else {
        if (!rc) rc = size_tables(tok, json_object_get(model, "vocab"), added, &arena_bytes);
        if (!rc) rc = load_vocab(tok, json_object_get(model, "vocab"), char_byte, &used);
        if (!rc) rc = load_merges(tok, json_object_get(model, "merges"), char_byte);
    }
    if (!rc) rc = load_added(tok, added, char_byte, cached ? NULL : &used);
    json_decref((json_t *)added);
    if (rc) return rc;
    assert(used <= arena_bytes);
    tok->ignore_merges = flag(model, "ignore_merges", false);
    build_added_set(&tok->raw_set, tok->added, tok->n_added, false);
    build_added_set(&tok->norm_set, tok->added, tok->n_added, true);
    rc = load_post_processor(tok, root);
    return rc ? rc : compile_word_re(tok);
}

int cv_tokenizer_check(const char *dir) {
    char *path = cv_xasprintf("%s/tokenizer.json", dir);
    FILE *f;
    const int rc = open_file(path, true, &f);
    if (f) fclose(f);
    free(path);
    return rc;
}

/* Through the cache's tables of this text when it has them: the rest of the file is parsed from a
 * copy with vocab and merges emptied (tok_cache.c). NULL when there are none or they do not fit the
 * text (then a full load decides). */
static cv_tokenizer *load_cached(const char *path, XXH128_hash_t key, const char *text, size_t len) {
    cv_tokenizer *tok = cv_xcalloc(1, sizeof *tok);
    if (!tok_cache_read(key, tok)) {
        free(tok);
        return NULL;
    }
    size_t rest_len;
    char *rest = tok_blank_tables(text, len, &rest_len);
    json_error_t err;
    json_t *root = rest ? json_loadb(rest, rest_len, JSON_ALLOW_NUL, &err) : NULL;
    const int rc = root ? build(tok, root, true) : CVLLM_ERR_FORMAT;
    json_decref(root);
    free(rest);
    if (!rc) return tok;
    cv_debug("tokenizer", "the cached tables of %s do not fit it: loading it whole", path);
    cv_tokenizer_free(tok);
    return NULL;
}

int cv_tokenizer_load(const char *dir, cv_tokenizer **out) {
    *out = NULL;
    char *path = cv_xasprintf("%s/tokenizer.json", dir);
    size_t len;
    const char *text = cv_map_file(path, &len);
    if (!text) {
        const int rc = cv_fail(errno == ENOENT ? CVLLM_ERR_NOT_FOUND : CVLLM_ERR_IO, "cannot open %s: %s", path,
                               strerror(errno));
        free(path);
        return rc;
    }
    const XXH128_hash_t key = tok_cache_key(text, len);
    cv_tokenizer *tok = load_cached(path, key, text, len);
    int rc = 0;
    if (!tok) {
        json_error_t err;
        json_t *root = json_loadb(text, len, JSON_ALLOW_NUL, &err);
        tok = cv_xcalloc(1, sizeof *tok);
        rc = root ? build(tok, root, false)
                  : cv_fail(CVLLM_ERR_FORMAT, "%s: line %d column %d: %s", path, err.line, err.column, err.text);
        json_decref(root);
        if (!rc) tok_cache_write(key, tok);
    }
    cv_unmap_file(text, len);
    free(path);
    if (!rc) rc = load_config(tok, dir);
    if (rc) {
        cv_tokenizer_free(tok);
        return rc;
    }
    *out = tok;
    return 0;
}

void cv_tokenizer_free(cv_tokenizer *tok) {
    if (!tok) return;
    if (tok->map) {
        cv_unmap_file(tok->map, tok->map_bytes);
    } else {
        free(tok->off);
        free(tok->len);
        free(tok->arena);
        free(tok->vocab_slots);
        free(tok->merge_slots);
    }
    free(tok->is_special);
    for (size_t i = 0; i < tok->n_added; i++) free(tok->added[i].content);
    free(tok->added);
    free(tok->raw_set.tokens);
    free(tok->norm_set.tokens);
    pcre2_code_free(tok->split_re);
    pcre2_code_free(tok->word_re);
    free(tok->eos_token);
    free(tok->pad_token);
    free(tok->bos_token);
    free(tok->unk_token);
    free(tok->config_json);
    free(tok->post_ids);
    free(tok);
}
