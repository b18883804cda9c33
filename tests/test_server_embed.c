/*
 * test_server_embed.c — `cvllm serve` on an embedding model: a folder laid out as sentence-transformers
 * and Qwen3-Embedding lay theirs out (modules.json with Pooling and Normalize, a tokenizer whose
 * TemplateProcessing appends a special token) is served by the pooling runner without a flag, and
 * /v1/embeddings answers as vLLM's does: float and base64 vectors (float32, float16, bfloat16; little
 * and big endian), add_special_tokens, truncate_prompt_tokens, use_activation, usage, and its 400s;
 * the generation routes are absent there, and /v1/embeddings is absent on a generating server.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "check.h"
#include "serve_process.h"
#include "testutil.h"

static char *dir;

/* The vector-folder tied model with the files of an embedding model; its tokenizer appends id 0
 * (the reference models have 4096 ids, so the real <|endoftext|> would be out of their vocabulary). */
static void make_folder(void) {
    dir = tu_model_dir("qwen3-dense-tied-f32");
    char *tok_path = tu_strdupf("%s/%s", dir, "tokenizer.json");
    json_t *tok = json_load_file(tok_path, 0, NULL);
    CHECK(tok != NULL);
    json_object_set_new(tok, "post_processor",
                        json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, s:[i], s:[s]}}}", "type",
                                  "TemplateProcessing", "single", "Sequence", "id", "A", "type_id", 0, "SpecialToken",
                                  "id", "<|endoftext|>", "type_id", 0, "special_tokens", "<|endoftext|>", "id",
                                  "<|endoftext|>", "ids", 0, "tokens", "<|endoftext|>"));
    CHECK_EQ_INT(unlink(tok_path), 0); /* a link to the shipped file */
    CHECK_EQ_INT(json_dump_file(tok, tok_path, 0), 0);
    json_decref(tok);
    free(tok_path);
    tu_write_sentence_transformers(dir, "lasttoken");
    static const char st_config[] = "{\"prompts\": {\"query\": \"a \", \"document\": \"\", \"bad\": 3}}";
    tu_write_file(dir, "config_sentence_transformers.json", st_config, strlen(st_config));
}

static json_t *call(int port, const char *path, const char *body, long *status) {
    sp_call c = {.port = port, .path = path, .body = body};
    sp_post(&c);
    *status = c.status;
    json_t *j = c.reply ? json_loads(c.reply, 0, NULL) : NULL;
    if (!j) fprintf(stderr, "reply of %s: %s\n", path, c.reply ? c.reply : "(none)");
    free(c.reply);
    return j;
}

/* data[i].embedding as floats (a JSON list), n of them. */
static size_t vector_of(const json_t *reply, size_t i, float *out, size_t cap) {
    const json_t *v = json_object_get(json_array_get(json_object_get(reply, "data"), i), "embedding");
    size_t n = json_array_size(v);
    for (size_t k = 0; k < n && k < cap; k++) out[k] = (float)json_real_value(json_array_get(v, k));
    return n;
}

static size_t b64_decode(const char *s, uint8_t *out) {
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = 0, len = strlen(s);
    for (size_t i = 0; i + 3 < len + 3 && i < len; i += 4) {
        uint32_t w = 0;
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            const char *d = s[i + k] == '=' ? NULL : strchr(digits, s[i + k]);
            pad += !d;
            w = w << 6 | (d ? (uint32_t)(d - digits) : 0);
        }
        out[n++] = (uint8_t)(w >> 16);
        if (pad < 2) out[n++] = (uint8_t)(w >> 8);
        if (pad < 1) out[n++] = (uint8_t)w;
    }
    return n;
}

typedef struct raw_reply {
    char *body, *metadata;
    size_t len;
    long status;
} raw_reply;

static size_t raw_body(char *data, size_t size, size_t n, void *user) {
    raw_reply *r = user;
    r->body = realloc(r->body, r->len + size * n + 1);
    memcpy(r->body + r->len, data, size * n);
    r->len += size * n;
    return size * n;
}

static size_t raw_header(char *data, size_t size, size_t n, void *user) {
    raw_reply *r = user;
    if (size * n > 9 && !strncasecmp(data, "metadata:", 9)) {
        size_t len = size * n - 9;
        while (len && (data[9 + len - 1] == '\r' || data[9 + len - 1] == '\n')) len--;
        r->metadata = strndup(data + 9, len);
    }
    return size * n;
}

/* POST `path` keeping the body's bytes and the metadata header. */
static raw_reply post_raw(int port, const char *path, const char *body) {
    raw_reply r = {0};
    CURL *h = curl_easy_init();
    char url[96];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, raw_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, raw_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &r);
    curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return r;
}

static double norm2(const float *v, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)v[i] * v[i];
    return sqrt(s);
}

static void expect_error(int port, const char *body, long status, const char *message) {
    long got;
    json_t *j = call(port, "/v1/embeddings", body, &got);
    CHECK_MSG(got == status, "%s: status %ld, expected %ld", body, got, status);
    const char *msg = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    CHECK_MSG(msg && strstr(msg, message), "%s: expected '%s', got '%s'", body, message, msg ? msg : "(none)");
    json_decref(j);
}

/* A request to a route and what it must get: a status, and a message in the error (NULL: none). */
typedef struct route_case {
    const char *path, *body;
    long status;
    const char *message;
} route_case;

static void expect_routes(int port, const route_case *cases, size_t n) {
    for (size_t k = 0; k < n; k++) {
        long status;
        json_t *r = call(port, cases[k].path, cases[k].body, &status);
        CHECK_MSG(status == cases[k].status, "%s %s: %ld", cases[k].path, cases[k].body, status);
        const char *msg = json_string_value(json_object_get(json_object_get(r, "error"), "message"));
        CHECK_MSG(!cases[k].message || (msg && strstr(msg, cases[k].message)), "%s %s: expected '%s', got '%s'",
                  cases[k].path, cases[k].body, cases[k].message, msg ? msg : "(none)");
        json_decref(r);
    }
}

/* POST /v1/embeddings of `body`'s input: its first vector. */
static size_t embedding_of(int port, const char *body, float *out) {
    long status;
    json_t *r = call(port, "/v1/embeddings", body, &status);
    CHECK_EQ_INT(status, 200);
    size_t n = vector_of(r, 0, out, 64);
    json_decref(r);
    return n;
}

/* /v2/embed (vLLM's Cohere embed API) against /v1/embeddings' vectors: texts with the input type's
 * prompt prefix (config_sentence_transformers.json: "query" is "a "), inputs through the chat
 * template, every embedding type, truncate START / END / NONE with max_tokens, and the refusals.
 * ids: "a b c"'s three token ids. */
