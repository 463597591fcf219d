// engine/setup.c - what pg_engine_create does before the engine thread
// starts: the device and its backend, the KV cache dtype, the model, the
// tokenizer and chat template, the runner, the KV pool's size from the
// memory that is left, the scheduler, and the start-up memory log.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/file.h"
#include "common/log.h"
#include "engine/dist/node_config.h"
#include "engine/engine_int.h"
#include "formats/gguf.h"
#include "engine/memplan.h"
#include "engine/draft_model.h"
#include "engine/draft_replay.h"
#include "kernels/dtype.h"

// Left free beside an explicit --kv-cache-memory: allocation granularity and
// the CUDA context's growth after start-up.
#define KV_FREE_MARGIN ((int64_t)256 << 20)

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

void eng_stats_memory(pg_engine *e) {
    pg_engine_stats *st = &e->stats;
    st->on_gpu = strcmp(e->backend->name, "cpu") != 0;
    st->n_ranks = pg_executor_size(e->exec);
    for (int32_t r = 0; r < st->n_ranks && r < PG_ENGINE_MAX_RANKS; r++) {
        pg_runner_mem m;
        pg_executor_mem_get(e->exec, r, &m);
        st->ranks[r] = (pg_engine_rank_mem){.weights = m.weights, .kv = m.kv, .workspace = m.workspace,
                                            .graphs = m.graphs, .other = m.other,
                                            .total = st->on_gpu ? m.total : 0, .free = st->on_gpu ? m.free : 0};
        if (r) continue;
        st->weight_bytes = m.weights;
        st->kv_bytes = m.kv;
        st->workspace_bytes = m.workspace;
        st->graph_bytes = m.graphs;
        st->other_bytes = m.other;
        st->gpu_total_bytes = st->on_gpu ? m.total : 0;
        st->gpu_free_bytes = st->on_gpu ? m.free : 0;
        st->host_swap_bytes = m.host_swap;
        st->host_weights_mapped_bytes = m.host_weights_mapped;
        st->host_kv_bytes = m.host_kv;
        st->host_pinned_bytes = m.host_pinned;
        st->host_weights_offloaded_bytes = m.host_weights_offloaded;
    }
}

// The device: cpu, cuda, or auto (the GPU when one is found), before any
// weight is read (so a wrong --device fails at once).
static bool wants_cuda(const pg_engine_config *cfg) {
    const char *dev = pg_engine_config_device(cfg);
    if (!strcmp(dev, "cuda")) return true;
    char why[160];
    return !strcmp(dev, "auto") && pg_backend_cuda_probe(why, sizeof why) > 0;
}

// The model and the ranks, the same on every node.
static void executor_config(const pg_engine_config *cfg, pg_model_load_opts *mo, pg_executor_config *ec) {
    *mo = (pg_model_load_opts){.path = cfg->model_path, .dummy = is_dummy(cfg), .hf_config = cfg->hf_config,
                               .dummy_seed = 0x5eedull, .dummy_std = 0.02f,
                               .quantization = cfg->quantization, .cpu_offload_bytes = cfg->cpu_offload_bytes,
                               // the first adapters fill the slots; the rest wait (engine_lora.c)
                               .lora_dirs = cfg->lora_paths,
                               .n_lora = cfg->n_lora < pg_engine_lora_slots(cfg) ? cfg->n_lora
                                                                                 : pg_engine_lora_slots(cfg),
                               .lora_slots = pg_engine_lora_slots(cfg),
                               .max_lora_rank = pg_engine_max_lora_rank(cfg),
                               .expert_parallel = cfg->expert_parallel, .moe_alltoall = cfg->moe_alltoall};
    *ec = (pg_executor_config){.tp = cfg->tensor_parallel > 1 ? cfg->tensor_parallel : 1, .device = pg_engine_config_device(cfg),
                               .n_threads = cfg->n_threads, .matmul_mode = cfg->matmul_mode, .comm = cfg->tp_comm,
                               .nnodes = cfg->nnodes, .node_rank = cfg->node_rank,
                               .master_addr = cfg->master_addr,
                               .master_port = cfg->master_port > 0 ? cfg->master_port : 29500,
                               .op_timeout_ms = cfg->tp_timeout_ms};
}

