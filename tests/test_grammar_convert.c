/*
 * test_grammar_convert.c — the constraint converters (src/sample/grammar/json_schema.c, regex.c,
 * convert.c) through the grammar engine, judged by validators that share no code with them.
 *
 * For a corpus of realistic JSON schemas, Python regexes and choice lists:
 *   1. the EBNF a converter writes parses (cv_grammar_parse, bytes only);
 *   2. hand-written valid instances are accepted byte by byte and can end there; invalid ones
 *      (each with the reason it is invalid) are refused;
 *   3. random walks through the matcher (every step draws uniformly among the bytes it accepts,
 *      so any reachable corner gets visited; past a length the walk heads for closing bytes and an
 *      accepting state) produce documents, and every one of them is checked by a real validator:
 *      ajv (node, tests/tools/validate_json.js) for JSON schemas, Python's re.fullmatch
 *      (tests/tools/check_regex.py) for regexes, membership for choices. A walk that reaches a
 *      state with no byte to go on and no way to end is a dead end, which is a bug too.
 * Each schema is converted with whitespace between tokens and compact; compact documents must hold
 * no whitespace outside strings, which also lets those walks reach further into the values.
 * Structural tags: texts with and without tags, accepted and refused, and walks into the tags
 * whose JSON goes to ajv with the tool's schema. Unsupported keywords and regex syntax, and the
 * limits (depth, size, loops), fail with their one-line messages.
 */
#define _GNU_SOURCE /* memmem */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "base/rng.h"
#include "base/utf8.h"
#include "check.h"
#include "sample/grammar/grammar.h"

#define WALKS 40          /* random documents per constraint */
#define SOFT_LEN 100      /* past this many bytes a walk heads for the end */
#define HARD_LEN 20000    /* a walk this long has failed to end */

/* ---- matching ------------------------------------------------------------------------------------- */

static cv_grammar *parse_ebnf(const char *what, const char *ebnf) {
    char err[512];
    cv_grammar *g = cv_grammar_parse(ebnf, strlen(ebnf), NULL, err, sizeof err);
    CHECK_MSG(g != NULL, "%s: the EBNF does not parse: %s\n%s", what, err, ebnf);
    return g;
}

/* Whether the whole of s is a sentence of g. */
static bool matches(const cv_grammar *g, const char *s, size_t n) {
    cv_matcher *m = cv_matcher_new(g);
    bool ok = cv_matcher_accept_bytes(m, s, n) && cv_matcher_can_end(m);
    cv_matcher_free(m);
    return ok;
}

/* One random sentence of g (malloc'd, its length in *n: it may hold NUL bytes), or NULL after a
 * dead end or an endless walk. `json`: the sentences are JSON, and past the soft length the walk
 * closes the string it is in, or else the innermost bracket. */
static char *walk_from(const cv_grammar *g, cv_rng *rng, const char *what, bool json, const char *prefix,
                       size_t *n_out) {
    cv_matcher *m = cv_matcher_new(g);
    char *out = NULL;
    size_t len = 0, cap = 0;
    bool in_str = false, escaped = false;
    cv_buf_append(&out, &len, &cap, "", 0);
    if (!cv_matcher_accept_bytes(m, prefix, strlen(prefix))) {
        CHECK_MSG(false, "%s: the walk's prefix %s is refused", what, prefix);
        cv_matcher_free(m);
        free(out);
        return NULL;
    }
    cv_buf_append(&out, &len, &cap, prefix, strlen(prefix));
    for (;;) {
        uint8_t cand[256], pref[256];
        int nc = 0, np = 0;
        for (int b = 0; b < 256; b++) {
            uint8_t x = (uint8_t)b;
            if (!cv_matcher_accept_bytes(m, &x, 1)) continue;
            cv_matcher_rollback(m, 1);
            cand[nc++] = x;
        }
        bool can_end = cv_matcher_can_end(m);
        if (nc == 0) {
            CHECK_MSG(can_end, "%s: dead end after %zu bytes: %s", what, len, out);
            if (!can_end) break;
            cv_matcher_free(m);
            *n_out = len;
            return out;
        }
        /* ending is one more choice among the bytes; past the soft length it is taken at once */
        if (can_end && (len >= SOFT_LEN || cv_rng_next(rng) % (uint64_t)(nc + 1) == 0)) {
            cv_matcher_free(m);
            *n_out = len;
            return out;
        }
        const uint8_t *from = cand;
        int n = nc;
        if (json && len >= SOFT_LEN) {
            for (int i = 0; i < nc; i++)
                if (in_str ? cand[i] == '"' && !escaped : cand[i] == '}' || cand[i] == ']') pref[np++] = cand[i];
            for (int i = 0; i < nc && !np && !in_str; i++)
                if (cand[i] == '"') pref[np++] = cand[i];
            if (np) from = pref, n = np;
        }
        uint8_t b = from[cv_rng_next(rng) % (uint64_t)n];
        CHECK(cv_matcher_accept_bytes(m, &b, 1));
        cv_buf_append(&out, &len, &cap, (const char *)&b, 1);
        if (in_str && !escaped && b == '"')
            in_str = false;
        else if (!in_str && b == '"')
            in_str = true;
        escaped = in_str && !escaped && b == '\\';
        if (len > HARD_LEN) {
            CHECK_MSG(false, "%s: walk did not end within %d bytes: ...%s", what, HARD_LEN, out + len - 300);
            break;
        }
    }
    cv_matcher_free(m);
    free(out);
    return NULL;
}

static char *walk(const cv_grammar *g, cv_rng *rng, const char *what, bool json, size_t *n_out) {
    return walk_from(g, rng, what, json, "", n_out);
}

/* ---- external validators ---------------------------------------------------------------------------- */

/* Runs `cmd` with the JSON text of `input` on stdin and returns its exit status; its stdout is
 * printed (one line per invalid document). */
