// scheduler/sched.c - continuous-batching scheduler.
//
// Containers (a request is in exactly one of them while live):
//   waiting  binary heap by key, holds no blocks (new or recompute-preempted)
//   swapped  binary heap by key, holds host blocks
//   running  array sorted by key, holds device blocks
// key = (priority under the priority policy else 0, arrival_ns, admission
// counter): the head of a heap is served first, the tail of `running` is the
// preemption victim. Requests are also indexed by id (open-addressing map)
// for abort.
//
// Per step (sched_step): running requests in key order get their tokens
// (preempting from the tail when the pool is out of blocks); then, if nothing
// was preempted, swapped requests come back (head first, stop at the first
// that does not fit), and once none is swapped, waiting ones are admitted
// (same head-of-line rule, so nobody is overtaken forever). All plan memory
// stays put until sched_update: token arrays grow only in sched_update
// (after the runner is done with the plan) and block tables only inside
// sched_step.
//
// Files: this one plans (admission, preemption, sched_step) and holds the
// public API's create / add / abort, stats and the invariant check;
// sched_req.c the containers and the end of sequences and requests (events,
// stop rules); sched_update.c a step's results (sched_advance,
// sched_resolve); sched_spec.c speculative decoding; sched_int.h the state
// they share.
#include "scheduler/sched_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

// ---------------------------------------------------------------------------
// Small helpers

static int32_t cdiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------
// Preemption

// Live sequences' tables of r into s->tabs; returns the count.
static int32_t live_tables(sched *s, req *r) {
    int32_t k = 0;
    for (int32_t i = 0; i < r->n; i++)
        if (r->seqs[i].finish == SCHED_FINISH_NONE) s->tabs[k++] = &r->seqs[i].table;
    return k;
}

// Preempts v, the tail of running: swap to host when asked and room is
// there, else drop its blocks for recompute.
static void preempt(sched *s, req *v) {
    PG_CHECK(s->n_run > 0 && s->run[s->n_run - 1] == v && !v->in_flight);
    s->n_run--;
    s->running_seqs -= v->n_live;
    s->preempted = true;
    v->usage.n_preemptions++;
    if (s->cfg.preemption_mode == SCHED_PREEMPT_SWAP) {
        int32_t k = live_tables(s, v), before = s->swap_out.n;
        if (kvp_swap_out(s->pool, s->tabs, k, &s->swap_out) == 0) {
            s->st.n_swap_out_blocks += s->swap_out.n - before;
            s->st.n_preempt_swap++;
            v->state = RQ_SWAPPED;
            sched_heap_push(&s->swapped, v);
            return;
        }
    }
    for (int32_t i = 0; i < v->n; i++) {
        kvp_table_release(s->pool, &v->seqs[i].table);
        v->seqs[i].n_computed = 0;
    }
    v->forked = false;
    v->lead = first_live(v);
    v->state = RQ_WAITING;
    sched_heap_push(&s->waiting, v);
    s->st.n_preempt_recompute++;
}

// ---------------------------------------------------------------------------
// Planning one request

// Tokens the lead must compute before sampling (n > 1: all but the last
// prompt token, which each forked sequence computes itself).
static int32_t lead_target(const req *r) {
    return r->n_live >= 2 ? r->n_prompt - 1 : r->seqs[r->lead].n_hist;
}

// Forks the lead's blocks into every live sequence once the lead has
// computed the prompt but its last token (n > 1 only).
static void maybe_fork(sched *s, req *r) {
    if (r->forked || r->n_live < 2) return;
    seq *lead = &r->seqs[r->lead];
    if (lead->n_computed != r->n_prompt - 1) return;
    for (int32_t i = 0; i < r->n; i++) {
        seq *q = &r->seqs[i];
        if (q == lead || q->finish != SCHED_FINISH_NONE) continue;
        kvp_table_fork(s->pool, &lead->table, &q->table, r->n_prompt);
        q->n_computed = lead->n_computed;
    }
    r->forked = true;
}

// Tokens to schedule for a sequence with `rem` pending under `left`.
static int32_t chunk_len(const sched *s, int32_t rem, int32_t left) {
    if (rem <= 0 || left <= 0) return 0;
    if (!s->cfg.enable_chunked_prefill) return rem <= left ? rem : 0;
    int32_t th = s->prefill_cap_now;
    if (th > 0 && rem > th) rem = th;
    return rem < left ? rem : left;
}

