/*
 * tok_encode.c — text → ids, in Hugging Face's order:
 *
 *   raw text ──split on non-normalised added tokens──▶ gaps ──NFC──▶ split on normalised added tokens
 *     ──▶ gaps ──Split regex (Isolated: matches and the text between them are pieces)──▶ pieces
 *     ──byte-level BPE──▶ ids
 *
 * Added tokens are found leftmost-longest, as HF's Aho-Corasick does; the candidates are indexed by
 * first byte, so ordinary text costs one table probe per byte. Each gap is pre-tokenised on its own,
 * so the regex's lookahead never sees past an added token, as in HF.
 *
 * BPE works on raw bytes: every byte starts as its own symbol in a doubly linked list, candidate
 * merges of neighbours sit in a min-heap ordered by (rank, position), and a popped candidate is
 * applied only if both symbols are still the ones it was made from. That is HF's algorithm, so ties
 * resolve identically, and it is O(n log n) even for a pathological megabyte-long piece. No cache:
 * the tokenizer stays immutable and shareable between threads without locks.
 *
 * Input must be valid UTF-8 (checked once up front, then PCRE2 runs with NO_UTF_CHECK).
 *
 * That is add_special_tokens=False; the post-processor's ids (tok_load.c) are added to it apart.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utf8.h"
#include "tokenizer/tok_internal.h"

typedef struct bpe_sym {
    int32_t id;
    int32_t prev, next;    /* neighbours in the list, -1 at the ends */
    bool alive;
} bpe_sym;

typedef struct bpe_cand {
    int32_t rank, pos;     /* merge syms[pos] with its next symbol */
    int32_t left, right;   /* the ids the candidate was made from */
    int32_t merged;
} bpe_cand;

typedef struct encoder {
    const cv_tokenizer *tok;
    int32_t *ids;
    size_t n_ids, cap_ids;
    bpe_sym *syms;
    size_t cap_syms;
    bpe_cand *heap;
    size_t n_heap, cap_heap;
    pcre2_match_data *md;
    pcre2_match_context *mctx;  /* created only when the default JIT stack is too small */
    pcre2_jit_stack *jit_stack;
} encoder;

static void push_id(encoder *e, int32_t id) {
    if (e->n_ids == e->cap_ids) {
        e->cap_ids = e->cap_ids ? 2 * e->cap_ids : 256;
        e->ids = cv_xrealloc(e->ids, e->cap_ids * sizeof *e->ids);
    }
    e->ids[e->n_ids++] = id;
}

/* ---- BPE ------------------------------------------------------------------------------------- */

static bool cand_less(const bpe_cand *a, const bpe_cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(encoder *e, bpe_cand c) {
    if (e->n_heap == e->cap_heap) {
        e->cap_heap = e->cap_heap ? 2 * e->cap_heap : 64;
        e->heap = cv_xrealloc(e->heap, e->cap_heap * sizeof *e->heap);
    }
    size_t i = e->n_heap++;
    while (i > 0 && cand_less(&c, &e->heap[(i - 1) / 2])) {
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = c;
}

static bpe_cand heap_pop(encoder *e) {
    assert(e->n_heap > 0);
    bpe_cand top = e->heap[0], last = e->heap[--e->n_heap];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= e->n_heap) break;
        if (child + 1 < e->n_heap && cand_less(&e->heap[child + 1], &e->heap[child])) child++;
        if (!cand_less(&e->heap[child], &last)) break;
        e->heap[i] = e->heap[child];
        i = child;
    }
    if (e->n_heap > 0) e->heap[i] = last;
    return top;
}

static void consider_pair(encoder *e, int32_t pos) {
    if (pos < 0) return;
    int32_t next = e->syms[pos].next;
    if (next < 0) return;
    const tok_merge_slot *m = tok_merge_find(e->tok, e->syms[pos].id, e->syms[next].id);
    if (m) heap_push(e, (bpe_cand){m->rank, pos, e->syms[pos].id, e->syms[next].id, m->merged});
}

static bool still_valid(const encoder *e, const bpe_cand *c) {
    const bpe_sym *s = &e->syms[c->pos];
    return s->alive && s->id == c->left && s->next >= 0 && e->syms[s->next].id == c->right;
}

static void apply_merge(encoder *e, const bpe_cand *c) {
    bpe_sym *s = &e->syms[c->pos];
    bpe_sym *gone = &e->syms[s->next];
    s->id = c->merged;
    s->next = gone->next;
    if (gone->next >= 0) e->syms[gone->next].prev = c->pos;
    gone->alive = false;
}

