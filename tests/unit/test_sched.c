// tests/unit/test_sched.c - scheduler: token budget, chunked prefill,
// preemption (recompute and swap), priorities, abort in every state,
// parallel sampling, stop rules, admission rejection and the caller's
// per-request owners (sched_request.owner). Every step is followed by
// sched_check (ref counts = block holders, queues consistent).
#include "tests/unit/sched_test_util.h"

// ---------------------------------------------------------------------------
// Harness: a scheduler, a fake clock and a fake runner

typedef struct harness {
    sched *s;
    int64_t clock;
    const pg_batch_plan *plan;
    pg_seq_output outs[512];
    sched_events ev;
    pg_batch_plan last; // copy of the last plan's scalars (h_cycle)
    pg_plan_seq last_seqs[512];
} harness;

static int64_t fake_clock(void *ctx) { return *(int64_t *)ctx; }

static void base_config(sched_config *c) {
    sched_config_default(c);
    c->block_size = 4;
    c->num_blocks = 64;
    c->max_model_len = 1024;
    c->max_num_batched_tokens = 32;
    c->long_prefill_token_threshold = 0; // exact chunk sizes below; the cap has its own tests
    c->seed = 7;
}

static harness *h_new(const sched_config *c) {
    harness *h = calloc(1, sizeof *h);
    sched_config cc = *c;
    cc.now_ns = fake_clock;
    cc.now_ctx = &h->clock;
    h->clock = 1000;
    h->s = sched_t_create(&cc);
    return h;
}

static void h_free(harness *h) {
    sched_destroy(h->s);
    free(h);
}

static void h_check(harness *h) { sched_t_check(h->s); }

static const pg_batch_plan *h_step(harness *h) {
    h->clock += 10;
    sched_t_step(h->s, &h->plan);
    int32_t sum = 0;
    for (int32_t i = 0; i < h->plan->n_seqs; i++) sum += h->plan->seqs[i].n_tokens;
    assert_int_equal(sum, h->plan->n_tokens);
    return h->plan;
}

typedef int32_t (*token_fn)(const pg_plan_seq *ps, void *ctx);

typedef struct token_answer {
    token_fn fn;
    void *ctx;
} token_answer;

static void token_answer_fn(pg_seq_output *o, const pg_plan_seq *ps, void *ctx) {
    const token_answer *t = ctx;
    o->token = t->fn(ps, t->ctx);
    o->logprob = -0.5f;
}

// Answers every sampling entry of the plan with fn(entry) and updates (the
// clock 10 on; fn does not read it).
static const sched_events *h_update_fn(harness *h, token_fn fn, void *ctx) {
    h->clock += 10;
    token_answer t = {fn, ctx};
    return sched_t_update(h->s, h->plan, h->outs, &h->ev, token_answer_fn, &t);
}

static int32_t const_token(const pg_plan_seq *ps, void *ctx) {
    (void)ps;
    return *(int32_t *)ctx;
}

static const sched_events *h_update(harness *h, int32_t token) {
    return h_update_fn(h, const_token, &token);
}

// Runs step + update with `token` for every sample. Returns a copy of the
// plan whose scalar fields stay readable (its pointers do not).
static const pg_batch_plan *h_cycle(harness *h, int32_t token) {
    const pg_batch_plan *p = h_step(h);
    h->last = *p;
    memcpy(h->last_seqs, p->seqs, sizeof(pg_plan_seq) * (size_t)p->n_seqs);
    h->last.seqs = h->last_seqs;
    h_update(h, token);
    return &h->last;
}

typedef struct req_opts {
    int32_t n_prompt, max_tokens, n, min_tokens, priority, eos, base;
    bool ignore_eos;
    int32_t n_stop;
    int32_t stop[4];
    int64_t arrival;
    uint64_t seed;
    bool has_seed;
    void *owner; // sched_request.owner
} req_opts;

static int h_add(harness *h, int64_t id, req_opts o) {
    int32_t prompt[1024];
    for (int32_t i = 0; i < o.n_prompt; i++) prompt[i] = o.base + i;
    pg_sampling_params sp;
    pg_sampling_params_default(&sp);
    sp.max_tokens = o.max_tokens ? o.max_tokens : 16;
    sp.n = o.n ? o.n : 1;
    sp.min_tokens = o.min_tokens;
    sp.ignore_eos = o.ignore_eos;
    sp.n_stop_ids = o.n_stop;
    memcpy(sp.stop_ids, o.stop, sizeof(int32_t) * (size_t)o.n_stop);
    sp.seed = o.seed;
    sp.has_seed = o.has_seed;
    sched_request r = {
        .id = id,
        .prompt = prompt,
        .n_prompt = o.n_prompt,
        .sp = &sp,
        .priority = o.priority,
        .arrival_ns = o.arrival ? o.arrival : h->clock,
        .eos_id = o.eos ? o.eos : -1,
        .owner = o.owner,
    };
    int rc = sched_add_request(h->s, &r);
    h_check(h);
    return rc;
}

static const pg_plan_seq *find_seq(const pg_batch_plan *p, int64_t seq_id) {
    for (int32_t i = 0; i < p->n_seqs; i++)
        if (p->seqs[i].seq_id == seq_id) return &p->seqs[i];
    return NULL;
}

static const sched_event *find_ev(const sched_events *ev, int64_t req, int32_t idx) {
    for (int32_t i = 0; i < ev->n; i++)
        if (ev->ev[i].req_id == req && ev->ev[i].seq_index == idx) return &ev->ev[i];
    return NULL;
}

static int32_t free_blocks(harness *h) { return sched_t_free_blocks(h->s); }

static sched_stats stats(harness *h) {
    sched_stats st;
    sched_stats_get(h->s, &st);
    return st;
}

// Drives until nothing is left; returns steps taken.
static int drain(harness *h, int32_t token) {
    int n = 0;
    while (sched_has_work(h->s) && n < 10000) {
        h_cycle(h, token);
        n++;
    }
    assert_false(sched_has_work(h->s));
    return n;
}

// ---------------------------------------------------------------------------
// Admission

// KV layer groups (a full group and a window of 8 positions; 4-token
// blocks, steps of 32 tokens): n = 3 samples of a 65-token prompt with 64
// new tokens (128 positions at the longest). The full group holds 32 blocks
// a sequence, of which the prompt's 16 full ones are shared (16 + 3 * 16);
// the windowed one 11 a sequence ((8 - 1 + 32) / 4 + 1, its own): 97 in
// all, where counting every group whole per sequence said 3 * 43 = 129.
static void test_admission_groups_share_prompt_blocks(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    c.kv_groups = 2;
    c.kv_group_window[1] = 8;
    c.num_blocks = 98; // 97 usable
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 65, .max_tokens = 64, .n = 3}), 0);
    // One more new token each: 129 positions, one more full block each (33
    // a sequence), 100 blocks: refused, naming them.
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 65, .max_tokens = 65, .n = 3}), PG_EINVAL);
    assert_non_null(strstr(pg_err_msg(), "needs 100 KV blocks"));
    h_free(h);
}