// Fills s->items / s->iseq with r's work this step under *b (not spent):
// the lead's next chunk before the fork (after `lead_hits` cached blocks),
// else one entry per live sequence. Returns the item count; *n_tok the tokens.
static int32_t build_items(sched *s, req *r, const budget *b, int32_t lead_hits, int32_t *n_tok) {
    int32_t n = 0, left = b->tokens, seqs = b->seqs;
    if (!r->forked) {
        seq *q = &r->seqs[r->lead];
        int32_t done = lead_hits ? lead_hits * s->bs : q->n_computed;
        int32_t c = seqs > 0 && !q->stopping ? chunk_len(s, lead_target(r) - done, left) : 0;
        q->n_draft = 0;
        if (c == 1 && !lead_hits && done == q->n_hist - 1) c += spec_propose(s, r, q, left);
        if (c > 0) {
            s->items[n] = (kvp_grow_item){&q->table, lead_hits, c};
            s->iseq[n++] = q;
            left -= c;
        }
    } else {
        // n > 1: each decoding sequence may draft from its own history,
        // with the budget left once every later sibling has its token.
        int32_t later = 0;
        for (int32_t i = 0; i < r->n; i++) {
            const seq *q = &r->seqs[i];
            later += q->finish == SCHED_FINISH_NONE && !q->stopping && q->n_hist > q->n_computed;
        }
        for (int32_t i = 0; i < r->n && seqs > 0 && left > 0; i++) {
            seq *q = &r->seqs[i];
            q->n_draft = 0;
            if (q->finish != SCHED_FINISH_NONE || q->stopping) continue;
            const int32_t rem = q->n_hist - q->n_computed;
            later -= rem > 0;
            int32_t c = chunk_len(s, rem, left);
            if (c <= 0) continue;
            if (c == 1 && rem == 1) c += spec_propose(s, r, q, left - later);
            s->items[n] = (kvp_grow_item){&q->table, 0, c};
            s->iseq[n++] = q;
            left -= c;
            seqs--;
        }
    }
    *n_tok = b->tokens - left;
    return n;
}

// Rows of a chunk [start, start + c) that score a prompt token (position
// p scores the token at p + 1 < n_prompt), while the request has not had
// its prompt logprobs (they come before its first token).
static int32_t prompt_lp_rows(const req *r, int32_t start, int32_t c) {
    if (!r->sp.want_prompt_logprobs || r->usage.first_token_ns) return 0;
    int32_t n = r->n_prompt - 1 - start;
    return n <= 0 ? 0 : n < c ? n : c;
}

// Adds the grown items of r to the plan and spends the budget.
static void commit_items(sched *s, req *r, int32_t n, int32_t n_tok, budget *b) {
    const pg_sampling_params *sp = &r->sp;
    for (int32_t i = 0; i < n; i++) {
        seq *q = s->iseq[i];
        int32_t c = s->items[i].n_new;
        q->n_computed = q->table.n_tokens - c; // includes adopted prefix hits
        q->n_sched = c;
        b->seqs -= q->n_draft; // a draft's rows count as sequences (spec_step_begin)
        int32_t k = s->plan.n_seqs++;
        PG_CHECK(k < s->cfg.max_num_seqs);
        s->pref[k] = q;
        int32_t n_gen = q->n_hist - r->n_prompt;
        s->pseqs[k] = (pg_plan_seq){
            .seq_id = q->seq_id,
            .tokens = q->n_draft ? q->draft : q->hist + q->n_computed,
            .n_tokens = c,
            .start_pos = q->n_computed,
            .block_table = q->table.blocks,
            .n_blocks = q->table.n_blocks,
            .sample = q->n_computed + c == q->n_hist || q->n_draft > 0,
            .sp = sp,
            .history = q->hist,
            .n_history = q->n_hist,
            .n_prompt = r->n_prompt,
            .n_generated = n_gen,
            .rng_seed = q->rng_seed,
            .mask_eos = n_gen < sp->min_tokens,
            .eos_id = r->eos_id,
            .n_prompt_lp = prompt_lp_rows(r, q->n_computed, c),
            .lora_id = r->lora_id,
            .n_draft = q->n_draft,
        };
    }
    s->plan.n_tokens += n_tok;
    b->tokens -= n_tok;
    b->seqs -= n;
    s->preq[s->n_preq++] = r;
    r->in_flight = true;
    if (!r->usage.first_scheduled_ns) r->usage.first_scheduled_ns = s->now;
}

// Running request r: plans its work, preempting the tail of running until
// the blocks fit. Returns true when r itself had to go (it was the tail).
static bool schedule_running(sched *s, req *r, budget *b) {
    maybe_fork(s, r);
    int32_t n_tok, n = build_items(s, r, b, 0, &n_tok);
    if (n == 0) return false;
    int32_t copies_before = s->copies.n;
    while (kvp_grow(s->pool, s->items, n, &s->copies) == PG_ENOSPC) {
        if (spec_drop(s, n, &n_tok)) continue; // no one is preempted for a guess
        req *victim = s->run[s->n_run - 1];
        preempt(s, victim);
        if (victim == r) return true;
    }
    s->st.n_cow_copies += s->copies.n - copies_before;
    commit_items(s, r, n, n_tok, b);
    return false;
}