static int run_validator(const char *cmd, json_t *input) {
    char path[] = "/tmp/cvllm-grammar-convert-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "w");
    json_dumpf(input, f, JSON_COMPACT);
    fclose(f);
    char *full = NULL;
    size_t len = 0, cap = 0;
    const char *parts[] = {cmd, " < ", path, " 2>&1"};
    for (size_t i = 0; i < 4; i++) cv_buf_append(&full, &len, &cap, parts[i], strlen(parts[i]));
    FILE *p = popen(full, "r");
    int status = -1;
    if (p) {
        char line[4096];
        while (fgets(line, sizeof line, p)) fprintf(stderr, "  validator: %s", line);
        status = pclose(p);
    }
    free(full);
    unlink(path);
    return status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#define AJV "NODE_PATH=/usr/share/nodejs node " CVLLM_SOURCE_DIR "/tests/tools/validate_json.js"
#define PYRE "python3 " CVLLM_SOURCE_DIR "/tests/tools/check_regex.py"

/* The documents of every JSON case, for one ajv run at the end. */
static json_t *ajv_jobs, *re_jobs;
static size_t n_documents;

static void add_job(json_t *jobs, const char *schema_key, json_t *schema, const char *list_key, json_t *texts) {
    json_t *job = json_object();
    json_object_set_new(job, schema_key, schema);
    json_object_set_new(job, list_key, texts);
    json_array_append_new(jobs, job);
}

/* ---- JSON schema cases -------------------------------------------------------------------------------- */

typedef struct bad {
    const char *text, *why;
} bad;

typedef struct schema_case {
    const char *name;
    const char *schema;
    const char *ajv_schema;         /* a draft-07 equivalent for ajv 6, when schema uses newer keywords */
    bool loose;                     /* strict_additional_properties off */
    const char *const *valid;
    const bad *invalid;
} schema_case;

#define V(...) ((const char *const[]){__VA_ARGS__, NULL})
#define X(...) ((const bad[]){__VA_ARGS__, {NULL, NULL}})

static const schema_case cases[] = {
    {.name = "person",
     .schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":40},"
               "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"email\":{\"type\":\"string\",\"format\":\"email\"},"
               "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":5}},\"required\":[\"name\",\"age\"]}",
     .valid = V("{\"name\":\"Ann\",\"age\":31}", "{\"name\":\"Bob\",\"age\":0,\"email\":\"bob.x@mail.example.com\",\"tags\":[\"a\",\"b\"]}",
                "{ \"name\" : \"C\" , \"age\" : 150 }", "{\n  \"name\": \"D\\\"q\\u00e9\\n\",\n  \"age\": 7,\n  \"tags\": []\n}",
                "{\"name\":\"\\ud83d\\ude00\",\"age\":1}"),
     .invalid = X({"{\"name\":\"Ann\"}", "required property age missing"},
                  {"{\"name\":\"Ann\",\"age\":151}", "age above maximum"},
                  {"{\"name\":\"Ann\",\"age\":-1}", "age below minimum"},
                  {"{\"name\":\"Ann\",\"age\":07}", "leading zero"},
                  {"{\"name\":\"\",\"age\":3}", "name shorter than minLength"},
                  {"{\"name\":\"Ann\",\"age\":3,\"tags\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\"]}", "more than maxItems tags"},
                  {"{\"age\":3,\"name\":\"Ann\"}", "properties out of schema order"},
                  {"{\"name\":\"Ann\",\"age\":3,\"x\":1}", "additional property under strict"},
                  {"{\"name\":\"Ann\",\"age\":3,}", "trailing comma"},
                  {"{\"name\":\"A\tb\",\"age\":3}", "raw control character in a string"},
                  {"{\"name\":\"A\\qb\",\"age\":3}", "bad escape"},
                  {"{\"name\":\"\\ud83d\",\"age\":3}", "lone surrogate escape"},
                  {"{\"name\":\"Ann\",\"age\":3,\"email\":\"no-at-sign\"}", "email without @"},
                  {"{\"name\":\"Ann\",\"age\":3.5}", "fraction in an integer"},
                  {"{\"name\":\"Ann\",\"age\":3}x", "text after the object"},
                  {"{\"name\":\"Ann\",                         \"age\":3}", "more whitespace than the cap"})},
    {.name = "enums",
     .schema = "{\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\",\"blue\"]},"
               "\"size\":{\"type\":\"string\",\"enum\":[\"S\",\"M\",\"L\",1]},\"level\":{\"enum\":[1,2.5,null,true,\"x\"]}},"
               "\"required\":[\"color\"]}",
     .valid = V("{\"color\":\"red\"}", "{\"color\":\"blue\",\"size\":\"L\",\"level\":2.5}", "{\"color\":\"green\",\"level\":null}"),
     .invalid = X({"{\"color\":\"yellow\"}", "value outside the enum"},
                  {"{\"color\":\"red\",\"size\":1}", "enum value of the wrong type"},
                  {"{\"color\":\"reds\"}", "an enum value's extension"},
                  {"{\"color\":\"red\",\"level\":2}", "number outside the enum"})},
    {.name = "enum beside keywords of other types",
     .schema = "{\"enum\":[\"ab\",\"abcd\",3,7],\"maxLength\":3,\"maximum\":5,\"properties\":{\"x\":{}},\"minItems\":2}",
     .valid = V("\"ab\"", "3"),
     .invalid = X({"\"abcd\"", "string longer than maxLength"}, {"7", "number above maximum"})},
    {.name = "order",
     .schema = "{\"type\":\"object\",\"properties\":{\"order_id\":{\"type\":\"string\",\"pattern\":\"^ORD-[0-9]{6}$\"},"
               "\"items\":{\"type\":\"array\",\"minItems\":1,\"items\":{\"type\":\"object\",\"properties\":{\"sku\":{\"type\":\"string\"},"
               "\"qty\":{\"type\":\"integer\",\"exclusiveMinimum\":0},\"price\":{\"type\":\"number\",\"minimum\":0}},"
               "\"required\":[\"sku\",\"qty\",\"price\"]}},\"shipping\":{\"type\":\"object\",\"properties\":{\"method\":{\"enum\":[\"ground\",\"air\"]},"
               "\"address\":{\"type\":\"string\"}},\"required\":[\"method\"]}},\"required\":[\"order_id\",\"items\"]}",
     .valid = V("{\"order_id\":\"ORD-000123\",\"items\":[{\"sku\":\"a\",\"qty\":1,\"price\":0}]}",
                "{\"order_id\":\"ORD-999999\",\"items\":[{\"sku\":\"a\",\"qty\":12,\"price\":9.99},{\"sku\":\"b\",\"qty\":3,\"price\":100}],"
                "\"shipping\":{\"method\":\"air\",\"address\":\"1 Main St\"}}"),
     .invalid = X({"{\"order_id\":\"ORD-12345\",\"items\":[{\"sku\":\"a\",\"qty\":1,\"price\":0}]}", "pattern: too few digits"},
                  {"{\"order_id\":\"ORD-123456\",\"items\":[]}", "fewer than minItems"},
                  {"{\"order_id\":\"ORD-123456\",\"items\":[{\"sku\":\"a\",\"qty\":0,\"price\":0}]}", "qty at the exclusive minimum"},
                  {"{\"order_id\":\"ORD-123456\",\"items\":[{\"sku\":\"a\",\"qty\":1,\"price\":-0.5}]}", "negative price"},
                  {"{\"order_id\":\"ORD-123456\",\"items\":[{\"sku\":\"a\",\"qty\":1,\"price\":1}],\"shipping\":{}}", "shipping without method"})},
    {.name = "tree ($defs recursion)",
     .schema = "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"integer\"},"
               "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"value\"]}},\"$ref\":\"#/$defs/node\"}",
     .ajv_schema = "{\"definitions\":{\"node\":{\"type\":\"object\",\"properties\":{\"value\":{\"type\":\"integer\"},"
                   "\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/node\"}}},\"required\":[\"value\"]}},"
                   "\"$ref\":\"#/definitions/node\"}",
     .valid = V("{\"value\":1}", "{\"value\":1,\"children\":[{\"value\":2},{\"value\":3,\"children\":[{\"value\":-4,\"children\":[]}]}]}"),
     .invalid = X({"{\"value\":1,\"children\":[{}]}", "child without value"},
                  {"{\"value\":1,\"children\":[{\"value\":\"2\"}]}", "child value of the wrong type"})},
    {.name = "linked list (root recursion, anyOf with null)",
     .schema = "{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"string\",\"maxLength\":3},"
               "\"next\":{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}",
     .valid = V("{\"v\":\"a\",\"next\":null}", "{\"v\":\"a\",\"next\":{\"v\":\"b\",\"next\":{\"v\":\"\",\"next\":null}}}"),
     .invalid = X({"{\"v\":\"a\",\"next\":{\"v\":\"b\"}}", "inner node without next"},
                  {"{\"v\":\"a\",\"next\":1}", "next neither a node nor null"})},
    {.name = "optional nullable (pydantic)",
     .schema = "{\"title\":\"User\",\"type\":\"object\",\"properties\":{\"id\":{\"title\":\"Id\",\"type\":\"integer\"},"
               "\"nickname\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":10},{\"type\":\"null\"}],\"default\":null,\"title\":\"Nickname\"},"
               "\"score\":{\"type\":[\"number\",\"null\"],\"minimum\":0}},\"required\":[\"id\"]}",
     .valid = V("{\"id\":5}", "{\"id\":5,\"nickname\":null}", "{\"id\":-5,\"nickname\":\"bo\",\"score\":0.5}", "{\"id\":1,\"score\":null}"),
     .invalid = X({"{\"id\":5,\"nickname\":\"01234567890\"}", "nickname longer than maxLength"},
                  {"{\"id\":5,\"score\":-1}", "negative score"})},
    {.name = "formats",
     .schema = "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},\"t\":{\"type\":\"string\",\"format\":\"time\"},"
               "\"dt\":{\"type\":\"string\",\"format\":\"date-time\"},\"u\":{\"type\":\"string\",\"format\":\"uuid\"},"
               "\"ip4\":{\"type\":\"string\",\"format\":\"ipv4\"},\"ip6\":{\"type\":\"string\",\"format\":\"ipv6\"},"
               "\"uri\":{\"type\":\"string\",\"format\":\"uri\"},\"host\":{\"type\":\"string\",\"format\":\"hostname\"},"
               "\"mail\":{\"type\":\"string\",\"format\":\"email\"}}}",
     .valid = V("{\"d\":\"2024-02-29\",\"t\":\"23:59:59.5+05:30\",\"dt\":\"2000-02-29T00:00:00Z\"}",
                "{\"u\":\"123e4567-e89b-12d3-a456-426614174000\",\"ip4\":\"192.168.0.255\",\"ip6\":\"2001:db8::8a2e:370:7334\"}",
                "{\"ip6\":\"::\",\"uri\":\"https://user@example.com:8080/a/b?x=1&y=%20#frag\",\"host\":\"api.example.com\",\"mail\":\"a.b+c@d-e.org\"}",
                "{\"ip6\":\"1:2:3:4:5:6:7:8\",\"uri\":\"urn:isbn:0451450523\"}"),
     .invalid = X({"{\"d\":\"2023-02-29\"}", "29 February of a common year"},
                  {"{\"d\":\"1900-02-29\"}", "1900 is not a leap year"},
                  {"{\"d\":\"2024-04-31\"}", "April has 30 days"},
                  {"{\"d\":\"2024-13-01\"}", "month 13"},
                  {"{\"t\":\"24:00:00Z\"}", "hour 24"},
                  {"{\"dt\":\"2024-01-01 10:00:00\"}", "date-time without an offset"},
                  {"{\"u\":\"123e4567-e89b-12d3-a456-42661417400\"}", "uuid one digit short"},
                  {"{\"ip4\":\"256.1.1.1\"}", "octet above 255"},
                  {"{\"ip6\":\"1::2::3\"}", "two ::"},
                  {"{\"uri\":\"no scheme\"}", "uri without a scheme"},
                  {"{\"host\":\"-bad.example\"}", "label starting with -"},
                  {"{\"mail\":\"a@b\"}", "email domain without a dot"})},
    {.name = "integer ranges",
     .schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":-1000,\"maximum\":-17},"
               "\"b\":{\"type\":\"integer\",\"exclusiveMinimum\":-3,\"exclusiveMaximum\":1000000},\"c\":{\"type\":\"integer\",\"minimum\":12345678901},"
               "\"d\":{\"type\":\"integer\",\"minimum\":2.5,\"maximum\":7.5}},\"required\":[\"a\",\"b\",\"c\",\"d\"]}",
     .valid = V("{\"a\":-17,\"b\":-2,\"c\":12345678901,\"d\":3}", "{\"a\":-1000,\"b\":999999,\"c\":99999999999999,\"d\":7}",
                "{\"a\":-500,\"b\":0,\"c\":12345678902,\"d\":5}"),
     .invalid = X({"{\"a\":-16,\"b\":0,\"c\":12345678901,\"d\":3}", "a above its maximum"},
                  {"{\"a\":-1001,\"b\":0,\"c\":12345678901,\"d\":3}", "a below its minimum"},
                  {"{\"a\":-17,\"b\":-3,\"c\":12345678901,\"d\":3}", "b at its exclusive minimum"},
                  {"{\"a\":-17,\"b\":1000000,\"c\":12345678901,\"d\":3}", "b at its exclusive maximum"},
                  {"{\"a\":-17,\"b\":0,\"c\":12345678900,\"d\":3}", "c one below its minimum"},
                  {"{\"a\":-17,\"b\":0,\"c\":12345678901,\"d\":2}", "d below the ceiling of 2.5"},
                  {"{\"a\":-17,\"b\":0,\"c\":12345678901,\"d\":8}", "d above the floor of 7.5"},
                  {"{\"a\":-017,\"b\":0,\"c\":12345678901,\"d\":3}", "leading zero"})},
    {.name = "number ranges",
     .schema = "{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1},"
               "\"t\":{\"type\":\"number\",\"exclusiveMinimum\":-273.15},\"n\":{\"type\":\"number\",\"maximum\":-0.5},"
               "\"x\":{\"type\":\"number\"},\"r\":{\"type\":\"number\",\"minimum\":1.25,\"exclusiveMaximum\":1.5}},"
               "\"required\":[\"p\",\"t\",\"n\",\"x\",\"r\"]}",
     .valid = V("{\"p\":0,\"t\":-273.14,\"n\":-0.5,\"x\":-1.5e-3,\"r\":1.25}", "{\"p\":1.000,\"t\":0,\"n\":-12,\"x\":0,\"r\":1.4999}",
                "{\"p\":0.3333,\"t\":1.0,\"n\":-0.51,\"x\":123.5E+10,\"r\":1.3}"),
     .invalid = X({"{\"p\":1.01,\"t\":0,\"n\":-1,\"x\":0,\"r\":1.3}", "p above 1"},
                  {"{\"p\":0,\"t\":-273.15,\"n\":-1,\"x\":0,\"r\":1.3}", "t at its exclusive minimum"},
                  {"{\"p\":0,\"t\":0,\"n\":-0.49,\"x\":0,\"r\":1.3}", "n above its maximum"},
                  {"{\"p\":0,\"t\":0,\"n\":-1,\"x\":01,\"r\":1.3}", "leading zero"},
                  {"{\"p\":0,\"t\":0,\"n\":-1,\"x\":1.,\"r\":1.3}", "fraction without digits"},
                  {"{\"p\":0,\"t\":0,\"n\":-1,\"x\":.5,\"r\":1.3}", "number starting with a dot"},
                  {"{\"p\":0,\"t\":0,\"n\":-1,\"x\":0,\"r\":1.5}", "r at its exclusive maximum"},
                  {"{\"p\":0,\"t\":0,\"n\":-1,\"x\":0,\"r\":1.2}", "r below its minimum"})},
    {.name = "close decimal bounds",
     .schema = "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"number\",\"minimum\":1.5,\"maximum\":1.501},"
               "{\"enum\":[2.5,2.501,2.502,\"x\"],\"maximum\":2.501,\"exclusiveMinimum\":2.5}]}}",
     .valid = V("[1.5,1.5005,1.501,1.50100,2.501,\"x\"]"),
     .invalid = X({"[1.5011]", "above 1.501 in the fourth place"}, {"[1.4999]", "below 1.5"}, {"[2.502]", "enum value above the maximum"},
                  {"[2.5]", "enum value at the exclusive minimum"})},
    {.name = "string lengths",
     .schema = "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":4},\"minItems\":2,\"maxItems\":3}",
     .valid = V("[\"ab\",\"abcd\"]", "[\"\\u00e9\\n\",\"\\ud83d\\ude00\\ud83d\\ude00\",\"\xe6\x97\xa5\xe6\x9c\xac\"]"),
     .invalid = X({"[\"ab\"]", "fewer than minItems"},
                  {"[\"ab\",\"a\"]", "string shorter than minLength"},
                  {"[\"ab\",\"abcde\"]", "string longer than maxLength"},
                  {"[\"ab\",\"ab\",\"ab\",\"ab\"]", "more than maxItems"})},
    {.name = "tool calls (array of {name, parameters})",
     .schema = "{\"type\":\"array\",\"minItems\":1,\"items\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},"
               "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\"]}},"
               "\"required\":[\"city\"]}},\"required\":[\"name\",\"parameters\"]},{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"search\"},"
               "\"parameters\":{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\"},\"limit\":{\"type\":\"integer\",\"minimum\":1,"
               "\"maximum\":50}},\"required\":[\"query\"]}},\"required\":[\"name\",\"parameters\"]}]}}",
     .valid = V("[{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Paris\"}}]",
                "[{\"name\":\"search\",\"parameters\":{\"query\":\"x\",\"limit\":50}},{\"name\":\"get_weather\",\"parameters\":{\"city\":\"B\",\"unit\":\"celsius\"}}]"),
     .invalid = X({"[]", "no call"},
                  {"[{\"name\":\"get_weather\",\"parameters\":{\"query\":\"x\"}}]", "another tool's parameters"},
                  {"[{\"name\":\"delete\",\"parameters\":{}}]", "unknown tool"},
                  {"[{\"name\":\"search\",\"parameters\":{\"query\":\"x\",\"limit\":51}}]", "limit above maximum"})},
    {.name = "tool calls as vLLM builds them (type beside anyOf, hoisted $defs)",
     .schema = "{\"type\":\"array\",\"minItems\":1,\"items\":{\"type\":\"object\",\"anyOf\":["
               "{\"properties\":{\"name\":{\"type\":\"string\",\"enum\":[\"get_weather\"]},\"parameters\":{\"type\":\"object\","
               "\"properties\":{\"location\":{\"$ref\":\"#/$defs/Location\"},\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7}},"
               "\"required\":[\"location\"],\"additionalProperties\":false}},\"required\":[\"name\",\"parameters\"]},"
               "{\"properties\":{\"name\":{\"type\":\"string\",\"enum\":[\"now\"]},\"parameters\":{\"type\":\"object\",\"properties\":{}}},"
               "\"required\":[\"name\",\"parameters\"]}]},"
               "\"$defs\":{\"Location\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},"
               "\"country\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}$\"}},\"required\":[\"city\"]}}}",
     .valid = V("[{\"name\":\"get_weather\",\"parameters\":{\"location\":{\"city\":\"Oslo\",\"country\":\"NO\"},\"days\":3}}]",
                "[{\"name\":\"now\",\"parameters\":{}},{\"name\":\"get_weather\",\"parameters\":{\"location\":{\"city\":\"\"}}}]"),
     .invalid = X({"[{\"name\":\"now\",\"parameters\":{\"x\":1}}]", "an argument the tool does not take"},
                  {"[{\"name\":\"get_weather\",\"parameters\":{\"location\":{\"city\":\"a\",\"country\":\"nor\"}}}]", "country pattern"},
                  {"[{\"name\":\"get_weather\",\"parameters\":{\"days\":3}}]", "location missing"})},
    {.name = "const values",
     .schema = "{\"type\":\"object\",\"properties\":{\"version\":{\"const\":{\"major\":1,\"tags\":[\"a\",null,true,2.5]}},"
               "\"kind\":{\"const\":\"fi\\\"xed\"}},\"required\":[\"version\",\"kind\"]}",
     .valid = V("{\"version\":{\"major\":1,\"tags\":[\"a\",null,true,2.5]},\"kind\":\"fi\\\"xed\"}"),
     .invalid = X({"{\"version\":{\"major\":2,\"tags\":[\"a\",null,true,2.5]},\"kind\":\"fi\\\"xed\"}", "another const"},
                  {"{\"version\":{\"major\":1,\"tags\":[\"a\",null,true,2.5]},\"kind\":\"fixed\"}", "const string without its quote"})},
    {.name = "additionalProperties schema",
     .schema = "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"i\":{\"type\":\"string\"}},\"required\":[\"id\"],"
               "\"additionalProperties\":{\"type\":\"number\"}}",
     .valid = V("{\"id\":1}", "{\"id\":1,\"x\":2.5,\"ids\":3}", "{\"id\":1,\"i\":\"s\",\"\":0}"),
     .invalid = X({"{\"id\":1,\"x\":\"s\"}", "additional property of the wrong type"},
                  {"{\"id\":1,\"id\":2}", "a declared name as an additional property"},
                  {"{\"id\":1,\"i\":\"s\",\"i\":3}", "a declared name (prefix of another) as an additional property"})},
    {.name = "loose object (not strict)",
     .schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}}}",
     .loose = true,
     .valid = V("{}", "{\"a\":true}", "{\"a\":false,\"b\":[1,{\"c\":null}]}", "{\"z\":\"\"}"),
     .invalid = X({"{\"a\":1}", "a of the wrong type"}, {"{\"b\":1,\"a\":true}", "declared property after an additional one"})},
    {.name = "prefixItems",
     .schema = "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":{\"type\":\"boolean\"},\"maxItems\":4}",
     .ajv_schema = "{\"type\":\"array\",\"items\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"additionalItems\":{\"type\":\"boolean\"},\"maxItems\":4}",
     .valid = V("[]", "[\"a\"]", "[\"a\",1]", "[\"a\",1,true,false]"),
     .invalid = X({"[1]", "first item of the wrong type"}, {"[\"a\",1,true,false,true]", "more than maxItems"},
                  {"[\"a\",1,2]", "rest item of the wrong type"})},
    {.name = "tuple (draft 7 items array, strict)",
     .schema = "{\"type\":\"array\",\"items\":[{\"type\":\"number\"},{\"type\":\"string\"}],\"minItems\":1}",
     .valid = V("[1]", "[1.5,\"x\"]"),
     .invalid = X({"[]", "fewer than minItems"}, {"[1,\"x\",2]", "item beyond the tuple under strict"})},
    {.name = "any value ({})",
     .schema = "{}",
     .valid = V("1", "\"s\"", "[1,{\"a\":[null,true,false]}]", "-0.5e+3", "{}"),
     .invalid = X({"tru", "truncated literal"}, {"[1,]", "trailing comma"}, {"{\"a\"}", "key without value"})},
    {.name = "type list with keywords",
     .schema = "{\"type\":[\"string\",\"null\",\"integer\"],\"maxLength\":3,\"minimum\":10}",
     .valid = V("null", "\"abc\"", "10", "12345"),
     .invalid = X({"\"abcd\"", "string longer than maxLength"}, {"9", "integer below minimum"}, {"true", "type not listed"})},
    {.name = "allOf of one $ref (definitions)",
     .schema = "{\"allOf\":[{\"$ref\":\"#/definitions/base\"}],\"definitions\":{\"base\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},"
               "\"required\":[\"x\"]}}}",
     .valid = V("{\"x\":1}"),
     .invalid = X({"{}", "required x missing"})},
    {.name = "allOf merged",
     .schema = "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]},"
               "{\"properties\":{\"b\":{\"type\":\"integer\",\"maximum\":5}},\"required\":[\"b\"]},{\"properties\":{\"b\":{\"minimum\":1}}}]}",
     .valid = V("{\"a\":\"\",\"b\":1}", "{\"a\":\"x\",\"b\":5}"),
     .invalid = X({"{\"a\":\"x\"}", "b missing"}, {"{\"a\":\"x\",\"b\":0}", "b below the minimum of a later allOf item"})},
    {.name = "allOf merging item schemas; $ref with escapes",
     .schema = "{\"allOf\":[{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/a~1b%20c\"}},{\"items\":{\"maxLength\":2},\"maxItems\":2}],"
               "\"$defs\":{\"a/b c\":{\"type\":\"string\",\"minLength\":1}}}",
     .ajv_schema = "{\"allOf\":[{\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/a~1b%20c\"}},{\"items\":{\"maxLength\":2},\"maxItems\":2}],"
                   "\"definitions\":{\"a/b c\":{\"type\":\"string\",\"minLength\":1}}}",
     .valid = V("[]", "[\"a\",\"bc\"]"),
     .invalid = X({"[\"\"]", "item shorter than the referenced minLength"}, {"[\"abc\"]", "item longer than the merged maxLength"},
                  {"[\"a\",\"b\",\"c\"]", "more than maxItems"})},
    {.name = "anyOf with sibling keywords (required either)",
     .schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"integer\"}},"
               "\"anyOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]}]}",
     .valid = V("{\"a\":\"x\"}", "{\"b\":1}", "{\"a\":\"x\",\"b\":2}"),
     .invalid = X({"{}", "neither a nor b"})},
    {.name = "oneOf discriminated",
     .schema = "{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"a\"},\"x\":{\"type\":\"integer\"}},\"required\":[\"kind\",\"x\"]},"
               "{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"b\"},\"y\":{\"type\":\"string\"}},\"required\":[\"kind\",\"y\"]}]}",
     .valid = V("{\"kind\":\"a\",\"x\":1}", "{\"kind\":\"b\",\"y\":\"\"}"),
     .invalid = X({"{\"kind\":\"a\",\"y\":\"\"}", "a's kind with b's field"})},
    {.name = "pattern narrowed by maxLength",
     .schema = "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]+$\",\"maxLength\":6}}",
     .valid = V("[\"Ab\",\"Abcdef\"]"),
     .invalid = X({"[\"Abcdefg\"]", "longer than maxLength"}, {"[\"A\"]", "pattern needs a lower-case letter"}, {"[\"ab\"]", "pattern needs a capital"})},
    {.name = "pattern with JSON escapes",
     .schema = "{\"type\":\"string\",\"pattern\":\"^a[\\\"\\\\\\\\\\n]b.c$\"}",
     .valid = V("\"a\\\"bxc\"", "\"a\\\\b\\tc\"", "\"a\\nb\xc3\xa9" "c\""),
     .invalid = X({"\"a\"bxc\"", "raw quote"}, {"\"axbxc\"", "character outside the class"}, {"\"a\\nb\\nc\"", "dot matching a newline"})},
    {.name = "unicode names and values",
     .schema = "{\"type\":\"object\",\"properties\":{\"\xe5\x90\x8d\xe5\x89\x8d\":{\"type\":\"string\",\"maxLength\":3},"
               "\"emoji\":{\"enum\":[\"\xf0\x9f\x98\x80\",\"\xc3\xbc\\\"q\\\\\"]}},\"required\":[\"\xe5\x90\x8d\xe5\x89\x8d\",\"emoji\"]}",
     .valid = V("{\"\xe5\x90\x8d\xe5\x89\x8d\":\"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\",\"emoji\":\"\xf0\x9f\x98\x80\"}",
                "{\"\xe5\x90\x8d\xe5\x89\x8d\":\"\",\"emoji\":\"\xc3\xbc\\\"q\\\\\"}"),
     .invalid = X({"{\"\xe5\x90\x8d\xe5\x89\x8d\":\"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xa7\",\"emoji\":\"\xf0\x9f\x98\x80\"}", "four characters"},
                  {"{\"\xe5\x90\x8d\xe5\x89\x8d\":\"\",\"emoji\":\"\xf0\x9f\x98\x81\"}", "another emoji"})},
    {.name = "booleans and null",
     .schema = "{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},\"nothing\":{\"type\":\"null\"}},\"required\":[\"ok\",\"nothing\"]}",
     .valid = V("{\"ok\":true,\"nothing\":null}", "{\"ok\":false,\"nothing\":null}"),
     .invalid = X({"{\"ok\":1,\"nothing\":null}", "1 is not a boolean"}, {"{\"ok\":true,\"nothing\":false}", "false is not null"})},
    {.name = "no-argument tool (empty properties)",
     .schema = "{\"type\":\"object\",\"properties\":{}}",
     .valid = V("{}", "{ }"),
     .invalid = X({"{\"a\":1}", "any property under strict"})},
    {.name = "required name outside properties",
     .schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"b\"],\"additionalProperties\":{\"type\":\"string\"}}",
     .valid = V("{\"b\":\"\"}", "{\"a\":1,\"b\":\"x\",\"c\":\"y\"}"),
     .invalid = X({"{\"a\":1}", "b missing"}, {"{\"b\":1}", "b of the additional schema's type"})},
    {.name = "false schemas",
     .schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"secret\":false},\"additionalProperties\":true,"
               "\"patternless\":1}",
     .valid = V("{}", "{\"a\":1,\"b\":2}"),
     .invalid = X({"{\"secret\":1}", "a property whose schema is false"})},
    {.name = "nested depth",
     .schema = "{\"type\":\"object\",\"properties\":{\"l1\":{\"type\":\"object\",\"properties\":{\"l2\":{\"type\":\"object\",\"properties\":{"
               "\"l3\":{\"type\":\"array\",\"items\":{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"leaf\":{\"type\":\"integer\"}},"
               "\"required\":[\"leaf\"]}}}},\"required\":[\"l3\"]}},\"required\":[\"l2\"]}},\"required\":[\"l1\"]}",
     .valid = V("{\"l1\":{\"l2\":{\"l3\":[[{\"leaf\":1}],[]]}}}"),
     .invalid = X({"{\"l1\":{\"l2\":{\"l3\":[[{}]]}}}", "leaf missing"})},
};

