// text/tokenizer/tokenizer.c - encode, decode and incremental detokenization.
//
// Encoding runs in three steps:
//   1. added/special tokens are matched in the raw text (leftmost, then
//      longest), splitting it into text fragments and token ids;
//   2. byte-level BPE: each fragment is split into pieces by the
//      pre-tokenizer regexes (PCRE2, one stage after another, matches and the
//      gaps between them both become pieces); SPM: each fragment becomes one
//      piece with ' ' replaced by '▁' and maybe a '▁' in front;
//   3. each piece is merged with a priority queue over a linked list of
//      symbols: O(n log n) in the piece length.
// The tokenizer is read-only here; every call keeps its scratch to itself.
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/tokenizer/tokenizer_int.h"

// --- per-call encoder state -------------------------------------------------

// A symbol of a piece being merged: bytes [start, start + len) of the piece.
// len == 0 marks a symbol merged into its left neighbour.
typedef struct {
    int32_t id;                // token id, -1 when the text is not a token
    int32_t prev, next;        // neighbours in the piece, -1 at the ends
    uint32_t start, len;
} bpe_sym;

// A candidate merge of two adjacent symbols. It is stale (skipped when
// popped) unless both symbols still have the lengths recorded here and are
// still neighbours. `key` orders the queue: priority in the high half (merge
// rank, or the SPM score mapped to an ordered integer), left index in the
// low half, so equal priorities merge leftmost first.
typedef struct {
    uint64_t key;
    int32_t right;
    uint32_t llen, rlen;
    int32_t merged;
} bpe_cand;

static int32_t cand_left(const bpe_cand *c) { return (int32_t)(uint32_t)c->key; }

// Maps -score to a uint32 that sorts like the float (higher scores first).
static uint32_t score_prio(float score) {
    float f = -score + 0.0f;  // -0.0 -> +0.0
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

typedef struct {
    const pg_tokenizer *t;
    bool parse_special;
    int32_t *ids;              // caller's output, [cap]
    int cap;
    int n;                     // ids produced so far (may exceed cap)
    pcre2_match_data *md;
    pcre2_match_context *mctx; // created on the first JIT stack overflow
    pcre2_jit_stack *jit;
    bpe_sym *syms;
    size_t syms_cap;
    bpe_cand *heap;
    size_t heap_n, heap_cap;
    char *buf;                 // SPM escaped text / a piece in the BPE alphabet
    size_t buf_cap;
} enc_state;

static int enc_grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return PG_OK;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, nc * elem);
    if (!q) return pg_err_set(PG_ENOMEM, "tokenizer: out of memory (%zu bytes)", nc * elem);
    *p = q;
    *cap = nc;
    return PG_OK;
}

static int emit(enc_state *e, int32_t id) {
    if (e->n == INT_MAX) return pg_err_set(PG_EINVAL, "tokenizer: too many tokens");
    if (e->n < e->cap) e->ids[e->n] = id;
    e->n++;
    return PG_OK;
}

// --- merging ----------------------------------------------------------------

static bool cand_less(const bpe_cand *a, const bpe_cand *b) { return a->key < b->key; }

static int heap_push(enc_state *e, bpe_cand c) {
    void *h = e->heap;
    PG_TRY(enc_grow(&h, &e->heap_cap, e->heap_n + 1, sizeof *e->heap));
    e->heap = h;
    size_t i = e->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &e->heap[p])) break;
        e->heap[i] = e->heap[p];
        i = p;
    }
    e->heap[i] = c;
    return PG_OK;
}

static bpe_cand heap_pop(enc_state *e) {
    bpe_cand top = e->heap[0], last = e->heap[--e->heap_n];
    size_t n = e->heap_n, i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const bpe_cand *best = &last;
        if (l < n && cand_less(&e->heap[l], best)) {
            m = l;
            best = &e->heap[l];
        }
        if (r < n && cand_less(&e->heap[r], best)) m = r;
        if (m == i) break;
        e->heap[i] = e->heap[m];
        i = m;
    }
    if (n) e->heap[i] = last;
    return top;
}

