// engine/setup.c - what pg_engine_create does before the engine thread
// starts: the device and its backend, the KV cache dtype, the model, the
// tokenizer and chat template, the runner, the KV pool's size from the
// memory that is left, the scheduler, and the start-up memory log.
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/file.h"
#include "common/log.h"
#include "engine/engine_int.h"
#include "engine/gguf.h"

#define DEFAULT_CPU_KV_BYTES ((int64_t)2 << 30)
#define DEFAULT_GPU_MEMORY_UTILIZATION 0.9
#define DEFAULT_GPU_SWAP_BYTES ((int64_t)4 << 30) // --preemption-mode swap without --swap-space (vLLM's)

static bool is_dummy(const pg_engine_config *c) { return c->load_format && !strcmp(c->load_format, "dummy"); }

// Where the tokenizer (and the model's chat template) come from: --tokenizer,
// else the model file or directory; NULL for a dummy model without one.
static const char *tokenizer_source(const pg_engine *e) {
    if (e->cfg.tokenizer) return e->cfg.tokenizer;
    return is_dummy(&e->cfg) ? NULL : e->cfg.model_path;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static int load_tokenizer(pg_engine *e) {
    const char *path = tokenizer_source(e);
    if (!path) {
        // A dummy model without --tokenizer: bytes plus placeholder ids
        // (benchmarks send token ids; generated ids print as <tN>).
        PG_LOGW("no --tokenizer for the dummy model: using a synthetic byte-level tokenizer over its %d ids",
                e->model->cfg.vocab_size);
        return pg_tokenizer_synthetic_bytes(e->model->cfg.vocab_size, &e->tok);
    }
    if (ends_with(path, ".json") && !pg_is_dir(path)) { // a tokenizer.json file
        char *dir = pg_xstrdup(path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        char *tc = pg_path_join(slash ? dir : ".", "tokenizer_config.json");
        int rc = pg_tokenizer_from_hf(path, pg_file_exists(tc) ? tc : NULL, &e->tok);
        free(tc);
        free(dir);
        return rc;
    }
    if (pg_is_dir(path)) {
        char *tj = pg_path_join(path, "tokenizer.json");
        char *tc = pg_path_join(path, "tokenizer_config.json");
        int rc = pg_tokenizer_from_hf(tj, pg_file_exists(tc) ? tc : NULL, &e->tok);
        free(tj);
        free(tc);
        return rc;
    }
    gguf_file *f;
    PG_TRY(gguf_open(path, &f));
    int rc = pg_tokenizer_from_gguf(f, &e->tok);
    gguf_close(f);
    return rc;
}

// The device: cpu, cuda, or auto (the GPU when one is found).
static int make_backend(pg_engine *e) {
    const pg_engine_config *cfg = &e->cfg;
    const char *dev = cfg->device ? cfg->device : "cpu";
    if (!strcmp(dev, "cuda") || !strcmp(dev, "auto")) {
        char why[160] = "";
        if (pg_backend_cuda_probe(why, sizeof why) > 0) return pg_backend_cuda_create(0, &e->backend);
        if (!strcmp(dev, "cuda")) return pg_err_set(PG_EUNSUPP, "--device cuda: %s", why);
        PG_LOGI("--device auto: %s; running on the CPU", why);
    } else if (strcmp(dev, "cpu")) {
        return pg_err_set(PG_EUNSUPP, "device '%s' is not known (cpu, cuda, auto)", dev);
    }
    return pg_backend_cpu_create(cfg->n_threads, cfg->matmul_mode, &e->backend);
}

void eng_stats_memory(pg_engine *e, const pg_runner_mem *m) {
    e->stats.on_gpu = strcmp(e->backend->name, "cpu") != 0;
    e->stats.weight_bytes = m->weights;
    e->stats.kv_bytes = m->kv;
    e->stats.workspace_bytes = m->workspace;
    e->stats.graph_bytes = m->graphs;
    e->stats.other_bytes = m->other;
    e->stats.gpu_total_bytes = e->stats.on_gpu ? m->total : 0;
    e->stats.gpu_free_bytes = e->stats.on_gpu ? m->free : 0;
    e->stats.host_swap_bytes = m->host_swap;
}

int eng_setup(pg_engine *e) {
    const pg_engine_config *cfg = &e->cfg;
    PG_TRY(make_backend(e));
    pg_backend *be = e->backend;
    const bool on_cpu = !strcmp(be->name, "cpu");
    // KV cache element type: auto = the device's native one (bf16 / f32).
    const char *kvd = cfg->kv_cache_dtype ? cfg->kv_cache_dtype : "auto";
    const bool kv_fp8 = !strcmp(kvd, "fp8");
    if (strcmp(kvd, "auto") && strcmp(kvd, "bf16") && !kv_fp8)
        return pg_err_set(PG_EINVAL, "KV cache dtype '%s' is not known (auto, bf16, fp8)", kvd);
    if (on_cpu && strcmp(kvd, "auto"))
        return pg_err_set(PG_EUNSUPP, "--kv-cache-dtype %s needs --device cuda: the CPU backend's KV "
                                      "cache is f32 (use auto)", kvd);
    // Async scheduling: auto = on with the GPU (the host plans the next step
    // while the device runs this one); on the CPU the same thread does both,
    // so it only adds a discarded token per finished sequence.
    const char *asy = cfg->async_scheduling ? cfg->async_scheduling : "auto";
    if (strcmp(asy, "auto") && strcmp(asy, "on") && strcmp(asy, "off"))
        return pg_err_set(PG_EINVAL, "async scheduling '%s' is not known (auto, on, off)", asy);
    e->async = !strcmp(asy, "on") || (!strcmp(asy, "auto") && !on_cpu);
    if (cfg->load_format && strcmp(cfg->load_format, "auto") && !is_dummy(cfg))
        return pg_err_set(PG_EINVAL, "load format '%s' is not known (auto, dummy)", cfg->load_format);
    pg_graph_mode graphs = PG_GRAPHS_STARTUP;
    const char *gmode = cfg->cuda_graphs ? cfg->cuda_graphs : "on";
    if (!strcmp(gmode, "off"))
        graphs = PG_GRAPHS_OFF;
    else if (!strcmp(gmode, "lazy"))
        graphs = PG_GRAPHS_LAZY;
    else if (strcmp(gmode, "on"))
        return pg_err_set(PG_EINVAL, "cuda graphs '%s' is not known (on, off, lazy)", gmode);

    pg_model_load_opts mo = {.path = cfg->model_path, .dummy = is_dummy(cfg), .hf_config = cfg->hf_config,
                             .dummy_seed = 0x5eedull, .dummy_std = 0.02f};
    PG_TRY(pg_model_load(&mo, be, &e->model));
    PG_TRY(load_tokenizer(e));
    PG_TRY(pg_chat_template_load(e->cfg.chat_template, tokenizer_source(e), e->tok, &e->chat));

    const pg_model_config *mc = &e->model->cfg;
    sched_config sc = cfg->sched;
    if (sc.block_size <= 0) sc.block_size = 16;
    // The step budget per device: on the CPU 2048 tokens are seconds of
    // work, during which every running stream waits; 256 keeps a step near a
    // few hundred milliseconds on the default model (issue 18's measurements,
    // docs/benchmarks.md), and the long-prefill cap follows at a quarter.
    // Without chunked prefill a prompt must fit one step: keep the larger one.
    if (!cfg->batched_tokens_set && on_cpu && sc.enable_chunked_prefill) sc.max_num_batched_tokens = 256;
    e->max_model_len = cfg->max_model_len > 0 ? cfg->max_model_len : mc->max_pos;
    if (e->max_model_len > mc->max_pos)
        PG_LOGW("max model length %d is beyond the model's %d positions", e->max_model_len, mc->max_pos);
    if (mc->sliding_window > 0 && e->max_model_len > mc->sliding_window) {
        // Without windowed attention, positions past the window would attend
        // to keys the model never saw together: stay exact instead.
        PG_LOGW("max model length %d capped to the model's sliding window of %d tokens (windowed "
                "attention is not implemented)", e->max_model_len, mc->sliding_window);
        e->max_model_len = mc->sliding_window;
    }
    // The runner sizes its workspace for the largest step (and, where the
    // backend measures memory, profiles it); the KV pool gets what is left.
    pg_runner_config rcfg = {.block_size = sc.block_size, .max_num_seqs = sc.max_num_seqs,
                             .max_num_batched_tokens = sc.max_num_batched_tokens,
                             .max_model_len = e->max_model_len,
                             .kv_dtype = kv_fp8 ? PG_KV_FP8_E4M3 : PG_KV_BF16, .graphs = graphs};
    PG_TRY(pg_runner_create(e->model, &rcfg, &e->runner));
    pg_runner_mem gm;
    pg_runner_mem_get(e->runner, &gm);
    const size_t per_block = pg_runner_kv_bytes_per_block(e->runner);
    int64_t kv_bytes;
    if (be->measures_memory) {
        double util = cfg->gpu_memory_utilization > 0 ? cfg->gpu_memory_utilization : DEFAULT_GPU_MEMORY_UTILIZATION;
        // Everything in use now (weights, workspace, context, other
        // processes) counts against the utilization budget, as in vLLM, and
        // so do the graphs captured after the pool is allocated.
        int64_t budget = (int64_t)(util * (double)gm.total) - (gm.total - gm.free) - gm.graphs_reserved;
        kv_bytes = cfg->kv_cache_bytes > 0 ? cfg->kv_cache_bytes : budget;
        if (kv_bytes < (int64_t)per_block * 2)
            return pg_err_set(PG_ENOMEM,
                              "no device memory left for the KV cache: %.2f GiB total, %.2f GiB in use after the "
                              "weights (%.2f GiB) and workspace (%.2f GiB) at --gpu-memory-utilization %.2f; raise "
                              "it, or lower --max-num-batched-tokens / --max-num-seqs",
                              (double)gm.total / (1 << 30), (double)(gm.total - gm.free) / (1 << 30),
                              (double)gm.weights / (1 << 30), (double)gm.workspace / (1 << 30), util);
    } else {
        kv_bytes = cfg->kv_cache_bytes > 0 ? cfg->kv_cache_bytes : DEFAULT_CPU_KV_BYTES;
    }
    int64_t kv_blocks64 = cfg->kv_blocks > 0 ? cfg->kv_blocks : kv_bytes / (int64_t)per_block;
    e->kv_blocks = kv_blocks64 > INT32_MAX ? INT32_MAX : (int32_t)kv_blocks64;
    int32_t host_blocks = cfg->swap_bytes > 0 ? (int32_t)(cfg->swap_bytes / (int64_t)per_block) : 0;
    if (sc.preemption_mode == SCHED_PREEMPT_SWAP && host_blocks == 0) {
        host_blocks = e->kv_blocks;
        // On the GPU the device pool is far larger than sensible pinned memory.
        if (!on_cpu && (int64_t)host_blocks * (int64_t)per_block > DEFAULT_GPU_SWAP_BYTES)
            host_blocks = (int32_t)(DEFAULT_GPU_SWAP_BYTES / (int64_t)per_block);
    }
    // A pool that cannot hold one sequence of the full model length is a
    // configuration error, reported with what would fit.
    int32_t need = (e->max_model_len + sc.block_size - 1) / sc.block_size + 1;
    if (e->kv_blocks < need)
        return pg_err_set(PG_EINVAL,
                          "KV cache of %d blocks (%d tokens) cannot hold one sequence of max model "
                          "length %d; lower --max-model-len to %d or give the cache at least %zu MiB",
                          e->kv_blocks, (e->kv_blocks - 1) * sc.block_size, e->max_model_len,
                          (e->kv_blocks - 1) * sc.block_size, ((size_t)need * per_block) >> 20);
    sc.num_blocks = e->kv_blocks;
    sc.num_host_blocks = host_blocks;
    sc.max_model_len = e->max_model_len;
    PG_TRY(pg_runner_alloc_kv(e->runner, e->kv_blocks, host_blocks));
    pg_runner_mem_get(e->runner, &gm);
    PG_TRY(sched_create(&sc, &e->sched));
    e->cfg.sched = sc;
    e->stats.kv_blocks = e->kv_blocks;
    e->stats.block_size = sc.block_size;
    eng_stats_memory(e, &gm);
    sched_stats_get(e->sched, &e->stats.sched);

    const double G = 1 << 30;
    PG_LOGI("model %s (%s, %s): %d layers, hidden %d, %d/%d heads, vocab %d; weights %.1f MiB on %s",
            mc->name[0] ? mc->name : cfg->model_path, mc->arch, e->model->format, mc->n_layers,
            mc->hidden, mc->n_heads, mc->n_kv_heads, mc->vocab_size,
            (double)e->model->weight_bytes / (1 << 20), be->name);
    PG_LOGI("device %s", gm.device);
    const char *kv_type = kv_fp8 ? "fp8 e4m3" : be->kv_native == PG_DTYPE_F32 ? "f32" : "bf16";
    if (be->measures_memory)
        PG_LOGI("device memory: total %.2f GiB = weights %.2f + KV cache %.2f + workspace %.2f (profiled at "
                "%d tokens / %d sequences; buffers %.2f) + graphs %.2f + other %.2f + free %.2f GiB",
                gm.total / G, gm.weights / G, gm.kv / G, gm.workspace / G, sc.max_num_batched_tokens,
                sc.max_num_seqs, gm.workspace_buffers / G, gm.graphs / G, gm.other / G, gm.free / G);
    else
        PG_LOGI("memory: weights %.1f MiB + KV cache %.1f MiB + workspace %.1f MiB (buffers for %d tokens / %d "
                "sequences per step)",
                gm.weights / (double)(1 << 20), gm.kv / (double)(1 << 20), gm.workspace / (double)(1 << 20),
                sc.max_num_batched_tokens, sc.max_num_seqs);
    PG_LOGI("KV cache on %s: %d blocks x %d tokens = %lld tokens (%.2f GiB, %s, %zu KiB per block); "
            "swap %d blocks (%.2f GiB); max model length %d",
            be->name, e->kv_blocks - 1, sc.block_size, (long long)(e->kv_blocks - 1) * sc.block_size,
            gm.kv / G, kv_type, per_block >> 10, host_blocks, gm.host_swap / G, e->max_model_len);
    PG_LOGI("async scheduling %s", e->async ? "on (the next step is planned while one runs)" : "off");
    return 0;
}
