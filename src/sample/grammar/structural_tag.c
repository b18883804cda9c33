/*
 * structural_tag.c — vLLM's structural tags (xgrammar's format) → EBNF.
 *
 * A structural tag mixes free text with constrained pieces: the model writes what it likes until a
 * trigger string appears (say "<function="), and from there the text must be one of the tags that
 * begin with that trigger — the rest of its begin, its content (a JSON schema, …), its end — after
 * which free text resumes. Two spellings reach cvllm, both JSON objects of type "structural_tag":
 *   - the legacy one, {"structures": [{"begin", "schema", "end"}], "triggers": [...]}, which is a
 *     triggered_tags format over json_schema contents and is compiled as one;
 *   - {"format": F} with F one of: const_string {value}; json_schema {json_schema}; regex
 *     {pattern}; grammar {grammar} (EBNF); sequence {elements}; or {elements}; tag {begin, content,
 *     end}; any_text (the content of a tag: any text up to its end; or the last piece of the
 *     output: any text); triggered_tags {triggers, tags, at_least_one, stop_after_first,
 *     excludes}; tags_with_separator {tags, separator, at_least_one, stop_after_first}. Other types
 *     are refused by name.
 *
 * Free text that must watch for strings (triggers, excludes, a tag's end after any_text) is an
 * Aho-Corasick automaton over code points written as rules: one rule per trie node that is not a
 * match, each listing the characters that lead to a node other than the root, one class of all
 * other characters back to the root's rule, and the empty alternative where the text may end. A
 * character that completes a trigger leads to the dispatch rule of that node (every tag whose begin
 * starts with a trigger that ends there); one that completes an exclude leads nowhere, so no output
 * contains it; one that completes a tag's end closes the any_text.
 *
 * Sub-grammars (schemas, regexes, user grammars) are converted on their own and embedded with their
 * rule names prefixed, so their rules never meet another's. JSON schema contents take the request's
 * JSON options (whitespace, additional properties) like a json constraint.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/utf8.h"
#include "sample/grammar/convert.h"

/* Nesting of formats and tags, and the code points of all watched strings of one free text. */
enum { MAX_DEPTH = 64, MAX_WATCH_CPS = 4096 };

typedef struct st_ctx {
    cv_text rules;           /* every rule but root */
    const cv_json_options *jo;
    unsigned next;           /* for fresh rule names */
    char *err;
    size_t err_len;
    bool failed;
} st_ctx;

static bool fail(st_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(st_ctx *c, const char *fmt, ...) {
    if (c->failed) return false;
    c->failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->err_len, fmt, ap);
    va_end(ap);
    return false;
}

/* A fresh rule name "st<n>-<what>" (what: a short word). */
static void fresh(st_ctx *c, char out[40], const char *what) { snprintf(out, 40, "st%u-%s", c->next++, what); }

static bool is_name_char(char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
}

/* Appends EBNF text with every rule name prefixed; names are whatever is not inside a literal, a
 * class, a repetition bound or a comment. */
static void put_prefixed(cv_text *t, const char *s, const char *prefix) {
    for (size_t i = 0; s[i];) {
        const char ch = s[i];
        if (ch == '"' || ch == '[') { /* a literal or a class: to its unescaped close */
            const char close = ch == '"' ? '"' : ']';
            size_t j = i + 1;
            while (s[j] && s[j] != close) j += s[j] == '\\' && s[j + 1] ? 2 : 1;
            if (s[j]) j++;
            cv_text_putn(t, s + i, j - i);
            i = j;
        } else if (ch == '{' || ch == '#') { /* a bound, or a comment to the end of the line */
            size_t j = i;
            while (s[j] && s[j] != (ch == '{' ? '}' : '\n')) j++;
            if (s[j]) j++;
            cv_text_putn(t, s + i, j - i);
            i = j;
        } else if (is_name_char(ch)) {
            size_t j = i;
            while (is_name_char(s[j])) j++;
            cv_text_put(t, prefix);
            cv_text_putn(t, s + i, j - i);
            i = j;
        } else {
            cv_text_putn(t, s + i, 1);
            i++;
        }
    }
    cv_text_put(t, "\n");
}

