/*
 * test_tokenizer.c — the tokenizer against Hugging Face and against itself.
 *
 *   - every case of tests/data/tokenizer/qwen3-cases.jsonl (ids from HF's tokenizer): exact ids,
 *     exact decode, decode == NFC(text), and the incremental detokenizer's deltas;
 *   - round trips decode(encode(x)) == NFC(x) on seeded random Unicode strings;
 *   - details HF defines: leftmost-longest added tokens, special flags on decode, lossy repair,
 *     Oniguruma's \s, megabyte-long pieces;
 *   - every error path of load / encode / decode, checking the message. Load errors use a small
 *     tokenizer cut out of the real one (ids < 1000) and altered one field at a time.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

#include "base/error.h"
#include "base/utf8.h"
#include "check.h"
#include "loader/fileutil.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#define QWEN_DIR CVLLM_SOURCE_DIR "/models/qwen3-tokenizer"
#define CASES CVLLM_TEST_DATA "/tokenizer/qwen3-cases.jsonl"

static cv_tokenizer *qwen;

/* ---- helpers --------------------------------------------------------------------------------- */

static char *nfc(const char *s, size_t len, size_t *out_len) {
    utf8proc_uint8_t *out = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &out,
                                      UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    if (n < 0) return NULL;
    *out_len = (size_t)n;
    return (char *)out;
}

static bool ids_equal(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", label);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fputc('\n', stderr);
}

/* encode(text) must be exactly `want`. */
static void check_encode(const cv_tokenizer *tok, const char *text, size_t len, const int32_t *want,
                         size_t n_want) {
    int32_t *ids;
    size_t n;
    int rc = cv_tokenizer_encode(tok, text, len, &ids, &n);
    CHECK_MSG(rc == 0, "encode failed: %s", cv_error_message());
    bool same = rc == 0 && ids_equal(ids, n, want, n_want);
    CHECK_MSG(same, "encode(\"%.*s\") differs", (int)(len > 60 ? 60 : len), text);
    if (!same && rc == 0) {
        print_ids("got ", ids, n);
        print_ids("want", want, n_want);
    }
    free(ids);
}

static int32_t *encode_ok(const cv_tokenizer *tok, const char *text, size_t *n) {
    int32_t *ids;
    int rc = cv_tokenizer_encode(tok, text, strlen(text), &ids, n);
    CHECK_MSG(rc == 0, "encode(\"%s\"): %s", text, cv_error_message());
    return ids;
}

static char *decode_ok(const cv_tokenizer *tok, const int32_t *ids, size_t n, bool skip,
                       size_t *len) {
    char *text;
    int rc = cv_tokenizer_decode(tok, ids, n, skip, &text, len);
    CHECK_MSG(rc == 0, "decode: %s", cv_error_message());
    return text;
}

/* Feeds ids one by one; every delta must be valid UTF-8 and all of them together the decode. */
static void check_detok(const cv_tokenizer *tok, const int32_t *ids, size_t n, bool skip,
                        const char *want, size_t want_len) {
    cv_detok d;
    cv_detok_init(&d, tok, skip);
    char *out = NULL;
    size_t len = 0, cap = 0;
    bool deltas_valid = true;
    for (size_t i = 0; i < n; i++) {
        size_t before = len, added = cv_detok_push(&d, ids[i], &out, &len, &cap);
        deltas_valid &= added == len - before && cv_utf8_validate(out + before, added, NULL);
    }
    cv_detok_flush(&d, &out, &len, &cap);
    cv_detok_free(&d);
    CHECK(deltas_valid);
    CHECK_MSG(len == want_len && memcmp(out, want, len) == 0, "detok \"%s\" != \"%s\"", out, want);
    free(out);
}

static json_t *read_cases(void) {
    FILE *f = fopen(CASES, "r");
    CHECK_MSG(f != NULL, "cannot open %s", CASES);
    json_t *cases = json_array();
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while (f && (n = getline(&line, &cap, f)) > 0) {
        json_error_t err;
        json_t *c = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &err);
        CHECK_MSG(c != NULL, "%s: %s", CASES, err.text);
        if (c) json_array_append_new(cases, c);
    }
    free(line);
    if (f) fclose(f);
    return cases;
}

static int32_t *json_ids(const json_t *arr, size_t *n) {
    *n = json_array_size(arr);
    int32_t *ids = cv_xmalloc((*n ? *n : 1) * sizeof *ids);
    for (size_t i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    return ids;
}

/* ---- reference cases ------------------------------------------------------------------------- */

static void reference_cases(const cv_tokenizer *tok) {
    json_t *cases = read_cases();
    CHECK_EQ_INT(json_array_size(cases), 400);
    size_t exact = 0, i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const json_t *jt = json_object_get(c, "text"), *jd = json_object_get(c, "decoded");
        const char *text = json_string_value(jt), *decoded = json_string_value(jd);
        size_t text_len = json_string_length(jt), decoded_len = json_string_length(jd), n_want;
        int32_t *want = json_ids(json_object_get(c, "ids"), &n_want);
        int before = cv_checks_failed;
        check_encode(tok, text, text_len, want, n_want);
        size_t len;
        char *got = decode_ok(tok, want, n_want, false, &len);
        CHECK_MSG(got && len == decoded_len && memcmp(got, decoded, len) == 0,
                  "case %zu: decode \"%s\" != \"%s\"", i, got, decoded);
        size_t norm_len;
        char *norm = nfc(text, text_len, &norm_len);
        CHECK_MSG(norm && norm_len == len && memcmp(norm, got, len) == 0,
                  "case %zu: decode(encode(x)) != NFC(x)", i);
        check_detok(tok, want, n_want, false, decoded, decoded_len);
        free(norm);
        free(got);
        free(want);
        if (cv_checks_failed == before) exact++;
    }
    printf("reference cases: %zu/%zu exact\n", exact, json_array_size(cases));
    json_decref(cases);
}

static void test_reference_cases(void) { reference_cases(qwen); }

/* ---- random round trips ---------------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng_next(void) { /* splitmix64: seeded, so every run tests the same strings */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Code point ranges that stress each stage: the regex classes, NFC composition, BPE over
 * multi-byte characters, and text around added tokens. */
static const uint32_t ranges[][2] = {
    {0x20, 0x7E},     {0x09, 0x0D},     {0xA0, 0x17F},    {0x300, 0x36F},  /* combining */
    {0x391, 0x3C9},   {0x410, 0x44F},   {0x5D0, 0x5EA},   {0x627, 0x64A},
    {0x900, 0x97F},   {0xE00, 0xE5B},   {0x1100, 0x1112}, {0x1161, 0x1175}, /* Hangul jamo */
    {0x2000, 0x206F}, {0x3000, 0x30FF}, {0x4E00, 0x9FFF}, {0xAC00, 0xD7A3},
    {0xFF01, 0xFF5E}, {0x1F300, 0x1F6FF}, {0x1F900, 0x1F9FF}, {0x10000, 0x1FFFF},
    {0x85, 0x85},     {0x180E, 0x180E}, {0xFEFF, 0xFEFF}, {0x0, 0x1F},
};

static size_t random_text(char *buf, size_t max_chars) {
    static const char *const inserts[] = {"<|im_start|>", "<|im_end|>", "<think>", "</think>",
                                          "'s", "'LL", "  ", "\r\n", "<|im_end", "123456"};
    size_t n = 0, chars = rng_next() % max_chars;
    for (size_t i = 0; i < chars; i++) {
        if (rng_next() % 16 == 0) {
            const char *s = inserts[rng_next() % CV_ARRAY_LEN(inserts)];
            memcpy(buf + n, s, strlen(s));
            n += strlen(s);
            continue;
        }
        const uint32_t *r = ranges[rng_next() % CV_ARRAY_LEN(ranges)];
        uint32_t cp = r[0] + (uint32_t)(rng_next() % (r[1] - r[0] + 1));
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
        n += cv_utf8_encode(cp, buf + n);
    }
    return n;
}