static void test_config_validation(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    sched *s = NULL;
    c.max_model_len = 0;
    assert_int_equal(sched_create(&c, &s), PG_EINVAL);
    base_config(&c);
    c.num_blocks = 1;
    assert_int_equal(sched_create(&c, &s), PG_EINVAL);
    base_config(&c);
    c.max_num_batched_tokens = 0;
    assert_int_equal(sched_create(&c, &s), PG_EINVAL);
    assert_null(s);
}

static void test_admission_rejects_what_never_fits(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    c.num_blocks = 9; // 8 usable blocks of 4 = 32 tokens
    c.max_model_len = 40;
    c.max_waiting = 2;
    harness *h = h_new(&c);
    // prompt + max_tokens beyond max_model_len
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 30, .max_tokens = 11}), PG_EINVAL);
    assert_non_null(strstr(pg_err_msg(), "maximum context length is 40"));
    // more blocks than the whole pool: 20 + 20 - 1 = 39 tokens = 10 blocks
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 20, .max_tokens = 20}), PG_EINVAL);
    assert_non_null(strstr(pg_err_msg(), "KV blocks"));
    // fits alone: 17 + 16 - 1 = 32 tokens = 8 blocks
    assert_int_equal(h_add(h, 3, (req_opts){.n_prompt = 17, .max_tokens = 16}), 0);
    // n = 3 of that: 4 shared + 3 * 4 own = 16 blocks
    assert_int_equal(h_add(h, 4, (req_opts){.n_prompt = 17, .max_tokens = 16, .n = 3}), PG_EINVAL);
    // bad parameters
    assert_int_equal(h_add(h, 5, (req_opts){.n_prompt = 0}), PG_EINVAL);
    assert_int_equal(h_add(h, 5, (req_opts){.n_prompt = 4, .max_tokens = 4, .min_tokens = 5}),
                     PG_EINVAL);
    assert_int_equal(h_add(h, 5, (req_opts){.n_prompt = 4, .n = 257}), PG_EINVAL);
    assert_int_equal(h_add(h, -1, (req_opts){.n_prompt = 4}), PG_EINVAL);
    assert_int_equal(h_add(h, 3, (req_opts){.n_prompt = 4}), PG_EINVAL); // duplicate id
    assert_non_null(strstr(pg_err_msg(), "already live"));
    // queue full is PG_ENOSPC (a normal outcome), not PG_EINVAL
    assert_int_equal(h_add(h, 6, (req_opts){.n_prompt = 4, .max_tokens = 2}), 0);
    assert_int_equal(h_add(h, 7, (req_opts){.n_prompt = 4, .max_tokens = 2}), PG_ENOSPC);
    sched_stats st = stats(h);
    assert_int_equal(st.n_admitted, 2);
    assert_int_equal(st.n_rejected, 9);
    assert_int_equal(st.n_waiting, 2);
    drain(h, 1);
    h_free(h);
}

static void test_admission_chunked_prefill_off_limit(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    c.enable_chunked_prefill = false;
    harness *h = h_new(&c);
    // After a recompute preemption the whole history (prompt + output - 1)
    // must go in one step: 30 + 4 - 1 = 33 > 32.
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 30, .max_tokens = 4}), PG_EINVAL);
    assert_non_null(strstr(pg_err_msg(), "chunked prefill is off"));
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 29, .max_tokens = 4}), 0);
    drain(h, 1);
    h_free(h);
}

static void test_step_update_protocol(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    sched_events ev;
    assert_int_equal(sched_update(h->s, NULL, &ev), PG_EINVAL); // no plan
    assert_false(sched_has_work(h->s));
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 0);
    assert_int_equal(sched_step(h->s, &p), PG_EINVAL); // previous not updated
    h_update(h, 0);
    h_free(h);
}

// ---------------------------------------------------------------------------
// Budget and chunked prefill

static void test_chunked_prefill_splits_prompt(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 100, .max_tokens = 3, .base = 1000}), 0);
    for (int32_t k = 0; k < 3; k++) {
        const pg_batch_plan *p = h_step(h);
        assert_int_equal(p->n_seqs, 1);
        const pg_plan_seq *ps = &p->seqs[0];
        assert_int_equal(ps->seq_id, 256);
        assert_int_equal(ps->start_pos, 32 * k);
        assert_int_equal(ps->n_tokens, 32);
        assert_int_equal(ps->tokens[0], 1000 + 32 * k);
        assert_int_equal(ps->n_blocks, 8 * (k + 1));
        assert_false(ps->sample); // the chunk does not reach the prompt's end
        assert_int_equal(h_update(h, 0)->n, 0);
    }
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->seqs[0].start_pos, 96);
    assert_int_equal(p->seqs[0].n_tokens, 4);
    assert_true(p->seqs[0].sample);
    assert_int_equal(p->seqs[0].n_generated, 0);
    assert_int_equal(p->seqs[0].n_history, 100);
    assert_int_equal(p->seqs[0].n_prompt, 100);
    const sched_events *ev = h_update(h, 7);
    assert_int_equal(ev->n, 1);
    assert_true(ev->ev[0].has_token);
    assert_int_equal(ev->ev[0].out.token, 7);
    assert_int_equal(ev->ev[0].n_generated, 1);
    assert_int_equal(ev->ev[0].finish, SCHED_FINISH_NONE);
    assert_int_equal(ev->ev[0].usage.first_token_ns, h->clock);
    p = h_step(h); // decode
    assert_int_equal(p->seqs[0].start_pos, 100);
    assert_int_equal(p->seqs[0].n_tokens, 1);
    assert_int_equal(p->seqs[0].tokens[0], 7);
    assert_int_equal(p->seqs[0].n_blocks, 26);
    assert_int_equal(p->seqs[0].history[100], 7);
    assert_int_equal(p->seqs[0].n_generated, 1);
    h_update(h, 8);
    h_step(h);
    ev = h_update(h, 9);
    assert_int_equal(ev->n, 1);
    assert_int_equal(ev->ev[0].finish, SCHED_FINISH_LENGTH);
    assert_true(ev->ev[0].req_finished);
    assert_int_equal(ev->ev[0].usage.prompt_tokens, 100);
    assert_int_equal(ev->ev[0].usage.completion_tokens, 3);
    assert_int_equal(ev->ev[0].usage.arrival_ns, 1000);
    assert_int_equal(ev->ev[0].usage.first_scheduled_ns, 1010);
    assert_false(sched_has_work(h->s));
    assert_int_equal(free_blocks(h), 63);
    h_free(h);
}

static void test_decodes_first_then_prefill_fills_budget(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 8, .max_tokens = 10}), 0);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 8, .max_tokens = 10}), 0);
    h_cycle(h, 5); // both prefill: 16 tokens
    assert_int_equal(h_add(h, 3, (req_opts){.n_prompt = 100, .max_tokens = 2}), 0);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 3);
    assert_int_equal(p->seqs[0].seq_id, 256); // running first, in arrival order
    assert_int_equal(p->seqs[1].seq_id, 512);
    assert_int_equal(p->seqs[0].n_tokens + p->seqs[1].n_tokens, 2);
    assert_int_equal(p->seqs[2].seq_id, 768);
    assert_int_equal(p->seqs[2].n_tokens, 30); // the rest of the budget
    assert_false(p->seqs[2].sample);
    assert_int_equal(p->n_tokens, 32);
    h_update(h, 5);
    drain(h, 5);
    h_free(h);
}

