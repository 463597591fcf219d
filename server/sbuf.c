// server/sbuf.c - growable byte buffer.
#include "server/sbuf.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/err.h"

void sbuf_reserve(sbuf *b, size_t extra) {
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    b->p = pg_xrealloc(b->p, cap);
    b->cap = cap;
}

void sbuf_append(sbuf *b, const void *data, size_t len) {
    sbuf_reserve(b, len);
    if (len) memcpy(b->p + b->len, data, len);
    b->len += len;
    b->p[b->len] = 0;
}

void sbuf_puts(sbuf *b, const char *s) { sbuf_append(b, s, strlen(s)); }

void sbuf_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        sbuf_append(b, small, (size_t)n);
        return;
    }
    sbuf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void sbuf_consume(sbuf *b, size_t n) {
    if (n >= b->len) {
        sbuf_reset(b);
        return;
    }
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    b->p[b->len] = 0;
}

void sbuf_truncate(sbuf *b, size_t len) {
    if (len < b->len) {
        b->len = len;
        b->p[len] = 0;
    }
}

char *sbuf_steal(sbuf *b, size_t *len) {
    if (!b->p) sbuf_reserve(b, 0), b->p[0] = 0;
    char *p = b->p;
    if (len) *len = b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

void sbuf_free(sbuf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}