static void test_random_round_trips(void) {
    rng_state = 1234;
    char buf[64 * 16];
    int failures = 0;
    for (int iter = 0; iter < 3000 && failures < 5; iter++) {
        size_t len = random_text(buf, 64), n, out_len, norm_len;
        int32_t *ids;
        int rc = cv_tokenizer_encode(qwen, buf, len, &ids, &n);
        CHECK_MSG(rc == 0, "random %d: %s", iter, cv_error_message());
        if (rc) continue;
        char *out = decode_ok(qwen, ids, n, false, &out_len);
        char *norm = nfc(buf, len, &norm_len);
        bool same = norm && out && out_len == norm_len && memcmp(out, norm, out_len) == 0;
        CHECK_MSG(same, "random %d: round trip of \"%.*s\" gave \"%s\"", iter, (int)len, buf, out);
        failures += !same;
        check_detok(qwen, ids, n, false, out, out_len);
        free(norm);
        free(out);
        free(ids);
    }
}

/* ---- behaviour HF defines -------------------------------------------------------------------- */

static void test_queries(void) {
    CHECK_EQ_INT(cv_tokenizer_vocab_size(qwen), 151669);
    CHECK_EQ_INT(cv_tokenizer_token_to_id(qwen, "<|im_end|>"), 151645);
    CHECK_EQ_INT(cv_tokenizer_token_to_id(qwen, "<think>"), 151667);
    CHECK_EQ_INT(cv_tokenizer_token_to_id(qwen, "ĠĠ"), 256);
    CHECK_EQ_INT(cv_tokenizer_token_to_id(qwen, "Hello"), 9707);
    CHECK_EQ_INT(cv_tokenizer_token_to_id(qwen, "no such token at all"), -1);
    CHECK(cv_tokenizer_is_special(qwen, 151645));
    CHECK(!cv_tokenizer_is_special(qwen, 151667)); /* <think> is special=false in Qwen3 */
    CHECK(!cv_tokenizer_is_special(qwen, 9707));
    CHECK(!cv_tokenizer_is_special(qwen, -1));
    CHECK(!cv_tokenizer_is_special(qwen, 151669));
    size_t len = 0;
    const char *b = cv_tokenizer_id_to_bytes(qwen, 256, &len);
    CHECK(b && len == 2 && memcmp(b, "  ", 2) == 0);
    CHECK(cv_tokenizer_id_to_bytes(qwen, 151669, &len) == NULL);
    CHECK(cv_tokenizer_id_to_bytes(qwen, -5, &len) == NULL);
    CHECK_STR_EQ(cv_tokenizer_special_string(qwen, "eos_token"), "<|im_end|>");
    CHECK_STR_EQ(cv_tokenizer_special_string(qwen, "eos"), "<|im_end|>");
    CHECK_STR_EQ(cv_tokenizer_special_string(qwen, "pad_token"), "<|endoftext|>");
    CHECK(cv_tokenizer_special_string(qwen, "bos_token") == NULL);
    CHECK(cv_tokenizer_special_string(qwen, "whatever") == NULL);
}

static void test_special_tokens(void) {
    const char *text = "<|im_start|>user\n<think>hi</think><tool_call>x</tool_call><|im_end|>";
    size_t n, len;
    int32_t *ids = encode_ok(qwen, text, &n);
    CHECK(n > 0 && ids[0] == 151644 && ids[n - 1] == 151645);
    char *all = decode_ok(qwen, ids, n, false, &len);
    CHECK_STR_EQ(all, text);
    char *kept = decode_ok(qwen, ids, n, true, &len);
    CHECK_STR_EQ(kept, "user\n<think>hi</think><tool_call>x</tool_call>");
    check_detok(qwen, ids, n, true, kept, strlen(kept));
    free(all);
    free(kept);
    free(ids);
    /* Leftmost-longest: an unfinished special token is ordinary text. */
    int32_t *partial = encode_ok(qwen, "<|im_end", &n);
    CHECK(n > 1);
    for (size_t i = 0; i < n; i++) CHECK(partial[i] < 151643);
    free(partial);
    /* Special tokens are matched before NFC and split the text for the regex. */
    int32_t *a = encode_ok(qwen, "a<|im_end|>\xcc\x81", &n);
    CHECK(n == 3 && a[0] == cv_tokenizer_token_to_id(qwen, "a") && a[1] == 151645);
    free(a);
}

static void test_lossy_decode(void) {
    int32_t e0 = cv_tokenizer_token_to_id(qwen, "à");        /* byte 0xE0 */
    int32_t x80 = cv_tokenizer_token_to_id(qwen, "Ģ");       /* byte 0x80 */
    int32_t f0 = cv_tokenizer_token_to_id(qwen, "ð"), x9f = cv_tokenizer_token_to_id(qwen, "Ł");
    int32_t x98 = cv_tokenizer_token_to_id(qwen, "ĺ"), A = cv_tokenizer_token_to_id(qwen, "A");
    CHECK(e0 >= 0 && x80 >= 0 && f0 >= 0 && x9f >= 0 && x98 >= 0 && A >= 0);
    struct {
        int32_t ids[4];
        size_t n;
        const char *want;
    } cases[] = {
        {{e0, A}, 2, "\xEF\xBF\xBD" "A"},
        {{e0, x80}, 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},        /* E0 80: overlong, two subparts */
        {{f0, x9f, x98}, 3, "\xEF\xBF\xBD"},               /* truncated at the end: one U+FFFD */
        {{f0, x9f, x98, A}, 4, "\xEF\xBF\xBD" "A"},
        {{x80, x80}, 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},
    };
    for (size_t i = 0; i < CV_ARRAY_LEN(cases); i++) {
        size_t len;
        char *got = decode_ok(qwen, cases[i].ids, cases[i].n, false, &len);
        CHECK_STR_EQ(got, cases[i].want);
        check_detok(qwen, cases[i].ids, cases[i].n, false, cases[i].want, strlen(cases[i].want));
        free(got);
    }
}

static void test_detok_holds_partial_characters(void) {
    size_t n;
    int32_t *ids = encode_ok(qwen, "\xF0\x9F\xAB\xA0", &n); /* 🫠 is three tokens in Qwen3 */
    CHECK(n >= 2);
    cv_detok d;
    cv_detok_init(&d, qwen, false);
    char *out = NULL;
    size_t len = 0, cap = 0;
    CHECK_EQ_INT(cv_detok_push(&d, ids[0], &out, &len, &cap), 0);
    CHECK_EQ_INT(d.n_pending > 0, 1);
    size_t total = 0;
    for (size_t i = 1; i < n; i++) total += cv_detok_push(&d, ids[i], &out, &len, &cap);
    CHECK_EQ_INT(total, 4);
    CHECK_STR_EQ(out, "\xF0\x9F\xAB\xA0");
    CHECK_EQ_INT(cv_detok_flush(&d, &out, &len, &cap), 0);
    /* A dangling partial character becomes U+FFFD at the flush, and unknown ids are ignored. */
    CHECK_EQ_INT(cv_detok_push(&d, ids[0], &out, &len, &cap), 0);
    CHECK_EQ_INT(cv_detok_push(&d, 999999, &out, &len, &cap), 0);
    CHECK_EQ_INT(cv_detok_push(&d, -1, &out, &len, &cap), 0);
    CHECK_EQ_INT(cv_detok_flush(&d, &out, &len, &cap), 3);
    CHECK_STR_EQ(out, "\xF0\x9F\xAB\xA0\xEF\xBF\xBD");
    cv_detok_free(&d);
    free(out);
    free(ids);
}

