// engine/memplan.h - what fits in memory, before anything is loaded.
//
// The planner sizes, per tensor-parallel rank, what start-up would allocate:
// the weights as the backend holds them (from the stored types and shapes
// in the file's headers, never the weights: pg_model_weight_plan), the
// runner's workspace (the same pure function the runner carves,
// pg_runner_workspace_plan), CUDA graphs and the KV pool that is left;
// then the KV tokens, the blocks and how many sequences of a given length
// fit at once. When a configuration does not fit it finds the flags that
// would make it fit, each with its numbers. `paged plan` (server/cmd_plan.c)
// prints it; engine/setup.c prints the same advice when start-up refuses a
// pool. Formulas and the CUDA estimates: docs/memory_planning.md.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"

#define PG_MEMPLAN_MAX_RANKS 64
#define PG_MEMPLAN_MAX_ADVICE 12

// What to plan: the engine's options plus the device's size.
typedef struct pg_memplan_in {
    pg_engine_config cfg;   // the flags (model, -tp, limits, KV options); borrowed strings
    bool cuda;              // plan for the CUDA backend (else the CPU's)
    int64_t device_total;   // CUDA: bytes of each GPU (--device-memory or the real one)
    int64_t device_other;   // CUDA: bytes in use that are not the model's (context, other
                            //   processes); < 0: the estimate of docs/memory_planning.md
    int32_t plan_seq_len;   // sequences of this many tokens (0: the max model length)
} pg_memplan_in;

typedef struct pg_memplan_rank {
    int64_t weights;            // as the backend holds them (offload: the resident ones and the slots)
    int64_t lora;               // of those, the LoRA adapters named at start-up (this rank's share)
    int64_t draft;              // rank 0: speculative decoding's draft model (weights, its KV, workspace)
    pg_offload_plan offload;    // --cpu-offload-gb: what moves to host memory
    int64_t quant_max_elems;    // the largest matrix kept quantized (FP8, int4): CUDA's dequantize scratch
    int64_t kv;                 // the KV pool (device blocks, block 0 included)
    int64_t workspace;          // buffers + extra
    int64_t workspace_buffers;  // the runner's allocation (exact)
    int64_t workspace_extra;    // CUDA: what the profiling forward adds (estimate)
    int64_t graphs;             // CUDA: the graph reserve (estimate)
    int64_t other;              // CUDA: context and other processes
    int64_t reserved;           // CUDA: total - utilization x total (never handed out)
    int64_t free;               // CUDA: what is left after everything (reserved included)
} pg_memplan_rank;

typedef struct pg_memplan {
    pg_model_config mc;
    bool cuda, kv_fp8;
    int32_t kv_dtype;          // pg_kv_shape.dtype (kernels/kernels.h)
    int32_t quantization;      // PG_QUANT_* (engine/model/model.h): --quantization
    int32_t experts_per_rank;  // the experts each rank holds (all of them but under
                               //   --enable-expert-parallel); 0 without experts
    int32_t lora_adapters, lora_slots; // --lora-modules named; --max-loras slots (0: LoRA off)
    int32_t tp, block_size, max_num_seqs, max_num_batched_tokens, max_model_len, plan_seq_len;
    double util;                 // CUDA: --gpu-memory-utilization
    int64_t device_total;        // CUDA: per GPU
    pg_memplan_rank ranks[PG_MEMPLAN_MAX_RANKS];
    size_t per_block;            // bytes of one KV block on one rank
    int32_t kv_blocks;           // the pool, block 0 (the null block) included
    int64_t kv_tokens;           // (kv_blocks - 1) x block_size; with KV layer groups the
                                 //   tokens of plan_seq_len-token sequences it holds
    int32_t kv_groups;           // KV layer groups: block tables a sequence (1: one for every layer)
    int32_t kv_group_window;     //   the windowed groups' window (0: none)
    int32_t kv_layers_per_block; //   the layers a block holds (every layer without groups)
    double kv_group_gain;        //   tokens of plan_seq_len sequences against one table for every layer
    int32_t host_blocks;         // swap blocks (--swap-space, --preemption-mode swap)
    int64_t seqs;                // concurrent sequences of plan_seq_len tokens
    int32_t need_blocks;         // blocks one sequence of max_model_len needs (+ the null block)
    bool fits;
    char why[256];               // when it does not fit: the reason
} pg_memplan;

