// engine/spec/verify.c - the acceptance rule of speculative decoding
// (engine/spec/verify.h).
#include "engine/spec/verify.h"

#include <stddef.h>

#include "common/err.h"
#include "kernels/sampling.h"

int pg_spec_verify_greedy(const int32_t *draft, int32_t k, const int32_t *target,
                          pg_spec_result *out) {
    PG_ARG(k >= 0 && k <= PG_SPEC_MAX_K, "speculative verify: k %d outside 0 .. %d", k,
           PG_SPEC_MAX_K);
    int32_t a = 0;
    while (a < k && draft[a] == target[a]) {
        out->tokens[a] = draft[a];
        a++;
    }
    out->tokens[a] = target[a];
    out->n_accepted = a;
    out->n_emitted = a + 1;
    return 0;
}

// The mass the residual max(0, p - q) gives token t; q NULL is one-hot on d.
static double residual_at(const float *p, const float *q, int32_t d, int32_t t) {
    double r = (double)p[t] - (q ? (double)q[t] : (t == d ? 1.0 : 0.0));
    return r > 0 ? r : 0;
}

// Inverse-CDF draw from the weights w(t) = residual_at(p, q, d, t) (q and d
// unused when `plain`: w = p), in id order. An all-zero residual (p == q up
// to rounding, where rejection had probability ~0) falls back to p.
static int32_t draw(const float *p, const float *q, int32_t d, int32_t vocab, int plain, double u) {
    double total = 0;
    for (int32_t t = 0; t < vocab; t++) total += plain ? (double)p[t] : residual_at(p, q, d, t);
    if (!plain && total <= 0) return draw(p, q, d, vocab, 1, u);
    double x = u * total, acc = 0;
    int32_t last = -1; // the last token with mass: rounding may walk past the end
    for (int32_t t = 0; t < vocab; t++) {
        double w = plain ? (double)p[t] : residual_at(p, q, d, t);
        if (w <= 0) continue;
        acc += w;
        last = t;
        if (x < acc) return t;
    }
    PG_CHECK(last >= 0); // p is all zero: the caller broke the contract
    return last;
}

// Whether draft d is kept: u < p(d) / q(d), compared as u * q(d) < p(d)
// so q(d) = 0 rejects and no division is needed; u in [0, 1) makes the
// chance exactly min(1, p(d) / q(d)).
static int accept(const float *p, const float *q, int32_t d, double u) {
    double qd = q ? (double)q[d] : 1.0;
    return qd > 0 && u * qd < (double)p[d];
}

int pg_spec_verify_sample(const int32_t *draft, int32_t k, const pg_spec_probs *probs,
                          uint64_t seed, int32_t n_generated, pg_spec_result *out) {
    const int32_t v = probs->vocab;
    PG_ARG(k >= 0 && k <= PG_SPEC_MAX_K, "speculative verify: k %d outside 0 .. %d", k,
           PG_SPEC_MAX_K);
    PG_ARG(v >= 1, "speculative verify: vocab %d", v);
    PG_ARG(n_generated >= 0, "speculative verify: n_generated %d", n_generated);
    for (int32_t i = 0; i < k; i++)
        PG_ARG(draft[i] >= 0 && draft[i] < v, "speculative verify: draft %d is token %d, vocab %d",
               i, draft[i], v);
    int32_t a = 0;
    for (; a < k; a++) {
        const uint64_t pos = (uint64_t)n_generated + (uint64_t)a;
        const float *p = probs->target + (size_t)a * (size_t)v;
        const float *q = probs->draft ? probs->draft + (size_t)a * (size_t)v : NULL;
        if (!accept(p, q, draft[a], pg_sampler_uniform(seed, PG_SPEC_ACCEPT_STREAM | pos))) {
            // Rejected: the residual's token replaces it, the drafts after it are dropped.
            out->tokens[a] = draw(p, q, draft[a], v, 0, pg_sampler_uniform(seed, pos));
            break;
        }
        out->tokens[a] = draft[a];
    }
    if (a == k) { // every draft kept: the bonus token from p_k
        const uint64_t pos = (uint64_t)n_generated + (uint64_t)k;
        out->tokens[k] = draw(probs->target + (size_t)k * (size_t)v, NULL, -1, v, 1,
                              pg_sampler_uniform(seed, pos));
    }
    out->n_accepted = a;
    out->n_emitted = a + 1;
    return 0;
}
