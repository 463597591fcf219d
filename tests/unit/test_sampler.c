// tests/unit/test_sampler.c - sampling rules on hand-made logits.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/sampling.h"

#define V 64

typedef struct {
    pg_sampler *s;
    pg_sample_params p;
    int32_t tok[32]; // the history at 0, ban lists at 16
} fixture;

static void setup_fixture(fixture *f) {
    assert_int_equal(pg_sampler_create(V, &f->s), 0);
    memset(&f->p, 0, sizeof f->p);
    f->p.temperature = 1.0f;
    f->p.top_p = 1.0f;
    f->p.repetition_penalty = 1.0f;
    f->p.logprobs = -1;
    f->p.seed = 42;
}

static void logits_ramp(float *l) {
    // token i has logit i/8: token 63 is the most likely.
    for (int i = 0; i < V; i++) l[i] = (float)i / 8.0f;
}

static int32_t sample(fixture *f, float *l) {
    pg_sample_out o;
    pg_sampler_sample(f->s, &f->p, f->tok, l, &o);
    return o.token;
}

static void test_greedy_and_logprobs(void **state) {
    fixture f;
    setup_fixture(&f);
    f.p.temperature = 0;
    f.p.logprobs = 5;
    float l[V];
    logits_ramp(l);
    pg_sample_out o;
    pg_sampler_sample(f.s, &f.p, f.tok, l, &o);
    assert_int_equal(o.token, 63);
    assert_int_equal(o.n_top, 5);
    double lse = 0;
    for (int i = 0; i < V; i++) lse += exp(i / 8.0);
    lse = log(lse);
    assert_float_equal(o.logprob, 63 / 8.0 - lse, 1e-5);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(o.top_ids[i], 63 - i);
        assert_float_equal(o.top_logprobs[i], (63 - i) / 8.0 - lse, 1e-5);
    }
    pg_sampler_free(f.s);
}

static void test_top_k_top_p_min_p(void **state) {
    fixture f;
    setup_fixture(&f);
    f.p.temperature = 1.0f;
    float l[V];
    // top_k = 3: only the three best ever come out.
    f.p.top_k = 3;
    for (int n = 0; n < 300; n++) {
        f.p.n_generated = n;
        logits_ramp(l);
        assert_true(sample(&f, l) >= 61);
    }
    // top_p tiny: the nucleus is the single best token.
    f.p.top_k = 0;
    f.p.top_p = 0.01f;
    for (int n = 0; n < 100; n++) {
        f.p.n_generated = n;
        logits_ramp(l);
        assert_int_equal(sample(&f, l), 63);
    }
    // min_p = 0.5 relative to the best: p_i/p_max = exp((i-63)/8) >= 0.5 keeps i >= 58.
    f.p.top_p = 1.0f;
    f.p.min_p = 0.5f;
    int seen_low = 0;
    for (int n = 0; n < 500; n++) {
        f.p.n_generated = n;
        logits_ramp(l);
        int t = sample(&f, l);
        assert_true(t >= 58);
        seen_low |= t == 58;
    }
    assert_true(seen_low);
    pg_sampler_free(f.s);
}

// The draw frequency matches the softmax within sampling noise.
static void test_distribution(void **state) {
    fixture f;
    setup_fixture(&f);
    f.p.temperature = 2.0f;
    int counts[V] = {0};
    float l[V];
    const int N = 20000;
    for (int n = 0; n < N; n++) {
        f.p.n_generated = n;
        logits_ramp(l);
        counts[sample(&f, l)]++;
    }
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(i / 16.0);
    for (int i = 56; i < V; i++) {
        double p = exp(i / 16.0) / z, got = (double)counts[i] / N;
        assert_true(fabs(got - p) < 5 * sqrt(p * (1 - p) / N) + 1e-3);
    }
    pg_sampler_free(f.s);
}

static void test_seed_determinism(void **state) {
    fixture f;
    setup_fixture(&f);
    f.p.temperature = 1.0f;
    float l[V];
    int32_t a[50], b[50];
    for (int n = 0; n < 50; n++) {
        f.p.n_generated = n;
        logits_ramp(l);
        a[n] = sample(&f, l);
    }
    for (int n = 0; n < 50; n++) {
        f.p.n_generated = n;
        logits_ramp(l);
        b[n] = sample(&f, l);
    }
    assert_memory_equal(a, b, sizeof a);
    f.p.seed = 43;
    int differ = 0;
    for (int n = 0; n < 50; n++) {
        f.p.n_generated = n;
        logits_ramp(l);
        differ += sample(&f, l) != a[n];
    }
    assert_true(differ > 0);
    assert_true(pg_sampler_uniform(1, 2) == pg_sampler_uniform(1, 2));
    assert_true(pg_sampler_uniform(1, 2) != pg_sampler_uniform(1, 3));
    pg_sampler_free(f.s);
}