static void test_cohere_embed(int port, const int32_t *ids) {
    float want[64], got[64];
    CHECK_EQ_INT((int)embedding_of(port, "{\"input\": \"a b c\"}", want), 64);
    long status;
    json_t *r = call(port, "/v2/embed", "{\"model\": \"emb\", \"texts\": [\"b c\"], \"input_type\": \"query\", "
                                        "\"embedding_types\": [\"float\", \"base64\", \"binary\", \"ubinary\"]}", &status);
    CHECK_EQ_INT(status, 200);
    CHECK(!strncmp(json_string_value(json_object_get(r, "id")), "embd-", 5));
    const json_t *emb = json_object_get(r, "embeddings");
    const json_t *f = json_array_get(json_object_get(emb, "float"), 0);
    CHECK_EQ_INT((int)json_array_size(f), 64);
    for (size_t k = 0; k < json_array_size(f); k++) CHECK((float)json_real_value(json_array_get(f, k)) == want[k]);
    uint8_t bytes[512];
    CHECK_EQ_INT((int)b64_decode(json_string_value(json_array_get(json_object_get(emb, "base64"), 0)), bytes), 256);
    CHECK(!memcmp(bytes, want, sizeof want)); /* little-endian float32 */
    const json_t *ub = json_array_get(json_object_get(emb, "ubinary"), 0), *sb = json_array_get(json_object_get(emb, "binary"), 0);
    CHECK_EQ_INT((int)json_array_size(ub), 8);
    for (size_t byte = 0; byte < 8 && json_array_size(ub) == 8; byte++) {
        int bits = 0;
        for (size_t b = 0; b < 8; b++) bits |= (want[byte * 8 + b] >= 0) << (7 - b);
        CHECK_EQ_INT((int)json_integer_value(json_array_get(ub, byte)), bits);
        CHECK_EQ_INT((int)json_integer_value(json_array_get(sb, byte)), bits - 128);
    }
    CHECK(!strcmp(json_string_value(json_array_get(json_object_get(r, "texts"), 0)), "b c"));
    const json_t *meta = json_object_get(r, "meta");
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(meta, "api_version"), "version")), "2"));
    CHECK_EQ_INT((int)json_integer_value(json_object_get(json_object_get(meta, "tokens"), "input_tokens")), 4);
    json_decref(r);
    /* inputs: the chat form (the test template joins the contents), which adds no special tokens */
    char body[256];
    snprintf(body, sizeof body, "{\"input\": [[%d, %d, %d]]}", ids[0], ids[1], ids[2]);
    CHECK_EQ_INT((int)embedding_of(port, body, want), 64);
    r = call(port, "/v2/embed", "{\"model\": \"emb\", \"inputs\": [{\"content\": [{\"type\": \"text\", \"text\": \"a b c\"}]}]}", &status);
    CHECK_EQ_INT(status, 200);
    f = json_array_get(json_object_get(json_object_get(r, "embeddings"), "float"), 0);
    for (size_t k = 0; k < 64 && json_array_size(f) == 64; k++) got[k] = (float)json_real_value(json_array_get(f, k));
    CHECK(json_array_size(f) == 64 && !memcmp(got, want, sizeof want));
    CHECK(json_object_get(r, "texts") == NULL);
    json_decref(r);
    /* truncation: END keeps the first max_tokens tokens, START the last (the post-processor's 0 last) */
    static const struct {
        const char *truncate;
        int first, second;
    } cuts[] = {{"END", 0, 1}, {"START", 2, -1}};
    for (size_t k = 0; k < 2; k++) {
        snprintf(body, sizeof body, "{\"input\": [[%d, %d]]}", ids[cuts[k].first], cuts[k].second < 0 ? 0 : ids[cuts[k].second]);
        CHECK_EQ_INT((int)embedding_of(port, body, want), 64);
        snprintf(body, sizeof body, "{\"model\": \"emb\", \"texts\": [\"a b c\"], \"truncate\": \"%s\", \"max_tokens\": 2}",
                 cuts[k].truncate);
        r = call(port, "/v2/embed", body, &status);
        CHECK_EQ_INT(status, 200);
        f = json_array_get(json_object_get(json_object_get(r, "embeddings"), "float"), 0);
        for (size_t i = 0; i < 64 && json_array_size(f) == 64; i++) got[i] = (float)json_real_value(json_array_get(f, i));
        CHECK_MSG(json_array_size(f) == 64 && !memcmp(got, want, sizeof want), "truncate %s", cuts[k].truncate);
        json_decref(r);
    }
    static const route_case bad[] = {
        {"/v2/embed", "{\"model\": \"emb\", \"texts\": [\"a b c\"], \"truncate\": \"NONE\", \"max_tokens\": 2}", 400,
         "Input of 4 tokens exceeds max_tokens=2 with truncate=NONE. Set truncate to END or START"},
        {"/v2/embed", "{\"model\": \"emb\", \"texts\": [\"a\"], \"input_type\": \"passage\"}", 400,
         "Unsupported input_type 'passage'. Supported values: document, query"},
        {"/v2/embed", "{\"texts\": [\"a\"]}", 400, "Field required"},
        {"/v2/embed", "{\"model\": \"emb\"}", 400, "One of texts, images, or inputs must be provided"},
        {"/v2/embed", "{\"model\": \"emb\", \"images\": [\"data:image/png;base64,AAAA\"]}", 400, "is not a multimodal model"},
        {"/v2/embed", "{\"model\": \"emb\", \"texts\": [\"a\"], \"embedding_types\": [\"int8\"]}", 400,
         "embedding_types[0] must be one of"},
        {"/v2/embed", "{\"model\": \"emb\", \"texts\": [\"a\"], \"truncate\": \"MIDDLE\"}", 400,
         "Input should be 'NONE', 'START' or 'END'"},
    };
    expect_routes(port, bad, sizeof bad / sizeof *bad);
}