// One way to make it fit: the flags to add, and the plan with them.
typedef struct pg_memplan_advice {
    char flags[96];
    pg_memplan plan;
} pg_memplan_advice;

// The plan for `in`; PG_E* for a model that cannot be read or split, or
// options that start-up would refuse (a fitting failure is not an error:
// out->fits is false and out->why says why).
int pg_memplan_compute(const pg_memplan_in *in, pg_memplan *out);

// The KV cache's element type from --kv-cache-dtype (NULL: auto) for the
// CPU or CUDA backend: PG_KV_NATIVE for auto (resolved with the model), or
// an error naming what each device takes. Read before the model loads.
int pg_kv_dtype_parse(const char *name, bool on_cpu, int32_t *out);
// The same with the model's head_dim: auto on the CPU is f16 in the
// llama.cpp-compatible numerics and f32 in exact ones; q8_0 needs head_dim
// % 32 == 0. The one rule engine/setup.c and the planner both follow.
int pg_kv_dtype_resolve(const pg_engine_config *cfg, bool on_cpu, int32_t head_dim, int32_t *out);

// Alternatives to `in` that fit (only flags this build has), best first;
// the number written (0 when nothing found). Each one is a full plan.
int pg_memplan_advise(const pg_memplan_in *in, pg_memplan_advice *out, int cap);

// The plan as text (lines for a terminal) or one JSON document (with the
// advice when it does not fit); malloc'd.
char *pg_memplan_text(const pg_memplan *p, const pg_memplan_advice *adv, int n_adv);
char *pg_memplan_json(const pg_memplan *p, const pg_memplan_advice *adv, int n_adv);
// The advice lines alone ("  --max-model-len 2032: 2032 KV tokens, 1 sequence of 2032"), malloc'd.
char *pg_memplan_advice_text(const pg_memplan_advice *adv, int n_adv);

// Start-up's refusal of a KV pool (engine/setup.c): logs the flags that
// would fit, one line each (the advice of `paged plan`), and returns `code`
// with `msg` (copied first) followed by those flags. device_total and
// device_other: the GPU's, as measured (ignored on the CPU).
int pg_memplan_refuse(const pg_engine_config *cfg, bool cuda, int64_t device_total, int64_t device_other, int code,
                      const char *msg);

// Host KV blocks (swap preemption and the host tier of the prefix cache)
// for a pool of `kv_blocks` device blocks of `per_block` bytes: --swap-space
// when given (cfg->swap_bytes >= 0); else on the GPU 4 GiB bounded by a
// tenth of `host_ram` (0 = unknown: no bound); on the CPU none, unless
// --preemption-mode swap (then as many as the device pool). The CPU's
// "device" blocks are host memory already: a host tier there would copy
// KV from host memory to host memory, buying reuse only at the price of
// RAM that --kv-cache-memory could give the device pool directly; so it
// is opt-in there (--swap-space), where a test or a small device pool
// wants it.
int32_t pg_host_kv_blocks(const pg_engine_config *cfg, bool cuda, int32_t kv_blocks, size_t per_block,
                          int64_t host_ram);

// Physical memory of this machine, bytes (0 when unknown).
int64_t pg_host_ram_bytes(void);

// This machine's GPU 0: its size and what is in use on it now (a context
// made for the question included). 0 with the sizes; PG_EUNSUPP with `why`
// in the message when there is none (no driver, a build without CUDA).
int pg_memplan_local_gpu(int64_t *total, int64_t *in_use);
