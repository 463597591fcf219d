// engine/runner.c - batch plan -> block moves, one forward, sampling.
#include "engine/runner.h"

#include <string.h>

#include "common/err.h"
#include "engine/sampler.h"

struct pg_runner {
    const pg_llama *model;
    pg_backend *be;
    pg_runner_config cfg;
    pg_kv_cache *kv;        // device cache
    pg_kv_cache *host_kv;   // swap space (NULL when n_host_blocks = 0)
    pg_fwd_workspace ws;
    pg_sampler *sampler;
    // Per-step buffers, grown on demand.
    int32_t cap_tokens, cap_seqs;
    int32_t *tokens, *pos, *slots, *logit_rows, *logit_seq;
    pg_attn_seq *seqs;
    float *logits;          // [cap_seqs][vocab]
    // This step's outputs and the previous step's (a step's PG_TOKEN_PENDING
    // inputs come from the previous step's outputs).
    pg_seq_output *outs, *prev_outs; // [cap_seqs] each
    int32_t n_outs, n_prev;
};

const float *pg_runner_last_logits(const pg_runner *r) { return r->logits; }

size_t pg_runner_kv_bytes_per_block(const pg_llama *model, int32_t block_size) {
    return pg_kv_cache_bytes_per_block(&model->cfg, block_size);
}

