/*
 * log.h — one-line, timestamped log messages on stderr in vLLM's shape
 * ("INFO 11-30 07:31:02 [engine] message"). The level comes from CVLLM_LOG_LEVEL
 * (debug|info|warning|error, default info), read once.
 */
#ifndef CV_LOG_H
#define CV_LOG_H

enum cv_log_level { CV_LOG_DEBUG, CV_LOG_INFO, CV_LOG_WARNING, CV_LOG_ERROR };

void cv_log(enum cv_log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int cv_log_enabled(enum cv_log_level level);
/* Sets the lowest level written and returns the one before, for a caller that says nothing for a
 * while (a check that another process repeats aloud) and then restores it. */
enum cv_log_level cv_log_set_threshold(enum cv_log_level level);

#define cv_debug(comp, ...) cv_log(CV_LOG_DEBUG, comp, __VA_ARGS__)
#define cv_info(comp, ...) cv_log(CV_LOG_INFO, comp, __VA_ARGS__)
#define cv_warn(comp, ...) cv_log(CV_LOG_WARNING, comp, __VA_ARGS__)
#define cv_error_log(comp, ...) cv_log(CV_LOG_ERROR, comp, __VA_ARGS__)

#endif
