// kernels/cpu/sampling.h - the CPU sampler: one row of logits at a time,
// with kernels/sampling.h's rules. The reference every other sampler is
// tested against.
#pragma once
#include <stdint.h>

#include "kernels/sampling.h"

typedef struct pg_sampler pg_sampler;

int pg_sampler_create(int32_t vocab_size, pg_sampler **out);
void pg_sampler_free(pg_sampler *s);
int32_t pg_sampler_vocab(const pg_sampler *s);

// Samples one token from logits[vocab] (modified in place: penalties and
// bans) with parameters `p`; `tokens` holds the history and ban list that
// p's offsets point into.
void pg_sampler_sample(pg_sampler *s, const pg_sample_params *p, const int32_t *tokens,
                       float *logits, pg_sample_out *out);
