/*
 * tok_cache.c — a loaded tokenizer's large tables kept on disk, keyed by tokenizer.json's bytes.
 *
 * Parsing Qwen3's tokenizer.json (151,643 vocabulary entries, 151,387 merges) with jansson and
 * building the byte arena and the two hash tables took 0.6-0.75 s of every process start (a 2-core
 * Zen 5 VM): most of a warm `cvllm serve` start, of every `cvllm tokenize`, and seconds of each test
 * process under ASan (a million jansson allocations). Those tables depend on nothing but the file,
 * so after a full load they are written to <cache>/tokenizer/<XXH3-128 of the file>.tok
 * (cv_cache_dir), and a later load of the same bytes maps them (page-cache pages: nothing to copy or
 * touch fresh) and parses only the rest of the file, its two big members emptied (tok_blank_tables):
 * the normalizer, pre-tokenizer, decoder and added tokens still come from jansson and the same code
 * as always. cv_tokenizer_load 0.57 → 0.023 s.
 *
 * An entry is trusted only whole: its magic, layout, key, sizes (against the file's length) and an
 * XXH3 of its payload must match, else it is ignored and a full load writes it again. Writes go to
 * NAME.tmp.PID, renamed into place, so a reader never sees a partial entry; a process killed while
 * writing leaves that temporary behind (one per crash, a few MiB).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "loader/fileutil.h"
#include "tokenizer/tok_internal.h"

#define CACHE_MAGIC "cvtok01"    /* 8 bytes with its NUL; a new file layout takes a new one */
#define MAX_TABLE (1ull << 28)   /* hash-table slots: far above any vocabulary */

typedef struct cache_header {
    char magic[8];
    uint64_t header_bytes; /* sizeof(cache_header): the same struct layout */
    XXH128_hash_t key;
    uint64_t vocab_size, arena_bytes, vocab_slots, merge_slots;
    int32_t byte_id[256];
    uint64_t payload_hash; /* of the parts (payload_hash()) */
} cache_header;

/* The parts, in file order, each at a multiple of PART_ALIGN: off, len, arena, the vocabulary's
 * slots, the merges' slots. */
enum { N_PARTS = 5, PART_ALIGN = 64 };

typedef struct part {
    const void *data;
    size_t bytes;
} part;

XXH128_hash_t tok_cache_key(const char *json, size_t len) {
    return XXH3_128bits_withSeed(json, len, (uint64_t)TOK_TABLES_VERSION << 32 ^ sizeof(cache_header));
}

/* <cache>/tokenizer/<key>.tok, or NULL when there is no cache folder; its folder in *dir when dir is
 * not NULL (cv_xmalloc'd too). */
static char *entry_path(XXH128_hash_t key, char **dir) {
    char *folder = cv_cache_dir("tokenizer");
    if (!folder) return NULL;
    char *path = cv_xasprintf("%s/%016llx%016llx.tok", folder, (unsigned long long)key.high64,
                              (unsigned long long)key.low64);
    if (dir) *dir = folder;
    else free(folder);
    return path;
}

static uint64_t align_up(uint64_t n) { return (n + PART_ALIGN - 1) / PART_ALIGN * PART_ALIGN; }

/* The parts' sizes for these counts; returns the file's size (header included). */
static uint64_t place_parts(uint64_t vocab_size, uint64_t arena_bytes, uint64_t vocab_slots, uint64_t merge_slots,
                            uint64_t offset[N_PARTS], uint64_t bytes[N_PARTS]) {
    bytes[0] = vocab_size * sizeof(uint32_t), bytes[1] = vocab_size * sizeof(int32_t), bytes[2] = arena_bytes;
    bytes[3] = vocab_slots * sizeof(int32_t), bytes[4] = merge_slots * sizeof(tok_merge_slot);
    uint64_t at = align_up(sizeof(cache_header));
    for (int i = 0; i < N_PARTS; i++) {
        offset[i] = at;
        at = align_up(at + bytes[i]);
    }
    return at;
}

/* Each part's XXH3-64 seeded with the one before. */
static uint64_t payload_hash(const part parts[N_PARTS]) {
    uint64_t h = 0;
    for (int i = 0; i < N_PARTS; i++) h = XXH3_64bits_withSeed(parts[i].data, parts[i].bytes, h);
    return h;
}

static bool power_of_two(uint64_t n) { return n && !(n & (n - 1)); }

/* Every index the tables hold stays inside them. */
static bool tables_sane(const cv_tokenizer *t, uint64_t arena_bytes, const int32_t byte_id[256]) {
    for (int32_t id = 0; id < t->vocab_size; id++)
        if (t->len[id] >= 0 && (uint64_t)t->off[id] + (uint64_t)t->len[id] > arena_bytes) return false;
    for (size_t i = 0; i <= t->vocab_mask; i++)
        if (t->vocab_slots[i] < -1 || t->vocab_slots[i] >= t->vocab_size) return false;
    for (size_t i = 0; i <= t->merge_mask; i++)
        if (t->merge_slots[i].key != UINT64_MAX && (t->merge_slots[i].merged < 0 || t->merge_slots[i].merged >= t->vocab_size))
            return false;
    for (int b = 0; b < 256; b++)
        if (byte_id[b] < 0 || byte_id[b] >= t->vocab_size) return false;
    return true;
}

