// engine/engine.h - the engine thread: model, scheduler and runner behind
// two queues.
//
// The loop thread (HTTP server) or the CLI submits requests and aborts; the
// engine thread admits them to the scheduler, plans a step, runs it, and
// publishes per-sequence events. Submissions and events are the only way in
// and out; `notify` is called (from the engine thread) whenever events are
// ready, e.g. uv_async_send for the server or a condition variable for the
// CLI. The engine never touches a socket.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "text/template/chat_template.h"
#include "engine/model/model.h"
#include "text/tokenizer/tokenizer.h"
#include "scheduler/sched.h"
#include "engine/spec/ngram.h"

typedef struct pg_engine pg_engine;

#define PG_MAX_LORA_MODULES 64 // --lora-modules entries

// Speculative decoding (--speculative-config; docs/speculative_decoding.md).
typedef struct pg_spec_options {
    bool ngram;               // method "ngram" (prompt lookup); false: off
    pg_ngram_config ngram_cfg; // prompt_lookup_min / _max, num_speculative_tokens (<= PG_MAX_DRAFT)
    bool draft;               // method "draft_model" (engine/draft_model.h); false: off
    int32_t draft_k;          // its num_speculative_tokens (<= PG_MAX_DRAFT)
    char draft_model[1024];   // its "model": a GGUF file or Hugging Face directory
    char replay[1024];        // its "replay": the replay draft's JSONL file ("": off; engine/draft_replay.h)
    double replay_error_rate; // its "replay_error_rate" (0 .. 1)
    uint64_t replay_seed;     // its "replay_seed"
    int32_t max_running_seqs; // backoff, vLLM's disable_by_batch_size (0: SCHED_SPEC_DEFAULT_MAX_SEQS)
} pg_spec_options;

typedef struct pg_engine_config {
    const char *model_path;      // GGUF file or Hugging Face directory
    const char *chat_template;   // NULL = the model's; a family name or a file
    const char *device;          // "auto" (NULL: the GPU when one is found), "cpu", "cuda"
    int n_threads;               // CPU backend threads (0 = all)
    pg_matmul_mode matmul_mode;  // CPU: exact f32 or llama.cpp-style quantized activations
    int64_t kv_cache_bytes;      // device KV memory (0 = default)
    int32_t kv_blocks;           // overrides kv_cache_bytes when > 0
    int64_t swap_bytes;          // host KV blocks: swap space + host tier (-1 = default, 0 = none)
    bool no_host_kv_cache;       // host blocks for swap preemption only (no host tier)
    bool host_kv_reused_only;    // --host-kv-offload reused: the tier copies only blocks hit since cached
    // KV layer groups off (vLLM's --disable-hybrid-kv-cache-manager): every
    // layer in one block table, sliding-window layers keeping every block.
    bool disable_kv_layer_groups;
    int32_t max_model_len;       // 0 = the model's context length
    sched_config sched;          // block size, budgets, policy, preemption
    pg_spec_options spec;        // speculative decoding (off)
    bool batched_tokens_set;     // --max-num-batched-tokens given: else a per-device default
                                 //   (pg_engine_sched_limits: PG_DEFAULT_CPU_BATCHED_TOKENS on
                                 //   the CPU, the scheduler's default on a GPU)
    // GPU (device "cuda", or "auto" when a GPU is found).
    double gpu_memory_utilization; // share of device memory for weights, workspace and KV
                                   //   (0 = PG_DEFAULT_GPU_MEMORY_UTILIZATION)
    const char *load_format;     // NULL or "auto": weights from model_path; "dummy": random
                                 //   weights generated on the GPU, shape from hf_config
    const char *hf_config;       // config.json (file or directory) for load_format "dummy"
    const char *tokenizer;       // tokenizer source (GGUF file, HF directory or tokenizer.json);
                                 //   NULL = the model's (dummy: a synthetic byte-level one)
    const char *cuda_graphs;     // decode CUDA graphs: NULL or "on" (captured at start-up),
                                 //   "lazy" (on a bucket's first step), "off"
    int32_t quantization;        // PG_QUANT_* (engine/model/model.h): online quantization at load
    int64_t cpu_offload_bytes;   // --cpu-offload-gb: layer weights kept in host memory and
                                 //   streamed to the device (engine/model/model_offload.c); 0 = none
    const char *kv_cache_dtype;  // NULL or "auto" (bf16 on CUDA; on the CPU f16, f32 in exact
                                 //   numerics), "bf16", "fp8" (e4m3, scaled: kv_cache_scales), "f32", "f16",
                                 //   "q8_0", "fp8_e4m3_scaled" (CPU only)
    int32_t kv_cache_scales;     // fp8 KV: PG_KV_SCALES_AUTO (the checkpoint's, else calibrated
                                 //   at start-up) or _ONE (1.0); engine/runner/runner.h
    const char *async_scheduling; // NULL or "auto" (on with CUDA, off on the CPU), "on", "off":
                                 //   plan step N + 1 while step N runs (scheduler/sched.h)
    int32_t tensor_parallel;     // ranks (0 or 1: none); engine/dist/executor.h
    bool expert_parallel;        // --enable-expert-parallel: whole experts per rank (docs/moe.md);
                                 //   ignored, with a log line, for a model without experts
    bool moe_alltoall;           // --all2all-backend alltoall: expert parallelism's combine by
                                 //   all-to-all (engine/model/moe_a2a.c); false: the all-reduce
    const char *tp_comm;         // NULL or "auto" (nccl on CUDA, cpu on the CPU), "cpu", "nccl"
    int32_t nnodes, node_rank;   // tensor parallelism across nodes (engine/dist/remote.h)
    const char *master_addr;     //   node 0's address (default 127.0.0.1)
    int32_t master_port;         //   its control port (default 29500; the tcp data plane + 1)
    int32_t tp_timeout_ms;       //   tcp data plane: a collective's wait for a silent rank (0 = 300 s)
    // LoRA (docs/lora.md; vLLM's flags): --enable-lora, adapters named by
    // --lora-modules name=path, --max-loras slots (0: as many as named; the
    // first that many adapters start in them, the rest are brought into a
    // slot when a request names them, evicting the least recently used
    // idle one), --max-cpu-loras adapters known at once (0: max(slots,
    // named)), --max-lora-rank (0: PG_DEFAULT_MAX_LORA_RANK).
    bool enable_lora;
    bool allow_runtime_lora_updating; // /v1/load_lora_adapter and /v1/unload_lora_adapter
    int32_t n_lora;
    const char *lora_names[PG_MAX_LORA_MODULES];
    const char *lora_paths[PG_MAX_LORA_MODULES];
    int32_t max_loras, max_lora_rank, max_cpu_loras;
} pg_engine_config;

