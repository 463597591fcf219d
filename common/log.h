// common/log.h - leveled logging to stderr with a timestamp.
#pragma once

typedef enum { PG_LOG_DEBUG, PG_LOG_INFO, PG_LOG_WARN, PG_LOG_ERROR } pg_log_level;

// Messages below this level are dropped (default INFO; PAGED_LOG=debug).
void pg_log_set_level(pg_log_level level);
void pg_log(pg_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define PG_LOGD(...) pg_log(PG_LOG_DEBUG, __VA_ARGS__)
#define PG_LOGI(...) pg_log(PG_LOG_INFO, __VA_ARGS__)
#define PG_LOGW(...) pg_log(PG_LOG_WARN, __VA_ARGS__)
#define PG_LOGE(...) pg_log(PG_LOG_ERROR, __VA_ARGS__)