/* Embeds a converted grammar (start rule "root"); its root's new name goes to name. */
static void embed(st_ctx *c, const char *ebnf, char name[48]) {
    char prefix[24];
    snprintf(prefix, sizeof prefix, "g%u-", c->next++);
    put_prefixed(&c->rules, ebnf, prefix);
    snprintf(name, 48, "%sroot", prefix);
}

static bool starts_with(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

/* ---- watched free text (Aho-Corasick over code points) ------------------------------------------ */

/* What completing a watched string means. */
typedef enum watch_kind { W_TRIGGER, W_EXCLUDE, W_END } watch_kind;

typedef struct watch {
    const char *s;           /* UTF-8 */
    watch_kind kind;
} watch;

typedef struct ac_node {
    uint32_t cp;             /* the edge into this node */
    int parent, fail;
    int first_child, next_sibling;
    int depth;
    int ends;                /* the watch ending exactly here, or -1 */
} ac_node;

typedef struct ac {
    ac_node *n;
    int count, cap;
    uint32_t *alphabet;      /* every code point on an edge, once */
    size_t n_alpha;
} ac;

static int ac_child(const ac *a, int node, uint32_t cp) {
    for (int k = a->n[node].first_child; k >= 0; k = a->n[k].next_sibling)
        if (a->n[k].cp == cp) return k;
    return -1;
}

static int ac_add_node(ac *a, int parent, uint32_t cp) {
    if (a->count == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 16;
        a->n = cv_xrealloc(a->n, (size_t)a->cap * sizeof *a->n);
    }
    const int k = a->count++;
    a->n[k] = (ac_node){.cp = cp, .parent = parent, .fail = 0, .first_child = -1, .next_sibling = -1,
                        .depth = parent < 0 ? 0 : a->n[parent].depth + 1, .ends = -1};
    if (parent >= 0) {
        a->n[k].next_sibling = a->n[parent].first_child;
        a->n[parent].first_child = k;
    }
    return k;
}

/* The automaton's step: the longest suffix of node's string + cp that is a prefix of a watch. */
static int ac_step(const ac *a, int node, uint32_t cp) {
    for (;;) {
        const int k = ac_child(a, node, cp);
        if (k >= 0) return k;
        if (node == 0) return 0;
        node = a->n[node].fail;
    }
}

/* Builds the trie and its failure links; false (with the reason) on an empty or non-UTF-8 string. */
static bool ac_build(st_ctx *c, ac *a, const watch *w, size_t n) {
    *a = (ac){0};
    ac_add_node(a, -1, 0);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = w[i].s;
        const size_t len = strlen(s);
        if (!len) return fail(c, "a trigger, exclude or end string is empty");
        if (!cv_utf8_validate(s, len, NULL)) return fail(c, "a trigger, exclude or end string is not valid UTF-8");
        int node = 0;
        for (size_t off = 0; off < len;) {
            uint32_t cp;
            size_t used;
            cv_utf8_decode(s + off, len - off, &cp, &used);
            off += used;
            if (++total > MAX_WATCH_CPS)
                return fail(c, "the trigger, exclude and end strings of one text are longer than %d characters in all",
                            MAX_WATCH_CPS);
            int k = ac_child(a, node, cp);
            if (k < 0) {
                k = ac_add_node(a, node, cp);
                bool seen = false;
                for (size_t q = 0; q < a->n_alpha && !seen; q++) seen = a->alphabet[q] == cp;
                if (!seen) {
                    a->alphabet = cv_xrealloc(a->alphabet, (a->n_alpha + 1) * sizeof *a->alphabet);
                    a->alphabet[a->n_alpha++] = cp;
                }
            }
            node = k;
        }
        if (a->n[node].ends < 0) a->n[node].ends = (int)i;
    }
    /* failure links breadth first: node ids grow with depth along any path, so visit by depth */
    int max_depth = 0;
    for (int k = 0; k < a->count; k++) max_depth = a->n[k].depth > max_depth ? a->n[k].depth : max_depth;
    for (int d = 1; d <= max_depth; d++)
        for (int k = 1; k < a->count; k++) {
            if (a->n[k].depth != d) continue;
            const int p = a->n[k].parent;
            a->n[k].fail = p == 0 ? 0 : ac_step(a, a->n[p].fail, a->n[k].cp);
        }
    return true;
}