// Queues the merge of symbols l and r when the vocabulary has one.
static int try_pair(enc_state *e, const char *s, int32_t l, int32_t r) {
    const pg_tokenizer *t = e->t;
    const bpe_sym *L = &e->syms[l], *R = &e->syms[r];
    bpe_cand c = {.right = r, .llen = L->len, .rlen = R->len};
    uint32_t prio;
    if (t->merge_by_score) {
        c.merged = pg_tok_lookup(t, s + L->start, (size_t)L->len + R->len);
        if (c.merged < 0) return PG_OK;
        prio = score_prio(t->scores[c.merged]);
    } else {
        if (L->id < 0 || R->id < 0) return PG_OK;
        const pg_tok_pair *p = pg_tok_merge_find(t, L->id, R->id);
        if (!p) return PG_OK;
        c.merged = p->merged;
        prio = (uint32_t)p->rank;
    }
    c.key = ((uint64_t)prio << 32) | (uint32_t)l;
    return heap_push(e, c);
}

// Merges the e->syms[0 .. n) of piece `s` (linked in order) until no
// adjacent pair merges. Symbol 0 always stays the head of the list.
static int merge_symbols(enc_state *e, const char *s, int32_t n) {
    e->heap_n = 0;
    for (int32_t i = 0; i + 1 < n; i++) PG_TRY(try_pair(e, s, i, i + 1));
    while (e->heap_n) {
        bpe_cand c = heap_pop(e);
        int32_t left = cand_left(&c);
        bpe_sym *L = &e->syms[left];
        if (L->len != c.llen || L->next != c.right) continue;
        bpe_sym *R = &e->syms[c.right];
        if (R->len != c.rlen) continue;
        L->id = c.merged;
        L->len += R->len;
        L->next = R->next;
        if (R->next >= 0) e->syms[R->next].prev = left;
        R->len = 0;
        if (L->prev >= 0) PG_TRY(try_pair(e, s, L->prev, left));
        if (L->next >= 0) PG_TRY(try_pair(e, s, left, L->next));
    }
    return PG_OK;
}

// Emits a symbol that is not a token: byte tokens (byte fallback) or unknown.
static int emit_fallback(enc_state *e, const char *s, size_t n) {
    const pg_tokenizer *t = e->t;
    if (t->kind == PG_TOK_SPM && !t->byte_fallback)
        return t->unk_fallback >= 0 ? emit(e, t->unk_fallback) : PG_OK;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[(unsigned char)s[i]];
        if (id < 0) id = t->unk_fallback;
        if (id >= 0) PG_TRY(emit(e, id));
    }
    return PG_OK;
}

static int emit_symbols(enc_state *e, const char *s) {
    for (int32_t i = 0; i >= 0; i = e->syms[i].next) {
        const bpe_sym *y = &e->syms[i];
        if (y->id >= 0) PG_TRY(emit(e, y->id));
        else PG_TRY(emit_fallback(e, s + y->start, y->len));
    }
    return PG_OK;
}

// --- byte-level BPE -------------------------------------------------------

// Encodes one pre-tokenized piece of raw bytes.
static int bpe_piece(enc_state *e, const char *s, size_t n) {
    const pg_tokenizer *t = e->t;
    if (n == 1) return emit_fallback(e, s, 1);  // byte_id, else unknown
    if (t->ignore_merges) {
        // A piece that is a token is emitted whole: look it up in the alphabet.
        void *b = e->buf;
        PG_TRY(enc_grow(&b, &e->buf_cap, n * 2, 1));
        e->buf = b;
        size_t w = 0;
        for (size_t i = 0; i < n; i++)
            w += (size_t)pg_tok_utf8_put(pg_tok_byte_to_cp((uint8_t)s[i]), e->buf + w);
        int32_t id = pg_tok_lookup(t, e->buf, w);
        if (id >= 0) return emit(e, id);
    }
    if (n > INT32_MAX) return pg_err_set(PG_EINVAL, "tokenizer: piece too long");
    void *p = e->syms;
    PG_TRY(enc_grow(&p, &e->syms_cap, n, sizeof *e->syms));
    e->syms = p;
    for (size_t i = 0; i < n; i++) {
        e->syms[i] = (bpe_sym){.id = t->byte_id[(unsigned char)s[i]],
                               .prev = (int32_t)i - 1,
                               .next = i + 1 < n ? (int32_t)i + 1 : -1,
                               .start = (uint32_t)i,
                               .len = 1};
    }
    PG_TRY(merge_symbols(e, s, (int32_t)n));
    return emit_symbols(e, s);
}

