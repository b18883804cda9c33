/*
 * histogram.h — a fixed-bucket histogram in Prometheus' shape (cumulative counts per upper bound,
 * plus sum and count). Not synchronised: the owner guards it.
 */
#ifndef CV_HISTOGRAM_H
#define CV_HISTOGRAM_H

#include <stddef.h>
#include <stdint.h>

#define CV_HISTOGRAM_MAX_BUCKETS 32

typedef struct cv_histogram {
    const double *bounds;        /* ascending upper bounds (static), +Inf implied */
    size_t n_bounds;
    uint64_t counts[CV_HISTOGRAM_MAX_BUCKETS + 1]; /* per bucket, not cumulative; last = +Inf */
    double sum;
    uint64_t count;
} cv_histogram;

void cv_histogram_init(cv_histogram *h, const double *bounds, size_t n_bounds);
void cv_histogram_observe(cv_histogram *h, double value);
/* vLLM's build_1_2_5_buckets(max_value): 1, 2, 5, 10, 20, 50, ... up to max_value, into out[cap];
 * returns how many. */
size_t cv_histogram_1_2_5_bounds(double max_value, double *out, size_t cap);

#endif
