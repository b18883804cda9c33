/*
 * tokenizer.h — Hugging Face byte-level BPE (Qwen2Tokenizer) from tokenizer.json.
 *
 * Encode = added/special tokens matched first (longest match at each position), then for each span
 * between them: NFC normalisation, the Split pre-tokenizer regex (PCRE2, UTF + UCP, JIT), byte-level
 * mapping, and BPE merges by rank. Decode maps tokens back to bytes. cv_detok turns a growing list of
 * ids into text deltas without ever emitting half a UTF-8 character.
 *
 * The public handle of cvllm.h is this object: a cvllm_tokenizer * is a cv_tokenizer * (api.c casts,
 * and the engine may hand its own cv_tokenizer out as a cvllm_tokenizer the same way). A loaded
 * tokenizer is immutable, so encode/decode may run on many threads at once.
 */
#ifndef CV_TOKENIZER_H
#define CV_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cv_tokenizer cv_tokenizer;

/* Reads DIR/tokenizer.json and (optionally) DIR/tokenizer_config.json. */
int cv_tokenizer_load(const char *dir, cv_tokenizer **out);
/* The error cv_tokenizer_load would give for DIR/tokenizer.json not being there, without reading it. */
int cv_tokenizer_check(const char *dir);
void cv_tokenizer_free(cv_tokenizer *tok);

/* *ids is cv_xmalloc'd. Invalid UTF-8 is CVLLM_ERR_INVALID_ARGUMENT naming the byte offset. */
int cv_tokenizer_encode(const cv_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                        size_t *n_ids);
/* cv_tokenizer_encode is Hugging Face's encode with add_special_tokens=False. These give the rest of
 * add_special_tokens=True: the ids tokenizer.json's post_processor puts around one sequence
 * (TemplateProcessing's single template, e.g. the <|endoftext|> Qwen3-Embedding appends and pools
 * on); a tokenizer without one (none, or ByteLevel as in Qwen3's) adds none. Other post-processors
 * are refused at load, so a loaded tokenizer never silently leaves ids out.
 * Grows *ids (cv_xmalloc'd, *n_ids long; NULL when *n_ids is 0) in place: the template's ids before
 * the sequence are prepended, those after it appended. CVLLM_ERR_INVALID_ARGUMENT for NULL
 * arguments, else 0. */
int cv_tokenizer_add_special_tokens(const cv_tokenizer *tok, int32_t **ids, size_t *n_ids);
/* How many ids cv_tokenizer_add_special_tokens adds (HF's num_special_tokens_to_add(pair=False)),
 * e.g. to leave room for them when truncating to a context length. */
size_t cv_tokenizer_num_special_tokens_to_add(const cv_tokenizer *tok);
/* *text is cv_xmalloc'd and NUL-terminated; invalid UTF-8 from partial tokens becomes U+FFFD.
 * An id outside [0, vocab_size) is CVLLM_ERR_INVALID_ARGUMENT; an id inside it that names no token
 * decodes to nothing (as in HF). */
int cv_tokenizer_decode(const cv_tokenizer *tok, const int32_t *ids, size_t n_ids,
                        bool skip_special_tokens, char **text, size_t *len);

int32_t cv_tokenizer_vocab_size(const cv_tokenizer *tok);   /* max id + 1 */
bool cv_tokenizer_is_special(const cv_tokenizer *tok, int32_t id);
/* Id of an exact token string (added or base vocabulary), -1 when none. */
int32_t cv_tokenizer_token_to_id(const cv_tokenizer *tok, const char *token);
/* Raw bytes of one token (after byte-level decoding); NULL for an unknown id. */
const char *cv_tokenizer_id_to_bytes(const cv_tokenizer *tok, int32_t id, size_t *len);
/* The token's string as transformers' convert_ids_to_tokens gives it: an added token's content, else
 * the vocabulary's byte-level spelling ("Ġworld" for " world", "Ċ" for "\n"). cv_xmalloc'd; NULL for
 * an unknown id. */
char *cv_tokenizer_id_to_token(const cv_tokenizer *tok, int32_t id);
/* tokenizer_config.json's eos_token / pad_token / bos_token / unk_token strings, NULL when absent.
 * `which` is the key ("eos_token") or its short form ("eos"). */
const char *cv_tokenizer_special_string(const cv_tokenizer *tok, const char *which);
/* tokenizer_config.json's object as compact JSON text, NULL when the folder has none. */
const char *cv_tokenizer_config_json(const cv_tokenizer *tok);

/* Incremental detokenizer: feed ids one at a time, get the text that became final. */
typedef struct cv_detok {
    const cv_tokenizer *tok;
    bool skip_special_tokens;
    char *pending;        /* bytes not yet emitted (an incomplete UTF-8 sequence) */
    size_t n_pending, cap_pending;
} cv_detok;

void cv_detok_init(cv_detok *d, const cv_tokenizer *tok, bool skip_special_tokens);
/* Appends the text completed by `id` to *out (a growing cv_xrealloc'd buffer of *out_len bytes,
 * kept NUL-terminated) and returns the number of bytes appended. Ids that name no token are
 * ignored. The deltas plus the flush concatenate to exactly cv_tokenizer_decode() of all ids. */
size_t cv_detok_push(cv_detok *d, int32_t id, char **out, size_t *out_len, size_t *out_cap);
/* Flushes what is pending at the end of a sequence (incomplete bytes become U+FFFD). */
size_t cv_detok_flush(cv_detok *d, char **out, size_t *out_len, size_t *out_cap);
void cv_detok_free(cv_detok *d);

#endif
