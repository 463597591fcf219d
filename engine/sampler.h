// engine/sampler.h - choosing the next token from logits on the CPU.
//
// Order of operations (as vLLM): logprobs are taken from the raw logits;
// then penalties (repetition over prompt and output, presence and frequency
// over output), the min_tokens mask, temperature, top-k, top-p, min-p, and
// a draw from a counter-based RNG keyed by (sequence seed, tokens sampled
// so far), so a seeded request gives the same text however it is batched.
#pragma once
#include <stdint.h>

#include "scheduler/plan.h"

typedef struct pg_sampler pg_sampler;

int pg_sampler_create(int32_t vocab_size, pg_sampler **out);
void pg_sampler_free(pg_sampler *s);

// Samples for `seq` from logits[vocab] (modified in place) into `out`.
void pg_sampler_sample(pg_sampler *s, const pg_plan_seq *seq, float *logits, pg_seq_output *out);

// The uniform draw in [0, 1) used for (seed, counter); exposed for tests.
double pg_sampler_uniform(uint64_t seed, uint64_t counter);
