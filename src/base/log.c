/*
 * log.c — see log.h. A whole line is formatted first and written with one fputs so that lines from
 * different threads never interleave.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static int threshold = -1;

static int level_from_env(void) {
    const char *s = getenv("CVLLM_LOG_LEVEL");
    if (!s) return CV_LOG_INFO;
    if (!strcasecmp(s, "debug")) return CV_LOG_DEBUG;
    if (!strcasecmp(s, "warning") || !strcasecmp(s, "warn")) return CV_LOG_WARNING;
    if (!strcasecmp(s, "error")) return CV_LOG_ERROR;
    return CV_LOG_INFO;
}

int cv_log_enabled(enum cv_log_level level) {
    if (threshold < 0) threshold = level_from_env();
    return (int)level >= threshold;
}

enum cv_log_level cv_log_set_threshold(enum cv_log_level level) {
    if (threshold < 0) threshold = level_from_env();
    const enum cv_log_level was = (enum cv_log_level)threshold;
    threshold = (int)level;
    return was;
}

void cv_log(enum cv_log_level level, const char *component, const char *fmt, ...) {
    static const char *names[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
    if (!cv_log_enabled(level)) return;
    char line[2048];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    int n = snprintf(line, sizeof line, "%s %02d-%02d %02d:%02d:%02d [%s] ", names[level],
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, component);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    if (len + 1 < sizeof line) {
        line[len] = '\n';
        line[len + 1] = '\0';
    }
    fputs(line, stderr);
}