void pg_engine_config_default(pg_engine_config *c);

// The defaults of pg_engine_config's zero fields that depend on the device,
// one definition each (read through engine/sizing.c) for start-up, `paged plan`
// (engine/memplan.c) and --help (server/engine_options.c).
#define PG_DEFAULT_GPU_MEMORY_UTILIZATION 0.9
#define PG_DEFAULT_CPU_KV_GIB 2 // the CPU's KV pool (host memory), all ranks together
// The CPU's step budget: 2048 tokens are seconds of CPU work, during
// which every running stream waits (docs/benchmarks.md, issue 18).
#define PG_DEFAULT_CPU_BATCHED_TOKENS 256
#define PG_DEFAULT_MAX_LORA_RANK 16 // --max-lora-rank: vLLM's (the LoRA workspace is sized for it)

// The scheduler limits an engine of `cfg` runs with: cfg->sched with the
// block size defaulted and, on the CPU with chunked prefill and no
// --max-num-batched-tokens, PG_DEFAULT_CPU_BATCHED_TOKENS per step.
// Start-up and `paged plan` both take them from here.
sched_config pg_engine_sched_limits(const pg_engine_config *cfg, bool on_cpu);
// --gpu-memory-utilization, or its default.
double pg_engine_gpu_memory_utilization(const pg_engine_config *cfg);
// Each of `tp` CPU ranks' KV bytes: --kv-cache-memory or the default, the
// whole pool's (host memory is one for every rank), shared out.
int64_t pg_engine_cpu_kv_bytes(const pg_engine_config *cfg, int32_t tp);
// The KV bytes the utilization leaves one GPU rank of `total` bytes:
// util x total minus everything in use (weights, workspace, context, other
// processes) and the graphs still to be captured, as in vLLM. Start-up
// passes what it measured, `paged plan` its model of the same.
int64_t pg_engine_gpu_kv_budget(const pg_engine_config *cfg, int64_t total, int64_t in_use, int64_t graphs_reserved);
// The pool's blocks, the null block 0 included: --kv-blocks, else as many
// as kv_bytes holds (at most INT32_MAX).
int32_t pg_engine_kv_blocks(const pg_engine_config *cfg, int64_t kv_bytes, size_t per_block);
// The least pool that starts: one sequence of max_model_len tokens plus
// the null block.
int32_t pg_engine_kv_blocks_needed(int32_t max_model_len, const sched_config *sc);
// The KV layer groups of model `mc` on a backend of `caps` (off with
// --disable-hybrid-kv-cache-manager or where attention runs no windows),
// into *lay and the scheduler config's kv_groups and windows.
void pg_engine_kv_groups(const pg_engine_config *cfg, const pg_model_config *mc, const pg_backend_caps *caps,
                         sched_config *sc, pg_kv_layout *lay);