// Head of swapped: brings it back with this step's work when everything
// fits. Returns false (nothing changed but a possible fork) otherwise.
static bool admit_swapped(sched *s, req *r, budget *b) {
    if (s->running_seqs + r->n_live > s->cfg.max_num_seqs) return false;
    maybe_fork(s, r);
    int32_t n_tok, n = build_items(s, r, b, 0, &n_tok);
    if (n == 0) return false;
    int32_t k = live_tables(s, r);
    int32_t cost = kvp_swap_in_cost(s->pool, s->tabs, k) + kvp_grow_cost(s->pool, s->items, n);
    if (cost > kvp_num_free(s->pool)) return false;
    int32_t moves_before = s->swap_in.n, copies_before = s->copies.n;
    PG_CHECK(kvp_swap_in(s->pool, s->tabs, k, &s->swap_in) == 0);
    PG_CHECK(kvp_grow(s->pool, s->items, n, &s->copies) == 0);
    s->st.n_swap_in_blocks += s->swap_in.n - moves_before;
    s->st.n_cow_copies += s->copies.n - copies_before;
    sched_heap_remove(&s->swapped, r);
    r->state = RQ_RUNNING;
    sched_run_insert(s, r);
    s->running_seqs += r->n_live;
    commit_items(s, r, n, n_tok, b);
    return true;
}

// Head of waiting: adopts its cached prefix and plans its first chunk when
// the blocks fit. Returns false (nothing changed) otherwise.
static bool admit_waiting(sched *s, req *r, budget *b) {
    if (s->running_seqs + r->n_live > s->cfg.max_num_seqs) return false;
    maybe_fork(s, r); // a one-token prompt forks at once (no blocks yet)
    int32_t hits = 0;
    seq *lead = &r->seqs[r->lead];
    // A request that wants prompt logprobs computes every prompt position
    // (vLLM skips the cache for it too) until it has had them, i.e. until
    // its first token: a recompute after that may take hits again.
    bool plp = r->sp.want_prompt_logprobs && !r->usage.first_token_ns;
    if (!r->forked && !plp) hits = kvp_table_lookup(s->pool, &lead->table, lead->hist, lead_target(r));
    int32_t n_tok, n = build_items(s, r, b, hits, &n_tok);
    if (n == 0) return false;
    int32_t copies_before = s->copies.n;
    if (kvp_grow(s->pool, s->items, n, &s->copies) == PG_ENOSPC) return false;
    s->st.n_cow_copies += s->copies.n - copies_before;
    if (!r->forked) kvp_note_lookup(s->pool, lead_target(r), hits * s->bs);
    if (!r->usage_cached_set) {
        r->usage.cached_tokens = hits * s->bs;
        r->usage_cached_set = true;
    }
    sched_heap_remove(&s->waiting, r);
    r->state = RQ_RUNNING;
    sched_run_insert(s, r);
    s->running_seqs += r->n_live;
    commit_items(s, r, n, n_tok, b);
    return true;
}

// ---------------------------------------------------------------------------
// Step

static void copy_moves(pg_block_move *dst, const kvp_moves *m) {
    for (int32_t i = 0; i < m->n; i++) dst[i] = (pg_block_move){m->v[i].from, m->v[i].to};
}

