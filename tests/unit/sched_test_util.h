// tests/unit/sched_test_util.h - the harness pieces the scheduler unit tests
// share (test_sched.c, test_sched_spec.c, test_sched_spec_batch.c): creating
// a scheduler, a step and an update with sched_check after each, adding a
// request, the free blocks. Static inline functions: each test binary is one
// .c file and gets its own copy.
//
// The speculative-decoding harness (a scheduler, the fake proposer's state,
// the last plan and the runner's outputs) is compiled where the including
// file defines SCHED_TEST_PROPOSER as its proposer type (complete before the
// include) and BS as the block size.
#ifndef PAGED_TESTS_UNIT_SCHED_TEST_UTIL_H
#define PAGED_TESTS_UNIT_SCHED_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "scheduler/sched.h"

static inline void sched_t_check(sched *s) {
    if (sched_check(s)) fail_msg("invariant: %s", pg_err_msg());
}

static inline sched *sched_t_create(const sched_config *c) {
    sched *s = NULL;
    if (sched_create(c, &s)) fail_msg("sched_create: %s", pg_err_msg());
    return s;
}

// sched_step into *plan, then sched_check; returns the plan.
static inline const pg_batch_plan *sched_t_step(sched *s, const pg_batch_plan **plan) {
    assert_int_equal(sched_step(s, plan), 0);
    sched_t_check(s);
    return *plan;
}

static inline int32_t sched_t_free_blocks(sched *s) {
    return kvp_num_free(sched_pool(s));
}

// Fills o (zeroed, seq_id set) for sampled entry ps.
typedef void (*sched_t_answer_fn)(pg_seq_output *o, const pg_plan_seq *ps, void *ctx);

// The fake runner: answers every sampled entry of plan with fn (into outs,
// in plan order), then sched_update into ev and sched_check; returns ev.
static inline const sched_events *sched_t_update(sched *s, const pg_batch_plan *plan,
                                                 pg_seq_output *outs, sched_events *ev,
                                                 sched_t_answer_fn fn, void *ctx) {
    pg_step_output out = {.n = 0, .outs = outs};
    for (int32_t i = 0; i < plan->n_seqs; i++) {
        const pg_plan_seq *ps = &plan->seqs[i];
        if (!ps->sample) continue;
        pg_seq_output *o = &outs[out.n++];
        memset(o, 0, sizeof *o);
        o->seq_id = ps->seq_id;
        fn(o, ps, ctx);
    }
    if (sched_update(s, &out, ev)) fail_msg("sched_update: %s", pg_err_msg());
    sched_t_check(s);
    return ev;
}

// Adds request `id` (must succeed): prompt first, first + 1, ... of
// n_prompt (at most 128) tokens; then sched_check.
static inline void sched_t_add(sched *s, int64_t id, int32_t first, int32_t n_prompt, int32_t eos,
                               const pg_sampling_params *sp) {
    int32_t prompt[128];
    for (int32_t i = 0; i < n_prompt; i++) prompt[i] = first + i;
    sched_request r = {.id = id, .prompt = prompt, .n_prompt = n_prompt, .sp = sp, .eos_id = eos};
    assert_int_equal(sched_add_request(s, &r), 0);
    sched_t_check(s);
}

#endif // PAGED_TESTS_UNIT_SCHED_TEST_UTIL_H

#if defined(SCHED_TEST_PROPOSER) && !defined(PAGED_TESTS_UNIT_SCHED_TEST_SPEC_HARNESS)
#define PAGED_TESTS_UNIT_SCHED_TEST_SPEC_HARNESS

typedef struct harness {
    sched *s;
    SCHED_TEST_PROPOSER prop;
    const pg_batch_plan *plan;
    pg_seq_output outs[64];
    sched_events ev;
} harness;

// A scheduler of num_blocks blocks of BS, max_model_len 256, a token
// budget of `tokens`, no long-prefill cap, and `spec` with the harness's
// proposer state as its ctx.
static inline harness *h_new_spec(sched_spec_config spec, int32_t num_blocks, int32_t tokens) {
    harness *h = calloc(1, sizeof *h);
    sched_config c;
    sched_config_default(&c);
    c.block_size = BS;
    c.num_blocks = num_blocks;
    c.max_model_len = 256;
    c.max_num_batched_tokens = tokens;
    c.long_prefill_token_threshold = 0;
    c.spec = spec;
    c.spec.ctx = &h->prop;
    h->s = sched_t_create(&c);
    return h;
}

static inline void h_free(harness *h) {
    sched_destroy(h->s);
    free(h);
}

static inline void h_check(harness *h) {
    sched_t_check(h->s);
}

static inline const pg_batch_plan *h_step(harness *h) {
    return sched_t_step(h->s, &h->plan);
}

static inline int32_t free_blocks(harness *h) {
    return sched_t_free_blocks(h->s);
}

// Answers every sampled entry of the last plan with fn and updates.
static inline const sched_events *h_update_with(harness *h, sched_t_answer_fn fn, void *ctx) {
    return sched_t_update(h->s, h->plan, h->outs, &h->ev, fn, ctx);
}

#endif // SCHED_TEST_PROPOSER