static void test_chunked_prefill_off_waits_whole(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    c.enable_chunked_prefill = false;
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 20, .max_tokens = 5}), 0);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 20, .max_tokens = 5, .base = 50}), 0);
    const pg_batch_plan *p = h_cycle(h, 1);
    assert_int_equal(p->n_seqs, 1); // 20 + 20 > 32: the second waits whole
    assert_int_equal(p->seqs[0].n_tokens, 20);
    p = h_cycle(h, 1);
    assert_int_equal(p->n_seqs, 2);
    assert_int_equal(p->seqs[1].n_tokens, 20);
    assert_true(p->seqs[1].sample);
    drain(h, 1);
    h_free(h);
}

static void test_long_prefill_threshold(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    c.long_prefill_token_threshold = 8;
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 20, .max_tokens = 2}), 0);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 20, .max_tokens = 2}), 0);
    const pg_batch_plan *p = h_cycle(h, 1);
    assert_int_equal(p->n_seqs, 2); // two capped chunks share the step
    assert_int_equal(p->seqs[0].n_tokens, 8);
    assert_int_equal(p->seqs[1].n_tokens, 8);
    h_cycle(h, 1);
    p = h_cycle(h, 1);
    assert_int_equal(p->seqs[0].n_tokens, 4);
    assert_true(p->seqs[0].sample);
    drain(h, 1);
    h_free(h);
}

// The default cap (a quarter of the budget, 8 of 32 here) applies only while
// another request is live: a lone long prompt takes the whole budget; once
// a short request arrives, the long prefill takes 8 tokens per step and the
// short one is served (prefilled, then decoded) in every step.
static void test_long_prefill_cap_auto_serves_short_requests(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    c.long_prefill_token_threshold = SCHED_LONG_PREFILL_AUTO;
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 200, .max_tokens = 2}), 0);
    const pg_batch_plan *p = h_cycle(h, 1);
    assert_int_equal(p->n_seqs, 1);
    assert_int_equal(p->seqs[0].n_tokens, 32); // alone: the whole budget
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 3, .max_tokens = 3}), 0);
    p = h_cycle(h, 1);
    assert_int_equal(p->n_seqs, 2);
    assert_int_equal(p->seqs[0].n_tokens, 8); // capped
    assert_int_equal(p->seqs[1].seq_id, 2 * 256);
    assert_int_equal(p->seqs[1].n_tokens, 3); // the short prompt, whole, sampling
    assert_true(p->seqs[1].sample);
    for (int k = 0; k < 2; k++) { // its decodes, every step
        p = h_cycle(h, 1);
        assert_int_equal(p->n_seqs, 2);
        assert_int_equal(p->seqs[0].n_tokens, 8);
        assert_int_equal(p->seqs[1].n_tokens, 1);
    }
    assert_int_equal(stats(h).n_running, 1); // 2 finished (3 tokens)
    p = h_cycle(h, 1);
    assert_int_equal(p->seqs[0].n_tokens, 32); // alone again
    drain(h, 1);
    h_free(h);
}

// A client that leaves during a long prefill: the abort lands between two
// chunks, the request is in no later plan and its blocks are back at once.
static void test_abort_between_prefill_chunks(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    c.long_prefill_token_threshold = SCHED_LONG_PREFILL_AUTO;
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 200, .max_tokens = 2}), 0);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 2, .max_tokens = 50, .ignore_eos = true}), 0);
    h_cycle(h, 1);
    h_cycle(h, 1);
    int32_t used = stats(h).kv.num_used;
    assert_int_equal(sched_abort(h->s, 1), 0);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 1);
    assert_int_equal(p->seqs[0].seq_id, 2 * 256);
    h_update(h, 1);
    bool aborted = false;
    for (int32_t i = 0; i < h->ev.n; i++)
        if (h->ev.ev[i].req_id == 1) aborted = h->ev.ev[i].finish == SCHED_FINISH_ABORT;
    assert_true(aborted);
    assert_true(stats(h).kv.num_used < used);
    drain(h, 1);
    h_free(h);
}

static void test_long_prefill_cap_config(void **state) {
    (void)state;
    sched_config c;
    sched_config_default(&c);
    assert_int_equal(c.long_prefill_token_threshold, SCHED_LONG_PREFILL_AUTO);
    c.num_blocks = 16;
    c.max_model_len = 64;
    c.long_prefill_token_threshold = -2;
    sched *s;
    assert_int_equal(sched_create(&c, &s), PG_EINVAL);
    c.long_prefill_token_threshold = 0;
    assert_int_equal(sched_create(&c, &s), 0);
    sched_destroy(s);
}

static void test_max_num_seqs_caps_running(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    c.max_num_seqs = 2;
    harness *h = h_new(&c);
    for (int64_t id = 1; id <= 3; id++)
        assert_int_equal(h_add(h, id, (req_opts){.n_prompt = 4, .max_tokens = 3}), 0);
    const pg_batch_plan *p = h_cycle(h, 1);
    assert_int_equal(p->n_seqs, 2);
    assert_int_equal(stats(h).n_waiting, 1);
    h_cycle(h, 1);
    h_cycle(h, 1); // 1 and 2 finish here
    assert_int_equal(stats(h).n_running, 0);
    p = h_cycle(h, 1);
    assert_int_equal(p->n_seqs, 1);
    assert_int_equal(p->seqs[0].seq_id, 3 * 256);
    drain(h, 1);
    h_free(h);
}

// ---------------------------------------------------------------------------
// Preemption

// Pool of 4 blocks of 4 tokens; two requests of 6 prompt + 8 output tokens
// each need all 4 blocks at their longest.
static void preempt_config(sched_config *c, sched_preempt_mode mode) {
    base_config(c);
    c->num_blocks = 5;
    c->num_host_blocks = 8;
    c->max_num_batched_tokens = 64;
    c->preemption_mode = mode;
}

static void test_preempt_recompute_keeps_output(void **state) {
    (void)state;
    sched_config c;
    preempt_config(&c, SCHED_PREEMPT_RECOMPUTE);
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 6, .max_tokens = 8, .base = 100}), 0);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 6, .max_tokens = 8, .base = 200}), 0);
    h_cycle(h, 11); // both prefill (2 blocks each): pool full
    assert_int_equal(free_blocks(h), 0);
    h_cycle(h, 12);                     // position 6
    h_cycle(h, 13);                     // position 7: both have 3 outputs
    const pg_batch_plan *p = h_step(h); // position 8 needs a block: 2 goes
    assert_int_equal(p->n_seqs, 1);
    assert_int_equal(p->seqs[0].seq_id, 256);
    assert_int_equal(p->seqs[0].n_blocks, 3);
    assert_int_equal(p->n_swap_out, 0);
    sched_stats st = stats(h);
    assert_int_equal(st.n_preempt_recompute, 1);
    assert_int_equal(st.n_waiting, 1);
    h_update(h, 14);
    // 2 is admitted again only when 1 is done and then recomputes its
    // prompt and its 3 outputs in one go, sampling its 4th token.
    const pg_plan_seq *ps = NULL;
    for (int k = 0; k < 20 && !ps; k++) {
        p = h_step(h);
        ps = find_seq(p, 512);
        if (ps) assert_null(find_seq(p, 256));
        h_update(h, 15);
    }
    assert_non_null(ps);
    assert_int_equal(ps->start_pos, 0);
    assert_int_equal(ps->n_tokens, 9);
    assert_true(ps->sample);
    assert_int_equal(ps->n_generated, 3);
    assert_int_equal(ps->tokens[6], 11);
    assert_int_equal(ps->tokens[8], 13);
    const sched_events *ev = &h->ev;
    const sched_event *e = find_ev(ev, 2, 0);
    assert_non_null(e);
    assert_int_equal(e->n_generated, 4);
    int steps = drain(h, 16);
    assert_int_equal(steps, 4);
    assert_int_equal(free_blocks(h), 4);
    h_free(h);
}