// Runs one regex over s[0 .. n) from `pos`: 1 with the match in md, 0 when
// there is none, negative on a matching failure.
static int regex_next(enc_state *e, pcre2_code *re, const char *s, size_t n, size_t pos) {
    for (;;) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, 0, e->md, e->mctx);
        if (rc > 0) return 1;
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !e->jit) {
            // Long runs can outgrow the 32 KiB default JIT stack; retry once
            // with a private one that may grow to 64 MiB.
            e->mctx = pcre2_match_context_create(NULL);
            e->jit = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
            if (!e->mctx || !e->jit) return pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
            pcre2_jit_stack_assign(e->mctx, NULL, e->jit);
            continue;
        }
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return pg_err_set(PG_EINVAL, "tokenizer: pre-tokenizer regex failed: %s", (const char *)msg);
    }
}

// Splits s[0 .. n) with stage `k` and hands every piece to the next stage;
// after the last stage, to BPE.
static int split_stage(enc_state *e, int k, const char *s, size_t n) {
    if (n == 0) return PG_OK;
    if (k == e->t->n_stages) return bpe_piece(e, s, n);
    pcre2_code *re = e->t->stages[k].re;
    size_t pos = 0, done = 0;
    while (pos < n) {
        int rc = regex_next(e, re, s, n, pos);
        if (rc < 0) return rc;
        if (rc == 0) break;
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) {  // an empty match makes no piece: step over one character
            int cl = ms < n ? pg_tok_utf8_next((const unsigned char *)s + ms, n - ms) : 1;
            pos = ms + (size_t)(cl > 0 ? cl : 1);
            continue;
        }
        if (ms > done) PG_TRY(split_stage(e, k + 1, s + done, ms - done));
        PG_TRY(split_stage(e, k + 1, s + ms, me - ms));
        pos = done = me;
    }
    if (done < n) PG_TRY(split_stage(e, k + 1, s + done, n - done));
    return PG_OK;
}

static int encode_bpe_text(enc_state *e, const char *s, size_t n) {
    if (n == 0) return PG_OK;
    if (e->t->prefix_space && s[0] != ' ') {
        char *copy = malloc(n + 1);
        if (!copy) return pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
        copy[0] = ' ';
        memcpy(copy + 1, s, n);
        int rc = split_stage(e, 0, copy, n + 1);
        free(copy);
        return rc;
    }
    return split_stage(e, 0, s, n);
}

// --- SPM --------------------------------------------------------------------

static int encode_spm_text(enc_state *e, const char *s, size_t n, bool prefix) {
    const pg_tokenizer *t = e->t;
    if (n == 0) return PG_OK;
    void *b = e->buf;
    PG_TRY(enc_grow(&b, &e->buf_cap, 3 * n + 3, 1));
    e->buf = b;
    char *x = e->buf;
    size_t m = 0;
    if (prefix) {
        memcpy(x, "\xe2\x96\x81", 3);
        m = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(x + m, "\xe2\x96\x81", 3);
            m += 3;
        } else {
            x[m++] = s[i];
        }
    }
    if (m > INT32_MAX) return pg_err_set(PG_EINVAL, "tokenizer: text too long");
    void *p = e->syms;
    PG_TRY(enc_grow(&p, &e->syms_cap, m, sizeof *e->syms));
    e->syms = p;
    // One symbol per character; an ill-formed byte is a symbol of its own.
    int32_t ns = 0;
    for (size_t i = 0; i < m;) {
        int k = pg_tok_utf8_next((const unsigned char *)x + i, m - i);
        if (k <= 0) k = 1;
        e->syms[ns] = (bpe_sym){.id = pg_tok_lookup(t, x + i, (size_t)k),
                                .prev = ns - 1,
                                .next = ns + 1,
                                .start = (uint32_t)i,
                                .len = (uint32_t)k};
        ns++;
        i += (size_t)k;
    }
    e->syms[ns - 1].next = -1;
    PG_TRY(merge_symbols(e, x, ns));
    return emit_symbols(e, x);
}