static void check_same_as_concat(const char *whole, const char *a, const char *b) {
    size_t na, nb;
    int32_t *ia = encode_ok(qwen, a, &na), *ib = encode_ok(qwen, b, &nb);
    int32_t *want = cv_xmalloc((na + nb) * sizeof *want);
    memcpy(want, ia, na * sizeof *want);
    memcpy(want + na, ib, nb * sizeof *want);
    check_encode(qwen, whole, strlen(whole), want, na + nb);
    free(want);
    free(ia);
    free(ib);
}

static void test_regex_dialect(void) {
    /* U+180E is not White_Space (Oniguruma), though PCRE2's own \s would take it: "  \u180E"
     * must split as " " + " \u180E" (\s+(?!\S) stops before a non-space). */
    check_same_as_concat("  \xE1\xA0\x8E", " ", " \xE1\xA0\x8E");
    /* U+0085 is White_Space: it ends a run as a space does. */
    check_same_as_concat("a\xC2\x85\xC2\x85" "b", "a\xC2\x85", "\xC2\x85" "b");
    /* Contractions are case-insensitive; a digit is a piece of its own. */
    check_same_as_concat("X'LL", "X", "'LL");
    check_same_as_concat("a1", "a", "1");
    /* Embedded NUL is text like any other. */
    int32_t *ids;
    size_t n;
    CHECK_EQ_INT(cv_tokenizer_encode(qwen, "a\0b", 3, &ids, &n), 0);
    char *out;
    size_t len;
    CHECK_EQ_INT(cv_tokenizer_decode(qwen, ids, n, false, &out, &len), 0);
    CHECK(len == 3 && memcmp(out, "a\0b", 3) == 0);
    free(out);
    free(ids);
    CHECK_EQ_INT(cv_tokenizer_encode(qwen, NULL, 0, &ids, &n), 0);
    CHECK_EQ_INT(n, 0);
    free(ids);
}

/* Megabyte-long pieces: the regex must not run out of stack and BPE must stay fast. */
static void test_long_pieces(void) {
    static const char *const units[] = {"a", " ", "\n", "!", "7", "\xE4\xBD\xA0", " a", "\r\n "};
    size_t total = 1 << 20;
    char *buf = cv_xmalloc(total + 8);
    for (size_t u = 0; u < CV_ARRAY_LEN(units); u++) {
        size_t ul = strlen(units[u]), len = 0;
        while (len + ul <= total) {
            memcpy(buf + len, units[u], ul);
            len += ul;
        }
        int32_t *ids;
        size_t n, out_len;
        int rc = cv_tokenizer_encode(qwen, buf, len, &ids, &n);
        CHECK_MSG(rc == 0, "unit %zu: %s", u, cv_error_message());
        if (rc) continue;
        char *out = decode_ok(qwen, ids, n, false, &out_len);
        CHECK_MSG(out_len == len && memcmp(out, buf, len) == 0, "unit %zu: round trip", u);
        CHECK(n <= len);
        free(out);
        free(ids);
    }
    free(buf);
}

/* ---- encode / decode errors ------------------------------------------------------------------ */

static void check_invalid(const char *text, size_t len, const char *want_msg) {
    int32_t *ids = (int32_t *)1;
    size_t n = 7;
    CHECK_EQ_INT(cv_tokenizer_encode(qwen, text, len, &ids, &n), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cv_error_message(), want_msg);
    CHECK(ids == NULL && n == 0);
}

static void test_encode_errors(void) {
    check_invalid("ab\xff", 3, "invalid UTF-8 at byte offset 2 (0xff)");
    check_invalid("\xc0\x80", 2, "invalid UTF-8 at byte offset 0 (0xc0)");          /* overlong */
    check_invalid("x\xed\xa0\x80", 4, "invalid UTF-8 at byte offset 1 (0xed)");     /* surrogate */
    check_invalid("\xf4\x90\x80\x80", 4, "invalid UTF-8 at byte offset 0 (0xf4)");  /* > 10FFFF */
    check_invalid("\xe4\xbd", 2, "invalid UTF-8 at byte offset 0 (0xe4)");          /* truncated */
    check_invalid("abcdefgh\x80", 9, "invalid UTF-8 at byte offset 8 (0x80)");      /* after ASCII */
    check_invalid("<|im_end|>\xfe", 11, "invalid UTF-8 at byte offset 10 (0xfe)");
    int32_t *ids;
    size_t n;
    CHECK_EQ_INT(cv_tokenizer_encode(qwen, NULL, 3, &ids, &n), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cv_error_message(), "text is NULL");
}

static void test_decode_errors(void) {
    int32_t bad[] = {9707, 151669};
    char *text = (char *)1;
    size_t len = 9;
    CHECK_EQ_INT(cv_tokenizer_decode(qwen, bad, 2, false, &text, &len), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cv_error_message(),
                 "token id 151669 at position 1 is out of range (vocabulary size 151669)");
    CHECK(text == NULL && len == 0);
    int32_t neg[] = {-3};
    CHECK_EQ_INT(cv_tokenizer_decode(qwen, neg, 1, true, &text, &len), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cv_error_message(), "token id -3 at position 0 is out of range (vocabulary size "
                                     "151669)");
    CHECK_EQ_INT(cv_tokenizer_decode(qwen, NULL, 2, true, &text, &len), CVLLM_ERR_INVALID_ARGUMENT);
    CHECK_STR_EQ(cv_error_message(), "ids is NULL");
    CHECK_EQ_INT(cv_tokenizer_decode(qwen, NULL, 0, true, &text, &len), 0);
    CHECK_STR_EQ(text, "");
    free(text);
}

/* ---- load errors, on a small tokenizer cut out of the real one --------------------------------- */

static char tmp_dir[] = "/tmp/cvllm_tok_XXXXXX";

/* Base vocabulary ids < 1000 and the merges among them; the added tokens unchanged. */
static json_t *make_mini(void) {
    json_error_t err;
    json_t *full = json_load_file(QWEN_DIR "/tokenizer.json", 0, &err);
    CHECK_MSG(full != NULL, "%s", err.text);
    if (!full) return NULL;
    json_t *model = json_object_get(full, "model"), *vocab = json_object_get(model, "vocab");
    json_t *mini_vocab = json_object(), *mini_merges = json_array();
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (json_integer_value(v) < 1000) json_object_set(mini_vocab, key, v);
    }
    size_t i;
    json_array_foreach(json_object_get(model, "merges"), i, v) {
        const char *a = json_string_value(json_array_get(v, 0));
        const char *b = json_string_value(json_array_get(v, 1));
        char *ab = cv_xasprintf("%s%s", a, b);
        if (json_object_get(mini_vocab, a) && json_object_get(mini_vocab, b) &&
            json_object_get(mini_vocab, ab))
            json_array_append(mini_merges, v);
        free(ab);
    }
    json_object_set_new(model, "vocab", mini_vocab);
    json_object_set_new(model, "merges", mini_merges);
    return full;
}

static int load_variant(const json_t *root, cv_tokenizer **tok) {
    char *path = cv_xasprintf("%s/tokenizer.json", tmp_dir);
    CHECK_EQ_INT(json_dump_file(root, path, JSON_COMPACT), 0);
    free(path);
    return cv_tokenizer_load(tmp_dir, tok);
}

static void write_file(const char *name, const char *content) {
    char *path = cv_xasprintf("%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(content, f);
        fclose(f);
    }
    free(path);
}

