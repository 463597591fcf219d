// engine/draft_model.c - the draft-model proposer (engine/draft_model.h): the
// draft's own runner and prefix-cached KV pool, one sequence at a time.
#include "engine/draft_model.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/runner/runner.h"
#include "kvpool/kvpool.h"

struct pg_draft {
    pg_model *model;
    pg_runner *runner;
    kvp_pool *pool;
    int32_t k, bs, chunk, max_len;
    int32_t *buf;          // [max_len + k] the history, then the drafts
    kvp_moves copies;      // kvp_grow's copy-on-write moves (none for a fresh table)
    pg_block_move *mv;     // [cap] the same as plan moves
    int32_t mv_cap;
    pg_sampling_params sp; // greedy, no logprobs
    int64_t proposals, positions;
    bool warned;
};

pg_runner_config pg_draft_runner_config(const pg_draft_config *c) {
    const int32_t bs = c->block_size > 0 ? c->block_size : 16;
    // One sequence a step: prefill chunks of this many tokens bound the
    // draft's workspace (its longest step).
    const int32_t chunk = c->max_model_len < 256 ? c->max_model_len : 256;
    return (pg_runner_config){.block_size = bs, .max_num_seqs = 1, .max_num_batched_tokens = chunk,
                              .max_model_len = c->max_model_len, .kv_dtype = c->kv_dtype,
                              .kv_scales = PG_KV_SCALES_ONE, .graphs = PG_GRAPHS_OFF};
}

int32_t pg_draft_kv_blocks(const pg_draft_config *c) {
    const int32_t bs = c->block_size > 0 ? c->block_size : 16;
    int64_t tokens = c->kv_tokens > 0 ? c->kv_tokens : 2 * (int64_t)c->max_model_len;
    if (tokens < 4096 && c->kv_tokens <= 0) tokens = 4096;
    if (tokens < (int64_t)c->max_model_len + c->k) tokens = (int64_t)c->max_model_len + c->k;
    const int64_t blocks = (tokens + bs - 1) / bs + 1;
    return blocks > INT32_MAX ? INT32_MAX : (int32_t)blocks;
}

int pg_draft_create(const pg_draft_config *c, pg_backend *be, pg_draft **out) {
    *out = NULL;
    PG_ARG(c->model_path && c->k >= 1 && c->k <= PG_MAX_DRAFT && c->max_model_len > 0,
           "draft model: a path, 1 .. %d tokens and a model length are needed", PG_MAX_DRAFT);
    pg_draft *d = pg_xcalloc(1, sizeof *d);
    const pg_runner_config rc_cfg = pg_draft_runner_config(c);
    d->k = c->k;
    d->bs = rc_cfg.block_size;
    d->max_len = c->max_model_len;
    d->chunk = rc_cfg.max_num_batched_tokens;
    int rc = 0;
    const pg_model_load_opts mo = {.path = c->model_path};
    if ((rc = pg_model_load(&mo, be, &d->model)) < 0) {
        pg_err_wrap(rc, "draft model %s: ", c->model_path);
        goto fail;
    }
    if (d->model->cfg.vocab_size != c->vocab_size) {
        rc = pg_err_set(PG_EINVAL, "draft model %s: vocabulary of %d tokens, the target's has %d", c->model_path,
                        d->model->cfg.vocab_size, c->vocab_size);
        goto fail;
    }
    if ((rc = pg_runner_create(d->model, &rc_cfg, &d->runner)) < 0) goto fail;
    const int32_t blocks = pg_draft_kv_blocks(c);
    if ((rc = pg_runner_alloc_kv(d->runner, blocks, 0)) < 0) goto fail;
    kvp_config kc;
    kvp_config_default(&kc);
    kc.num_blocks = blocks;
    kc.block_size = d->bs;
    if ((rc = kvp_create(&kc, &d->pool)) < 0) goto fail;
    d->buf = pg_xmalloc(sizeof(int32_t) * ((size_t)d->max_len + (size_t)d->k));
    pg_sampling_params_default(&d->sp);
    d->sp.temperature = 0.0f;
    d->sp.max_tokens = d->k;
    *out = d;
    return 0;
fail:
    pg_draft_free(d);
    return rc;
}

