/*
 * metrics.h — /metrics in Prometheus' text exposition format (version 0.0.4), with vLLM's metric
 * names and labels (model_name, engine), from a cv_engine_stats snapshot.
 */
#ifndef CV_SERVER_METRICS_H
#define CV_SERVER_METRICS_H

#include "engine/engine_loop.h"

/* The whole exposition (free()). `model_name` is the first served model name. */
char *cv_metrics_render(const cv_engine_stats *st, const char *model_name);

#endif
