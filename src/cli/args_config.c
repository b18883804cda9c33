/*
 * args_config.c — vLLM's `--config FILE.yaml` (FlexibleArgumentParser.load_config_file): a YAML
 * mapping of flag names to values, turned into command-line arguments:
 *
 *   key: true        → --key            key: false   → --no-key (dropped if the command has none)
 *   key: [a, b]      → --key a b        key: {a: 1}  → --key '{"a":1}'
 *   key: value       → --key value      key: null    → nothing (the flag's default)
 *
 * The file is read with libyaml's document loader into JSON values first, typed as vLLM's
 * yaml.safe_load types them: anchors and aliases resolve, `<<` merge keys merge (explicit keys win,
 * earlier merged mappings before later ones), and plain (unquoted) scalars follow PyYAML's YAML 1.1
 * resolver — null (~, null, empty), bool (true/false, yes/no, on/off in three casings), int (decimal,
 * 0x, 0o or a leading 0 for octal, 0b, '_' allowed), float (with a '.', optional signed exponent);
 * quoted scalars are strings. Values then become the text Python's str() prints for them (an int in
 * decimal, 0.90 as 0.9, a bool in a list as True/False), and a mapping becomes JSON. vLLM passes a
 * null on as the string "None", which its optional flags read as "unset": here the key is left out.
 * .inf and .nan have no JSON form and are refused.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "base/error.h"
#include "cli/args_internal.h"

static bool one_of(const char *s, size_t n, const char *const *words) {
    for (; *words; words++)
        if (strlen(*words) == n && !memcmp(s, *words, n)) return true;
    return false;
}

/* PyYAML's int forms: [-+]?0b[01_]+, [-+]?0x[0-9a-fA-F_]+, [-+]?0o?[0-7_]+ (octal), decimal. */
static bool yaml_int(const char *s, size_t n, long long *out) {
    char digits[72];
    size_t k = 0, i = 0;
    bool neg = false;
    if (i < n && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
    int base = 10;
    if (i + 1 < n && s[i] == '0' && (s[i + 1] == 'b' || s[i + 1] == 'x' || s[i + 1] == 'o')) {
        base = s[i + 1] == 'b' ? 2 : s[i + 1] == 'x' ? 16 : 8;
        i += 2;
    } else if (i + 1 < n && s[i] == '0') {
        base = 8;
    }
    for (; i < n; i++) {
        if (s[i] == '_') continue;
        if (k + 1 >= sizeof digits) return false;
        digits[k++] = s[i];
    }
    digits[k] = '\0';
    if (k == 0 || digits[0] == '-' || digits[0] == '+') return false;
    char *end;
    errno = 0;
    long long v = strtoll(digits, &end, base);
    if (*end || errno) return false;
    *out = neg ? -v : v;
    return true;
}

/* PyYAML's float forms: digits with a '.' and an optional exponent with a sign ('_' allowed). */
static bool yaml_float(const char *s, size_t n, double *out) {
    char text[128];
    size_t k = 0, i = 0, int_digits = 0, frac_digits = 0;
    if (n >= sizeof text) return false;
    if (i < n && (s[i] == '-' || s[i] == '+')) text[k++] = s[i++];
    for (; i < n && ((s[i] >= '0' && s[i] <= '9') || s[i] == '_'); i++)
        if (s[i] != '_') text[k++] = s[i], int_digits++;
    if (i == n || s[i] != '.') return false;
    text[k++] = s[i++];
    for (; i < n && ((s[i] >= '0' && s[i] <= '9') || s[i] == '_'); i++)
        if (s[i] != '_') text[k++] = s[i], frac_digits++;
    if (int_digits + frac_digits == 0) return false;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        text[k++] = s[i++];
        if (i >= n || (s[i] != '-' && s[i] != '+')) return false;
        text[k++] = s[i++];
        size_t exp = i;
        while (i < n && s[i] >= '0' && s[i] <= '9') text[k++] = s[i++];
        if (i == exp) return false;
    }
    text[k] = '\0';
    *out = strtod(text, NULL);
    return i == n;
}