static void ac_free(ac *a) {
    free(a->n);
    free(a->alphabet);
}

/* A node completes a watch when a watch ends there or at a node on its failure chain. */
static bool ac_matches(const ac *a, int node) {
    for (int k = node; k > 0; k = a->n[k].fail)
        if (a->n[k].ends >= 0) return true;
    return false;
}

/* The free text as rules "<base>-<node>", the root state "<base>-0" (a fresh name the caller makes,
 * so that it can be referred to before its rules exist): dispatch(ctx, node, out) writes the
 * expression that follows a completed watch at node (nothing may follow: it returns false and the
 * character is not allowed); can_end: the text may stop in any state (the output ends there). */
typedef bool (*dispatch_fn)(st_ctx *c, void *arg, const ac *a, int node, cv_text *out);

static void write_text(st_ctx *c, const ac *a, bool can_end, dispatch_fn dispatch, void *arg, const char *base) {
    for (int s = 0; s < a->count && !c->failed; s++) {
        if (ac_matches(a, s)) continue;
        /* the rule is built apart: a dispatch writes rules of its own into c->rules */
        cv_text rule = {0};
        cv_cpset others = {0}; /* the characters back to the root: all but those written out */
        cv_text_printf(&rule, "%s-%d ::=", base, s);
        bool any = false;
        if (can_end) {
            cv_text_put(&rule, " \"\"");
            any = true;
        }
        for (size_t q = 0; q < a->n_alpha; q++) {
            const uint32_t cp = a->alphabet[q];
            const int to = ac_step(a, s, cp);
            if (to == 0) continue;
            cv_cpset_add(&others, cp, cp);
            cv_text dest = {0};
            if (ac_matches(a, to)) {
                if (!dispatch(c, arg, a, to, &dest)) {
                    cv_text_free(&dest);
                    continue;
                }
            } else {
                cv_text_printf(&dest, "%s-%d", base, to);
            }
            char utf8[4];
            cv_text_put(&rule, any ? " | " : " ");
            cv_ebnf_literal(&rule, utf8, cv_utf8_encode(cp, utf8));
            cv_text_printf(&rule, " %s", dest.s ? dest.s : "");
            cv_text_free(&dest);
            any = true;
        }
        cv_cpset_invert(&others);
        if (others.n) {
            cv_text_put(&rule, any ? " | " : " ");
            cv_ebnf_class(&rule, &others);
            cv_text_printf(&rule, " %s-0", base);
        }
        cv_text_printf(&c->rules, "%s\n", rule.s);
        cv_text_free(&rule);
        cv_cpset_free(&others);
    }
}

/* ---- formats ---------------------------------------------------------------------------------------- */

static bool format(st_ctx *c, const json_t *f, bool last, int depth, cv_text *out);

static const char *str_field(st_ctx *c, const json_t *f, const char *key, const char *type) {
    const json_t *v = json_object_get(f, key);
    if (!json_is_string(v)) {
        fail(c, "a %s format needs \"%s\" as a string", type, key);
        return NULL;
    }
    return json_string_value(v);
}

static bool bool_field(st_ctx *c, const json_t *f, const char *key, const char *type, bool *out) {
    const json_t *v = json_object_get(f, key);
    *out = false;
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) return fail(c, "\"%s\" of a %s format must be true or false", key, type);
    *out = json_is_true(v);
    return true;
}

static const json_t *array_field(st_ctx *c, const json_t *f, const char *key, const char *type, bool nonempty) {
    const json_t *v = json_object_get(f, key);
    if (!json_is_array(v) || (nonempty && !json_array_size(v))) {
        fail(c, "a %s format needs \"%s\" as a%s list", type, key, nonempty ? " non-empty" : "");
        return NULL;
    }
    return v;
}

static void put_literal(cv_text *out, const char *s) {
    if (*s) cv_ebnf_literal(out, s, strlen(s));
    else cv_text_put(out, "\"\"");
}