static void test_preempt_swap_and_swapped_first(void **state) {
    (void)state;
    sched_config c;
    preempt_config(&c, SCHED_PREEMPT_SWAP);
    c.enable_prefix_caching = false;
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 6, .max_tokens = 8, .base = 100}), 0);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 6, .max_tokens = 8, .base = 200}), 0);
    const pg_batch_plan *p = h_cycle(h, 11);
    assert_int_equal(find_seq(p, 256)->block_table[1], 2);
    assert_int_equal(find_seq(p, 512)->block_table[0], 3);
    h_cycle(h, 12);
    h_cycle(h, 13);
    p = h_step(h);
    // 2's blocks 3 and 4 go to host 0 and 1; 1 takes the freed block 3
    // (the runner copies it out before the forward writes it).
    assert_int_equal(p->n_swap_out, 2);
    assert_int_equal(p->swap_out[0].from, 3);
    assert_int_equal(p->swap_out[0].to, 0);
    assert_int_equal(p->swap_out[1].from, 4);
    assert_int_equal(p->swap_out[1].to, 1);
    assert_int_equal(p->n_seqs, 1);
    assert_int_equal(p->seqs[0].block_table[2], 3);
    assert_int_equal(stats(h).n_swapped, 1);
    assert_int_equal(stats(h).n_preempt_swap, 1);
    assert_int_equal(stats(h).kv.num_host_free, 6);
    h_update(h, 14);
    // A new request arrives; the swapped one must come back first.
    assert_int_equal(h_add(h, 3, (req_opts){.n_prompt = 4, .max_tokens = 2, .base = 300}), 0);
    int k = 0;
    for (; k < 20; k++) {
        p = h_step(h);
        if (find_seq(p, 512)) break;
        assert_null(find_seq(p, 768)); // never before 2 is back
        h_update(h, 15);
    }
    const pg_plan_seq *ps = find_seq(p, 512);
    assert_non_null(ps);
    assert_int_equal(p->n_swap_in, 2);
    assert_int_equal(p->swap_in[0].from, 0);
    assert_int_equal(p->swap_in[1].from, 1);
    assert_int_equal(ps->block_table[0], p->swap_in[0].to);
    assert_int_equal(ps->block_table[1], p->swap_in[1].to);
    assert_int_equal(ps->start_pos, 8); // nothing recomputed
    assert_int_equal(ps->n_tokens, 1);
    assert_int_equal(ps->n_generated, 3);
    assert_int_equal(ps->tokens[0], 13);
    assert_int_equal(ps->n_blocks, 3);
    h_update(h, 16);
    assert_int_equal(stats(h).kv.num_host_free, 8);
    drain(h, 17);
    h_free(h);
}

// Swap mode without enough host blocks falls back to recompute.
static void test_preempt_swap_falls_back_to_recompute(void **state) {
    (void)state;
    sched_config c;
    preempt_config(&c, SCHED_PREEMPT_SWAP);
    c.num_host_blocks = 1;
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 6, .max_tokens = 8}), 0);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 6, .max_tokens = 8, .base = 50}), 0);
    for (int i = 0; i < 4; i++) h_cycle(h, 3);
    sched_stats st = stats(h);
    assert_int_equal(st.n_preempt_swap, 0);
    assert_int_equal(st.n_preempt_recompute, 1);
    drain(h, 3);
    h_free(h);
}

// ---------------------------------------------------------------------------
// Priorities

static void test_priority_order_and_victim(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    c.policy = SCHED_POLICY_PRIORITY;
    c.num_blocks = 6; // 5 usable
    c.max_num_batched_tokens = 64;
    harness *h = h_new(&c);
    assert_int_equal(
        h_add(h, 1, (req_opts){.n_prompt = 4, .max_tokens = 8, .priority = 1, .arrival = 1}), 0);
    assert_int_equal(
        h_add(h, 2, (req_opts){.n_prompt = 4, .max_tokens = 8, .priority = 5, .arrival = 2}), 0);
    assert_int_equal(
        h_add(h, 3, (req_opts){.n_prompt = 4, .max_tokens = 8, .priority = 3, .arrival = 3}), 0);
    const pg_batch_plan *p = h_cycle(h, 1);
    assert_int_equal(p->n_seqs, 3);
    assert_int_equal(p->seqs[0].seq_id, 256); // priority order: 1, 3, 2
    assert_int_equal(p->seqs[1].seq_id, 768);
    assert_int_equal(p->seqs[2].seq_id, 512);
    // Position 4 needs a second block each: 5 blocks for 6 -> the lowest
    // priority (2, priority 5) is preempted although 3 arrived later.
    p = h_cycle(h, 1);
    assert_int_equal(p->n_seqs, 2);
    assert_non_null(find_seq(p, 256));
    assert_non_null(find_seq(p, 768));
    assert_int_equal(stats(h).n_preempt_recompute, 1);
    drain(h, 1);
    h_free(h);
}

static void test_priority_waiting_order(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    c.policy = SCHED_POLICY_PRIORITY;
    c.max_num_seqs = 1;
    harness *h = h_new(&c);
    assert_int_equal(
        h_add(h, 1, (req_opts){.n_prompt = 4, .max_tokens = 1, .priority = 5, .arrival = 1}), 0);
    assert_int_equal(
        h_add(h, 2, (req_opts){.n_prompt = 4, .max_tokens = 1, .priority = 1, .arrival = 3}), 0);
    assert_int_equal(
        h_add(h, 3, (req_opts){.n_prompt = 4, .max_tokens = 1, .priority = 1, .arrival = 2}), 0);
    int64_t order[3];
    for (int i = 0; i < 3; i++) order[i] = h_cycle(h, 1)->seqs[0].seq_id / 256;
    assert_int_equal(order[0], 3); // priority 1, earlier arrival
    assert_int_equal(order[1], 2);
    assert_int_equal(order[2], 1);
    h_free(h);
}

