// tests/unit/test_sched_sim.c - randomized simulation of the scheduler
// against a fake runner.
//
// The fake runner keeps a simulated KV cache: every slot holds the (token,
// position) written into it. It performs the plan's swap-outs, swap-ins and
// copies, writes each scheduled token into its slot, then - like attention -
// reads back every position of each sequence's context through its block
// table and checks it holds that sequence's history. A sampled token is a
// hash of the context read from the cache, the sequence's seed and its
// sample counter, so it depends on nothing but the history: a run without
// preemption, computed here directly from the request (the reference), must
// produce exactly the same tokens. Any lost, shared-while-written, stale or
// wrongly swapped block changes the output or trips the context check.
//
// Thousands of random requests (lengths, arrivals, priorities, n, stop ids,
// min_tokens, aborts at any moment, early finishes) run on pools small enough
// to force preemption in both modes. After every step and update:
// sched_check (ref counts = owners, free lists, queues), budgets, plan shape;
// at the end: every request finished exactly once with the reference output
// and the pool is empty. FCFS runs also bound the steps a request waits.
//
// KV layer groups (kvpool/kvpool.h): the fake runner writes every token
// into each group's block and, for a windowed group, reads back only the
// window of the entry's first query (a dropped block there is an error);
// the sampled token hashes the full group 0's context, as before.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "scheduler/sched.h"

enum {
    VOCAB = 40, // small: EOS (token 0) and stop ids come up often
    EOS = 0,
    MAX_PROMPT = 120,
    MAX_OUT = 160,
    MAX_N = 4,
    N_SYSTEM = 4, // shared prompt prefixes (prefix caching)
    SYSTEM_LEN = 40,
};

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rnext(rng *r) { return mix64(r->s++); }
static int32_t rint_(rng *r, int32_t lo, int32_t hi) { // [lo, hi]
    return lo + (int32_t)(rnext(r) % (uint64_t)(hi - lo + 1));
}
static bool rprob(rng *r, double p) { return (double)(rnext(r) >> 11) * 0x1.0p-53 < p; }

// ---------------------------------------------------------------------------
// The model: next token from the history, the seed and the sample counter

static uint64_t ctx_step(uint64_t h, int32_t tok, int32_t pos) {
    return mix64(h ^ ((uint64_t)(uint32_t)tok * 0x9e3779b97f4a7c15ull + (uint64_t)pos));
}

static bool banned(int32_t t, int32_t eos, const pg_sampling_params *sp) {
    if (eos >= 0 && t == eos) return true;
    for (int32_t i = 0; i < sp->n_stop_ids; i++)
        if (t == sp->stop_ids[i]) return true;
    return false;
}

static int32_t draw(uint64_t ctx, uint64_t seed, int32_t g, bool mask, int32_t eos,
                    const pg_sampling_params *sp) {
    int32_t t = (int32_t)(mix64(ctx ^ mix64(seed) ^ ((uint64_t)g << 40)) % VOCAB);
    if (mask)
        while (banned(t, eos, sp)) t = (t + 1) % VOCAB;
    return t;
}

// ---------------------------------------------------------------------------
// Simulated requests and their reference outputs

typedef struct sim_seq {
    int32_t out[MAX_OUT]; // tokens received in events
    int32_t n_out;
    bool finished;
    sched_finish_reason finish;
    int32_t stop_token;
    bool finish_requested; // sched_finish_seq sent
    uint64_t seed;         // seen in plans (unseeded requests)
    bool seed_known;
} sim_seq;

typedef struct sim_req {
    int64_t id;
    int32_t prompt[MAX_PROMPT];
    int32_t n_prompt;
    pg_sampling_params sp;
    int32_t priority;
    int64_t arrival;
    int state; // 0 new, 1 live, 2 done, 3 rejected
    bool abort_sent;
    int64_t submit_step, first_sched_step, last_sched_step, max_gap;
    sim_seq seqs[MAX_N];
} sim_req;

// Reference run of one sequence (seeded `seed`) without any scheduler: its
// output and how it ends.
static int32_t reference(const sim_req *r, uint64_t seed, int32_t max_model_len, int32_t *out,
                         sched_finish_reason *fin, int32_t *stop_token) {
    const pg_sampling_params *sp = &r->sp;
    int32_t eos = sp->ignore_eos ? -1 : EOS;
    uint64_t h = 0;
    for (int32_t p = 0; p < r->n_prompt; p++) h = ctx_step(h, r->prompt[p], p);
    int32_t n = 0, len = r->n_prompt;
    *stop_token = -1;
    for (;;) {
        int32_t t = draw(h, seed, n, n < sp->min_tokens, eos, sp);
        out[n++] = t;
        h = ctx_step(h, t, len++);
        if (n >= sp->min_tokens && (t == eos || banned(t, -1, sp))) {
            *fin = SCHED_FINISH_STOP;
            *stop_token = t;
            return n;
        }
        if (n >= sp->max_tokens || len >= max_model_len) {
            *fin = SCHED_FINISH_LENGTH;
            return n;
        }
    }
}

// ---------------------------------------------------------------------------
// The fake runner with a simulated KV cache

typedef struct kv_slot {
    int32_t tok, pos;
} kv_slot;

typedef struct runner {
    int32_t bs, n_blocks, n_host;
    int32_t groups;                       // KV layer groups (1: one table)
    int32_t window[KVP_MAX_GROUPS];       // group g's window (0: full)
    kv_slot *dev;   // [n_blocks * bs]
    kv_slot *host;  // [n_host * bs]
    int64_t *stamp; // [n_blocks * bs] step that last wrote the slot
    // Outputs of the last two steps: under async scheduling a step's output
    // is read after the next step ran, and that step's PG_TOKEN_PENDING
    // inputs come from it (as a real runner takes them from the device).
    pg_seq_output outs[2][256];
    int32_t n_outs[2];
    int32_t cur;
} runner;