// How many times the tokens of n_tokens-token sequences the same KV memory
// holds with the layout `lay` against one block table for every layer
// (layer-blocks of a sequence: ceil(n / bs) x layers against
// pg_engine_kv_blocks_needed x layers per block). 1 without groups.
double pg_engine_kv_group_gain(const sched_config *sc, const pg_kv_layout *lay, int32_t n_tokens);

// LoRA slots an engine of cfg keeps: 0 without --enable-lora, else
// --max-loras, or as many as --lora-modules names (at least 1).
int32_t pg_engine_lora_slots(const pg_engine_config *cfg);
// --max-lora-rank, or its default.
int32_t pg_engine_max_lora_rank(const pg_engine_config *cfg);
// The adapters known at once (in a slot or waiting for one): --max-cpu-loras,
// or max(slots, --lora-modules named); 0 without --enable-lora.
int32_t pg_engine_lora_known_cap(const pg_engine_config *cfg);

// Nodes 1..n-1 of a multi-node tensor-parallel group (c->node_rank > 0):
// loads this node's ranks and runs node 0's steps on them until node 0
// stops. 0 when node 0 said quit; else an error.
int pg_engine_follow(const pg_engine_config *c);

// A generation request. The prompt ids are copied.
typedef struct pg_gen_request {
    const int32_t *prompt;
    int32_t n_prompt;
    pg_sampling_params sp;
    int32_t priority;
    void *user;                  // returned with every event
    // Token masks (text/grammar/structured.h): a grammar every sequence's output
    // must match, and/or the only token ids that may be sampled. The engine
    // takes its own reference to `grammar` and copies the ids, and copies
    // sp's logit_bias arrays: the caller's may go after pg_engine_submit.
    struct pg_grammar *grammar;  // NULL = none
    const int32_t *allowed_ids;  // [n_allowed]
    int32_t n_allowed;           // 0 = every token allowed
    // bad_words as token sequences: sequence k is bad_ids[bad_off[k] ..
    // bad_off[k + 1]); its last token is banned where the output ends with
    // the rest of it (a one-token sequence: always). Copied.
    const int32_t *bad_off;      // [n_bad + 1]
    const int32_t *bad_ids;
    int32_t n_bad;
    int64_t lora_id;             // 0: the base model; else pg_engine_lora_find's id of an adapter
} pg_gen_request;

// One event from the engine: a sched_event plus the submitter's pointer,
// and an error message when the request was rejected at admission
// (finish = SCHED_FINISH_ERROR, error_code < 0).
typedef struct pg_gen_event {
    sched_event ev;
    void *user;
    int error_code;
    char error[256];
    int64_t publish_ns;          // pg_now_ns() when the engine published it (latency metrics)
    // Prompt logprobs (sp.want_prompt_logprobs): on the request's first
    // event with a token, prompt_lp[p] for every prompt position p >= 1
    // (entry 0 unused; n_prompt_lp = the prompt's length). Owned by whoever
    // polls the event: free() it (NULL otherwise).
    pg_prompt_logprob *prompt_lp;
    int32_t n_prompt_lp;
} pg_gen_event;

typedef void (*pg_engine_notify_fn)(void *ctx);

// Loads the model, tokenizer and chat template, sizes the KV pool, and
// starts the engine thread. Errors name the file and the reason.
int pg_engine_create(const pg_engine_config *cfg, pg_engine_notify_fn notify, void *notify_ctx,
                     pg_engine **out);
// Stops the thread (running requests are dropped without events) and frees all.
void pg_engine_destroy(pg_engine *e);

// Thread-safe. Queues a request and returns its id (>= 0). The request is
// validated by the scheduler on the engine thread; a rejection comes back as
// an error event.
int64_t pg_engine_submit(pg_engine *e, const pg_gen_request *req);
// Thread-safe. Aborts a request (its events end with SCHED_FINISH_ABORT).
void pg_engine_abort(pg_engine *e, int64_t id);
// Thread-safe. Finishes one sequence early (a stop string matched).
void pg_engine_finish_seq(pg_engine *e, int64_t id, int32_t seq_index);

// Thread-safe. Moves up to `cap` pending events into `out`; returns the count.
int pg_engine_poll(pg_engine *e, pg_gen_event *out, int cap);