int sched_step(sched *s, const pg_batch_plan **out) {
    *out = NULL;
    if (s->in_flight) return pg_err_set(PG_EINVAL, "sched_step: the previous plan was not updated");
    s->now = sched_clock(s);
    s->plan.n_seqs = s->plan.n_tokens = 0;
    s->n_preq = 0;
    s->copies.n = s->swap_out.n = s->swap_in.n = 0;
    s->preempted = false;
    // The previous plan's moves run before this one's: its host blocks may
    // be reused now.
    kvp_release_holds(s->pool);
    budget b = {s->cfg.max_num_batched_tokens, s->cfg.max_num_seqs};
    // The long-prefill cap matters only when someone else could use the
    // rest of the budget.
    s->prefill_cap_now = s->n_run + s->waiting.n + s->swapped.n > 1 ? s->prefill_cap : 0;
    spec_step_begin(s);
    // Layer groups: the blocks that fell out of a windowed group's window
    // (every query yet to run, in flight included, is at n_computed or
    // later) go back before anything is allocated.
    for (int32_t i = 0; i < s->n_run; i++)
        for (int32_t j = 0; j < s->run[i]->n; j++) {
            seq *q = &s->run[i]->seqs[j];
            kvp_table_slide(s->pool, &q->table, q->n_computed);
        }

    for (int32_t i = 0; i < s->n_run && b.tokens > 0; i++)
        if (schedule_running(s, s->run[i], &b)) break;
    if (!s->preempted) {
        while (s->swapped.n > 0 && b.tokens > 0 && b.seqs > 0)
            if (!admit_swapped(s, s->swapped.v[0], &b)) break;
        while (s->swapped.n == 0 && s->waiting.n > 0 && b.tokens > 0 && b.seqs > 0)
            if (!admit_waiting(s, s->waiting.v[0], &b)) break;
    }
    spec_batch_fill(s); // propose_batch: every provisional draft at once

    // The host tier's offloads and loads join the swaps: the same ordering
    // (swap-out, swap-in, copies, forward) makes them safe. Copies ahead
    // (PAGED_KV_OFFLOAD_AHEAD) come last among the swap-outs, counted by
    // n_swap_out_ahead; the runner runs them with the others for now
    // (docs/engine.md "Copy ahead").
    const int32_t n_ahead = kvp_take_tier_moves(s->pool, &s->swap_out, &s->swap_in);
    int32_t n_mv = s->swap_out.n + s->swap_in.n + s->copies.n;
    s->mv = grow_array(s->mv, &s->mv_cap, n_mv, sizeof(pg_block_move));
    copy_moves(s->mv, &s->swap_out);
    copy_moves(s->mv + s->swap_out.n, &s->swap_in);
    copy_moves(s->mv + s->swap_out.n + s->swap_in.n, &s->copies);
    pg_batch_plan *p = &s->plan;
    p->seqs = s->pseqs;
    p->n_swap_out = s->swap_out.n;
    p->n_swap_out_ahead = n_ahead;
    p->n_swap_in = s->swap_in.n;
    p->n_copies = s->copies.n;
    p->swap_out = s->mv;
    p->swap_in = s->mv + s->swap_out.n;
    p->copies = s->mv + s->swap_out.n + s->swap_in.n;
    p->mask_words = 0; // sched_set_masks; every entry's mask starts NULL
    p->kv_groups = kvp_num_groups(s->pool);
    s->in_flight = true;
    s->st.n_steps++;
    *out = p;
    return 0;
}

int sched_set_masks(sched *s, const uint32_t *const *masks, int32_t words) {
    if (!s->in_flight) return pg_err_set(PG_EINVAL, "sched_set_masks: no plan in flight");
    if (words <= 0) return pg_err_set(PG_EINVAL, "sched_set_masks: %d words", words);
    for (int32_t i = 0; i < s->plan.n_seqs; i++) s->pseqs[i].mask = s->pseqs[i].sample ? masks[i] : NULL;
    s->plan.mask_words = words;
    return 0;
}

// ---------------------------------------------------------------------------
// Public API

void sched_config_default(sched_config *c) {
    memset(c, 0, sizeof *c);
    c->block_size = SCHED_DEFAULT_BLOCK_SIZE;
    c->enable_prefix_caching = true;
    c->max_num_batched_tokens = SCHED_DEFAULT_MAX_NUM_BATCHED_TOKENS;
    c->max_num_seqs = SCHED_DEFAULT_MAX_NUM_SEQS;
    c->enable_chunked_prefill = true;
    c->long_prefill_token_threshold = SCHED_LONG_PREFILL_AUTO;
    c->policy = SCHED_POLICY_FCFS;
    c->preemption_mode = SCHED_PREEMPT_RECOMPUTE;
}