bool tok_cache_read(XXH128_hash_t key, cv_tokenizer *tok) {
    char *path = entry_path(key, NULL);
    size_t len = 0;
    const char *map = path ? cv_map_file(path, &len) : NULL;
    free(path);
    if (!map) return false;
    cache_header h;
    bool ok = len >= sizeof h;
    if (ok) memcpy(&h, map, sizeof h);
    uint64_t offset[N_PARTS], bytes[N_PARTS];
    ok = ok && !memcmp(h.magic, CACHE_MAGIC, 8) && h.header_bytes == sizeof h && h.key.low64 == key.low64 &&
         h.key.high64 == key.high64 && h.vocab_size > 0 && h.vocab_size <= TOK_MAX_ID && h.arena_bytes <= len &&
         power_of_two(h.vocab_slots) && h.vocab_slots <= MAX_TABLE && power_of_two(h.merge_slots) &&
         h.merge_slots <= MAX_TABLE &&
         place_parts(h.vocab_size, h.arena_bytes, h.vocab_slots, h.merge_slots, offset, bytes) == (uint64_t)len;
    cv_tokenizer t = {.vocab_size = (int32_t)h.vocab_size, .vocab_mask = h.vocab_slots - 1, .merge_mask = h.merge_slots - 1};
    if (ok) {
        part parts[N_PARTS];
        for (int i = 0; i < N_PARTS; i++) parts[i] = (part){map + offset[i], bytes[i]};
        t.off = (uint32_t *)(map + offset[0]), t.len = (int32_t *)(map + offset[1]), t.arena = (char *)(map + offset[2]);
        t.vocab_slots = (int32_t *)(map + offset[3]), t.merge_slots = (tok_merge_slot *)(map + offset[4]);
        ok = payload_hash(parts) == h.payload_hash && tables_sane(&t, h.arena_bytes, h.byte_id);
    }
    if (!ok) {
        cv_unmap_file(map, len);
        return false;
    }
    tok->vocab_size = t.vocab_size;
    tok->off = t.off, tok->len = t.len, tok->arena = t.arena;
    tok->vocab_slots = t.vocab_slots, tok->vocab_mask = t.vocab_mask;
    tok->merge_slots = t.merge_slots, tok->merge_mask = t.merge_mask;
    memcpy(tok->byte_id, h.byte_id, sizeof h.byte_id);
    tok->is_special = cv_xcalloc((size_t)t.vocab_size, 1); /* the added tokens set it */
    tok->map = map, tok->map_bytes = len;
    return true;
}

void tok_cache_write(XXH128_hash_t key, const cv_tokenizer *tok) {
    char *dir = NULL, *path = entry_path(key, &dir);
    if (!path) return;
    char *tmp = cv_xasprintf("%s.tmp.%ld", path, (long)getpid());
    uint64_t arena_bytes = 0;
    for (int32_t id = 0; id < tok->vocab_size; id++)
        if (tok->len[id] >= 0 && (uint64_t)tok->off[id] + (uint64_t)tok->len[id] > arena_bytes)
            arena_bytes = (uint64_t)tok->off[id] + (uint64_t)tok->len[id];
    uint64_t offset[N_PARTS], bytes[N_PARTS];
    const uint64_t file_bytes = place_parts((uint64_t)tok->vocab_size, arena_bytes, tok->vocab_mask + 1,
                                            tok->merge_mask + 1, offset, bytes);
    const part parts[N_PARTS] = {{tok->off, bytes[0]}, {tok->len, bytes[1]}, {tok->arena, bytes[2]},
                                 {tok->vocab_slots, bytes[3]}, {tok->merge_slots, bytes[4]}};
    cache_header h = {.magic = CACHE_MAGIC, .header_bytes = sizeof h, .key = key,
                      .vocab_size = (uint64_t)tok->vocab_size, .arena_bytes = arena_bytes,
                      .vocab_slots = tok->vocab_mask + 1, .merge_slots = tok->merge_mask + 1,
                      .payload_hash = payload_hash(parts)};
    memcpy(h.byte_id, tok->byte_id, sizeof h.byte_id);
    static const char zeros[PART_ALIGN];
    FILE *f = cv_mkdirs(dir) == 0 ? fopen(tmp, "wb") : NULL;
    bool ok = f && fwrite(&h, sizeof h, 1, f) == 1;
    uint64_t at = sizeof h;
    for (int i = 0; ok && i <= N_PARTS; i++) {
        const uint64_t to = i < N_PARTS ? offset[i] : file_bytes; /* padding up to the part, or the end */
        ok = fwrite(zeros, 1, to - at, f) == to - at && (i == N_PARTS || fwrite(parts[i].data, 1, bytes[i], f) == bytes[i]);
        at = i < N_PARTS ? offset[i] + bytes[i] : to;
    }
    int err = ok ? 0 : errno;
    if (f && fclose(f) != 0 && ok) ok = false, err = errno;
    if (ok && rename(tmp, path) != 0) ok = false, err = errno;
    if (ok) {
        cv_debug("tokenizer", "tokenizer tables cached in %s", path);
    } else {
        cv_warn("tokenizer", "tokenizer cache not written (%s): %s", f ? tmp : dir, strerror(err ? err : EIO));
        if (f) unlink(tmp);
    }
    free(dir), free(tmp), free(path);
}

