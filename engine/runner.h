// engine/runner.h - executes a scheduler batch plan on a backend.
//
// The runner owns the KV memory (device cache plus the host swap mirror),
// the activation workspace and the sampler. It needs nothing but the plan:
// it performs the plan's block moves, runs one forward over every scheduled
// token, and samples for the sequences that ask for it.
#pragma once
#include <stdint.h>

#include "engine/llama.h"
#include "scheduler/plan.h"

typedef struct pg_runner pg_runner;

typedef struct pg_runner_config {
    int32_t n_blocks;       // device KV blocks (block 0 is the pool's null block)
    int32_t n_host_blocks;  // host swap blocks (0 = no swap space)
    int32_t block_size;     // tokens per block
} pg_runner_config;

// `model` and `be` are borrowed and must outlive the runner.
int pg_runner_create(const pg_llama *model, pg_backend *be, const pg_runner_config *cfg,
                     pg_runner **out);
void pg_runner_free(pg_runner *r);

// Runs one step. `out->outs` points into runner memory, valid until the next
// call. A decode entry whose token is PG_TOKEN_PENDING gets the
// token its sequence sampled in the previous call. Fails only on an invalid
// plan (token or block id out of range, a pending token with no sample
// behind it).
int pg_runner_execute(pg_runner *r, const pg_batch_plan *plan, pg_step_output *out);

// For tests: the f32 logits of the last step's sampled sequences, in plan
// order, [n][vocab], as the sampler left them (penalties and bans applied in
// place); NULL before the first step.
const float *pg_runner_last_logits(const pg_runner *r);

// Bytes of KV memory per block (device) for planning the pool size.
size_t pg_runner_kv_bytes_per_block(const pg_llama *model, int32_t block_size);

// Host bytes of the activation and logit buffers now (they grow to the
// largest step seen; 0 before the first).
size_t pg_runner_workspace_bytes(const pg_runner *r);
