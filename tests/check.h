/*
 * check.h — the smallest test harness that does the job: CHECK macros count and report failures
 * with file:line and keep going; a test program ends with `return cv_check_summary("name")`, which
 * prints "N passed, N failed" and returns the exit code ctest reads.
 */
#ifndef CV_CHECK_H
#define CV_CHECK_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int cv_checks_passed, cv_checks_failed;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (cond) {                                                                   \
            cv_checks_passed++;                                                       \
        } else {                                                                      \
            cv_checks_failed++;                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);  \
        }                                                                             \
    } while (0)

#define CHECK_MSG(cond, ...)                                                          \
    do {                                                                              \
        if (cond) {                                                                   \
            cv_checks_passed++;                                                       \
        } else {                                                                      \
            cv_checks_failed++;                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
        }                                                                             \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                            \
    do {                                                                              \
        long long cv_a_ = (long long)(a), cv_b_ = (long long)(b);                     \
        CHECK_MSG(cv_a_ == cv_b_, "%lld != %lld", cv_a_, cv_b_);                       \
    } while (0)

#define CHECK_STR_EQ(a, b)                                                            \
    do {                                                                              \
        const char *cv_a_ = (a), *cv_b_ = (b);                                        \
        CHECK_MSG(cv_a_ && cv_b_ && strcmp(cv_a_, cv_b_) == 0, "\"%s\" != \"%s\"",    \
                  cv_a_ ? cv_a_ : "(null)", cv_b_ ? cv_b_ : "(null)");                \
    } while (0)

#define CHECK_CONTAINS(haystack, needle)                                              \
    do {                                                                              \
        const char *cv_h_ = (haystack), *cv_n_ = (needle);                            \
        CHECK_MSG(cv_h_ && strstr(cv_h_, cv_n_), "\"%s\" does not contain \"%s\"",    \
                  cv_h_ ? cv_h_ : "(null)", cv_n_);                                   \
    } while (0)

static inline int cv_check_summary(const char *name) {
    printf("%s: %d passed, %d failed\n", name, cv_checks_passed, cv_checks_failed);
    return cv_checks_failed ? 1 : 0;
}

#endif