/* Whitespace options on one schema: the documents must keep to them. */
static bool ws_outside_strings(const char *s, const char *allowed) {
    bool in_str = false;
    for (const char *p = s; *p; p++) {
        if (in_str) {
            if (*p == '\\') p++;
            else if (*p == '"') in_str = false;
        } else if (*p == '"') {
            in_str = true;
        } else if ((*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') && !strchr(allowed, *p)) {
            return false;
        }
    }
    return true;
}

static void run_schema(const char *name, const char *schema, const char *ajv_schema, const cv_json_options *o,
                       const char *const *valid, const bad *invalid, const char *ws_allowed, cv_rng *rng) {
    char err[512];
    char *ebnf = cv_json_schema_to_ebnf(schema, strlen(schema), o, err, sizeof err);
    CHECK_MSG(ebnf != NULL, "%s: %s", name, err);
    if (!ebnf) return;
    cv_grammar *g = parse_ebnf(name, ebnf);
    if (!g) {
        free(ebnf);
        return;
    }
    for (size_t i = 0; valid && valid[i]; i++)
        CHECK_MSG(matches(g, valid[i], strlen(valid[i])), "%s: valid instance refused: %s\n%s", name, valid[i], ebnf);
    for (size_t i = 0; invalid && invalid[i].text; i++)
        CHECK_MSG(!matches(g, invalid[i].text, strlen(invalid[i].text)), "%s: invalid instance (%s) accepted: %s", name,
                  invalid[i].why, invalid[i].text);
    json_t *texts = json_array();
    for (int w = 0; w < WALKS; w++) {
        size_t n;
        char *doc = walk(g, rng, name, true, &n);
        if (!doc) continue;
        CHECK_MSG(cv_utf8_validate(doc, n, NULL) && strlen(doc) == n, "%s: walk produced invalid UTF-8 or NUL", name);
        if (ws_allowed)
            CHECK_MSG(ws_outside_strings(doc, ws_allowed), "%s: whitespace outside the option: %s", name, doc);
        json_array_append_new(texts, json_stringn(doc, n));
        n_documents++;
        free(doc);
    }
    json_error_t je;
    const char *for_ajv = ajv_schema ? ajv_schema : schema;
    json_t *sj = json_loads(for_ajv, JSON_DECODE_ANY, &je);
    CHECK_MSG(sj != NULL, "%s: test schema is not JSON: %s", name, je.text);
    if (sj)
        add_job(ajv_jobs, "schema", sj, "instances", texts);
    else
        json_decref(texts);
    cv_grammar_free(g);
    free(ebnf);
}

static void test_schemas(cv_rng *rng) {
    for (size_t i = 0; i < CV_ARRAY_LEN(cases); i++) {
        const schema_case *c = &cases[i];
        cv_json_options o = {.any_whitespace = true, .strict_additional_properties = !c->loose};
        run_schema(c->name, c->schema, c->ajv_schema, &o, c->valid, c->invalid, NULL, rng);
        /* compact: whitespace takes no share of the walks, so they reach further into the values */
        o.any_whitespace = false;
        run_schema(c->name, c->schema, c->ajv_schema, &o, NULL, NULL, "", rng);
    }
    /* the whitespace options, on the first case */
    const schema_case *p = &cases[0];
    cv_json_options compact = {.any_whitespace = false, .strict_additional_properties = true};
    run_schema("person, compact", p->schema, NULL, &compact, V("{\"name\":\"Ann\",\"age\":31,\"tags\":[\"a\",\"b\"]}"),
               X({"{ \"name\":\"Ann\",\"age\":31}", "space after {"}, {"{\"name\": \"Ann\",\"age\":31}", "space after :"},
                 {"{\"name\":\"Ann\",\"age\":31,\"tags\":[\"a\", \"b\"]}", "space after ,"}),
               "", rng);
    cv_json_options pat = {.any_whitespace = true, .whitespace_pattern = "[ ]?", .strict_additional_properties = true};
    run_schema("person, whitespace pattern", p->schema, NULL, &pat, V("{ \"name\" : \"Ann\" , \"age\" : 31 }"),
               X({"{\n\"name\":\"Ann\",\"age\":31}", "newline outside the pattern"}, {"{  \"name\":\"Ann\",\"age\":31}", "two spaces"}),
               " ", rng);
}

static void test_json_object(cv_rng *rng) {
    cv_json_options o = {.any_whitespace = true};
    char *ebnf = cv_json_object_ebnf(&o);
    CHECK(ebnf != NULL);
    if (!ebnf) return;
    cv_grammar *g = parse_ebnf("json_object", ebnf);
    if (g) {
        static const char *const valid[] = {"{}", "[]", "{\"a\":[1,2,{\"b\":null}],\"a\":\"dup\"}",
                                            "[ \"x\" , -1.5E-7 , true ]"};
        static const char *const invalid[] = {"1", "\"s\"", "null", "{\"a\":01}", "[1,]", "{\"a\":1}}", "{'a':1}"};
        for (size_t i = 0; i < CV_ARRAY_LEN(valid); i++)
            CHECK_MSG(matches(g, valid[i], strlen(valid[i])), "json_object refused %s", valid[i]);
        for (size_t i = 0; i < CV_ARRAY_LEN(invalid); i++)
            CHECK_MSG(!matches(g, invalid[i], strlen(invalid[i])), "json_object accepted %s", invalid[i]);
        json_t *texts = json_array();
        for (int w = 0; w < WALKS; w++) {
            size_t n;
            char *doc = walk(g, rng, "json_object", true, &n);
            if (doc) json_array_append_new(texts, json_stringn(doc, n)), n_documents++;
            free(doc);
        }
        add_job(ajv_jobs, "schema", json_loads("{\"type\":[\"object\",\"array\"]}", 0, NULL), "instances", texts);
        cv_grammar_free(g);
    }
    free(ebnf);
}

/* ---- regex cases ------------------------------------------------------------------------------------------ */

typedef struct regex_case {
    const char *regex;
    const char *const *valid;
    const char *const *invalid;
} regex_case;

static const regex_case regexes[] = {
    {"\\(\\d{3}\\) \\d{3}-\\d{4}", V("(555) 123-4567"), V("555 123-4567", "(555) 123-456", "(\xd9\xa0\xd9\xa0\xd9\xa0) 123-4567")},
    {"\\+?1?[-. ]?\\d{3}[-. ]?\\d{3}[-. ]?\\d{4}", V("+1-555-123-4567", "5551234567", "1 555.123.4567"), V("+1-555-123-456", "555-1234-567")},
    {"\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])", V("2024-01-31", "1999-12-01"), V("2024-13-01", "2024-00-10", "2024-1-01")},
    {"[\\w.+-]+@[\\w-]+\\.[\\w.-]+", V("a.b+c@ex-ample.co.uk"), V("a@b", "@b.c", "a b@c.d")},
    {"((25[0-5]|2[0-4]\\d|1?\\d?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1?\\d?\\d)", V("0.0.0.0", "255.255.255.255", "10.1.99.100"),
     V("256.1.1.1", "1.1.1", "1.1.1.1.")},
    {"(cat|dog|bird)s?( and (cat|dog|bird)s?)*", V("cat", "dogs and birds and cat"), V("cats and", "cow")},
    {"((a|b)(c(d|e)?)+)+f", V("acf", "bcdcecf", "acbcdf"), V("af", "acdd f", "abf")},
    {"[\xc3\xa0-\xc3\xbf]{2,4}|\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e|[\\u0400-\\u04FF]+",
     V("\xc3\xa0\xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", "\xd0\x96\xd0\xb8\xd0\xb2"), V("\xc3\xa0", "\xe6\x97\xa5\xe6\x9c\xac", "ab")},
    {"[^\\s,]+(,[^\\s,]+)*", V("a,b,c", "\xe2\x82\xac,x"), V("a,,b", "a b", "a,\xe3\x80\x80")},
    {"\\D{3}\\W\\w+", V("abc-x1_", "x y!z"), V("ab1-x", "abc-", "abc\xd9\xa0x")},
    {"a.c", V("abc", "a\xe2\x82\xac" "c", "a\tc"), V("a\nc", "ac")},
    {"^abc$", V("abc"), V("abcd", "ab")},
    {"^(foo|bar)$|baz", V("foo", "bar", "baz"), V("foobaz")},
    {"a+?b*?", V("a", "aab", "abbb"), V("b", "")},
    {"\\x41\\u00e9\\t\\.\\\\\\U0001F600", V("A\xc3\xa9\t.\\\xf0\x9f\x98\x80"), V("A\xc3\xa9\t.\\", "A\xc3\xa9 .\\\xf0\x9f\x98\x80")},
    {"x{2,}y{,3}z{3}", V("xxzzz", "xxxxyyyzzz"), V("xzzz", "xxyyyyzzz", "xxzz")},
    {"(?P<year>\\d{4})-(?P<m>\\d\\d)(?:/(?#comment)x)?", V("2024-01", "2024-01/x"), V("2024-1", "2024-01/")},
    {"a{,}b|a{x}", V("b", "aaab", "a{x}"), V("ax", "a{,}b")},
    {"[]a]+[^]a]", V("]]ab", "a]x"), V("]a", "aa]")},
    {"", V(""), V("a")},
    {"[\\d\\-+*/ ()]+", V("(1 + 2) * 3 - 4/5"), V("1 ^ 2", "")},
    {"[^a-z\\n]{1,3}", V("ABC", "\xe2\x82\xac", "1 "), V("a", "\n", "ABCD")},
};

static void test_regexes(cv_rng *rng) {
    for (size_t i = 0; i < CV_ARRAY_LEN(regexes); i++) {
        const regex_case *rc = &regexes[i];
        char err[512];
        char *ebnf = cv_regex_to_ebnf(rc->regex, strlen(rc->regex), err, sizeof err);
        CHECK_MSG(ebnf != NULL, "regex %s: %s", rc->regex, err);
        if (!ebnf) continue;
        cv_grammar *g = parse_ebnf(rc->regex, ebnf);
        if (g) {
            for (size_t j = 0; rc->valid[j]; j++)
                CHECK_MSG(matches(g, rc->valid[j], strlen(rc->valid[j])), "regex %s refused %s\n%s", rc->regex,
                          rc->valid[j], ebnf);
            for (size_t j = 0; rc->invalid[j]; j++)
                CHECK_MSG(!matches(g, rc->invalid[j], strlen(rc->invalid[j])), "regex %s accepted %s\n%s", rc->regex,
                          rc->invalid[j], ebnf);
            json_t *texts = json_array();
            for (int w = 0; w < WALKS; w++) {
                size_t n;
                char *doc = walk(g, rng, rc->regex, false, &n);
                if (!doc) continue;
                CHECK_MSG(cv_utf8_validate(doc, n, NULL), "regex %s: walk produced invalid UTF-8", rc->regex);
                json_array_append_new(texts, json_stringn(doc, n));
                n_documents++;
                free(doc);
            }
            add_job(re_jobs, "regex", json_string(rc->regex), "strings", texts);
            cv_grammar_free(g);
        }
        free(ebnf);
    }
}

/* ---- choices ------------------------------------------------------------------------------------------------- */

static void test_choices(cv_rng *rng) {
    static const char *const choices[] = {"positive", "negative",         "neutral", "a\"b", "back\\slash",
                                          "new\nline", "\xc3\xbcn\xc3\xaf", "pos",     "",     "negative"};
    char *ebnf = cv_choice_to_ebnf(choices, CV_ARRAY_LEN(choices));
    CHECK(ebnf != NULL);
    cv_grammar *g = ebnf ? parse_ebnf("choice", ebnf) : NULL;
    if (g) {
        for (size_t i = 0; i < CV_ARRAY_LEN(choices); i++)
            CHECK_MSG(matches(g, choices[i], strlen(choices[i])), "choice %s refused", choices[i]);
        static const char *const invalid[] = {"posi", "positives", "a\\\"b", "NEUTRAL", " pos"};
        for (size_t i = 0; i < CV_ARRAY_LEN(invalid); i++)
            CHECK_MSG(!matches(g, invalid[i], strlen(invalid[i])), "choice accepted %s", invalid[i]);
        for (int w = 0; w < 4 * WALKS; w++) {
            size_t n;
            char *doc = walk(g, rng, "choice", false, &n);
            if (!doc) continue;
            bool member = false;
            for (size_t i = 0; i < CV_ARRAY_LEN(choices) && !member; i++) member = strcmp(doc, choices[i]) == 0;
            CHECK_MSG(member, "choice walk produced %s", doc);
            free(doc);
        }
        cv_grammar_free(g);
    }
    free(ebnf);
    CHECK(cv_choice_to_ebnf(NULL, 0) == NULL);
    static const char *const not_utf8[] = {"ok", "\xff"};
    CHECK(cv_choice_to_ebnf(not_utf8, 2) == NULL);
}

/* ---- structural tags ------------------------------------------------------------------------------------------- */

/* A structural tag's EBNF through the engine; NULL (with a failed check) when it does not convert. */
static cv_grammar *structural(const char *what, const char *spec, bool ws) {
    char err[512] = "";
    cv_json_options o = {.any_whitespace = ws, .strict_additional_properties = true};
    char *ebnf = cv_structural_tag_to_ebnf(spec, strlen(spec), &o, err, sizeof err);
    CHECK_MSG(ebnf != NULL, "structural tag %s: %s", what, err);
    cv_grammar *g = ebnf ? parse_ebnf(what, ebnf) : NULL;
    free(ebnf);
    return g;
}

static void expect_texts(const char *what, const cv_grammar *g, const char *const *valid, const char *const *invalid) {
    for (size_t i = 0; valid && valid[i]; i++)
        CHECK_MSG(matches(g, valid[i], strlen(valid[i])), "structural tag %s refused %s", what, valid[i]);
    for (size_t i = 0; invalid && invalid[i]; i++)
        CHECK_MSG(!matches(g, invalid[i], strlen(invalid[i])), "structural tag %s accepted %s", what, invalid[i]);
}

#define WEATHER "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"," \
                "\"minimum\":1}},\"required\":[\"city\"]}"
#define SEARCH "{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\",\"maxLength\":8}},\"required\":[\"q\"]}"

/* Checks a text of the legacy tag below without the grammar engine: every "<function=" starts a
 * known begin, then one JSON value (jansson reads exactly one) that goes to ajv with that tool's
 * schema, then "</function>". */
static void check_function_text(const char *doc, size_t n, json_t *weather, json_t *search) {
    static const char *const begins[] = {"<function=get_weather>", "<function=search>"};
    size_t at = 0;
    for (const char *hit; (hit = memmem(doc + at, n - at, "<function=", 10)) != NULL;) {
        at = (size_t)(hit - doc);
        int tool = -1;
        for (int t = 0; t < 2 && tool < 0; t++)
            if (n - at >= strlen(begins[t]) && !memcmp(doc + at, begins[t], strlen(begins[t]))) tool = t;
        CHECK_MSG(tool >= 0, "structural tag walk: unknown tool at %zu: %.*s", at, (int)(n - at), doc + at);
        if (tool < 0) return;
        at += strlen(begins[tool]);
        json_error_t je;
        json_t *v = json_loadb(doc + at, n - at, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &je);
        CHECK_MSG(v != NULL, "structural tag walk: no JSON after the begin: %.*s", (int)(n - at), doc + at);
        if (!v) return;
        json_decref(v);
        const size_t used = (size_t)je.position;
        json_t *texts = json_array();
        json_array_append_new(texts, json_stringn(doc + at, used));
        add_job(ajv_jobs, "schema", json_incref(tool ? search : weather), "instances", texts);
        n_documents++;
        at += used;
        CHECK_MSG(n - at >= 11 && !memcmp(doc + at, "</function>", 11), "structural tag walk: no end after the JSON: %.*s",
                  (int)(n - at), doc + at);
    }
}

static void test_structural_tags(cv_rng *rng) {
    /* vLLM's legacy spelling: free text, and a call of either tool wherever "<function=" appears */
    const char *legacy = "{\"type\":\"structural_tag\",\"structures\":["
                         "{\"begin\":\"<function=get_weather>\",\"schema\":" WEATHER ",\"end\":\"</function>\"},"
                         "{\"begin\":\"<function=search>\",\"schema\":" SEARCH ",\"end\":\"</function>\"}],"
                         "\"triggers\":[\"<function=\"]}";
    cv_grammar *g = structural("legacy", legacy, true);
    if (g) {
        expect_texts("legacy", g,
                     V("", "Plain text, no call.", "<functio", "I'll check. <function=get_weather>{\"city\": \"Paris\"}</function>",
                       "<<function=search>{\"q\":\"cvllm\"}</function> then <function=get_weather>{\"city\":\"Oslo\","
                       "\"days\":3}</function>\u00fcber", "\xe2\x9c\x93 <function=search>{ \"q\" : \"x\" }</function>"),
                     V("<function=unknown>{}</function>", "<function=get_weather>{\"days\":2}</function>",
                       "<function=search>{\"q\":\"too long query\"}</function>", "<function=get_weather>{\"city\":\"A\"}",
                       "<function=get_weather>{\"city\":\"A\"}</func", "<function=search>{\"q\":\"a\"} </function>"));
        json_t *weather = json_loads(WEATHER, 0, NULL), *search = json_loads(SEARCH, 0, NULL);
        static const char *const prefixes[] = {"<function=get_weather>", "<function=search>", "ok <function="};
        for (int w = 0; w < 3 * WALKS; w++) {
            size_t n;
            char *doc = walk_from(g, rng, "legacy structural tag", true, prefixes[w % 3], &n);
            if (!doc) continue;
            CHECK_MSG(cv_utf8_validate(doc, n, NULL), "structural tag walk produced invalid UTF-8");
            check_function_text(doc, n, weather, search);
            free(doc);
        }
        json_decref(weather);
        json_decref(search);
        cv_grammar_free(g);
    }

    /* a Qwen-style forced call: at least one, then nothing after it; excluded text never appears */
    const char *forced = "{\"type\":\"structural_tag\",\"format\":{\"type\":\"triggered_tags\","
                         "\"triggers\":[\"<tool_call>\"],\"at_least_one\":true,\"stop_after_first\":true,"
                         "\"excludes\":[\"BAD\"],\"tags\":[{\"type\":\"tag\",\"begin\":\"<tool_call>\\n{\\\"name\\\": "
                         "\\\"search\\\", \\\"arguments\\\": \",\"content\":{\"type\":\"json_schema\",\"json_schema\":"
                         SEARCH "},\"end\":\"}\\n</tool_call>\"}]}}";
    g = structural("forced", forced, false);
    if (g) {
        expect_texts("forced", g,
                     V("<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\":\"a\"}}\n</tool_call>",
                       "Let me look. BA <tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\":\"b\"}}\n</tool_call>"),
                     V("", "no call at all", "BAD <tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\":\"a\"}}\n</tool_call>",
                       "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\":\"a\"}}\n</tool_call> more",
                       "<tool_call>\n{\"name\": \"other\", \"arguments\": {\"q\":\"a\"}}\n</tool_call>"));
        cv_grammar_free(g);
    }

    /* a sequence of a tag of any text and a constant; tags with a separator; or; regex; grammar */
    const char *think = "{\"type\":\"structural_tag\",\"format\":{\"type\":\"sequence\",\"elements\":["
                        "{\"type\":\"tag\",\"begin\":\"<think>\",\"content\":{\"type\":\"any_text\"},\"end\":\"</think>\"},"
                        "{\"type\":\"or\",\"elements\":[{\"type\":\"const_string\",\"value\":\"OK\"},"
                        "{\"type\":\"regex\",\"pattern\":\"[0-9]{2,3}\"},{\"type\":\"grammar\",\"grammar\":"
                        "\"root ::= \\\"x\\\" rest\\nrest ::= [a-c]*\"}]},"
                        "{\"type\":\"tags_with_separator\",\"separator\":\",\",\"tags\":["
                        "{\"begin\":\"<a>\",\"content\":{\"type\":\"const_string\",\"value\":\"1\"},\"end\":\"</a>\"},"
                        "{\"begin\":\"<b>\",\"content\":{\"type\":\"any_text\"},\"end\":[\"</b>\",\"</B>\"]}]}]}}";
    g = structural("think", think, true);
    if (g) {
        expect_texts("think", g,
                     V("<think></think>OK", "<think>a < b </think>42<a>1</a>", "<think>\n</thin</think>xab<b>zz</B>,<a>1</a>",
                       "<think>x</think>123<b></b>,<b>,</b>"),
                     V("<think>a</think>b</think>OK", "<think>OK", "<think></think>4", "<think></think>OK<a>2</a>",
                       "<think></think>OK<a>1</a><a>1</a>", "<think></think>xd", "<think></think>OK,"));
        cv_grammar_free(g);
    }
}

/* ---- errors ---------------------------------------------------------------------------------------------------- */

static void expect_schema_error(const char *schema, const char *msg) {
    char err[512];
    cv_json_options o = {.any_whitespace = true, .strict_additional_properties = true};
    char *ebnf = cv_json_schema_to_ebnf(schema, strlen(schema), &o, err, sizeof err);
    CHECK_MSG(ebnf == NULL, "schema %.200s converted, expected error '%s'", schema, msg);
    free(ebnf);
    if (ebnf) return;
    CHECK_MSG(strstr(err, msg) != NULL, "schema %.200s: error '%s' does not contain '%s'", schema, err, msg);
    CHECK_MSG(!strchr(err, '\n'), "error message has more than one line: %s", err);
}

static void expect_regex_error(const char *regex, const char *msg) {
    char err[512];
    char *ebnf = cv_regex_to_ebnf(regex, strlen(regex), err, sizeof err);
    CHECK_MSG(ebnf == NULL, "regex %s converted, expected error '%s'", regex, msg);
    free(ebnf);
    if (!ebnf) CHECK_MSG(strstr(err, msg) != NULL, "regex %s: error '%s' does not contain '%s'", regex, err, msg);
}

static void expect_structural_error(const char *spec, const char *msg) {
    char err[512] = "";
    cv_json_options o = {.any_whitespace = true, .strict_additional_properties = true};
    char *ebnf = cv_structural_tag_to_ebnf(spec, strlen(spec), &o, err, sizeof err);
    CHECK_MSG(ebnf == NULL, "structural tag %.200s converted, expected error '%s'", spec, msg);
    free(ebnf);
    if (!ebnf) CHECK_MSG(strstr(err, msg) != NULL, "structural tag %.200s: error '%s' does not contain '%s'", spec, err, msg);
}

static void test_errors(void) {
    expect_structural_error("{\"type\":\"structural_tag\",\"format\":{\"type\":\"qwen_xml_parameter\"}}",
                            "the format type \"qwen_xml_parameter\" is not supported");
    expect_structural_error("{\"structures\":[{\"begin\":\"<f>\",\"schema\":{},\"end\":\"</f>\"}],\"triggers\":[\"<g\"]}",
                            "tag 0's begin \"<f>\" does not start with any trigger");
    expect_structural_error("{\"structures\":[{\"begin\":\"<f>\",\"schema\":{},\"end\":\"</f>\"}],\"triggers\":[\"<f\",\"<h\"]}",
                            "no tag begins with the trigger \"<h\"");
    expect_structural_error("{\"structures\":[{\"begin\":\"<f>\",\"schema\":{\"type\":\"strin\"},\"end\":\"</f>\"}],"
                            "\"triggers\":[\"<f\"]}", "json_schema: unknown type 'strin'");
    expect_structural_error("{\"type\":\"structural_tag\",\"format\":{\"type\":\"sequence\",\"elements\":["
                            "{\"type\":\"any_text\"},{\"type\":\"const_string\",\"value\":\"x\"}]}}",
                            "any_text must be the content of a tag or the last part of the output");
    expect_structural_error("{\"type\":\"structural_tag\"}", "needs \"format\"");
    expect_structural_error("[1]", "must be a JSON object");
    expect_structural_error("{\"format\":", "not JSON");
    expect_structural_error("{\"format\":{\"type\":\"regex\",\"pattern\":\"(?=a)\"}}", "regex: ");
    expect_structural_error("{\"format\":{\"type\":\"tag\",\"begin\":\"a\",\"content\":{\"type\":\"any_text\"},\"end\":\"\"}}",
                            "empty");
    expect_schema_error("{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":\"array\",\"uniqueItems\":true}}}",
                        "unsupported keyword 'uniqueItems' at /properties/tags");
    expect_schema_error("{\"not\":{\"type\":\"string\"}}", "unsupported keyword 'not' at /");
    expect_schema_error("{\"type\":\"object\",\"if\":{},\"then\":{}}", "unsupported keyword 'if'");
    expect_schema_error("{\"type\":\"object\",\"patternProperties\":{\"^x\":{}}}", "unsupported keyword 'patternProperties'");
    expect_schema_error("{\"properties\":{\"n\":{\"type\":\"integer\",\"multipleOf\":3}}}", "unsupported keyword 'multipleOf' at /properties/n");
    expect_schema_error("{\"type\":\"object\",\"dependentRequired\":{\"a\":[\"b\"]}}", "unsupported keyword 'dependentRequired'");
    expect_schema_error("{\"type\":\"object\",\"minProperties\":2}", "unsupported keyword 'minProperties'");
    expect_schema_error("{\"$defs\":{\"a\":{\"items\":{\"$ref\":\"#/$defs/a/x\"}}},\"$ref\":\"#/$defs/a\"}", "points to nothing at /$defs/a/items");
    expect_schema_error("{\"$ref\":\"#\"}", "refers back to itself");
    expect_schema_error("{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}", "refers back to itself before any input at /anyOf/0");
    expect_schema_error("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/b\"},\"b\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", "refers back to itself");
    expect_schema_error("{\"$ref\":\"https://example.com/s.json\"}", "unsupported $ref");
    expect_schema_error("{\"$ref\":\"#/$defs/missing\"}", "points to nothing");
    expect_schema_error("{\"type\":\"strin\"}", "unknown type 'strin'");
    expect_schema_error("{\"type\":\"string\",\"format\":\"color\"}", "unsupported format 'color'");
    expect_schema_error("{\"type\":\"integer\",\"minimum\":5,\"exclusiveMaximum\":5}", "no integer lies between");
    expect_schema_error("{\"type\":\"number\",\"minimum\":2,\"maximum\":1.5}", "no number lies between");
    expect_schema_error("{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}", "minLength is greater than maxLength");
    expect_schema_error("{\"type\":\"string\",\"maxLength\":-1}", "'maxLength' must be a non-negative integer");
    expect_schema_error("{\"type\":", "not JSON");
    expect_schema_error("false", "accepts nothing");
    expect_schema_error("[1]", "must be an object or a boolean");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"(?<=a)b\"}", "unsupported pattern (lookarounds are not supported at offset 0)");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"a+b+\",\"maxLength\":4}", "together with this pattern is not supported");
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"abcdef\",\"maxLength\":4}", "no string matching the pattern");
    /* a branch dropped as too long, then one that cannot be narrowed */
    expect_schema_error("{\"type\":\"string\",\"pattern\":\"abcdefgh|a+b+\",\"maxLength\":4}",
                        "together with this pattern is not supported");
    expect_schema_error("{\"type\":\"string\",\"format\":\"email\",\"maxLength\":40}", "together with this format is not supported");
    expect_schema_error("{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"],\"additionalProperties\":false}",
                        "required property 'b' is not allowed by additionalProperties at /");
    expect_schema_error("{\"type\":\"object\",\"properties\":{\"a\":false},\"required\":[\"a\"]}", "required property 'a' has the schema false");
    expect_schema_error("{\"type\":\"array\",\"items\":false,\"minItems\":1}", "minItems exceeds");
    expect_schema_error("{\"type\":\"string\",\"anyOf\":[{\"type\":\"integer\"}]}", "allow no common type at /anyOf/0");
    expect_schema_error("{\"properties\":{\"a\":{}},\"allOf\":[{\"additionalProperties\":false}]}", "properties or items interact");
    expect_schema_error("{\"allOf\":[{\"pattern\":\"a\"},{\"pattern\":\"b\"}]}", "both have 'pattern'");
    expect_schema_error("{\"type\":\"object\",\"anyOf\":[{\"not\":{\"required\":[\"a\"]}}]}", "unsupported keyword 'not' at /anyOf/0");
    expect_schema_error("{\"allOf\":[{\"items\":[{}]},{\"items\":{}}]}", "properties or items interact is not supported at /");
    expect_schema_error("{\"enum\":[\"a\"],\"pattern\":\"a\"}", "'pattern' together with enum/const");
    expect_schema_error("{\"enum\":[1,{\"k\":1}],\"required\":[\"k\"]}", "'required' together with enum/const");
    expect_schema_error("{\"type\":\"integer\",\"enum\":[\"a\",1.5]}", "no value of enum/const");
    expect_schema_error("{\"anyOf\":[false,false]}", "no branch of 'anyOf'");
    expect_schema_error("{\"properties\":{\"a\\nb\":{\"not\":{}}}}", "at /properties/a?b");

    /* the limits: depth, size, and work that would otherwise grow without bound */
    char *deep = malloc(20000);
    size_t n = 0;
    for (int i = 0; i < 100; i++) n += (size_t)sprintf(deep + n, "{\"type\":\"array\",\"items\":");
    n += (size_t)sprintf(deep + n, "{}");
    for (int i = 0; i < 100; i++) deep[n++] = '}';
    deep[n] = 0;
    expect_schema_error(deep, "schema too deep");
    free(deep);
    char *big = NULL;
    size_t len = 0, cap = 0;
    cv_buf_append(&big, &len, &cap, "{\"enum\":[", 9);
    for (int i = 0; i < 50000; i++) {
        char item[128];
        /* 100-character values: 50,000 of them pass the 4 MB bound on the grammar */
        int k = snprintf(item, sizeof item, "%s\"%06d-%093d\"", i ? "," : "", i, 0);
        cv_buf_append(&big, &len, &cap, item, (size_t)k);
    }
    cv_buf_append(&big, &len, &cap, "]}", 2);
    expect_schema_error(big, "schema too large");
    free(big);
    /* each level references the next twice, beside a keyword: inlined, it would double per level */
    char *twice = NULL;
    len = cap = 0;
    const char *head = "{\"$ref\":\"#/$defs/d0\",\"$defs\":{";
    cv_buf_append(&twice, &len, &cap, head, strlen(head));
    for (int i = 0; i < 40; i++) {
        char item[256];
        int k = snprintf(item, sizeof item, "\"d%d\":{\"anyOf\":[{\"$ref\":\"#/$defs/d%d\",\"minLength\":1},{\"$ref\":\"#/$defs/d%d\",\"maxLength\":9}]},",
                         i, i + 1, i + 1);
        cv_buf_append(&twice, &len, &cap, item, (size_t)k);
    }
    const char *tail = "\"d40\":{\"type\":\"string\"}}}";
    cv_buf_append(&twice, &len, &cap, tail, strlen(tail));
    expect_schema_error(twice, "schema too large");
    free(twice);

    /* options that cannot make JSON */
    char err[256];
    cv_json_options bad_ws = {.any_whitespace = true, .whitespace_pattern = "[ x]*"};
    CHECK(cv_json_schema_to_ebnf("{}", 2, &bad_ws, err, sizeof err) == NULL);
    CHECK_CONTAINS(err, "whitespace pattern may match characters other than JSON whitespace");
    CHECK(cv_json_object_ebnf(&bad_ws) == NULL);
    bad_ws.whitespace_pattern = "( ";
    CHECK(cv_json_schema_to_ebnf("{}", 2, &bad_ws, err, sizeof err) == NULL);
    CHECK_CONTAINS(err, "invalid whitespace pattern: missing ), unterminated subpattern at offset 0");

    /* counts past the engine's repetition limit: a maximum is lowered (a subset), a minimum refused */
    cv_json_options o = {.any_whitespace = true};
    const char *huge = "{\"type\":\"array\",\"maxItems\":100000,\"items\":{\"type\":\"string\",\"maxLength\":70000}}";
    char *ebnf = cv_json_schema_to_ebnf(huge, strlen(huge), &o, err, sizeof err);
    CHECK_MSG(ebnf != NULL, "%s", err);
    cv_grammar *g = ebnf ? parse_ebnf("huge counts", ebnf) : NULL;
    if (g) CHECK(matches(g, "[\"abc\",\"\"]", 10));
    cv_grammar_free(g);
    free(ebnf);
    expect_schema_error("{\"type\":\"string\",\"minLength\":20000}", "'minLength' above 10000 is not supported");
    expect_schema_error("{\"type\":\"array\",\"minItems\":20000}", "'minItems' above 10000 is not supported");
    expect_schema_error("{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}",
                        "required property 'b' is not in properties, and other properties are off (strict)");

    expect_regex_error("(?=a)b", "lookarounds are not supported at offset 0");
    expect_regex_error("a(?!b)", "lookarounds are not supported at offset 1");
    expect_regex_error("(a)\\1", "backreferences are not supported at offset 3");
    expect_regex_error("(?P<x>a)(?P=x)", "backreferences are not supported at offset 8");
    expect_regex_error("\\bword", "word boundaries");
    expect_regex_error("a^b", "'^' is only supported at the start at offset 1");
    expect_regex_error("a$b", "'$' is only supported at the end at offset 1");
    expect_regex_error("(^a)*", "'^' is only supported at the start");
    expect_regex_error("(?i)abc", "inline flags are not supported at offset 0");
    expect_regex_error("a**", "multiple repeat at offset 2");
    expect_regex_error("*a", "nothing to repeat at offset 0");
    expect_regex_error("(ab", "missing ), unterminated subpattern at offset 0");
    expect_regex_error("ab)", "unbalanced parenthesis at offset 2");
    expect_regex_error("[a-", "unterminated character set at offset 0");
    expect_regex_error("[z-a]", "bad character range at offset 1");
    expect_regex_error("[a-\\d]", "bad character range");
    expect_regex_error("a{3,1}", "min repeat greater than max repeat at offset 1");
    expect_regex_error("a{1000000}", "repetition count above");
    expect_regex_error("a*+", "possessive quantifiers are not supported at offset 2");
    expect_regex_error("\\q", "unsupported escape \\q at offset 0");
    expect_regex_error("[^\\s\\S]", "the regex matches nothing");
    expect_regex_error("a\xff", "invalid UTF-8 at offset 1");
    expect_regex_error("(?>a)", "atomic groups");
}

