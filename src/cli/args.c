/*
 * args.c — see args.h: the rewriting of the arguments vLLM's FlexibleArgumentParser does before
 * argparse (config file, underscores, -O, dotted JSON arguments), the matching of option names
 * with argparse's abbreviations, numbers, and the table of flags that are accepted and ignored.
 */
#include "cli/args.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "cli/args_internal.h"

static const char *program_path = "cvllm";

void cv_args_set_program(const char *argv0) {
    if (argv0 && *argv0) program_path = argv0;
}

const char *cv_args_program(void) { return program_path; }

int cv_args_error(cv_args *a, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "cvllm %s: ", a->cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    a->failed = true;
    return 2;
}

void cv_args_note(const char *fmt, ...) {
    if (getenv(CV_ARGS_NOTED_ENV)) return;
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    cv_info("args", "%s", text);
}

/* ---- argument lists ------------------------------------------------------------------------ */

void cv_arglist_push(cv_arglist *l, char *owned, bool optional) {
    if (l->n + 1 >= l->cap) { /* one spare slot for the NULL that ends argv */
        l->cap = l->cap ? l->cap * 2 : 16;
        l->items = cv_xrealloc(l->items, l->cap * sizeof *l->items);
        l->optional = cv_xrealloc(l->optional, l->cap * sizeof *l->optional);
    }
    l->items[l->n] = owned;
    l->optional[l->n++] = optional;
    l->items[l->n] = NULL;
}

void cv_arglist_free(cv_arglist *l) {
    for (size_t i = 0; i < l->n; i++) free(l->items[i]);
    free(l->items);
    free(l->optional);
    *l = (cv_arglist){0};
}

/* ---- stage 1: rewriting (vLLM's FlexibleArgumentParser.parse_args) -------------------------- */

/* `--config FILE` / `--config=FILE` replaced by the file's flags, right after the subcommand and
 * the positional MODEL when it comes first, so that the rest of the command line overrides them. */
static char *expand_config(int argc, char **argv, cv_arglist *out) {
    int at = -1, count = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--config") || !strncmp(argv[i], "--config=", 9)) {
            if (at < 0) at = i;
            count++;
        }
    int insert = argc > 1 && argv[1][0] != '-' ? 2 : 1, skip = 0;
    cv_arglist config = {0};
    if (count > 1) return cv_xstrdup("More than one config file specified!");
    if (at >= 0) {
        const char *path = argv[at][8] == '=' ? argv[at] + 9 : at + 1 < argc ? argv[at + 1] : NULL;
        if (!path) return cv_xstrdup("No config file specified! Please check your command-line arguments.");
        char *err = cv_args_config_load(path, &config);
        if (err) {
            cv_arglist_free(&config);
            return err;
        }
        skip = argv[at][8] == '=' ? 1 : 2;
    }
    for (int i = 0; i < argc; i++) {
        if (i == insert)
            for (size_t k = 0; k < config.n; k++) cv_arglist_push(out, config.items[k], config.optional[k]);
        if (at >= 0 && i >= at && i < at + skip) continue;
        cv_arglist_push(out, cv_xstrdup(argv[i]), false);
    }
    free(config.items); /* the strings moved to *out (insert <= at: the file is never lost) */
    free(config.optional);
    return NULL;
}

/* `--some_flag[.json_key][=value]` → `--some-flag...`: only the name, up to '=' or the first '.'. */
static void dash_name(char *arg) {
    for (char *p = arg + 2; *p && *p != '=' && *p != '.'; p++)
        if (*p == '_') *p = '-';
}

/* Underscores and -O forms, one argument at a time. `-O3`, `-O=3`, `-O 3` and a bare `-O` all
 * become --optimization-level, whose value is then checked; vLLM ≥ 0.12 spells it that way (before,
 * -O was --compilation-config, whose dotted form `-O.key` still works). */
static void rewrite_names(cv_arglist *in, cv_arglist *out) {
    for (size_t i = 0; i < in->n; i++) {
        char *s = in->items[i];
        bool opt = in->optional[i];
        if (s[0] == '-' && s[1] == '-') {
            dash_name(s);
            cv_arglist_push(out, s, opt);
        } else if (s[0] == '-' && s[1] == 'O' && s[2] == '.') {
            cv_arglist_push(out, cv_xasprintf("--compilation-config%s", s + 2), opt);
            free(s);
        } else if (s[0] == '-' && s[1] == 'O') {
            cv_arglist_push(out, cv_xstrdup("--optimization-level"), opt);
            if (s[2]) cv_arglist_push(out, cv_xstrdup(s + (s[2] == '=' ? 3 : 2)), opt);
            free(s);
        } else {
            cv_arglist_push(out, s, opt);
        }
    }
    free(in->items);
    free(in->optional);
    *in = (cv_arglist){0};
}

