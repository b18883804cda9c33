/*
 * arrivals.c — see arrivals.h. The gamma sampler is Marsaglia and Tsang's squeeze method (one
 * normal and one uniform per try, accepted > 95% of the time), the standard choice when a
 * numpy-quality generator is wanted without numpy; normals come from the polar Box–Muller method.
 * Shape 1 takes the exponential shortcut so the default Poisson case costs one log per request.
 */
#include "bench/arrivals.h"

#include <assert.h>
#include <math.h>

static double standard_normal(cv_rng *rng) {
    for (;;) {
        double u = 2.0 * cv_rng_uniform(rng) - 1.0, v = 2.0 * cv_rng_uniform(rng) - 1.0;
        double s = u * u + v * v;
        if (s > 0.0 && s < 1.0) return u * sqrt(-2.0 * log(s) / s);
    }
}

/* Gamma(shape, 1) for shape >= 1. */
static double gamma_large(cv_rng *rng, double shape) {
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = standard_normal(rng), v = 1.0 + c * x;
        if (v <= 0.0) continue;
        v = v * v * v;
        double u = cv_rng_uniform(rng);
        if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
        if (u > 0.0 && log(u) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v;
    }
}

double cv_gamma_sample(cv_rng *rng, double shape, double scale) {
    assert(shape > 0 && scale > 0);
    if (shape == 1.0) return scale * cv_rng_exponential(rng);
    if (shape >= 1.0) return scale * gamma_large(rng, shape);
    double u;
    do u = cv_rng_uniform(rng);
    while (u == 0.0);
    return scale * gamma_large(rng, shape + 1.0) * pow(u, 1.0 / shape);
}

/* The gap before a request sent at `rate` (vLLM's get_request). */
static double gap_at(cv_rng *rng, double rate, double burstiness) {
    if (isinf(rate)) return 0;
    if (isinf(burstiness)) return 1.0 / rate;
    return cv_gamma_sample(rng, burstiness, 1.0 / (rate * burstiness));
}

void cv_arrival_times(cv_rng *rng, size_t n, double rate, double burstiness, double *t) {
    assert(rate > 0 && burstiness > 0);
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        sum += gap_at(rng, rate, burstiness);
        t[i] = sum;
    }
    if (n == 0 || sum == 0) return;
    double factor = ((double)n / rate) / sum;
    for (size_t i = 0; i < n; i++) t[i] *= factor;
}

void cv_arrival_times_ramp(cv_rng *rng, size_t n, cv_ramp_strategy strategy, double start, double end,
                           double burstiness, double *t, double *rates) {
    assert(start > 0 && end > 0 && burstiness > 0);
    double sum = 0;
    for (size_t i = 0; i < n; i++) {
        const double share = (double)i / (double)(n > 2 ? n - 1 : 1);
        rates[i] = strategy == CV_RAMP_LINEAR ? start + (end - start) * share : start * pow(end / start, share);
        sum += gap_at(rng, rates[i], burstiness);
        t[i] = sum;
    }
}
