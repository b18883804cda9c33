/*
 * stats.h — summary statistics computed the way numpy computes them, because vLLM's benchmark
 * numbers come from numpy and ours must be comparable to the last printed digit.
 *
 * mean = pairwise sum / n (numpy's float64 add.reduce), std = population standard deviation
 * (ddof = 0), median = middle element or mean of the two middle ones, percentile = numpy's default
 * "linear" method with its two-sided interpolation. vLLM calls these on `values or 0`, so an empty
 * array gives 0 for every statistic; so do these functions.
 */
#ifndef CV_BENCH_STATS_H
#define CV_BENCH_STATS_H

#include <stddef.h>

/* numpy's pairwise summation of float64 (exact same association order for contiguous arrays). */
double cv_stats_sum(const double *x, size_t n);
double cv_stats_mean(const double *x, size_t n);
double cv_stats_std(const double *x, size_t n);
/* `sorted` must be ascending (cv_stats_sort). */
double cv_stats_median(const double *sorted, size_t n);
double cv_stats_percentile(const double *sorted, size_t n, double pct); /* pct in [0, 100] */
void cv_stats_sort(double *x, size_t n);

/* Formats a double as Python's str() does (shortest round-trip repr, "1.0" for integral values,
 * "inf"), for labels that vLLM builds with f-strings ("P99.9", "openai-4.0qps-..."). */
void cv_stats_py_float(double v, char *buf, size_t size);

#endif