static void test_embedding_server(void) {
    /* a template whose text the test model's 4096 ids can spell: the messages' contents, then "!" when
     * a generation prompt is asked for */
    static const char tmpl[] = "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}!{% endif %}";
    tu_write_file(dir, "embed.jinja", tmpl, strlen(tmpl));
    char *tmpl_path = tu_strdupf("%s/%s", dir, "embed.jinja");
    const char *args[] = {"--host", "127.0.0.1", "--port", "0", "--dtype", "float32", "--max-model-len", "32",
                          "--kv-cache-memory-bytes", "16M", "--num-threads", "2", "--served-model-name", "emb",
                          "--chat-template", tmpl_path};
    sp_proc p = sp_spawn(dir, dir, "embed", args, sizeof args / sizeof *args);
    CHECK_MSG(sp_wait_ready(&p, 30), "server did not start");
    const int port = p.port;
    char *log = tu_read_text(p.log);
    CHECK_CONTAINS(log, "Resolved `--runner auto` to `--runner pooling`");
    free(log);

    /* ids of "a b c" without special tokens, from /tokenize */
    long status;
    json_t *t = call(port, "/tokenize", "{\"prompt\": \"a b c\", \"add_special_tokens\": false}", &status);
    CHECK_EQ_INT(status, 200);
    const json_t *tokens = json_object_get(t, "tokens");
    const size_t n_ids = json_array_size(tokens);
    CHECK(n_ids == 3);
    char ids[64] = "", ids_eos[64] = "";
    for (size_t i = 0; i < n_ids; i++)
        snprintf(ids + strlen(ids), sizeof ids - strlen(ids), "%s%lld", i ? "," : "",
                 (long long)json_integer_value(json_array_get(tokens, i)));
    snprintf(ids_eos, sizeof ids_eos, "%s,0", ids);
    json_decref(t);
    t = call(port, "/tokenize", "{\"prompt\": \"a b c\"}", &status);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(t, "count")), 4); /* the post-processor's 0 appended */
    json_decref(t);

    /* text with the post-processor's token == those ids with 0 appended; without it == the bare ids */
    char body[512];
    snprintf(body, sizeof body, "{\"model\": \"emb\", \"input\": [\"a b c\", \"a b c\", \"a b c\"]}");
    json_t *r = call(port, "/v1/embeddings", body, &status); /* three texts: warms what the next call reads */
    CHECK_EQ_INT(status, 200);
    float text[64], a[64], b[64], c[64];
    CHECK_EQ_INT((int)vector_of(r, 2, text, 64), 64);
    json_decref(r);
    snprintf(body, sizeof body, "{\"model\": \"emb\", \"input\": [[%s], [%s], [%s]]}", ids_eos, ids_eos, ids);
    r = call(port, "/v1/embeddings", body, &status);
    CHECK_EQ_INT(status, 200);
    CHECK(!strncmp(json_string_value(json_object_get(r, "id")), "embd-", 5));
    CHECK(!strcmp(json_string_value(json_object_get(r, "object")), "list"));
    CHECK(!strcmp(json_string_value(json_object_get(r, "model")), "emb"));
    const json_t *usage = json_object_get(r, "usage");
    CHECK_EQ_INT((int)json_integer_value(json_object_get(usage, "prompt_tokens")), 4 + 4 + 3);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(usage, "total_tokens")), 11);
    CHECK_EQ_INT((int)vector_of(r, 0, a, 64), 64);
    CHECK(!memcmp(a, text, sizeof a));
    CHECK_EQ_INT((int)json_integer_value(json_object_get(usage, "completion_tokens")), 0);
    CHECK_EQ_INT((int)vector_of(r, 1, b, 64), 64);
    CHECK_EQ_INT((int)vector_of(r, 2, c, 64), 64);
    CHECK(!memcmp(a, b, sizeof a));
    CHECK(memcmp(a, c, sizeof a) != 0);
    CHECK(fabs(norm2(a, 64) - 1) < 1e-5);
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT((int)json_integer_value(json_object_get(json_array_get(json_object_get(r, "data"), i), "index")), i);
    json_decref(r);

    snprintf(body, sizeof body, "{\"input\": \"a b c\", \"add_special_tokens\": false, \"use_activation\": false}");
    r = call(port, "/v1/embeddings", body, &status);
    float unnorm[64];
    CHECK_EQ_INT((int)vector_of(r, 0, unnorm, 64), 64);
    CHECK(fabs(norm2(unnorm, 64) - 1) > 1e-3);
    double len = norm2(unnorm, 64), worst = 0;
    for (int i = 0; i < 64; i++) worst = fmax(worst, fabs(c[i] - unnorm[i] / len));
    CHECK_MSG(worst < 1e-6, "use_activation false vs normalized: %.3g", worst);
    json_decref(r);

    /* truncate_prompt_tokens keeps the last tokens: the same vector as those ids alone */
    snprintf(body, sizeof body, "{\"input\": [[7, %s]], \"truncate_prompt_tokens\": 4}", ids_eos);
    r = call(port, "/v1/embeddings", body, &status);
    float tr[64];
    CHECK_EQ_INT((int)vector_of(r, 0, tr, 64), 64);
    CHECK(!memcmp(tr, a, sizeof a));
    CHECK_EQ_INT((int)json_integer_value(json_object_get(json_object_get(r, "usage"), "prompt_tokens")), 4);
    json_decref(r);

    /* base64: the same floats' bytes, and f16 / bf16 / fp8 casts of them, either byte order */
    static const struct {
        const char *dtype, *endian;
        size_t width;
    } encodings[] = {{"float32", "native", 4}, {"float32", "big", 4}, {"float16", "little", 2}, {"bfloat16", "big", 2},
                     {"fp8_e4m3", "big", 1}, {"fp8_e5m2", "native", 1}};
    for (size_t k = 0; k < sizeof encodings / sizeof *encodings; k++) {
        snprintf(body, sizeof body,
                 "{\"input\": [[%s]], \"encoding_format\": \"base64\", \"embed_dtype\": \"%s\", \"endianness\": \"%s\"}",
                 ids_eos, encodings[k].dtype, encodings[k].endian);
        r = call(port, "/v1/embeddings", body, &status);
        CHECK_EQ_INT(status, 200);
        const char *s = json_string_value(json_object_get(json_array_get(json_object_get(r, "data"), 0), "embedding"));
        uint8_t bytes[512];
        size_t n = s ? b64_decode(s, bytes) : 0;
        CHECK_EQ_INT((int)n, (int)(64 * encodings[k].width));
        const bool big = !strcmp(encodings[k].endian, "big");
        for (size_t i = 0; i < 64 && n == 64 * encodings[k].width; i++) {
            uint32_t u = 0;
            for (size_t bi = 0; bi < encodings[k].width; bi++)
                u |= (uint32_t)bytes[i * encodings[k].width + (big ? encodings[k].width - 1 - bi : bi)] << (8 * bi);
            float f;
            const bool e4m3 = !strcmp(encodings[k].dtype, "fp8_e4m3"), e5m2 = !strcmp(encodings[k].dtype, "fp8_e5m2");
            const int man = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, exp = (int)(u & 0x7f) >> man;
            if (encodings[k].width == 4) memcpy(&f, &u, 4);
            else if (!strcmp(encodings[k].dtype, "bfloat16")) u <<= 16, memcpy(&f, &u, 4);
            else if (encodings[k].width == 2)
                f = (float)ldexp((double)(1024 + (u & 1023)), (int)((u >> 10) & 31) - 25) * ((u & 0x8000) ? -1.f : 1.f);
            else /* fp8: normal or subnormal, no NaN or infinity in a unit vector */
                f = (float)ldexp((double)((exp ? 1 << man : 0) + (int)(u & ((1u << man) - 1))),
                                 (exp ? exp : 1) - bias - man) * ((u & 0x80) ? -1.f : 1.f);
            double tol = encodings[k].width == 4 ? 0 : !strcmp(encodings[k].dtype, "bfloat16") ? 1.0 / 256
                         : e4m3 ? 1.0 / 16 : e5m2 ? 1.0 / 8 : 1.0 / 2048;
            const double floor = e4m3 ? 0x1p-10 : e5m2 ? 0x1p-17 : 1e-7; /* half the smallest subnormal */
            CHECK_MSG(fabs(f - a[i]) <= tol * fabs(a[i]) + floor, "%s %s value %zu: %g vs %g", encodings[k].dtype,
                      encodings[k].endian, i, f, a[i]);
        }
        json_decref(r);
    }

    /* encoding_format bytes: the vectors' raw bytes back to back, vLLM's metadata header; bytes_only
     * without the header */
    snprintf(body, sizeof body, "{\"input\": [[%s], [%s]], \"encoding_format\": \"bytes\"}", ids_eos, ids);
    raw_reply raw = post_raw(port, "/v1/embeddings", body);
    CHECK_EQ_INT(raw.status, 200);
    CHECK_EQ_INT((int)raw.len, 2 * 64 * 4);
    if (raw.len == 2 * 64 * 4) {
        CHECK(!memcmp(raw.body, a, sizeof a));
        CHECK(!memcmp(raw.body + 256, c, sizeof c));
    }
    json_t *meta = raw.metadata ? json_loads(raw.metadata, 0, NULL) : NULL;
    CHECK_MSG(meta != NULL, "metadata header: %s", raw.metadata ? raw.metadata : "(none)");
    const json_t *item = json_array_get(json_object_get(meta, "data"), 1);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(item, "start")), 256);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(item, "end")), 512);
    CHECK_EQ_INT((int)json_integer_value(json_array_get(json_object_get(item, "shape"), 0)), 64);
    CHECK(!strcmp(json_string_value(json_object_get(item, "embed_dtype")) ? json_string_value(json_object_get(item, "embed_dtype")) : "", "float32"));
    CHECK_EQ_INT((int)json_integer_value(json_object_get(json_object_get(meta, "usage"), "prompt_tokens")), 7);
    json_decref(meta);
    free(raw.body);
    free(raw.metadata);
    snprintf(body, sizeof body, "{\"input\": [[%s]], \"encoding_format\": \"bytes_only\", \"embed_dtype\": \"float16\"}", ids_eos);
    raw = post_raw(port, "/v1/embeddings", body);
    CHECK_EQ_INT(raw.status, 200);
    CHECK_EQ_INT((int)raw.len, 64 * 2);
    CHECK(raw.metadata == NULL);
    free(raw.body);
    free(raw.metadata);

    /* /score and /rerank on an embedding model: the cosine similarity of the two texts' vectors */
    r = call(port, "/score", "{\"text_1\": \"a b c\", \"text_2\": [\"a b c\", \" d\"]}", &status);
    CHECK_EQ_INT(status, 200);
    const json_t *data = json_object_get(r, "data");
    CHECK_EQ_INT((int)json_array_size(data), 2);
    CHECK(fabs(json_real_value(json_object_get(json_array_get(data, 0), "score")) - 1) < 1e-6);
    const double cos_d = json_real_value(json_object_get(json_array_get(data, 1), "score"));
    json_decref(r);
    r = call(port, "/v1/embeddings", "{\"input\": \" d\"}", &status);
    float d_vec[64];
    CHECK_EQ_INT((int)vector_of(r, 0, d_vec, 64), 64);
    double dot = 0;
    for (int i = 0; i < 64; i++) dot += (double)d_vec[i] * a[i]; /* both unit vectors */
    CHECK_MSG(fabs(dot - cos_d) < 1e-5, "cosine %.7f vs /score %.7f", dot, cos_d);
    json_decref(r);
    r = call(port, "/rerank", "{\"query\": \"a b c\", \"documents\": [\" d\", \"a b c\"], \"top_n\": 1}", &status);
    CHECK_EQ_INT(status, 200);
    const json_t *results = json_object_get(r, "results");
    CHECK_EQ_INT((int)json_array_size(results), 1);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(json_array_get(results, 0), "index")), 1);
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(json_array_get(results, 0), "document"), "text")), "a b c"));
    json_decref(r);

    /* SageMaker's /invocations routes to embeddings on a pooling server */
    snprintf(body, sizeof body, "{\"input\": [[%s]]}", ids_eos);
    r = call(port, "/invocations", body, &status);
    CHECK_EQ_INT(status, 200);
    float inv[64];
    CHECK_EQ_INT((int)vector_of(r, 0, inv, 64), 64);
    CHECK(!memcmp(inv, a, sizeof a));
    json_decref(r);

    expect_error(port, "{\"input\": [1, 2], \"dimensions\": 8}", 400, "does not support matryoshka representation");
    expect_error(port, "{\"input\": [1, 2], \"normalize\": true}", 400, "use `use_activation` instead");
    expect_error(port, "{\"input\": []}", 400, "please provide at least one prompt");
    expect_error(port, "{\"model\": \"emb\"}", 400, "Field required");
    expect_error(port, "{\"input\": [1, 99999]}", 400, "Token id 99999 is out of vocabulary");
    expect_error(port, "{\"input\": [[]]}", 400, "The decoder prompt cannot be empty");
    expect_error(port, "{\"input\": [1, 2], \"encoding_format\": \"hex\"}", 400, "Input should be");
    /* the chat form: the rendered conversation, without special tokens by default (vLLM's
     * EmbeddingChatRequest), so "a b c" in a message is the bare ids' vector */
    r = call(port, "/v1/embeddings", "{\"messages\": [{\"role\": \"user\", \"content\": \"a b\"}, "
                                     "{\"role\": \"assistant\", \"content\": \" c\"}]}", &status);
    CHECK_EQ_INT(status, 200);
    float chat[64];
    CHECK_EQ_INT((int)vector_of(r, 0, chat, 64), 64);
    CHECK(!memcmp(chat, c, sizeof c));
    CHECK_EQ_INT((int)json_integer_value(json_object_get(json_object_get(r, "usage"), "prompt_tokens")), 3);
    json_decref(r);
    r = call(port, "/v1/embeddings", "{\"messages\": [{\"role\": \"user\", \"content\": \"a b c\"}], "
                                     "\"add_generation_prompt\": true, \"add_special_tokens\": true}", &status);
    CHECK_EQ_INT(status, 200);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(json_object_get(r, "usage"), "prompt_tokens")), 5);
    json_decref(r);
    expect_error(port, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"add_generation_prompt\": true, "
                       "\"continue_final_message\": true}", 400, "Cannot set both");
    expect_error(port, "{\"input\": [1, 2], \"model\": \"other\"}", 404, "The model `other` does not exist.");
    char long_body[256] = "{\"input\": [1";
    for (int i = 1; i < 33; i++) strcat(long_body, ",1");
    strcat(long_body, "]}");
    expect_error(port, long_body, 400, "You passed 33 input tokens and requested 0 output tokens");

    /* /pooling is the same vector as an item of object "pooling"; /classify is a classifier's */
    r = call(port, "/pooling", "{\"input\": \"a b c\"}", &status);
    CHECK_EQ_INT(status, 200);
    CHECK(!strncmp(json_string_value(json_object_get(r, "id")), "pooling-", 8));
    const json_t *pooled = json_array_get(json_object_get(r, "data"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(pooled, "object")), "pooling"));
    const json_t *vec = json_object_get(pooled, "data");
    CHECK_EQ_INT((int)json_array_size(vec), 64);
    for (size_t k = 0; k < json_array_size(vec); k++) CHECK((float)json_real_value(json_array_get(vec, k)) == text[k]);
    json_decref(r);
    static const route_case bad_pooling[] = {
        {"/pooling", "{\"input\": \"a\", \"dimensions\": 8}", 400, "dimensions is currently not supported"},
        {"/pooling", "{\"input\": \"a\", \"task\": \"classify\"}", 400, "Unsupported task: 'classify' Supported tasks: ('embed',)"},
    };
    expect_routes(port, bad_pooling, sizeof bad_pooling / sizeof *bad_pooling);
    r = call(port, "/classify", "{\"input\": \"a\"}", &status);
    CHECK_EQ_INT(status, 404);
    json_decref(r);
    /* /invocations: input is an embedding, query and documents a rerank */
    r = call(port, "/invocations", "{\"input\": \"a b c\"}", &status);
    CHECK(status == 200 && !strncmp(json_string_value(json_object_get(r, "id")), "embd-", 5));
    json_decref(r);
    r = call(port, "/invocations", "{\"query\": \"a\", \"documents\": [\"b\", \"c\"]}", &status);
    CHECK(status == 200 && json_array_size(json_object_get(r, "results")) == 2);
    json_decref(r);

    int32_t id3[3];
    for (size_t i = 0; i < 3; i++) id3[i] = (int32_t)atoi(i == 0 ? ids : strchr(i == 1 ? ids : strchr(ids, ',') + 1, ',') + 1);
    test_cohere_embed(port, id3);

    /* the generation routes do not exist on a pooling server */
    r = call(port, "/v1/completions", "{\"prompt\": \"a\"}", &status);
    CHECK_EQ_INT(status, 404);
    json_decref(r);
    r = call(port, "/v1/chat/completions", "{\"messages\": []}", &status);
    CHECK_EQ_INT(status, 404);
    json_decref(r);
    r = call(port, "/v1/messages", "{\"messages\": []}", &status);
    CHECK_EQ_INT(status, 404);
    json_decref(r);
    r = call(port, "/v1/models", NULL, &status);
    CHECK_EQ_INT(status, 200);
    json_decref(r);
    kill(p.pid, SIGTERM);
    CHECK_EQ_INT(sp_wait_exit(&p, 20), 0);
    free(tmpl_path);
}

