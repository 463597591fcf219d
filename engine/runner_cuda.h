// engine/runner_cuda.h - executes scheduler batch plans on a CUDA device.
//
// The same contract as engine/runner.h (plan in, sampled tokens out; the
// runner owns the KV memory and needs nothing but the plan), with the model
// on the GPU: kernels/cuda/cuda_model.h holds the device half, this is the
// host half (weights upload, plan -> flattened batch with decode sequences
// first, sampling parameters). Design: docs/cuda_runner.md.
//
// Set-up is three calls, so the engine can size the KV pool from what is
// left after the weights and the profiled workspace:
//   pg_cuda_runner_create     weights on the device, workspace, profiling step
//   pg_cuda_runner_mem        device memory by category (free = what is left)
//   pg_cuda_runner_alloc_kv   the KV pool and the host swap blocks
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/llama.h"
#include "kernels/cuda/cuda_model.h"
#include "scheduler/plan.h"

typedef struct pg_cuda_runner pg_cuda_runner;

typedef struct pg_cuda_runner_config {
    int device;                     // CUDA device index
    int32_t block_size;             // tokens per KV block
    int32_t max_num_seqs;           // the scheduler's limits: the workspace is
    int32_t max_num_batched_tokens; //   sized for the largest step they allow
    int32_t max_model_len;
    bool dummy_weights; // random weights generated on the device
    uint64_t dummy_seed;
    float dummy_std; // 0 = 0.02
    pg_cuda_graph_mode graphs; // decode CUDA graphs: 0 = captured at start-up (in alloc_kv)
    int32_t kv_dtype;          // PG_KV_BF16 (0) or PG_KV_FP8_E4M3 (kernels/kernels.h)
} pg_cuda_runner_config;

// The number of usable CUDA devices; 0 with `why` saying why not ("built
// without CUDA", no device). Never fails.
int pg_cuda_runner_probe(char *why, size_t cap);

// Uploads `model`'s weights (any pg_dtype: bf16 rows are copied, others
// dequantized row by row to f32 and converted on the device; Q|K|V and
// gate|up fused) or, with dummy_weights, generates them; then sizes the
// workspace and runs the profiling step. `model` is borrowed and must
// outlive the runner (its config and inv_freq are read; its weight data
// only during this call).
int pg_cuda_runner_create(const pg_llama *model, const pg_cuda_runner_config *cfg,
                          pg_cuda_runner **out);
void pg_cuda_runner_free(pg_cuda_runner *r);

// Bytes of one KV block on the device (every layer, K and V; 2 bytes per
// element for PG_KV_BF16, 1 for PG_KV_FP8_E4M3).
size_t pg_cuda_runner_kv_bytes_per_block(const pg_model_config *c, int32_t block_size, int32_t kv_dtype);

void pg_cuda_runner_mem(const pg_cuda_runner *r, pg_cuda_mem_stats *out);

// Allocates n_blocks device KV blocks (block 0 is the pool's null block) and
// n_host_blocks pinned swap blocks. PG_ENOMEM saying what would fit. Then,
// with cfg.graphs PG_CUDA_GRAPHS_STARTUP, captures the decode CUDA graphs
// (pg_cuda_model_capture_graphs): the KV budget must leave
// pg_cuda_mem_stats.graphs_reserved free for them.
int pg_cuda_runner_alloc_kv(pg_cuda_runner *r, int32_t n_blocks, int32_t n_host_blocks);

// Runs one step: moves, forward, sampling. `out->outs` points into runner
// memory, valid until the next call. Fails on an invalid plan (ids out of
// range, a plan beyond the configured limits) or a device error.
// begin + end with no step open.
int pg_cuda_runner_execute(pg_cuda_runner *r, const pg_batch_plan *plan, pg_step_output *out);

// The same in two halves (async scheduling, scheduler/sched.h): begin
// validates and flattens the plan and queues the step on the device (it
// reads nothing of the plan afterwards); end waits for the oldest begun
// step and returns its outputs (`out->outs` valid until the next end). At
// most two steps open. A decode entry whose token is PG_TOKEN_PENDING gets
// the token its sequence sampled in the step begun just before (on the
// device); PG_EINVAL if that step did not sample it.
int pg_cuda_runner_begin(pg_cuda_runner *r, const pg_batch_plan *plan);
int pg_cuda_runner_end(pg_cuda_runner *r, pg_step_output *out);

// For tests: the f32 logits of the last step's sampled sequences, in plan
// order, out[n][vocab].
int pg_cuda_runner_last_logits(pg_cuda_runner *r, float *out, int32_t n);
