// bench/bench_scheduler.c - scheduler CPU time per step.
//
// Times sched_step + sched_update (the scheduler's share of an engine step;
// the runner is a stub that answers every sample with a pseudo-random
// token) with 256 running sequences, in several configurations. Prints
// median and p99 per step in microseconds, then one JSON line per config.
// Target: median < 100 us at 256 sequences.
//
//   build/bench/bench_scheduler [steps]      (default 3000 timed steps)
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "scheduler/sched.h"

typedef struct bench_case {
    const char *name;
    int32_t n_requests; // live requests kept at all times
    int32_t n;          // sequences per request
    int32_t prompt;     // prompt tokens
    int32_t shared;     // of which a prefix shared by all requests
    int32_t max_tokens; // short: requests finish and are replaced (churn)
    bool caching;
    int32_t num_blocks; // small: preemption under pressure
    sched_preempt_mode mode;
    int32_t num_host_blocks;
} bench_case;

static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

typedef struct bench_state {
    sched *s;
    const bench_case *bc;
    int64_t next_id;
    int32_t *prompt;
    pg_seq_output *outs;
    uint64_t rng;
} bench_state;

static int add_request(bench_state *b) {
    const bench_case *bc = b->bc;
    for (int32_t i = bc->shared; i < bc->prompt; i++)
        b->prompt[i] = (int32_t)(mix64(b->rng++) % 32000) + 1;
    pg_sampling_params sp;
    pg_sampling_params_default(&sp);
    sp.n = bc->n;
    sp.max_tokens = bc->max_tokens;
    sp.ignore_eos = true;
    sched_request r = {b->next_id++, b->prompt, bc->prompt, &sp, 0, pg_now_ns(), 2, NULL, 0, 0};
    return sched_add_request(b->s, &r);
}

// Runs one step with a stub runner; returns the scheduler's nanoseconds.
static int64_t one_step(bench_state *b, int32_t *n_seqs, int32_t *n_tok, int32_t *n_finished) {
    const pg_batch_plan *p;
    int64_t t0 = pg_now_ns();
    if (sched_step(b->s, &p)) {
        fprintf(stderr, "step: %s\n", pg_err_msg());
        exit(1);
    }
    int64_t t1 = pg_now_ns();
    pg_step_output out = {.n = 0, .outs = b->outs};
    for (int32_t i = 0; i < p->n_seqs; i++) {
        if (!p->seqs[i].sample) continue;
        pg_seq_output *o = &b->outs[out.n++];
        o->seq_id = p->seqs[i].seq_id;
        o->token = (int32_t)(mix64(b->rng++) % 32000) + 3;
        o->logprob = -1.0f;
        o->n_top = 0;
    }
    *n_seqs = p->n_seqs;
    *n_tok = p->n_tokens;
    sched_events ev;
    int64_t t2 = pg_now_ns();
    if (sched_update(b->s, &out, &ev)) {
        fprintf(stderr, "update: %s\n", pg_err_msg());
        exit(1);
    }
    int64_t t3 = pg_now_ns();
    *n_finished = 0;
    for (int32_t i = 0; i < ev.n; i++) *n_finished += ev.ev[i].req_finished;
    return (t1 - t0) + (t3 - t2);
}