// What the hello of a multi-node group carries (engine/dist/node_config.h):
// this node's model, from its headers, and the flags every node must share,
// as start-up resolves them (a default and the value it stands for agree).
static int node_config(const pg_engine_config *cfg, bool on_cpu, const pg_model_load_opts *mo, pg_node_config *nc) {
    pg_model_config mc;
    int32_t wd;
    PG_TRY(pg_model_identity(mo, &mc, &wd));
    memset(nc, 0, sizeof *nc);
    pg_node_config_name(nc->arch, mc.arch);
    pg_node_config_name(nc->weight_dtype, wd < 0 ? "random" : pg_dtype_name(wd));
    pg_node_config_name(nc->load_format, is_dummy(cfg) ? "dummy" : "auto");
    nc->n_layers = mc.n_layers;
    nc->hidden = mc.hidden;
    nc->vocab_size = mc.vocab_size;
    nc->n_heads = mc.n_heads;
    nc->n_kv_heads = mc.n_kv_heads;
    nc->head_dim = mc.head_dim;
    nc->ffn = mc.ffn;
    nc->n_experts = mc.n_experts;
    nc->n_experts_used = mc.n_experts_used;
    pg_node_config_name(nc->device, on_cpu ? "cpu" : "cuda");
    pg_node_config_name(nc->matmul_mode, on_cpu ? pg_matmul_mode_name(cfg->matmul_mode) : "");
    pg_node_config_name(nc->quantization, pg_quantization_name(cfg->quantization));
    nc->expert_parallel = cfg->expert_parallel && mc.n_experts > 0; // ignored without experts
    pg_node_config_name(nc->all2all_backend, cfg->moe_alltoall ? "alltoall" : "allreduce");
    int32_t kv;
    PG_TRY(pg_kv_dtype_resolve(cfg, on_cpu, mc.head_dim, &kv));
    pg_node_config_name(nc->kv_cache_dtype, kv == PG_KV_NATIVE ? "bf16" : pg_kv_dtype_name(kv));
    if (kv == PG_KV_FP8_E4M3)
        pg_node_config_name(nc->kv_cache_scales, cfg->kv_cache_scales == PG_KV_SCALES_ONE ? "one" : "auto");
    nc->lora_slots = pg_engine_lora_slots(cfg);
    nc->max_lora_rank = cfg->enable_lora ? pg_engine_max_lora_rank(cfg) : 0;
    const sched_config sc = pg_engine_sched_limits(cfg, on_cpu);
    nc->max_model_len = cfg->max_model_len > 0 ? cfg->max_model_len : mc.max_pos;
    nc->block_size = sc.block_size;
    nc->max_num_seqs = sc.max_num_seqs;
    nc->max_num_batched_tokens = sc.max_num_batched_tokens;
    nc->chunked_prefill = sc.enable_chunked_prefill;
    nc->prefix_caching = sc.enable_prefix_caching;
    nc->kv_layer_groups = !cfg->disable_kv_layer_groups;
    if (cfg->spec.ngram)
        snprintf(nc->speculative, sizeof nc->speculative, "ngram k=%d", cfg->spec.ngram_cfg.k);
    else if (cfg->spec.draft)
        snprintf(nc->speculative, sizeof nc->speculative, "draft_model k=%d", cfg->spec.draft_k);
    return 0;
}

int pg_engine_follow(const pg_engine_config *cfg) {
    PG_ARG(cfg->nnodes > 1 && cfg->node_rank > 0, "following needs --nnodes > 1 and --node-rank > 0");
    pg_model_load_opts mo;
    pg_executor_config ec;
    executor_config(cfg, &mo, &ec);
    pg_node_config nc;
    PG_TRY(node_config(cfg, !wants_cuda(cfg), &mo, &nc));
    ec.node_config = &nc;
    pg_executor *ex;
    PG_TRY(pg_executor_create(&ec, &mo, &ex));
    int rc = pg_executor_follow(ex);
    pg_executor_free(ex);
    return rc;
}