/* A tag's end: one string or a list of them (any one closes the tag). */
static size_t tag_ends(st_ctx *c, const json_t *tag, const char **ends, size_t max) {
    const json_t *e = json_object_get(tag, "end");
    if (json_is_string(e)) {
        ends[0] = json_string_value(e);
        return 1;
    }
    if (json_is_array(e) && json_array_size(e) && json_array_size(e) <= max) {
        for (size_t i = 0; i < json_array_size(e); i++) {
            if (!json_is_string(json_array_get(e, i))) break;
            ends[i] = json_string_value(json_array_get(e, i));
            if (i + 1 == json_array_size(e)) return i + 1;
        }
    }
    fail(c, "a tag needs \"end\" as a string or a non-empty list of up to %zu strings", max);
    return 0;
}

/* any_text inside a tag: text up to the first of its ends, which closes it. */
static bool close_tag(st_ctx *c, void *arg, const ac *a, int node, cv_text *out) { return true; }

enum { MAX_ENDS = 16 };

/* tag {begin, content, end}: the begin is written by the caller when begin_done (a trigger took
 * part of it). */
static bool tag_format(st_ctx *c, const json_t *t, size_t begin_done, int depth, cv_text *out) {
    if (!json_is_object(t) || (json_object_get(t, "type") && !json_is_string(json_object_get(t, "type"))) ||
        (json_is_string(json_object_get(t, "type")) && strcmp(json_string_value(json_object_get(t, "type")), "tag")))
        return fail(c, "a tag must be an object of type \"tag\"");
    const char *begin = str_field(c, t, "begin", "tag");
    const json_t *content = json_object_get(t, "content");
    const char *ends[MAX_ENDS];
    const size_t n_ends = begin ? tag_ends(c, t, ends, MAX_ENDS) : 0;
    if (!n_ends) return false;
    if (!json_is_object(content)) return fail(c, "a tag needs \"content\" as a format object");
    cv_text_put(out, "(");
    if (begin[begin_done]) {
        put_literal(out, begin + begin_done);
        cv_text_put(out, " ");
    }
    const char *type = json_string_value(json_object_get(content, "type"));
    if (type && !strcmp(type, "any_text")) {
        watch w[MAX_ENDS];
        for (size_t i = 0; i < n_ends; i++) w[i] = (watch){ends[i], W_END};
        ac a;
        if (!ac_build(c, &a, w, n_ends)) {
            ac_free(&a);
            return false;
        }
        char text[40];
        fresh(c, text, "text");
        write_text(c, &a, false, close_tag, NULL, text);
        ac_free(&a);
        cv_text_printf(out, "%s-0)", text);
        return !c->failed;
    }
    if (!format(c, content, false, depth + 1, out)) return false;
    cv_text_put(out, " (");
    for (size_t i = 0; i < n_ends; i++) {
        if (i) cv_text_put(out, " | ");
        put_literal(out, ends[i]);
    }
    cv_text_put(out, "))");
    return true;
}

/* triggered_tags: what follows a completed trigger at a node, written once per node as a rule
 * (both texts of at_least_one, and every state that reaches the node, refer to it). */
typedef struct triggered {
    const json_t *tags;
    const watch *w;
    const char *after;       /* the rule after a tag: more text, or NULL (the output ends) */
    int depth;
    signed char *state;      /* per node: 0 not written yet, 1 rule memo[node], -1 not allowed */
    char (*memo)[40];
} triggered;