// The token a PG_TOKEN_PENDING input stands for: what this sequence sampled
// in the previous step.
static int32_t pending_token(const runner *rn, int64_t seq_id) {
    const int32_t prev = rn->cur ^ 1;
    for (int32_t i = 0; i < rn->n_outs[prev]; i++)
        if (rn->outs[prev][i].seq_id == seq_id) return rn->outs[prev][i].token;
    fail_msg("seq %lld: pending token but no output in the previous step", (long long)seq_id);
    return -1;
}

static void copy_block(kv_slot *dst, int32_t to, const kv_slot *src, int32_t from, int32_t bs) {
    memcpy(dst + (size_t)to * (size_t)bs, src + (size_t)from * (size_t)bs,
           sizeof(kv_slot) * (size_t)bs);
}

static kv_slot *slot(runner *rn, const pg_plan_seq *ps, int32_t pos, int32_t g) {
    int32_t b = ps->block_table[(size_t)(pos / rn->bs) * (size_t)rn->groups + (size_t)g];
    if (b <= 0 || b >= rn->n_blocks)
        fail_msg("seq %lld: block id %d (position %d, group %d)", (long long)ps->seq_id, b, pos, g);
    return &rn->dev[(size_t)b * (size_t)rn->bs + (size_t)(pos % rn->bs)];
}

static void swap_out_range(runner *rn, const pg_batch_plan *p, int32_t from, int32_t to) {
    for (int32_t i = from; i < to; i++) {
        assert_true(p->swap_out[i].from > 0 && p->swap_out[i].from < rn->n_blocks);
        assert_true(p->swap_out[i].to >= 0 && p->swap_out[i].to < rn->n_host);
        copy_block(rn->host, p->swap_out[i].to, rn->dev, p->swap_out[i].from, rn->bs);
    }
}