// --- encode -----------------------------------------------------------------

static bool ascii_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static int encode_fragment(enc_state *e, const char *s, size_t n, bool at_start) {
    const pg_tokenizer *t = e->t;
    if (t->kind == PG_TOK_SPM) {
        bool prefix = t->spm_prefix == PG_TOK_PREFIX_ALWAYS ||
                      (t->spm_prefix == PG_TOK_PREFIX_FIRST && at_start);
        return encode_spm_text(e, s, n, prefix);
    }
    return encode_bpe_text(e, s, n);
}

// The longest special token starting at text[pos], or -1.
static int32_t match_special(const enc_state *e, const char *text, size_t len, size_t pos) {
    const pg_tokenizer *t = e->t;
    unsigned char c = (unsigned char)text[pos];
    for (int32_t k = t->special_first[c]; k < t->special_first[c + 1]; k++) {
        int32_t id = t->special_ids[k];
        if (!e->parse_special && t->type[id] != PG_TOK_T_USER_DEFINED) continue;
        uint32_t n = t->text_len[id];
        if (n <= len - pos && memcmp(text + pos, t->text + t->text_off[id], n) == 0) return id;
    }
    return -1;
}

static int encode_all(enc_state *e, const char *text, size_t len, bool add_bos) {
    const pg_tokenizer *t = e->t;
    if (add_bos && t->bos >= 0) PG_TRY(emit(e, t->bos));
    size_t frag = 0, pos = 0;
    while (pos < len && t->n_special) {
        int32_t id = match_special(e, text, len, pos);
        if (id < 0) {
            pos++;
            continue;
        }
        size_t s = pos, end = pos + t->text_len[id];
        if (t->flags[id] & PG_TOK_F_LSTRIP)
            while (s > frag && ascii_space(text[s - 1])) s--;
        if (t->flags[id] & PG_TOK_F_RSTRIP)
            while (end < len && ascii_space(text[end])) end++;
        PG_TRY(encode_fragment(e, text + frag, s - frag, frag == 0));
        PG_TRY(emit(e, id));
        pos = frag = end;
    }
    return encode_fragment(e, text + frag, len - frag, frag == 0);
}

int pg_tokenizer_encode(const pg_tokenizer *t, const char *text, size_t len, bool add_bos,
                        bool parse_special, int32_t *ids, int cap) {
    if (!t || (!text && len) || cap < 0 || (cap > 0 && !ids))
        return pg_err_set(PG_EINVAL, "tokenizer: bad arguments to encode");
    if (len > (size_t)INT_MAX / 4)
        return pg_err_set(PG_EINVAL, "tokenizer: text of %zu bytes is too long", len);
    enc_state e = {.t = t, .parse_special = parse_special, .ids = ids, .cap = cap};
    int rc = PG_OK;
    if (t->n_stages) {
        e.md = pcre2_match_data_create(1, NULL);
        if (!e.md) rc = pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
    }
    if (rc == PG_OK) rc = encode_all(&e, text ? text : "", len, add_bos);
    pcre2_match_data_free(e.md);
    pcre2_match_context_free(e.mctx);
    pcre2_jit_stack_free(e.jit);
    free(e.syms);
    free(e.heap);
    free(e.buf);
    return rc < 0 ? rc : e.n;
}

