// common/err.c - per-thread error message storage.
#include "common/err.h"

#include <string.h>

static _Thread_local char err_buf[1024];

int pg_err_set(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    return code;
}

int pg_err_wrap(int code, const char *fmt, ...) {
    char prefix[512], old[sizeof err_buf];
    memcpy(old, err_buf, sizeof old);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    snprintf(err_buf, sizeof err_buf, "%s%s", prefix, old);
    return code;
}

const char *pg_err_msg(void) { return err_buf; }

static void *oom(size_t n) {
    fprintf(stderr, "out of host memory allocating %zu bytes\n", n);
    abort();
}

void *pg_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    return p ? p : oom(n);
}

void *pg_xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    return p ? p : oom(count * size);
}

void *pg_xrealloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    return q ? q : oom(n);
}

char *pg_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(pg_xmalloc(n), s, n);
}