typedef void (*mutator)(json_t *root);

static void m_model_type(json_t *r) { json_object_set_new(json_object_get(r, "model"), "type", json_string("Unigram")); }
static void m_dropout(json_t *r) { json_object_set_new(json_object_get(r, "model"), "dropout", json_real(0.1)); }
static void m_byte_fallback(json_t *r) { json_object_set_new(json_object_get(r, "model"), "byte_fallback", json_true()); }
static void m_prefix(json_t *r) { json_object_set_new(json_object_get(r, "model"), "continuing_subword_prefix", json_string("##")); }
static void m_no_model(json_t *r) { json_object_del(r, "model"); }
static void m_vocab_array(json_t *r) { json_object_set_new(json_object_get(r, "model"), "vocab", json_array()); }
static void m_merges_object(json_t *r) { json_object_set_new(json_object_get(r, "model"), "merges", json_object()); }
static void m_bad_id(json_t *r) { json_object_set_new(json_object_get(json_object_get(r, "model"), "vocab"), "Ġt", json_string("x")); }
static void m_dup_id(json_t *r) { json_object_set_new(json_object_get(json_object_get(r, "model"), "vocab"), "zzzq", json_integer(5)); }
static void m_missing_byte(json_t *r) { json_object_del(json_object_get(json_object_get(r, "model"), "vocab"), "Ā"); }
static void m_merge_unknown(json_t *r) { json_array_append_new(json_object_get(json_object_get(r, "model"), "merges"), json_pack("[ss]", "q", "qqqqq")); }
static void m_merge_result(json_t *r) { json_array_append_new(json_object_get(json_object_get(r, "model"), "merges"), json_pack("[ss]", "q", "z")); }
static void m_merge_string(json_t *r) { json_array_append_new(json_object_get(json_object_get(r, "model"), "merges"), json_string("q z x")); }
static void m_merge_number(json_t *r) { json_array_append_new(json_object_get(json_object_get(r, "model"), "merges"), json_integer(3)); }
static void m_normalizer(json_t *r) { json_object_set_new(r, "normalizer", json_pack("{ss}", "type", "NFKC")); }
static void m_pre_tok(json_t *r) { json_object_set_new(r, "pre_tokenizer", json_pack("{ss}", "type", "Whitespace")); }
static json_t *split_of(json_t *r) { return json_array_get(json_object_get(json_object_get(r, "pre_tokenizer"), "pretokenizers"), 0); }
static void m_behavior(json_t *r) { json_object_set_new(split_of(r), "behavior", json_string("MergedWithPrevious")); }
static void m_invert(json_t *r) { json_object_set_new(split_of(r), "invert", json_true()); }
static void m_regex(json_t *r) { json_object_set_new(split_of(r), "pattern", json_pack("{ss}", "Regex", "(\\p{L}+")); }
static void m_pattern(json_t *r) { json_object_set_new(split_of(r), "pattern", json_pack("{si}", "Regex", 3)); }
static void m_use_regex(json_t *r) { json_object_set_new(json_array_get(json_object_get(json_object_get(r, "pre_tokenizer"), "pretokenizers"), 1), "use_regex", json_true()); }
static void m_prefix_space(json_t *r) { json_object_set_new(json_array_get(json_object_get(json_object_get(r, "pre_tokenizer"), "pretokenizers"), 1), "add_prefix_space", json_true()); }
static void m_decoder(json_t *r) { json_object_set_new(r, "decoder", json_pack("{ss}", "type", "WordPiece")); }
static void m_added_array(json_t *r) { json_object_set_new(r, "added_tokens", json_object()); }
static void m_added_content(json_t *r) { json_object_del(json_array_get(json_object_get(r, "added_tokens"), 2), "content"); }
static void m_added_id(json_t *r) { json_object_set_new(json_array_get(json_object_get(r, "added_tokens"), 0), "id", json_integer(-1)); }
static void m_same_bytes(json_t *r) { json_object_set_new(json_object_get(json_object_get(r, "model"), "vocab"), " ", json_integer(1000)); }
static void m_empty_vocab(json_t *r) {
    json_object_set_new(json_object_get(r, "model"), "vocab", json_object());
    json_object_set_new(r, "added_tokens", json_array());
}

static void test_load_errors(void) {
    static const struct {
        mutator mutate;
        int code;
        const char *msg;
    } cases[] = {
        {m_model_type, CVLLM_ERR_UNSUPPORTED, "tokenizer.json: model type \"Unigram\" is not supported (only BPE)"},
        {m_dropout, CVLLM_ERR_UNSUPPORTED, "tokenizer.json: BPE dropout is not supported"},
        {m_byte_fallback, CVLLM_ERR_UNSUPPORTED, "tokenizer.json: BPE byte_fallback is not supported"},
        {m_prefix, CVLLM_ERR_UNSUPPORTED, "tokenizer.json: BPE continuing_subword_prefix is not supported"},
        {m_no_model, CVLLM_ERR_FORMAT, "tokenizer.json: no \"model\""},
        {m_vocab_array, CVLLM_ERR_FORMAT, "tokenizer.json: model.vocab is not an object"},
        {m_merges_object, CVLLM_ERR_FORMAT, "tokenizer.json: model.merges is not an array"},
        {m_bad_id, CVLLM_ERR_FORMAT, "tokenizer.json: vocab token \"Ġt\" has no valid id"},
        {m_dup_id, CVLLM_ERR_FORMAT, "tokenizer.json: vocab id 5 is used twice"},
        {m_missing_byte, CVLLM_ERR_FORMAT, "tokenizer.json: the vocabulary has no token for byte 0x00 (byte-level BPE needs all 256)"},
        {m_merge_unknown, CVLLM_ERR_FORMAT, "the second token is not in the vocabulary"},
        {m_merge_result, CVLLM_ERR_FORMAT, "the result is not in the vocabulary"},
        {m_merge_string, CVLLM_ERR_FORMAT, "\"q z x\" is not two tokens separated by one space"},
        {m_merge_number, CVLLM_ERR_FORMAT, "is neither \"a b\" nor [a, b]"},
        {m_normalizer, CVLLM_ERR_UNSUPPORTED, "tokenizer.json: normalizer \"NFKC\" is not supported (only NFC or none)"},
        {m_pre_tok, CVLLM_ERR_UNSUPPORTED, "tokenizer.json: pre_tokenizer must be Sequence[Split, ByteLevel] (got Whitespace)"},
        {m_behavior, CVLLM_ERR_UNSUPPORTED, "tokenizer.json: Split behavior \"MergedWithPrevious\" is not supported (only Isolated)"},
        {m_invert, CVLLM_ERR_UNSUPPORTED, "tokenizer.json: Split with invert is not supported"},
        {m_regex, CVLLM_ERR_FORMAT, "tokenizer.json: the Split regex does not compile at offset 7: missing closing parenthesis"},
        {m_pattern, CVLLM_ERR_FORMAT, "tokenizer.json: Split pattern is neither Regex nor String"},
        {m_use_regex, CVLLM_ERR_UNSUPPORTED, "tokenizer.json: pre_tokenizer ByteLevel use_regex is not supported (use a Split pre-tokenizer)"},
        {m_prefix_space, CVLLM_ERR_UNSUPPORTED, "tokenizer.json: pre_tokenizer ByteLevel add_prefix_space is not supported"},
        {m_decoder, CVLLM_ERR_UNSUPPORTED, "tokenizer.json: decoder \"WordPiece\" is not supported (only ByteLevel)"},
        {m_added_array, CVLLM_ERR_FORMAT, "tokenizer.json: added_tokens is not an array"},
        {m_added_content, CVLLM_ERR_FORMAT, "tokenizer.json: added_tokens[2] has no content"},
        {m_added_id, CVLLM_ERR_FORMAT, "tokenizer.json: added token \"<|endoftext|>\" has no valid id"},
        {m_empty_vocab, CVLLM_ERR_FORMAT, "tokenizer.json: the vocabulary is empty"},
        /* " " is not in the byte-level alphabet, so it stands for itself: the bytes of "Ġ". */
        {m_same_bytes, CVLLM_ERR_FORMAT, "tokenizer.json: vocab token \" \" (id 1000) decodes to the same bytes as another token"},
    };
    json_t *mini = make_mini();
    if (!mini) return;
    for (size_t i = 0; i < CV_ARRAY_LEN(cases); i++) {
        json_t *variant = json_deep_copy(mini);
        cases[i].mutate(variant);
        cv_tokenizer *tok = (cv_tokenizer *)1;
        int rc = load_variant(variant, &tok);
        CHECK_MSG(rc == cases[i].code, "load error case %zu: rc %d (%s)", i, rc, cv_error_message());
        CHECK_CONTAINS(cv_error_message(), cases[i].msg);
        CHECK(tok == NULL);
        json_decref(variant);
    }
    json_decref(mini);
}

