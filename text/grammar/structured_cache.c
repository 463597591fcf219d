// text/grammar/structured_cache.c - compiled grammars shared by requests that
// give the same constraint (structured.h).
//
// A small array searched linearly with a use clock: capacities are tens of
// entries and a lookup compares a hash first, so this costs far less than
// the compilation it saves.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar/structured.h"

typedef struct entry {
    pg_grammar_kind kind;
    uint64_t hash;
    char *text;
    size_t len;
    pg_grammar *g;
    uint64_t used;
} entry;

struct pg_grammar_cache {
    pthread_mutex_t mu;
    const pg_struct_vocab *v;
    pg_grammar_limits lim;
    entry *e;
    int n, cap;
    uint64_t clock;
};

static uint64_t hash_text(pg_grammar_kind k, const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)k;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

pg_grammar_cache *pg_grammar_cache_create(const pg_struct_vocab *v, const pg_grammar_limits *lim,
                                          int capacity) {
    pg_grammar_cache *c = pg_xcalloc(1, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    c->v = v;
    if (lim)
        c->lim = *lim;
    else
        pg_grammar_limits_default(&c->lim);
    c->cap = capacity > 0 ? capacity : 1;
    c->e = pg_xcalloc((size_t)c->cap, sizeof(entry));
    return c;
}

void pg_grammar_cache_free(pg_grammar_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) {
        free(c->e[i].text);
        pg_grammar_unref(c->e[i].g);
    }
    free(c->e);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int pg_grammar_cache_get(pg_grammar_cache *c, pg_grammar_kind kind, const char *text, size_t len,
                         pg_grammar **out, char *err, size_t err_cap) {
    *out = NULL;
    uint64_t h = hash_text(kind, text, len);
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++) {
        entry *e = &c->e[i];
        if (e->hash == h && e->kind == kind && e->len == len && !memcmp(e->text, text, len)) {
            e->used = ++c->clock;
            *out = pg_grammar_ref(e->g);
            pthread_mutex_unlock(&c->mu);
            return 0;
        }
    }
    pthread_mutex_unlock(&c->mu);
    // Compile outside the lock: two threads missing on the same text both
    // compile, and the second insert is dropped below.
    pg_grammar *g = NULL;
    int rc = pg_grammar_compile(kind, text, len, c->v, &c->lim, &g, err, err_cap);
    if (rc < 0) return rc;
    pthread_mutex_lock(&c->mu);
    int slot = -1;
    for (int i = 0; i < c->n && slot < 0; i++)
        if (c->e[i].hash == h && c->e[i].kind == kind && c->e[i].len == len &&
            !memcmp(c->e[i].text, text, len))
            slot = -2;
    if (slot == -1) {
        if (c->n < c->cap) {
            slot = c->n++;
        } else {
            slot = 0;
            for (int i = 1; i < c->n; i++)
                if (c->e[i].used < c->e[slot].used) slot = i;
            free(c->e[slot].text);
            pg_grammar_unref(c->e[slot].g);
        }
        entry *e = &c->e[slot];
        e->kind = kind;
        e->hash = h;
        e->text = pg_xmalloc(len + 1);
        memcpy(e->text, text, len);
        e->text[len] = 0;
        e->len = len;
        e->g = pg_grammar_ref(g);
        e->used = ++c->clock;
    }
    pthread_mutex_unlock(&c->mu);
    *out = g;
    return 0;
}
