/*
 * arrivals.h — when `bench serve` sends each request, as vLLM's get_request() decides it.
 *
 * With a finite --request-rate R and --burstiness B, the gaps between requests are
 * Gamma(shape = B, scale = 1 / (R·B)) (B = 1 is a Poisson process; the coefficient of variation is
 * 1/√B), the first request also waits one gap, and the cumulative times are then rescaled so that
 * the last request goes out at exactly N/R seconds — which makes the offered load the same for
 * every seed. R = inf sends everything at t = 0; B = inf gives evenly spaced requests.
 */
#ifndef CV_BENCH_ARRIVALS_H
#define CV_BENCH_ARRIVALS_H

#include <stddef.h>

#include "base/rng.h"

/* One Gamma(shape, scale) variate (Marsaglia–Tsang; shape < 1 through the x·U^(1/shape) boost). */
double cv_gamma_sample(cv_rng *rng, double shape, double scale);

/* Fills t[0..n) with send times in seconds from the benchmark start (non-decreasing). `rate` and
 * `burstiness` must be > 0 and may be INFINITY. Deterministic for a given rng state. */
void cv_arrival_times(cv_rng *rng, size_t n, double rate, double burstiness, double *t);

/* vLLM's --ramp-up-strategy: request i's rate goes from `start` to `end` requests/s with its share
 * i/(n−1) of the run, linearly or exponentially (start·(end/start)^share), its gap drawn at that rate
 * as above, and the times are not rescaled. rates[i] gets request i's rate. start, end > 0. */
typedef enum { CV_RAMP_LINEAR, CV_RAMP_EXPONENTIAL } cv_ramp_strategy;
void cv_arrival_times_ramp(cv_rng *rng, size_t n, cv_ramp_strategy strategy, double start, double end,
                           double burstiness, double *t, double *rates);

#endif