int pg_tokenizer_encode_alloc(const pg_tokenizer *t, const char *text, size_t len, bool add_bos,
                              bool parse_special, int32_t **ids_out) {
    if (!ids_out) return pg_err_set(PG_EINVAL, "tokenizer: bad arguments to encode");
    *ids_out = NULL;
    // pg_tokenizer_encode refuses such a text; checked first so the guess
    // below cannot overflow.
    if (len > (size_t)INT_MAX / 4)
        return pg_err_set(PG_EINVAL, "tokenizer: text of %zu bytes is too long", len);
    // A token covers at least one byte of most texts; the slack is for BOS
    // and SPM's leading '▁'. A text that needs more takes a second pass at
    // the exact count.
    int cap = (int)len + 16;
    int32_t *ids = pg_xmalloc(sizeof *ids * (size_t)cap);
    int n = pg_tokenizer_encode(t, text, len, add_bos, parse_special, ids, cap);
    if (n > cap) {
        ids = pg_xrealloc(ids, sizeof *ids * (size_t)n);
        n = pg_tokenizer_encode(t, text, len, add_bos, parse_special, ids, n);
    }
    if (n < 0) {
        free(ids);
        return n;
    }
    *ids_out = ids;
    return n;
}

// --- queries ----------------------------------------------------------------

pg_tok_kind pg_tokenizer_kind(const pg_tokenizer *t) { return t->kind; }
int32_t pg_tokenizer_vocab_size(const pg_tokenizer *t) { return t->n_vocab; }
int32_t pg_tokenizer_bos(const pg_tokenizer *t) { return t->bos; }
int32_t pg_tokenizer_eos(const pg_tokenizer *t) { return t->eos; }
bool pg_tokenizer_add_bos(const pg_tokenizer *t) { return t->add_bos_default && t->bos >= 0; }
int32_t pg_tokenizer_max_token_bytes(const pg_tokenizer *t) { return t->max_dec_len; }
const char *pg_tokenizer_pre_name(const pg_tokenizer *t) { return t->pre_name; }

bool pg_tokenizer_is_special(const pg_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return false;
    return t->type[id] == PG_TOK_T_CONTROL || t->type[id] == PG_TOK_T_UNKNOWN;
}

int32_t pg_tokenizer_find(const pg_tokenizer *t, const char *piece) {
    if (!t || !piece) return -1;
    return pg_tok_lookup(t, piece, strlen(piece));
}

int pg_tokenizer_token_bytes(const pg_tokenizer *t, int32_t id, char *buf, int cap) {
    if (!t || id < 0 || id >= t->n_vocab)
        return pg_err_set(PG_EINVAL, "tokenizer: token id %d outside the vocabulary", (int)id);
    if (cap < 0 || (cap > 0 && !buf)) return pg_err_set(PG_EINVAL, "tokenizer: bad buffer");
    int n = (int)t->dec_len[id];
    if (n <= cap) memcpy(buf, t->dec + t->dec_off[id], (size_t)n);
    return n;
}

// --- decoding -----------------------------------------------------------------

void pg_detok_init(pg_detok *d, const pg_tokenizer *t, bool skip_special) {
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->skip_special = skip_special;
    d->first = t && t->kind == PG_TOK_SPM && t->spm_prefix != PG_TOK_PREFIX_NEVER;
}

static const char REPLACEMENT[3] = {'\xef', '\xbf', '\xbd'};  // U+FFFD

// Output writer that fails instead of overflowing `cap` (room for the NUL).
typedef struct {
    char *out;
    size_t cap, w;
    bool full;
} writer;

static void put(writer *o, const void *p, size_t n) {
    if (o->full || o->w + n + 1 > o->cap) {
        o->full = true;
        return;
    }
    memcpy(o->out + o->w, p, n);
    o->w += n;
}