static bool dispatch_tags(st_ctx *c, void *arg, const ac *a, int node, cv_text *out) {
    triggered *tr = arg;
    if (!tr->state[node]) {
        bool exclude = false;
        size_t n = 0;
        cv_text body = {0};
        for (int k = node; k > 0 && !c->failed; k = a->n[k].fail) {
            const int i = a->n[k].ends;
            if (i >= 0 && tr->w[i].kind == W_EXCLUDE) exclude = true;
            if (i < 0 || tr->w[i].kind != W_TRIGGER) continue;
            const char *trigger = tr->w[i].s;
            for (size_t j = 0; j < json_array_size(tr->tags) && !c->failed; j++) {
                const json_t *tag = json_array_get(tr->tags, j);
                const char *begin = json_string_value(json_object_get(tag, "begin"));
                if (!begin || !starts_with(begin, trigger)) continue;
                if (n++) cv_text_put(&body, " | ");
                tag_format(c, tag, strlen(trigger), tr->depth + 1, &body);
                if (tr->after) cv_text_printf(&body, " %s", tr->after);
            }
        }
        tr->state[node] = exclude || !n ? -1 : 1;
        if (tr->state[node] > 0) {
            fresh(c, tr->memo[node], "tags");
            cv_text_printf(&c->rules, "%s ::= %s\n", tr->memo[node], body.s);
        }
        cv_text_free(&body);
    }
    if (tr->state[node] < 0) return false;
    cv_text_put(out, tr->memo[node]);
    return true;
}

static bool triggered_tags(st_ctx *c, const json_t *f, bool last, int depth, cv_text *out) {
    const json_t *triggers = array_field(c, f, "triggers", "triggered_tags", true);
    const json_t *tags = triggers ? array_field(c, f, "tags", "triggered_tags", true) : NULL;
    const json_t *excludes = json_object_get(f, "excludes");
    bool at_least_one, stop_after_first;
    if (!tags || !bool_field(c, f, "at_least_one", "triggered_tags", &at_least_one) ||
        !bool_field(c, f, "stop_after_first", "triggered_tags", &stop_after_first))
        return false;
    if (excludes && !json_is_null(excludes) && !json_is_array(excludes))
        return fail(c, "\"excludes\" of a triggered_tags format must be a list of strings");
    if (!last) return fail(c, "a triggered_tags format reads text to the end of the output, so nothing may follow it");
    const size_t n_trig = json_array_size(triggers), n_excl = json_array_size(excludes);
    watch *w = cv_xcalloc(n_trig + n_excl, sizeof *w);
    bool ok = true;
    for (size_t i = 0; i < n_trig + n_excl && ok; i++) {
        const json_t *s = i < n_trig ? json_array_get(triggers, i) : json_array_get(excludes, i - n_trig);
        ok = json_is_string(s) || fail(c, "triggers and excludes must be strings");
        if (ok) w[i] = (watch){json_string_value(s), i < n_trig ? W_TRIGGER : W_EXCLUDE};
    }
    /* every tag begins with a trigger, and every trigger starts some tag */
    for (size_t j = 0; j < json_array_size(tags) && ok; j++) {
        const char *begin = json_string_value(json_object_get(json_array_get(tags, j), "begin"));
        bool found = false;
        for (size_t i = 0; i < n_trig && begin && !found; i++) found = starts_with(begin, w[i].s);
        ok = found || fail(c, "tag %zu's begin %s%s%s does not start with any trigger", j, begin ? "\"" : "",
                           begin ? begin : "(missing)", begin ? "\"" : "");
    }
    for (size_t i = 0; i < n_trig && ok; i++) {
        bool found = false;
        for (size_t j = 0; j < json_array_size(tags) && !found; j++) {
            const char *begin = json_string_value(json_object_get(json_array_get(tags, j), "begin"));
            found = begin && starts_with(begin, w[i].s);
        }
        ok = found || fail(c, "no tag begins with the trigger \"%s\"", w[i].s);
    }
    ac a = {0};
    if (ok) ok = ac_build(c, &a, w, n_trig + n_excl);
    if (ok) {
        /* the text after a tag (may end), and before the first one when at_least_one (may not) */
        char after[40], after_root[48], first[40];
        triggered tr = {.tags = tags, .w = w, .after = NULL, .depth = depth,
                        .state = cv_xcalloc((size_t)a.count, 1), .memo = cv_xcalloc((size_t)a.count, 40)};
        if (!stop_after_first) { /* its root is named before its rules: a tag's dispatch returns there */
            fresh(c, after, "text");
            snprintf(after_root, sizeof after_root, "%s-0", after);
            tr.after = after_root;
            write_text(c, &a, true, dispatch_tags, &tr, after);
        }
        if (at_least_one || stop_after_first) {
            fresh(c, first, "text");
            write_text(c, &a, !at_least_one, dispatch_tags, &tr, first);
            cv_text_printf(out, "%s-0", first);
        } else {
            cv_text_put(out, after_root);
        }
        ok = !c->failed;
        free(tr.state);
        free(tr.memo);
    }
    ac_free(&a);
    free(w);
    return ok;
}

