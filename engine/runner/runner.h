// engine/runner/runner.h - executes scheduler batch plans on any backend.
//
// The one runner: plan checks, input flattening (decode sequences first),
// one upload of the step's inputs, the model's forward, sampling, step
// begin/end (asynchronous on the GPU, synchronous on the CPU), CUDA-graph
// buckets for decode steps and the memory-profiling forward. The runner
// owns the KV memory (device blocks plus host swap blocks), the workspace
// sized at create for the largest step the scheduler may form, and two
// pinned input/output images; a step allocates nothing.
//
// Set-up is three calls, so the engine can size the KV pool from what is
// left after the weights and the profiled workspace:
//   pg_runner_create     workspace + (on a backend that measures memory) the
//                        profiling forward and the graph memory probe
//   pg_runner_mem        device memory by category (free = what is left)
//   pg_runner_alloc_kv   the KV pool and the host swap blocks; then the
//                        start-up capture of the decode graphs
// Design: docs/backend.md.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model/model.h"
#include "scheduler/plan.h"

typedef struct pg_runner pg_runner;

// CUDA graphs of decode steps. startup: every (batch, context) bucket is
// captured before serving; lazy: a bucket after its first eager step; off:
// every step eager. Ignored by a backend without graphs. PAGED_CUDA_GRAPHS=0
// in the environment forces off.
typedef enum pg_graph_mode {
    PG_GRAPHS_STARTUP = 0,
    PG_GRAPHS_OFF = 1,
    PG_GRAPHS_LAZY = 2,
} pg_graph_mode;
// --cuda-graphs: NULL or "on" (startup), "off", "lazy"; PG_EINVAL otherwise.
// Start-up (engine/setup.c), its option check and `paged plan` read the
// names here.
int pg_graph_mode_parse(const char *name, pg_graph_mode *out);
// Whether decode steps may run as graphs in `mode` (on a backend that
// captures): not in mode off, nor with PAGED_CUDA_GRAPHS=0 in the
// environment. The knob's one reader: the runner and `paged plan` ask here.
bool pg_runner_graphs_wanted(pg_graph_mode mode);
// The bytes per graph the reserve counts at least: the probe sees the
// allocator's 2 MiB pages, so it can measure less than a graph takes
// (engine/runner/runner_graphs.c). `paged plan` estimates with it.
#define PG_RUNNER_GRAPH_MIN_BYTES ((int64_t)1 << 20)
// The device bytes the KV budget leaves for the decode graphs of a runner
// with these limits (max_seqs as pg_runner_ws_limits caps it): every
// (batch, context) bucket at `per_graph` bytes, times 1.5, plus 16 MiB,
// for `sets` sets of buckets (2 with LoRA adapters: the plain graphs and
// those with the adapters' kernels in, runner_graphs.c).
// The runner passes its probe's measure, `paged plan` the floor above.
int64_t pg_runner_graph_reserve(int32_t max_seqs, int32_t max_model_len, int64_t per_graph, int32_t sets);

// The scales of an fp8 KV cache (engine/runner/runner_kv_scales.c): auto = the
// checkpoint's k_scale / v_scale, else calibrated at start-up per layer and
// KV head; one = 1.0 everywhere (vLLM's default without scales).
enum { PG_KV_SCALES_AUTO = 0, PG_KV_SCALES_ONE = 1 };
// "auto" or "one" (also "1" and "1.0"); PG_EINVAL naming the flag otherwise.
int pg_kv_scales_parse(const char *s, int32_t *out);

typedef struct pg_runner_config {
    int32_t block_size;             // tokens per KV block
    int32_t max_num_seqs;           // the scheduler's limits: the workspace is
    int32_t max_num_batched_tokens; //   sized for the largest step they allow
    int32_t max_model_len;
    int32_t kv_dtype;               // PG_KV_* (kernels/kernels.h): native, fp8 (CUDA), f32/f16/bf16/q8_0 (CPU)
    int32_t kv_scales;              // fp8 KV: PG_KV_SCALES_* (engine/runner/runner_kv_scales.c)
    pg_graph_mode graphs;
    // KV layer groups (engine/model/model.h pg_kv_layout, docs/kv_layer_groups.md):
    // the sliding-window layers keep their own block tables, which plans
    // carry (pg_batch_plan.kv_groups). Only where the backend's attention
    // runs windows (caps attn_window): the engine decides.
    bool kv_layer_groups;
    // Tensor parallelism: gather every logit even for plain-greedy steps,
    // whose ranks otherwise exchange only row maxima (pg_runner_last_logits
    // needs the logits: tests).
    bool full_logits;
} pg_runner_config;

// The runner's buffers for a configuration, computed from the dims alone
// (no backend, no weights): pg_runner_create allocates exactly `bytes` and
// two pinned images of `pinned / 2`; `paged plan` and the start-up advice
// (engine/memplan.h) size the same numbers before loading anything.
// The backend's own workspaces the runner's one allocation carries.
typedef struct pg_runner_ws_sizes {
    size_t attn, sample; // attn_workspace_bytes, sample_workspace_bytes
    size_t moe;          // moe_workspace_bytes for max_tokens rows (MoE models; else 0)
    size_t lora;         // lora_workspace_bytes for max_tokens rows (adapters; else 0)
} pg_runner_ws_sizes;