// FCFS ignores priority values.
static void test_fcfs_ignores_priority(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    c.max_num_seqs = 1;
    harness *h = h_new(&c);
    assert_int_equal(
        h_add(h, 1, (req_opts){.n_prompt = 4, .max_tokens = 1, .priority = 9, .arrival = 1}), 0);
    assert_int_equal(
        h_add(h, 2, (req_opts){.n_prompt = 4, .max_tokens = 1, .priority = 0, .arrival = 2}), 0);
    assert_int_equal(h_cycle(h, 1)->seqs[0].seq_id, 256);
    assert_int_equal(h_cycle(h, 1)->seqs[0].seq_id, 512);
    h_free(h);
}

// ---------------------------------------------------------------------------
// Abort

static void assert_abort_event(const sched_events *ev, int64_t id) {
    const sched_event *e = find_ev(ev, id, 0);
    assert_non_null(e);
    assert_int_equal(e->finish, SCHED_FINISH_ABORT);
    assert_false(e->has_token);
    assert_true(e->req_finished);
}

static void test_abort_waiting(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 4}), 0);
    assert_int_equal(sched_abort(h->s, 1), 0);
    assert_int_equal(sched_abort(h->s, 1), PG_ENOTFOUND);
    assert_true(sched_has_work(h->s)); // the abort event is still to deliver
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 0);
    assert_abort_event(h_update(h, 0), 1);
    assert_false(sched_has_work(h->s));
    assert_int_equal(stats(h).n_aborted, 1);
    h_free(h);
}

static void test_abort_running_frees_blocks_now(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 10}), 0);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 10, .base = 77}), 0);
    h_cycle(h, 1);
    assert_int_equal(free_blocks(h), 63 - 6);
    assert_int_equal(sched_abort(h->s, 1), 0);
    assert_int_equal(free_blocks(h), 63 - 3);
    h_check(h);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 1);
    const sched_events *ev = h_update(h, 1);
    assert_abort_event(ev, 1);
    assert_non_null(find_ev(ev, 2, 0));
    drain(h, 1);
    h_free(h);
}

static void test_abort_in_flight_takes_effect_at_update(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 10}), 0);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 1);
    int32_t before = free_blocks(h);
    assert_int_equal(sched_abort(h->s, 1), 0);
    assert_int_equal(free_blocks(h), before);  // the runner may be using them
    assert_int_equal(p->seqs[0].tokens[0], 0); // plan memory still valid
    h_check(h);
    const sched_events *ev = h_update(h, 5); // its sampled token is dropped
    assert_int_equal(ev->n, 1);
    assert_abort_event(ev, 1);
    assert_int_equal(free_blocks(h), 63);
    assert_false(sched_has_work(h->s));
    h_free(h);
}

static void test_abort_swapped(void **state) {
    (void)state;
    sched_config c;
    preempt_config(&c, SCHED_PREEMPT_SWAP);
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 6, .max_tokens = 8}), 0);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 6, .max_tokens = 8, .base = 50}), 0);
    for (int i = 0; i < 4; i++) h_cycle(h, 3);
    assert_int_equal(stats(h).n_swapped, 1);
    assert_int_equal(stats(h).kv.num_host_free, 6);
    assert_int_equal(sched_abort(h->s, 2), 0);
    assert_int_equal(stats(h).kv.num_host_free, 8);
    assert_int_equal(stats(h).n_swapped, 0);
    h_check(h);
    h_step(h);
    assert_abort_event(h_update(h, 3), 2);
    drain(h, 3);
    h_free(h);
}

// ---------------------------------------------------------------------------
// Parallel sampling

static int32_t by_seq_index(const pg_plan_seq *ps, void *ctx) {
    (void)ctx;
    return 50 + (int32_t)(ps->seq_id % 256);
}

static void test_parallel_sampling_fork_and_cow(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    c.enable_prefix_caching = false;
    harness *h = h_new(&c);
    assert_int_equal(
        h_add(
            h, 3,
            (req_opts){
                .n_prompt = 6, .max_tokens = 4, .n = 3, .seed = 100, .has_seed = true, .base = 10}),
        0);
    // Step 1: the lead computes the prompt but its last token, no sample.
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 1);
    assert_int_equal(p->seqs[0].seq_id, 3 * 256);
    assert_int_equal(p->seqs[0].n_tokens, 5);
    assert_false(p->seqs[0].sample);
    assert_int_equal(stats(h).n_running_seqs, 3); // reserved for the fork
    h_update(h, 0);
    // Step 2: fork; every sequence computes position 5 and samples with its
    // own seed. Block 2 (positions 4..7) is shared and written: two copies.
    p = h_step(h);
    assert_int_equal(p->n_seqs, 3);
    for (int32_t i = 0; i < 3; i++) {
        const pg_plan_seq *ps = &p->seqs[i];
        assert_int_equal(ps->seq_id, 3 * 256 + i);
        assert_int_equal(ps->start_pos, 5);
        assert_int_equal(ps->n_tokens, 1);
        assert_int_equal(ps->tokens[0], 15);
        assert_true(ps->sample);
        assert_int_equal(ps->rng_seed, 100 + (uint64_t)i);
        assert_int_equal(ps->block_table[0], 1);
    }
    assert_int_equal(p->n_copies, 2);
    assert_int_equal(p->copies[0].from, 2);
    assert_int_equal(p->copies[0].to, 3);
    assert_int_equal(p->copies[1].from, 2);
    assert_int_equal(p->copies[1].to, 4);
    assert_int_equal(p->seqs[0].block_table[1], 3);
    assert_int_equal(p->seqs[1].block_table[1], 4);
    assert_int_equal(p->seqs[2].block_table[1], 2);
    assert_int_equal(kvp_block_ref(sched_pool(h->s), 1), 3);
    const sched_events *ev = h_update_fn(h, by_seq_index, NULL);
    assert_int_equal(ev->n, 3);
    for (int32_t i = 0; i < 3; i++) {
        assert_int_equal(ev->ev[i].seq_index, i);
        assert_int_equal(ev->ev[i].out.token, 50 + i);
        assert_false(ev->ev[i].req_finished);
    }
    // Each continues on its own history.
    p = h_step(h);
    for (int32_t i = 0; i < 3; i++) assert_int_equal(p->seqs[i].tokens[0], 50 + i);
    h_update_fn(h, by_seq_index, NULL);
    // A stop string matched on sequence 1 (outside the plan in flight).
    assert_int_equal(sched_finish_seq(h->s, 3, 1, SCHED_FINISH_STOP), 0);
    assert_int_equal(sched_finish_seq(h->s, 3, 1, SCHED_FINISH_STOP), PG_EINVAL);
    assert_int_equal(stats(h).n_running_seqs, 2);
    h_check(h);
    p = h_step(h);
    assert_int_equal(p->n_seqs, 2);
    ev = h_update_fn(h, by_seq_index, NULL);
    const sched_event *e1 = find_ev(ev, 3, 1);
    assert_non_null(e1);
    assert_int_equal(e1->finish, SCHED_FINISH_STOP);
    assert_int_equal(e1->stop_token, -1);
    assert_false(e1->has_token);
    // The others reach max_tokens on the next step; the request ends.
    h_step(h);
    ev = h_update_fn(h, by_seq_index, NULL);
    assert_int_equal(ev->n, 2);
    assert_int_equal(ev->ev[1].seq_index, 2);
    assert_int_equal(ev->ev[1].finish, SCHED_FINISH_LENGTH);
    assert_true(ev->ev[1].req_finished);
    assert_false(ev->ev[0].req_finished);
    assert_int_equal(ev->ev[1].usage.completion_tokens, 4 + 2 + 4);
    assert_int_equal(free_blocks(h), 63);
    h_free(h);
}

