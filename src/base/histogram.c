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

size_t cv_histogram_1_2_5_bounds(double max_value, double *out, size_t cap) {
    static const double mantissas[] = {1, 2, 5};
    size_t n = 0;
    for (double scale = 1;; scale *= 10)
        for (size_t i = 0; i < 3; i++) {
            double v = mantissas[i] * scale;
            if (v > max_value || n == cap) return n;
            out[n++] = v;
        }
}
