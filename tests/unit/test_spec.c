// tests/unit/test_spec.c - the speculative decoding building blocks: the
// n-gram proposer (engine/spec/ngram.h) against hand cases and a naive
// reference, and the acceptance rule (engine/spec/verify.h), greedy by
// hand and sampling by a chi-square test that it keeps the target's
// distribution.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "engine/spec/ngram.h"
#include "engine/spec/verify.h"
#include "kernels/sampling.h"

_Static_assert(PG_NGRAM_MAX_K == PG_SPEC_MAX_K, "a proposal must always fit the verifier");

#define ARR(...) ((const int32_t[]){__VA_ARGS__})
#define LEN(...) ((int32_t)(sizeof((int32_t[]){__VA_ARGS__}) / sizeof(int32_t)))

// Proposes for the history given and compares with want[0 .. nw).
static void expect_proposal(pg_ngram_config c, const int32_t *hist, int32_t n, int32_t limit,
                            const int32_t *want, int32_t nw) {
    int32_t out[PG_NGRAM_MAX_K];
    int32_t got = pg_ngram_propose(&c, hist, n, limit, out);
    assert_int_equal(got, nw);
    for (int32_t i = 0; i < nw; i++) assert_int_equal(out[i], want[i]);
}
#define EXPECT(min_n, max_n, k, limit, hist, want)                                                 \
    expect_proposal((pg_ngram_config){min_n, max_n, k}, ARR hist, LEN hist, limit, ARR want,       \
                    LEN want)
#define EXPECT_NONE(min_n, max_n, k, hist)                                                         \
    expect_proposal((pg_ngram_config){min_n, max_n, k}, ARR hist, LEN hist, 1000, NULL, 0)

static void test_ngram_cases(void **state) {
    // No earlier occurrence of any suffix.
    EXPECT_NONE(1, 3, 4, (1, 2, 3, 4));
    EXPECT_NONE(2, 2, 2, (1, 2, 3, 4, 1, 2, 3, 5, 6));
    // Too short a history: nothing, whatever the tokens.
    EXPECT_NONE(2, 3, 4, (7));
    expect_proposal((pg_ngram_config){1, 3, 4}, NULL, 0, 1000, NULL, 0);
    // vLLM's docstring example: [4 2 3] has no earlier occurrence, [2 3]
    // has; three tokens follow it before the history ends.
    EXPECT(2, 3, 4, 1000, (1, 2, 3, 4, 2, 3), (4, 2, 3));
    EXPECT(2, 2, 3, 1000, (1, 2, 3, 4, 1, 2, 3), (4, 1, 2));
    // The longest n-gram wins over an earlier shorter one: "5 7" at 2
    // rather than "7" at 0; with max_n 1 the "7" at 0 it is.
    EXPECT(1, 2, 2, 1000, (7, 9, 5, 7, 8, 1, 2, 5, 7), (8, 1));
    EXPECT(1, 1, 2, 1000, (7, 9, 5, 7, 8, 1, 2, 5, 7), (9, 5));
    // min_n excludes a match shorter than it ("7" at 0 here).
    EXPECT_NONE(2, 3, 2, (7, 9, 5, 7, 8, 1, 2, 3, 7));
    // max_n caps the length: "5 6" first occurs at 0, "4 5 6" only at 3.
    EXPECT(2, 2, 3, 1000, (5, 6, 9, 4, 5, 6, 1, 4, 5, 6), (9, 4, 5));
    EXPECT(2, 3, 3, 1000, (5, 6, 9, 4, 5, 6, 1, 4, 5, 6), (1, 4, 5));
    // Of several occurrences, the earliest.
    EXPECT(1, 1, 3, 1000, (3, 1, 3, 2, 3), (1, 3, 2));
    // Truncated at the history's end: two tokens follow "1 2".
    EXPECT(2, 2, 5, 1000, (1, 2, 1, 2), (1, 2));
    // k and the caller's limit cut the proposal.
    EXPECT(1, 2, 2, 1000, (1, 2, 3, 4, 5, 6, 1), (2, 3));
    EXPECT(1, 2, 6, 3, (1, 2, 3, 4, 5, 6, 1), (2, 3, 4));
    EXPECT_NONE(1, 2, 6, (1, 2, 3, 4, 5, 6, 2, 7));
    expect_proposal((pg_ngram_config){1, 2, 6}, ARR(1, 2, 3, 1), 4, 0, NULL, 0);
    // Repeats: an occurrence may overlap the suffix. "5 5 5" at 0 is
    // followed by the history's last 5 alone.
    EXPECT(1, 3, 4, 1000, (5, 5, 5, 5), (5));
    EXPECT(1, 1, 4, 1000, (5, 5, 5, 5), (5, 5, 5));
    // A period of three: the earliest "a b c" leaves the longest continuation.
    EXPECT(1, 3, 8, 1000, (1, 2, 3, 1, 2, 3, 1, 2, 3), (1, 2, 3, 1, 2, 3));
    EXPECT(1, 4, 2, 1000, (1, 2, 3, 1, 2, 3, 1, 2, 3), (1, 2));
}