// n > 1 with a one-token prompt forks at admission; unseeded requests get
// distinct seeds per sequence too.
static void test_parallel_sampling_one_token_prompt(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 1, .max_tokens = 2, .n = 4}), 0);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 4);
    for (int32_t i = 0; i < 4; i++) {
        assert_int_equal(p->seqs[i].start_pos, 0);
        assert_true(p->seqs[i].sample);
        assert_int_equal(p->seqs[i].block_table[0], 1 + i);
        if (i) assert_true(p->seqs[i].rng_seed == p->seqs[0].rng_seed + (uint64_t)i);
    }
    assert_int_equal(p->n_copies, 0);
    h_update(h, 1);
    drain(h, 1);
    h_free(h);
}

// An n > 1 request preempted by recompute re-forks and resumes every
// sequence on its own output.
static void test_parallel_sampling_recompute(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    c.num_blocks = 9; // 8 usable
    c.max_num_batched_tokens = 64;
    c.enable_prefix_caching = false;
    harness *h = h_new(&c);
    // 2 requests x (1 shared + 2 x 2 own) = 10 blocks > 8 at their longest.
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 6, .max_tokens = 6, .n = 2, .base = 10}),
                     0);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 6, .max_tokens = 6, .n = 2, .base = 20}),
                     0);
    bool seen_refork = false;
    for (int k = 0; k < 40 && sched_has_work(h->s); k++) {
        const pg_batch_plan *p = h_step(h);
        const pg_plan_seq *a = find_seq(p, 512), *b = find_seq(p, 513);
        if (stats(h).n_preempt_recompute > 0 && a && b && a->n_tokens > 1) {
            // Re-forked after recompute: each recomputes its own outputs.
            assert_int_equal(a->start_pos, 5);
            assert_int_equal(a->tokens[1], 50);
            assert_int_equal(b->tokens[1], 51);
            assert_true(a->sample && b->sample);
            seen_refork = true;
        }
        h_update_fn(h, by_seq_index, NULL);
    }
    assert_true(seen_refork);
    assert_false(sched_has_work(h->s));
    h_free(h);
}

// ---------------------------------------------------------------------------
// Stop rules

static void test_min_tokens_masks_eos(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1,
                           (req_opts){.n_prompt = 4,
                                      .max_tokens = 10,
                                      .min_tokens = 3,
                                      .eos = 2,
                                      .n_stop = 1,
                                      .stop = {9}}),
                     0);
    for (int32_t k = 0; k < 3; k++) {
        const pg_batch_plan *p = h_step(h);
        assert_int_equal(p->seqs[0].mask_eos, k < 3);
        assert_int_equal(p->seqs[0].eos_id, 2);
        // A runner that ignored the mask: EOS does not stop before min_tokens.
        const sched_events *ev = h_update(h, 2);
        assert_int_equal(ev->ev[0].finish, k < 2 ? SCHED_FINISH_NONE : SCHED_FINISH_STOP);
    }
    const sched_event *e = &h->ev.ev[0];
    assert_int_equal(e->stop_token, 2);
    assert_true(e->has_token);
    assert_true(e->req_finished);
    assert_int_equal(e->usage.completion_tokens, 3);
    h_free(h);
}

static void test_stop_ids_and_ignore_eos(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    assert_int_equal(
        h_add(h, 1,
              (req_opts){.n_prompt = 4, .max_tokens = 10, .eos = 2, .n_stop = 2, .stop = {8, 9}}),
        0);
    assert_int_equal(
        h_add(h, 2, (req_opts){.n_prompt = 4, .max_tokens = 3, .eos = 2, .ignore_eos = true}), 0);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(find_seq(p, 512)->eos_id, -1); // nothing to mask
    const sched_events *ev = h_update(h, 2);
    assert_int_equal(find_ev(ev, 1, 0)->finish, SCHED_FINISH_STOP); // EOS
    assert_int_equal(find_ev(ev, 1, 0)->stop_token, 2);
    assert_int_equal(find_ev(ev, 2, 0)->finish, SCHED_FINISH_NONE);
    h_cycle(h, 2);
    h_step(h);
    ev = h_update(h, 2);
    assert_int_equal(find_ev(ev, 2, 0)->finish, SCHED_FINISH_LENGTH);
    assert_int_equal(find_ev(ev, 2, 0)->n_generated, 3);
    assert_int_equal(
        h_add(h, 3, (req_opts){.n_prompt = 4, .max_tokens = 10, .n_stop = 2, .stop = {8, 9}}), 0);
    h_cycle(h, 5);
    h_step(h);
    ev = h_update(h, 9);
    assert_int_equal(ev->ev[0].finish, SCHED_FINISH_STOP);
    assert_int_equal(ev->ev[0].stop_token, 9);
    assert_int_equal(ev->ev[0].out.token, 9);
    h_free(h);
}

static void test_finish_seq_in_flight_drops_token(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 4, .max_tokens = 10}), 0);
    h_cycle(h, 1);
    h_step(h);
    assert_int_equal(sched_finish_seq(h->s, 1, 0, SCHED_FINISH_STOP), 0);
    assert_int_equal(sched_finish_seq(h->s, 1, 3, SCHED_FINISH_STOP), PG_EINVAL);
    const sched_events *ev = h_update(h, 1);
    assert_int_equal(ev->n, 1);
    assert_false(ev->ev[0].has_token);
    assert_int_equal(ev->ev[0].finish, SCHED_FINISH_STOP);
    assert_int_equal(ev->ev[0].n_generated, 1);
    assert_true(ev->ev[0].req_finished);
    assert_int_equal(free_blocks(h), 63);
    h_free(h);
}

static void test_step_failure_finishes_with_error(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 4}), 0);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 4, .base = 9}), 0);
    h_step(h);
    assert_int_equal(sched_update(h->s, NULL, &h->ev), 0);
    h_check(h);
    assert_int_equal(h->ev.n, 2);
    assert_int_equal(h->ev.ev[0].finish, SCHED_FINISH_ERROR);
    assert_true(h->ev.ev[0].req_finished && h->ev.ev[1].req_finished);
    assert_int_equal(free_blocks(h), 63);
    // An output that does not answer the plan is a failed step too.
    assert_int_equal(h_add(h, 3, (req_opts){.n_prompt = 4}), 0);
    h_step(h);
    pg_seq_output o = {.seq_id = 12345, .token = 1};
    pg_step_output out = {.n = 1, .outs = &o};
    assert_int_equal(sched_update(h->s, &out, &h->ev), PG_EINVAL);
    h_check(h);
    assert_int_equal(h->ev.ev[0].finish, SCHED_FINISH_ERROR);
    assert_false(sched_has_work(h->s));
    h_free(h);
}

// ---------------------------------------------------------------------------
// Owners: the caller's per-request data, kept with the request