static void runner_execute(runner *rn, const pg_batch_plan *p, int64_t step, pg_step_output *out) {
    // The host tier's copies ahead (the last n_swap_out_ahead swap-outs)
    // may run at any time before the next plan's moves: first in even
    // steps, after the forward's writes in odd ones (as a copy stream
    // beside the forward would, at either end).
    const int32_t n_own = p->n_swap_out - p->n_swap_out_ahead;
    const bool ahead_last = step & 1;
    assert_true(p->n_swap_out_ahead >= 0 && n_own >= 0);
    if (!ahead_last) swap_out_range(rn, p, n_own, p->n_swap_out);
    swap_out_range(rn, p, 0, n_own);
    for (int32_t i = 0; i < p->n_swap_in; i++) {
        assert_true(p->swap_in[i].from >= 0 && p->swap_in[i].from < rn->n_host);
        assert_true(p->swap_in[i].to > 0 && p->swap_in[i].to < rn->n_blocks);
        copy_block(rn->dev, p->swap_in[i].to, rn->host, p->swap_in[i].from, rn->bs);
    }
    for (int32_t i = 0; i < p->n_copies; i++) {
        assert_true(p->copies[i].from > 0 && p->copies[i].to > 0);
        copy_block(rn->dev, p->copies[i].to, rn->dev, p->copies[i].from, rn->bs);
    }
    // Sequences run one at a time, in a random order: each writes its tokens
    // and then reads its whole context back, like a runner that does not
    // batch all cache writes before attention. A block handed to a reader
    // before its writer ran (a same-step prefix hit) shows up here.
    int32_t order[256];
    for (int32_t i = 0; i < p->n_seqs; i++) order[i] = i;
    for (int32_t i = p->n_seqs - 1; i > 0; i--) {
        int32_t j = (int32_t)(mix64((uint64_t)step * 1000003u + (uint64_t)i) % (uint64_t)(i + 1));
        int32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    int32_t sample_slot[256], n_sample = 0;
    for (int32_t i = 0; i < p->n_seqs; i++)
        if (p->seqs[i].sample) sample_slot[i] = n_sample++;
    rn->cur ^= 1;
    rn->n_outs[rn->cur] = n_sample;
    out->n = n_sample;
    out->outs = rn->outs[rn->cur];
    for (int32_t oi = 0; oi < p->n_seqs; oi++) {
        const pg_plan_seq *ps = &p->seqs[order[oi]];
        int32_t end = ps->start_pos + ps->n_tokens, fed = -1;
        for (int32_t k = 0; k < ps->n_tokens; k++) {
            int32_t tok = ps->tokens[k];
            if (tok == PG_TOKEN_PENDING) {
                if (ps->n_tokens != 1 || end != ps->n_history)
                    fail_msg("seq %lld: a pending token outside a decode entry", (long long)ps->seq_id);
                tok = fed = pending_token(rn, ps->seq_id);
            }
            for (int32_t g = 0; g < rn->groups; g++) {
                kv_slot *s = slot(rn, ps, ps->start_pos + k, g);
                int64_t *st = &rn->stamp[s - rn->dev];
                if (*st == step) fail_msg("slot written twice in step %lld", (long long)step);
                *st = step;
                *s = (kv_slot){tok, ps->start_pos + k};
            }
        }
        uint64_t h = 0;
        for (int32_t g = 0; g < rn->groups; g++) {
            // What the entry's first query sees onwards: a windowed group
            // only its window, whose blocks must all be there.
            const int32_t w = rn->window[g], lo = w > 0 && ps->start_pos - w + 1 > 0 ? ps->start_pos - w + 1 : 0;
            for (int32_t pos = lo; pos < end; pos++) {
                const kv_slot *s = slot(rn, ps, pos, g);
                int32_t want = ps->history[pos] == PG_TOKEN_PENDING && pos == end - 1 ? fed : ps->history[pos];
                if (s->tok != want || s->pos != pos)
                    fail_msg("seq %lld: KV at %d (group %d) holds (%d, %d), history has %d (step %lld)",
                             (long long)ps->seq_id, pos, g, s->tok, s->pos, want, (long long)step);
                if (g == 0) h = ctx_step(h, s->tok, pos);
            }
        }
        if (!ps->sample) continue;
        pg_seq_output *o = &rn->outs[rn->cur][sample_slot[order[oi]]]; // outputs in plan order
        memset(o, 0, sizeof *o);
        o->seq_id = ps->seq_id;
        o->token = draw(h, ps->rng_seed, ps->n_generated, ps->mask_eos, ps->eos_id, ps->sp);
        o->logprob = -1.0f;
    }
    if (ahead_last) swap_out_range(rn, p, n_own, p->n_swap_out);
}

// ---------------------------------------------------------------------------
// One simulation run

typedef struct sim_config {
    const char *name;
    uint64_t seed;
    int32_t n_requests;
    sched_config sc;
    double p_abort, p_abort_in_flight, p_finish_seq;
    int32_t max_concurrency;
    bool async; // plan step N+1 before resolving step N (sched_advance / sched_resolve)
} sim_config;

typedef struct sim_result {
    uint64_t digest;
    int64_t steps;
    sched_stats st;
    int64_t max_wait;
    int32_t n_rejected, n_done, n_aborts_in_flight, n_first_sched;
    int64_t n_sync; // async: steps resolved before planning the next
} sim_result;

typedef struct sim {
    const sim_config *cfg;
    rng r;
    sched *s;
    runner rn;
    sim_req *reqs;
    int32_t n_submitted, n_live;
    int64_t step, clock;
    int32_t system[N_SYSTEM][SYSTEM_LEN];
    int64_t *live_ids; // [n_live] submitted and not finished
    uint64_t digest;
    sim_result res;
    int64_t last_first_sched_key; // FCFS: first schedules in arrival order
} sim;

static int64_t sim_clock(void *ctx) { return ((sim *)ctx)->clock; }

static int64_t blocks_needed(int32_t bs, int32_t p, int32_t m, int32_t n) {
    int64_t shared = (p - 1) / bs;
    return shared + (int64_t)n * ((p + m - 1 + bs - 1) / bs - shared);
}

static void make_request(sim *m, sim_req *q, int64_t id) {
    rng *r = &m->r;
    memset(q, 0, sizeof *q);
    q->id = id;
    if (id > 0 && rprob(r, 0.05)) { // the same prompt again (a retry): whole-prompt hits
        const sim_req *o = q - 1 - rint_(r, 0, id > 20 ? 19 : (int32_t)id - 1);
        memcpy(q->prompt, o->prompt, sizeof q->prompt);
        q->n_prompt = o->n_prompt;
    }
    int32_t kind = q->n_prompt ? -1 : rint_(r, 0, 9);
    int32_t n = q->n_prompt;
    if (kind >= 0 && kind < 4) { // shares a system prompt
        int32_t sys = rint_(r, 0, N_SYSTEM - 1), k = rint_(r, 8, SYSTEM_LEN);
        for (; n < k; n++) q->prompt[n] = m->system[sys][n];
    }
    int32_t extra = kind < 0    ? 0
                    : kind == 9 ? rint_(r, 40, MAX_PROMPT - SYSTEM_LEN)
                                : rint_(r, 1, 24);
    for (int32_t i = 0; i < extra && n < MAX_PROMPT; i++) q->prompt[n++] = rint_(r, 1, VOCAB - 1);
    q->n_prompt = n;
    pg_sampling_params *sp = &q->sp;
    pg_sampling_params_default(sp);
    sp->max_tokens = rprob(r, 0.2) ? rint_(r, 1, 4) : rint_(r, 1, 64);
    if (rprob(r, 0.03)) sp->max_tokens = 150; // often beyond max_model_len or the pool
    sp->n = rprob(r, 0.25) ? rint_(r, 2, MAX_N) : 1;
    sp->min_tokens = rprob(r, 0.2) ? rint_(r, 0, sp->max_tokens) : 0;
    sp->ignore_eos = rprob(r, 0.1);
    // The fake runner ignores penalties; under async scheduling they make
    // the engine resolve before planning (sched_can_run_ahead).
    if (m->cfg->async && rprob(r, 0.03)) sp->presence_penalty = 0.5f;
    if (rprob(r, 0.3)) {
        sp->n_stop_ids = rint_(r, 1, 2);
        for (int32_t i = 0; i < sp->n_stop_ids; i++) sp->stop_ids[i] = rint_(r, 1, VOCAB - 1);
    }
    sp->has_seed = rprob(r, 0.8);
    sp->seed = rnext(r);
    q->priority = rint_(r, 0, 3);
    q->arrival = m->clock;
    for (int32_t i = 0; i < MAX_N; i++) q->seqs[i].stop_token = -1;
}

static bool expect_reject(const sim *m, const sim_req *q) {
    const sched_config *c = &m->cfg->sc;
    if (q->n_prompt + q->sp.max_tokens > c->max_model_len) return true;
    int64_t need = blocks_needed(c->block_size, q->n_prompt, q->sp.max_tokens, q->sp.n);
    if (c->kv_groups > 1) {
        // Per group (scheduler/sched.c): a full group shares the prompt's
        // full blocks among the samples; a windowed one holds its window
        // and a step's tokens for each sample. Admitted requests must then
        // run to the end here, so this is no under-count.
        kvp_config kc;
        kvp_config_default(&kc);
        kc.block_size = c->block_size;
        kc.n_groups = c->kv_groups;
        memcpy(kc.group_window, c->kv_group_window, sizeof kc.group_window);
        const int64_t len = q->n_prompt + q->sp.max_tokens - 1, shared = (q->n_prompt - 1) / c->block_size;
        need = 0;
        for (int32_t g = 0; g < c->kv_groups; g++) {
            const int64_t held = kvp_config_group_blocks_for(&kc, g, len, c->max_num_batched_tokens);
            need += c->kv_group_window[g] > 0 ? q->sp.n * held : shared + q->sp.n * (held - shared);
        }
    }
    if (need > c->num_blocks - 1) return true;
    if (!c->enable_chunked_prefill &&
        q->n_prompt + q->sp.max_tokens - 1 > c->max_num_batched_tokens)
        return true;
    return q->sp.n > c->max_num_seqs;
}

static void submit(sim *m) {
    sim_req *q = &m->reqs[m->n_submitted];
    make_request(m, q, m->n_submitted);
    m->n_submitted++;
    sched_request in = {q->id, q->prompt, q->n_prompt, &q->sp, q->priority, q->arrival, EOS, q, 0, 0};
    int rc = sched_add_request(m->s, &in);
    if (expect_reject(m, q)) {
        if (rc != PG_EINVAL) fail_msg("request %lld should be rejected", (long long)q->id);
        q->state = 3;
        m->res.n_rejected++;
        return;
    }
    if (rc) fail_msg("request %lld rejected: %s", (long long)q->id, pg_err_msg());
    q->state = 1;
    q->submit_step = m->step;
    q->first_sched_step = -1;
    q->last_sched_step = m->step;
    m->live_ids[m->n_live++] = q->id;
}

static void check(sim *m) {
    if (sched_check(m->s))
        fail_msg("%s step %lld: %s", m->cfg->name, (long long)m->step, pg_err_msg());
}

// Validates a finished request against the reference.
static void validate_done(sim *m, sim_req *q) {
    int32_t ref[MAX_OUT + 1];
    for (int32_t i = 0; i < q->sp.n; i++) {
        sim_seq *z = &q->seqs[i];
        if (!z->finished) fail_msg("request %lld seq %d not finished", (long long)q->id, i);
        uint64_t seed = q->sp.has_seed ? q->sp.seed + (uint64_t)i : z->seed;
        if (!q->sp.has_seed && !z->seed_known && z->n_out > 0)
            fail_msg("request %lld: output without a seen seed", (long long)q->id);
        sched_finish_reason fin;
        int32_t stop;
        int32_t n_ref = reference(q, seed, m->cfg->sc.max_model_len, ref, &fin, &stop);
        if (z->n_out > n_ref)
            fail_msg("request %lld seq %d: %d tokens > reference %d", (long long)q->id, i, z->n_out,
                     n_ref);
        for (int32_t k = 0; k < z->n_out; k++)
            if (z->out[k] != ref[k])
                fail_msg("request %lld seq %d token %d: %d, reference %d (%s)", (long long)q->id, i,
                         k, z->out[k], ref[k], m->cfg->name);
        // Cut short (abort, stop string) or natural end, never anything else.
        bool natural = z->n_out == n_ref && z->finish == fin && z->stop_token == stop;
        bool aborted = q->abort_sent && z->finish == SCHED_FINISH_ABORT;
        bool stopped = z->finish_requested && z->finish == SCHED_FINISH_STOP && z->stop_token == -1;
        if (!natural && !aborted && !stopped)
            fail_msg("request %lld seq %d: %d tokens finish %d stop %d, reference %d %d %d%s%s",
                     (long long)q->id, i, z->n_out, (int)z->finish, z->stop_token, n_ref, (int)fin,
                     stop, q->abort_sent ? " (aborted)" : "", z->finish_requested ? " (cut)" : "");
    }
    q->state = 2;
    m->res.n_done++;
    for (int32_t k = 0; k < m->n_live; k++)
        if (m->live_ids[k] == q->id) {
            m->live_ids[k] = m->live_ids[--m->n_live];
            break;
        }
}

static void process_events(sim *m, const sched_events *ev) {
    for (int32_t k = 0; k < ev->n; k++) {
        const sched_event *e = &ev->ev[k];
        if (e->req_id < 0 || e->req_id >= m->n_submitted) fail_msg("event for unknown request");
        sim_req *q = &m->reqs[e->req_id];
        if (q->state != 1)
            fail_msg("event for request %lld in state %d", (long long)q->id, q->state);
        if (e->owner != q) fail_msg("event of request %lld without its owner", (long long)q->id);
        if (e->req_finished && sched_request_owner(m->s, q->id))
            fail_msg("request %lld: owner still handed out after its last event", (long long)q->id);
        if (e->seq_index < 0 || e->seq_index >= q->sp.n) fail_msg("bad seq index");
        sim_seq *z = &q->seqs[e->seq_index];
        if (z->finished) fail_msg("event after finish (request %lld)", (long long)q->id);
        if (e->has_token) {
            if (z->n_out >= MAX_OUT || z->n_out >= q->sp.max_tokens) fail_msg("too many tokens");
            if (e->out.seq_id != q->id * SCHED_MAX_N + e->seq_index) fail_msg("event seq id");
            z->out[z->n_out++] = e->out.token;
        }
        if (e->n_generated != z->n_out)
            fail_msg("request %lld: n_generated %d, received %d", (long long)q->id, e->n_generated,
                     z->n_out);
        if (e->finish != SCHED_FINISH_NONE) {
            z->finished = true;
            z->finish = e->finish;
            z->stop_token = e->stop_token;
        }
        m->digest = mix64(m->digest ^ (uint64_t)e->req_id * 31 ^ (uint64_t)e->seq_index * 7 ^
                          (uint64_t)(e->has_token ? e->out.token : -1) << 8 ^ (uint64_t)e->finish);
        const sched_usage *u = &e->usage;
        if (u->prompt_tokens != q->n_prompt || u->arrival_ns != q->arrival)
            fail_msg("usage prompt/arrival");
        if (u->first_scheduled_ns && u->first_scheduled_ns < u->arrival_ns) fail_msg("usage time");
        if (u->first_token_ns && u->first_token_ns < u->first_scheduled_ns) fail_msg("usage time");
        if (e->req_finished) {
            int32_t total = 0;
            for (int32_t i = 0; i < q->sp.n; i++) total += q->seqs[i].n_out;
            if (u->completion_tokens != total) fail_msg("usage completion tokens");
            if (u->finish_ns < u->first_token_ns) fail_msg("usage finish time");
            validate_done(m, q);
        } else {
            bool all = true;
            for (int32_t i = 0; i < q->sp.n; i++) all &= q->seqs[i].finished;
            if (all)
                fail_msg("request %lld: all sequences done, no req_finished", (long long)q->id);
        }
    }
}

// Random aborts and early finishes (stop strings) on live requests.
static void poke(sim *m, double p_abort, double p_finish) {
    if (m->n_live == 0) return;
    if (rprob(&m->r, p_abort)) {
        sim_req *q = &m->reqs[m->live_ids[rint_(&m->r, 0, m->n_live - 1)]];
        // A request whose every sequence was finished (sched_finish_seq) may
        // be gone from the scheduler before its events arrive: the engine's
        // abort then finds nothing, so the sim does not send one.
        bool all_cut = true;
        for (int32_t i = 0; i < q->sp.n; i++) all_cut &= q->seqs[i].finish_requested || q->seqs[i].finished;
        if (!q->abort_sent && !all_cut) {
            if (sched_abort(m->s, q->id))
                fail_msg("abort %lld: %s", (long long)q->id, pg_err_msg());
            q->abort_sent = true;
        }
    }
    if (rprob(&m->r, p_finish)) {
        sim_req *q = &m->reqs[m->live_ids[rint_(&m->r, 0, m->n_live - 1)]];
        int32_t i = rint_(&m->r, 0, q->sp.n - 1);
        sim_seq *z = &q->seqs[i];
        if (!q->abort_sent && !z->finished && !z->finish_requested) {
            if (sched_finish_seq(m->s, q->id, i, SCHED_FINISH_STOP))
                fail_msg("finish_seq: %s", pg_err_msg());
            z->finish_requested = true;
        }
    }
    check(m);
}

// Plan shape and budgets; sequence-level checks against what the sim knows.
static void check_plan(sim *m, const pg_batch_plan *p) {
    const sched_config *c = &m->cfg->sc;
    if (p->n_tokens > c->max_num_batched_tokens) fail_msg("token budget exceeded");
    if (p->n_seqs > c->max_num_seqs) fail_msg("sequence cap exceeded");
    int32_t sum = 0;
    for (int32_t i = 0; i < p->n_seqs; i++) {
        const pg_plan_seq *ps = &p->seqs[i];
        sum += ps->n_tokens;
        int64_t id = ps->seq_id / SCHED_MAX_N;
        int32_t idx = (int32_t)(ps->seq_id % SCHED_MAX_N);
        if (id < 0 || id >= m->n_submitted) fail_msg("plan: unknown request");
        sim_req *q = &m->reqs[id];
        sim_seq *z = &q->seqs[idx];
        if (q->state != 1 || z->finished) fail_msg("plan: finished sequence scheduled");
        for (int32_t j = 0; j < i; j++)
            if (p->seqs[j].seq_id == ps->seq_id) fail_msg("plan: sequence twice");
        if (ps->n_tokens < 1) fail_msg("plan: empty entry");
        int32_t end = ps->start_pos + ps->n_tokens;
        if (ps->n_blocks != (end + c->block_size - 1) / c->block_size) fail_msg("plan: n_blocks");
        if (p->kv_groups != (c->kv_groups > 1 ? c->kv_groups : 1)) fail_msg("plan: kv_groups");
        // Async: the token sampled in the step before may still be pending
        // (the sim has not seen its event): one more history entry.
        int32_t extra = ps->n_history - q->n_prompt - z->n_out;
        if (extra < 0 || extra > (m->cfg->async ? 1 : 0))
            fail_msg("plan: history length (request %lld)", (long long)id);
        if (extra && (ps->history[ps->n_history - 1] != PG_TOKEN_PENDING || ps->n_tokens != 1 ||
                      ps->start_pos != ps->n_history - 1))
            fail_msg("plan: pending token misplaced (request %lld)", (long long)id);
        if (ps->n_prompt != q->n_prompt || ps->n_generated != z->n_out + extra)
            fail_msg("plan: generated count (request %lld)", (long long)id);
        if (memcmp(ps->history, q->prompt, sizeof(int32_t) * (size_t)q->n_prompt) ||
            memcmp(ps->history + q->n_prompt, z->out, sizeof(int32_t) * (size_t)z->n_out))
            fail_msg("plan: history content (request %lld)", (long long)id);
        if (ps->tokens != ps->history + ps->start_pos || end > ps->n_history)
            fail_msg("plan: tokens");
        if (ps->sample != (end == ps->n_history)) fail_msg("plan: sample flag");
        if (ps->mask_eos != (z->n_out + extra < q->sp.min_tokens)) fail_msg("plan: mask_eos");
        if (ps->eos_id != (q->sp.ignore_eos ? -1 : EOS)) fail_msg("plan: eos_id");
        if (q->sp.has_seed && ps->rng_seed != q->sp.seed + (uint64_t)idx) fail_msg("plan: seed");
        if (z->seed_known && z->seed != ps->rng_seed) fail_msg("plan: seed changed");
        z->seed = ps->rng_seed;
        z->seed_known = true;
        if (q->first_sched_step < 0) {
            q->first_sched_step = m->step;
            m->res.n_first_sched++;
            // Head-of-line: first schedules follow the queue's key order.
            int64_t key = (c->policy == SCHED_POLICY_PRIORITY ? 0 : q->arrival);
            if (c->policy == SCHED_POLICY_FCFS && key < m->last_first_sched_key)
                fail_msg("request %lld overtaken", (long long)id);
            if (key > m->last_first_sched_key) m->last_first_sched_key = key;
        }
        int64_t gap = m->step - q->last_sched_step;
        if (gap > q->max_gap) q->max_gap = gap;
        q->last_sched_step = m->step;
    }
    if (sum != p->n_tokens) fail_msg("plan: n_tokens");
}

static void run_sim(const sim_config *cfg, sim_result *res) {
    sim *m = calloc(1, sizeof *m);
    m->cfg = cfg;
    m->r.s = cfg->seed;
    m->clock = 1;
    sched_config sc = cfg->sc;
    sc.now_ns = sim_clock;
    sc.now_ctx = m;
    if (sched_create(&sc, &m->s)) fail_msg("sched_create: %s", pg_err_msg());
    m->reqs = calloc((size_t)cfg->n_requests, sizeof(sim_req));
    m->live_ids = calloc((size_t)cfg->n_requests, sizeof(int64_t));
    m->rn.bs = sc.block_size;
    m->rn.n_blocks = sc.num_blocks;
    m->rn.n_host = sc.num_host_blocks;
    m->rn.groups = sc.kv_groups > 1 ? sc.kv_groups : 1;
    memcpy(m->rn.window, sc.kv_group_window, sizeof m->rn.window);
    m->rn.dev = malloc(sizeof(kv_slot) * (size_t)sc.num_blocks * (size_t)sc.block_size);
    m->rn.host = malloc(sizeof(kv_slot) * (size_t)(sc.num_host_blocks + 1) * (size_t)sc.block_size);
    m->rn.stamp = calloc((size_t)sc.num_blocks * (size_t)sc.block_size, sizeof(int64_t));
    memset(m->rn.dev, 0xff, sizeof(kv_slot) * (size_t)sc.num_blocks * (size_t)sc.block_size);
    for (int32_t i = 0; i < N_SYSTEM; i++)
        for (int32_t j = 0; j < SYSTEM_LEN; j++) m->system[i][j] = rint_(&m->r, 1, VOCAB - 1);
    m->last_first_sched_key = INT64_MIN;

    int32_t concurrency = cfg->max_concurrency;
    bool pending = false; // async: an advanced step awaits sched_resolve
    pg_step_output prev_out = {0};
    while (m->n_submitted < cfg->n_requests || m->n_live > 0 || pending) {
        if (pending && m->n_submitted == cfg->n_requests && m->n_live == 0) {
            sched_events ev; // the last step planned nothing: only its resolve is left
            if (sched_resolve(m->s, &prev_out, &ev)) fail_msg("resolve: %s", pg_err_msg());
            process_events(m, &ev);
            pending = false;
            continue;
        }
        m->step++;
        m->clock += 1000;
        if (m->step > 200000) fail_msg("%s: no progress", cfg->name);
        if (m->step % 97 == 0) concurrency = rint_(&m->r, 2, cfg->max_concurrency); // bursts
        int32_t arrivals = rint_(&m->r, 0, 3);
        for (int32_t a = 0;
             a < arrivals && m->n_live < concurrency && m->n_submitted < cfg->n_requests; a++) {
            submit(m);
            check(m);
        }
        poke(m, cfg->p_abort, cfg->p_finish_seq);
        const pg_batch_plan *p;
        if (sched_step(m->s, &p)) fail_msg("step: %s", pg_err_msg());
        check(m);
        int32_t first_before = m->res.n_first_sched;
        check_plan(m, p);
        sched_stats st;
        sched_stats_get(m->s, &st);
        // Swapped requests come back before any new one is admitted.
        if (st.n_swapped > 0 && m->res.n_first_sched != first_before)
            fail_msg("%s: admitted while a request is swapped", cfg->name);
        pg_step_output out;
        runner_execute(&m->rn, p, m->step, &out);
        // Aborts and finishes while the plan is in flight.
        if (p->n_seqs && rprob(&m->r, cfg->p_abort_in_flight)) {
            int64_t id = p->seqs[rint_(&m->r, 0, p->n_seqs - 1)].seq_id / SCHED_MAX_N;
            if (!m->reqs[id].abort_sent) {
                if (sched_abort(m->s, id)) fail_msg("abort in flight: %s", pg_err_msg());
                m->reqs[id].abort_sent = true;
                m->res.n_aborts_in_flight++;
            }
        }
        poke(m, 0, cfg->p_finish_seq);
        sched_events ev;
        if (!cfg->async) {
            if (sched_update(m->s, &out, &ev)) fail_msg("update: %s", pg_err_msg());
            check(m);
            process_events(m, &ev);
            continue;
        }
        // Async: this step has run; now the previous one's tokens arrive,
        // then this one is advanced and the next is planned before its
        // tokens are known (unless a penalty needs them).
        if (pending) {
            if (sched_resolve(m->s, &prev_out, &ev)) fail_msg("resolve: %s", pg_err_msg());
            check(m);
            process_events(m, &ev);
        }
        if (sched_advance(m->s)) fail_msg("advance: %s", pg_err_msg());
        check(m);
        prev_out = out;
        pending = true;
        if (!sched_can_run_ahead(m->s) || rprob(&m->r, 0.05)) {
            m->res.n_sync++;
            if (sched_resolve(m->s, &prev_out, &ev)) fail_msg("resolve: %s", pg_err_msg());
            check(m);
            process_events(m, &ev);
            pending = false;
        }
    }
    if (pending) fail_msg("%s: a step left unresolved", cfg->name);
    for (int32_t i = 0; i < cfg->n_requests; i++) {
        sim_req *q = &m->reqs[i];
        if (q->state != 2 && q->state != 3) fail_msg("request %d never finished", i);
        if (q->state == 2 && q->max_gap > res->max_wait) res->max_wait = q->max_gap;
        if (q->state == 2 && q->first_sched_step >= 0 &&
            q->first_sched_step - q->submit_step > res->max_wait)
            res->max_wait = q->first_sched_step - q->submit_step;
    }
    sched_stats_get(m->s, &res->st);
    if (res->st.kv.num_free != sc.num_blocks - 1 || res->st.kv.num_host_free != sc.num_host_blocks)
        fail_msg("%s: blocks leaked at the end", cfg->name);
    assert_false(sched_has_work(m->s));
    res->digest = m->digest;
    res->steps = m->step;
    res->n_rejected = m->res.n_rejected;
    res->n_done = m->res.n_done;
    res->n_aborts_in_flight = m->res.n_aborts_in_flight;
    res->n_sync = m->res.n_sync;
    sched_destroy(m->s);
    free(m->reqs);
    free(m->live_ids);
    free(m->rn.dev);
    free(m->rn.host);
    free(m->rn.stamp);
    free(m);
}

// ---------------------------------------------------------------------------
// Configurations

static void base(sim_config *c, const char *name, uint64_t seed) {
    memset(c, 0, sizeof *c);
    c->name = name;
    c->seed = seed;
    c->n_requests = 2500;
    sched_config_default(&c->sc);
    c->sc.block_size = 8;
    c->sc.num_blocks = 48;      // 47 usable blocks = 376 tokens: constant pressure
    c->sc.num_host_blocks = 24; // swap space smaller than demand: fallback happens too
    c->sc.max_model_len = 180;
    c->sc.max_num_batched_tokens = 48;
    c->sc.max_num_seqs = 16;
    c->sc.seed = seed;
    c->p_abort = 0.02;
    c->p_abort_in_flight = 0.02;
    c->p_finish_seq = 0.02;
    c->max_concurrency = 24;
}

static void print_result(const sim_config *c, const sim_result *r) {
    print_message("%-28s steps %6lld done %4d rej %3d abort %3lld (in flight %3d) preempt "
                  "recompute %4lld swap %4lld cow %4lld hits %5lld/%6lld max wait %lld\n",
                  c->name, (long long)r->steps, r->n_done, r->n_rejected,
                  (long long)r->st.n_aborted, r->n_aborts_in_flight,
                  (long long)r->st.n_preempt_recompute, (long long)r->st.n_preempt_swap,
                  (long long)r->st.n_cow_copies, (long long)r->st.kv.prefix_hits,
                  (long long)r->st.kv.prefix_queries, (long long)r->max_wait);
}

// Bound on the steps an FCFS request waits (before its first step or
// between two steps): nobody overtakes it, fewer than max_concurrency live
// requests are ahead of it, and each of those runs alone to completion
// within its prompt in chunks plus its longest output (150) steps.
static int64_t fcfs_wait_bound(const sim_config *c) {
    int64_t per =
        (c->sc.max_model_len + c->sc.max_num_batched_tokens - 1) / c->sc.max_num_batched_tokens;
    return (int64_t)c->max_concurrency * (per + 150);
}

static void test_sim_recompute_fcfs(void **state) {
    (void)state;
    sim_config c;
    base(&c, "recompute fcfs cache", 1);
    sim_result r = {0};
    run_sim(&c, &r);
    print_result(&c, &r);
    assert_true(r.st.n_preempt_recompute > 50);
    assert_true(r.st.n_cow_copies > 50);
    assert_true(r.st.kv.prefix_hits > 1000);
    assert_true(r.st.n_aborted > 20 && r.n_aborts_in_flight > 10);
    assert_true(r.n_rejected > 0);
    assert_true(r.max_wait <= fcfs_wait_bound(&c));
    // Reproducible: the same seed gives the same event stream.
    sim_result r2 = {0};
    run_sim(&c, &r2);
    assert_true(r.digest == r2.digest);
}

static void test_sim_swap_fcfs(void **state) {
    (void)state;
    sim_config c;
    base(&c, "swap fcfs cache", 2);
    c.sc.preemption_mode = SCHED_PREEMPT_SWAP;
    sim_result r = {0};
    run_sim(&c, &r);
    print_result(&c, &r);
    assert_true(r.st.n_preempt_swap > 50);
    assert_true(r.st.n_swap_in_blocks > 100);
    assert_true(r.st.n_preempt_recompute > 0); // host full: fallback
    assert_true(r.max_wait <= fcfs_wait_bound(&c));
}

static void test_sim_priority_no_cache_no_chunking(void **state) {
    (void)state;
    sim_config c;
    base(&c, "recompute prio nocache nochunk", 3);
    c.sc.policy = SCHED_POLICY_PRIORITY;
    c.sc.enable_prefix_caching = false;
    c.sc.enable_chunked_prefill = false;
    c.sc.max_num_batched_tokens = 192; // whole histories in one step
    sim_result r = {0};
    run_sim(&c, &r);
    print_result(&c, &r);
    assert_true(r.st.n_preempt_recompute > 50);
    assert_int_equal(r.st.kv.prefix_hits, 0);
}

static void test_sim_swap_priority_threshold(void **state) {
    (void)state;
    sim_config c;
    base(&c, "swap prio cache threshold", 4);
    c.sc.preemption_mode = SCHED_PREEMPT_SWAP;
    c.sc.policy = SCHED_POLICY_PRIORITY;
    c.sc.long_prefill_token_threshold = 16;
    c.sc.num_host_blocks = 64;
    c.sc.block_size = 4;
    c.sc.num_blocks = 96;
    sim_result r = {0};
    run_sim(&c, &r);
    print_result(&c, &r);
    assert_true(r.st.n_preempt_swap > 50);
}

// Async scheduling: every step is planned before the previous step's
// tokens are known (but where a penalty or the 5% random sync says
// otherwise); outputs must equal the reference exactly, as in the sync runs.
static void test_sim_async_recompute_fcfs(void **state) {
    (void)state;
    sim_config c;
    base(&c, "async recompute fcfs cache", 11);
    c.async = true;
    sim_result r = {0};
    run_sim(&c, &r);
    print_result(&c, &r);
    print_message("%-28s resolved before planning: %lld of %lld steps\n", c.name,
                  (long long)r.n_sync, (long long)r.steps);
    assert_true(r.st.n_preempt_recompute > 50);
    assert_true(r.st.kv.prefix_hits > 1000);
    assert_true(r.st.n_aborted > 20 && r.n_aborts_in_flight > 10);
    assert_true(r.n_sync > 0 && r.n_sync < r.steps / 2);
    assert_true(r.max_wait <= fcfs_wait_bound(&c));
    sim_result r2 = {0};
    run_sim(&c, &r2);
    assert_true(r.digest == r2.digest);
}

static void test_sim_async_swap_priority(void **state) {
    (void)state;
    sim_config c;
    base(&c, "async swap prio cache", 12);
    c.async = true;
    c.sc.preemption_mode = SCHED_PREEMPT_SWAP;
    c.sc.policy = SCHED_POLICY_PRIORITY;
    c.sc.long_prefill_token_threshold = 16;
    sim_result r = {0};
    run_sim(&c, &r);
    print_result(&c, &r);
    assert_true(r.st.n_preempt_swap > 50);
    assert_true(r.st.n_swap_in_blocks > 100);
}

// KV layer groups: a full group and two windowed ones (windows of 12 and 21
// positions over 4-token blocks), so blocks drop mid-prefill and mid-decode;
// prefix hits need only the windows' blocks; the pool is the same bytes as
// the runs above, in blocks a third the size.
static void groups(sim_config *c) {
    c->sc.block_size = 4;
    c->sc.num_blocks = 3 * 48;
    c->sc.num_host_blocks = 3 * 24;
    c->sc.kv_groups = 3;
    c->sc.kv_group_window[1] = 12;
    c->sc.kv_group_window[2] = 21;
}

static void test_sim_groups_recompute_fcfs(void **state) {
    (void)state;
    sim_config c;
    base(&c, "groups recompute fcfs cache", 21);
    groups(&c);
    sim_result r = {0};
    run_sim(&c, &r);
    print_result(&c, &r);
    assert_true(r.st.n_preempt_recompute > 50);
    assert_true(r.st.kv.prefix_hits > 1000);
    assert_true(r.st.n_cow_copies > 50);
    assert_true(r.max_wait <= fcfs_wait_bound(&c));
}

static void test_sim_groups_async_swap_priority(void **state) {
    (void)state;
    sim_config c;
    base(&c, "groups async swap prio cache", 22);
    groups(&c);
    c.async = true;
    c.sc.preemption_mode = SCHED_PREEMPT_SWAP;
    c.sc.policy = SCHED_POLICY_PRIORITY;
    c.sc.enable_host_kv_cache = true;
    sim_result r = {0};
    run_sim(&c, &r);
    print_result(&c, &r);
    assert_true(r.st.n_preempt_swap > 50);
    assert_true(r.st.n_swap_in_blocks > 100);
}

// The host tier copying ahead (PAGED_KV_OFFLOAD_AHEAD): the fake runner
// runs the copies ahead before the plan's moves or after its forward, under
// async scheduling, with swap preemption sharing the host blocks, and with
// layer groups.
static void test_sim_async_host_tier_ahead(void **state) {
    (void)state;
    for (int variant = 0; variant < 2; variant++) {
        sim_config c;
        base(&c, variant ? "groups async swap host tier ahead" : "async host tier ahead", 23 + variant);
        if (variant) groups(&c);
        c.async = true;
        c.sc.preemption_mode = variant ? SCHED_PREEMPT_SWAP : SCHED_PREEMPT_RECOMPUTE;
        c.sc.enable_host_kv_cache = true;
        c.sc.host_kv_ahead = true;
        sim_result r = {0};
        run_sim(&c, &r);
        print_result(&c, &r);
        print_message("  offloads %lld (%lld ahead), host hits %lld tokens\n", (long long)r.st.kv.offloads,
                      (long long)r.st.kv.offloads_ahead, (long long)r.st.kv.host_hits);
        assert_true(r.st.kv.offloads_ahead > 100 && r.st.kv.host_hits > 100);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sim_async_host_tier_ahead),
        cmocka_unit_test(test_sim_groups_recompute_fcfs),
        cmocka_unit_test(test_sim_groups_async_swap_priority),
        cmocka_unit_test(test_sim_async_recompute_fcfs),
        cmocka_unit_test(test_sim_async_swap_priority),
        cmocka_unit_test(test_sim_recompute_fcfs),
        cmocka_unit_test(test_sim_swap_fcfs),
        cmocka_unit_test(test_sim_priority_no_cache_no_chunking),
        cmocka_unit_test(test_sim_swap_priority_threshold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