/* Short names of the JSON flags, so `-cc.mode 3` and `--compilation-config '{...}'` merge. */
static const char *const json_aliases[][2] = {
    {"-cc", "--compilation-config"},
    {"-sc", "--speculative-config"},
};

static char *canonical_flag(const char *name, size_t len) {
    for (size_t k = 0; k < CV_ARRAY_LEN(json_aliases); k++)
        if (strlen(json_aliases[k][0]) == len && !strncmp(name, json_aliases[k][0], len))
            return cv_xstrdup(json_aliases[k][1]);
    return cv_xstrndup(name, len);
}

/* The length of the option name of `s` (up to '='), when `s` is a dotted argument `-x.key...`. A
 * negative number ("-0.5") is a value, not an option. */
static size_t dotted_name_len(const char *s) {
    if (s[0] != '-') return 0;
    const char *p = s + 1 + (s[1] == '-');
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z'))) return 0;
    size_t len = strcspn(s, "=");
    return memchr(s, '.', len) ? len : 0;
}

/* vLLM's human_readable_int: 25.6k = 25600, 1K = 1024 (no decimals with binary suffixes). */
static bool human_readable_int(const char *s, json_int_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || strspn(s, "0123456789.") != (size_t)(end - s) || !end[0] || end[1] || errno) return false;
    static const char suffixes[] = "kmgtKMGT";
    const char *at = strchr(suffixes, end[0]);
    if (!at) return false;
    int k = (int)(at - suffixes);
    if (k >= 4 && memchr(s, '.', (size_t)(end - s))) return false;
    double value = k >= 4 ? ldexp(v, 10 * (k - 3)) : v * pow(1000.0, k + 1);
    if (value >= 9.2e18) return false; /* not an int64: the text stays a string */
    *out = (json_int_t)value;
    return true;
}

/* The value of a dotted argument: JSON, else a 1k-style integer, else the string itself; `key+`
 * takes a comma-separated list of strings (vLLM). */
static json_t *dotted_value(const char *text, bool list) {
    if (list) {
        json_t *arr = json_array();
        for (const char *p = text;; p++) {
            size_t n = strcspn(p, ",");
            json_array_append_new(arr, json_stringn(p, n));
            p += n;
            if (!*p) break;
        }
        return arr;
    }
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    json_int_t n;
    if (!v && human_readable_int(text, &n)) v = json_integer(n);
    return v ? v : json_string(text);
}

/* Deep merge of `src` into `dst` as vLLM's recursive_dict_update: objects merge, lists append,
 * anything else is replaced (and named in *dups when given). */
static void json_merge(json_t *dst, json_t *src, const char *path, char **dups) {
    const char *key;
    json_t *v;
    json_object_foreach(src, key, v) {
        json_t *old = json_object_get(dst, key);
        char *sub = cv_xasprintf("%s.%s", path, key);
        if (json_is_object(v) && json_is_object(old)) {
            json_merge(old, v, sub, dups);
        } else if (json_is_array(v) && json_is_array(old)) {
            json_array_extend(old, v);
        } else {
            if (old && dups) {
                char *more = *dups ? cv_xasprintf("%s, %s", *dups, sub) : cv_xstrdup(sub);
                free(*dups);
                *dups = more;
            }
            json_object_set(dst, key, v);
        }
        free(sub);
    }
}

typedef struct dotted_flag {
    char *name;   /* the long name of the flag */
    json_t *value;
} dotted_flag;

/* The index of the last argument that gives flag `name` (or an alias of it) whole, or -1. */
static long last_whole_flag(const cv_arglist *l, const char *name) {
    long found = -1;
    for (size_t i = 1; i < l->n; i++) {
        const char *s = l->items[i];
        size_t len = strcspn(s, "=");
        if (s[0] != '-' || memchr(s, '.', len)) continue;
        char *canon = canonical_flag(s, len);
        if (!strcmp(canon, name) && (s[len] == '=' || i + 1 < l->n)) found = (long)i;
        free(canon);
    }
    return found;
}

