// text/grammar/structured_vocab.c - the vocabulary as the grammar matcher sees
// it (structured_state.h): each token's bytes, whether it may be matched as
// text, and the trie of the text tokens in pre-order that a mask walks
// (structured_mask.c), with the plain-byte facts its shortcut needs.
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar/structured_state.h"
#include "text/tokenizer/tokenizer.h"

static int cmp_tok(const void *a, const void *b, void *ctx) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    const pg_struct_vocab *v = ctx;
    int32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], (size_t)(lx < ly ? lx : ly));
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void build_trie(pg_struct_vocab *v) {
    int32_t *order = pg_xmalloc(sizeof(int32_t) * (size_t)(v->n + 1));
    int32_t m = 0;
    for (int32_t i = 0; i < v->n; i++)
        if (v->text[i]) order[m++] = i;
    qsort_r(order, (size_t)m, sizeof(int32_t), cmp_tok, v);
    int64_t cap = 0;
    for (int32_t k = 0; k < m; k++) cap += v->off[order[k] + 1] - v->off[order[k]];
    v->nbyte = pg_xmalloc((size_t)cap + 1);
    v->ndepth = pg_xmalloc(sizeof(uint16_t) * (size_t)(cap + 1));
    v->nskip = pg_xmalloc(sizeof(int32_t) * (size_t)(cap + 1));
    v->ntok = pg_xmalloc(sizeof(int32_t) * (size_t)(cap + 2));
    v->toks = pg_xmalloc(sizeof(int32_t) * (size_t)(m + 1));
    int32_t path[65536 / 4];
    int32_t depth = 0, n_tok = 0, maxd = 0;
    const uint8_t *prev = NULL;
    int32_t prev_len = 0;
    for (int32_t k = 0; k < m; k++) {
        int32_t t = order[k];
        const uint8_t *b = v->bytes + v->off[t];
        int32_t len = v->off[t + 1] - v->off[t];
        if (len > (int32_t)(sizeof path / sizeof path[0]) - 1) continue;  // absurdly long token
        int32_t c = 0;
        while (c < len && c < prev_len && b[c] == prev[c]) c++;
        while (depth > c) v->nskip[path[--depth]] = v->n_nodes;  // close deeper nodes
        for (int32_t d = c; d < len; d++) {
            int32_t id = v->n_nodes++;
            v->nbyte[id] = b[d];
            v->ndepth[id] = (uint16_t)(d + 1);
            v->ntok[id] = n_tok;
            path[depth++] = id;
        }
        if (len > maxd) maxd = len;
        v->toks[n_tok++] = t;
        // tokens at a node are counted by the next node's ntok: keep the
        // start of every later node at the current count
        prev = b;
        prev_len = len;
    }
    while (depth > 0) v->nskip[path[--depth]] = v->n_nodes;
    v->ntok[v->n_nodes] = n_tok;
    // ntok[i] was the token count when node i was created; a node's own
    // tokens are those added before the next node was created.
    v->max_depth = maxd;
    // Children of i are i + 1, then each child's nskip, up to nskip[i];
    // going backwards every child is done before its parent.
    v->nplain = pg_xmalloc((size_t)v->n_nodes + 1);
    v->nsdepth = pg_xmalloc((size_t)v->n_nodes + 1);
    for (int32_t i = v->n_nodes - 1; i >= 0; i--) {
        uint8_t ok = 1;
        int sd = 0;
        for (int32_t c = i + 1; c < v->nskip[i]; c = v->nskip[c]) {
            ok = ok && v->nplain[c] && sg_plain_byte(v->nbyte[c]);
            if (v->nsdepth[c] + 1 > sd) sd = v->nsdepth[c] + 1;
        }
        v->nplain[i] = ok;
        v->nsdepth[i] = (uint8_t)(sd > 255 ? 255 : sd);
    }
    free(order);
}

int pg_struct_vocab_create(int32_t n, const char *const *tok, const int32_t *len,
                           const bool *special, int32_t eos, pg_struct_vocab **out) {
    *out = NULL;
    if (n <= 0 || !tok || !len || eos >= n)
        return pg_err_set(PG_EINVAL, "structured vocab: bad arguments (n %d, eos %d)", n, eos);
    pg_struct_vocab *v = pg_xcalloc(1, sizeof *v);
    v->n = n;
    v->eos = eos;
    v->off = pg_xmalloc(sizeof(int32_t) * (size_t)(n + 1));
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (len[i] < 0 || total + len[i] > INT32_MAX / 2) {
            free(v->off);
            free(v);
            return pg_err_set(PG_EINVAL, "structured vocab: bad token length at %d", i);
        }
        total += len[i];
    }
    v->bytes = pg_xmalloc((size_t)total + 1);
    v->text = pg_xcalloc((size_t)n, 1);
    int32_t o = 0;
    for (int32_t i = 0; i < n; i++) {
        v->off[i] = o;
        if (len[i]) memcpy(v->bytes + o, tok[i], (size_t)len[i]);
        o += len[i];
        v->text[i] = len[i] > 0 && !(special && special[i]) && i != eos;
    }
    v->off[n] = o;
    build_trie(v);
    *out = v;
    return 0;
}

int pg_struct_vocab_from_tokenizer(const pg_tokenizer *t, pg_struct_vocab **out) {
    int32_t n = pg_tokenizer_vocab_size(t);
    char **tok = pg_xcalloc((size_t)n, sizeof(char *));
    int32_t *len = pg_xcalloc((size_t)n, sizeof(int32_t));
    bool *special = pg_xcalloc((size_t)n, sizeof(bool));
    char buf[1024];
    for (int32_t i = 0; i < n; i++) {
        int k = pg_tokenizer_token_bytes(t, i, buf, sizeof buf);
        if (k < 0 || k > (int)sizeof buf) k = 0;  // never allowed as text
        tok[i] = pg_xmalloc((size_t)k + 1);
        memcpy(tok[i], buf, (size_t)k);
        len[i] = k;
        special[i] = pg_tokenizer_is_special(t, i);
    }
    int rc = pg_struct_vocab_create(n, (const char *const *)tok, len, special, pg_tokenizer_eos(t), out);
    for (int32_t i = 0; i < n; i++) free(tok[i]);
    free(tok);
    free(len);
    free(special);
    return rc;
}

void pg_struct_vocab_free(pg_struct_vocab *v) {
    if (!v) return;
    free(v->off);
    free(v->bytes);
    free(v->text);
    free(v->nbyte);
    free(v->ndepth);
    free(v->nskip);
    free(v->ntok);
    free(v->toks);
    free(v->nplain);
    free(v->nsdepth);
    free(v);
}

int32_t pg_struct_vocab_size(const pg_struct_vocab *v) { return v->n; }
