// engine/dist/plan_wire.c - step plans as bytes (engine/dist/plan_wire.h).
//
// Layout: the plan's counts, then per sequence its fixed fields, its
// sampling parameters (the struct, then the logit-bias arrays it points
// to), its tokens, block table and history; then the block moves; then
// the mask words and the masks (a count per sequence, 0 or its rows, then the words). Decoding measures the
// arrays first and makes one allocation for all of them.
#include "engine/dist/plan_wire.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

void pg_wbuf_put(pg_wbuf *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        b->data = pg_xrealloc(b->data, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
}

void pg_wbuf_free(pg_wbuf *b) {
    free(b->data);
    *b = (pg_wbuf){0};
}

static void put_i32(pg_wbuf *b, int32_t v) { pg_wbuf_put(b, &v, sizeof v); }

void pg_plan_encode(pg_wbuf *b, const pg_batch_plan *p) {
    put_i32(b, p->n_seqs);
    put_i32(b, p->n_tokens);
    const int32_t groups = p->kv_groups > 1 ? p->kv_groups : 1;
    put_i32(b, groups);
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const pg_plan_seq *s = &p->seqs[i];
        pg_plan_seq fixed = *s;
        fixed.tokens = fixed.block_table = fixed.history = NULL;
        fixed.sp = NULL;
        fixed.mask = NULL;
        pg_wbuf_put(b, &fixed, sizeof fixed);
        const bool has_sp = s->sp != NULL;
        put_i32(b, has_sp);
        if (has_sp) {
            pg_sampling_params sp = *s->sp;
            sp.bias_ids = NULL;
            sp.bias_values = NULL;
            pg_wbuf_put(b, &sp, sizeof sp);
            pg_wbuf_put(b, s->sp->bias_ids, sizeof(int32_t) * (size_t)s->sp->n_logit_bias);
            pg_wbuf_put(b, s->sp->bias_values, sizeof(float) * (size_t)s->sp->n_logit_bias);
        }
        pg_wbuf_put(b, s->tokens, sizeof(int32_t) * (size_t)s->n_tokens);
        pg_wbuf_put(b, s->block_table, sizeof(int32_t) * (size_t)s->n_blocks * (size_t)groups);
        pg_wbuf_put(b, s->history, sizeof(int32_t) * (size_t)(s->history ? s->n_history : 0));
        put_i32(b, s->history != NULL);
    }
    put_i32(b, p->n_swap_out);
    put_i32(b, p->n_swap_in);
    put_i32(b, p->n_copies);
    put_i32(b, p->n_swap_out_ahead);
    pg_wbuf_put(b, p->swap_out, sizeof(pg_block_move) * (size_t)p->n_swap_out);
    pg_wbuf_put(b, p->swap_in, sizeof(pg_block_move) * (size_t)p->n_swap_in);
    pg_wbuf_put(b, p->copies, sizeof(pg_block_move) * (size_t)p->n_copies);
    put_i32(b, p->mask_words);
    for (int32_t i = 0; i < p->n_seqs && p->mask_words > 0; i++) {
        // Its masks' count (0: none; a draft's entry has one per row,
        // pg_plan_seq.mask), then the masks.
        const uint32_t *m = p->seqs[i].mask;
        const int32_t rows = m ? p->seqs[i].n_draft + 1 : 0;
        put_i32(b, rows);
        if (m) pg_wbuf_put(b, m, sizeof(uint32_t) * (size_t)p->mask_words * (size_t)rows);
    }
}

// A reader over the bytes; `bad` once anything ran past the end.
typedef struct {
    const uint8_t *p, *end;
    bool bad;
} reader;

static const void *take(reader *r, size_t n) {
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = true;
        return NULL;
    }
    const void *q = r->p;
    r->p += n;
    return q;
}

static int32_t get_i32(reader *r) {
    const void *q = take(r, sizeof(int32_t));
    int32_t v = 0;
    if (q) memcpy(&v, q, sizeof v);
    return v;
}

// Copies n bytes into the arena at *off (when arena is non-NULL) and
// returns where they went; always advances the reader and *off.
static void *copy_out(reader *r, size_t n, char *arena, size_t *off) {
    const void *q = take(r, n);
    size_t at = (*off + 15) & ~(size_t)15;
    *off = at + n;
    if (!arena || !q) return NULL;
    if (n) memcpy(arena + at, q, n);
    return arena + at;
}

