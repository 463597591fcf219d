// engine/draft_model.c - the draft-model proposer (engine/draft_model.h): the
// draft's own runner and prefix-cached KV pool; every sequence of a
// scheduler step in the same runner steps (catch-up prefills together,
// then one decode step per draft position for all).
#include "engine/draft_model.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/draft_replay.h"
#include "engine/runner/runner.h"
#include "kvpool/kvpool.h"
#include "scheduler/sched.h"

// One sequence of a batch being proposed for: its history and drafts
// (buf), its table (the draft's KV), its limit and what it has so far;
// pos: the next position to compute (prefill), < 0 once out (no blocks, a
// failed step).
typedef struct dseq {
    int32_t *buf;
    kvp_table *t;
    int32_t n, limit, got, pos;
} dseq;

struct pg_draft {
    pg_model *model;
    pg_runner *runner;
    kvp_pool *pool;
    int32_t k, bs, chunk, max_len, max_seqs;
    int32_t *buf;          // [max_seqs][max_len + k] each sequence's history, then its drafts
    kvp_table *tabs;       // [max_seqs] their tables while a batch is proposed
    pg_plan_seq *ps;       // [max_seqs] a runner step's entries
    dseq *q;               // [max_seqs] the sequences of the group being proposed for
    kvp_moves copies;      // kvp_grow's copy-on-write moves (none for a fresh table)
    pg_block_move *mv;     // [cap] the same as plan moves
    int32_t mv_cap;
    pg_sampling_params sp; // greedy, no logprobs
    int64_t proposals, positions, steps;
    bool warned;
    pg_replay *replay;     // the replay draft's recording, or NULL
};

// Sequences in one draft step: the scheduler's speculation backoff (no
// more sequences than that speculate), at most a step's tokens.
static int32_t draft_max_seqs(const pg_draft_config *c, int32_t chunk) {
    int32_t m = c->max_seqs > 0 ? c->max_seqs : SCHED_SPEC_DEFAULT_MAX_SEQS;
    return m < chunk ? m : chunk;
}