static void bpe_piece(encoder *e, const char *s, size_t n) {
    const cv_tokenizer *tok = e->tok;
    if (n == 0) return;
    if (n == 1) {
        push_id(e, tok->byte_id[(uint8_t)s[0]]);
        return;
    }
    if (tok->ignore_merges) {
        int32_t whole = tok_vocab_find(tok, s, n);
        if (whole >= 0) {
            push_id(e, whole);
            return;
        }
    }
    if (n > e->cap_syms) {
        e->cap_syms = n;
        e->syms = cv_xrealloc(e->syms, n * sizeof *e->syms);
    }
    for (size_t i = 0; i < n; i++)
        e->syms[i] = (bpe_sym){tok->byte_id[(uint8_t)s[i]], (int32_t)i - 1,
                               i + 1 < n ? (int32_t)i + 1 : -1, true};
    e->n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++) consider_pair(e, (int32_t)i);
    while (e->n_heap > 0) {
        bpe_cand c = heap_pop(e);
        if (!still_valid(e, &c)) continue;
        apply_merge(e, &c);
        consider_pair(e, e->syms[c.pos].prev);
        consider_pair(e, c.pos);
    }
    for (int32_t i = 0; i >= 0; i = e->syms[i].next) push_id(e, e->syms[i].id);
}

/* ---- pre-tokenizer --------------------------------------------------------------------------- */

static int match_at(encoder *e, const char *s, size_t len, size_t off) {
    int rc = pcre2_match(e->tok->split_re, (PCRE2_SPTR)s, len, off, PCRE2_NO_UTF_CHECK, e->md,
                         e->mctx);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !e->jit_stack) {
        /* Deeply backtracking input: give JIT a larger stack, once per encode call. */
        e->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
        e->mctx = pcre2_match_context_create(NULL);
        if (!e->jit_stack || !e->mctx)
            return cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate a regex stack");
        pcre2_jit_stack_assign(e->mctx, NULL, e->jit_stack);
        rc = pcre2_match(e->tok->split_re, (PCRE2_SPTR)s, len, off, PCRE2_NO_UTF_CHECK, e->md,
                         e->mctx);
    }
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return cv_fail(CVLLM_ERR_INTERNAL, "pre-tokenizer regex failed at byte %zu: %s", off,
                       (const char *)msg);
    }
    return rc;
}

static size_t utf8_char_len(const char *s, size_t len) {
    uint32_t cp;
    size_t n;
    cv_utf8_decode(s, len, &cp, &n);
    return n;
}

static int pre_tokenize(encoder *e, const char *s, size_t len) {
    size_t pos = 0, off = 0;
    const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
    while (off < len) {
        int rc = match_at(e, s, len, off);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return rc;
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* an empty match splits nothing; step over one character */
            off = ms + utf8_char_len(s + ms, len - ms);
            continue;
        }
        bpe_piece(e, s + pos, ms - pos);
        bpe_piece(e, s + ms, me - ms);
        pos = off = me;
    }
    bpe_piece(e, s + pos, len - pos);
    return 0;
}

/* ---- added tokens ---------------------------------------------------------------------------- */

typedef int (*gap_fn)(encoder *e, const char *s, size_t len);

/* The added token that starts at s[i], longest first; NULL when none. */
static const tok_added *added_at(const tok_added_set *set, const char *s, size_t len, size_t i) {
    uint8_t b = (uint8_t)s[i];
    for (uint32_t k = set->first[b]; k < set->first[b + 1]; k++) {
        const tok_added *t = set->tokens[k];
        if (t->len <= len - i && memcmp(s + i, t->content, t->len) == 0) return t;
    }
    return NULL;
}

static size_t prev_char_start(const char *s, size_t i) {
    assert(i > 0);
    do i--;
    while (i > 0 && ((uint8_t)s[i] & 0xC0) == 0x80);
    return i;
}

/* Whether the one character s[0..len) is a \w character (match data: the shared one is not in use
 * while added tokens are being found). */
static bool is_word_char(encoder *e, const char *s, size_t len) {
    return pcre2_match(e->tok->word_re, (PCRE2_SPTR)s, len, 0, PCRE2_NO_UTF_CHECK, e->md, NULL) >= 0;
}

static bool whole_word(encoder *e, const char *s, size_t len, size_t start, size_t stop) {
    if (start > 0) {
        size_t p = prev_char_start(s, start);
        if (is_word_char(e, s + p, start - p)) return false;
    }
    return stop == len || !is_word_char(e, s + stop, utf8_char_len(s + stop, len - stop));
}