/* Puts the merged dotted object of one flag where the flag's whole value is, merged over it, or
 * at the end when the flag is not given whole (or not as a JSON object: then its parser reports
 * that value). */
static void place_dotted(cv_arglist *l, dotted_flag *d) {
    long at = last_whole_flag(l, d->name);
    if (at >= 0) {
        char *s = l->items[at], *eq = strchr(s, '=');
        size_t vi = eq ? (size_t)at : (size_t)at + 1;
        json_t *whole = json_loads(eq ? eq + 1 : l->items[vi], 0, NULL);
        if (json_is_object(whole)) {
            json_merge(whole, d->value, d->name, NULL);
            char *text = json_dumps(whole, JSON_COMPACT);
            char *arg = eq ? cv_xasprintf("%.*s=%s", (int)(eq - s), s, text) : cv_xstrdup(text);
            free(l->items[vi]);
            l->items[vi] = arg;
            free(text);
            json_decref(whole);
            return;
        }
        json_decref(whole);
    }
    cv_arglist_push(l, cv_xstrdup(d->name), false);
    cv_arglist_push(l, json_dumps(d->value, JSON_COMPACT), false);
}

/* `--flag.a.b value`, `--flag.a.b=value`, `--flag.list+ x,y`: one JSON object per flag. */
static char *merge_dotted(cv_arglist *in, cv_arglist *out) {
    dotted_flag *flags = NULL;
    size_t n_flags = 0;
    char *dups = NULL, *err = NULL;
    for (size_t i = 0; i < in->n; i++) {
        char *s = in->items[i];
        size_t len = i ? dotted_name_len(s) : 0;
        if (!len) {
            cv_arglist_push(out, s, in->optional[i]);
            continue;
        }
        const char *text = s[len] == '=' ? s + len + 1 : i + 1 < in->n ? in->items[i + 1] : NULL;
        if (!text) {
            err = cv_xasprintf("%.*s needs a value", (int)len, s);
            free(s);
            continue;
        }
        bool list = s[len - 1] == '+';
        size_t key_end = len - list;
        size_t base_len = strcspn(s, ".");
        char *base = canonical_flag(s, base_len);
        json_t *value = dotted_value(text, list);
        /* {"a": {"b": value}} from ".a.b", innermost first */
        for (size_t end = key_end; end > base_len;) {
            size_t start = end;
            while (s[start - 1] != '.') start--;
            json_t *o = json_object();
            char *key = cv_xstrndup(s + start, end - start);
            json_object_set_new(o, key, value);
            free(key);
            value = o;
            end = start - 1;
        }
        size_t k = 0;
        while (k < n_flags && strcmp(flags[k].name, base)) k++;
        if (k == n_flags) {
            flags = cv_xrealloc(flags, (n_flags + 1) * sizeof *flags);
            flags[n_flags++] = (dotted_flag){.name = base, .value = json_object()};
        } else {
            free(base);
        }
        json_merge(flags[k].value, value, flags[k].name, &dups);
        json_decref(value);
        if (s[len] != '=') free(in->items[++i]);
        free(s);
    }
    free(in->items);
    free(in->optional);
    *in = (cv_arglist){0};
    if (dups) cv_warn("args", "Found duplicate keys %s", dups);
    free(dups);
    for (size_t k = 0; k < n_flags; k++) {
        if (!err) place_dotted(out, &flags[k]);
        free(flags[k].name);
        json_decref(flags[k].value);
    }
    free(flags);
    return err;
}

int cv_args_init(cv_args *a, const char *cmd, int argc, char **argv) {
    *a = (cv_args){.cmd = cmd, .orig_argc = argc, .orig_argv = argv, .i = 1, .tried_at = -1};
    cv_arglist raw = {0}, named = {0}, merged = {0};
    char *err = expand_config(argc, argv, &raw);
    rewrite_names(&raw, &named);
    if (!err) err = merge_dotted(&named, &merged);
    cv_arglist_free(&raw);
    cv_arglist_free(&named);
    if (merged.n == 0) cv_arglist_push(&merged, cv_xstrdup(argc ? argv[0] : cmd), false);
    a->argc = (int)merged.n;
    a->argv = merged.items;
    a->optional = merged.optional;
    if (!err) return 0;
    cv_args_error(a, "%s", err);
    free(err);
    return 2;
}