static void expect_bad_config(pg_ngram_config c, const char *field) {
    assert_int_equal(pg_ngram_config_check(&c), PG_EINVAL);
    if (!strstr(pg_err_msg(), field)) fail_msg("message '%s' lacks '%s'", pg_err_msg(), field);
}

static void test_ngram_config(void **state) {
    assert_int_equal(pg_ngram_config_check(&(pg_ngram_config){1, 1, 1}), 0);
    assert_int_equal(pg_ngram_config_check(&(pg_ngram_config){2, 5, 4}), 0);
    assert_int_equal(pg_ngram_config_check(&(pg_ngram_config){1, PG_NGRAM_MAX_N, PG_NGRAM_MAX_K}),
                     0);
    expect_bad_config((pg_ngram_config){0, 3, 4}, "min_n 0");
    expect_bad_config((pg_ngram_config){-1, 3, 4}, "min_n -1");
    expect_bad_config((pg_ngram_config){3, 2, 4}, "max_n 2 below min_n 3");
    expect_bad_config((pg_ngram_config){1, PG_NGRAM_MAX_N + 1, 4}, "max_n 65");
    expect_bad_config((pg_ngram_config){1, 3, 0}, "k 0");
    expect_bad_config((pg_ngram_config){1, 3, PG_NGRAM_MAX_K + 1}, "k 65");
}

// The rule written the obvious way, O(n^2 max_n): for n from max_n down,
// the first start s < len - n whose n tokens equal the suffix's.
static int32_t naive_propose(pg_ngram_config c, const int32_t *t, int32_t len, int32_t limit,
                             int32_t *out) {
    int32_t k = c.k < limit ? c.k : limit;
    if (k <= 0) return 0;
    for (int32_t n = c.max_n; n >= c.min_n; n--) {
        for (int32_t s = 0; s + n < len; s++) {
            if (memcmp(t + s, t + len - n, (size_t)n * sizeof *t) != 0) continue;
            int32_t m = 0;
            for (; m < k && s + n + m < len; m++) out[m] = t[s + n + m];
            return m;
        }
    }
    return 0;
}

static uint64_t rng_next(uint64_t *s) { // xorshift64*: the tests' own stream
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}
static int32_t rng_below(uint64_t *s, int32_t n) {
    return (int32_t)(rng_next(s) % (uint64_t)n);
}

static void compare_with_naive(pg_ngram_config c, const int32_t *t, int32_t len, int32_t limit) {
    int32_t got[PG_NGRAM_MAX_K], want[PG_NGRAM_MAX_K];
    int32_t ng = pg_ngram_propose(&c, t, len, limit, got);
    int32_t nw = naive_propose(c, t, len, limit, want);
    if (ng != nw || memcmp(got, want, (size_t)nw * sizeof *got) != 0)
        fail_msg("len %d min_n %d max_n %d k %d limit %d: %d tokens, naive %d", len, c.min_n,
                 c.max_n, c.k, limit, ng, nw);
}