/* ---- the JSON without model.vocab's and model.merges' members ------------------------------------ */

static size_t skip_ws(const char *s, size_t i, size_t n) {
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

/* The index after the string that opens at s[i] == '"', or n + 1 when it does not close: the next
 * quote that an even run of backslashes (none included) precedes. */
static size_t skip_string(const char *s, size_t i, size_t n) {
    const size_t first = i + 1;
    for (i = first; i < n;) {
        const char *q = memchr(s + i, '"', n - i);
        if (!q) return n + 1;
        const size_t at = (size_t)(q - s);
        size_t slashes = 0;
        while (at - slashes > first && s[at - slashes - 1] == '\\') slashes++;
        if (slashes % 2 == 0) return at + 1;
        i = at + 1;
    }
    return n + 1;
}

/* The index after the value at s[i] (no whitespace before it), or n + 1: containers by their
 * brackets' depth with strings skipped, scalars up to the next delimiter. jansson parses the result
 * and rejects what this lets through. */
static size_t skip_value(const char *s, size_t i, size_t n) {
    if (i >= n) return n + 1;
    if (s[i] == '"') return skip_string(s, i, n);
    if (s[i] != '{' && s[i] != '[') {
        while (i < n && !strchr(",}] \t\r\n", s[i])) i++;
        return i;
    }
    int depth = 0;
    while (i < n) {
        if (s[i] == '"') {
            i = skip_string(s, i, n);
            continue;
        }
        if (s[i] == '{' || s[i] == '[') depth++;
        else if ((s[i] == '}' || s[i] == ']') && --depth == 0) return i + 1;
        i++;
    }
    return n + 1;
}

/* The ranges to cut: the members of model.vocab and model.merges. */
enum { MAX_CUTS = 8 };
typedef struct cuts {
    size_t from[MAX_CUTS], to[MAX_CUTS];
    int n, found; /* found: 1 vocab, 2 merges */
} cuts;

/* Calls member(key, key_len, value, value_end) for each member of the object at s[i] == '{';
 * returns the index after it, or n + 1 when it is not an object this scan can walk. */
typedef void (*member_fn)(const char *s, const char *key, size_t key_len, size_t value, size_t end, cuts *c);
static size_t walk_object(const char *s, size_t i, size_t n, member_fn member, cuts *c) {
    if (i >= n || s[i] != '{') return n + 1;
    i = skip_ws(s, i + 1, n);
    if (i < n && s[i] == '}') return i + 1;
    for (;;) {
        if (i >= n || s[i] != '"') return n + 1;
        const size_t key = i + 1, key_end = skip_string(s, i, n);
        if (key_end > n) return n + 1;
        i = skip_ws(s, key_end, n);
        if (i >= n || s[i] != ':') return n + 1;
        const size_t value = skip_ws(s, i + 1, n), end = skip_value(s, value, n);
        if (end > n) return n + 1;
        member(s, s + key, key_end - 1 - key, value, end, c);
        i = skip_ws(s, end, n);
        if (i < n && s[i] == '}') return i + 1;
        if (i >= n || s[i] != ',') return n + 1;
        i = skip_ws(s, i + 1, n);
    }
}

static bool key_is(const char *key, size_t len, const char *name) { return len == strlen(name) && !memcmp(key, name, len); }

/* A member of "model": vocab's object and merges' array lose everything between their brackets. */
static void cut_table(const char *s, const char *key, size_t key_len, size_t value, size_t end, cuts *c) {
    const bool vocab = key_is(key, key_len, "vocab"), merges = key_is(key, key_len, "merges");
    if ((!(vocab && s[value] == '{') && !(merges && s[value] == '[')) || c->n == MAX_CUTS) return;
    c->from[c->n] = value + 1, c->to[c->n] = end - 1, c->n++;
    c->found |= vocab ? 1 : 2;
}

/* A member of the root: walks "model". */
static void walk_model(const char *s, const char *key, size_t key_len, size_t value, size_t end, cuts *c) {
    if (key_is(key, key_len, "model")) walk_object(s, value, end, cut_table, c);
}

char *tok_blank_tables(const char *json, size_t len, size_t *out_len) {
    cuts c = {.n = 0};
    const size_t end = walk_object(json, skip_ws(json, 0, len), len, walk_model, &c);
    if (end > len || c.found != 3) return NULL;
    char *out = cv_xmalloc(len + 1);
    size_t at = 0, from = 0;
    for (int i = 0; i < c.n; i++) { /* the cuts come in text order */
        memcpy(out + at, json + from, c.from[i] - from);
        at += c.from[i] - from;
        from = c.to[i];
    }
    memcpy(out + at, json + from, len - from);
    at += len - from;
    out[at] = '\0';
    *out_len = at;
    return out;
}
