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

#include "engine/chat_template.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "scheduler/sched.h"

typedef struct pg_engine pg_engine;

typedef struct pg_engine_config {
    const char *model_path;      // GGUF file or Hugging Face directory
    const char *chat_template;   // NULL = the model's; a family name or a file
    const char *device;          // "cpu" (default), "cuda", "auto"
    int n_threads;               // CPU backend threads (0 = all)
    pg_matmul_mode matmul_mode;  // CPU: exact f32 or llama.cpp-style quantized activations
    int64_t kv_cache_bytes;      // device KV memory (0 = default)
    int32_t kv_blocks;           // overrides kv_cache_bytes when > 0
    int64_t swap_bytes;          // host swap space (0 = none)
    int32_t max_model_len;       // 0 = the model's context length
    sched_config sched;          // block size, budgets, policy, preemption
    // GPU (device "cuda", or "auto" when a GPU is found).
    double gpu_memory_utilization; // share of device memory for weights, workspace and KV (0 = 0.9)
    const char *load_format;     // NULL or "auto": weights from model_path; "dummy": random
                                 //   weights generated on the GPU, shape from hf_config
    const char *hf_config;       // config.json (file or directory) for load_format "dummy"
    const char *tokenizer;       // tokenizer source (GGUF file, HF directory or tokenizer.json);
                                 //   NULL = the model's (dummy: a synthetic byte-level one)
    const char *cuda_graphs;     // decode CUDA graphs: NULL or "on" (captured at start-up),
                                 //   "lazy" (on a bucket's first step), "off"
    const char *kv_cache_dtype;  // NULL or "auto" (bf16 on CUDA, f32 on the CPU), "bf16", "fp8"
                                 //   (e4m3, scale 1.0; CUDA only)
    const char *async_scheduling; // NULL or "auto" (on with CUDA, off on the CPU), "on", "off":
                                 //   plan step N + 1 while step N runs (scheduler/sched.h)
} pg_engine_config;

void pg_engine_config_default(pg_engine_config *c);

// A generation request. The prompt ids are copied.
typedef struct pg_gen_request {
    const int32_t *prompt;
    int32_t n_prompt;
    pg_sampling_params sp;
    int32_t priority;
    void *user;                  // returned with every event
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

// Read-only model facts for the front end.
const pg_tokenizer *pg_engine_tokenizer(const pg_engine *e);
const pg_chat_template *pg_engine_chat_template(const pg_engine *e); // NULL if none
const pg_model_config *pg_engine_model_config(const pg_engine *e);
int32_t pg_engine_max_model_len(const pg_engine *e);
const char *pg_engine_device_name(const pg_engine *e);

// Thread-safe snapshot of the scheduler statistics, updated every step, and
// timing counters for the metrics endpoint.
typedef struct pg_engine_stats {
    sched_stats sched;
    int32_t kv_blocks, block_size;
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
    int64_t host_swap_bytes;     // pinned host memory of the swap space
} pg_engine_stats;
void pg_engine_stats_get(pg_engine *e, pg_engine_stats *out);