// Every event of `ev` carries its request's owner (owners[req_id]).
static void assert_event_owners(const sched_events *ev, void *const *owners) {
    for (int32_t i = 0; i < ev->n; i++) assert_ptr_equal(ev->ev[i].owner, owners[ev->ev[i].req_id]);
}

// The owners of the tests below: request i's is &owner_slot[i].
static int owner_slot[8];

// sched_for_each_owner's callback: counts the visits of each owner.
static void count_owner(void *owner, void *ctx) {
    int *counts = ctx;
    int i = (int)((int *)owner - owner_slot);
    assert_true(i >= 0 && i < 8);
    counts[i]++;
}

// The requests whose owners sched_for_each_owner visits, as a bit set
// (bit i: request i); each must be visited once.
static unsigned owners_visited(harness *h) {
    int counts[8] = {0};
    sched_for_each_owner(h->s, count_owner, counts);
    unsigned bits = 0;
    for (int i = 0; i < 8; i++) {
        assert_true(counts[i] <= 1);
        if (counts[i]) bits |= 1u << i;
    }
    return bits;
}

static void test_owner_lookup_and_events(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    void *owners[8];
    for (int i = 0; i < 8; i++) owners[i] = &owner_slot[i];
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 6, .max_tokens = 2, .owner = owners[1]}), 0);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 6, .max_tokens = 4, .base = 40, .owner = owners[2]}), 0);
    assert_ptr_equal(sched_request_owner(h->s, 1), owners[1]);
    assert_ptr_equal(sched_request_owner(h->s, 2), owners[2]);
    assert_null(sched_request_owner(h->s, 3)); // unknown id
    assert_int_equal(owners_visited(h), 0x6);
    // Request 1 samples twice and finishes (max_tokens); its owner is in
    // every event, the last one included, and is gone after it.
    bool done = false;
    for (int k = 0; k < 10 && !done; k++) {
        h_step(h);
        const sched_events *ev = h_update(h, 5);
        assert_event_owners(ev, owners);
        const sched_event *e1 = find_ev(ev, 1, 0);
        if (e1 && e1->req_finished) {
            assert_true(e1->has_token);
            done = true;
        }
    }
    assert_true(done);
    assert_null(sched_request_owner(h->s, 1));
    assert_ptr_equal(sched_request_owner(h->s, 2), owners[2]);
    assert_int_equal(owners_visited(h), 0x4);
    drain(h, 5);
    assert_event_owners(&h->ev, owners);
    assert_null(sched_request_owner(h->s, 2));
    assert_int_equal(owners_visited(h), 0);
    h_free(h);
}

static void test_owner_of_aborted_request(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    void *owners[8];
    for (int i = 0; i < 8; i++) owners[i] = &owner_slot[i];
    // Waiting: the abort ends it at once; its final event, still to come,
    // keeps the owner, which sched_for_each_owner visits until then.
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 4, .owner = owners[1]}), 0);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 4, .base = 30, .owner = owners[2]}), 0);
    assert_int_equal(sched_abort(h->s, 1), 0);
    assert_null(sched_request_owner(h->s, 1));
    assert_int_equal(owners_visited(h), 0x6);
    h_step(h);
    const sched_events *ev = h_update(h, 3);
    assert_abort_event(ev, 1);
    assert_event_owners(ev, owners);
    assert_int_equal(owners_visited(h), 0x4);
    // In flight: the owner stays until the update ends it.
    h_step(h);
    assert_int_equal(sched_abort(h->s, 2), 0);
    assert_ptr_equal(sched_request_owner(h->s, 2), owners[2]);
    ev = h_update(h, 3);
    assert_abort_event(ev, 2);
    assert_event_owners(ev, owners);
    assert_null(sched_request_owner(h->s, 2));
    assert_int_equal(owners_visited(h), 0);
    assert_false(sched_has_work(h->s));
    h_free(h);
}

static void test_owner_with_parallel_sampling(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    void *owners[8];
    for (int i = 0; i < 8; i++) owners[i] = &owner_slot[i];
    assert_int_equal(
        h_add(h, 3, (req_opts){.n_prompt = 6, .max_tokens = 4, .n = 3, .owner = owners[3]}), 0);
    assert_int_equal(h_add(h, 4, (req_opts){.n_prompt = 5, .max_tokens = 8, .n = 2, .base = 60,
                                            .owner = owners[4]}),
                     0);
    h_cycle(h, 7); // prompts
    h_step(h);     // the forks sample
    const sched_events *ev = h_update_fn(h, by_seq_index, NULL);
    int32_t seen3 = 0;
    for (int32_t i = 0; i < ev->n; i++) seen3 += ev->ev[i].req_id == 3;
    assert_int_equal(seen3, 3); // one event per sequence, each with the owner
    assert_event_owners(ev, owners);
    // One sequence ends early: the request and its owner stay.
    assert_int_equal(sched_finish_seq(h->s, 3, 1, SCHED_FINISH_STOP), 0);
    assert_ptr_equal(sched_request_owner(h->s, 3), owners[3]);
    assert_int_equal(owners_visited(h), 0x18);
    // Request 4 ends through both of its sequences: gone, 3 stays.
    assert_int_equal(sched_finish_seq(h->s, 4, 0, SCHED_FINISH_STOP), 0);
    assert_int_equal(sched_finish_seq(h->s, 4, 1, SCHED_FINISH_STOP), 0);
    assert_null(sched_request_owner(h->s, 4));
    assert_int_equal(owners_visited(h), 0x18); // 4's last event is still to deliver
    h_step(h);
    ev = h_update(h, 7);
    assert_event_owners(ev, owners);
    assert_int_equal(owners_visited(h), 0x8);
    drain(h, 7);
    assert_event_owners(&h->ev, owners);
    assert_null(sched_request_owner(h->s, 3));
    assert_int_equal(owners_visited(h), 0);
    h_free(h);
}

// Async: a request that sched_resolve ends while it is in the next plan
// stays in the scheduler until the next sched_advance, but its owner is
// handed out no more (its last event is out: the caller frees it then).
static void test_owner_gone_after_last_event_in_next_plan(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    void *owners[8];
    for (int i = 0; i < 8; i++) owners[i] = &owner_slot[i];
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 4, .max_tokens = 8, .eos = 2,
                                            .owner = owners[1]}),
                     0);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 4, .max_tokens = 8, .base = 20,
                                            .owner = owners[2]}),
                     0);
    // Step N: both prompts, both sample; N + 1 planned before N resolves.
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->n_seqs, 2);
    pg_seq_output o[2];
    memset(o, 0, sizeof o);
    for (int32_t i = 0; i < 2; i++) {
        o[i].seq_id = p->seqs[i].seq_id;
        o[i].token = o[i].seq_id == 1 * 256 ? 2 : 9; // 1 stops on EOS
    }
    pg_step_output out = {.n = 2, .outs = o};
    assert_int_equal(sched_advance(h->s), 0);
    p = h_step(h);
    assert_int_equal(p->n_seqs, 2);
    sched_events ev;
    assert_int_equal(sched_resolve(h->s, &out, &ev), 0);
    const sched_event *e1 = find_ev(&ev, 1, 0);
    assert_non_null(e1);
    assert_true(e1->req_finished);
    assert_ptr_equal(e1->owner, owners[1]);
    assert_null(sched_request_owner(h->s, 1));
    assert_ptr_equal(sched_request_owner(h->s, 2), owners[2]);
    assert_int_equal(owners_visited(h), 0x4);
    // Step N + 1: request 1's entry is skipped, its output dropped.
    for (int32_t i = 0; i < 2; i++) {
        o[i].seq_id = p->seqs[i].seq_id;
        o[i].token = 9;
    }
    assert_int_equal(sched_advance(h->s), 0);
    assert_int_equal(sched_resolve(h->s, &out, &ev), 0);
    h_check(h);
    assert_null(find_ev(&ev, 1, 0));
    assert_non_null(find_ev(&ev, 2, 0));
    assert_event_owners(&ev, owners);
    assert_int_equal(owners_visited(h), 0x4);
    drain(h, 9);
    assert_int_equal(owners_visited(h), 0);
    h_free(h);
}

