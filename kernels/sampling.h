// kernels/sampling.h - what every backend's sampler takes and returns.
//
// One parameter struct and one result struct for the CPU sampler
// (kernels/cpu/sampling.c, the reference) and the GPU sampler
// (kernels/cuda/sampling.cu). The runner (engine/runner/runner.c) fills them from
// the scheduler's plan, once for every backend.
//
// Order of operations (as vLLM): logprobs are taken from the raw logits;
// then penalties (repetition over prompt and output, presence and frequency
// over output), banned ids (the min_tokens mask), logit bias, the allowed-
// token bitmask (structured outputs), greedy when temperature
// <= 0 or top_k == 1; else temperature, a window of 30 nats, top-k, top-p,
// min-p over the candidates sorted by logit (ties by lower id) and a draw
// u = pg_sampler_uniform(seed, n_generated) walked down that order, so a
// seeded request gives the same text however it is batched. A forced row
// skips all of it: its token is given and only scored.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PG_SAMPLE_MAX_LOGPROBS 20

// Per-sequence parameters, an array [n] in the backend's memory.
typedef struct pg_sample_params {
    float temperature;        // <= 0: greedy
    float top_p;              // 1 = off
    float min_p;              // 0 = off
    float repetition_penalty; // 1 = off; over prompt and output tokens
    float presence_penalty;   // 0 = off; over output tokens
    float frequency_penalty;  // 0 = off; over output tokens
    int32_t top_k;            // 0 or -1 = off; 1 = greedy
    int32_t logprobs;         // -1: none; 0..20: logprob of the token + that many top entries
    uint64_t seed;            // per-sequence RNG seed
    int32_t n_generated;      // RNG counter: tokens this sequence has sampled so far
    int32_t hist_offset;      // history (prompt then output) at tokens[hist_offset ..
    int32_t n_history;        //   + n_history); only when a penalty reads it
    int32_t n_prompt;         // the first n_prompt of it are the prompt
    int32_t ban_offset;       // token ids set to -inf: tokens[ban_offset .. + n_ban)
    int32_t n_ban;            //   (EOS and stop ids while min_tokens is not reached)
    int32_t bias_offset;      // logit bias: n_bias pairs (id, float bits) at
    int32_t n_bias;           //   tokens[bias_offset .. + 2 * n_bias), added after the bans
    int32_t mask_offset;      // allowed tokens (structured outputs, allowed_token_ids):
    int32_t n_mask;           //   bit (t & 31) of tokens[mask_offset + (t >> 5)], n_mask
                              //   words (0 = no mask; tokens past them are not allowed).
                              //   Applied last: a token whose bit is clear is never sampled.
    int32_t forced;           // 1: no sampling: out->token = forced_token, scored from the raw
    int32_t forced_token;     //   logits (logprob, rank, top-N); prompt logprobs (the runner's
                              //   engine/runner/runner_prompt_logprobs.c). Every other field but
                              //   logprobs is ignored then.
} pg_sample_params;

// Per-sequence result, an array [n] in the backend's memory; the host reads
// back these few hundred bytes per sequence, never the logits.
typedef struct pg_sample_out {
    int32_t token;
    float logprob; // log-softmax of the raw logits at `token` (0 when logprobs < 0)
    int32_t n_top; // min(logprobs, 20) entries, most likely first, ties by lower id
    int32_t rank;  // forced with logprobs >= 0: 1 + the tokens whose raw logit is greater
                   //   than token's (vLLM's rank); else 0
    int32_t top_ids[PG_SAMPLE_MAX_LOGPROBS];
    float top_logprobs[PG_SAMPLE_MAX_LOGPROBS];
} pg_sample_out;

// The uniform draw in [0, 1) for (seed, counter): splitmix64 of both, 53
// bits. Both samplers use it bit for bit.
double pg_sampler_uniform(uint64_t seed, uint64_t counter);

#ifdef __cplusplus
}
#endif