static void test_file_errors(void) {
    cv_tokenizer *tok;
    CHECK_EQ_INT(cv_tokenizer_load("/nonexistent/dir", &tok), CVLLM_ERR_NOT_FOUND);
    CHECK_STR_EQ(cv_error_message(),
                 "cannot open /nonexistent/dir/tokenizer.json: No such file or directory");
    write_file("tokenizer.json", "{\"model\": [1, 2,\n");
    CHECK_EQ_INT(cv_tokenizer_load(tmp_dir, &tok), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "tokenizer.json: line 2 column 0:");
    write_file("tokenizer.json", "[]");
    CHECK_EQ_INT(cv_tokenizer_load(tmp_dir, &tok), CVLLM_ERR_FORMAT);
    CHECK_STR_EQ(cv_error_message(), "tokenizer.json: not an object");
}

/* ---- the mini tokenizer: added-token flags and tokenizer_config.json -------------------------- */

static json_t *added_token(const char *content, int id, bool special, bool lstrip, bool rstrip,
                           bool normalized, bool single_word) {
    return json_pack("{sssisbsbsbsbsb}", "content", content, "id", id, "special", special,
                     "lstrip", lstrip, "rstrip", rstrip, "normalized", normalized, "single_word",
                     single_word);
}

static void test_added_token_flags(void) {
    json_t *mini = make_mini();
    if (!mini) return;
    json_t *added = json_array();
    json_array_append_new(added, added_token("<L>", 2000, true, true, false, false, false));
    json_array_append_new(added, added_token("<R>", 2001, false, false, true, false, false));
    json_array_append_new(added, added_token("mask", 2002, false, false, false, false, true));
    json_array_append_new(added, added_token("\xc3\xa9t\xc3\xa9", 2003, false, false, false, true, false));
    json_object_set_new(mini, "added_tokens", added);
    write_file("tokenizer_config.json", "{\"eos_token\": {\"content\": \"<L>\"}, \"pad_token\": null}");
    cv_tokenizer *tok;
    int rc = load_variant(mini, &tok);
    CHECK_MSG(rc == 0, "mini: %s", cv_error_message());
    json_decref(mini);
    if (rc) return;
    CHECK_EQ_INT(cv_tokenizer_vocab_size(tok), 2004);
    CHECK_STR_EQ(cv_tokenizer_special_string(tok, "eos_token"), "<L>");
    CHECK(cv_tokenizer_special_string(tok, "pad_token") == NULL);
    size_t n, n_ab;
    int32_t *ab = encode_ok(tok, "ab", &n_ab); /* reference pieces from the same tokenizer */
    CHECK(n_ab >= 1);
    struct {
        const char *text;
        int32_t want[4];
        size_t n;
    } cases[] = {
        {"  <L>", {2000}, 1},                  /* lstrip eats the spaces before */
        {"<R> \t", {2001}, 1},                 /* rstrip eats the spaces after */
        {"mask", {2002}, 1},                   /* single_word: alone */
        {"e\xcc\x81t\xc3\xa9", {2003}, 1},     /* normalized: matched after NFC */
    };
    for (size_t i = 0; i < CV_ARRAY_LEN(cases); i++)
        check_encode(tok, cases[i].text, strlen(cases[i].text), cases[i].want, cases[i].n);
    int32_t *ids = encode_ok(tok, "masks", &n); /* single_word: inside a word it is plain text */
    for (size_t i = 0; i < n; i++) CHECK(ids[i] < 1000);
    free(ids);
    ids = encode_ok(tok, "ab<L>ab", &n);
    CHECK(n == 2 * n_ab + 1 && ids[n_ab] == 2000);
    free(ids);
    /* Ids between the base and added vocabularies name nothing and decode to nothing. */
    int32_t hole[] = {1500, 2000, 1999};
    size_t len;
    char *text = decode_ok(tok, hole, 3, false, &len);
    CHECK_STR_EQ(text, "<L>");
    free(text);
    text = decode_ok(tok, hole, 3, true, &len);
    CHECK_STR_EQ(text, "");
    free(text);
    CHECK_EQ_INT(cv_tokenizer_token_to_id(tok, "<R>"), 2001);
    free(ab);
    cv_tokenizer_free(tok);

    write_file("tokenizer_config.json", "{\"eos_token\": 5}");
    json_t *again = make_mini();
    CHECK_EQ_INT(load_variant(again, &tok), CVLLM_ERR_FORMAT);
    CHECK_STR_EQ(cv_error_message(), "tokenizer_config.json: \"eos_token\" is not a string");
    write_file("tokenizer_config.json", "[1]");
    CHECK_EQ_INT(load_variant(again, &tok), CVLLM_ERR_FORMAT);
    CHECK_STR_EQ(cv_error_message(), "tokenizer_config.json: not an object");
    write_file("tokenizer_config.json", "not json");
    CHECK_EQ_INT(load_variant(again, &tok), CVLLM_ERR_FORMAT);
    CHECK_CONTAINS(cv_error_message(), "tokenizer_config.json: line 1");
    json_decref(again);
    char *cfg = cv_xasprintf("%s/tokenizer_config.json", tmp_dir);
    unlink(cfg);
    free(cfg);
}

/* Merges also come as "a b" strings; the result must not depend on the spelling. */
static void test_string_merges(void) {
    json_t *mini = make_mini();
    if (!mini) return;
    json_t *merges = json_object_get(json_object_get(mini, "model"), "merges"), *strs = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        char *s = cv_xasprintf("%s %s", json_string_value(json_array_get(m, 0)),
                               json_string_value(json_array_get(m, 1)));
        json_array_append_new(strs, json_string(s));
        free(s);
    }
    cv_tokenizer *pairs, *strings;
    CHECK_EQ_INT(load_variant(mini, &pairs), 0);
    json_object_set_new(json_object_get(mini, "model"), "merges", strs);
    CHECK_EQ_INT(load_variant(mini, &strings), 0);
    json_decref(mini);
    const char *text = "the quick brown fox jumps over the lazy dog, in the time it takes";
    size_t n1, n2;
    int32_t *a = encode_ok(pairs, text, &n1), *b = encode_ok(strings, text, &n2);
    CHECK(ids_equal(a, n1, b, n2));
    CHECK(n1 < strlen(text)); /* merges did happen */
    free(a);
    free(b);
    cv_tokenizer_free(pairs);
    cv_tokenizer_free(strings);
}