// ---------------------------------------------------------------------------
// Prefix caching through the scheduler

static void test_prefix_cache_hit_skips_prompt(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 20, .max_tokens = 1}), 0);
    h_cycle(h, 1);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 20, .max_tokens = 1}), 0);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->seqs[0].start_pos, 16); // 19 / 4 = 4 full blocks hit
    assert_int_equal(p->seqs[0].n_tokens, 4);
    assert_int_equal(p->seqs[0].block_table[0], 1);
    const sched_events *ev = h_update(h, 1);
    assert_int_equal(ev->ev[0].usage.cached_tokens, 16);
    sched_stats st = stats(h);
    assert_int_equal(st.kv.prefix_queries, 40);
    assert_int_equal(st.kv.prefix_hits, 16);
    h_free(h);
}

// A prompt of exactly 4 cached blocks hits 3: its last token is computed.
static void test_prefix_cache_never_whole_prompt(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 16, .max_tokens = 1}), 0);
    h_cycle(h, 1);
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 16, .max_tokens = 1}), 0);
    const pg_batch_plan *p = h_step(h);
    assert_int_equal(p->seqs[0].start_pos, 12);
    assert_int_equal(p->seqs[0].n_tokens, 4);
    assert_true(p->seqs[0].sample);
    assert_int_equal(h_update(h, 1)->ev[0].usage.cached_tokens, 12);
    h_free(h);
}

// The host tier: evicted prefix blocks are offloaded by swap-out moves in
// the plan that evicts them, and a later request with that prefix gets them
// back by swap-in moves in its admission plan (cached_tokens counts them).
static void test_host_tier_offload_and_load(void **state) {
    (void)state;
    sched_config c;
    base_config(&c);
    c.num_blocks = 12; // 11 usable
    c.num_host_blocks = 8;
    c.enable_host_kv_cache = true;
    harness *h = h_new(&c);
    assert_int_equal(h_add(h, 1, (req_opts){.n_prompt = 20, .max_tokens = 1}), 0);
    drain(h, 1); // blocks 1..5 cached, free: 6..11 then 5 4 3 2 1
    assert_int_equal(h_add(h, 2, (req_opts){.n_prompt = 40, .max_tokens = 1, .base = 500}), 0);
    const pg_batch_plan *p = h_cycle(h, 1); // 32 tokens: 6..11, then evicts 5, 4
    assert_int_equal(p->n_swap_out, 2);
    p = h_step(h); // 8 more: evicts 3, 2
    assert_int_equal(p->n_swap_out, 2);
    assert_int_equal(p->swap_out[0].from, 3);
    assert_int_equal(p->swap_out[1].from, 2);
    h_update(h, 1);
    assert_false(sched_has_work(h->s));
    assert_int_equal(h_add(h, 3, (req_opts){.n_prompt = 20, .max_tokens = 1}), 0);
    p = h_step(h);
    assert_int_equal(p->seqs[0].start_pos, 16); // block 1 on the device, 3 blocks from the host
    assert_int_equal(p->n_swap_in, 3);
    for (int32_t i = 0; i < 3; i++) assert_int_equal(p->seqs[0].block_table[1 + i], p->swap_in[i].to);
    const sched_events *ev = h_update(h, 1);
    assert_int_equal(ev->ev[0].usage.cached_tokens, 16);
    sched_stats st = stats(h);
    assert_int_equal(st.kv.host_hits, 12);
    assert_int_equal(st.kv.prefix_hits, 16);
    assert_true(st.kv.offloads >= 4);
    assert_int_equal(st.kv.num_used, 0);
    assert_int_equal(st.kv.num_host_used, 0); // holds released with nothing in flight
    assert_int_equal(free_blocks(h), 11);
    h_free(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_validation),
        cmocka_unit_test(test_admission_rejects_what_never_fits),
        cmocka_unit_test(test_admission_groups_share_prompt_blocks),
        cmocka_unit_test(test_admission_chunked_prefill_off_limit),
        cmocka_unit_test(test_step_update_protocol),
        cmocka_unit_test(test_chunked_prefill_splits_prompt),
        cmocka_unit_test(test_decodes_first_then_prefill_fills_budget),
        cmocka_unit_test(test_chunked_prefill_off_waits_whole),
        cmocka_unit_test(test_long_prefill_threshold),
        cmocka_unit_test(test_long_prefill_cap_auto_serves_short_requests),
        cmocka_unit_test(test_abort_between_prefill_chunks),
        cmocka_unit_test(test_long_prefill_cap_config),
        cmocka_unit_test(test_max_num_seqs_caps_running),
        cmocka_unit_test(test_preempt_recompute_keeps_output),
        cmocka_unit_test(test_preempt_swap_and_swapped_first),
        cmocka_unit_test(test_preempt_swap_falls_back_to_recompute),
        cmocka_unit_test(test_priority_order_and_victim),
        cmocka_unit_test(test_priority_waiting_order),
        cmocka_unit_test(test_fcfs_ignores_priority),
        cmocka_unit_test(test_abort_waiting),
        cmocka_unit_test(test_abort_running_frees_blocks_now),
        cmocka_unit_test(test_abort_in_flight_takes_effect_at_update),
        cmocka_unit_test(test_abort_swapped),
        cmocka_unit_test(test_parallel_sampling_fork_and_cow),
        cmocka_unit_test(test_parallel_sampling_one_token_prompt),
        cmocka_unit_test(test_parallel_sampling_recompute),
        cmocka_unit_test(test_min_tokens_masks_eos),
        cmocka_unit_test(test_stop_ids_and_ignore_eos),
        cmocka_unit_test(test_finish_seq_in_flight_drops_token),
        cmocka_unit_test(test_step_failure_finishes_with_error),
        cmocka_unit_test(test_owner_lookup_and_events),
        cmocka_unit_test(test_owner_of_aborted_request),
        cmocka_unit_test(test_owner_with_parallel_sampling),
        cmocka_unit_test(test_owner_gone_after_last_event_in_next_plan),
        cmocka_unit_test(test_prefix_cache_hit_skips_prompt),
        cmocka_unit_test(test_prefix_cache_never_whole_prompt),
        cmocka_unit_test(test_host_tier_offload_and_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