void cv_args_free(cv_args *a) {
    cv_arglist l = {.items = a->argv, .optional = a->optional, .n = (size_t)a->argc};
    cv_arglist_free(&l);
    free(a->tried);
    for (size_t k = 0; k < a->n_pool; k++) free(a->pool[k]);
    free(a->pool);
    a->argv = NULL;
    a->optional = NULL;
    a->tried = NULL;
}

/* ---- stage 2: matching ----------------------------------------------------------------------- */

bool cv_args_next_name(const char **names, const char **name, size_t *len) {
    if (!**names) return false;
    *name = *names;
    *len = strcspn(*names, "|");
    *names += *len + ((*names)[*len] == '|');
    return true;
}

/* Remembers an option name tried on the current argument, for cv_args_unknown. */
static void record(cv_args *a, const char *name, size_t len) {
    if (a->tried_at != a->i) {
        a->tried_at = a->i;
        a->n_tried = 0;
    }
    for (size_t k = 0; k < a->n_tried; k++)
        if (a->tried[k].len == len && !strncmp(a->tried[k].name, name, len)) return;
    if (a->n_tried == a->cap_tried) {
        a->cap_tried = a->cap_tried ? a->cap_tried * 2 : 64;
        a->tried = cv_xrealloc(a->tried, a->cap_tried * sizeof *a->tried);
    }
    a->tried[a->n_tried].name = name;
    a->tried[a->n_tried++].len = len;
}

/* Which of `names` argv[i] is: 0 none, else the length of the name; *eq tells NAME=value. */
static size_t match(cv_args *a, const char *names, bool *eq) {
    const char *arg = a->argv[a->i], *name;
    size_t len, found = 0;
    while (cv_args_next_name(&names, &name, &len)) {
        record(a, name, len);
        if (!found && !strncmp(arg, name, len) && (arg[len] == '\0' || arg[len] == '=')) {
            found = len;
            *eq = arg[len] == '=';
        }
    }
    return found;
}

static int name_len(const char *names) { return (int)strcspn(names, "|"); }

bool cv_args_value(cv_args *a, const char *names, const char **value) {
    bool eq;
    size_t len = match(a, names, &eq);
    if (!len) return false;
    const char *arg = a->argv[a->i++];
    if (eq) {
        *value = arg + len + 1;
    } else if (a->i < a->argc) {
        *value = a->argv[a->i++];
    } else {
        *value = NULL;
        cv_args_error(a, "%.*s needs a value", name_len(names), names);
    }
    return true;
}

bool cv_args_flag(cv_args *a, const char *names) {
    bool eq;
    size_t len = match(a, names, &eq);
    if (!len) return false;
    const char *arg = a->argv[a->i++];
    if (eq) cv_args_error(a, "argument %.*s: ignored explicit argument '%s'", name_len(names), names, arg + len + 1);
    return true;
}

static bool is_option(const char *s) { return s[0] == '-' && s[1] != '\0'; }

bool cv_args_list(cv_args *a, const char *names, const char ***items, size_t *n) {
    bool eq;
    size_t len = match(a, names, &eq);
    if (!len) return false;
    const char *arg = a->argv[a->i++];
    size_t before = *n;
    if (eq) {
        *items = cv_xrealloc(*items, (*n + 1) * sizeof **items);
        (*items)[(*n)++] = arg + len + 1;
    }
    while (!eq && a->i < a->argc && !is_option(a->argv[a->i])) {
        *items = cv_xrealloc(*items, (*n + 1) * sizeof **items);
        (*items)[(*n)++] = a->argv[a->i++];
    }
    if (*n == before) cv_args_error(a, "%.*s needs at least one value", name_len(names), names);
    return true;
}

bool cv_args_optional_value(cv_args *a, const char *names, const char **value) {
    bool eq;
    size_t len = match(a, names, &eq);
    if (!len) return false;
    const char *arg = a->argv[a->i++];
    *value = eq ? arg + len + 1 : a->i < a->argc && !is_option(a->argv[a->i]) ? a->argv[a->i++] : NULL;
    return true;
}

