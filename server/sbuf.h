// server/sbuf.h - a growable byte buffer, always NUL-terminated.
//
// Used for response bodies, SSE chunks and detokenized text. Growth aborts
// on out-of-memory (pg_xrealloc): a front end that cannot allocate a few KB
// has nothing better to do.
#pragma once
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

typedef struct sbuf {
    char *p;      // NULL until the first append; p[len] == 0 afterwards
    size_t len;
    size_t cap;
} sbuf;

// Ensures room for `extra` more bytes plus the NUL.
void sbuf_reserve(sbuf *b, size_t extra);
void sbuf_append(sbuf *b, const void *data, size_t len);
void sbuf_puts(sbuf *b, const char *s);
void sbuf_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Drops the first `n` bytes.
void sbuf_consume(sbuf *b, size_t n);
void sbuf_truncate(sbuf *b, size_t len);
static inline void sbuf_reset(sbuf *b) {
    b->len = 0;
    if (b->p) b->p[0] = 0;
}
// Hands the bytes to the caller (who frees them) and leaves `b` empty.
char *sbuf_steal(sbuf *b, size_t *len);
void sbuf_free(sbuf *b);
// The contents as a string ("" when empty).
static inline const char *sbuf_str(const sbuf *b) { return b->p ? b->p : ""; }