// One pass over the bytes: with arena NULL it only measures (*size), else it
// fills `out`.
static int decode_pass(const uint8_t *data, size_t len, char *arena, size_t *size, pg_plan_decoded *out) {
    reader r = {data, data + len, false};
    size_t off = 0;
    const int32_t n_seqs = get_i32(&r), n_tokens = get_i32(&r);
    if (n_seqs < 0 || n_seqs > (1 << 20)) return pg_err_set(PG_EFORMAT, "plan: %d sequences", n_seqs);
    const int32_t groups = get_i32(&r);
    if (groups < 1 || groups > 64) return pg_err_set(PG_EFORMAT, "plan: %d KV groups", groups);
    size_t seqs_at = (off + 15) & ~(size_t)15;
    off = seqs_at + sizeof(pg_plan_seq) * (size_t)n_seqs;
    size_t sps_at = (off + 15) & ~(size_t)15;
    off = sps_at + sizeof(pg_sampling_params) * (size_t)n_seqs;
    pg_plan_seq *seqs = arena ? (pg_plan_seq *)(arena + seqs_at) : NULL;
    pg_sampling_params *sps = arena ? (pg_sampling_params *)(arena + sps_at) : NULL;
    for (int32_t i = 0; i < n_seqs && !r.bad; i++) {
        const void *q = take(&r, sizeof(pg_plan_seq));
        pg_plan_seq s;
        if (q) memcpy(&s, q, sizeof s);
        else break;
        if (s.n_tokens < 0 || s.n_blocks < 0 || s.n_history < 0) return pg_err_set(PG_EFORMAT, "plan: bad counts");
        if (get_i32(&r)) {
            const void *sq = take(&r, sizeof(pg_sampling_params));
            if (!sq) break;
            pg_sampling_params sp;
            memcpy(&sp, sq, sizeof sp);
            if (sp.n_logit_bias < 0 || sp.n_logit_bias > PG_MAX_LOGIT_BIAS)
                return pg_err_set(PG_EFORMAT, "plan: %d logit biases", sp.n_logit_bias);
            sp.bias_ids = copy_out(&r, sizeof(int32_t) * (size_t)sp.n_logit_bias, arena, &off);
            sp.bias_values = copy_out(&r, sizeof(float) * (size_t)sp.n_logit_bias, arena, &off);
            if (sps) sps[i] = sp;
            s.sp = sps ? &sps[i] : NULL;
        } else {
            s.sp = NULL;
        }
        s.tokens = copy_out(&r, sizeof(int32_t) * (size_t)s.n_tokens, arena, &off);
        s.block_table = copy_out(&r, sizeof(int32_t) * (size_t)s.n_blocks * (size_t)groups, arena, &off);
        const int32_t *hist = copy_out(&r, sizeof(int32_t) * (size_t)s.n_history, arena, &off);
        s.history = get_i32(&r) ? hist : NULL;
        if (seqs) seqs[i] = s;
    }
    const int32_t n_out = get_i32(&r), n_in = get_i32(&r), n_cp = get_i32(&r), n_ahead = get_i32(&r);
    if (n_out < 0 || n_in < 0 || n_cp < 0 || n_ahead < 0 || n_ahead > n_out)
        return pg_err_set(PG_EFORMAT, "plan: bad move counts");
    const pg_block_move *so = copy_out(&r, sizeof(pg_block_move) * (size_t)n_out, arena, &off);
    const pg_block_move *si = copy_out(&r, sizeof(pg_block_move) * (size_t)n_in, arena, &off);
    const pg_block_move *cp = copy_out(&r, sizeof(pg_block_move) * (size_t)n_cp, arena, &off);
    const int32_t words = get_i32(&r);
    if (words < 0 || words > (1 << 20)) return pg_err_set(PG_EFORMAT, "plan: %d mask words", words);
    for (int32_t i = 0; i < n_seqs && words > 0 && !r.bad; i++) {
        const int32_t rows = get_i32(&r);
        if (rows < 0 || rows > PG_MAX_DRAFT + 1) return pg_err_set(PG_EFORMAT, "plan: %d masks for a sequence", rows);
        const uint32_t *m = rows ? copy_out(&r, sizeof(uint32_t) * (size_t)words * (size_t)rows, arena, &off) : NULL;
        if (seqs) seqs[i].mask = m;
    }
    if (r.bad || r.p != r.end) return pg_err_set(PG_EFORMAT, "plan: %zu bytes are not one plan", len);
    *size = off;
    if (out) {
        out->plan = (pg_batch_plan){.n_seqs = n_seqs, .seqs = seqs, .n_tokens = n_tokens,
                                    .n_swap_out = n_out, .n_swap_in = n_in, .n_copies = n_cp,
                                    .n_swap_out_ahead = n_ahead,
                                    .swap_out = so, .swap_in = si, .copies = cp, .mask_words = words,
                                    .kv_groups = groups};
    }
    return 0;
}

int pg_plan_decode(const uint8_t *data, size_t len, pg_plan_decoded *out) {
    memset(out, 0, sizeof *out);
    size_t size = 0;
    PG_TRY(decode_pass(data, len, NULL, &size, NULL));
    out->mem = pg_xmalloc(size ? size : 1);
    int rc = decode_pass(data, len, out->mem, &size, out);
    if (rc < 0) pg_plan_decoded_free(out);
    return rc;
}

void pg_plan_decoded_free(pg_plan_decoded *d) {
    free(d->mem);
    memset(d, 0, sizeof *d);
}