static void test_ngram_random_vs_naive(void **state) {
    enum { MAXLEN = 3000 };
    static int32_t t[MAXLEN];
    uint64_t s = 0x5eed5eedull;
    int32_t proposed = 0, cases = 0;
    for (int32_t iter = 0; iter < 20000; iter++) {
        // Small alphabets make matches of every length common; a history
        // made of a few repeated chunks makes long matches common too.
        int32_t len = rng_below(&s, iter < 19900 ? 120 : MAXLEN);
        int32_t alpha = 1 + rng_below(&s, 4);
        for (int32_t i = 0; i < len; i++) t[i] = rng_below(&s, alpha);
        if (iter % 3 == 0 && len > 8) // copy a random earlier chunk to the end
            for (int32_t i = len / 2, from = rng_below(&s, len / 2); i < len; i++, from++)
                t[i] = t[from];
        pg_ngram_config c = {1 + rng_below(&s, 6), 0, 1 + rng_below(&s, 10)};
        c.max_n = c.min_n + rng_below(&s, iter % 10 == 0 ? PG_NGRAM_MAX_N - c.min_n + 1 : 8);
        int32_t limit = rng_below(&s, 8) == 0 ? rng_below(&s, 4) : 1000;
        compare_with_naive(c, t, len, limit);
        int32_t out[PG_NGRAM_MAX_K];
        proposed += pg_ngram_propose(&c, t, len, limit, out) > 0;
        cases++;
    }
    printf("ngram vs naive: %d random histories, %d with a proposal\n", cases, proposed);
    // The corpus exercised both outcomes often.
    assert_true(proposed > cases / 4 && proposed < cases - cases / 20);
}

static void test_ngram_long_history_is_linear(void **state) {
    // A million tokens of one symbol: the worst case of a naive search,
    // one pass here. It finds max_n at 0 and the tokens after it.
    enum { N = 1 << 20 };
    int32_t *t = calloc(N, sizeof *t);
    assert_non_null(t);
    t[0] = 9;
    int32_t out[PG_NGRAM_MAX_K];
    pg_ngram_config c = {1, PG_NGRAM_MAX_N, PG_NGRAM_MAX_K};
    assert_int_equal(pg_ngram_propose(&c, t, N, 1000, out), PG_NGRAM_MAX_K);
    for (int32_t i = 0; i < PG_NGRAM_MAX_K; i++) assert_int_equal(out[i], 0);
    free(t);
}

// --- verification, greedy ---

static void expect_result(const pg_spec_result *r, int32_t accepted, const int32_t *tokens) {
    assert_int_equal(r->n_accepted, accepted);
    assert_int_equal(r->n_emitted, accepted + 1);
    for (int32_t i = 0; i <= accepted; i++) assert_int_equal(r->tokens[i], tokens[i]);
}

static void test_verify_greedy(void **state) {
    pg_spec_result r;
    const int32_t d[] = {4, 8, 15, 16};
    // All accepted: the drafts and the bonus argmax after them.
    assert_int_equal(pg_spec_verify_greedy(d, 4, ARR(4, 8, 15, 16, 23), &r), 0);
    expect_result(&r, 4, ARR(4, 8, 15, 16, 23));
    // None: the target's first argmax replaces the first draft.
    assert_int_equal(pg_spec_verify_greedy(d, 4, ARR(5, 8, 15, 16, 23), &r), 0);
    expect_result(&r, 0, ARR(5));
    // In the middle: later agreement does not matter after a mismatch.
    assert_int_equal(pg_spec_verify_greedy(d, 4, ARR(4, 8, 42, 16, 23), &r), 0);
    expect_result(&r, 2, ARR(4, 8, 42));
    // No drafts: a plain decoding step.
    assert_int_equal(pg_spec_verify_greedy(d, 0, ARR(7), &r), 0);
    expect_result(&r, 0, ARR(7));
    assert_int_equal(pg_spec_verify_greedy(d, -1, ARR(7), &r), PG_EINVAL);
    assert_int_equal(pg_spec_verify_greedy(d, PG_SPEC_MAX_K + 1, ARR(7), &r), PG_EINVAL);
}

// --- verification, sampling ---