// LoRA flags that cannot work, before any weight is read (vLLM's rules).
static int check_lora(const pg_engine_config *cfg) {
    if (cfg->n_lora > 0 && !cfg->enable_lora) return pg_err_set(PG_EINVAL, "--lora-modules needs --enable-lora");
    if (cfg->allow_runtime_lora_updating && !cfg->enable_lora)
        return pg_err_set(PG_EINVAL, "--allow-runtime-lora-updating needs --enable-lora");
    if (cfg->max_cpu_loras > 0 && cfg->max_cpu_loras < pg_engine_lora_slots(cfg))
        return pg_err_set(PG_EINVAL, "--max-cpu-loras %d must be at least --max-loras %d", cfg->max_cpu_loras,
                          pg_engine_lora_slots(cfg));
    if (cfg->n_lora > pg_engine_lora_known_cap(cfg))
        return pg_err_set(PG_EINVAL, "--lora-modules names %d adapters, more than --max-cpu-loras %d", cfg->n_lora,
                          pg_engine_lora_known_cap(cfg));
    for (int32_t i = 0; i < cfg->n_lora; i++)
        for (int32_t j = 0; j < i; j++)
            if (!strcmp(cfg->lora_names[i], cfg->lora_names[j]))
                return pg_err_set(PG_EINVAL, "--lora-modules: the name '%s' is given twice", cfg->lora_names[i]);
    return 0;
}

// The start-up log's line of a rank's share: heads, FFN columns, experts
// (a slice of every one, or whole ones under expert parallelism), vocabulary.
static void log_tensor_parallel(const pg_engine_config *cfg, const pg_model_config *mc, const pg_model_shard *sh) {
    char exp[96] = "";
    if (mc->n_experts > 0 && sh->expert_parallel)
        snprintf(exp, sizeof exp, ", experts %d of %d whole (expert parallel)", sh->n_exp, mc->n_experts);
    else if (mc->n_experts > 0)
        snprintf(exp, sizeof exp, ", %d of every expert's %d columns", sh->moe_ffn, mc->moe_ffn);
    PG_LOGI("tensor parallel: %d ranks (%d heads, %d KV heads, %d FFN columns%s and %d vocabulary rows each)%s",
            sh->size, sh->n_heads, sh->n_kv_heads, sh->ffn, exp, sh->vocab, cfg->nnodes > 1 ? " across nodes" : "");
}

// The start-up log's name of the KV type.
static const char *kv_dtype_log_name(const pg_backend *be, int32_t dtype) {
    if (dtype != PG_KV_NATIVE) return pg_kv_dtype_name(dtype);
    return be->caps->kv_native == PG_DTYPE_F32 ? "f32" : "bf16";
}

// The scheduler's proposer (sched_spec_config.propose): n-gram prompt lookup.
static int32_t ngram_propose(void *ctx, const int32_t *history, int32_t n, int32_t limit, int32_t *out) {
    return pg_ngram_propose(ctx, history, n, limit, out);
}

// The draft-model proposer (sched_spec_config.propose_batch): every
// speculating sequence of a step at once.
static void draft_propose(void *ctx, sched_propose_item *items, int32_t n_items) {
    pg_draft_propose_batch(ctx, items, n_items);
}