int pg_detok_feed(pg_detok *d, int32_t id, char *out, int cap) {
    if (!d || !d->tok || !out || cap <= 0) return pg_err_set(PG_EINVAL, "detok: bad arguments");
    const pg_tokenizer *t = d->tok;
    out[0] = '\0';
    if (id < 0 || id >= t->n_vocab)
        return pg_err_set(PG_EINVAL, "detok: token id %d outside the vocabulary", (int)id);
    if (d->skip_special && pg_tokenizer_is_special(t, id)) return 0;
    const unsigned char *src = (const unsigned char *)t->dec + t->dec_off[id];
    size_t n = t->dec_len[id];
    pg_detok saved = *d;
    if (d->first && n > 0) {
        // SPM: the space the encoder put in front of the text is not output.
        int type = t->type[id];
        if (src[0] == ' ' && type != PG_TOK_T_CONTROL && type != PG_TOK_T_UNKNOWN) {
            src++;
            n--;
        }
        d->first = false;
    }
    writer o = {out, (size_t)cap, 0, false};
    size_t i = 0;
    if (d->n_pending) {
        // Complete (or reject) the held-back character with the new bytes.
        unsigned char tmp[8];
        size_t np = (size_t)d->n_pending, take = n < 4 - np ? n : 4 - np;
        memcpy(tmp, d->pending, np);
        memcpy(tmp + np, src, take);
        int k = pg_tok_utf8_next(tmp, np + take);
        if (k == 0) {  // still incomplete: all of src was taken
            memcpy(d->pending, tmp, np + take);
            d->n_pending = (int)(np + take);
            return 0;
        }
        d->n_pending = 0;
        if (k > 0) {
            put(&o, tmp, (size_t)k);
            i = (size_t)k - np;
        } else {  // the held bytes are a maximal ill-formed subpart; src restarts
            put(&o, REPLACEMENT, 3);
        }
    }
    while (i < n && !o.full) {
        if (src[i] < 0x80) {
            size_t j = i;
            while (j < n && src[j] < 0x80) j++;
            put(&o, src + i, j - i);
            i = j;
            continue;
        }
        int k = pg_tok_utf8_next(src + i, n - i);
        if (k > 0) {
            put(&o, src + i, (size_t)k);
            i += (size_t)k;
        } else if (k == 0) {
            memcpy(d->pending, src + i, n - i);
            d->n_pending = (int)(n - i);
            break;
        } else {
            put(&o, REPLACEMENT, 3);
            i += (size_t)-k;
        }
    }
    if (o.full) {
        *d = saved;
        out[0] = '\0';
        return pg_err_set(PG_ENOSPC, "detok: output buffer of %d bytes too small", cap);
    }
    out[o.w] = '\0';
    return (int)o.w;
}

int pg_detok_flush(pg_detok *d, char *out, int cap) {
    if (!d || !out || cap <= 0) return pg_err_set(PG_EINVAL, "detok: bad arguments");
    out[0] = '\0';
    if (!d->n_pending) return 0;
    if (cap < 4) return pg_err_set(PG_ENOSPC, "detok: output buffer of %d bytes too small", cap);
    memcpy(out, REPLACEMENT, 3);
    out[3] = '\0';
    d->n_pending = 0;
    return 3;
}

int pg_tokenizer_decode(const pg_tokenizer *t, const int32_t *ids, int n, bool skip_special,
                        char **out) {
    if (!out) return pg_err_set(PG_EINVAL, "tokenizer: bad arguments to decode");
    *out = NULL;
    if (!t || n < 0 || (n > 0 && !ids)) return pg_err_set(PG_EINVAL, "tokenizer: bad arguments to decode");
    pg_detok d;
    pg_detok_init(&d, t, skip_special);
    size_t cap = 256, w = 0;
    char *buf = malloc(cap);
    if (!buf) return pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
    for (int i = 0; i <= n; i++) {
        // Worst case for one token: every byte (and the 3 held ones) as U+FFFD.
        size_t need = i < n && ids[i] >= 0 && ids[i] < t->n_vocab ? t->dec_len[ids[i]] : 0;
        need = 3 * (need + 4) + 1;
        if (cap - w < need) {
            while (cap - w < need) cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                return pg_err_set(PG_ENOMEM, "tokenizer: out of memory");
            }
            buf = nb;
        }
        size_t room = cap - w > INT_MAX ? INT_MAX : cap - w;
        int r = i < n ? pg_detok_feed(&d, ids[i], buf + w, (int)room)
                      : pg_detok_flush(&d, buf + w, (int)room);
        if (r < 0) {
            free(buf);
            return r;
        }
        w += (size_t)r;
    }
    buf[w] = '\0';
    *out = buf;
    return PG_OK;
}
