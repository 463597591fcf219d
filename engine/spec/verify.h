// engine/spec/verify.h - the acceptance rule of speculative decoding
// (docs/speculative_decoding.md): given k draft tokens and the target
// model's view of the k + 1 positions they open (after the last accepted
// token, after each draft token), which drafts are kept and which token
// follows them. Pure host code over one sequence: no model, no allocation.
//
// Greedy: a draft is kept while it equals the target's argmax; the first
// mismatch is replaced by the argmax, and when all k match the argmax after
// the last one is the bonus token. The output is exactly what k + 1 greedy
// steps of the target alone would give.
//
// Sampling (Leviathan et al. 2023, Chen et al. 2023; vLLM's
// rejection_sampler): draft d_i is accepted with probability
// min(1, p_i(d_i) / q_i(d_i)); on the first rejection the token is drawn
// from norm(max(0, p_i - q_i)) and the rest is dropped; when all k are
// accepted the bonus token is drawn from p_k. Each emitted token is then
// distributed exactly as p at its position (tests/unit/test_spec.c checks
// it by a chi-square test).
//
// Randomness is counter-based (pg_sampler_uniform, kernels/sampling.h), so
// a seeded request draws the same numbers however it is batched. The token
// decided at output position j (j = n_generated + i for draft i, and
// n_generated + a for the token after a accepted drafts) uses:
//   accept test of draft i:      u = pg_sampler_uniform(seed, PG_SPEC_ACCEPT_STREAM | j)
//   residual or bonus draw:      u = pg_sampler_uniform(seed, j)
// The second is the counter the plain sampler uses for position j; the
// first is a separate stream (top bit set), so the two never share a draw.
#pragma once
#include <stdint.h>

#define PG_SPEC_MAX_K         64 // drafts verified per step at most (= PG_NGRAM_MAX_K)
#define PG_SPEC_ACCEPT_STREAM (1ull << 63)

// What a verification keeps: tokens[0 .. n_accepted) are the accepted
// drafts and tokens[n_accepted] the target's own token (the replacement or
// the bonus), so n_emitted = n_accepted + 1 always.
typedef struct pg_spec_result {
    int32_t n_accepted;
    int32_t n_emitted;
    int32_t tokens[PG_SPEC_MAX_K + 1];
} pg_spec_result;

// Greedy: draft [k], target [k + 1] the target's argmax at each position.
// PG_EINVAL when k is outside 0 .. PG_SPEC_MAX_K.
int pg_spec_verify_greedy(const int32_t *draft, int32_t k, const int32_t *target,
                          pg_spec_result *out);

// The target's and the draft's distributions for one sequence, each row a
// probability vector over the vocabulary (summing to 1: the target's after
// temperature, top-k, top-p and min-p, masked tokens at 0).
typedef struct pg_spec_probs {
    const float *target; // [(k + 1) * vocab]: row i is p_i
    const float *draft;  // [k * vocab]: row i is q_i; NULL: q_i is one-hot on
                         //   draft[i] (a proposer without a model, e.g. n-gram),
                         //   so the accept test is u < p_i(d_i) and the residual
                         //   is p_i without d_i
    int32_t vocab;
} pg_spec_probs;

// Sampling: draft [k] verified against probs, with the request's seed and
// n_generated (tokens it has sampled so far: the output position of
// draft 0). PG_EINVAL on k outside 0 .. PG_SPEC_MAX_K, vocab < 1 or a
// draft id outside the vocabulary. A draft with q_i(d_i) = 0 is rejected
// (as vLLM does: the draft could not have proposed it).
int pg_spec_verify_sample(const int32_t *draft, int32_t k, const pg_spec_probs *probs,
                          uint64_t seed, int32_t n_generated, pg_spec_result *out);
