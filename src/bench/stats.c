/*
 * stats.c — see stats.h. The summation copies numpy's pairwise_sum (unrolled by 8, blocks of 128,
 * halves rounded to a multiple of 8) rather than a plain loop: for more than 8 values the two give
 * different last bits, and the point of this file is to print what vLLM prints.
 */
#include "bench/stats.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

enum { PAIRWISE_BLOCK = 128 };

double cv_stats_sum(const double *x, size_t n) {
    if (n < 8) {
        double s = 0.;
        for (size_t i = 0; i < n; i++) s += x[i];
        return s;
    }
    if (n <= PAIRWISE_BLOCK) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = x[j];
        size_t i = 8;
        for (; i < n - n % 8; i += 8)
            for (int j = 0; j < 8; j++) r[j] += x[i + j];
        double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) s += x[i];
        return s;
    }
    size_t half = n / 2;
    half -= half % 8;
    return cv_stats_sum(x, half) + cv_stats_sum(x + half, n - half);
}

double cv_stats_mean(const double *x, size_t n) { return n ? cv_stats_sum(x, n) / (double)n : 0.0; }

double cv_stats_std(const double *x, size_t n) {
    if (!n) return 0.0;
    double mean = cv_stats_mean(x, n);
    double *sq = cv_xmalloc(n * sizeof *sq);
    for (size_t i = 0; i < n; i++) sq[i] = (x[i] - mean) * (x[i] - mean);
    double var = cv_stats_sum(sq, n) / (double)n;
    free(sq);
    return sqrt(var);
}

double cv_stats_median(const double *sorted, size_t n) {
    if (!n) return 0.0;
    if (n % 2) return sorted[n / 2];
    return (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0;
}

/* numpy's _lerp: interpolating from the nearer end keeps the result monotonic and exact at t=1. */
static double lerp(double a, double b, double t) {
    double d = b - a;
    return t >= 0.5 ? b - d * (1.0 - t) : a + d * t;
}

double cv_stats_percentile(const double *sorted, size_t n, double pct) {
    assert(pct >= 0 && pct <= 100);
    if (!n) return 0.0;
    double virtual_index = (pct / 100.0) * (double)(n - 1);
    double lo = floor(virtual_index);
    size_t i = (size_t)lo, j = i + 1 < n ? i + 1 : n - 1;
    return lerp(sorted[i], sorted[j], virtual_index - lo);
}

static int compare_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

void cv_stats_sort(double *x, size_t n) {
    if (n > 1) qsort(x, n, sizeof *x, compare_double);
}

void cv_stats_py_float(double v, char *buf, size_t size) {
    assert(size >= 32);
    if (isinf(v)) {
        snprintf(buf, size, v > 0 ? "inf" : "-inf");
        return;
    }
    if (isnan(v)) {
        snprintf(buf, size, "nan");
        return;
    }
    int digits = 1;
    for (; digits < 17; digits++) {
        snprintf(buf, size, "%.*e", digits - 1, v);
        if (strtod(buf, NULL) == v) break;
    }
    snprintf(buf, size, "%.*e", digits - 1, v);
    int exponent = atoi(strchr(buf, 'e') + 1);
    if (exponent < -4 || exponent >= 16) return; /* Python keeps the scientific form here */
    int decimals = digits - 1 - exponent;
    snprintf(buf, size, "%.*f", decimals > 0 ? decimals : 0, v);
    if (!strchr(buf, '.')) strncat(buf, ".0", size - strlen(buf) - 1);
}