static void test_penalties_and_eos_mask(void **state) {
    fixture f;
    setup_fixture(&f);
    f.p.temperature = 0;
    float l[V];
    // Output so far: token 63 twice. A frequency penalty of 1 per occurrence
    // lowers 63 by 2 (below 62 and 61..); presence adds 1 more.
    f.tok[0] = 5;           // prompt
    f.tok[1] = 63, f.tok[2] = 63;
    f.p.n_history = 3;
    f.p.n_prompt = 1;
    f.p.frequency_penalty = 1.0f;
    logits_ramp(l);
    assert_int_equal(sample(&f, l), 62);
    // Repetition penalty divides positive logits of seen tokens (prompt too).
    f.p.frequency_penalty = 0;
    f.p.repetition_penalty = 2.0f;
    logits_ramp(l);
    assert_int_equal(sample(&f, l), 62); // 63/8/2 < 62/8
    // Presence penalty: once per distinct output token.
    f.p.repetition_penalty = 1.0f;
    f.p.presence_penalty = 0.2f; // 63/8 - 0.2 = 7.675 < 62/8 = 7.75
    logits_ramp(l);
    assert_int_equal(sample(&f, l), 62);
    // The ban list (EOS and stop ids while min_tokens is not reached).
    f.p.presence_penalty = 0;
    f.p.n_history = 0;
    for (int i = 0; i < V; i++) l[i] = 0;
    l[0] = 10, l[7] = 9, l[3] = 8;
    f.tok[16] = 0; // EOS
    f.tok[17] = 7; // a stop id
    f.p.ban_offset = 16;
    f.p.n_ban = 2;
    assert_int_equal(sample(&f, l), 3);
    pg_sampler_free(f.s);
}

// A forced row (prompt logprobs) scores the given token: its logprob, its
// rank (1 + strictly greater logits, ties do not push it down), the top-N,
// and nothing the sampling rules would change (penalties, bans, the mask).
static void test_forced_token_scoring(void **state) {
    fixture f;
    setup_fixture(&f);
    f.p.forced = 1;
    f.p.forced_token = 60;
    f.p.logprobs = 3;
    f.p.temperature = 0.7f;         // ignored
    f.tok[16] = 60;                 // a ban of the forced token: ignored
    f.p.ban_offset = 16;
    f.p.n_ban = 1;
    float l[V];
    logits_ramp(l);
    l[10] = 61 / 8.0f; // ties 61: the forced token has 4 strictly above it (63, 62, 61, 10)
    pg_sample_out o;
    pg_sampler_sample(f.s, &f.p, f.tok, l, &o);
    double lse = 0;
    for (int i = 0; i < V; i++) lse += exp((double)l[i]);
    lse = log(lse);
    assert_int_equal(o.token, 60);
    assert_float_equal(o.logprob, 60 / 8.0 - lse, 1e-5);
    assert_int_equal(o.rank, 5);
    assert_int_equal(o.n_top, 3);
    assert_int_equal(o.top_ids[0], 63);
    assert_int_equal(o.top_ids[1], 62);
    assert_int_equal(o.top_ids[2], 10); // ties by lower id
    assert_float_equal(o.logprob, l[60] - lse, 1e-5); // logits not modified by the ban
    // The most likely token ranks 1; logprobs 0 gives no top entries.
    f.p.forced_token = 63;
    f.p.logprobs = 0;
    pg_sampler_sample(f.s, &f.p, f.tok, l, &o);
    assert_int_equal(o.token, 63);
    assert_int_equal(o.rank, 1);
    assert_int_equal(o.n_top, 0);
    // An unforced row reports rank 0.
    f.p.forced = 0;
    f.p.n_ban = 0;
    pg_sampler_sample(f.s, &f.p, f.tok, l, &o);
    assert_int_equal(o.rank, 0);
    pg_sampler_free(f.s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_and_logprobs),
        cmocka_unit_test(test_top_k_top_p_min_p),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_seed_determinism),
        cmocka_unit_test(test_penalties_and_eos_mask),
        cmocka_unit_test(test_forced_token_scoring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
