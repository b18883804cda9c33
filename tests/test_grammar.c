/*
 * test_grammar.c — the grammar core (src/sample/grammar/: ebnf.c, matcher.c, vocab.c, mask.c).
 *
 *   - the parser: each error with its exact message and place, the limits refused quickly;
 *   - the byte automaton: many small grammars, each with byte strings that must be whole sentences,
 *     must be prefixes only, or must be refused (literals, classes incl. negated and multi-byte
 *     UTF-8, repetition bounds, alternation, recursion, empty rules and nullable repetitions);
 *   - the matcher: rollback, can_end / terminated, eos;
 *   - token masks over the full real Qwen3 vocabulary, checked bit for bit against accepting each
 *     token on a copy of the state (the reference), on several grammars and states; the cache
 *     answering the same mask; and a random walk drawing uniformly from each mask.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/rng.h"
#include "base/utf8.h"
#include "check.h"
#include "sample/grammar/grammar.h"
#include "sample/grammar/grammar_internal.h"  /* the cache's counters */
#include "testutil.h"
#include "tokenizer/tokenizer.h"

#define MODEL_ROWS 151936  /* Qwen3's embedding rows; the tokenizer knows 151,669 ids */

/* ---- helpers ---------------------------------------------------------------------------------- */

static cv_grammar *parse(const char *text, const cv_vocab *v) {
    char err[256];
    cv_grammar *g = cv_grammar_parse(text, strlen(text), v, err, sizeof err);
    CHECK_MSG(g != NULL, "grammar refused: %s\n%s", err, text);
    return g;
}

static void expect_error(const char *text, const char *message) {
    char err[256];
    cv_grammar *g = cv_grammar_parse(text, strlen(text), NULL, err, sizeof err);
    CHECK_MSG(g == NULL, "grammar accepted, expected \"%s\":\n%s", message, text);
    if (g) {
        cv_grammar_free(g);
        return;
    }
    CHECK_MSG(strcmp(err, message) == 0, "\"%s\" != \"%s\" for\n%s", err, message, text);
}

/* 'F': a whole sentence; 'P': a proper prefix only (accepted, cannot end); 'X': refused. */
static char judge(const cv_grammar *g, const char *s, size_t n) {
    cv_matcher *m = cv_matcher_new(g);
    char r = 'X';
    if (cv_matcher_accept_bytes(m, s, n)) r = cv_matcher_can_end(m) ? 'F' : 'P';
    cv_matcher_free(m);
    return r;
}

typedef struct byte_case {
    const char *input;
    char expect;
} byte_case;

static void check_cases(const char *grammar, const byte_case *cases) {
    cv_grammar *g = parse(grammar, NULL);
    if (!g) return;
    for (const byte_case *c = cases; c->input; c++) {
        char got = judge(g, c->input, strlen(c->input));
        CHECK_MSG(got == c->expect, "grammar\n%s\ninput \"%s\": got %c, expected %c", grammar, c->input, got,
                  c->expect);
    }
    cv_grammar_free(g);
}

static bool bit(const uint32_t *mask, int32_t t) {
    return (mask[t >> 5] >> (t & 31)) & 1u;
}

static bool accept_str(cv_matcher *m, const char *s) {
    return cv_matcher_accept_bytes(m, s, strlen(s));
}

/* ---- the parser ---------------------------------------------------------------------------------- */

static void test_parse_errors(void) {
    expect_error("root ::= value", "line 1 col 10: undefined rule 'value'");
    expect_error("root ::= \"a\"\nitem ::= \"b\" valu\n", "line 2 col 14: undefined rule 'valu'");
    expect_error("start ::= \"a\"\n", "line 2 col 1: the grammar has no rule named 'root'");
    expect_error("", "line 1 col 1: the grammar has no rule named 'root'");
    expect_error("root ::= \"a\\q\"", "line 1 col 12: bad escape '\\q'");
    expect_error("root ::= \"\\x4g\"", "line 1 col 11: bad escape '\\x': expected 2 hex digits");
    expect_error("root ::= \"\\uD800\"", "line 1 col 11: bad escape '\\uD800': a surrogate is not a character");
    expect_error("root ::= [\\U00110000]", "line 1 col 11: bad escape '\\U00110000': above U+10FFFF");
    expect_error("root ::= \"abc\n", "line 1 col 10: unterminated literal");
    expect_error("root ::= \"abc", "line 1 col 10: unterminated literal");
    expect_error("root ::= [abc", "line 1 col 10: unterminated character class");
    expect_error("root ::= [a-", "line 1 col 10: unterminated character class");
    expect_error("root ::= []", "line 1 col 10: empty character class");
    expect_error("root ::= [z-a]", "line 1 col 11: bad range 'z-a' in character class: its end is below its start");
    expect_error("root ::= \"a\"{3,2}", "line 1 col 13: bad repetition bounds '{3,2}': the maximum is below the minimum");
    expect_error("root ::= \"a\"{x}", "line 1 col 14: expected a number in repetition bounds");
    expect_error("root ::= \"a\"{,2}", "line 1 col 14: expected a number in repetition bounds");
    expect_error("root ::= \"a\"{2", "line 1 col 15: expected '}' to close the repetition bounds");
    expect_error("root ::= \"a\"{1,20000}", "line 1 col 16: repetition bound 20000 exceeds the limit of 10000");
    expect_error("root ::= * \"a\"", "line 1 col 10: '*' follows nothing it could repeat");
    expect_error("root ::= (\"a\" | \"b\"", "line 1 col 20: expected ')' to close the group opened on line 1");
    expect_error("root ::= (\"a\"\nx ::= \"b\")", "line 2 col 1: expected ')' to close the group opened on line 1");
    expect_error("root ::= \"a\" )", "line 1 col 14: unmatched ')'");
    expect_error("root \"a\"", "line 1 col 6: expected '::=' after the rule name 'root'");
    expect_error("\"a\" ::= root", "line 1 col 1: expected a rule name");
    expect_error("root ::= \"a\"\nroot ::= \"b\"", "line 2 col 1: rule 'root' is defined twice (first on line 1)");
    expect_error("root ::= \"a\" ; \"b\"", "line 1 col 14: unexpected character ';'");
    expect_error("root ::= \"\xff\"", "line 1 col 11: invalid UTF-8 in the grammar text");
    /* left recursion, direct and through a nullable prefix, in a rule and in a helper */
    expect_error("root ::= expr\nexpr ::= expr \"+\" term | term\nterm ::= [0-9]",
                 "line 2 col 1: rule 'expr' is left-recursive");
    expect_error("root ::= a\na ::= b \"x\" | \"y\"\nb ::= a?", "line 2 col 1: rule 'a' is left-recursive");
    expect_error("root ::= ws root \"x\" | \"y\"\nws ::= \" \"*", "line 1 col 1: rule 'root' is left-recursive");
    expect_error("root ::= (root \"x\")* \"y\"", "line 1 col 1: rule 'root' is left-recursive");
}