/* --runner generate on the same folder: no /v1/embeddings; flags vLLM refuses or cvllm does not run. */
static void test_runner_flags(void) {
    const char *args[] = {"--host", "127.0.0.1", "--port", "0", "--runner", "generate", "--max-model-len", "32",
                          "--kv-cache-memory-bytes", "16M", "--num-threads", "2"};
    sp_proc p = sp_spawn(dir, dir, "generate", args, sizeof args / sizeof *args);
    CHECK_MSG(sp_wait_ready(&p, 30), "server did not start");
    long status;
    json_t *r = call(p.port, "/v1/embeddings", "{\"input\": [1, 2]}", &status);
    CHECK_EQ_INT(status, 404);
    json_decref(r);
    r = call(p.port, "/v1/completions", "{\"prompt\": [1, 2], \"max_tokens\": 2}", &status);
    CHECK_EQ_INT(status, 200);
    json_decref(r);
    kill(p.pid, SIGTERM);
    CHECK_EQ_INT(sp_wait_exit(&p, 20), 0);

    /* cvllm generate on an embedding folder: runner auto pools, so it says what to do instead */
    char *cmd = tu_strdupf("generate %s --prompt-token-ids 1,2 --max-model-len 32 --kv-cache-memory-bytes 16M", dir, "");
    tu_run g = tu_run_cvllm(dir, "", cmd);
    CHECK_EQ_INT(g.status, 1);
    CHECK_CONTAINS(g.err, "runs on the pooling runner, which generates nothing");
    tu_run_free(&g);
    free(cmd);

    static const struct {
        const char *flag, *value, *message;
    } bad[] = {
        {"--runner", "embed", "argument --runner: invalid choice: 'embed'"},
        {"--convert", "reward", "reward is not supported"},
        {"--pooler-config", "{\"pooling_type\": \"STEP\"}", "pooling type STEP is not supported"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        const char *a[] = {"--port", "0", bad[k].flag, bad[k].value, "--kv-cache-memory-bytes", "16M"};
        char tag[16];
        snprintf(tag, sizeof tag, "bad%zu", k);
        sp_proc q = sp_spawn(dir, dir, tag, a, sizeof a / sizeof *a);
        CHECK(sp_wait_exit(&q, 30) != 0);
        char *log = tu_read_text(q.log);
        CHECK_CONTAINS(log, bad[k].message);
        free(log);
    }
}

static double score_of(int port, const char *path, const char *body, size_t i) {
    long status;
    json_t *r = call(port, path, body, &status);
    CHECK_MSG(status == 200, "%s %s: %ld", path, body, status);
    double s = json_real_value(json_object_get(json_array_get(json_object_get(r, "data"), i), "score"));
    json_decref(r);
    return s;
}

/* The original Qwen3-Reranker's way in vLLM (hf_overrides naming Qwen3ForSequenceClassification and
 * its two label tokens; here "!" and "a", in the test model's 4096 ids): /score and /rerank score a
 * pair as one prompt, the two texts one after the other, or --chat-template rendered over the roles
 * "query" and "document" with the request's instruction. The engine's scores themselves are held to
 * the reference in test_pooling. */
static void test_reranker(void) {
    static const char overrides[] = "{\"architectures\": [\"Qwen3ForSequenceClassification\"], "
                                    "\"classifier_from_token\": [\"!\", \"a\"], \"is_original_qwen3_reranker\": true}";
    /* the document, then the query, then the instruction: a prompt the no-template server spells too */
    static const char tmpl[] = "{{ messages | selectattr(\"role\", \"eq\", \"document\") | map(attribute=\"content\") | first }}"
                               "{{ messages | selectattr(\"role\", \"eq\", \"query\") | map(attribute=\"content\") | first }}"
                               "{{ instruction | default(\"\") }}\n";
    tu_write_file(dir, "rerank.jinja", tmpl, strlen(tmpl));
    char *tmpl_path = tu_strdupf("%s/%s", dir, "rerank.jinja");
    const char *plain_args[] = {"--host", "127.0.0.1", "--port", "0", "--dtype", "float32", "--max-model-len", "32",
                                "--kv-cache-memory-bytes", "16M", "--num-threads", "1", "--hf-overrides", overrides};
    const char *tmpl_args[] = {"--host", "127.0.0.1", "--port", "0", "--dtype", "float32", "--max-model-len", "32",
                               "--kv-cache-memory-bytes", "16M", "--num-threads", "1", "--hf-overrides", overrides,
                               "--chat-template", tmpl_path};
    sp_proc plain = sp_spawn(dir, dir, "rerank", plain_args, sizeof plain_args / sizeof *plain_args);
    sp_proc templ = sp_spawn(dir, dir, "rerank-template", tmpl_args, sizeof tmpl_args / sizeof *tmpl_args);
    CHECK_MSG(sp_wait_ready(&plain, 30) && sp_wait_ready(&templ, 30), "reranker servers did not start");
    char *log = tu_read_text(plain.log);
    CHECK_CONTAINS(log, "Resolved `--runner auto` to `--runner pooling`");
    CHECK_CONTAINS(log, "pooling runner (--convert classify): 1 label from from_2_way_softmax, LAST pooling");
    free(log);

    /* without a template the pair is q + d: the same text split elsewhere scores the same */
    const double s1 = score_of(plain.port, "/score", "{\"text_1\": \"a b\", \"text_2\": \" c\"}", 0);
    const double s2 = score_of(plain.port, "/v1/score", "{\"queries\": \"a\", \"documents\": [\" b c\"]}", 0);
    CHECK_MSG(s1 == s2 && s1 > 0 && s1 < 1, "%.9f vs %.9f", s1, s2);
    const double s3 = score_of(plain.port, "/score", "{\"data_1\": \"a b\", \"data_2\": \" d\"}", 0);
    CHECK(s3 != s1);
    /* use_activation false: the logit itself, whose sigmoid is the score */
    const double logit = score_of(plain.port, "/score", "{\"text_1\": \"a b\", \"text_2\": \" c\", \"use_activation\": false}", 0);
    CHECK_MSG(fabs(1 / (1 + exp(-logit)) - s1) < 1e-6, "sigmoid(%.7f) vs %.7f", logit, s1);
    /* 1:N and N:N give each pair its own prompt */
    CHECK(score_of(plain.port, "/score", "{\"text_1\": [\"a b\", \"a b\"], \"text_2\": [\" d\", \" c\"]}", 1) == s1);
    CHECK(score_of(plain.port, "/score", "{\"text_1\": \"a b\", \"text_2\": [\" d\", \" c\"]}", 0) == s3);

    /* with the template: document, query, instruction, the template's trailing newline dropped (as
     * Jinja drops it) */
    CHECK(score_of(templ.port, "/score", "{\"text_1\": \" c\", \"text_2\": \"a b\"}", 0) == s1);
    CHECK(score_of(templ.port, "/score", "{\"text_1\": \"b\", \"text_2\": \"a \", \"instruction\": \" c\"}", 0) == s1);
    CHECK(score_of(templ.port, "/score", "{\"text_1\": \"b\", \"text_2\": \"a \", \"chat_template_kwargs\": "
                                         "{\"instruction\": \" c\"}, \"instruction\": \"x\"}", 0) == s1);

    /* /rerank: best first, cut to top_n, the documents echoed, usage over all of them */
    long status;
    json_t *r = call(plain.port, "/rerank", "{\"query\": \"a b\", \"documents\": [\" d\", \" c\", \" e\"]}", &status);
    CHECK_EQ_INT(status, 200);
    CHECK(!strncmp(json_string_value(json_object_get(r, "id")), "score-", 6));
    const json_t *results = json_object_get(r, "results");
    CHECK_EQ_INT((int)json_array_size(results), 3);
    double prev = 2;
    bool saw_c = false;
    for (size_t i = 0; i < json_array_size(results); i++) {
        const json_t *it = json_array_get(results, i);
        const double s = json_real_value(json_object_get(it, "relevance_score"));
        CHECK(s <= prev);
        prev = s;
        const json_t *doc = json_object_get(it, "document");
        const int index = (int)json_integer_value(json_object_get(it, "index"));
        static const char *const docs[] = {" d", " c", " e"};
        CHECK(index >= 0 && index < 3 && !strcmp(json_string_value(json_object_get(doc, "text")), docs[index]));
        if (index == 1) saw_c = s == s1;
    }
    CHECK(saw_c);
    CHECK(json_integer_value(json_object_get(json_object_get(r, "usage"), "prompt_tokens")) > 0);
    json_decref(r);
    r = call(plain.port, "/v2/rerank", "{\"query\": \"a b\", \"documents\": [\" d\", \" c\", \" e\"], \"top_n\": 2}", &status);
    CHECK_EQ_INT(status, 200);
    CHECK_EQ_INT((int)json_array_size(json_object_get(r, "results")), 2);
    json_decref(r);

    static const struct {
        const char *path, *body, *message;
    } bad[] = {
        {"/score", "{\"text_1\": [\"a\", \"b\"], \"text_2\": [\"a\", \"b\", \"c\"]}", "Input lengths must be either 1:1, 1:N or N:N"},
        {"/score", "{\"text_1\": [], \"text_2\": [\"a\"]}", "At least one text element must be given"},
        {"/score", "{\"text_1\": \"a\", \"text_2\": []}", "At least one text_pair element must be given"},
        {"/score", "{\"text_1\": \"a\"}", "Field required"},
        {"/score", "{\"text_1\": \"a\", \"text_2\": {\"content\": []}}", "is not a multimodal model"},
        {"/rerank", "{\"documents\": [\"a\"]}", "Field required"},
        {"/rerank", "{\"query\": \"a\", \"documents\": []}", "At least one text_pair element must be given"},
        {"/score", "{\"text_1\": \"a\", \"text_2\": \"b\", \"model\": \"x\"}", "The model `x` does not exist."},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        r = call(plain.port, bad[k].path, bad[k].body, &status);
        CHECK_MSG(status == 400 || status == 404, "%s: %ld", bad[k].body, status);
        const char *msg = json_string_value(json_object_get(json_object_get(r, "error"), "message"));
        CHECK_MSG(msg && strstr(msg, bad[k].message), "%s: expected '%s', got '%s'", bad[k].body, bad[k].message,
                  msg ? msg : "(none)");
        json_decref(r);
    }
    /* /classify and /pooling: the pair's text as one input, the one label's probability; /invocations
     * takes input as a classification */
    r = call(plain.port, "/classify", "{\"input\": [\"a b c\"]}", &status);
    CHECK_EQ_INT(status, 200);
    CHECK(!strncmp(json_string_value(json_object_get(r, "id")), "classify-", 9));
    const json_t *item = json_array_get(json_object_get(r, "data"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(item, "label")), "LABEL_0"));
    CHECK_EQ_INT((int)json_integer_value(json_object_get(item, "num_classes")), 1);
    CHECK(json_real_value(json_array_get(json_object_get(item, "probs"), 0)) == s1);
    json_decref(r);
    r = call(plain.port, "/pooling", "{\"input\": \"a b c\", \"use_activation\": false}", &status);
    CHECK_EQ_INT(status, 200);
    CHECK(json_real_value(json_array_get(json_object_get(json_array_get(json_object_get(r, "data"), 0), "data"), 0)) ==
          logit);
    json_decref(r);
    r = call(plain.port, "/invocations", "{\"input\": \"a b c\"}", &status);
    CHECK(status == 200 && !strncmp(json_string_value(json_object_get(r, "id")), "classify-", 9));
    json_decref(r);
    r = call(plain.port, "/invocations", "{\"text_1\": \"a b\", \"text_2\": \" c\"}", &status);
    CHECK(status == 200 && json_real_value(json_object_get(json_array_get(json_object_get(r, "data"), 0), "score")) == s1);
    json_decref(r);
    /* a reranker has no embeddings and no generation */
    r = call(plain.port, "/v1/embeddings", "{\"input\": \"a\"}", &status);
    CHECK_EQ_INT(status, 404);
    json_decref(r);
    r = call(plain.port, "/v1/completions", "{\"prompt\": \"a\"}", &status);
    CHECK_EQ_INT(status, 404);
    json_decref(r);
    kill(plain.pid, SIGTERM);
    kill(templ.pid, SIGTERM);
    CHECK_EQ_INT(sp_wait_exit(&plain, 20), 0);
    CHECK_EQ_INT(sp_wait_exit(&templ, 20), 0);
    free(tmpl_path);
}