int sched_create(const sched_config *cfg, sched **out) {
    *out = NULL;
    if (cfg->max_model_len < 1)
        return pg_err_set(PG_EINVAL, "scheduler: max_model_len %d < 1", cfg->max_model_len);
    if (cfg->max_num_batched_tokens < 1)
        return pg_err_set(PG_EINVAL, "scheduler: max_num_batched_tokens %d < 1",
                          cfg->max_num_batched_tokens);
    if (cfg->max_num_seqs < 1 || cfg->max_num_seqs > (1 << 20))
        return pg_err_set(PG_EINVAL, "scheduler: max_num_seqs %d out of range", cfg->max_num_seqs);
    if (cfg->long_prefill_token_threshold < 0 &&
        cfg->long_prefill_token_threshold != SCHED_LONG_PREFILL_AUTO)
        return pg_err_set(PG_EINVAL, "scheduler: long_prefill_token_threshold %d < 0",
                          cfg->long_prefill_token_threshold);
    if (cfg->policy != SCHED_POLICY_FCFS && cfg->policy != SCHED_POLICY_PRIORITY)
        return pg_err_set(PG_EINVAL, "scheduler: unknown policy %d", (int)cfg->policy);
    if (cfg->preemption_mode != SCHED_PREEMPT_RECOMPUTE &&
        cfg->preemption_mode != SCHED_PREEMPT_SWAP)
        return pg_err_set(PG_EINVAL, "scheduler: unknown preemption mode %d",
                          (int)cfg->preemption_mode);
    const sched_spec_config *sc = &cfg->spec;
    if (sc->num_tokens < 0 || sc->num_tokens > PG_MAX_DRAFT || sc->max_running_seqs < 0 ||
        (sc->num_tokens > 0 && !sc->propose && !sc->propose_batch))
        return pg_err_set(PG_EINVAL, "scheduler: speculative tokens %d out of [0, %d] or no proposer",
                          sc->num_tokens, PG_MAX_DRAFT);
    kvp_config kc;
    kvp_config_default(&kc);
    kc.num_blocks = cfg->num_blocks;
    kc.num_host_blocks = cfg->num_host_blocks;
    kc.block_size = cfg->block_size;
    kc.enable_prefix_caching = cfg->enable_prefix_caching;
    kc.enable_host_tier = cfg->enable_host_kv_cache;
    kc.host_tier_reused_only = cfg->host_kv_reused_only;
    kc.host_tier_ahead = cfg->host_kv_ahead;
    kc.n_groups = cfg->kv_groups;
    memcpy(kc.group_window, cfg->kv_group_window, sizeof kc.group_window);
    kvp_pool *pool;
    int rc = kvp_create(&kc, &pool);
    if (rc < 0) return pg_err_wrap(rc, "scheduler: ");
    sched *s = pg_xcalloc(1, sizeof *s);
    s->cfg = *cfg;
    s->pool = pool;
    s->bs = cfg->block_size;
    s->prefill_cap = cfg->long_prefill_token_threshold;
    if (s->prefill_cap == SCHED_LONG_PREFILL_AUTO) {
        s->prefill_cap = cfg->max_num_batched_tokens / 4 / s->bs * s->bs;
        if (s->prefill_cap < s->bs) s->prefill_cap = s->bs;
    }
    s->rng = cfg->seed;
    s->pseqs = pg_xcalloc((size_t)cfg->max_num_seqs, sizeof(pg_plan_seq));
    s->pref = pg_xcalloc((size_t)cfg->max_num_seqs, sizeof(seq *));
    s->preq = pg_xcalloc((size_t)cfg->max_num_seqs, sizeof(req *));
    s->ures_seq = pg_xcalloc((size_t)cfg->max_num_seqs, sizeof(int64_t));
    s->ures_req = pg_xcalloc((size_t)cfg->max_num_seqs, sizeof(int64_t));
    s->plan.seqs = s->pseqs;
    if (cfg->spec.propose_batch) {
        s->spec_items = pg_xcalloc((size_t)cfg->max_num_seqs, sizeof(sched_propose_item));
        s->spec_entry = pg_xcalloc((size_t)cfg->max_num_seqs, sizeof(int32_t));
    }
    *out = s;
    return 0;
}

void sched_destroy(sched *s) {
    if (!s) return;
    for (uint64_t i = 0; s->ids.vals && i <= s->ids.mask; i++)
        if (s->ids.vals[i]) sched_req_free(s, s->ids.vals[i]);
    free(s->ids.keys);
    free(s->ids.vals);
    free(s->waiting.v);
    free(s->swapped.v);
    free(s->run);
    free(s->pseqs);
    free(s->pref);
    free(s->preq);
    free(s->ures_seq);
    free(s->ures_req);
    free(s->spec_items);
    free(s->spec_entry);
    kvp_moves_fini(&s->copies);
    kvp_moves_fini(&s->swap_out);
    kvp_moves_fini(&s->swap_in);
    free(s->mv);
    free(s->ev.v);
    free(s->pending.v);
    free(s->dead);
    kvp_destroy(s->pool);
    free(s);
}

// KV blocks r needs at its longest: the shared prompt blocks once, then
// every sequence's own up to prompt + max_tokens - 1 positions (the last
// sampled token is never run). With layer groups, per group: a
// full-attention group as the plain pool (the n sequences fork from the
// prompt and share its full blocks); a windowed group holds its window and
// a step's tokens (kvp_group_blocks_for), counted for every sequence, since
// at the longest those are past the prompt and each sequence's own.
static int64_t blocks_needed(const sched *s, int32_t n_prompt, int32_t max_tokens, int32_t n) {
    const int32_t bs = s->bs, len = n_prompt + max_tokens - 1;
    const int64_t shared = (n_prompt - 1) / bs;
    int64_t need = 0;
    for (int32_t g = 0; g < kvp_num_groups(s->pool); g++) {
        const int64_t held = kvp_group_blocks_for(s->pool, g, len, s->cfg.max_num_batched_tokens);
        need += kvp_group_window(s->pool, g) > 0 ? (int64_t)n * held : shared + (int64_t)n * (held - shared);
    }
    return need;
}