static bool tags_with_separator(st_ctx *c, const json_t *f, int depth, cv_text *out) {
    const json_t *tags = array_field(c, f, "tags", "tags_with_separator", true);
    const char *sep = tags ? str_field(c, f, "separator", "tags_with_separator") : NULL;
    bool at_least_one, stop_after_first;
    if (!sep || !bool_field(c, f, "at_least_one", "tags_with_separator", &at_least_one) ||
        !bool_field(c, f, "stop_after_first", "tags_with_separator", &stop_after_first))
        return false;
    char one[40];
    fresh(c, one, "tag");
    cv_text body = {0};
    for (size_t j = 0; j < json_array_size(tags); j++) {
        if (j) cv_text_put(&body, " | ");
        if (!tag_format(c, json_array_get(tags, j), 0, depth + 1, &body)) {
            cv_text_free(&body);
            return false;
        }
    }
    cv_text_printf(&c->rules, "%s ::= %s\n", one, body.s);
    cv_text_free(&body);
    cv_text_put(out, "(");
    if (stop_after_first) cv_text_put(out, one);
    else {
        cv_text_printf(out, "%s (", one);
        put_literal(out, sep);
        cv_text_printf(out, " %s)*", one);
    }
    cv_text_put(out, at_least_one ? ")" : ")?");
    return true;
}

/* A sub-grammar from a converter, embedded; `what` names it in the error. */
static bool sub_grammar(st_ctx *c, char *ebnf, const char *err, const char *what, cv_text *out) {
    if (!ebnf) return fail(c, "%s: %s", what, err[0] ? err : "not valid");
    char name[48];
    embed(c, ebnf, name);
    free(ebnf);
    cv_text_put(out, name);
    return true;
}

/* One format as an EBNF expression; last: nothing follows it in the output. */
static bool format(st_ctx *c, const json_t *f, bool last, int depth, cv_text *out) {
    if (depth > MAX_DEPTH) return fail(c, "formats are nested more than %d deep", MAX_DEPTH);
    if (!json_is_object(f)) return fail(c, "a format must be an object");
    const char *type = json_string_value(json_object_get(f, "type"));
    if (!type) return fail(c, "a format needs \"type\" as a string");
    char err[400] = "";
    if (!strcmp(type, "const_string")) {
        const char *v = str_field(c, f, "value", type);
        if (!v) return false;
        if (!cv_utf8_validate(v, strlen(v), NULL)) return fail(c, "a const_string value is not valid UTF-8");
        put_literal(out, v);
        return true;
    }
    if (!strcmp(type, "json_schema")) {
        const json_t *s = json_object_get(f, "json_schema");
        if (!json_is_object(s) && !json_is_boolean(s))
            return fail(c, "a json_schema format needs \"json_schema\" as a schema object");
        char *text = json_dumps(s, JSON_COMPACT | JSON_ENCODE_ANY);
        char *ebnf = cv_json_schema_to_ebnf(text, strlen(text), c->jo, err, sizeof err);
        free(text);
        return sub_grammar(c, ebnf, err, "json_schema", out);
    }
    if (!strcmp(type, "regex")) {
        const char *p = str_field(c, f, "pattern", type);
        return p && sub_grammar(c, cv_regex_to_ebnf(p, strlen(p), err, sizeof err), err, "regex", out);
    }
    if (!strcmp(type, "grammar")) {
        const char *g = str_field(c, f, "grammar", type);
        return g && sub_grammar(c, cv_xstrdup(g), err, "grammar", out);
    }
    if (!strcmp(type, "sequence") || !strcmp(type, "or")) {
        const bool seq = type[0] == 's';
        const json_t *el = array_field(c, f, "elements", type, true);
        if (!el) return false;
        cv_text_put(out, "(");
        for (size_t i = 0; i < json_array_size(el); i++) {
            if (i) cv_text_put(out, seq ? " " : " | ");
            if (!format(c, json_array_get(el, i), last && (!seq || i + 1 == json_array_size(el)), depth + 1, out))
                return false;
        }
        cv_text_put(out, ")");
        return true;
    }
    if (!strcmp(type, "tag")) return tag_format(c, f, 0, depth, out);
    if (!strcmp(type, "any_text")) {
        if (!last) return fail(c, "any_text must be the content of a tag or the last part of the output");
        cv_cpset all = {0};
        cv_cpset_add(&all, 0, CV_CP_MAX);
        cv_text_put(out, "(");
        cv_ebnf_class(out, &all);
        cv_text_put(out, ")*");
        cv_cpset_free(&all);
        return true;
    }
    if (!strcmp(type, "triggered_tags")) return triggered_tags(c, f, last, depth, out);
    if (!strcmp(type, "tags_with_separator")) return tags_with_separator(c, f, depth, out);
    return fail(c, "the format type \"%s\" is not supported (supported: const_string, json_schema, regex, grammar, "
                "sequence, or, tag, any_text, triggered_tags, tags_with_separator)", type);
}