int pg_runner_create(const pg_llama *model, pg_backend *be, const pg_runner_config *cfg,
                     pg_runner **out) {
    *out = NULL;
    pg_runner *r = pg_xcalloc(1, sizeof *r);
    r->model = model;
    r->be = be;
    r->cfg = *cfg;
    int rc = pg_kv_cache_create(&model->cfg, cfg->n_blocks, cfg->block_size, &r->kv);
    if (rc == 0 && cfg->n_host_blocks > 0)
        rc = pg_kv_cache_create(&model->cfg, cfg->n_host_blocks, cfg->block_size, &r->host_kv);
    if (rc == 0) rc = pg_sampler_create(model->cfg.vocab_size, &r->sampler);
    if (rc < 0) {
        pg_runner_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

void pg_runner_free(pg_runner *r) {
    if (!r) return;
    pg_kv_cache_free(r->kv);
    pg_kv_cache_free(r->host_kv);
    pg_fwd_workspace_free(&r->ws);
    pg_sampler_free(r->sampler);
    free(r->tokens);
    free(r->pos);
    free(r->slots);
    free(r->logit_rows);
    free(r->logit_seq);
    free(r->seqs);
    free(r->logits);
    free(r->outs);
    free(r->prev_outs);
    free(r);
}

size_t pg_runner_workspace_bytes(const pg_runner *r) {
    const pg_model_config *c = &r->model->cfg;
    const size_t T = (size_t)r->ws.cap_tokens, hd = (size_t)c->head_dim;
    size_t f = T * (2 * (size_t)c->hidden + 2 * (size_t)(c->n_heads + 2 * c->n_kv_heads) * hd +
                    3 * (size_t)c->ffn); // x, xn, qkv, q|k|v, gate_up, h (engine/llama.c)
    f += (size_t)r->ws.cap_logits * (size_t)c->hidden + (size_t)r->cap_seqs * (size_t)c->vocab_size;
    return f * sizeof(float) + (size_t)r->cap_tokens * 3 * sizeof(int32_t);
}

static void reserve(pg_runner *r, int32_t n_tokens, int32_t n_seqs) {
    if (n_tokens > r->cap_tokens) {
        size_t n = (size_t)n_tokens;
        r->tokens = pg_xrealloc(r->tokens, n * sizeof(int32_t));
        r->pos = pg_xrealloc(r->pos, n * sizeof(int32_t));
        r->slots = pg_xrealloc(r->slots, n * sizeof(int32_t));
        r->cap_tokens = n_tokens;
    }
    if (n_seqs > r->cap_seqs) {
        size_t n = (size_t)n_seqs;
        r->seqs = pg_xrealloc(r->seqs, n * sizeof(pg_attn_seq));
        r->logit_rows = pg_xrealloc(r->logit_rows, n * sizeof(int32_t));
        r->logit_seq = pg_xrealloc(r->logit_seq, n * sizeof(int32_t));
        r->outs = pg_xrealloc(r->outs, n * sizeof(pg_seq_output));
        r->prev_outs = pg_xrealloc(r->prev_outs, n * sizeof(pg_seq_output));
        free(r->logits);
        r->logits = pg_xmalloc(n * (size_t)r->model->cfg.vocab_size * sizeof(float));
        r->cap_seqs = n_seqs;
    }
}

// Copies whole blocks between two caches of the same shape (swap).
static void move_blocks(pg_kv_cache *dst, pg_kv_cache *src, const pg_block_move *mv, int32_t n) {
    size_t block = (size_t)src->shape.block_size * (size_t)src->shape.n_kv_heads *
                   (size_t)src->shape.head_dim;
    for (int32_t l = 0; l < src->n_layers; l++)
        for (int32_t i = 0; i < n; i++) {
            memcpy(dst->k[l] + (size_t)mv[i].to * block, src->k[l] + (size_t)mv[i].from * block,
                   block * sizeof(float));
            memcpy(dst->v[l] + (size_t)mv[i].to * block, src->v[l] + (size_t)mv[i].from * block,
                   block * sizeof(float));
        }
}

static int do_moves(pg_runner *r, const pg_batch_plan *p) {
    int32_t nd = r->cfg.n_blocks, nh = r->cfg.n_host_blocks;
    if ((p->n_swap_out || p->n_swap_in) && !r->host_kv)
        return pg_err_set(PG_EINVAL, "plan: swap requested but there is no swap space");
    PG_TRY(pg_block_moves_check(p->swap_out, p->n_swap_out, nd, nh, "swap-out"));
    PG_TRY(pg_block_moves_check(p->swap_in, p->n_swap_in, nh, nd, "swap-in"));
    PG_TRY(pg_block_moves_check(p->copies, p->n_copies, nd, nd, "copy"));
    if (p->n_swap_out) move_blocks(r->host_kv, r->kv, p->swap_out, p->n_swap_out);
    if (p->n_swap_in) move_blocks(r->kv, r->host_kv, p->swap_in, p->n_swap_in);
    for (int32_t i = 0; i < p->n_copies; i++) {
        int32_t from = p->copies[i].from, to = p->copies[i].to;
        for (int32_t l = 0; l < r->kv->n_layers; l++)
            r->be->copy_blocks(r->be, r->kv->k[l], r->kv->v[l], r->kv->shape, &from, &to, 1);
    }
    return 0;
}

// The token `seq_id` sampled in the previous step, or -1.
static int32_t prev_token(const pg_runner *r, int64_t seq_id) {
    for (int32_t i = 0; i < r->n_prev; i++)
        if (r->prev_outs[i].seq_id == seq_id) return r->prev_outs[i].token;
    return -1;
}

int pg_runner_execute(pg_runner *r, const pg_batch_plan *p, pg_step_output *out) {
    // The last step's outputs are kept for this step's pending tokens.
    pg_seq_output *swap = r->prev_outs;
    r->prev_outs = r->outs;
    r->outs = swap;
    r->n_prev = r->n_outs;
    r->n_outs = 0;
    out->n = 0;
    out->outs = r->outs;
    PG_TRY(do_moves(r, p));
    int32_t n_tokens = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) n_tokens += p->seqs[i].n_tokens;
    if (n_tokens == 0) return 0;
    reserve(r, n_tokens, p->n_seqs);
    const int32_t bs = r->cfg.block_size;
    int32_t row = 0, n_logits = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const pg_plan_seq *s = &p->seqs[i];
        int32_t ctx = s->start_pos + s->n_tokens;
        if (s->n_tokens <= 0 || s->start_pos < 0 || (int64_t)s->n_blocks * bs < ctx)
            return pg_err_set(PG_EINVAL, "plan: sequence %lld has %d blocks for %d positions",
                              (long long)s->seq_id, s->n_blocks, ctx);
        for (int32_t b = 0; b < (ctx + bs - 1) / bs; b++)
            if (s->block_table[b] <= 0 || s->block_table[b] >= r->cfg.n_blocks)
                return pg_err_set(PG_EINVAL, "plan: block id %d out of range", s->block_table[b]);
        r->seqs[i] = (pg_attn_seq){row, s->n_tokens, s->start_pos, s->block_table};
        for (int32_t t = 0; t < s->n_tokens; t++, row++) {
            int32_t pos = s->start_pos + t, tok = s->tokens[t];
            if (tok == PG_TOKEN_PENDING && s->n_tokens == 1 && (tok = prev_token(r, s->seq_id)) < 0)
                return pg_err_set(PG_EINVAL,
                                  "plan: sequence %lld has a pending token but did not sample in "
                                  "the previous step",
                                  (long long)s->seq_id);
            r->tokens[row] = tok;
            r->pos[row] = pos;
            r->slots[row] = s->block_table[pos / bs] * bs + pos % bs;
        }
        if (s->sample) {
            r->logit_rows[n_logits] = row - 1;
            r->logit_seq[n_logits++] = i;
        }
    }
    pg_fwd_batch fb = {n_tokens, r->tokens, r->pos, r->slots, p->n_seqs, r->seqs, n_logits, r->logit_rows};
    PG_TRY(pg_llama_forward(r->model, r->be, r->kv, &r->ws, &fb, r->logits));
    const int64_t vocab = r->model->cfg.vocab_size;
    for (int32_t i = 0; i < n_logits; i++)
        pg_sampler_sample(r->sampler, &p->seqs[r->logit_seq[i]], r->logits + i * vocab, &r->outs[i]);
    out->n = r->n_outs = n_logits;
    out->outs = r->outs; // after reserve(), which may have moved it
    return 0;
}