/* --convert classify on the folder (whose architecture is *ForCausalLM), its head three lm_head rows
 * (vLLM's no_post_processing method: tokens "!", "a" and "b") named by id2label: /classify's
 * probabilities are the softmax of its raw scores and its label the likeliest; /pooling returns the
 * same in any encoding; there are no /score and /rerank (vLLM serves them for one label only). */
static void test_classifier(void) {
    static const char overrides[] = "{\"method\": \"no_post_processing\", \"classifier_from_token\": [\"!\", \"a\", "
                                    "\"b\"], \"id2label\": {\"0\": \"bang\", \"1\": \"a\", \"2\": \"b\"}}";
    const char *args[] = {"--host", "127.0.0.1", "--port", "0", "--dtype", "float32", "--max-model-len", "32",
                          "--kv-cache-memory-bytes", "16M", "--num-threads", "1", "--convert", "classify",
                          "--hf-overrides", overrides};
    sp_proc p = sp_spawn(dir, dir, "classify", args, sizeof args / sizeof *args);
    CHECK_MSG(sp_wait_ready(&p, 30), "classifier server did not start");
    char *log = tu_read_text(p.log);
    CHECK_CONTAINS(log, "pooling runner (--convert classify): 3 labels from no_post_processing, LAST pooling");
    free(log);
    long status;
    json_t *r = call(p.port, "/classify", "{\"input\": [\"a b\", \"c\"], \"use_activation\": false}", &status);
    CHECK_EQ_INT(status, 200);
    double raw[2][3];
    for (size_t i = 0; i < 2; i++)
        for (size_t k = 0; k < 3; k++)
            raw[i][k] = json_real_value(json_array_get(json_object_get(json_array_get(json_object_get(r, "data"), i),
                                                                       "probs"), k));
    json_decref(r);
    r = call(p.port, "/classify", "{\"input\": [\"a b\", \"c\"]}", &status);
    CHECK_EQ_INT(status, 200);
    CHECK(json_integer_value(json_object_get(json_object_get(r, "usage"), "prompt_tokens")) > 0);
    static const char *const names[] = {"bang", "a", "b"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *item = json_array_get(json_object_get(r, "data"), i);
        CHECK_EQ_INT((int)json_integer_value(json_object_get(item, "index")), (int)i);
        CHECK_EQ_INT((int)json_integer_value(json_object_get(item, "num_classes")), 3);
        double sum = 0, max = fmax(raw[i][0], fmax(raw[i][1], raw[i][2]));
        size_t best = 0;
        for (size_t k = 0; k < 3; k++) sum += exp(raw[i][k] - max);
        for (size_t k = 0; k < 3; k++) {
            const double prob = json_real_value(json_array_get(json_object_get(item, "probs"), k));
            CHECK_MSG(fabs(prob - exp(raw[i][k] - max) / sum) < 1e-6, "prompt %zu label %zu: %.7f", i, k, prob);
            if (raw[i][k] > raw[i][best]) best = k;
        }
        CHECK(!strcmp(json_string_value(json_object_get(item, "label")), names[best]));
    }
    const double prob0 = json_real_value(json_array_get(json_object_get(json_array_get(json_object_get(r, "data"), 0),
                                                                        "probs"), 0));
    json_decref(r);
    /* /pooling: the same probabilities, as floats or base64 float32 */
    r = call(p.port, "/pooling", "{\"input\": \"a b\", \"encoding_format\": \"base64\"}", &status);
    CHECK_EQ_INT(status, 200);
    uint8_t bytes[64];
    CHECK_EQ_INT((int)b64_decode(json_string_value(json_object_get(json_array_get(json_object_get(r, "data"), 0), "data")),
                                 bytes), 12);
    float first;
    memcpy(&first, bytes, 4);
    CHECK(first == (float)prob0);
    json_decref(r);
    static const route_case refused[] = {
        {"/score", "{\"text_1\": \"a\", \"text_2\": \"b\"}", 404, "Not Found"},
        {"/rerank", "{\"query\": \"a\", \"documents\": [\"b\"]}", 404, "Not Found"},
        {"/v1/embeddings", "{\"input\": \"a\"}", 404, "Not Found"},
        {"/v2/embed", "{\"model\": \"x\", \"texts\": [\"a\"]}", 404, "Not Found"},
        {"/pooling", "{\"input\": \"a\", \"task\": \"score\"}", 400, "Unsupported task: 'score' Supported tasks: ('classify',)"},
        {"/classify", "{\"input\": \"a\", \"dimensions\": 2}", 200, NULL}, /* not a classify field: ignored */
        {"/classify", "{}", 400, "Field required"},
        {"/classify", "{\"input\": \"a\", \"use_activation\": 3}", 400, "Input should be a valid boolean"},
    };
    expect_routes(p.port, refused, sizeof refused / sizeof *refused);
    kill(p.pid, SIGTERM);
    CHECK_EQ_INT(sp_wait_exit(&p, 20), 0);
}

