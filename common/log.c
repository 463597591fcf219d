// common/log.c - leveled logging to stderr.
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int log_level = -1;

void pg_log_set_level(pg_log_level level) { log_level = (int)level; }

static int current_level(void) {
    if (log_level < 0) {
        const char *env = getenv("PAGED_LOG");
        log_level = PG_LOG_INFO;
        if (env && !strcmp(env, "debug")) log_level = PG_LOG_DEBUG;
        if (env && !strcmp(env, "warn")) log_level = PG_LOG_WARN;
        if (env && !strcmp(env, "error")) log_level = PG_LOG_ERROR;
    }
    return log_level;
}

void pg_log(pg_log_level level, const char *fmt, ...) {
    if ((int)level < current_level()) return;
    static const char *names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char line[2048];
    int n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03ld %-5s ", tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, names[level]);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    // One fputs per line so lines from different threads do not interleave.
    size_t len = strlen(line);
    if (len + 1 < sizeof line) line[len] = '\n', line[len + 1] = 0;
    fputs(line, stderr);
}