#define V    6 // vocabulary of the sampling tests
#define SEED 0x0123456789abcdefull

// The inverse CDF in id order over float weights, computed as verify.c
// does (same operations, so the same token for the same u).
static int32_t cdf_pick(const float *w, int32_t v, double u) {
    double total = 0, acc = 0;
    int32_t last = -1;
    for (int32_t t = 0; t < v; t++) total += (double)w[t];
    double x = u * total;
    for (int32_t t = 0; t < v; t++) {
        if (w[t] <= 0) continue;
        acc += (double)w[t];
        last = t;
        if (x < acc) return t;
    }
    return last;
}

static void test_verify_sample_args(void **state) {
    float p[2 * V] = {0};
    p[0] = p[V] = 1;
    pg_spec_probs probs = {p, NULL, V};
    pg_spec_result r;
    assert_int_equal(pg_spec_verify_sample(ARR(V), 1, &probs, SEED, 0, &r), PG_EINVAL);
    assert_int_equal(pg_spec_verify_sample(ARR(-1), 1, &probs, SEED, 0, &r), PG_EINVAL);
    assert_int_equal(pg_spec_verify_sample(ARR(0), -1, &probs, SEED, 0, &r), PG_EINVAL);
    assert_int_equal(pg_spec_verify_sample(ARR(0), PG_SPEC_MAX_K + 1, &probs, SEED, 0, &r),
                     PG_EINVAL);
    assert_int_equal(pg_spec_verify_sample(ARR(0), 1, &probs, SEED, -1, &r), PG_EINVAL);
    probs.vocab = 0;
    assert_int_equal(pg_spec_verify_sample(ARR(0), 1, &probs, SEED, 0, &r), PG_EINVAL);
    probs.vocab = V;
    assert_int_equal(pg_spec_verify_sample(ARR(0), 1, &probs, SEED, 0, &r), 0);
    expect_result(&r, 1, ARR(0, 0));
}

// The documented counters, draw by draw: the accept test of the token at
// output position j reads pg_sampler_uniform(seed, PG_SPEC_ACCEPT_STREAM | j),
// the residual and bonus draws pg_sampler_uniform(seed, j).
static void test_verify_sample_counters(void **state) {
    const float p[2 * V] = {0.1f, 0.2f, 0.3f, 0.15f, 0.05f, 0.2f,
                            0.3f, 0.1f, 0.1f, 0.2f,  0.1f,  0.2f};
    float resid[V];
    memcpy(resid, p, sizeof resid);
    resid[2] = 0; // one-hot draft on 2: the residual is p_0 without it
    pg_spec_probs probs = {p, NULL, V};
    int32_t n_acc = 0;
    for (int32_t g = 0; g < 2000; g++) {
        pg_spec_result r, again;
        assert_int_equal(pg_spec_verify_sample(ARR(2), 1, &probs, SEED, g, &r), 0);
        int accept = pg_sampler_uniform(SEED, PG_SPEC_ACCEPT_STREAM | (uint64_t)g) < (double)p[2];
        if (accept)
            expect_result(&r, 1,
                          ARR(2, cdf_pick(p + V, V, pg_sampler_uniform(SEED, (uint64_t)g + 1))));
        else
            expect_result(&r, 0, ARR(cdf_pick(resid, V, pg_sampler_uniform(SEED, (uint64_t)g))));
        n_acc += accept;
        // Reproducible: the same seed and position give the same tokens.
        assert_int_equal(pg_spec_verify_sample(ARR(2), 1, &probs, SEED, g, &again), 0);
        assert_int_equal(again.n_emitted, r.n_emitted);
        assert_memory_equal(again.tokens, r.tokens, (size_t)r.n_emitted * sizeof *r.tokens);
        // No drafts: one plain draw from p_0 at the sampler's own counter.
        assert_int_equal(pg_spec_verify_sample(NULL, 0, &probs, SEED, g, &r), 0);
        expect_result(&r, 0, ARR(cdf_pick(p, V, pg_sampler_uniform(SEED, (uint64_t)g))));
    }
    assert_true(n_acc > 450 && n_acc < 750); // about 0.3 of 2000
}