/* The legacy spelling as the triggered_tags format it means. */
static json_t *legacy_format(st_ctx *c, const json_t *st) {
    const json_t *structures = json_object_get(st, "structures"), *triggers = json_object_get(st, "triggers");
    if (!json_is_array(structures) || !json_is_array(triggers) || !json_array_size(triggers)) {
        fail(c, "a structural tag needs \"structures\" and a non-empty \"triggers\" list");
        return NULL;
    }
    json_t *tags = json_array();
    for (size_t i = 0; i < json_array_size(structures); i++) {
        const json_t *s = json_array_get(structures, i), *schema = json_object_get(s, "schema");
        if (!json_is_object(s)) {
            fail(c, "structure %zu is not an object", i);
            json_decref(tags);
            return NULL;
        }
        /* no schema: any JSON value */
        json_t *content = json_pack("{s:s, s:o}", "type", "json_schema", "json_schema",
                                    json_is_object(schema) ? json_incref((json_t *)schema) : json_object());
        json_array_append_new(tags, json_pack("{s:s, s:O*, s:o, s:O*}", "type", "tag", "begin",
                                              json_object_get(s, "begin"), "content", content, "end",
                                              json_object_get(s, "end")));
    }
    if (!json_array_size(tags)) {
        fail(c, "a structural tag needs at least one structure");
        json_decref(tags);
        return NULL;
    }
    return json_pack("{s:s, s:O, s:o}", "type", "triggered_tags", "triggers", triggers, "tags", tags);
}

char *cv_structural_tag_to_ebnf(const char *spec, size_t len, const cv_json_options *o, char *err, size_t err_len) {
    st_ctx c = {.jo = o, .err = err, .err_len = err_len};
    json_error_t je;
    json_t *st = json_loadb(spec, len, JSON_DECODE_ANY, &je);
    if (!st) {
        snprintf(err, err_len, "not JSON: %s at line %d column %d", je.text, je.line, je.column);
        return NULL;
    }
    const char *type = json_string_value(json_object_get(st, "type"));
    json_t *f = NULL;
    if (!json_is_object(st)) fail(&c, "a structural tag must be a JSON object");
    else if (type && strcmp(type, "structural_tag") != 0) fail(&c, "the type of a structural tag is \"structural_tag\", not \"%s\"", type);
    else if (json_object_get(st, "format")) f = json_incref(json_object_get(st, "format"));
    else if (json_object_get(st, "structures")) f = legacy_format(&c, st);
    else fail(&c, "a structural tag needs \"format\" (or the legacy \"structures\" and \"triggers\")");
    cv_text root = {0};
    if (f && format(&c, f, true, 0, &root)) {
        cv_text_printf(&c.rules, "root ::= %s\n", root.s);
    }
    json_decref(f);
    json_decref(st);
    cv_text_free(&root);
    if (c.failed) {
        cv_text_free(&c.rules);
        return NULL;
    }
    return cv_text_take(&c.rules);
}