/* vLLM's token_embed task (--pooler-config task): /pooling returns one normalized row a prompt token
 * (the post-processor's token included), as nested lists, base64 of them all, or bytes with the
 * shape [rows, width]; /score and /rerank score by late interaction (MaxSim); /v1/embeddings and
 * /classify are absent, and /invocations pools. */
static void test_token_embed(void) {
    const char *args[] = {"--host", "127.0.0.1", "--port", "0", "--dtype", "float32", "--max-model-len", "32",
                          "--kv-cache-memory-bytes", "16M", "--num-threads", "1", "--pooler-config",
                          "{\"task\": \"token_embed\"}"};
    sp_proc p = sp_spawn(dir, dir, "token", args, sizeof args / sizeof *args);
    CHECK_MSG(sp_wait_ready(&p, 30), "token_embed server did not start");
    long status;
    json_t *r = call(p.port, "/pooling", "{\"input\": \"a b c\"}", &status);
    CHECK_EQ_INT(status, 200);
    const json_t *rows = json_object_get(json_array_get(json_object_get(r, "data"), 0), "data");
    CHECK_EQ_INT((int)json_array_size(rows), 4);
    float first[64] = {0};
    for (size_t t = 0; t < json_array_size(rows); t++) {
        const json_t *row = json_array_get(rows, t);
        CHECK_EQ_INT((int)json_array_size(row), 64);
        float v[64];
        for (size_t k = 0; k < 64 && json_array_size(row) == 64; k++) v[k] = (float)json_real_value(json_array_get(row, k));
        CHECK(fabs(norm2(v, 64) - 1) < 1e-5);
        if (t == 0) memcpy(first, v, sizeof first);
    }
    json_decref(r);
    r = call(p.port, "/pooling", "{\"input\": \"a b c\", \"encoding_format\": \"base64\"}", &status);
    uint8_t bytes[2048];
    CHECK_EQ_INT((int)b64_decode(json_string_value(json_object_get(json_array_get(json_object_get(r, "data"), 0), "data")),
                                 bytes), 4 * 64 * 4);
    CHECK(!memcmp(bytes, first, sizeof first));
    json_decref(r);
    raw_reply raw = post_raw(p.port, "/pooling", "{\"input\": [\"a b c\", \"a\"], \"encoding_format\": \"bytes\"}");
    CHECK_EQ_INT(raw.status, 200);
    CHECK_EQ_INT((int)raw.len, (4 + 2) * 64 * 4);
    json_t *meta = raw.metadata ? json_loads(raw.metadata, 0, NULL) : NULL;
    const json_t *shape = json_object_get(json_array_get(json_object_get(meta, "data"), 1), "shape");
    CHECK(json_array_size(shape) == 2 && json_integer_value(json_array_get(shape, 0)) == 2 &&
          json_integer_value(json_array_get(shape, 1)) == 64);
    json_decref(meta);
    free(raw.body);
    free(raw.metadata);
    r = call(p.port, "/invocations", "{\"input\": \"a\"}", &status);
    CHECK(status == 200 && !strncmp(json_string_value(json_object_get(r, "id")), "pooling-", 8));
    json_decref(r);
    /* /score and /rerank by late interaction: a text against itself scores one a (unit) row */
    r = call(p.port, "/score", "{\"text_1\": \"a b c\", \"text_2\": [\"a b c\", \" d\"]}", &status);
    CHECK_EQ_INT(status, 200);
    const double self = json_real_value(json_object_get(json_array_get(json_object_get(r, "data"), 0), "score"));
    const double other = json_real_value(json_object_get(json_array_get(json_object_get(r, "data"), 1), "score"));
    CHECK_MSG(fabs(self - 4) < 1e-4 && other < self, "MaxSim %.6f against itself, %.6f against another", self, other);
    json_decref(r);
    r = call(p.port, "/rerank", "{\"query\": \"a b c\", \"documents\": [\" d\", \"a b c\"]}", &status);
    CHECK(status == 200 && json_integer_value(json_object_get(json_array_get(json_object_get(r, "results"), 0), "index")) == 1);
    json_decref(r);
    static const route_case refused[] = {
        {"/v1/embeddings", "{\"input\": \"a\"}", 404, "Not Found"},
        {"/classify", "{\"input\": \"a\"}", 404, "Not Found"},
        {"/pooling", "{\"input\": \"a\", \"task\": \"embed\"}", 400, "Unsupported task: 'embed' Supported tasks: ('token_embed',)"},
    };
    expect_routes(p.port, refused, sizeof refused / sizeof *refused);
    kill(p.pid, SIGTERM);
    CHECK_EQ_INT(sp_wait_exit(&p, 20), 0);
}