static void test_verify_sample_one_hot_edges(void **state) {
    // p(d) = 1: always accepted, whatever the draw; p(d) = 0: never, and
    // the replacement is never d.
    float p[4 * V] = {0};
    p[3] = p[V + 1] = p[2 * V + 4] = 1;
    for (int32_t t = 0; t < V; t++) p[3 * V + t] = 1.0f / V;
    pg_spec_probs probs = {p, NULL, V};
    for (int32_t g = 0; g < 500; g++) {
        pg_spec_result r;
        assert_int_equal(pg_spec_verify_sample(ARR(3, 1, 4), 3, &probs, SEED, g, &r), 0);
        assert_int_equal(r.n_accepted, 3);
        assert_int_equal(pg_spec_verify_sample(ARR(3, 2, 4), 3, &probs, SEED, g, &r), 0);
        expect_result(&r, 1, ARR(3, 1)); // 2 rejected, 1 the only token left
    }
    // With draft probabilities: q = p accepts always; q(d) = 0 rejects.
    float q[3 * V];
    memcpy(q, p, sizeof q);
    probs.draft = q;
    pg_spec_result r;
    assert_int_equal(pg_spec_verify_sample(ARR(3, 1, 4), 3, &probs, SEED, 7, &r), 0);
    assert_int_equal(r.n_accepted, 3);
    q[3] = 0, q[5] = 1, p[5] = 0.5f, p[3] = 0.5f;
    assert_int_equal(pg_spec_verify_sample(ARR(3, 1, 4), 3, &probs, SEED, 7, &r), 0);
    expect_result(&r, 0, ARR(3)); // residual max(0, p - q) is all on 3
}

// Pearson's chi-square of counts h [V] (n in all) against probabilities p,
// over the cells p gives mass; a cell p gives none must be empty. *df gets
// the degrees of freedom.
static double chi_square(const int64_t *h, int64_t n, const float *p, int *df) {
    double x2 = 0;
    *df = -1;
    for (int32_t t = 0; t < V; t++) {
        if (p[t] <= 0) {
            assert_int_equal(h[t], 0);
            continue;
        }
        double e = (double)n * p[t];
        x2 += ((double)h[t] - e) * ((double)h[t] - e) / e;
        (*df)++;
    }
    return x2;
}

// The 0.1% critical values of chi-square for 1 .. 5 degrees of freedom: a
// correct sampler exceeds them once in a thousand seeds; the seeds below
// are fixed, so the test is deterministic, and the figures printed are far
// below the bound.
static void expect_matches(const char *what, const int64_t *h, int64_t n, const float *p) {
    static const double crit[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52};
    int df;
    double x2 = chi_square(h, n, p, &df);
    printf("%s: chi-square %.2f, %d degrees of freedom, %lld draws, bound %.2f\n", what, x2, df,
           (long long)n, crit[df]);
    assert_true(df >= 1 && df <= 5);
    assert_true(x2 < crit[df]);
}

static void random_distribution(uint64_t *s, float *p) {
    double sum = 0, w[V];
    for (int32_t t = 0; t < V; t++) sum += w[t] = 0.05 + (double)rng_below(s, 1000) / 1000.0;
    for (int32_t t = 0; t < V; t++) p[t] = (float)(w[t] / sum);
}

enum { K = 3, DRAWS = 200000 };

// Runs DRAWS verifications of K drafts, each at its own positions; the
// drafts come from q (NULL: the fixed one-hot drafts d). Counts the first
// token, the second where the first draft was kept, and the draft alone.
static void run_draws(const float *p, const float *q, const int32_t *d, int64_t h0[V],
                      int64_t h1[V], int64_t *n1, int64_t hd[V], int64_t *accepted) {
    pg_spec_probs probs = {p, q, V};
    memset(h0, 0, V * sizeof *h0), memset(h1, 0, V * sizeof *h1), memset(hd, 0, V * sizeof *hd);
    *n1 = *accepted = 0;
    for (int32_t n = 0; n < DRAWS; n++) {
        int32_t draft[K];
        for (int32_t i = 0; i < K; i++) // the draft's own stream: another seed
            draft[i] =
                q ? cdf_pick(q + i * V, V, pg_sampler_uniform(~SEED, (uint64_t)n * K + i)) : d[i];
        pg_spec_result r;
        assert_int_equal(pg_spec_verify_sample(draft, K, &probs, SEED, n * (K + 1), &r), 0);
        h0[r.tokens[0]]++;
        hd[draft[0]]++;
        if (r.n_emitted > 1) h1[r.tokens[1]]++, (*n1)++;
        *accepted += r.n_accepted;
    }
}