pg_runner_config pg_draft_runner_config(const pg_draft_config *c) {
    const int32_t bs = c->block_size > 0 ? c->block_size : 16;
    // Prefill chunks of this many tokens (all the sequences' together)
    // bound the draft's workspace (its longest step).
    const int32_t chunk = c->max_model_len < 256 ? c->max_model_len : 256;
    return (pg_runner_config){.block_size = bs, .max_num_seqs = draft_max_seqs(c, chunk),
                              .max_num_batched_tokens = chunk,
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
    d->max_seqs = rc_cfg.max_num_seqs;
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
    const pg_replay_config rp = {.path = c->replay_path, .error_rate = c->replay_error_rate,
                                 .seed = c->replay_seed, .vocab_size = c->vocab_size};
    if (c->replay_path && c->replay_path[0] && (rc = pg_replay_load(&rp, &d->replay)) < 0) goto fail;
    if ((rc = pg_runner_create(d->model, &rc_cfg, &d->runner)) < 0) goto fail;
    const int32_t blocks = pg_draft_kv_blocks(c);
    if ((rc = pg_runner_alloc_kv(d->runner, blocks, 0)) < 0) goto fail;
    kvp_config kc;
    kvp_config_default(&kc);
    kc.num_blocks = blocks;
    kc.block_size = d->bs;
    if ((rc = kvp_create(&kc, &d->pool)) < 0) goto fail;
    d->buf = pg_xmalloc(sizeof(int32_t) * (size_t)d->max_seqs * ((size_t)d->max_len + (size_t)d->k));
    d->tabs = pg_xcalloc((size_t)d->max_seqs, sizeof(kvp_table));
    d->ps = pg_xcalloc((size_t)d->max_seqs, sizeof(pg_plan_seq));
    d->q = pg_xcalloc((size_t)d->max_seqs, sizeof(dseq));
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
    pg_replay_free(d->replay);
    kvp_moves_fini(&d->copies);
    free(d->mv);
    free(d->buf);
    free(d->tabs);
    free(d->ps);
    free(d->q);
    free(d);
}

void pg_draft_counts(const pg_draft *d, int64_t *proposals, int64_t *positions, int64_t *steps) {
    *proposals = d->proposals;
    *positions = d->positions;
    *steps = d->steps;
}

pg_replay *pg_draft_replay(pg_draft *d) {
    return d->replay;
}


// Runs the entries d->ps[0 .. m) of `tokens` tokens in one step, the
// copy-on-write moves so far first; the sampled ones' greedy tokens into
// their sequence's buf (seq_id: the index in q), got + 1.
static int run(pg_draft *d, dseq *q, int32_t m, int32_t tokens) {
    if (d->copies.n > d->mv_cap) {
        d->mv_cap = d->copies.n;
        d->mv = pg_xrealloc(d->mv, sizeof(pg_block_move) * (size_t)d->mv_cap);
    }
    for (int32_t i = 0; i < d->copies.n; i++) d->mv[i] = (pg_block_move){d->copies.v[i].from, d->copies.v[i].to};
    pg_batch_plan p = {.n_seqs = m, .seqs = d->ps, .n_tokens = tokens, .n_copies = d->copies.n, .copies = d->mv,
                       .kv_groups = 1};
    d->copies.n = 0;
    pg_step_output o;
    PG_TRY(pg_runner_execute(d->runner, &p, &o));
    d->positions += tokens;
    d->steps++;
    for (int32_t i = 0; i < o.n; i++) {
        const int64_t id = o.outs[i].seq_id;
        PG_ARG(id >= 0 && id < d->max_seqs, "draft step: output for sequence %lld", (long long)id);
        dseq *s = &q[id];
        s->buf[s->n + s->got] = o.outs[i].token;
        s->got++;
    }
    return 0;
}

// The entry of positions [pos, pos + m) of sequence i; sampled when it
// reaches the end of what is known (history then drafts).
static pg_plan_seq entry(const pg_draft *d, const dseq *s, int32_t i, int32_t pos, int32_t m) {
    const int32_t known = s->n + s->got;
    return (pg_plan_seq){.seq_id = i, .tokens = s->buf + pos, .n_tokens = m, .start_pos = pos,
                         .block_table = s->t->blocks, .n_blocks = s->t->n_blocks, .sample = pos + m == known,
                         .sp = &d->sp, .history = s->buf, .n_history = pos + m, .n_prompt = pos + m, .eos_id = -1};
}

// Up to d->max_seqs items: lookups and grows, the catch-up prefills packed
// into steps of d->chunk tokens, then one decode step per draft position
// for every sequence still drafting. Returns the runner's error, if any
// (the items keep what they had).
static int propose_group(pg_draft *d, sched_propose_item *items, int32_t n, dseq *q) {
    for (int32_t i = 0; i < n; i++) {
        dseq *s = &q[i];
        const sched_propose_item *it = &items[i];
        *s = (dseq){.buf = d->buf + (size_t)i * ((size_t)d->max_len + (size_t)d->k), .t = &d->tabs[i], .n = it->n,
                    .limit = it->limit, .pos = -1};
        kvp_table_init(s->t);
        if (s->limit > d->k) s->limit = d->k;
        if (s->limit > d->max_len - s->n) s->limit = d->max_len - s->n;
        if (s->limit <= 0 || s->n <= 0) continue;
        memcpy(s->buf, it->history, sizeof(int32_t) * (size_t)s->n);
        // What an earlier proposal left in the cache (at least the last
        // token is computed again: its logits are the first draft's).
        const int32_t hits = kvp_table_lookup(d->pool, s->t, s->buf, s->n);
        const kvp_grow_item g = {s->t, hits, s->n - hits * d->bs};
        if (kvp_grow(d->pool, &g, 1, &d->copies) == 0) s->pos = hits * d->bs; // else: no room, no draft
    }
    int rc = 0;
    // Prefills: every sequence's missing positions, in order, packed.
    for (int32_t i = 0; rc == 0 && i < n;) {
        int32_t m = 0, tokens = 0;
        for (; i < n && tokens < d->chunk; i++) {
            dseq *s = &q[i];
            if (s->pos < 0 || s->pos >= s->n) continue;
            const int32_t c = s->n - s->pos < d->chunk - tokens ? s->n - s->pos : d->chunk - tokens;
            d->ps[m++] = entry(d, s, i, s->pos, c);
            s->pos += c;
            tokens += c;
            if (s->pos < s->n) break; // the next step goes on with it
        }
        if (m > 0) rc = run(d, q, m, tokens);
    }
    // The rest one position a step, each after the one before (the last
    // drafted token is never run: its KV is not needed).
    for (int32_t j = 1; rc == 0 && j < d->k; j++) {
        int32_t m = 0;
        for (int32_t i = 0; i < n; i++) {
            dseq *s = &q[i];
            if (s->got != j || s->got >= s->limit) continue;
            const kvp_grow_item g = {s->t, 0, 1};
            if (kvp_grow(d->pool, &g, 1, &d->copies) < 0) continue; // out of blocks: it stops here
            d->ps[m++] = entry(d, s, i, s->n + s->got - 1, 1);
        }
        if (m == 0) break;
        rc = run(d, q, m, m);
    }
    return rc;
}

void pg_draft_propose_batch(pg_draft *d, sched_propose_item *items, int32_t n) {
    dseq *q = d->q;
    for (int32_t base = 0; base < n; base += d->max_seqs) {
        const int32_t m = n - base < d->max_seqs ? n - base : d->max_seqs;
        const int rc = propose_group(d, items + base, m, q);
        if (rc < 0 && !d->warned) {
            PG_LOGW("draft model: a proposal failed (%s); proposals stop where they fail", pg_err_msg());
            d->warned = true;
        }
        for (int32_t i = 0; i < m; i++) {
            dseq *s = &q[i];
            sched_propose_item *it = &items[base + i];
            // Every full block computed stays findable for the next proposal.
            const int32_t computed = s->got > 0 ? s->n + s->got - 1 : 0;
            if (computed > 0)
                kvp_table_commit(d->pool, s->t, s->buf, computed < s->t->n_tokens ? computed : s->t->n_tokens);
            kvp_table_release(d->pool, s->t);
            kvp_table_fini(s->t);
            it->got = s->got;
            if (s->got == 0) continue;
            memcpy(it->out, s->buf + s->n, sizeof(int32_t) * (size_t)s->got);
            // After the draft's passes, so their cost is the real draft's.
            pg_replay_apply(d->replay, it->history, it->n, it->n_prompt, it->out, it->got);
            d->proposals++;
        }
    }
}

int32_t pg_draft_propose(pg_draft *d, const int32_t *history, int32_t n, int32_t limit, int32_t *out) {
    sched_propose_item it = {history, n, limit, out, 0, 0};
    pg_draft_propose_batch(d, &it, 1);
    return it.got;
}