static void run_case(const bench_case *bc, int32_t steps) {
    sched_config c;
    sched_config_default(&c);
    c.num_blocks = bc->num_blocks;
    c.num_host_blocks = bc->num_host_blocks;
    c.enable_prefix_caching = bc->caching;
    c.max_model_len = 8192;
    c.max_num_batched_tokens = 8192;
    c.max_num_seqs = 256;
    c.preemption_mode = bc->mode;
    bench_state b = {0};
    b.bc = bc;
    b.rng = 12345;
    if (sched_create(&c, &b.s)) {
        fprintf(stderr, "%s\n", pg_err_msg());
        exit(1);
    }
    b.prompt = malloc(sizeof(int32_t) * (size_t)bc->prompt);
    b.outs = malloc(sizeof(pg_seq_output) * 256);
    for (int32_t i = 0; i < bc->shared; i++) b.prompt[i] = 1000 + i;
    for (int32_t i = 0; i < bc->n_requests; i++)
        if (add_request(&b)) {
            fprintf(stderr, "%s\n", pg_err_msg());
            exit(1);
        }
    // Warm up until every request runs (prefills done), then time.
    int32_t n_seqs, n_tok, n_fin;
    for (int32_t i = 0; i < 64; i++) {
        one_step(&b, &n_seqs, &n_tok, &n_fin);
        for (int32_t k = 0; k < n_fin; k++) add_request(&b);
    }
    int64_t *ns = malloc(sizeof(int64_t) * (size_t)steps);
    int64_t seqs_sum = 0, tok_sum = 0;
    for (int32_t i = 0; i < steps; i++) {
        ns[i] = one_step(&b, &n_seqs, &n_tok, &n_fin);
        seqs_sum += n_seqs;
        tok_sum += n_tok;
        for (int32_t k = 0; k < n_fin; k++) add_request(&b); // keep the load constant
    }
    qsort(ns, (size_t)steps, sizeof(int64_t), cmp_i64);
    double med = (double)ns[steps / 2] * 1e-3, p99 = (double)ns[(int64_t)steps * 99 / 100] * 1e-3;
    sched_stats st;
    sched_stats_get(b.s, &st);
    printf("%-34s %8.1f %8.1f %8.1f %9.0f %8lld %8lld\n", bc->name, med, p99,
           (double)seqs_sum / steps, (double)tok_sum / steps,
           (long long)(st.n_preempt_recompute + st.n_preempt_swap), (long long)st.n_finished);
    fprintf(stderr,
            "{\"bench\":\"scheduler\",\"case\":\"%s\",\"median_us\":%.2f,\"p99_us\":%.2f,"
            "\"seqs_per_step\":%.1f,\"tokens_per_step\":%.0f,\"preemptions\":%lld}\n",
            bc->name, med, p99, (double)seqs_sum / steps, (double)tok_sum / steps,
            (long long)(st.n_preempt_recompute + st.n_preempt_swap));
    free(ns);
    free(b.prompt);
    free(b.outs);
    sched_destroy(b.s);
}

int main(int argc, char **argv) {
    int32_t steps = argc > 1 ? atoi(argv[1]) : 3000;
    if (steps < 100) steps = 100;
    const bench_case cases[] = {
        // 256 decoding sequences, long outputs: the steady decode step.
        {"decode 256x1, prefix cache", 256, 1, 512, 0, 7000, true, 65536, 0, 0},
        {"decode 256x1, no prefix cache", 256, 1, 512, 0, 7000, false, 65536, 0, 0},
        {"decode 64x4 (n=4, forked)", 64, 4, 512, 0, 7000, true, 65536, 0, 0},
        // Churn: short outputs, requests finish and new ones (sharing a
        // 256-token prefix) are admitted with chunked prefill every step.
        {"churn 256x1, shared prefix", 256, 1, 384, 256, 64, true, 20000, 0, 0},
        // Pressure: the pool holds ~60% of what 256 requests grow to;
        // they finish and are replaced, with steady preemption.
        {"pressure 256x1, recompute", 256, 1, 64, 0, 192, true, 2400, 0, 0},
        {"pressure 256x1, swap", 256, 1, 64, 0, 192, true, 2400, SCHED_PREEMPT_SWAP, 4096},
    };
    printf("scheduler time per step (sched_step + sched_update), %d timed steps\n", steps);
    printf("%-34s %8s %8s %8s %9s %8s %8s\n", "case", "med us", "p99 us", "seqs", "tokens",
           "preempt", "finished");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], steps);
    return 0;
}