static size_t strip_left(const char *s, size_t start, size_t floor) {
    while (start > floor) {
        size_t p = prev_char_start(s, start);
        uint32_t cp;
        size_t n;
        if (cv_utf8_decode(s + p, start - p, &cp, &n) != CV_UTF8_OK || !cv_unicode_is_white_space(cp))
            break;
        start = p;
    }
    return start < floor ? floor : start;
}

static size_t strip_right(const char *s, size_t len, size_t stop) {
    while (stop < len) {
        uint32_t cp;
        size_t n;
        if (cv_utf8_decode(s + stop, len - stop, &cp, &n) != CV_UTF8_OK ||
            !cv_unicode_is_white_space(cp))
            break;
        stop += n;
    }
    return stop;
}

/* Emits added tokens of `set` found in s and hands the text between them to `gap`. */
static int split_added(encoder *e, const tok_added_set *set, const char *s, size_t len, gap_fn gap) {
    if (set->n == 0) return gap(e, s, len);
    size_t done = 0; /* s[0..done) has been emitted */
    for (size_t i = 0; i < len;) {
        const tok_added *t = added_at(set, s, len, i);
        if (!t) {
            i++;
            continue;
        }
        size_t start = i, stop = i + t->len;
        if (t->single_word && !whole_word(e, s, len, start, stop)) {
            i = stop; /* HF's matcher does not look for overlapping matches either */
            continue;
        }
        if (t->lstrip) start = strip_left(s, start, done);
        if (t->rstrip) stop = strip_right(s, len, stop);
        if (start > done) {
            int rc = gap(e, s + done, start - done);
            if (rc) return rc;
        }
        push_id(e, t->id);
        done = i = stop;
    }
    return done < len ? gap(e, s + done, len - done) : 0;
}

static int after_normalization(encoder *e, const char *s, size_t len) {
    return split_added(e, &e->tok->norm_set, s, len, pre_tokenize);
}

static bool is_ascii(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if ((uint8_t)s[i] >= 0x80) return false;
    return true;
}

static int normalize_gap(encoder *e, const char *s, size_t len) {
    if (!e->tok->nfc || is_ascii(s, len)) return after_normalization(e, s, len);
    char *norm;
    size_t norm_len;
    int rc = tok_nfc(s, len, &norm, &norm_len);
    if (!rc) rc = after_normalization(e, norm, norm_len);
    free(norm);
    return rc;
}

/* ---- entry point ----------------------------------------------------------------------------- */

int cv_tokenizer_encode(const cv_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                        size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len > 0) return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "text is NULL");
    size_t bad;
    if (len > 0 && !cv_utf8_validate(text, len, &bad))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "invalid UTF-8 at byte offset %zu (0x%02x)",
                       bad, (uint8_t)text[bad]);
    encoder e = {.tok = tok};
    e.md = pcre2_match_data_create_from_pattern(tok->split_re, NULL);
    if (!e.md) return cv_fail(CVLLM_ERR_NO_MEMORY, "cannot allocate regex match data");
    int rc = len > 0 ? split_added(&e, &tok->raw_set, text, len, normalize_gap) : 0;
    pcre2_match_data_free(e.md);
    pcre2_match_context_free(e.mctx);
    pcre2_jit_stack_free(e.jit_stack);
    free(e.syms);
    free(e.heap);
    if (rc) {
        free(e.ids);
        return rc;
    }
    *ids = e.ids ? e.ids : cv_xmalloc(sizeof **ids);
    *n_ids = e.n_ids;
    return 0;
}

int cv_tokenizer_add_special_tokens(const cv_tokenizer *tok, int32_t **ids, size_t *n_ids) {
    if (!tok || !ids || !n_ids || (!*ids && *n_ids))
        return cv_fail(CVLLM_ERR_INVALID_ARGUMENT, "cv_tokenizer_add_special_tokens: NULL argument");
    const size_t before = tok->n_post_before, after = tok->n_post_after, n = *n_ids;
    if (!before && !after) return 0;
    int32_t *out = cv_xrealloc(*ids, (before + n + after) * sizeof *out);
    if (n) memmove(out + before, out, n * sizeof *out);
    memcpy(out, tok->post_ids, before * sizeof *out);
    memcpy(out + before + n, tok->post_ids + before, after * sizeof *out);
    *ids = out;
    *n_ids = before + n + after;
    return 0;
}

size_t cv_tokenizer_num_special_tokens_to_add(const cv_tokenizer *tok) {
    return tok->n_post_before + tok->n_post_after;
}
