/*
 * histogram.c — see histogram.h. Buckets are found by linear scan: there are at most ~30 and an
 * observation happens once per token at most.
 */
#include "base/histogram.h"

#include <assert.h>
#include <string.h>

void cv_histogram_init(cv_histogram *h, const double *bounds, size_t n_bounds) {
    assert(n_bounds <= CV_HISTOGRAM_MAX_BUCKETS);
    memset(h, 0, sizeof *h);
    h->bounds = bounds;
    h->n_bounds = n_bounds;
}

void cv_histogram_observe(cv_histogram *h, double value) {
    size_t i = 0;
    while (i < h->n_bounds && value > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += value;
    h->count++;
}