/* A literal Split pattern, and a regex that fails at match time (backtracking limit). */
static void test_split_patterns(void) {
    json_t *mini = make_mini();
    if (!mini) return;
    json_object_set_new(split_of(mini), "pattern", json_pack("{ss}", "String", "."));
    cv_tokenizer *tok;
    int rc = load_variant(mini, &tok);
    CHECK_MSG(rc == 0, "String pattern: %s", cv_error_message());
    if (rc) return;
    size_t n;
    int32_t *ids = encode_ok(tok, "in.in", &n); /* "." isolates; "in" is one token */
    int32_t in = cv_tokenizer_token_to_id(tok, "in"), dot = cv_tokenizer_token_to_id(tok, ".");
    CHECK(in >= 0 && n == 3 && ids[0] == in && ids[1] == dot && ids[2] == in);
    free(ids);
    cv_tokenizer_free(tok);

    json_object_set_new(split_of(mini), "pattern", json_pack("{ss}", "Regex", "(a+)+$"));
    CHECK_EQ_INT(load_variant(mini, &tok), 0);
    char text[64];
    memset(text, 'a', 40);
    text[40] = '!';
    CHECK_EQ_INT(cv_tokenizer_encode(tok, text, 41, &ids, &n), CVLLM_ERR_INTERNAL);
    CHECK_STR_EQ(cv_error_message(), "pre-tokenizer regex failed at byte 0: match limit exceeded");
    cv_tokenizer_free(tok);
    json_decref(mini);
}

/* ---- post_processor: the ids of add_special_tokens=True ---------------------------------------- */

/* A TemplateProcessing post-processor whose single template is `single` (pieces: "A" for the
 * sequence, anything else a special token of that name), its special_tokens `specials`. */
static json_t *template_proc(const char *const *single, size_t n, json_t *specials) {
    json_t *pieces = json_array();
    for (size_t i = 0; i < n; i++) {
        if (strcmp(single[i], "A") == 0)
            json_array_append_new(pieces, json_pack("{s{sssi}}", "Sequence", "id", "A", "type_id", 0));
        else
            json_array_append_new(pieces, json_pack("{s{sssi}}", "SpecialToken", "id", single[i], "type_id", 0));
    }
    json_t *pair = json_deep_copy(pieces);
    json_array_append_new(pair, json_pack("{s{sssi}}", "Sequence", "id", "B", "type_id", 1));
    return json_pack("{ss so so so}", "type", "TemplateProcessing", "single", pieces, "pair", pair,
                     "special_tokens", specials);
}

static json_t *special_entry(const char *name, const int32_t *ids, size_t n) {
    json_t *jids = json_array(), *toks = json_array();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(jids, json_integer(ids[i]));
        json_array_append_new(toks, json_string(name));
    }
    return json_pack("{ss so so}", "id", name, "ids", jids, "tokens", toks);
}

/* special_tokens of the tests: <|endoftext|> (Qwen3-Embedding's), <|im_start|>, and <two> with two
 * ids. */
static json_t *test_specials(void) {
    static const int32_t eot[] = {151643}, start[] = {151644}, two[] = {151645, 151646};
    return json_pack("{so so so}", "<|endoftext|>", special_entry("<|endoftext|>", eot, 1),
                     "<|im_start|>", special_entry("<|im_start|>", start, 1),
                     "<two>", special_entry("<two>", two, 2));
}

static json_t *sequence_proc(json_t *a, json_t *b) {
    json_t *list = json_array();
    json_array_append_new(list, a);
    if (b) json_array_append_new(list, b);
    return json_pack("{ss so}", "type", "Sequence", "processors", list);
}

