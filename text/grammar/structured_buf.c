// text/grammar/structured_buf.c - the growable text buffer the converters
// write GBNF into (structured_int.h), with a cap that marks the text
// incomplete instead of growing past it.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar/structured_int.h"

static void buf_grow(sg_buf *b, size_t add) {
    if (b->limit && b->len + add > b->limit) {
        b->overflow = true;
        return;
    }
    if (b->len + add + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->len + add + 1) cap *= 2;
    b->p = pg_xrealloc(b->p, cap);
    b->cap = cap;
}

void sg_putn(sg_buf *b, const char *s, size_t n) {
    if (b->overflow || n == 0) return;
    buf_grow(b, n);
    if (b->overflow) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void sg_puts(sg_buf *b, const char *s) { sg_putn(b, s, strlen(s)); }

void sg_printf(sg_buf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        sg_putn(b, small, (size_t)n);
        return;
    }
    char *big = pg_xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    sg_putn(b, big, (size_t)n);
    free(big);
}

void sg_put_literal(sg_buf *b, const char *s, size_t n) {
    sg_putn(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sg_putn(b, e, 2);
        } else if (c < 0x20 || c == 0x7f) {
            sg_printf(b, "\\x%02X", c);
        } else {
            sg_putn(b, (const char *)&c, 1);
        }
    }
    sg_putn(b, "\"", 1);
}

void sg_free(sg_buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}