/* Limits: refused with their message, and quickly (a slow refusal would show as a test timeout). */
static void test_limits(void) {
    /* nested repetitions grow linearly (each level repeats one reference), so this one is small */
    cv_grammar *g = parse("root ::= ((\"a\"{10000}){10000}){10000}", NULL);
    cv_grammar_free(g);
    expect_error("root ::= [a-z]{0,10000} [a-z]{0,10000} [a-z]{0,10000} [a-z]{0,10000} [a-z]{0,10000} "
                 "[a-z]{0,10000} [a-z]{0,10000} [a-z]{0,10000} [a-z]{0,10000} [a-z]{0,10000} [a-z]{0,10000}",
                 "line 1 col 150: grammar too large: repetition '{0,10000}' would pass 100000 rules after expansion");
    /* nesting: 300 parentheses */
    char deep[1024] = "root ::= ";
    for (int k = 0; k < 300; k++) strcat(deep, "(");
    strcat(deep, "\"a\"");
    for (int k = 0; k < 300; k++) strcat(deep, ")");
    expect_error(deep, "line 1 col 266: groups nested deeper than 256");
    /* Repetitions of a part that may be empty, nested 91 deep (found by fuzz_grammar, which spent
     * more than 10 s in the first closure): 2^depth distinct return stacks and never a byte on top.
     * At the start the grammar is refused; after a byte, that byte is not allowed. Both at once. */
    static const char nested[] = "????????????????++++++++++++++++++++++++++++++++++++++++"
                                 "???????????????????????????????????";
    char *at_start = tu_strdupf("root ::= expr\n%sexpr ::=%s", nested, "");
    expect_error(at_start, "the grammar is too ambiguous: its start alone expands 32768 rule references more than it "
                           "has rules, or leaves more than 4096 stacks (nested repetitions of parts that may be empty?)");
    free(at_start);
    char *after_byte = tu_strdupf("root ::= \"a\" e%s \"b\"\ne ::=%s", nested, "");
    g = parse(after_byte, NULL);
    if (g) {
        cv_matcher *m = cv_matcher_new(g);
        CHECK(!cv_matcher_accept_bytes(m, "a", 1));
        CHECK(!cv_matcher_can_end(m));
        cv_matcher_free(m);
        cv_grammar_free(g);
    }
    free(after_byte);
    /* elements: 60 rules of 10,000 copies each */
    size_t cap = 4 << 20, n = 0;
    char *many = malloc(cap);
    char err[256];
    n += (size_t)snprintf(many + n, cap - n, "root ::= r0\n");
    for (int k = 0; k < 60; k++) n += (size_t)snprintf(many + n, cap - n, "r%d ::= \"ab\"{10000} r%d\n", k, k + 1);
    n += (size_t)snprintf(many + n, cap - n, "r60 ::= \"b\"\n");
    g = cv_grammar_parse(many, n, NULL, err, sizeof err);
    CHECK(g == NULL);
    CHECK_STR_EQ(err, "line 51 col 13: grammar too large: repetition '{10000}' would pass 500000 elements after expansion");
    cv_grammar_free(g);
    /* rules: 100,001 of them */
    n = 0;
    n += (size_t)snprintf(many + n, cap - n, "root ::= r0\n");
    for (int k = 0; k < 100001; k++) n += (size_t)snprintf(many + n, cap - n, "r%d ::= \"a\" r%d\n", k, k + 1);
    n += (size_t)snprintf(many + n, cap - n, "r100001 ::= \"b\"\n");
    g = cv_grammar_parse(many, n, NULL, err, sizeof err);
    CHECK(g == NULL);
    CHECK_STR_EQ(err, "line 100000 col 16: grammar too large: more than 100000 rules after expansion");
    cv_grammar_free(g);
    /* 30,000 distinct non-ASCII classes (each its own byte-trie rule) */
    n = 0;
    n += (size_t)snprintf(many + n, cap - n, "root ::=");
    for (int k = 0; k < 30000; k++) n += (size_t)snprintf(many + n, cap - n, " [\\u%04x]", 0x4e00 + k);
    g = cv_grammar_parse(many, n, NULL, err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    if (g) {
        cv_matcher *m = cv_matcher_new(g);
        CHECK(cv_matcher_accept_bytes(m, "\xe4\xb8\x80\xe4\xb8\x81", 6));
        CHECK(!cv_matcher_accept_bytes(m, "\xe4\xb8\x80", 3));
        CHECK(cv_matcher_accept_bytes(m, "\xe4\xb8\x82", 3));
        cv_matcher_free(m);
        cv_grammar_free(g);
    }
    /* just below the limits: a long chain of rules and a large repetition work */
    n = 0;
    n += (size_t)snprintf(many + n, cap - n, "root ::= r0\n");
    for (int k = 0; k < 50000; k++) n += (size_t)snprintf(many + n, cap - n, "r%d ::= r%d\n", k, k + 1);
    n += (size_t)snprintf(many + n, cap - n, "r50000 ::= \"z\"\n");
    g = cv_grammar_parse(many, n, NULL, err, sizeof err);
    CHECK_MSG(g != NULL, "%s", err);
    if (g) {
        CHECK(judge(g, "z", 1) == 'F');
        cv_grammar_free(g);
    }
    free(many);
    g = parse("root ::= \"a\"{10000} \"b\"{0,10000}", NULL);
    if (g) {
        char *s = malloc(20001);
        memset(s, 'a', 10000);
        memset(s + 10000, 'b', 10001);
        CHECK(judge(g, s, 9999) == 'P');
        CHECK(judge(g, s, 10000) == 'F');
        CHECK(judge(g, s, 20000) == 'F');
        CHECK(judge(g, s, 20001) == 'X');
        cv_grammar_free(g);
        free(s);
    }
}

/* ---- the byte automaton --------------------------------------------------------------------------- */

static void test_bytes(void) {
    check_cases("root ::= \"abc\"", (const byte_case[]){
        {"", 'P'}, {"a", 'P'}, {"ab", 'P'}, {"abc", 'F'}, {"abcd", 'X'}, {"b", 'X'}, {NULL, 0}});
    check_cases("root ::= \"a\" | \"ab\" | \"abc\" | ", (const byte_case[]){
        {"", 'F'}, {"a", 'F'}, {"ab", 'F'}, {"abc", 'F'}, {"abd", 'X'}, {NULL, 0}});
    /* escapes: the literal is the bytes of its code points */
    check_cases("root ::= \"\\n\\r\\t\\\\\\\"\\'\\[\\]\\x41\\u00e9\\U0001F600\"", (const byte_case[]){
        {"\n\r\t\\\"'[]A\xc3\xa9\xf0\x9f\x98\x80", 'F'}, {"\n\r\t\\\"'[]A\xe9", 'X'}, {NULL, 0}});
    check_cases("root ::= \"h\xc3\xa9llo\"  # raw UTF-8 in a literal\n", (const byte_case[]){
        {"h\xc3\xa9llo", 'F'}, {"h\xc3", 'P'}, {"hello", 'X'}, {NULL, 0}});
    /* classes: ranges, several items, a '-' at either end, escapes */
    check_cases("root ::= [a-cx-z0_]+", (const byte_case[]){
        {"abcxyz0_", 'F'}, {"d", 'X'}, {"", 'P'}, {"-", 'X'}, {NULL, 0}});
    check_cases("root ::= [-a]* [b-]", (const byte_case[]){
        {"-a-b", 'F'}, {"--", 'F'}, {"c", 'X'}, {NULL, 0}});
    check_cases("root ::= [\\]\\[\\\\\\x00-\\x02]+", (const byte_case[]){
        {"][\\", 'F'}, {"\x01\x02", 'F'}, {"\x03", 'X'}, {NULL, 0}});
    /* multi-byte classes: exactly the code points, by their UTF-8 bytes */
    check_cases("root ::= [\xc3\xa0-\xc3\xbf\xe4\xb8\x80-\xe9\xbf\xbf]", (const byte_case[]){
        {"\xc3\xa0", 'F'}, {"\xc3\xbf", 'F'}, {"\xc3\x9f", 'X'}, {"\xe4\xb8\x80", 'F'}, {"\xe9\xbf\xbf", 'F'},
        {"\xe4\xb7\xbf", 'X'}, {"\xea\x80\x80", 'X'}, {"\xe4\xb8", 'P'}, {"a", 'X'}, {NULL, 0}});
    check_cases("root ::= [\\u0800-\\u0fff\\U00010000-\\U0001ffff]", (const byte_case[]){
        {"\xe0\xa0\x80", 'F'}, {"\xe0\xbf\xbf", 'F'}, {"\xe1\x80\x80", 'X'}, {"\xdf\xbf", 'X'},
        {"\xf0\x90\x80\x80", 'F'}, {"\xf0\x9f\xbf\xbf", 'F'}, {"\xf0\xa0\x80\x80", 'X'}, {NULL, 0}});
    /* negated classes and '.': every scalar value not listed, nothing ill-formed */
    static const char *negated = "root ::= [^\"\\\\\\x00-\\x1f]*";
    check_cases(negated, (const byte_case[]){
        {"hello world", 'F'}, {"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 'F'}, {"\"", 'X'}, {"\\", 'X'}, {"\x1f", 'X'},
        {"\x7f", 'F'}, {"\xc0\x80", 'X'}, {"\xc1\xbf", 'X'}, {"\xe0\x80\x80", 'X'}, {"\xed\xa0\x80", 'X'},
        {"\xed\x9f\xbf", 'F'}, {"\xee\x80\x80", 'F'}, {"\xf4\x8f\xbf\xbf", 'F'}, {"\xf4\x90\x80\x80", 'X'},
        {"\xf5", 'X'}, {"\x80", 'X'}, {"\xc3", 'P'}, {"\xf0\x9f", 'P'}, {NULL, 0}});
    check_cases("root ::= . .", (const byte_case[]){
        {"ab", 'F'}, {"\n\x01", 'F'}, {"\xc3\xa9\xf4\x8f\xbf\xbf", 'F'}, {"\xed\xbf\xbf", 'X'},
        {"\xef\xbf\xbf\xef\xbf\xbf", 'F'}, {"\xf0\x8f\xbf\xbf", 'X'}, {"abc", 'X'}, {NULL, 0}});
    check_cases("root ::= [^a-z\\u00e9]", (const byte_case[]){
        {"A", 'F'}, {"a", 'X'}, {"\xc3\xa9", 'X'}, {"\xc3\xa8", 'F'}, {"\xc3\xaa", 'F'}, {NULL, 0}});
    cv_grammar *any = parse("root ::= . [\\x00]", NULL);
    if (any) {
        CHECK(judge(any, "\0\0", 2) == 'F');
        cv_grammar_free(any);
    }
    /* repetition bounds */
    check_cases("root ::= \"ab\"{2} \"c\"{1,3} \"d\"{2,}", (const byte_case[]){
        {"ababcdd", 'F'}, {"ababcccdddd", 'F'}, {"abcdd", 'X'}, {"ababccccdd", 'X'}, {"ababcd", 'P'},
        {"ababddd", 'X'}, {NULL, 0}});
    check_cases("root ::= [0-9]{0,3} \"x\"? \"y\"{0} \"z\"{0,2}", (const byte_case[]){
        {"", 'F'}, {"123", 'F'}, {"1234", 'X'}, {"12x", 'F'}, {"xzz", 'F'}, {"xzzz", 'X'}, {"y", 'X'}, {NULL, 0}});
    check_cases("root ::= (\"a\" | \"bc\")+ \";\"", (const byte_case[]){
        {"abca;", 'F'}, {";", 'X'}, {"ab;", 'X'}, {"bcbc", 'P'}, {NULL, 0}});
    check_cases("root ::= (\"x\" (\"y\" | \"z\")*)? \"!\"", (const byte_case[]){
        {"!", 'F'}, {"x!", 'F'}, {"xyzzy!", 'F'}, {"y!", 'X'}, {NULL, 0}});
    /* recursion: balanced parentheses, nested lists */
    static const char *parens = "root ::= p\np ::= (\"(\" p \")\")*";
    check_cases(parens, (const byte_case[]){
        {"", 'F'}, {"()", 'F'}, {"(()())()", 'F'}, {"((", 'P'}, {"(()", 'P'}, {"())", 'X'}, {")", 'X'}, {NULL, 0}});
    check_cases("root ::= list\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [0-9]+ | list",
                (const byte_case[]){{"[]", 'F'}, {"[1,[2,[]],33]", 'F'}, {"[[[[", 'P'}, {"[1,]", 'X'}, {"[,", 'X'},
                                    {NULL, 0}});
    /* empty rules and nullable repetitions (cycles through the empty string end by themselves) */
    check_cases("root ::= a \"!\"\na ::= b*\nb ::= \"x\"?", (const byte_case[]){
        {"!", 'F'}, {"x!", 'F'}, {"xxx!", 'F'}, {"xy", 'X'}, {NULL, 0}});
    check_cases("root ::= (\"\" | \"a\")* (e e)+ e{3,5} \"b\"\ne ::= ", (const byte_case[]){
        {"b", 'F'}, {"aab", 'F'}, {"", 'P'}, {NULL, 0}});
    check_cases("root ::= x\nx ::= y\ny ::= x | \"q\"", (const byte_case[]){{"q", 'F'}, {"qq", 'X'}, {NULL, 0}});
    check_cases("root ::= (\"a\"? \"b\"?)* \"c\"", (const byte_case[]){
        {"c", 'F'}, {"abbac", 'F'}, {"ca", 'X'}, {NULL, 0}});
    /* right recursion and long runs keep working (the stack does not grow with tail calls) */
    static const char *tail = "root ::= \"a\" root | \"b\"";
    cv_grammar *g = parse(tail, NULL);
    if (g) {
        char *s = malloc(100001);
        memset(s, 'a', 100000);
        s[100000] = 'b';
        CHECK(judge(g, s, 100001) == 'F');
        CHECK(judge(g, s, 100000) == 'P');
        free(s);
        cv_grammar_free(g);
    }
    /* syntax: comments, newlines anywhere, continuation lines starting with '|', names with '-' */
    check_cases("# a comment\nroot ::= # here too\n  json-value\n  | \"x\"   # trailing\n"
                "json-value ::= (\n  \"a\"\n  | \"b\"\n)\n",
                (const byte_case[]){{"a", 'F'}, {"b", 'F'}, {"x", 'F'}, {"ab", 'X'}, {NULL, 0}});
}

/* ---- the matcher --------------------------------------------------------------------------------- */

/* A grammar whose only sentence is empty: the matcher starts with no stack at all (fuzz_grammar found
 * the byte step reading its stack list from a NULL pointer). */
static void test_empty_language(void) {
    cv_grammar *g = parse("root ::= expr\nexpr ::=", NULL);
    if (!g) return;
    cv_matcher *m = cv_matcher_new(g);
    CHECK(cv_matcher_can_end(m) && cv_matcher_terminated(m));
    CHECK(!cv_matcher_accept_bytes(m, "x", 1));
    CHECK(cv_matcher_accept_bytes(m, "", 0));
    cv_matcher_rollback(m, 1);
    CHECK(cv_matcher_history(m) == 0);
    cv_matcher_free(m);
    cv_grammar_free(g);
}

static void test_matcher(void) {
    cv_grammar *g = parse("root ::= \"ab\" (\"c\" | \"cd\")", NULL);
    if (!g) return;
    cv_matcher *m = cv_matcher_new(g);
    CHECK(cv_matcher_history(m) == 0);
    CHECK(!cv_matcher_can_end(m) && !cv_matcher_terminated(m));
    CHECK(cv_matcher_accept_bytes(m, "a", 1));
    CHECK(!cv_matcher_accept_bytes(m, "bx", 2));  /* all or nothing */
    CHECK(cv_matcher_history(m) == 1);
    CHECK(cv_matcher_accept_bytes(m, "b", 1));
    CHECK(cv_matcher_accept_bytes(m, "", 0));     /* an empty string is one step of history */
    CHECK(cv_matcher_history(m) == 3);
    CHECK(cv_matcher_accept_bytes(m, "c", 1));
    CHECK(cv_matcher_can_end(m) && !cv_matcher_terminated(m));
    CHECK(cv_matcher_accept_bytes(m, "d", 1));
    CHECK(cv_matcher_can_end(m) && cv_matcher_terminated(m));
    CHECK(!cv_matcher_accept_bytes(m, "d", 1));
    cv_matcher_rollback(m, 2);
    CHECK(cv_matcher_history(m) == 3);
    CHECK(!cv_matcher_can_end(m));
    CHECK(!cv_matcher_accept_bytes(m, "d", 1));
    CHECK(cv_matcher_accept_bytes(m, "cd", 2));
    CHECK(cv_matcher_terminated(m));
    cv_matcher_rollback(m, cv_matcher_history(m));
    CHECK(cv_matcher_history(m) == 0);
    CHECK(cv_matcher_accept_bytes(m, "abcd", 4) && cv_matcher_terminated(m));
    /* no vocabulary: tokens are never accepted */
    CHECK(!cv_matcher_accept_token(m, 0));
    cv_matcher_free(m);
    cv_grammar_free(g);

    /* a grammar that matches nothing is not terminated at the start, and is a dead end */
    g = parse("root ::= [^\\x00-\\U0010FFFF]", NULL);
    if (g) {
        m = cv_matcher_new(g);
        CHECK(!cv_matcher_can_end(m) && !cv_matcher_terminated(m));
        CHECK(!cv_matcher_accept_bytes(m, "a", 1));
        cv_matcher_free(m);
        cv_grammar_free(g);
    }
    /* the empty grammar is complete and terminated from the start */
    g = parse("root ::= ", NULL);
    if (g) {
        m = cv_matcher_new(g);
        CHECK(cv_matcher_can_end(m) && cv_matcher_terminated(m));
        cv_matcher_free(m);
        cv_grammar_free(g);
    }
    /* an ambiguous grammar whose stacks double per byte is capped, not exhausted */
    g = parse("root ::= s\ns ::= \"a\" s \"b\" | \"a\" s \"c\" | ", NULL);
    if (g) {
        m = cv_matcher_new(g);
        int accepted = 0;
        while (accepted < 40 && cv_matcher_accept_bytes(m, "a", 1)) accepted++;
        CHECK_MSG(accepted >= 10 && accepted < 40, "accepted %d", accepted);
        cv_matcher_free(m);
        cv_grammar_free(g);
    }
}

/* ---- a vocabulary's edge cases, on a tokenizer made for them ------------------------------------- */

/* The 256 byte tokens (ids 0..255, byte-level spelling), "ab" (256), an added non-special "ab" (257:
 * the same bytes as 256), a special <|end|> (258, the eos); the model has 300 rows. */
static void test_mini_vocab(void) {
    json_error_t jerr;
    json_t *root = json_load_file(CVLLM_SOURCE_DIR "/models/qwen3-tokenizer/tokenizer.json", 0, &jerr);
    CHECK_MSG(root != NULL, "%s", jerr.text);
    if (!root) return;
    json_t *vocab = json_object();
    for (unsigned b = 0; b < 256; b++) {
        /* GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for U+0100.. */
        uint32_t cp = b <= 0x20 ? 0x100 + b : b >= 0x7F && b <= 0xA0 ? 0x121 + (b - 0x7F) : b == 0xAD ? 0x143 : b;
        char name[5] = {0};
        cv_utf8_encode(cp, name);
        json_object_set_new(vocab, name, json_integer(b));
    }
    json_object_set_new(vocab, "ab", json_integer(256));
    json_t *model = json_object_get(root, "model");
    json_object_set_new(model, "vocab", vocab);
    json_object_set_new(model, "merges", json_pack("[[s,s]]", "a", "b"));
    json_object_set_new(root, "added_tokens",
                        json_pack("[{s:i,s:s,s:b,s:b,s:b,s:b,s:b},{s:i,s:s,s:b,s:b,s:b,s:b,s:b}]", "id", 257, "content", "ab",
                                  "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 0, "id", 258,
                                  "content", "<|end|>", "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                                  "special", 1));
    char *dir = tu_make_temp_dir();
    char *path = tu_strdupf("%s/%s", dir, "tokenizer.json");
    CHECK(json_dump_file(root, path, JSON_COMPACT) == 0);
    json_decref(root);
    cv_tokenizer *tok = NULL;
    CHECK(cv_tokenizer_load(dir, &tok) == 0);
    unlink(path);
    rmdir(dir);
    free(path);
    free(dir);
    if (!tok) return;
    enum { ROWS = 300 };
    int32_t eos[] = {258, 258, -1, 400};  /* repeated and out-of-range ids are ignored */
    cv_vocab *v = cv_vocab_new(tok, ROWS, eos, 4);
    CHECK(cv_vocab_size(v) == ROWS);
    cv_grammar *g = parse("root ::= \"ab\"+ | \"c\"", v);
    if (g) {
        uint32_t mask[(ROWS + 31) / 32];
        cv_matcher *m = cv_matcher_new(g);
        for (int step = 0; step < 2; step++) {
            cv_matcher_fill_mask(m, mask);
            /* start: a, c, ab (both ids); after "ab": a, ab (both), eos */
            int32_t expect[5] = {'a', 256, 257, step == 0 ? 'c' : 258, -1};
            for (int32_t t = 0; t < ROWS; t++) {
                bool want = false;
                for (int k = 0; expect[k] >= 0; k++) want |= expect[k] == t;
                bool ok = cv_matcher_accept_token(m, t);
                if (ok) cv_matcher_rollback(m, 1);
                CHECK_MSG(bit(mask, t) == want && ok == want, "step %d, token %d: mask %d, accept %d, expected %d", step,
                          t, bit(mask, t), ok, want);
            }
            CHECK(cv_matcher_accept_token(m, step == 0 ? 257 : 256));
        }
        cv_matcher_free(m);
        cv_grammar_free(g);
    }
    cv_vocab_free(v);
    cv_tokenizer_free(tok);
}

/* ---- token masks over the real vocabulary ---------------------------------------------------------- */

static const char JSONISH[] =
    "root ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws string ws \",\" ws \"\\\"age\\\"\" ws \":\" ws integer\n"
    "         (ws \",\" ws \"\\\"tags\\\"\" ws \":\" ws \"[\" ws (string (ws \",\" ws string)*)? ws \"]\")? ws \"}\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,15})\n"
    "ws ::= [ \\t\\n]*\n";

typedef struct vocab_fixture {
    cv_tokenizer *tok;
    cv_vocab *v;
    int32_t eos[2];
    size_t n_words;
    uint32_t *mask, *again;
} vocab_fixture;

static size_t popcount(const uint32_t *mask, size_t n_words) {
    size_t n = 0;
    for (size_t w = 0; w < n_words; w++) n += (size_t)__builtin_popcount(mask[w]);
    return n;
}

/* The mask against the reference: for every id, accepting it (then undoing it) must succeed exactly
 * when its bit is set; the eos bits must equal can_end; a second fill must come from the cache and be
 * identical. Returns the number of allowed ids. */
static size_t check_mask(vocab_fixture *f, const cv_grammar *g, cv_matcher *m, const char *what) {
    cv_mask_cache_stats before, after;
    cv_matcher_fill_mask(m, f->mask);
    size_t history = cv_matcher_history(m);
    int wrong = 0;
    for (int32_t t = 0; t < MODEL_ROWS; t++) {
        bool ok = cv_matcher_accept_token(m, t);
        if (ok) cv_matcher_rollback(m, 1);
        if (ok != bit(f->mask, t)) {
            if (wrong < 5) fprintf(stderr, "%s: token %d: mask %d, accept %d\n", what, t, bit(f->mask, t), ok);
            wrong++;
        }
    }
    CHECK_MSG(wrong == 0, "%s: %d ids where the mask and accept_token disagree", what, wrong);
    CHECK(cv_matcher_history(m) == history);
    bool can_end = cv_matcher_can_end(m);
    CHECK_MSG(bit(f->mask, f->eos[0]) == can_end && bit(f->mask, f->eos[1]) == can_end, "%s: eos bits", what);
    /* the bits past the vocabulary stay clear */
    CHECK(f->mask[f->n_words - 1] >> (MODEL_ROWS & 31) == 0 || (MODEL_ROWS & 31) == 0);
    cv_grammar_cache_stats(g, &before);
    cv_matcher_fill_mask(m, f->again);
    cv_grammar_cache_stats(g, &after);
    CHECK_MSG(after.hits == before.hits + 1, "%s: the second mask did not come from the cache", what);
    CHECK_MSG(memcmp(f->mask, f->again, f->n_words * sizeof *f->mask) == 0, "%s: the cached mask differs", what);
    return popcount(f->mask, f->n_words);
}

typedef struct mask_case {
    const char *prefix;
    size_t min_allowed, max_allowed;  /* a sanity band, so that a trivially empty or full mask fails */
} mask_case;

static void check_grammar_masks(vocab_fixture *f, const char *grammar, const mask_case *cases) {
    cv_grammar *g = parse(grammar, f->v);
    if (!g) return;
    for (const mask_case *c = cases; c->prefix; c++) {
        cv_matcher *m = cv_matcher_new(g);
        CHECK_MSG(cv_matcher_accept_bytes(m, c->prefix, strlen(c->prefix)), "prefix \"%s\" refused", c->prefix);
        char what[160];
        snprintf(what, sizeof what, "after \"%.100s\"", c->prefix);
        size_t n = check_mask(f, g, m, what);
        CHECK_MSG(n >= c->min_allowed && n <= c->max_allowed, "%s: %zu allowed, expected %zu..%zu", what, n,
                  c->min_allowed, c->max_allowed);
        cv_matcher_free(m);
    }
    cv_grammar_free(g);
}

static void test_vocab(vocab_fixture *f) {
    CHECK(cv_vocab_size(f->v) == MODEL_ROWS);
    cv_grammar *g = parse("root ::= [^\x01]*", f->v);  /* anything but \x01: every text token fits */
    if (!g) return;
    cv_matcher *m = cv_matcher_new(g);
    cv_matcher_fill_mask(m, f->mask);
    int32_t known = cv_tokenizer_vocab_size(f->tok);
    CHECK(known == 151669);
    size_t specials = 0, refused = 0;
    for (int32_t t = 0; t < MODEL_ROWS; t++) {
        bool special = t >= known || cv_tokenizer_is_special(f->tok, t);
        specials += special && t < known;
        bool is_eos = t == f->eos[0] || t == f->eos[1];
        if (special && !is_eos) {
            refused += !bit(f->mask, t) && !cv_matcher_accept_token(m, t);
        }
    }
    CHECK_MSG(refused == (size_t)(MODEL_ROWS - known) + specials - 2, "special and padded ids must be refused");
    CHECK(specials >= 14);
    CHECK(bit(f->mask, f->eos[0]) && bit(f->mask, f->eos[1]));  /* the empty string is complete */
    CHECK(!cv_matcher_accept_token(m, -1) && !cv_matcher_accept_token(m, MODEL_ROWS));
    CHECK(cv_matcher_history(m) == 0);
    /* every text token but those holding \x01 or ill-formed UTF-8 is allowed */
    int32_t hello = cv_tokenizer_token_to_id(f->tok, "hello");
    CHECK(hello >= 0 && bit(f->mask, hello));
    CHECK(popcount(f->mask, f->n_words) > 140000);
    cv_matcher_free(m);
    cv_grammar_free(g);
}

static void test_eos(vocab_fixture *f) {
    cv_grammar *g = parse("root ::= \"ab\" \"c\"?", f->v);
    if (!g) return;
    cv_matcher *m = cv_matcher_new(g);
    CHECK(!cv_matcher_accept_token(m, f->eos[0]));  /* not a sentence yet */
    CHECK(cv_matcher_accept_bytes(m, "ab", 2) && cv_matcher_can_end(m));
    cv_matcher_fill_mask(m, f->mask);
    CHECK(bit(f->mask, f->eos[0]) && bit(f->mask, f->eos[1]));
    int32_t c = cv_tokenizer_token_to_id(f->tok, "c");
    CHECK(c >= 0 && bit(f->mask, c));
    CHECK(cv_matcher_accept_token(m, f->eos[1]));
    CHECK(cv_matcher_terminated(m) && !cv_matcher_can_end(m));
    CHECK(!cv_matcher_accept_token(m, c) && !cv_matcher_accept_token(m, f->eos[0]));
    CHECK(!cv_matcher_accept_bytes(m, "c", 1) && !cv_matcher_accept_bytes(m, "", 0));
    cv_matcher_fill_mask(m, f->mask);
    CHECK(popcount(f->mask, f->n_words) == 0);
    cv_matcher_rollback(m, 1);
    CHECK(!cv_matcher_terminated(m) && cv_matcher_can_end(m));
    CHECK(cv_matcher_accept_token(m, c));
    CHECK(cv_matcher_terminated(m) && cv_matcher_can_end(m));  /* complete, nothing may follow but eos */
    cv_matcher_fill_mask(m, f->mask);
    CHECK(popcount(f->mask, f->n_words) == 2 && bit(f->mask, f->eos[0]) && bit(f->mask, f->eos[1]));
    cv_matcher_free(m);
    cv_grammar_free(g);
}

static void test_masks(vocab_fixture *f) {
    check_grammar_masks(f, JSONISH, (const mask_case[]){
        {"", 1, 20},
        {"{", 50, 2000},
        {"{\"name\": \"Al", 140000, 150000},             /* inside a string: nearly everything */
        {"{\"name\": \"Al\\", 5, 10000},                  /* after a backslash */
        {"{\"name\": \"Al\\u00", 10, 5000},               /* inside \uXXXX */
        {"{\"name\": \"\xe4\xb8", 20, 5000},              /* inside a multi-byte character */
        {"{\"name\"", 50, 2000},
        {"{\"name\": \"x\", \"age\": 4", 50, 3000},          /* inside a number */
        {"{\"name\": \"x\", \"age\": 0", 50, 3000},          /* no digit may follow a leading 0 */
        {"{\"name\": \"x\", \"age\": 4, \"tags\": [\"a\", ", 20, 2000},
        {"{\"name\": \"x\", \"age\": 4}", 2, 2},            /* complete: eos only */
        {NULL, 0, 0}});
    /* multi-byte classes and '.', a bounded repetition, and an ambiguous nullable start */
    check_grammar_masks(f, "root ::= ([\xe4\xb8\x80-\xe9\xbf\xbf] | \"\xe3\x80\x82\")+ .{0,3} \"!\"", (const mask_case[]){
        {"", 100, 40000}, {"\xe4\xb8\xad", 100, 150000}, {"\xe4\xb8\xad\xe6", 1, 40000}, {"\xe4\xb8\xad" "abc", 1, 10},
        {NULL, 0, 0}});
    check_grammar_masks(f, "root ::= (\"a\" | \"ab\" | \"abc\" | \"\")* [0-9]? (\" \" | \"\\n\")*", (const mask_case[]){
        {"", 10, 1000}, {"abab", 10, 1000}, {"aab1", 2, 500}, {NULL, 0, 0}});
    /* recursion: nested brackets, tokens like "[[" and "]]" */
    check_grammar_masks(f, "root ::= list\nlist ::= \"[\" (list (\",\" list)*)? \"]\"", (const mask_case[]){
        {"", 2, 100}, {"[[[", 2, 200}, {"[[],[[]", 2, 200}, {NULL, 0, 0}});
}

/* Two matchers in the same state through different histories (so different node numbering) share
 * the cached mask, which is the right one. */
static void test_cache_sharing(vocab_fixture *f) {
    cv_grammar *g = parse(JSONISH, f->v);
    if (!g) return;
    cv_matcher *a = cv_matcher_new(g), *b = cv_matcher_new(g);
    CHECK(accept_str(a, "{\"name\": \"x\", \"age\": 12"));
    CHECK(accept_str(b, "{ \"name\" : \"yz\\n\", \"age\" : "));
    cv_matcher_rollback(b, 1);
    CHECK(accept_str(b, "{\"name\": \"x\", "));
    CHECK(accept_str(b, "\"age\": 1"));
    CHECK(accept_str(b, "2"));
    cv_mask_cache_stats s0, s1;
    cv_matcher_fill_mask(a, f->mask);
    cv_grammar_cache_stats(g, &s0);
    cv_matcher_fill_mask(b, f->again);
    cv_grammar_cache_stats(g, &s1);
    CHECK(s1.hits == s0.hits + 1);
    CHECK(memcmp(f->mask, f->again, f->n_words * sizeof *f->mask) == 0);
    check_mask(f, g, b, "the shared state");
    cv_matcher_free(a);
    cv_matcher_free(b);
    cv_grammar_free(g);
}

/* Draws each token uniformly from the mask, as a random-weights model does; every drawn token must be
 * accepted, and the eos bits must follow can_end. A sentence that ends starts over. A few states on
 * the way are checked in full against the reference. */
static int random_walk(vocab_fixture *f, const char *grammar, int steps, uint64_t seed) {
    cv_grammar *g = parse(grammar, f->v);
    if (!g) return 0;
    cv_matcher *m = cv_matcher_new(g);
    cv_rng rng;
    cv_rng_seed(&rng, seed);
    int32_t *allowed = malloc(MODEL_ROWS * sizeof *allowed);
    int refused = 0, eos_wrong = 0, empty = 0, sentences = 0;
    for (int step = 0; step < steps; step++) {
        if (step % 100 == 50) {
            char what[64];
            snprintf(what, sizeof what, "random walk step %d", step);
            check_mask(f, g, m, what);
        }
        cv_matcher_fill_mask(m, f->mask);
        size_t n = 0;
        for (int32_t t = 0; t < MODEL_ROWS; t++)
            if (bit(f->mask, t)) allowed[n++] = t;
        bool can_end = cv_matcher_can_end(m);
        eos_wrong += bit(f->mask, f->eos[0]) != can_end || bit(f->mask, f->eos[1]) != can_end;
        if (n == 0) {
            empty++;
            break;
        }
        int32_t t = allowed[cv_rng_next(&rng) % n];
        refused += !cv_matcher_accept_token(m, t);
        if (cv_matcher_terminated(m)) {
            sentences++;
            cv_matcher_rollback(m, cv_matcher_history(m));
        }
    }
    CHECK_MSG(refused == 0, "%d drawn tokens refused", refused);
    CHECK_MSG(eos_wrong == 0, "%d masks with eos bits unlike can_end", eos_wrong);
    CHECK_MSG(empty == 0, "a mask allowed nothing");
    free(allowed);
    cv_matcher_free(m);
    cv_grammar_free(g);
    return sentences;
}

/* A small cache bound: entries are evicted least-recently-used, the bytes stay within the bound, and
 * a mask computed again after its eviction is the same. */
static void test_cache_eviction(vocab_fixture *f) {
    cv_grammar *g = parse("root ::= \"\\\"\" [^\"\\\\\\x00-\\x1f]{0,30} \"\\\"\"", f->v);
    if (!g) return;
    cv_grammar_set_cache_limit(g, 100000);  /* a handful of bitmaps */
    cv_matcher *m = cv_matcher_new(g);
    size_t n_words = f->n_words;
    uint32_t *first = malloc(n_words * sizeof *first);
    CHECK(accept_str(m, "\""));
    cv_matcher_fill_mask(m, first);
    for (int k = 0; k < 20; k++) {  /* 20 more string positions, each a new state */
        CHECK(accept_str(m, "a"));
        cv_matcher_fill_mask(m, f->mask);
    }
    cv_mask_cache_stats st;
    cv_grammar_cache_stats(g, &st);
    CHECK_MSG(st.evictions > 0 && st.bytes <= 100000, "%llu evictions, %zu bytes",
              (unsigned long long)st.evictions, st.bytes);
    cv_matcher_rollback(m, 20);
    cv_matcher_fill_mask(m, f->mask);
    cv_mask_cache_stats again;
    cv_grammar_cache_stats(g, &again);
    CHECK(again.misses == st.misses + 1);  /* the first state was evicted, so walked again */
    CHECK(memcmp(first, f->mask, n_words * sizeof *first) == 0);
    free(first);
    cv_matcher_free(m);
    cv_grammar_free(g);
}

/* A grammar whose every byte pushes its own return (palindromes) makes every trie node a new state;
 * its walk stops at the budget with a subset: every token it allows is accepted, every single-byte
 * token is decided exactly (so progress stays possible), and the cache counts the stopped walk. */
static void test_walk_budget(vocab_fixture *f) {
    char grammar[4096] = "root ::= \"\" | [^a-zA-Z0-9] root \"!\"";
    static const char letters[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    for (const char *c = letters; *c; c++) {
        size_t n = strlen(grammar);
        snprintf(grammar + n, sizeof grammar - n, " | \"%c\" root \"%c\"", *c, *c);
    }
    cv_grammar *g = parse(grammar, f->v);
    if (!g) return;
    cv_matcher *m = cv_matcher_new(g);
    CHECK(accept_str(m, "ab"));
    cv_matcher_fill_mask(m, f->mask);
    cv_mask_cache_stats st;
    cv_grammar_cache_stats(g, &st);
    CHECK(st.stopped == 1);
    size_t allowed = 0, wrong = 0, singles = 0;
    for (int32_t t = 0; t < MODEL_ROWS; t++) {
        size_t len;
        bool single = !cv_tokenizer_is_special(f->tok, t) && cv_tokenizer_id_to_bytes(f->tok, t, &len) && len == 1;
        if (!bit(f->mask, t) && !single) continue;
        bool ok = cv_matcher_accept_token(m, t);
        if (ok) cv_matcher_rollback(m, 1);
        wrong += ok != bit(f->mask, t);
        allowed += bit(f->mask, t);
        singles += single;
    }
    CHECK_MSG(wrong == 0, "%zu tokens wrong in a stopped walk's mask", wrong);
    CHECK(singles == 256);
    CHECK(allowed > 256);
    cv_matcher_free(m);
    cv_grammar_free(g);
    random_walk(f, grammar, 40, 5);
}

/* Two threads, each with its own matcher of one shared grammar (and so one shared cache), drawing
 * tokens from their masks: every drawn token is accepted, and the last mask is exact. */
typedef struct thread_walk {
    vocab_fixture *f;
    const cv_grammar *g;
    uint64_t seed;
    int refused, wrong, steps;
} thread_walk;

static void *thread_walk_run(void *arg) {
    thread_walk *tw = arg;
    size_t n_words = tw->f->n_words;
    uint32_t *mask = malloc(n_words * sizeof *mask);
    int32_t *allowed = malloc(MODEL_ROWS * sizeof *allowed);
    cv_matcher *m = cv_matcher_new(tw->g);
    cv_rng rng;
    cv_rng_seed(&rng, tw->seed);
    for (int step = 0; step < tw->steps; step++) {
        cv_matcher_fill_mask(m, mask);
        size_t n = 0;
        for (int32_t t = 0; t < MODEL_ROWS; t++)
            if (bit(mask, t)) allowed[n++] = t;
        if (n == 0) break;
        int32_t t = allowed[cv_rng_next(&rng) % n];
        tw->refused += !cv_matcher_accept_token(m, t);
        if (cv_matcher_terminated(m)) cv_matcher_rollback(m, cv_matcher_history(m));
    }
    /* the last mask (perhaps the other thread's cache entry) against the reference */
    cv_matcher_fill_mask(m, mask);
    for (int32_t t = 0; t < MODEL_ROWS; t++) {
        bool ok = cv_matcher_accept_token(m, t);
        if (ok) cv_matcher_rollback(m, 1);
        tw->wrong += ok != bit(mask, t);
    }
    free(mask);
    free(allowed);
    cv_matcher_free(m);
    return NULL;
}

static void test_threads(vocab_fixture *f) {
    cv_grammar *g = parse(JSONISH, f->v);
    if (!g) return;
    thread_walk tw[2] = {{f, g, 21, 0, 0, 150}, {f, g, 22, 0, 0, 150}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) pthread_create(&th[k], NULL, thread_walk_run, &tw[k]);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    CHECK(tw[0].refused == 0 && tw[1].refused == 0);
    CHECK(tw[0].wrong == 0 && tw[1].wrong == 0);
    cv_grammar_free(g);
}

static void test_random_walks(vocab_fixture *f) {
    /* bounded strings and a short array, so the walk gets through whole objects */
    int sentences = random_walk(f,
                "root ::= \"{\" ws \"\\\"id\\\"\" ws \":\" ws int ws \",\" ws \"\\\"tags\\\"\" ws \":\" ws \"[\" ws\n"
                "         (str (ws \",\" ws str){0,2})? ws \"]\" ws \"}\"\n"
                "str ::= \"\\\"\" ([^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\nt]){0,6} \"\\\"\"\n"
                "int ::= \"-\"? [0-9]{1,4}\n"
                "ws ::= [ \\n]{0,2}\n",
                300, 7);
    printf("random walk through the JSON grammar: %d objects completed\n", sentences);
    CHECK(sentences >= 1);
    random_walk(f,
                "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= factor ((\"*\" | \"/\") factor)*\n"
                "factor ::= [0-9]+ | \"(\" ws expr ws \")\" | \"-\" factor\nws ::= \" \"?\n",
                300, 11);
}

int main(void) {
    test_parse_errors();
    test_limits();
    test_bytes();
    test_matcher();
    test_empty_language();
    test_mini_vocab();

    vocab_fixture f = {0};
    if (cv_tokenizer_load(CVLLM_SOURCE_DIR "/models/qwen3-tokenizer", &f.tok) != 0) {
        CHECK_MSG(false, "cannot load the Qwen3 tokenizer");
        return cv_check_summary("test_grammar");
    }
    f.eos[0] = cv_tokenizer_token_to_id(f.tok, "<|im_end|>");
    f.eos[1] = cv_tokenizer_token_to_id(f.tok, "<|endoftext|>");
    CHECK(f.eos[0] == 151645 && f.eos[1] == 151643);
    f.v = cv_vocab_new(f.tok, MODEL_ROWS, f.eos, 2);
    f.n_words = (MODEL_ROWS + 31) / 32;
    f.mask = malloc(f.n_words * sizeof *f.mask);
    f.again = malloc(f.n_words * sizeof *f.again);
    test_vocab(&f);
    test_eos(&f);
    test_masks(&f);
    test_cache_sharing(&f);
    test_cache_eviction(&f);
    test_walk_budget(&f);
    test_random_walks(&f);
    test_threads(&f);
    free(f.mask);
    free(f.again);
    cv_vocab_free(f.v);
    cv_tokenizer_free(f.tok);
    return cv_check_summary("test_grammar");
}
