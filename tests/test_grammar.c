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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "check.h"
#include "sample/grammar/grammar.h"
#include "tokenizer/tokenizer.h"

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

int main(void) {
    test_parse_errors();
    test_limits();
    test_bytes();
    test_matcher();
    return cv_check_summary("test_grammar");
}