int eng_setup(pg_engine *e) {
    const pg_engine_config *cfg = &e->cfg;
    if (cfg->nnodes > 1 && cfg->node_rank > 0)
        return pg_err_set(PG_EINVAL, "--node-rank %d follows node 0 (pg_engine_follow): it runs no engine of its own",
                          cfg->node_rank);
    const bool on_cpu = !wants_cuda(cfg);
    const char *kvd = cfg->kv_cache_dtype ? cfg->kv_cache_dtype : "auto";
    int32_t kv_dtype = PG_KV_NATIVE;
    PG_TRY(pg_kv_dtype_parse(kvd, on_cpu, &kv_dtype)); // a bad type fails before the model loads
    // Async scheduling: auto = on with the GPU (the host plans the next step
    // while the device runs this one); on the CPU the same thread does both,
    // so it only adds a discarded token per finished sequence.
    const char *asy = cfg->async_scheduling ? cfg->async_scheduling : "auto";
    if (strcmp(asy, "auto") && strcmp(asy, "on") && strcmp(asy, "off"))
        return pg_err_set(PG_EINVAL, "async scheduling '%s' is not known (auto, on, off)", asy);
    e->async = !strcmp(asy, "on") || (!strcmp(asy, "auto") && !on_cpu);
    if (cfg->load_format && strcmp(cfg->load_format, "auto") && !is_dummy(cfg))
        return pg_err_set(PG_EINVAL, "load format '%s' is not known (auto, dummy)", cfg->load_format);
    pg_graph_mode graphs;
    PG_TRY(pg_graph_mode_parse(cfg->cuda_graphs, &graphs));
    PG_TRY(check_lora(cfg));

    pg_model_load_opts mo;
    pg_executor_config ec;
    executor_config(cfg, &mo, &ec);
    const int32_t tp = ec.tp;
    pg_node_config nc;
    if (ec.nnodes > 1) {
        PG_TRY(node_config(cfg, on_cpu, &mo, &nc));
        ec.node_config = &nc;
    }
    PG_TRY(pg_executor_create(&ec, &mo, &e->exec));
    e->backend = pg_executor_backend(e->exec, 0);
    e->model = pg_executor_model(e->exec, 0);
    pg_backend *be = e->backend;
    PG_TRY(load_tokenizer(e));
    PG_TRY(pg_chat_template_load(e->cfg.chat_template, tokenizer_source(e), e->tok, &e->chat));

    const pg_model_config *mc = &e->model->cfg;
    PG_TRY(pg_kv_dtype_resolve(cfg, on_cpu, mc->head_dim, &kv_dtype));
    sched_config sc = pg_engine_sched_limits(cfg, on_cpu);
    e->max_model_len = cfg->max_model_len > 0 ? cfg->max_model_len : mc->max_pos;
    if (e->max_model_len > mc->max_pos)
        PG_LOGW("max model length %d is beyond the model's %d positions", e->max_model_len, mc->max_pos);
    if (mc->sliding_window > 0 && e->max_model_len > mc->sliding_window && e->model->attn_window == 0) {
        // Without windowed attention, positions past the window would attend
        // to keys the model never saw together: stay exact instead.
        PG_LOGW("max model length %d capped to the model's sliding window of %d tokens (windowed "
                "attention is not implemented for it here)", e->max_model_len, mc->sliding_window);
        e->max_model_len = mc->sliding_window;
    }
    // KV layer groups: the sliding-window layers' own block tables.
    pg_kv_layout lay;
    pg_engine_kv_groups(cfg, mc, be->caps, &sc, &lay);
    // The runner sizes its workspace for the largest step (and, where the
    // backend measures memory, profiles it); the KV pool gets what is left.
    pg_runner_config rcfg = {.block_size = sc.block_size, .max_num_seqs = sc.max_num_seqs,
                             .max_num_batched_tokens = sc.max_num_batched_tokens,
                             .max_model_len = e->max_model_len,
                             .kv_dtype = kv_dtype, .kv_scales = cfg->kv_cache_scales, .graphs = graphs,
                             .kv_layer_groups = !cfg->disable_kv_layer_groups && be->caps->attn_window};
    PG_TRY(pg_executor_runners_create(e->exec, &rcfg));
    if (cfg->spec.draft) {
        // On rank 0's backend, before the KV budget is measured: the draft's
        // weights, KV and workspace are in use then, so the target's pool
        // gets what they leave (not in `paged plan` yet).
        const pg_draft_config dc = {.model_path = cfg->spec.draft_model, .k = cfg->spec.draft_k,
                                    .max_model_len = e->max_model_len, .vocab_size = mc->vocab_size,
                                    .kv_dtype = kv_dtype, .max_seqs = cfg->spec.max_running_seqs,
                                    .replay_path = cfg->spec.replay, .replay_error_rate = cfg->spec.replay_error_rate,
                                    .replay_seed = cfg->spec.replay_seed};
        PG_TRY(pg_draft_create(&dc, be, &e->draft));
    }
    PG_TRY(pg_executor_mem_refresh(e->exec));
    pg_runner_mem gm;
    const size_t per_block = pg_executor_kv_bytes_per_block(e->exec);
    int64_t kv_bytes;
    if (be->caps->measures_memory) {
        const double util = pg_engine_gpu_memory_utilization(cfg);
        // Everything in use now (weights, workspace, context, other
        // processes) counts against the utilization budget, as in vLLM, and
        // so do the graphs captured after the pool is allocated. Every rank
        // holds the same blocks: the tightest rank sizes the pool.
        int64_t budget = INT64_MAX;
        for (int32_t r = 0; r < tp; r++) {
            pg_runner_mem m;
            pg_executor_mem_get(e->exec, r, &m);
            const int64_t b = pg_engine_gpu_kv_budget(cfg, m.total, m.total - m.free, m.graphs_reserved);
            if (b < budget) {
                budget = b;
                gm = m;
            }
        }
        kv_bytes = cfg->kv_cache_bytes > 0 ? cfg->kv_cache_bytes : budget;
        // An explicit size is checked against what is free now, not against
        // the utilization: a second server on a shared GPU (vLLM refuses
        // that) starts when its cache fits beside the first one, and says
        // what it found when it does not. A small margin stays free for
        // the allocator's granularity and the graphs captured later.
        if (cfg->kv_cache_bytes > 0) {
            int64_t room = INT64_MAX;
            for (int32_t r = 0; r < tp; r++) {
                pg_runner_mem m;
                pg_executor_mem_get(e->exec, r, &m);
                int64_t f = m.free - m.graphs_reserved - KV_FREE_MARGIN;
                if (f < room) {
                    room = f;
                    gm = m;
                }
            }
            if (cfg->kv_cache_bytes > room) {
                const int64_t mine = gm.weights + gm.workspace + gm.graphs;
                const int64_t others = gm.total - gm.free - mine > 0 ? gm.total - gm.free - mine : 0;
                pg_err_set(PG_ENOMEM,
                           "--kv-cache-memory %.2f GiB does not fit on %s: %.2f GiB free of %.2f GiB (this process "
                           "%.2f GiB: weights %.2f, workspace %.2f; other processes and contexts %.2f GiB); at most "
                           "%.2f GiB fits",
                           (double)cfg->kv_cache_bytes / (1 << 30), gm.device, (double)gm.free / (1 << 30),
                           (double)gm.total / (1 << 30), (double)mine / (1 << 30), (double)gm.weights / (1 << 30),
                           (double)gm.workspace / (1 << 30), (double)others / (1 << 30),
                           room > 0 ? (double)room / (1 << 30) : 0.0);
                return pg_memplan_refuse(cfg, true, gm.total, gm.other, PG_ENOMEM, pg_err_msg());
            }
        }
        if (kv_bytes < (int64_t)per_block * 2) {
            pg_err_set(PG_ENOMEM,
                              "no device memory left for the KV cache: %.2f GiB total, %.2f GiB in use after the "
                              "weights (%.2f GiB) and workspace (%.2f GiB) at --gpu-memory-utilization %.2f; raise "
                              "it, or lower --max-num-batched-tokens / --max-num-seqs",
                              (double)gm.total / (1 << 30), (double)(gm.total - gm.free) / (1 << 30),
                              (double)gm.weights / (1 << 30), (double)gm.workspace / (1 << 30), util);
            return pg_memplan_refuse(cfg, true, gm.total, gm.other, PG_ENOMEM, pg_err_msg());
        }
    } else {
        pg_executor_mem_get(e->exec, 0, &gm);
        // Host memory is one for every rank: the size is the whole pool's,
        // and each rank holds its share of every block.
        kv_bytes = pg_engine_cpu_kv_bytes(cfg, tp);
    }
    e->kv_blocks = pg_engine_kv_blocks(cfg, kv_bytes, per_block);
    // Host blocks: swap preemption and the prefix cache's host tier share
    // them (engine/memplan.c says why the CPU has none by default).
    int32_t host_blocks = pg_host_kv_blocks(cfg, !on_cpu, e->kv_blocks, per_block, pg_host_ram_bytes());
    sc.enable_host_kv_cache = host_blocks > 0 && sc.enable_prefix_caching && !cfg->no_host_kv_cache;
    sc.host_kv_reused_only = cfg->host_kv_reused_only;
    // PAGED_KV_OFFLOAD_AHEAD=1 (experimental, docs/engine.md "Copy ahead"):
    // the tier copies the blocks next in line for eviction a plan early.
    const char *ahead = getenv("PAGED_KV_OFFLOAD_AHEAD");
    sc.host_kv_ahead = sc.enable_host_kv_cache && ahead && !strcmp(ahead, "1");
    // A pool that cannot hold one sequence of the full model length is a
    // configuration error, reported with what would fit.
    const int32_t need = pg_engine_kv_blocks_needed(e->max_model_len, &sc);
    if (e->kv_blocks < need && (lay.n_groups > 1 || lay.window[0] > 0)) {
        pg_err_set(PG_EINVAL,
                   "KV cache of %d blocks cannot hold one sequence of max model length %d (%d blocks of %d layers "
                   "in %d layer groups); lower --max-model-len or give the cache at least %zu MiB",
                   e->kv_blocks - 1, e->max_model_len, need - 1, lay.n_slots, lay.n_groups,
                   ((size_t)need * per_block) >> 20);
        return pg_memplan_refuse(cfg, !on_cpu, gm.total, gm.other, PG_EINVAL, pg_err_msg());
    }
    if (e->kv_blocks < need) {
        pg_err_set(PG_EINVAL,
                          "KV cache of %d blocks (%d tokens) cannot hold one sequence of max model "
                          "length %d; lower --max-model-len to %d or give the cache at least %zu MiB",
                          e->kv_blocks, (e->kv_blocks - 1) * sc.block_size, e->max_model_len,
                          (e->kv_blocks - 1) * sc.block_size, ((size_t)need * per_block) >> 20);
        return pg_memplan_refuse(cfg, !on_cpu, gm.total, gm.other, PG_EINVAL, pg_err_msg());
    }
    sc.num_blocks = e->kv_blocks;
    sc.num_host_blocks = host_blocks;
    sc.max_model_len = e->max_model_len;
    PG_TRY(pg_executor_alloc_kv(e->exec, e->kv_blocks, host_blocks));
    PG_TRY(pg_executor_mem_refresh(e->exec));
    pg_executor_mem_get(e->exec, 0, &gm);
    if (cfg->spec.ngram) {
        // The scheduler asks for drafts through a callback: it sits below
        // the engine and knows no proposer.
        sc.spec = (sched_spec_config){.num_tokens = cfg->spec.ngram_cfg.k,
                                      .max_running_seqs = cfg->spec.max_running_seqs,
                                      .propose = ngram_propose,
                                      .ctx = &e->cfg.spec.ngram_cfg};
        PG_LOGI("speculative decoding: n-gram prompt lookup, n %d..%d, %d tokens, up to %d running sequences",
                cfg->spec.ngram_cfg.min_n, cfg->spec.ngram_cfg.max_n, cfg->spec.ngram_cfg.k,
                cfg->spec.max_running_seqs > 0 ? cfg->spec.max_running_seqs : SCHED_SPEC_DEFAULT_MAX_SEQS);
    }
    if (cfg->spec.draft) {
        sc.spec = (sched_spec_config){.num_tokens = cfg->spec.draft_k,
                                      .max_running_seqs = cfg->spec.max_running_seqs,
                                      .propose_batch = draft_propose,
                                      .ctx = e->draft};
        PG_LOGI("speculative decoding: draft model %s, %d tokens, up to %d running sequences", cfg->spec.draft_model,
                cfg->spec.draft_k,
                cfg->spec.max_running_seqs > 0 ? cfg->spec.max_running_seqs : SCHED_SPEC_DEFAULT_MAX_SEQS);
        const pg_replay *rp = pg_draft_replay(e->draft);
        if (rp) {
            int32_t n_req;
            int64_t n_tok;
            pg_replay_size(rp, &n_req, &n_tok);
            PG_LOGI("speculative decoding: replaying %s (%d requests, %lld tokens), error rate %g, seed %llu "
                    "(a measuring tool: docs/speculative_decoding.md)", cfg->spec.replay, n_req, (long long)n_tok,
                    cfg->spec.replay_error_rate, (unsigned long long)cfg->spec.replay_seed);
        }
    }
    PG_TRY(sched_create(&sc, &e->sched));
    e->cfg.sched = sc;
    e->stats.kv_blocks = e->kv_blocks;
    e->stats.host_kv_blocks = host_blocks;
    e->stats.host_kv_tier = sc.enable_host_kv_cache;
    e->stats.block_size = sc.block_size;
    e->stats.kv_groups = lay.n_groups;
    e->stats.kv_layers_per_block = lay.n_slots;
    eng_stats_memory(e);
    sched_stats_get(e->sched, &e->stats.sched);

    const double G = 1 << 30;
    PG_LOGI("model %s (%s, %s): %d layers, hidden %d, %d/%d heads, vocab %d; weights %.1f MiB on %s%s",
            mc->name[0] ? mc->name : cfg->model_path, mc->arch, e->model->format, mc->n_layers,
            mc->hidden, mc->n_heads, mc->n_kv_heads, mc->vocab_size,
            (double)e->model->weight_bytes / (1 << 20), be->name, tp > 1 ? " (rank 0's shard)" : "");
    if (mc->n_experts > 0) {
        int64_t total, active;
        pg_config_params(mc, &total, &active);
        // The experts' type as the backend runs them (the first expert this
        // rank holds): the model line names only the attention's.
        const pg_bweight *ew = NULL;
        for (int32_t l = 0; l < mc->n_layers && !ew; l++)
            for (int32_t x = 0; e->model->layers[l].exp_gate_up && x < mc->n_experts && !ew; x++)
                ew = e->model->layers[l].exp_gate_up[x];
        PG_LOGI("mixture of experts: %d experts of FFN %d per MoE layer, %d used per token, %s; %.3g B parameters, "
                "%.3g B active per token", mc->n_experts, mc->moe_ffn, mc->n_experts_used,
                ew ? pg_dtype_name(ew->dtype) : "none on this rank", total / 1e9, active / 1e9);
    }
    if (e->model->quantization != PG_QUANT_NONE) {
        const int64_t *lb = e->model->layer_bytes;
        const int32_t *ld = e->model->layer_dtypes;
        PG_LOGI("quantization %s: per layer Q|K|V %s %.2f MiB, O %s %.2f MiB, gate|up %s %.2f MiB, down %s %.2f MiB "
                "(scales included); embedding, LM head and norms as stored",
                pg_quantization_name(e->model->quantization), pg_dtype_name(ld[0]), lb[0] / 1048576.0,
                pg_dtype_name(ld[1]), lb[1] / 1048576.0, pg_dtype_name(ld[2]), lb[2] / 1048576.0,
                pg_dtype_name(ld[3]), lb[3] / 1048576.0);
    }
    const char *note = pg_executor_device_note(e->exec);
    PG_LOGI("device %s%s%s%s", gm.device, note[0] ? " (" : "", note, note[0] ? ")" : "");
    if (tp > 1) log_tensor_parallel(cfg, &e->model->cfg, &e->model->shard);
    if (cfg->expert_parallel && e->model->cfg.n_experts <= 0)
        PG_LOGI("--enable-expert-parallel: the model has no experts; ignored (as vLLM does)");
    if (cfg->moe_alltoall)
        PG_LOGI("--all2all-backend alltoall: %s", e->model->shard.moe_alltoall
                                                      ? "each row's expert shares go to the rank owning the row"
                                                      : "no experts or one rank; nothing to exchange");
    // Every rank's memory (rank 0's below stands for the rest on one node).
    for (int32_t r = 1; r < tp && be->caps->measures_memory; r++) {
        pg_runner_mem m;
        pg_executor_mem_get(e->exec, r, &m);
        PG_LOGI("rank %d device memory: total %.2f GiB = weights %.2f + KV cache %.2f + workspace %.2f + graphs "
                "%.2f + other %.2f + free %.2f GiB (%s)",
                r, m.total / G, m.weights / G, m.kv / G, m.workspace / G, m.graphs / G, m.other / G, m.free / G,
                m.device);
    }
    const char *kv_type = kv_dtype_log_name(be, kv_dtype);
    if (be->caps->measures_memory)
        PG_LOGI("device memory: total %.2f GiB = weights %.2f + KV cache %.2f + workspace %.2f (profiled at "
                "%d tokens / %d sequences; buffers %.2f) + graphs %.2f + other %.2f + free %.2f GiB",
                gm.total / G, gm.weights / G, gm.kv / G, gm.workspace / G, sc.max_num_batched_tokens,
                sc.max_num_seqs, gm.workspace_buffers / G, gm.graphs / G, gm.other / G, gm.free / G);
    else
        PG_LOGI("memory%s: weights %.1f MiB + KV cache %.1f MiB + workspace %.1f MiB (buffers for %d tokens / %d "
                "sequences per step)",
                tp > 1 ? " per rank" : "", gm.weights / (double)(1 << 20), gm.kv / (double)(1 << 20),
                gm.workspace / (double)(1 << 20), sc.max_num_batched_tokens, sc.max_num_seqs);
    PG_LOGI("KV cache on %s%s: %d blocks x %d tokens = %lld tokens (%.2f GiB, %s, %zu bytes per block); "
            "host blocks %d (%.2f GiB: %s); max model length %d",
            be->name, tp > 1 ? " (each rank: its heads of every block)" : "", e->kv_blocks - 1, sc.block_size, (long long)(e->kv_blocks - 1) * sc.block_size,
            gm.kv / G, kv_type, per_block, host_blocks, gm.host_swap / G,
            host_blocks == 0                ? "none"
            : sc.enable_host_kv_cache       ? (sc.preemption_mode == SCHED_PREEMPT_SWAP
                                                   ? (sc.host_kv_reused_only ? "swap space and host KV tier (reused blocks)"
                                                                             : "swap space and host KV tier")
                                                   : (sc.host_kv_reused_only ? "host KV tier (reused blocks)"
                                                                             : "host KV tier"))
                                            : "swap space",
            e->max_model_len);
    if (sc.host_kv_ahead)
        PG_LOGI("host KV tier: copying the blocks next in line for eviction a plan early (PAGED_KV_OFFLOAD_AHEAD=1)");
    if (lay.n_groups > 1 || lay.window[0] > 0) {
        char groups[160] = "";
        for (int32_t g = 0, n = 0; g < lay.n_groups && n < (int)sizeof groups - 24; g++)
            n += snprintf(groups + n, sizeof groups - (size_t)n, "%s%s", g ? ", " : "",
                          lay.window[g] ? "window" : "full");
        if (lay.window[lay.n_groups - 1] > 0)
            snprintf(groups + strlen(groups), sizeof groups - strlen(groups), "; window %d", lay.window[lay.n_groups - 1]);
        PG_LOGI("KV layer groups: %d block table%s a sequence (%s), %d layer%s a block; a sequence of max model "
                "length holds at most %d blocks: %.2fx the tokens of one table for every layer "
                "(--disable-hybrid-kv-cache-manager)",
                lay.n_groups, lay.n_groups > 1 ? "s" : "", groups, lay.n_slots, lay.n_slots > 1 ? "s" : "", need - 1,
                pg_engine_kv_group_gain(&sc, &lay, e->max_model_len));
    }
    const double M = 1 << 20;
    PG_LOGI("host memory%s: weights mapped %.1f MiB + weights offloaded %.1f MiB + KV cache %.1f MiB + swap/host "
            "tier %.1f MiB + pinned workspace %.1f MiB",
            tp > 1 ? " (rank 0)" : "", gm.host_weights_mapped / M, gm.host_weights_offloaded / M, gm.host_kv / M,
            gm.host_swap / M, gm.host_pinned / M);
    PG_LOGI("async scheduling %s", e->async ? "on (the next step is planned while one runs)" : "off");
    return 0;
}