bool cv_args_unknown(cv_args *a) {
    char *arg = a->argv[a->i];
    if (a->optional[a->i]) { /* a config file's false bool whose --no- form this command lacks */
        a->i++;
        return true;
    }
    size_t plen = strcspn(arg, "=");
    size_t n_match = 0, pick = 0;
    if (a->tried_at == a->i && arg[0] == '-' && arg[1] == '-' && plen > 2)
        for (size_t k = 0; k < a->n_tried; k++)
            if (a->tried[k].len > plen && !strncmp(a->tried[k].name, arg, plen)) {
                n_match++;
                pick = k;
            }
    if (n_match == 1) {
        a->argv[a->i] = cv_xasprintf("%.*s%s", (int)a->tried[pick].len, a->tried[pick].name, arg + plen);
        free(arg);
        return true;
    }
    if (n_match > 1) {
        size_t cap = 64, used = 0;
        char *list = cv_xmalloc(cap);
        list[0] = '\0';
        for (size_t k = 0; k < a->n_tried; k++) {
            if (a->tried[k].len <= plen || strncmp(a->tried[k].name, arg, plen)) continue;
            while (used + a->tried[k].len + 3 > cap) list = cv_xrealloc(list, cap *= 2);
            used += (size_t)sprintf(list + used, "%s%.*s", used ? ", " : "", (int)a->tried[k].len, a->tried[k].name);
        }
        cv_args_error(a, "ambiguous option: %s could match %s", arg, list);
        free(list);
        return false;
    }
    cv_args_error(a, "unknown option %s (see cvllm %s --help)", arg, a->cmd);
    return false;
}

/* ---- numbers --------------------------------------------------------------------------------- */

static int64_t suffix_multiplier(char c) {
    switch (c) {
    case 'k': return 1000;
    case 'K': return 1024;
    case 'm': return 1000000;
    case 'M': return 1024 * 1024;
    case 'g': return 1000000000;
    case 'G': return 1024LL * 1024 * 1024;
    default: return 0;
    }
}

bool cv_args_int(cv_args *a, const char *flag, const char *s, int64_t min, int64_t max, int64_t *out) {
    if (!s) return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    int64_t mult = 1;
    if (end != s && *end && !end[1] && suffix_multiplier(*end)) {
        mult = suffix_multiplier(*end);
        end++;
    }
    if (end == s || *end || errno == ERANGE) {
        cv_args_error(a, "%s expects an integer, got '%s'", flag, s);
        return false;
    }
    if ((v > 0 && v > max / mult) || (v < 0 && v < min / mult) || v * mult < min || v * mult > max) {
        cv_args_error(a, "%s must be in [%lld, %lld], got '%s'", flag, (long long)min, (long long)max, s);
        return false;
    }
    *out = v * mult;
    return true;
}

bool cv_args_int_option(cv_args *a, const char *names, int64_t min, int64_t max, int64_t *out) {
    const char *v;
    if (!cv_args_value(a, names, &v)) return false;
    cv_args_int(a, names, v, min, max, out);
    return true;
}

bool cv_args_int32_option(cv_args *a, const char *names, int32_t min, int32_t max, int32_t *out) {
    int64_t x = *out;
    if (!cv_args_int_option(a, names, min, max, &x)) return false;
    *out = (int32_t)x;
    return true;
}

bool cv_args_float(cv_args *a, const char *flag, const char *s, double min, double max, double *out) {
    if (!s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno == ERANGE || isnan(v)) {
        cv_args_error(a, "%s expects a number, got '%s'", flag, s);
        return false;
    }
    if (v < min || v > max) {
        cv_args_error(a, "%s must be in [%g, %g], got '%s'", flag, min, max, s);
        return false;
    }
    *out = v;
    return true;
}

/* ---- accepted and ignored flags -------------------------------------------------------------- */

bool cv_args_in_list(const char *const *list, const char *s) {
    for (; *list; list++)
        if (!strcmp(*list, s)) return true;
    return false;
}

char *cv_args_quoted_list(const char *const *list, const char *last_sep) {
    char *s = cv_xstrdup(""), *more;
    for (size_t k = 0; list[k]; k++) {
        more = cv_xasprintf("%s%s'%s'", s, k == 0 ? "" : list[k + 1] ? ", " : last_sep, list[k]);
        free(s);
        s = more;
    }
    return s;
}