// Validates `in` against limits that do not change; 0 or PG_EINVAL.
static int validate_request(const sched *s, const sched_request *in) {
    const sched_config *c = &s->cfg;
    if (!in->prompt || !in->sp) return pg_err_set(PG_EINVAL, "request: missing prompt or params");
    const pg_sampling_params *sp = in->sp;
    if (in->id < 0 || in->id >= SCHED_MAX_REQ_ID)
        return pg_err_set(PG_EINVAL, "request: id %lld out of [0, 2^54)", (long long)in->id);
    if (sched_idmap_get(&s->ids, in->id))
        return pg_err_set(PG_EINVAL, "request: id %lld is already live", (long long)in->id);
    if (in->n_prompt < 1) return pg_err_set(PG_EINVAL, "request: empty prompt");
    for (int32_t i = 0; i < in->n_prompt; i++)
        if (in->prompt[i] < 0)
            return pg_err_set(PG_EINVAL, "request: prompt token %d is negative", i);
    if (sp->n < 1 || sp->n > SCHED_MAX_N || sp->n > c->max_num_seqs)
        return pg_err_set(PG_EINVAL, "request: n = %d out of [1, %d]", sp->n,
                          c->max_num_seqs < SCHED_MAX_N ? c->max_num_seqs : SCHED_MAX_N);
    if (sp->max_tokens < 1) return pg_err_set(PG_EINVAL, "request: max_tokens must be >= 1");
    if (sp->min_tokens < 0 || sp->min_tokens > sp->max_tokens)
        return pg_err_set(PG_EINVAL, "request: min_tokens %d out of [0, max_tokens %d]",
                          sp->min_tokens, sp->max_tokens);
    if (sp->n_stop_ids < 0 || sp->n_stop_ids > PG_MAX_STOP_IDS)
        return pg_err_set(PG_EINVAL, "request: %d stop token ids (at most %d)", sp->n_stop_ids,
                          PG_MAX_STOP_IDS);
    if (sp->logprobs < -1 || sp->logprobs > PG_MAX_LOGPROBS)
        return pg_err_set(PG_EINVAL, "request: logprobs %d out of [-1, %d]", sp->logprobs,
                          PG_MAX_LOGPROBS);
    if ((int64_t)in->n_prompt + sp->max_tokens > c->max_model_len)
        return pg_err_set(PG_EINVAL,
                          "request: this model's maximum context length is %d tokens, but %d "
                          "were requested (%d in the prompt, %d for the completion)",
                          c->max_model_len, in->n_prompt + sp->max_tokens, in->n_prompt,
                          sp->max_tokens);
    int64_t need = blocks_needed(s, in->n_prompt, sp->max_tokens, sp->n);
    if (need > kvp_num_usable(s->pool))
        return pg_err_set(PG_EINVAL,
                          "request: needs %lld KV blocks (%d prompt + %d completion tokens, n = "
                          "%d) but the whole cache holds %d blocks of %d tokens",
                          (long long)need, in->n_prompt, sp->max_tokens, sp->n,
                          kvp_num_usable(s->pool), s->bs);
    if (!c->enable_chunked_prefill && in->n_prompt + sp->max_tokens - 1 > c->max_num_batched_tokens)
        return pg_err_set(PG_EINVAL,
                          "request: %d prompt + %d completion tokens exceed one step's %d "
                          "tokens and chunked prefill is off",
                          in->n_prompt, sp->max_tokens, c->max_num_batched_tokens);
    return 0;
}

int sched_add_request(sched *s, const sched_request *in) {
    int rc = validate_request(s, in);
    if (rc < 0) {
        s->st.n_rejected++;
        return rc;
    }
    if (s->cfg.max_waiting > 0 && s->waiting.n + s->swapped.n >= s->cfg.max_waiting) {
        s->st.n_rejected++;
        return pg_err_set(PG_ENOSPC, "request: queue full (%d waiting)", s->cfg.max_waiting);
    }
    const pg_sampling_params *sp = in->sp;
    int32_t n = sp->n;
    // Output room grows by doubling: a long max_tokens costs nothing upfront.
    int32_t cap = in->n_prompt + (sp->max_tokens < 16 ? sp->max_tokens : 16);
    req *r = pg_xcalloc(1, sizeof(req) + sizeof(seq) * (size_t)n);
    r->id = in->id;
    r->owner = in->owner;
    r->sp = *sp;
    r->prio = s->cfg.policy == SCHED_POLICY_PRIORITY ? in->priority : 0;
    r->arrival_ns = in->arrival_ns;
    r->order = s->order++;
    r->eos_id = sp->ignore_eos ? -1 : in->eos_id;
    r->lora_id = in->lora_id;
    r->n_prompt = in->n_prompt;
    r->n = r->n_live = n;
    r->usage.prompt_tokens = in->n_prompt;
    r->usage.arrival_ns = in->arrival_ns;
    uint64_t seed = sp->has_seed ? sp->seed : mix64(s->rng++);
    for (int32_t i = 0; i < n; i++) {
        seq *q = &r->seqs[i];
        q->rq = r;
        q->index = i;
        q->seq_id = in->id * SCHED_MAX_N + i;
        q->hist = pg_xmalloc(sizeof(int32_t) * (size_t)cap);
        q->hist_cap = cap;
        memcpy(q->hist, in->prompt, sizeof(int32_t) * (size_t)in->n_prompt);
        q->n_hist = in->n_prompt;
        q->rng_seed = seed + (uint64_t)i; // vLLM: child seed = seed + index
        q->stop_token = -1;
        kvp_table_init(&q->table);
        kvp_table_set_salt(&q->table, in->cache_salt);
    }
    r->state = RQ_WAITING;
    sched_heap_push(&s->waiting, r);
    sched_idmap_put(&s->ids, r->id, r);
    s->st.n_admitted++;
    return 0;
}

