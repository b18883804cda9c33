/*
 * tok_decode.c — ids → text, whole or incrementally, plus the small per-id queries.
 *
 * Decoding concatenates each token's raw bytes (added tokens included, unless skipped as special)
 * and repairs the result as Rust's String::from_utf8_lossy does, which is what HF returns. The
 * incremental detokenizer runs the very same repair over a sliding window: it keeps back only a
 * valid-but-unfinished UTF-8 sequence at the end (at most 3 bytes), so the deltas it emits are
 * always whole characters and their concatenation (plus the flush) equals the one-shot decode.
 *
 * Ids inside [0, vocab_size) that name no token (a hole between the base and added vocabularies)
 * decode to nothing, as in HF; ids outside that range are an error for decode and are ignored by
 * the detokenizer, whose push has no error path (a sampler never produces them).
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utf8.h"
#include "tokenizer/tok_internal.h"

static bool in_range(const cv_tokenizer *tok, int32_t id) {
    return id >= 0 && id < tok->vocab_size;
}

int32_t cv_tokenizer_vocab_size(const cv_tokenizer *tok) { return tok->vocab_size; }

bool cv_tokenizer_is_special(const cv_tokenizer *tok, int32_t id) {
    return in_range(tok, id) && tok->is_special[id];
}

const char *cv_tokenizer_id_to_bytes(const cv_tokenizer *tok, int32_t id, size_t *len) {
    if (!in_range(tok, id) || tok->len[id] < 0) return NULL;
    *len = (size_t)tok->len[id];
    return tok->arena + tok->off[id];
}

/* The byte-level alphabet's character for byte b (GPT-2's bytes_to_unicode): printable bytes stand for
 * themselves, the 68 others for U+0100.. in byte order (tok_load.c reads the same table backwards). */
static uint32_t byte_char(unsigned char b) {
    if (b <= 0x20) return 0x100 + b;
    if (b >= 0x7F && b <= 0xA0) return 0x121 + (b - 0x7F);
    if (b == 0xAD) return 0x143;
    return b;
}

char *cv_tokenizer_id_to_token(const cv_tokenizer *tok, int32_t id) {
    for (size_t i = 0; i < tok->n_added; i++) /* HF looks added tokens up before the model */
        if (tok->added[i].id == id) return cv_xstrndup(tok->added[i].content, tok->added[i].len);
    size_t n;
    const char *bytes = cv_tokenizer_id_to_bytes(tok, id, &n);
    if (!bytes) return NULL;
    char *out = cv_xmalloc(2 * n + 1), *w = out; /* every alphabet character is below U+0800 */
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = byte_char((unsigned char)bytes[i]);
        if (cp < 0x80) {
            *w++ = (char)cp;
        } else {
            *w++ = (char)(0xC0 | (cp >> 6));
            *w++ = (char)(0x80 | (cp & 0x3F));
        }
    }
    *w = '\0';
    return out;
}

const char *cv_tokenizer_config_json(const cv_tokenizer *tok) { return tok->config_json; }

const char *cv_tokenizer_special_string(const cv_tokenizer *tok, const char *which) {
    static const char suffix[] = "_token";
    size_t n = strlen(which), k = sizeof suffix - 1;
    if (n > k && strcmp(which + n - k, suffix) == 0) n -= k;
    if (n == 3 && strncmp(which, "eos", 3) == 0) return tok->eos_token;
    if (n == 3 && strncmp(which, "pad", 3) == 0) return tok->pad_token;
    if (n == 3 && strncmp(which, "bos", 3) == 0) return tok->bos_token;
    if (n == 3 && strncmp(which, "unk", 3) == 0) return tok->unk_token;
    return NULL;
}

/* The bytes id contributes to decoded text: none when skipped, unknown or out of range. */
static const char *visible_bytes(const cv_tokenizer *tok, int32_t id, bool skip_special,
                                 size_t *len) {
    if (!in_range(tok, id) || tok->len[id] < 0 || (skip_special && tok->is_special[id])) return NULL;
    *len = (size_t)tok->len[id];
    return tok->arena + tok->off[id];
}

int cv_tokenizer_decode(const cv_tokenizer *tok, const int32_t *ids, size_t n_ids,
                        bool skip_special_tokens, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    if (!ids && n_ids > 0) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "ids is NULL");
    char *raw = NULL;
    size_t n_raw = 0, cap_raw = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (!in_range(tok, ids[i])) {
            free(raw);
            return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "token id %d at position %zu is out of "
                           "range (vocabulary size %d)", ids[i], i, tok->vocab_size);
        }
        size_t n;
        const char *bytes = visible_bytes(tok, ids[i], skip_special_tokens, &n);
        if (bytes) cv_buf_append(&raw, &n_raw, &cap_raw, bytes, n);
    }
    char *out = NULL;
    size_t n_out = 0, cap_out = 0;
    cv_utf8_lossy_append(raw ? raw : "", n_raw, true, &out, &n_out, &cap_out);
    free(raw);
    *text = out;
    *len = n_out;
    return 0;
}

/* ---- incremental detokenizer ----------------------------------------------------------------- */

void cv_detok_init(cv_detok *d, const cv_tokenizer *tok, bool skip_special_tokens) {
    *d = (cv_detok){.tok = tok, .skip_special_tokens = skip_special_tokens};
}

size_t cv_detok_push(cv_detok *d, int32_t id, char **out, size_t *out_len, size_t *out_cap) {
    size_t n, before = *out_len;
    const char *bytes = visible_bytes(d->tok, id, d->skip_special_tokens, &n);
    if (bytes) cv_buf_append(&d->pending, &d->n_pending, &d->cap_pending, bytes, n);
    size_t used = cv_utf8_lossy_append(d->pending ? d->pending : "", d->n_pending, false, out,
                                       out_len, out_cap);
    if (used < d->n_pending) memmove(d->pending, d->pending + used, d->n_pending - used);
    d->n_pending -= used;
    return *out_len - before;
}

size_t cv_detok_flush(cv_detok *d, char **out, size_t *out_len, size_t *out_cap) {
    size_t before = *out_len;
    cv_utf8_lossy_append(d->pending ? d->pending : "", d->n_pending, true, out, out_len, out_cap);
    d->n_pending = 0;
    return *out_len - before;
}

void cv_detok_free(cv_detok *d) {
    free(d->pending);
    d->pending = NULL;
    d->n_pending = d->cap_pending = 0;
}