static json_t *byte_level_proc(void) {
    return json_pack("{ss sb sb sb}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                     "use_regex", 0);
}

/* Loads mini with post_processor `proc` (taken; NULL: none at all); encode + add_special_tokens of
 * `text` must be want_before ++ encode(text) ++ want_after. */
static void check_post(json_t *mini, json_t *proc, const char *what, const char *text,
                       const int32_t *want_before, size_t n_before, const int32_t *want_after,
                       size_t n_after) {
    if (proc) json_object_set_new(mini, "post_processor", proc);
    else json_object_del(mini, "post_processor");
    cv_tokenizer *tok;
    int rc = load_variant(mini, &tok);
    CHECK_MSG(rc == 0, "%s: %s", what, cv_error_message());
    if (rc) return;
    CHECK_MSG(cv_tokenizer_num_special_tokens_to_add(tok) == n_before + n_after, "%s: %zu to add", what,
              cv_tokenizer_num_special_tokens_to_add(tok));
    size_t n_plain, n;
    int32_t *plain = encode_ok(tok, text, &n_plain), *ids = encode_ok(tok, text, &n);
    CHECK_MSG(ids_equal(plain, n_plain, ids, n), "%s: encode changed", what);
    CHECK_EQ_INT(cv_tokenizer_add_special_tokens(tok, &ids, &n), 0);
    int32_t *want = cv_xmalloc((n_before + n_plain + n_after + 1) * sizeof *want);
    if (n_before) memcpy(want, want_before, n_before * sizeof *want);
    if (n_plain) memcpy(want + n_before, plain, n_plain * sizeof *want);
    if (n_after) memcpy(want + n_before + n_plain, want_after, n_after * sizeof *want);
    bool same = ids_equal(ids, n, want, n_before + n_plain + n_after);
    CHECK_MSG(same, "%s: add_special_tokens(\"%s\") differs", what, text);
    if (!same) {
        print_ids("got ", ids, n);
        print_ids("want", want, n_before + n_plain + n_after);
    }
    free(want);
    free(plain);
    free(ids);
    cv_tokenizer_free(tok);
}

static void test_post_processor(void) {
    /* The real Qwen3 tokenizer (post_processor ByteLevel) adds nothing. */
    CHECK_EQ_INT(cv_tokenizer_num_special_tokens_to_add(qwen), 0);
    size_t n, n_copy;
    int32_t *ids = encode_ok(qwen, "Hello world", &n), *copy = encode_ok(qwen, "Hello world", &n_copy);
    CHECK_EQ_INT(cv_tokenizer_add_special_tokens(qwen, &ids, &n), 0);
    CHECK(n > 0 && ids_equal(ids, n, copy, n_copy));
    free(copy);
    free(ids);

    json_t *mini = make_mini();
    if (!mini) return;
    static const char *const embed[] = {"A", "<|endoftext|>"};           /* Qwen3-Embedding's */
    static const char *const around[] = {"<|im_start|>", "A", "<two>", "<|endoftext|>"};
    static const char *const first[] = {"<two>", "<|im_start|>", "A"};
    const int32_t eot[] = {151643}, start[] = {151644}, two_eot[] = {151645, 151646, 151643};
    const int32_t two_start[] = {151645, 151646, 151644}, start_two[] = {151644, 151645, 151646};
    check_post(mini, template_proc(embed, 2, test_specials()), "embedding", "the cat", NULL, 0, eot, 1);
    check_post(mini, template_proc(embed, 2, test_specials()), "embedding, empty text", "", NULL, 0, eot, 1);
    check_post(mini, template_proc(around, 4, test_specials()), "around", "a <|im_end|> b", start, 1,
               two_eot, 3);
    check_post(mini, template_proc(first, 3, test_specials()), "before only", "x", two_start, 3, NULL, 0);
    check_post(mini, sequence_proc(byte_level_proc(), template_proc(embed, 2, test_specials())),
               "Sequence[ByteLevel, TemplateProcessing]", "the cat", NULL, 0, eot, 1);
    /* A later template wraps an earlier one's result: <|im_start|> (<two> A) <|endoftext|>. */
    static const char *const outer[] = {"<|im_start|>", "A", "<|endoftext|>"};
    static const char *const inner[] = {"<two>", "A"};
    check_post(mini, sequence_proc(template_proc(inner, 2, test_specials()),
                                   template_proc(outer, 3, test_specials())),
               "two templates", "hi", start_two, 3, eot, 1);
    check_post(mini, byte_level_proc(), "ByteLevel", "the cat", NULL, 0, NULL, 0);
    check_post(mini, sequence_proc(byte_level_proc(), NULL), "Sequence[ByteLevel]", "a", NULL, 0, NULL, 0);
    check_post(mini, json_null(), "null", "the cat", NULL, 0, NULL, 0);
    check_post(mini, NULL, "absent", "x", NULL, 0, NULL, 0);

    /* NULL arguments; an empty NULL array grows like any other. */
    json_object_set_new(mini, "post_processor", template_proc(embed, 2, test_specials()));
    cv_tokenizer *tok;
    CHECK_EQ_INT(load_variant(mini, &tok), 0);
    if (tok) {
        int32_t *none = NULL;
        size_t n_none = 0;
        CHECK_EQ_INT(cv_tokenizer_add_special_tokens(tok, &none, &n_none), 0);
        CHECK(n_none == 1 && none && none[0] == 151643);
        free(none);
        none = NULL;
        n_none = 3;
        CHECK_EQ_INT(cv_tokenizer_add_special_tokens(tok, &none, &n_none), CVLLM_ERR_INVALID_ARGUMENT);
        CHECK_EQ_INT(cv_tokenizer_add_special_tokens(tok, NULL, &n_none), CVLLM_ERR_INVALID_ARGUMENT);
        CHECK_STR_EQ(cv_error_message(), "cv_tokenizer_add_special_tokens: NULL argument");
        cv_tokenizer_free(tok);
    }

    /* Load errors. */
    static const char *const unknown[] = {"A", "<|nope|>"};
    static const char *const no_a[] = {"<|endoftext|>"};
    static const char *const two_a[] = {"A", "<|endoftext|>", "A"};
    json_t *bad_id = test_specials();
    json_array_set_new(json_object_get(json_object_get(bad_id, "<two>"), "ids"), 1, json_integer(151669));
    json_t *seq_b = template_proc(embed, 2, test_specials());
    json_object_set_new(json_object_get(json_array_get(json_object_get(seq_b, "single"), 0), "Sequence"),
                        "id", json_string("B"));
    struct {
        json_t *proc;
        int code;
        const char *msg;
    } bad[] = {
        {template_proc(unknown, 2, test_specials()), CVLLM_ERR_FORMAT,
         "tokenizer.json: post_processor TemplateProcessing names special token \"<|nope|>\", which "
         "its special_tokens does not define"},
        {sequence_proc(byte_level_proc(), template_proc(unknown, 2, json_object())), CVLLM_ERR_FORMAT,
         "tokenizer.json: post_processor TemplateProcessing names special token \"<|nope|>\", which "
         "its special_tokens does not define"},
        {json_pack("{ss s[si] s[si]}", "type", "BertProcessing", "sep", "[SEP]", 102, "cls", "[CLS]", 101),
         CVLLM_ERR_UNSUPPORTED, "tokenizer.json: post_processor \"BertProcessing\" is not supported "
         "(only TemplateProcessing, ByteLevel or a Sequence of them)"},
        {sequence_proc(byte_level_proc(), json_pack("{ss}", "type", "RobertaProcessing")),
         CVLLM_ERR_UNSUPPORTED, "tokenizer.json: post_processor \"RobertaProcessing\" is not supported"},
        {json_pack("{ss}", "type", "Sequence"), CVLLM_ERR_FORMAT,
         "tokenizer.json: post_processor Sequence has no \"processors\" array"},
        {template_proc(around, 4, bad_id), CVLLM_ERR_FORMAT,
         "tokenizer.json: post_processor special token \"<two>\": ids[1] is not an id of the vocabulary"},
        {template_proc(no_a, 1, test_specials()), CVLLM_ERR_FORMAT,
         "tokenizer.json: post_processor TemplateProcessing's single template must hold Sequence A "
         "once (it does 0 times)"},
        {template_proc(two_a, 3, test_specials()), CVLLM_ERR_FORMAT, "(it does 2 times)"},
        {seq_b, CVLLM_ERR_FORMAT,
         "tokenizer.json: post_processor TemplateProcessing's single template holds Sequence \"B\" (only A)"},
        {json_pack("{ss}", "type", "TemplateProcessing"), CVLLM_ERR_FORMAT,
         "tokenizer.json: post_processor TemplateProcessing has no \"single\" template"},
    };
    for (size_t i = 0; i < CV_ARRAY_LEN(bad); i++) {
        json_object_set_new(mini, "post_processor", bad[i].proc);
        tok = (cv_tokenizer *)1;
        int rc = load_variant(mini, &tok);
        CHECK_MSG(rc == bad[i].code, "post_processor error case %zu: rc %d (%s)", i, rc, cv_error_message());
        CHECK_CONTAINS(cv_error_message(), bad[i].msg);
        CHECK(tok == NULL);
    }
    json_decref(mini);
}

/* ---- the tables' cache (tok_cache.c) --------------------------------------------------------- */

/* The .tok entries under root/tokenizer; the path of the last one read in *last (cv_xmalloc'd). */
static size_t cache_entries(const char *root, char **last) {
    char *dir = cv_xasprintf("%s/tokenizer", root);
    size_t n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 4, ".tok")) continue;
        n++;
        free(*last);
        *last = cv_xasprintf("%s/%s", dir, e->d_name);
    }
    if (d) closedir(d);
    free(dir);
    return n;
}

/* a and b have the same tokens: bytes, specialness and added tokens. */
static void check_same_tokens(const cv_tokenizer *a, const cv_tokenizer *b) {
    CHECK_EQ_INT(cv_tokenizer_vocab_size(a), cv_tokenizer_vocab_size(b));
    size_t differ = 0;
    for (int32_t id = 0; id < cv_tokenizer_vocab_size(a); id++) {
        size_t la = 0, lb = 0;
        const char *ba = cv_tokenizer_id_to_bytes(a, id, &la), *bb = cv_tokenizer_id_to_bytes(b, id, &lb);
        if ((ba == NULL) != (bb == NULL) || la != lb || (ba && memcmp(ba, bb, la)) ||
            cv_tokenizer_is_special(a, id) != cv_tokenizer_is_special(b, id))
            differ++;
    }
    CHECK_MSG(differ == 0, "%zu tokens differ", differ);
    CHECK_EQ_INT(a->n_added, b->n_added);
    for (size_t i = 0; i < a->n_added && i < b->n_added; i++)
        CHECK(a->added[i].id == b->added[i].id && a->added[i].len == b->added[i].len &&
              !memcmp(a->added[i].content, b->added[i].content, a->added[i].len));
}

/* A load of dir; *mapped: whether its tables came from the cache. */
static cv_tokenizer *load_dir(const char *dir, bool *mapped) {
    cv_tokenizer *tok = NULL;
    const int rc = cv_tokenizer_load(dir, &tok);
    CHECK_MSG(rc == 0, "load %s: %s", dir, cv_error_message());
    *mapped = tok && tok->map;
    return tok;
}

/* The first load of a tokenizer.json writes its tables' entry and the next maps it; both give the
 * reference cases' ids and the same tokens. A damaged or truncated entry is not used and is written
 * again; another text is another entry; no cache folder to write still loads. */