static void test_verify_sample_preserves_target(void **state) {
    uint64_t s = 0xfeedfacecafebeefull;
    float p[(K + 1) * V], q[K * V];
    for (int32_t i = 0; i <= K; i++) random_distribution(&s, p + i * V);
    for (int32_t i = 0; i < K; i++) random_distribution(&s, q + i * V);
    // Filtering (top-k, a grammar) leaves the target zeros the draft lacks.
    p[0] += p[4], p[4] = 0;
    int64_t h0[V], h1[V], hd[V], n1, accepted;
    run_draws(p, q, NULL, h0, h1, &n1, hd, &accepted);
    expect_matches("first token vs p_0 (draft probs)", h0, DRAWS, p);
    expect_matches("second token vs p_1 (draft probs)", h1, n1, p + V);
    // The acceptance rate at 0 is sum_t min(p_0, q_0).
    double want = 0;
    for (int32_t t = 0; t < V; t++) want += fmin(p[t], q[t]);
    printf("first draft accepted %.4f of draws, expected %.4f\n", (double)n1 / DRAWS, want);
    assert_true(fabs((double)n1 / DRAWS - want) < 0.005);
    // The test has power: the drafts alone, from q, fail it by far.
    int df;
    double x2 = chi_square(hd, DRAWS, q, &df);
    int64_t hp[V];
    memcpy(hp, hd, sizeof hp);
    hp[4] = 0; // p_0 gives 4 no mass: leave it out to compare q's draws with p
    double x2p = 0;
    for (int32_t t = 0; t < V; t++)
        if (p[t] > 0)
            x2p += ((double)hp[t] - DRAWS * p[t]) * ((double)hp[t] - DRAWS * p[t]) / (DRAWS * p[t]);
    printf("drafts vs q: chi-square %.2f; drafts vs p_0: %.0f\n", x2, x2p);
    assert_true(x2 < 20.52 && x2p > 1000);
}

static void test_verify_sample_one_hot_preserves_target(void **state) {
    uint64_t s = 0x0badc0ffee0ddf00ull;
    float p[(K + 1) * V];
    for (int32_t i = 0; i <= K; i++) random_distribution(&s, p + i * V);
    const int32_t d[K] = {2, 0, 5};
    int64_t h0[V], h1[V], hd[V], n1, accepted;
    run_draws(p, NULL, d, h0, h1, &n1, hd, &accepted);
    expect_matches("first token vs p_0 (one-hot draft)", h0, DRAWS, p);
    expect_matches("second token vs p_1 (one-hot draft)", h1, n1, p + V);
    printf("one-hot: first draft accepted %.4f, expected p_0(d_0) %.4f; mean accepted %.3f\n",
           (double)n1 / DRAWS, (double)p[d[0]], (double)accepted / DRAWS);
    assert_true(fabs((double)n1 / DRAWS - p[d[0]]) < 0.005);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram_cases),
        cmocka_unit_test(test_ngram_config),
        cmocka_unit_test(test_ngram_random_vs_naive),
        cmocka_unit_test(test_ngram_long_history_is_linear),
        cmocka_unit_test(test_verify_greedy),
        cmocka_unit_test(test_verify_sample_args),
        cmocka_unit_test(test_verify_sample_counters),
        cmocka_unit_test(test_verify_sample_one_hot_edges),
        cmocka_unit_test(test_verify_sample_preserves_target),
        cmocka_unit_test(test_verify_sample_one_hot_preserves_target),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