/* The name as a string owned by *a (recorded names must outlive the call that tried them). */
static const char *intern(cv_args *a, const char *s) {
    for (size_t k = 0; k < a->n_pool; k++)
        if (!strcmp(a->pool[k], s)) return a->pool[k];
    a->pool = cv_xrealloc(a->pool, (a->n_pool + 1) * sizeof *a->pool);
    return a->pool[a->n_pool++] = cv_xstrdup(s);
}

/* The `--no-NAME` forms of a "--name|-n" list (argparse's BooleanOptionalAction; long names only). */
static bool negated(cv_args *a, const char *names) {
    const char *name;
    size_t len;
    while (cv_args_next_name(&names, &name, &len)) {
        if (len < 3 || name[1] != '-') continue;
        char *no = cv_xasprintf("--no-%.*s", (int)len - 2, name + 2);
        bool hit = cv_args_flag(a, intern(a, no));
        free(no);
        if (hit) return true;
    }
    return false;
}

bool cv_args_bool(cv_args *a, const char *names, bool *out) {
    if (cv_args_flag(a, names)) *out = true;
    else if (negated(a, names)) *out = false;
    else return false;
    return true;
}

bool cv_args_refused(cv_args *a, const cv_refused_flag *flags, size_t n) {
    const char *arg = a->argv[a->i];
    const size_t len = strcspn(arg, "=");
    for (size_t k = 0; k < n; k++)
        for (const char *p = flags[k].names; *p;) {
            const size_t m = strcspn(p, "|");
            if (m == len && !strncmp(p, arg, m)) {
                cv_args_error(a, "%.*s is not supported: %s", (int)len, arg, flags[k].why);
                return true;
            }
            p += m + (p[m] == '|');
        }
    return false;
}

bool cv_args_ignored(cv_args *a, const cv_ignored_flag *flags, size_t n) {
    const char *v = NULL;
    int64_t x;
    double d;
    for (size_t k = 0; k < n; k++) {
        const cv_ignored_flag *f = &flags[k];
        int len = name_len(f->names);
        switch (f->kind) {
        case CV_IGNORED_SWITCH:
        case CV_IGNORED_BOOL:
            if (cv_args_flag(a, f->names) || (f->kind == CV_IGNORED_BOOL && negated(a, f->names))) {
                cv_args_note("%s is accepted and ignored on this backend", a->argv[a->i - 1]);
                return true;
            }
            break;
        case CV_IGNORED_INT:
        case CV_IGNORED_FLOAT:
        case CV_IGNORED_STRING:
        case CV_IGNORED_CHOICE:
            if (!cv_args_value(a, f->names, &v)) break;
            char *flag = cv_xstrndup(f->names, (size_t)len);
            bool ok = v && (f->kind == CV_IGNORED_INT     ? cv_args_int(a, flag, v, 0, INT32_MAX, &x)
                            : f->kind == CV_IGNORED_FLOAT ? cv_args_float(a, flag, v, -INFINITY, INFINITY, &d)
                                                          : true);
            if (ok && f->kind == CV_IGNORED_CHOICE && !cv_args_in_list(f->choices, v)) {
                char *list = cv_args_quoted_list(f->choices, ", ");
                cv_args_error(a, "argument %s: invalid choice: '%s' (choose from %s)", flag, v, list);
                free(list);
                ok = false;
            }
            if (ok) cv_args_note("%s %s is accepted and ignored on this backend", flag, v);
            free(flag);
            return true;
        case CV_IGNORED_JSON: {
            if (!cv_args_value(a, f->names, &v)) break;
            json_t *j = v ? json_loads(v, JSON_DECODE_ANY, NULL) : NULL;
            if (v && !json_is_object(j)) cv_args_error(a, "%.*s must be a JSON object, got '%s'", len, f->names, v);
            else if (v) cv_args_note("%.*s is accepted and ignored on this backend", len, f->names);
            json_decref(j);
            return true;
        }
        case CV_IGNORED_SIZES: {
            const char **items = NULL;
            size_t n_items = 0;
            if (!cv_args_list(a, f->names, &items, &n_items)) break;
            char *name = cv_xstrndup(f->names, (size_t)len);
            bool valid = !a->failed;
            for (size_t i = 0; valid && i < n_items; i++) valid = cv_args_int(a, name, items[i], 1, INT32_MAX, &x);
            if (valid) cv_args_note("%s is accepted and ignored on this backend", name);
            free(name);
            free(items);
            return true;
        }
        }
    }
    return false;
}
