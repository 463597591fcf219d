// engine/dist/executor.h - the tensor-parallel workers: one backend, model shard
// and runner per rank, all driven by the same step plan.
//
// With one rank (no tensor parallelism) everything runs on the caller's
// thread and the executor is a thin wrapper of the runner. With N ranks,
// rank 0 runs on the caller's thread (the engine thread) and ranks 1..N-1
// each on a worker thread of their own (one per GPU, with its own device,
// stream, weight shard, KV memory and CUDA graphs); every call below runs
// on every rank at once and returns when all are done, with the first
// failing rank's error. Block ids are the same on every rank, so the
// scheduler and the KV pool see one device. Ranks meet in the model's
// collectives (kernels/comm/comm.h: NCCL on CUDA, the in-process communicator
// on the CPU). Design: docs/tensor_parallel.md.
#pragma once
#include <stdint.h>

#include "engine/model/model.h"
#include "engine/runner/runner.h"
#include "kernels/kernels.h"

typedef struct pg_executor pg_executor;

typedef struct pg_executor_config {
    int32_t tp;                 // ranks (>= 1)
    const char *device;         // "cpu", "cuda", "auto" (the GPUs when found); required
    int32_t n_threads;          // CPU backend threads in all (0 = every online CPU), split across ranks
    pg_matmul_mode matmul_mode; // CPU numerics
    const char *comm;           // "auto" (NULL: nccl on CUDA, cpu on the CPU), "cpu", "nccl"
    // Several nodes (engine/dist/remote.h): tp / nnodes ranks on each; node 0
    // drives, the others follow (pg_executor_follow). The collectives go
    // over NCCL on GPUs, else over the tcp communicator on master_port + 1.
    int32_t nnodes, node_rank;  // 0 or 1 node: one host
    const char *master_addr;
    int32_t master_port;
    // tcp: a collective's wait for a peer that sends nothing before it
    // fails (0 = 300 s; --tp-timeout).
    int32_t op_timeout_ms;
    // Several nodes: what every node must share, sent in the hello and
    // compared by node 0 (engine/dist/node_config.h); NULL: all zeros.
    const struct pg_node_config *node_config;
} pg_executor_config;

// Makes every rank's backend and communicator and loads every rank's shard
// (in parallel). Bad configurations fail before any weight is read, with
// one line naming the numbers: more ranks than GPUs, a model that does not
// split (engine/model/model.h pg_model_shard_plan), a communicator that cannot
// serve the device.
int pg_executor_create(const pg_executor_config *cfg, const pg_model_load_opts *mo, pg_executor **out);
void pg_executor_free(pg_executor *ex);

// Ranks in all (every node's); backend and model of a rank on this node.
int32_t pg_executor_size(const pg_executor *ex);
pg_backend *pg_executor_backend(const pg_executor *ex, int32_t rank);
const pg_model *pg_executor_model(const pg_executor *ex, int32_t rank);

// The runners (engine/runner/runner.h), one per rank, each sized by `cfg`.
int pg_executor_runners_create(pg_executor *ex, const pg_runner_config *cfg);
// Device memory by category per rank, as of the last refresh (each rank
// reads its own device on its own thread).
int pg_executor_mem_refresh(pg_executor *ex);
void pg_executor_mem_get(const pg_executor *ex, int32_t rank, pg_runner_mem *out);
// Bytes of one KV block on one rank (the same on every rank).
size_t pg_executor_kv_bytes_per_block(const pg_executor *ex);
// Rank `rank`'s KV cache (pg_runner_kv).
const pg_bkv *pg_executor_kv(const pg_executor *ex, int32_t rank);
int pg_executor_alloc_kv(pg_executor *ex, int32_t n_blocks, int32_t n_host_blocks);

// pg_runner_begin/_end/_execute on every rank (and node: the plan carries
// the token masks); outputs are rank
// 0's (every rank samples the same tokens from the same logits; end checks
// that they did).
int pg_executor_begin(pg_executor *ex, const pg_batch_plan *plan);
int pg_executor_end(pg_executor *ex, pg_step_output *out);
int pg_executor_execute(pg_executor *ex, const pg_batch_plan *plan, pg_step_output *out);
int pg_executor_last_logits(pg_executor *ex, float *out, int32_t n);
// LoRA slot `slot` of every rank's model (and node's) filled with the adapter
// in `dir`, or emptied (dir NULL): pg_model_lora_set on each, between steps.
int pg_executor_lora_set(pg_executor *ex, int32_t slot, const char *dir);
// Why --device auto chose the CPU ("--device auto: no CUDA device found
// ...; running on the CPU"), or "" when it did not.
const char *pg_executor_device_note(const pg_executor *ex);

// Nodes 1..n-1: runs node 0's calls on this node's ranks until node 0 says
// quit (0) or the link breaks (an error).
int pg_executor_follow(pg_executor *ex);