int sched_abort(sched *s, int64_t id) {
    req *r = sched_idmap_get(&s->ids, id);
    if (!r) return pg_err_set(PG_ENOTFOUND, "abort: no live request %lld", (long long)id);
    if (r->in_flight) {
        r->abort_pending = true;
        return 0;
    }
    sched_end_now(s, r, -1, SCHED_FINISH_ABORT);
    return 0;
}

int sched_finish_seq(sched *s, int64_t id, int32_t seq_index, sched_finish_reason reason) {
    req *r = sched_idmap_get(&s->ids, id);
    if (!r) return pg_err_set(PG_ENOTFOUND, "finish: no live request %lld", (long long)id);
    if (seq_index < 0 || seq_index >= r->n)
        return pg_err_set(PG_EINVAL, "finish: request %lld has no sequence %d", (long long)id,
                          seq_index);
    if (reason == SCHED_FINISH_NONE || reason > SCHED_FINISH_ERROR)
        return pg_err_set(PG_EINVAL, "finish: bad reason %d", (int)reason);
    seq *q = &r->seqs[seq_index];
    if (q->finish != SCHED_FINISH_NONE || q->pending != SCHED_FINISH_NONE)
        return pg_err_set(PG_EINVAL, "finish: sequence %d of %lld already finished", seq_index,
                          (long long)id);
    if (r->in_flight) {
        q->pending = reason;
        return 0;
    }
    sched_end_now(s, r, seq_index, reason);
    return 0;
}

void *sched_request_owner(const sched *s, int64_t id) {
    const req *r = sched_idmap_get(&s->ids, id);
    // n_live 0: its last event is out, though a plan still holds it
    // (sched_resolve ended it while it is in the next plan).
    return r && r->n_live > 0 ? r->owner : NULL;
}

void sched_for_each_owner(sched *s, void (*fn)(void *owner, void *ctx), void *ctx) {
    for (uint64_t i = 0; s->ids.vals && i <= s->ids.mask; i++) {
        const req *r = s->ids.vals[i];
        if (r && r->n_live > 0) fn(r->owner, ctx);
    }
    // Ended by an abort or an early finish since the last update: gone
    // from the map, their last event still to deliver.
    for (int32_t k = 0; k < s->pending.n; k++)
        if (s->pending.v[k].req_finished) fn(s->pending.v[k].owner, ctx);
}

bool sched_has_work(const sched *s) {
    return s->n_run > 0 || s->waiting.n > 0 || s->swapped.n > 0 || s->pending.n > 0 || s->advanced;
}

void sched_stats_get(const sched *s, sched_stats *o) {
    *o = s->st;
    o->n_running = s->n_run;
    o->n_waiting = s->waiting.n;
    o->n_swapped = s->swapped.n;
    o->n_running_seqs = s->running_seqs;
    kvp_stats_get(s->pool, &o->kv);
    o->lora_running_mask = o->lora_waiting_mask = 0;
#define LORA_BIT(r) ((r)->lora_id > 0 && (r)->lora_id <= 64 ? (uint64_t)1 << ((r)->lora_id - 1) : 0)
    for (int32_t i = 0; i < s->n_run; i++) o->lora_running_mask |= LORA_BIT(s->run[i]);
    for (int32_t i = 0; i < s->waiting.n; i++) o->lora_waiting_mask |= LORA_BIT(s->waiting.v[i]);
    for (int32_t i = 0; i < s->swapped.n; i++) o->lora_waiting_mask |= LORA_BIT(s->swapped.v[i]);
#undef LORA_BIT
}

const kvp_pool *sched_pool(const sched *s) { return s->pool; }

// ---------------------------------------------------------------------------
// Invariant check