typedef struct pg_runner_ws_plan {
    int32_t max_tokens, max_seqs; // the largest step: max_num_batched_tokens, and
                                  //   max_num_seqs capped by it
    size_t inputs;                // packed step inputs (block tables, histories, masks)
    size_t attn, sample;          // the backend's attention and sampler workspaces
    size_t moe;                   // the backend's moe_ffn workspace for max_tokens rows (MoE models)
    size_t lora;                  // the backend's lora_apply workspace for max_tokens rows (adapters)
    size_t kv_scales;             // fp8 KV scales [n_layers][2][n_kv_heads] f32 (0: none)
    size_t bytes;                 // the whole workspace allocation (activations, logits,
                                  //   the two above, samples, inputs)
    size_t pinned;                // host: the two pinned input/output images
} pg_runner_ws_plan;

// The step limits the workspace is carved for (what attn_ws and sample_ws
// below are asked for: the backend's attn_workspace_bytes(max_seqs, shard
// heads, ..., max_model_len) and sample_workspace_bytes(max_seqs, vocab)).
void pg_runner_ws_limits(const pg_runner_config *cfg, int32_t *max_tokens, int32_t *max_seqs);
// The workspace of rank `sh` for `cfg` with activations in act_dtype.
void pg_runner_workspace_plan(const pg_model_config *mc, const pg_model_shard *sh, const pg_runner_config *cfg,
                              int32_t act_dtype, const pg_runner_ws_sizes *ws, pg_runner_ws_plan *out);

// `model` (and its backend) are borrowed and must outlive the runner.
int pg_runner_create(const pg_model *model, const pg_runner_config *cfg, pg_runner **out);
void pg_runner_free(pg_runner *r);

// Device memory by category, bytes (on the CPU: host bytes, total and free
// of the machine). other = total - free - the rest.
typedef struct pg_runner_mem {
    int64_t total, free;
    int64_t weights, kv, workspace, graphs, other;
    int64_t host_swap;         // host bytes of the swap blocks (swap preemption + host KV tier)
    // Host memory by category (the start-up log, paged:host_memory_bytes):
    // the mapped model file's bytes the weights point into (a backend that
    // borrows them: the CPU), the KV pool where the device is the host (the
    // CPU), and the pinned input/output images of the workspace.
    int64_t host_weights_mapped, host_kv, host_pinned;
    int64_t host_weights_offloaded; // --cpu-offload-gb: the layers' host copies (pinned on a GPU)
    int64_t workspace_buffers; // of `workspace`, the buffers the runner allocated
    int32_t n_graphs;          // graphs captured so far (`graphs` bytes)
    int64_t graphs_reserved;   // bytes set aside for graphs not captured yet (not in
                               //   `graphs`; part of `free`): the KV budget must leave them
    char device[160];          // the backend's description
} pg_runner_mem;
void pg_runner_mem_get(const pg_runner *r, pg_runner_mem *out);

// Bytes of one KV block (every layer of a group, K and V) in the configured dtype.
size_t pg_runner_kv_bytes_per_block(const pg_runner *r);
// The runner's KV layout (layer groups; one group when off).
const pg_kv_layout *pg_runner_kv_layout(const pg_runner *r);
// The KV cache (NULL before pg_runner_alloc_kv), for tools that read it
// (tests/tools/kv_quality.c: the magnitudes of K and V).
const pg_bkv *pg_runner_kv(const pg_runner *r);

// Allocates n_blocks KV blocks (block 0 is the pool's null block) and
// n_host_blocks swap blocks; PG_ENOMEM saying what would fit. Then, in the
// start-up graph mode, captures the decode graphs (the KV budget must leave
// pg_runner_mem.graphs_reserved free for them).
int pg_runner_alloc_kv(pg_runner *r, int32_t n_blocks, int32_t n_host_blocks);

// Runs one step: moves, forward, sampling. `out->outs` points into runner
// memory, valid until the next call. Fails on an invalid plan (ids out of
// range, a plan beyond the configured limits) or a device error.
int pg_runner_execute(pg_runner *r, const pg_batch_plan *plan, pg_step_output *out);

// The same in two halves (async scheduling, scheduler/sched.h): begin
// validates and flattens the plan and queues the step (it reads nothing of
// the plan afterwards); end waits for the oldest begun step and returns its
// outputs (`out->outs` valid until the next end). At most two steps open. A
// decode entry whose token is PG_TOKEN_PENDING gets the token its sequence
// sampled in the step begun just before (on the device); PG_EINVAL if that
// step did not sample it.
int pg_runner_begin(pg_runner *r, const pg_batch_plan *plan);

int pg_runner_end(pg_runner *r, pg_step_output *out);

// For tests: the f32 logits of the last ended step's sampled sequences, in
// plan order, out[n][vocab], as the model computed them (before penalties);
// PG_EINVAL once a later step is begun (its forward writes the same buffer).
int pg_runner_last_logits(pg_runner *r, float *out, int32_t n);