// LoRA adapters (docs/lora.md). Thread-safe.
// The id of the adapter served as `name` (> 0; pg_gen_request.lora_id), or 0.
int64_t pg_engine_lora_find(pg_engine *e, const char *name);
// fn(ctx, name, path) for each adapter loaded now, in slot order.
// The names of the adapters in the LoRA slots of `slot_mask` (bit i: slot
// i, sched_stats.lora_*_mask), comma-separated in slot order, into buf
// (truncated to cap); "" for none. Any thread.
void pg_engine_lora_names(pg_engine *e, uint64_t slot_mask, char *buf, size_t cap);
void pg_engine_lora_list(pg_engine *e, void (*fn)(void *ctx, const char *name, const char *path), void *ctx);
// Loads the adapter in `path` as `name` into a free slot on every rank,
// between steps; blocks until done (not on the loop thread). PG_EINVAL: the
// name is taken, no slot is free, or the adapter does not fit (its file
// named).
int pg_engine_lora_load(pg_engine *e, const char *name, const char *path);
// Unloads `name`; blocks until done. PG_ENOTFOUND: none is loaded;
// PG_ENOSPC: requests still run with it (nothing changes).
int pg_engine_lora_unload(pg_engine *e, const char *name);

// Read-only model facts for the front end.
const pg_tokenizer *pg_engine_tokenizer(const pg_engine *e);
const pg_chat_template *pg_engine_chat_template(const pg_engine *e); // NULL if none
const pg_model_config *pg_engine_model_config(const pg_engine *e);
// The --quantization the weights were loaded with: "none", "fp8", "int4".
const char *pg_engine_quantization(const pg_engine *e);
int32_t pg_engine_max_model_len(const pg_engine *e);
// The device a configuration asks for: cfg->device, or "auto" when none is
// given (as vLLM: `serve --model M` on a GPU host runs on the GPU). The one
// place that default lives.
const char *pg_engine_config_device(const pg_engine_config *cfg);
const char *pg_engine_device_name(const pg_engine *e);

#define PG_ENGINE_MAX_RANKS 64
typedef struct pg_engine_rank_mem {
    int64_t weights, kv, workspace, graphs, other, total, free;
} pg_engine_rank_mem;

// Thread-safe snapshot of the scheduler statistics, updated every step, and
// timing counters for the metrics endpoint.
typedef struct pg_engine_stats {
    sched_stats sched;
    int32_t kv_blocks, block_size;
    int32_t kv_groups, kv_layers_per_block; // KV layer groups (1, every layer: none)
    int64_t kv_bytes, weight_bytes, workspace_bytes;
    int64_t steps, prompt_tokens_computed, tokens_sampled;
    double busy_seconds;
    // Device memory, bytes (GPU only; 0 on the CPU): the card's total, what
    // is free, CUDA graphs, and other (CUDA context, libraries, other
    // processes); weights, KV and workspace are above (on the CPU: host
    // bytes, the workspace growing with the largest step). Read at start-up,
    // then at most once a second by the engine thread after a step.
    bool on_gpu;
    int64_t gpu_total_bytes, gpu_free_bytes, graph_bytes, other_bytes;
    int64_t host_swap_bytes;     // pinned host memory of the swap space (swap preemption + host KV tier)
    // Host memory by category (rank 0's; pg_runner_mem): weights mapped from
    // the model file (CPU), the KV pool (CPU), the pinned step images.
    int64_t host_weights_mapped_bytes, host_kv_bytes, host_pinned_bytes;
    int64_t host_weights_offloaded_bytes; // --cpu-offload-gb's host copies of layer weights
    int32_t host_kv_blocks;      // host blocks (0 = no swap space, no host tier)
    bool host_kv_tier;           // evicted prefix blocks kept in the host blocks
    // Per tensor-parallel rank (the fields above are rank 0's): each rank's
    // device by category (total and free on the GPU only).
    int32_t n_ranks;
    pg_engine_rank_mem ranks[PG_ENGINE_MAX_RANKS];
} pg_engine_stats;
void pg_engine_stats_get(pg_engine *e, pg_engine_stats *out);

// Thread-safe. Whether the engine can still serve, for a watchdog: a failed
// step (the device is in an unknown state: a CUDA error is sticky) or a
// step that has run for too long (a hung device, a deadlock) means it
// cannot, and the process should exit so a supervisor restarts it.
typedef struct pg_engine_health {
    bool failed;                 // a step failed
    char reason[200];            // why (set when failed)
    int64_t step_age_ns;         // how long the oldest unfinished step has run (0: none running)
} pg_engine_health;
void pg_engine_health_get(pg_engine *e, pg_engine_health *out);

// Fault injection for tests (read by pg_engine_create): PAGED_FAULT_INJECT
// = "stall:N[:SECONDS]" makes the engine thread stall the N-th step that
// has work for SECONDS (default 3600, or until the engine is destroyed),
// as a hung device would; "fail:N" makes that step fail as a device error
// would. Anything else is a start-up error.