/* vLLM's chunked processing (--pooler-config enable_chunked_processing): an input of 20 tokens on a
 * server of --max-model-len 8 runs as chunks of 8, 8 and 4, and its vector is the chunks' own
 * vectors (each embedded alone) averaged by their lengths; an input within max_model_len, beside it in
 * the same request, is embedded whole. max_embed_len caps the input; without chunking it names it. */
static void test_chunked_embeddings(void) {
    const char *args[] = {"--host", "127.0.0.1", "--port", "0", "--dtype", "float32", "--max-model-len", "8",
                          "--kv-cache-memory-bytes", "16M", "--num-threads", "1", "--enable-log-requests",
                          "--pooler-config", "{\"enable_chunked_processing\": true, \"max_embed_len\": 30}"};
    sp_proc p = sp_spawn(dir, dir, "chunked", args, sizeof args / sizeof *args);
    CHECK_MSG(sp_wait_ready(&p, 30), "chunked-processing server did not start");
    char ids[4][160] = {"", "", "", ""}; /* the whole input, then its three chunks */
    for (int t = 0; t < 20; t++) {
        char id[16];
        snprintf(id, sizeof id, "%d", 1 + (t * 37) % 4000);
        for (int k = 0; k < 4; k++)
            if (k == 0 || t / 8 == k - 1) snprintf(ids[k] + strlen(ids[k]), 160 - strlen(ids[k]), "%s%s", ids[k][0] ? "," : "", id);
    }
    char body[1024];
    snprintf(body, sizeof body, "{\"input\": [[%s], [%s], [%s]]}", ids[1], ids[2], ids[3]);
    long status;
    json_t *r = call(p.port, "/v1/embeddings", body, &status);
    CHECK_EQ_INT(status, 200);
    float chunk[3][64], want[64];
    for (size_t k = 0; k < 3; k++) CHECK_EQ_INT((int)vector_of(r, k, chunk[k], 64), 64);
    json_decref(r);
    for (size_t k = 0; k < 64; k++) want[k] = (8 * chunk[0][k] + 8 * chunk[1][k] + 4 * chunk[2][k]) / 20;
    snprintf(body, sizeof body, "{\"input\": [[5, 6, 7], [%s]]}", ids[0]);
    r = call(p.port, "/v1/embeddings", body, &status);
    CHECK_EQ_INT(status, 200);
    float got[64], short_one[64];
    CHECK_EQ_INT((int)vector_of(r, 1, got, 64), 64);
    double worst = 0;
    for (size_t k = 0; k < 64; k++) worst = fmax(worst, fabs((double)got[k] - want[k]));
    CHECK_MSG(worst < 1e-5, "chunked vector off the weighted mean of its chunks by %g", worst);
    CHECK_MSG(norm2(got, 64) < 0.999, "the mean of unit vectors is not normalized again (norm %.6f)", norm2(got, 64));
    CHECK_EQ_INT((int)json_integer_value(json_object_get(json_object_get(r, "usage"), "prompt_tokens")), 3 + 20);
    CHECK_EQ_INT((int)vector_of(r, 0, short_one, 64), 64);
    json_decref(r);
    float alone[64];
    CHECK_EQ_INT((int)embedding_of(p.port, "{\"input\": [5, 6, 7]}", alone), 64);
    CHECK(!memcmp(alone, short_one, sizeof alone));
    char *log = tu_read_text(p.log);
    CHECK_CONTAINS(log, "-prompt-1-chunk-2: params: PoolingParams(");
    free(log);
    char over[256];
    snprintf(over, sizeof over, "{\"input\": [[%s,%s]]}", ids[0], ids[1]); /* 28 tokens: within max_embed_len */
    CHECK_EQ_INT((int)embedding_of(p.port, over, got), 64);
    snprintf(over, sizeof over, "{\"input\": [[%s,%s,1,2,3]]}", ids[0], ids[1]);
    expect_error(p.port, over, 400, "This model's maximum embedding input length is 30 tokens. However, you requested "
                 "31 tokens in the input for embedding generation.");
    snprintf(over, sizeof over, "{\"input\": [[%s]]}", ids[0]);
    const route_case others[] = {{"/pooling", over, 400, "resulting in a maximum input length of 8 tokens"}};
    expect_routes(p.port, others, 1); /* vLLM chunks only the embeddings requests */
    kill(p.pid, SIGTERM);
    CHECK_EQ_INT(sp_wait_exit(&p, 20), 0);

    const char *plain_args[] = {"--host", "127.0.0.1", "--port", "0", "--dtype", "float32", "--max-model-len", "8",
                                "--kv-cache-memory-bytes", "16M", "--num-threads", "1", "--pooler-config",
                                "{\"max_embed_len\": 30}"};
    p = sp_spawn(dir, dir, "unchunked", plain_args, sizeof plain_args / sizeof *plain_args);
    CHECK_MSG(sp_wait_ready(&p, 30), "max_embed_len server did not start");
    expect_error(p.port, over, 400, "This model's maximum position embeddings length is 8 tokens. However, you "
                 "requested 20 tokens in the input for embedding generation. Please reduce the length of the input or "
                 "enable chunked processing.");
    kill(p.pid, SIGTERM);
    CHECK_EQ_INT(sp_wait_exit(&p, 20), 0);
}