int main(void) {
    cv_rng rng;
    cv_rng_seed(&rng, 14);
    ajv_jobs = json_array();
    re_jobs = json_array();
    test_schemas(&rng);
    test_json_object(&rng);
    test_regexes(&rng);
    test_choices(&rng);
    test_structural_tags(&rng);
    test_errors();
    printf("%zu random documents\n", n_documents);
    /* the validators themselves: they must say no to what is invalid */
    json_t *probe = json_array();
    json_t *bad_int = json_array();
    json_array_append_new(bad_int, json_string("1.5"));
    add_job(probe, "schema", json_loads("{\"type\":\"integer\"}", 0, NULL), "instances", bad_int);
    CHECK_EQ_INT(run_validator(AJV, probe), 1);
    json_decref(probe);
    probe = json_array();
    json_t *bad_str = json_array();
    json_array_append_new(bad_str, json_string("ab"));
    add_job(probe, "regex", json_string("a"), "strings", bad_str);
    CHECK_EQ_INT(run_validator(PYRE, probe), 1);
    json_decref(probe);
    int rc = run_validator(AJV, ajv_jobs);
    CHECK_MSG(rc == 0, "ajv found invalid documents (exit %d; 2: a schema refused, 127: node missing)", rc);
    rc = run_validator(PYRE, re_jobs);
    CHECK_MSG(rc == 0, "Python's re found non-matching strings (exit %d; 127: python3 missing)", rc);
    json_decref(ajv_jobs);
    json_decref(re_jobs);
    return cv_check_summary("test_grammar_convert");
}