static int check_req(const sched *s, const req *r, int32_t *dev, int32_t *host) {
    int32_t live = 0;
    for (int32_t i = 0; i < r->n; i++) {
        const seq *q = &r->seqs[i];
        const kvp_table *t = &q->table;
        if (q->finish == SCHED_FINISH_NONE) live++;
        if (t->n_blocks != cdiv(t->n_tokens, s->bs))
            return pg_err_set(PG_EINVAL, "seq %lld: %d blocks for %d tokens", (long long)q->seq_id,
                              t->n_blocks, t->n_tokens);
        if (t->n_tokens != q->n_computed + q->n_sched + q->spec_held)
            return pg_err_set(PG_EINVAL, "seq %lld: table covers %d, computed %d + %d",
                              (long long)q->seq_id, t->n_tokens, q->n_computed, q->n_sched);
        if (q->n_computed > q->n_hist || q->n_hist > r->n_prompt + r->sp.max_tokens)
            return pg_err_set(PG_EINVAL, "seq %lld: bad lengths", (long long)q->seq_id);
        if (t->n_blocks && q->finish != SCHED_FINISH_NONE)
            return pg_err_set(PG_EINVAL, "seq %lld: finished but holds blocks",
                              (long long)q->seq_id);
        if (t->n_blocks && !r->forked && i != r->lead)
            return pg_err_set(PG_EINVAL, "seq %lld: holds blocks before the fork",
                              (long long)q->seq_id);
        if (t->n_blocks && r->state == RQ_WAITING)
            return pg_err_set(PG_EINVAL, "seq %lld: waiting but holds blocks",
                              (long long)q->seq_id);
        if (t->n_blocks && t->swapped != (r->state == RQ_SWAPPED))
            return pg_err_set(PG_EINVAL, "seq %lld: blocks on the wrong side",
                              (long long)q->seq_id);
        kvp_table_count_owners(s->pool, t, dev, host);
    }
    // (none live: only a request that sched_resolve ended while it is in the
    // next plan, unlinked by the next sched_advance)
    if (live != r->n_live || (live == 0 && !r->in_flight))
        return pg_err_set(PG_EINVAL, "request %lld: %d live sequences, counted %d",
                          (long long)r->id, r->n_live, live);
    if (live > 0 && r->seqs[r->lead].finish != SCHED_FINISH_NONE && !r->forked)
        return pg_err_set(PG_EINVAL, "request %lld: finished lead", (long long)r->id);
    return 0;
}

int sched_check(const sched *s) {
    const kvp_pool *p = s->pool;
    int32_t nb = kvp_num_usable(p) + 1, nh = kvp_num_host_blocks(p);
    int32_t *dev = pg_xcalloc((size_t)nb, sizeof(int32_t));
    int32_t *host = pg_xcalloc((size_t)(nh ? nh : 1), sizeof(int32_t));
    int rc = 0, n_live_reqs = 0, run_seqs = 0;
    for (uint64_t i = 0; s->ids.vals && i <= s->ids.mask; i++) {
        const req *r = s->ids.vals[i];
        if (!r) continue;
        n_live_reqs++;
        if ((rc = check_req(s, r, dev, host)) < 0) goto done;
        const rheap *h = r->state == RQ_WAITING   ? &s->waiting
                         : r->state == RQ_SWAPPED ? &s->swapped
                                                  : NULL;
        if (r->state == RQ_RUNNING) {
            if (r->qpos < 0 || r->qpos >= s->n_run || s->run[r->qpos] != r) {
                rc =
                    pg_err_set(PG_EINVAL, "request %lld not at its running slot", (long long)r->id);
                goto done;
            }
            run_seqs += r->n_live;
        } else if (!h || r->qpos < 0 || r->qpos >= h->n || h->v[r->qpos] != r) {
            rc = pg_err_set(PG_EINVAL, "request %lld not in its queue", (long long)r->id);
            goto done;
        }
    }
    if (n_live_reqs != s->n_run + s->waiting.n + s->swapped.n) {
        rc = pg_err_set(PG_EINVAL, "%d live requests but %d + %d + %d queued", n_live_reqs,
                        s->n_run, s->waiting.n, s->swapped.n);
        goto done;
    }
    for (int32_t i = 1; i < s->n_run; i++) {
        if (!req_before(s->run[i - 1], s->run[i])) {
            rc = pg_err_set(PG_EINVAL, "running not sorted at %d", i);
            goto done;
        }
    }
    const rheap *heaps[2] = {&s->waiting, &s->swapped};
    for (int32_t k = 0; k < 2; k++)
        for (int32_t i = 1; i < heaps[k]->n; i++)
            if (req_before(heaps[k]->v[i], heaps[k]->v[(i - 1) / 2])) {
                rc = pg_err_set(PG_EINVAL, "heap order broken at %d", i);
                goto done;
            }
    if (run_seqs != s->running_seqs || run_seqs > s->cfg.max_num_seqs) {
        rc = pg_err_set(PG_EINVAL, "running sequences %d, counted %d, cap %d", s->running_seqs,
                        run_seqs, s->cfg.max_num_seqs);
        goto done;
    }
    rc = kvp_check(p, dev, host);
done:
    free(dev);
    free(host);
    return rc;
}

const char *sched_finish_name(sched_finish_reason r) {
    switch (r) {
    case SCHED_FINISH_STOP: return "stop";
    case SCHED_FINISH_LENGTH: return "length";
    case SCHED_FINISH_ABORT: return "abort";
    case SCHED_FINISH_ERROR: return "error";
    default: return NULL;
    }
}