/* `cvllm bench serve --backend openai-embeddings` against a pooling server: every request succeeds,
 * and vLLM's pooling report (no generated-token rows, end-to-end latency only) and result keys. The
 * model has the whole vocabulary (dummy weights), since the random prompts use every id. */
static void test_bench_embeddings(void) {
    char *full = tu_model_dir("qwen3-dense-f32"), *cfg = tu_strdupf("%s/%s", full, "config.json");
    json_t *c = json_load_file(cfg, 0, NULL);
    json_object_set_new(c, "vocab_size", json_integer(151936));
    CHECK_EQ_INT(unlink(cfg), 0);
    CHECK_EQ_INT(json_dump_file(c, cfg, 0), 0);
    json_decref(c);
    const char *args[] = {"--host", "127.0.0.1", "--port", "0", "--load-format", "dummy", "--runner", "pooling",
                          "--max-model-len", "64", "--kv-cache-memory-bytes", "16M", "--num-threads", "2"};
    sp_proc p = sp_spawn(full, full, "bench", args, sizeof args / sizeof *args);
    CHECK_MSG(sp_wait_ready(&p, 60), "server did not start");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "bench serve --backend openai-embeddings --endpoint /v1/embeddings --port %d --model %s --num-prompts 6 "
             "--random-input-len 100 --seed 3 --save-result --result-dir %s --result-filename embed.json",
             p.port, full, full);
    tu_run r = tu_run_cvllm(full, "", cmd);
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "Successful requests:                     6 ");
    CHECK_CONTAINS(r.out, "Total input tokens:                      384 "); /* 100-token prompts cut to 64 */
    CHECK_CONTAINS(r.out, "Mean E2EL (ms):");
    CHECK_CONTAINS(r.out, "P99 E2EL (ms):");
    CHECK(!strstr(r.out, "TTFT") && !strstr(r.out, "Total generated tokens") && !strstr(r.out, "Output token"));
    tu_run_free(&r);
    char *saved = tu_strdupf("%s/%s", full, "embed.json");
    json_t *j = json_load_file(saved, 0, NULL);
    CHECK(j != NULL);
    CHECK_EQ_INT((int)json_integer_value(json_object_get(j, "completed")), 6);
    CHECK_EQ_INT((int)json_array_size(json_object_get(j, "input_lens")), 6);
    CHECK(json_object_get(j, "mean_e2el_ms") && !json_object_get(j, "mean_ttft_ms") && !json_object_get(j, "failed"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "backend")), "openai-embeddings"));
    json_decref(j);
    free(saved);
    /* the generation endpoints are not an embeddings URL */
    snprintf(cmd, sizeof cmd, "bench serve --backend openai-embeddings --port %d --model %s --num-prompts 1", p.port, full);
    r = tu_run_cvllm(full, "", cmd);
    CHECK_EQ_INT(r.status, 2);
    CHECK_CONTAINS(r.err, "URL must end with 'embeddings'");
    tu_run_free(&r);

    /* vLLM's vllm-rerank backend over its random-rerank dataset: 7 documents, 3 a request, one query;
     * an embedding model reranks by cosine */
    snprintf(cmd, sizeof cmd,
             "bench serve --backend vllm-rerank --dataset-name random-rerank --endpoint /rerank --port %d --model %s "
             "--num-prompts 7 --random-batch-size 3 --random-input-len 40 --seed 5 --save-result --result-dir %s "
             "--result-filename rerank.json",
             p.port, full, full);
    r = tu_run_cvllm(full, "", cmd);
    CHECK_MSG(r.status == 0, "%s", r.err);
    CHECK_CONTAINS(r.out, "Successful requests:                     3 ");
    CHECK(!strstr(r.out, "TTFT") && !strstr(r.out, "Output token"));
    tu_run_free(&r);
    saved = tu_strdupf("%s/%s", full, "rerank.json");
    j = json_load_file(saved, 0, NULL);
    CHECK(j && json_integer_value(json_object_get(j, "completed")) == 3);
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "backend")), "vllm-rerank"));
    json_decref(j);
    free(saved);
    static const struct {
        const char *args, *message;
    } refused[] = {
        {"--backend vllm-rerank --endpoint /rerank", "--backend vllm-rerank goes with --dataset-name random-rerank"},
        {"--dataset-name random-rerank --endpoint /v1/embeddings --backend openai-embeddings",
         "--backend vllm-rerank goes with --dataset-name random-rerank"},
        {"--backend vllm-rerank --dataset-name random-rerank --endpoint /v1/embeddings", "URL must end with 'rerank'"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++) {
        snprintf(cmd, sizeof cmd, "bench serve %s --port %d --model %s --num-prompts 1", refused[k].args, p.port, full);
        r = tu_run_cvllm(full, "", cmd);
        CHECK_EQ_INT(r.status, 2);
        CHECK_CONTAINS(r.err, refused[k].message);
        tu_run_free(&r);
    }
    kill(p.pid, SIGTERM);
    CHECK_EQ_INT(sp_wait_exit(&p, 20), 0);
    tu_remove_tree(full);
    free(full);
    free(cfg);
}

int main(void) {
    curl_global_init(CURL_GLOBAL_DEFAULT);
    make_folder();
    test_embedding_server();
    test_runner_flags();
    test_reranker();
    test_classifier();
    test_token_embed();
    test_chunked_embeddings();
    test_bench_embeddings();
    tu_remove_tree(dir);
    free(dir);
    curl_global_cleanup();
    return cv_check_summary("test_server_embed");
}