void pg_draft_free(pg_draft *d) {
    if (!d) return;
    pg_runner_free(d->runner);
    kvp_destroy(d->pool);
    pg_model_free(d->model);
    kvp_moves_fini(&d->copies);
    free(d->mv);
    free(d->buf);
    free(d);
}

void pg_draft_counts(const pg_draft *d, int64_t *proposals, int64_t *positions) {
    *proposals = d->proposals;
    *positions = d->positions;
}

// Runs positions [start, start + m) of the table's sequence (the tokens
// buf[start ..]); with `sample`, the greedy token after the last into *tok.
static int run(pg_draft *d, const kvp_table *t, int32_t start, int32_t m, bool sample, int32_t *tok) {
    if (d->copies.n > d->mv_cap) {
        d->mv_cap = d->copies.n;
        d->mv = pg_xrealloc(d->mv, sizeof(pg_block_move) * (size_t)d->mv_cap);
    }
    for (int32_t i = 0; i < d->copies.n; i++) d->mv[i] = (pg_block_move){d->copies.v[i].from, d->copies.v[i].to};
    pg_plan_seq s = {.seq_id = 0, .tokens = d->buf + start, .n_tokens = m, .start_pos = start,
                     .block_table = t->blocks, .n_blocks = t->n_blocks, .sample = sample, .sp = &d->sp,
                     .history = d->buf, .n_history = start + m, .n_prompt = start + m, .eos_id = -1};
    pg_batch_plan p = {.n_seqs = 1, .seqs = &s, .n_tokens = m, .n_copies = d->copies.n, .copies = d->mv,
                       .kv_groups = 1};
    d->copies.n = 0;
    pg_step_output o;
    PG_TRY(pg_runner_execute(d->runner, &p, &o));
    d->positions += m;
    if (sample) {
        PG_ARG(o.n == 1, "draft step: %d outputs", o.n);
        *tok = o.outs[0].token;
    }
    return 0;
}

int32_t pg_draft_propose(pg_draft *d, const int32_t *history, int32_t n, int32_t limit, int32_t *out) {
    if (limit > d->k) limit = d->k;
    if (limit > d->max_len - n) limit = d->max_len - n;
    if (limit <= 0 || n <= 0) return 0;
    memcpy(d->buf, history, sizeof(int32_t) * (size_t)n);
    kvp_table t;
    kvp_table_init(&t);
    // What an earlier proposal left in the cache (at least the last token
    // is computed again: its logits are the first draft's).
    const int32_t hits = kvp_table_lookup(d->pool, &t, d->buf, n);
    kvp_grow_item it = {&t, hits, n - hits * d->bs};
    int32_t got = 0, rc = kvp_grow(d->pool, &it, 1, &d->copies);
    for (int32_t pos = hits * d->bs; rc == 0 && pos < n;) {
        const int32_t m = n - pos < d->chunk ? n - pos : d->chunk;
        rc = run(d, &t, pos, m, pos + m == n, &d->buf[n]);
        pos += m;
    }
    if (rc == 0) got = 1;
    // The rest one at a time, each after the one before (the last drafted
    // token is never run: its KV is not needed).
    while (rc == 0 && got < limit) {
        it = (kvp_grow_item){&t, 0, 1};
        if ((rc = kvp_grow(d->pool, &it, 1, &d->copies)) < 0) break;
        if ((rc = run(d, &t, n + got - 1, 1, true, &d->buf[n + got])) == 0) got++;
    }
    if (rc < 0 && rc != PG_ENOSPC && !d->warned) {
        PG_LOGW("draft model: a proposal failed (%s); proposals stop where they fail", pg_err_msg());
        d->warned = true;
    }
    // Every full block computed stays findable for the next proposal.
    const int32_t computed = rc == 0 || got > 0 ? n + got - 1 : 0;
    if (computed > 0) kvp_table_commit(d->pool, &t, d->buf, computed < t.n_tokens ? computed : t.n_tokens);
    kvp_table_release(d->pool, &t);
    kvp_table_fini(&t);
    if (got == 0) return 0;
    memcpy(out, d->buf + n, sizeof(int32_t) * (size_t)got);
    d->proposals++;
    return got;
}