static void test_cache(void) {
    char *root = cv_xasprintf("%s/cache", tmp_dir), *entry = NULL; /* in the test's own folder */
    CHECK_EQ_INT(mkdir(root, 0700), 0);
    char *saved = getenv("CVLLM_CACHE_ROOT") ? cv_xstrdup(getenv("CVLLM_CACHE_ROOT")) : NULL;
    setenv("CVLLM_CACHE_ROOT", root, 1);
    bool mapped;
    cv_tokenizer *built = load_dir(QWEN_DIR, &mapped);
    CHECK(!mapped);
    CHECK_EQ_INT(cache_entries(root, &entry), 1);
    cv_tokenizer *cached = load_dir(QWEN_DIR, &mapped);
    CHECK(mapped);
    if (built && cached) {
        check_same_tokens(built, cached);
        reference_cases(cached);
    }
    cv_tokenizer_free(cached);
    struct stat st;
    CHECK(entry && stat(entry, &st) == 0);
    if (entry) { /* one byte of the merges' table flipped */
        FILE *f = fopen(entry, "r+b");
        CHECK(f != NULL);
        if (f) {
            fseek(f, (long)st.st_size - 100, SEEK_SET);
            int c = fgetc(f);
            fseek(f, (long)st.st_size - 100, SEEK_SET);
            fputc(c ^ 0x10, f);
            fclose(f);
        }
        cached = load_dir(QWEN_DIR, &mapped);
        CHECK(!mapped);
        if (cached) check_same_tokens(built, cached);
        cv_tokenizer_free(cached);
        cv_tokenizer_free(load_dir(QWEN_DIR, &mapped));
        CHECK_MSG(mapped, "the damaged entry was written again");
        CHECK_EQ_INT(truncate(entry, st.st_size - 1), 0);
        cv_tokenizer_free(load_dir(QWEN_DIR, &mapped));
        CHECK(!mapped);
        cv_tokenizer_free(load_dir(QWEN_DIR, &mapped));
        CHECK(mapped);
    }
    { /* the same JSON with a newline more: its own entry */
        size_t len;
        char *text = cv_read_file(QWEN_DIR "/tokenizer.json", &len);
        char *path = cv_xasprintf("%s/tokenizer.json", tmp_dir);
        FILE *f = fopen(path, "wb");
        CHECK(f && text && fwrite(text, 1, len, f) == len && fputc('\n', f) == '\n');
        if (f) fclose(f);
        cv_tokenizer_free(load_dir(tmp_dir, &mapped));
        CHECK(!mapped);
        CHECK_EQ_INT(cache_entries(root, &entry), 2);
        cached = load_dir(tmp_dir, &mapped);
        CHECK(mapped);
        if (built && cached) check_same_tokens(built, cached);
        cv_tokenizer_free(cached);
        unlink(path);
        free(path);
        free(text);
    }
    { /* the post-processor comes from the text beside mapped tables as well */
        json_t *mini = make_mini();
        static const char *const embed[] = {"A", "<|endoftext|>"};
        if (mini) {
            json_object_set_new(mini, "post_processor", template_proc(embed, 2, test_specials()));
            cv_tokenizer *tok = NULL;
            for (int pass = 0; pass < 2; pass++) {
                CHECK_EQ_INT(load_variant(mini, &tok), 0);
                const bool from_map = tok && tok->map;
                CHECK_MSG(from_map == (pass == 1), "pass %d: mapped %d", pass, from_map);
                if (tok) {
                    int32_t *ids = NULL;
                    size_t n = 0;
                    CHECK_EQ_INT(cv_tokenizer_add_special_tokens(tok, &ids, &n), 0);
                    CHECK(n == 1 && ids[0] == 151643);
                    free(ids);
                }
                cv_tokenizer_free(tok);
            }
            json_decref(mini);
        }
    }
    { /* a cache root under a file: nothing written, the load is whole */
        char *file = cv_xasprintf("%s/file", root), *under = cv_xasprintf("%s/file/below", root);
        FILE *f = fopen(file, "w");
        if (f) fclose(f);
        setenv("CVLLM_CACHE_ROOT", under, 1);
        cv_tokenizer_free(load_dir(QWEN_DIR, &mapped));
        CHECK(!mapped);
        unlink(file);
        free(file), free(under);
    }
    cv_tokenizer_free(built);
    while (cache_entries(root, &entry)) unlink(entry);
    free(entry);
    char *dir = cv_xasprintf("%s/tokenizer", root);
    rmdir(dir);
    free(dir);
    rmdir(root);
    free(root);
    if (saved) setenv("CVLLM_CACHE_ROOT", saved, 1);
    else unsetenv("CVLLM_CACHE_ROOT");
    free(saved);
}

/* tok_blank_tables empties model.vocab and model.merges of the root object, only those, through
 * strings that hold brackets and escaped quotes; anything else gives NULL. */
static void test_blank_tables(void) {
    static const struct {
        const char *in, *out; /* out NULL: refused */
    } cases[] = {
        {"{\"model\": {\"vocab\": {\"a\": 0, \"}\": 1, \"\\\"]\": 2}, \"merges\": [[\"a\", \"]\"], \"a }\"], \"x\": 1}, \"y\": \"model\"}",
         "{\"model\": {\"vocab\": {}, \"merges\": [], \"x\": 1}, \"y\": \"model\"}"},
        {" {\"x\": {\"vocab\": {\"a\": 1}}, \"model\":{\"merges\":[\"b b\"],\"vocab\":{\"b\":2}}}\n",
         " {\"x\": {\"vocab\": {\"a\": 1}}, \"model\":{\"merges\":[],\"vocab\":{}}}\n"},
        {"{\"model\": {\"merges\": [\"\\\\\", \"\\\\\\\"\"], \"vocab\": {\"a\\\\\": 0, \"\\\\\\\\\": 1}}}",
         "{\"model\": {\"merges\": [], \"vocab\": {}}}"},
        {"{\"model\": {\"vocab\": {\"a\": 0}}}", NULL},
        {"{\"model\": {\"vocab\": [], \"merges\": []}}", NULL},
        {"{\"model\": [{\"vocab\": {}, \"merges\": []}]}", NULL},
        {"[{\"model\": {\"vocab\": {}, \"merges\": []}}]", NULL},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"a a\"", NULL},
        {"{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]} \"x\": 1}", NULL},
    };
    for (size_t i = 0; i < CV_ARRAY_LEN(cases); i++) {
        size_t len = 0;
        char *out = tok_blank_tables(cases[i].in, strlen(cases[i].in), &len);
        if (cases[i].out) {
            CHECK_MSG(out && len == strlen(cases[i].out) && !strcmp(out, cases[i].out), "case %zu: %s", i, out ? out : "NULL");
        } else {
            CHECK_MSG(!out, "case %zu: %s", i, out);
        }
        free(out);
    }
}

int main(void) {
    CHECK(mkdtemp(tmp_dir) != NULL);
    int rc = cv_tokenizer_load(QWEN_DIR, &qwen);
    CHECK_MSG(rc == 0, "load: %s", cv_error_message());
    if (rc) return cv_check_summary("test_tokenizer");
    test_queries();
    test_reference_cases();
    test_random_round_trips();
    test_special_tokens();
    test_lossy_decode();
    test_detok_holds_partial_characters();
    test_regex_dialect();
    test_long_pieces();
    test_encode_errors();
    test_decode_errors();
    test_load_errors();
    test_file_errors();
    test_added_token_flags();
    test_string_merges();
    test_split_patterns();
    test_post_processor();
    test_blank_tables();
    test_cache();
    cv_tokenizer_free(qwen);
    char *path = cv_xasprintf("%s/tokenizer.json", tmp_dir);
    unlink(path);
    free(path);
    rmdir(tmp_dir);
    return cv_check_summary("test_tokenizer");
}