/* A scalar as JSON, typed by PyYAML's resolver when plain; NULL with *err for .inf / .nan. */
static json_t *scalar_json(const yaml_node_t *node, char **err) {
    const char *s = (const char *)node->data.scalar.value;
    size_t n = node->data.scalar.length;
    if (node->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return json_stringn(s, n);
    static const char *const nulls[] = {"", "~", "null", "Null", "NULL", NULL};
    static const char *const trues[] = {"yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON", NULL};
    static const char *const falses[] = {"no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF", NULL};
    static const char *const special[] = {".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf",
                                          "-.INF", ".nan", ".NaN", ".NAN", NULL};
    long long i;
    double d;
    if (one_of(s, n, nulls)) return json_null();
    if (one_of(s, n, trues)) return json_true();
    if (one_of(s, n, falses)) return json_false();
    if (yaml_int(s, n, &i)) return json_integer((json_int_t)i);
    if (yaml_float(s, n, &d)) return json_real(d);
    if (one_of(s, n, special)) {
        /* vLLM's json.dumps would write Infinity / NaN, which JSON parsers reject */
        *err = cv_xasprintf("'%.*s' cannot be written as JSON", (int)n, s);
        return NULL;
    }
    return json_stringn(s, n);
}

static json_t *node_json(yaml_document_t *doc, yaml_node_t *node, int depth, char **err);

/* A `<<` merge key's value (a mapping or a list of them) added to *merged, first one first. */
static bool collect_merge(yaml_document_t *doc, yaml_node_t *value, int depth, json_t *merged, char **err) {
    json_t *v = node_json(doc, value, depth + 1, err);
    if (!v) return false;
    json_t *list = json_is_object(v) ? json_pack("[O]", v) : json_incref(v);
    bool ok = json_is_array(list);
    size_t i;
    json_t *m;
    json_array_foreach(list, i, m) {
        if (!(ok = json_is_object(m))) break;
        const char *k;
        json_t *item;
        json_object_foreach(m, k, item) if (!json_object_get(merged, k)) json_object_set(merged, k, item);
    }
    if (!ok) *err = cv_xstrdup("a merge key (<<) needs a mapping or a list of mappings");
    json_decref(list);
    json_decref(v);
    return ok;
}

/* A node as JSON; NULL with *err set for what JSON cannot hold (a non-scalar key, a cycle). */
static json_t *node_json(yaml_document_t *doc, yaml_node_t *node, int depth, char **err) {
    if (depth > 64) {
        *err = cv_xstrdup("nested too deeply (a recursive alias?)");
        return NULL;
    }
    if (node->type == YAML_SCALAR_NODE) return scalar_json(node, err);
    if (node->type == YAML_SEQUENCE_NODE) {
        json_t *arr = json_array();
        for (yaml_node_item_t *it = node->data.sequence.items.start; it < node->data.sequence.items.top; it++) {
            json_t *v = node_json(doc, yaml_document_get_node(doc, *it), depth + 1, err);
            if (!v) {
                json_decref(arr);
                return NULL;
            }
            json_array_append_new(arr, v);
        }
        return arr;
    }
    json_t *obj = json_object(), *merged = json_object();
    bool ok = true;
    for (yaml_node_pair_t *p = node->data.mapping.pairs.start; ok && p < node->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(doc, p->key), *value = yaml_document_get_node(doc, p->value);
        if (k->type != YAML_SCALAR_NODE) {
            *err = cv_xstrdup("a mapping key is not a scalar");
            ok = false;
            break;
        }
        const char *key = (const char *)k->data.scalar.value;
        if (k->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && !strcmp(key, "<<")) {
            ok = collect_merge(doc, value, depth, merged, err);
            continue;
        }
        json_t *v = node_json(doc, value, depth + 1, err);
        if (!(ok = v != NULL)) break;
        char *name = cv_xstrndup(key, k->data.scalar.length);
        json_object_set_new(obj, name, v);
        free(name);
    }
    if (ok) {
        const char *key;
        json_t *v;
        json_object_foreach(merged, key, v) if (!json_object_get(obj, key)) json_object_set(obj, key, v);
    }
    json_decref(merged);
    if (ok) return obj;
    json_decref(obj);
    return NULL;
}

/* Python's str() of a value as vLLM passes it on: 0.9 for 0.90, True/False, None; a container as
 * JSON (vLLM would print Python's repr, which no flag reads). */
static char *python_str(const json_t *v) {
    if (json_is_string(v)) return cv_xstrndup(json_string_value(v), json_string_length(v));
    if (json_is_integer(v)) return cv_xasprintf("%lld", (long long)json_integer_value(v));
    if (json_is_true(v)) return cv_xstrdup("True");
    if (json_is_false(v)) return cv_xstrdup("False");
    if (json_is_null(v)) return cv_xstrdup("None");
    if (json_is_real(v)) { /* the shortest digits that read back the same, as Python's repr */
        double d = json_real_value(v);
        char *s = NULL;
        for (int digits = 1; digits <= 17; digits++) {
            free(s);
            s = cv_xasprintf("%.*g", digits, d);
            if (strtod(s, NULL) == d) break;
        }
        if (strpbrk(s, ".e")) return s;
        char *more = cv_xasprintf("%s.0", s);
        free(s);
        return more;
    }
    return json_dumps(v, JSON_COMPACT);
}

/* One `key: value` of the top-level mapping as arguments. */
static void add_flag(const char *key, const json_t *value, cv_arglist *out) {
    if (json_is_null(value)) return;
    if (json_is_boolean(value)) {
        bool on = json_is_true(value);
        cv_arglist_push(out, cv_xasprintf(on ? "--%s" : "--no-%s", key), !on);
        return;
    }
    if (json_is_array(value) && json_array_size(value) == 0) return;
    cv_arglist_push(out, cv_xasprintf("--%s", key), false);
    if (json_is_array(value)) {
        size_t i;
        json_t *item;
        json_array_foreach(value, i, item) cv_arglist_push(out, python_str(item), false);
    } else {
        cv_arglist_push(out, python_str(value), false);
    }
}

static char *load_document(const char *path, yaml_parser_t *parser, cv_arglist *out) {
    yaml_document_t doc, next;
    if (!yaml_parser_load(parser, &doc))
        return cv_xasprintf("config file %s: %s at line %zu, column %zu", path, parser->problem,
                            parser->problem_mark.line + 1, parser->problem_mark.column + 1);
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    char *err = NULL, *why = NULL;
    json_t *flags = NULL;
    if (!root) {
        err = cv_xasprintf("config file %s is empty", path);
    } else if (root->type != YAML_MAPPING_NODE) {
        err = cv_xasprintf("config file %s: expected a mapping of flag names to values", path);
    } else if (!yaml_parser_load(parser, &next)) {
        err = cv_xasprintf("config file %s: %s at line %zu, column %zu", path, parser->problem,
                           parser->problem_mark.line + 1, parser->problem_mark.column + 1);
    } else {
        if (yaml_document_get_root_node(&next))
            err = cv_xasprintf("config file %s: expected a single document in the stream", path);
        yaml_document_delete(&next);
        if (!err && !(flags = node_json(&doc, root, 0, &why))) err = cv_xasprintf("config file %s: %s", path, why);
    }
    const char *key;
    json_t *value;
    json_object_foreach(flags, key, value) add_flag(key, value, out);
    json_decref(flags);
    free(why);
    yaml_document_delete(&doc);
    return err;
}

char *cv_args_config_load(const char *path, cv_arglist *out) {
    /* vLLM: file_path.split(".")[-1] */
    const char *dot = strrchr(path, '.'), *ext = dot ? dot + 1 : path;
    if (strcmp(ext, "yaml") != 0 && strcmp(ext, "yml") != 0)
        return cv_xasprintf("Config file must be of a yaml/yml type. %s supplied", ext);
    FILE *f = fopen(path, "rb");
    if (!f)
        return cv_xasprintf("Unable to read the config file at %s. Check path correctness (%s)", path, strerror(errno));
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        return cv_xstrdup("out of memory");
    }
    yaml_parser_set_input_file(&parser, f);
    char *err = load_document(path, &parser, out);
    yaml_parser_delete(&parser);
    fclose(f);
    return err;
}
