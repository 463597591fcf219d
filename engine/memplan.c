// engine/memplan.c - the memory plan: per rank weights, workspace, graphs
// and the KV pool that is left, from the headers and the flags alone; and
// the flags that would make a configuration fit (engine/memplan.h).
//
// The CPU numbers are exact (the same functions start-up uses). On CUDA
// the buffers are exact but three figures are measured at start-up and
// estimated here from the H200 runs of docs/benchmarks.md: what the
// profiling forward adds to the buffers, the graph reserve, and the CUDA
// context (docs/memory_planning.md says which and how to compare).
// Every rule and default comes from its owner, called here, never copied:
// the limits and defaults from engine/sizing.c, the KV block from
// kernels/kernels.h, the sampler's and decode's workspaces from
// kernels/cuda/cuda_ops.h, the graph reserve from the runner.
#include "engine/memplan.h"
#include "engine/draft_model.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/model/lora_adapter.h"
#include "engine/model/model.h"
#include "engine/runner/runner.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h" // the CPU's MoE and LoRA workspace sizes
#include "kernels/cuda/cuda_ops.h" // the CUDA workspaces' sizes, callable without a GPU
#include "kernels/dtype.h"

#define MiB ((int64_t)1 << 20)
#define GiB ((int64_t)1 << 30)
#define DEFAULT_GPU_SWAP_BYTES (4 * GiB)        // vLLM's --swap-space; also the host tier's default
// CUDA estimates (docs/memory_planning.md): the H200 start-ups of runs 1,
// 5 and 6 logged "other 0.52 GiB" (context, cuBLASLt handle, NCCL-free),
// and a profiled workspace 0.01 GiB above its buffers (lazily loaded
// kernels, cuBLASLt plans); the graph probe's measure is taken at its floor
// (pg_runner_graph_reserve).
#define CUDA_OTHER_ESTIMATE (532 * MiB)
#define CUDA_PROFILE_EXTRA (16 * MiB)
#define H200_SMS 132

// --- the devices' rules (the backends' own functions) ----------------------------------

// K and V of every layer: the function both backends' kv_block_bytes call.
// (KV layer groups: a block holds `layers` of them.)
static size_t kv_block_bytes(bool cuda, int32_t dtype, const pg_model_config *mc, int32_t layers, int32_t n_kv,
                             int32_t bs) {
    const pg_kv_shape s = {.block_size = bs, .n_kv_heads = n_kv, .head_dim = mc->head_dim, .dtype = dtype};
    return pg_kv_block_bytes(layers, s, !cuda);
}

// The KV type's name for the plan (the backend's native type by its name).
static const char *kv_name(const pg_memplan *p) {
    if (p->kv_dtype != PG_KV_NATIVE) return pg_kv_dtype_name(p->kv_dtype);
    return p->cuda ? "bf16" : "f32";
}

// --- the KV cache type (engine/setup.c uses the same rules) ---------------------------

int pg_kv_dtype_parse(const char *name, bool on_cpu, int32_t *out) {
    static const struct {
        const char *name;
        int32_t cpu, cuda; // -1: not on that device
    } types[] = {
        {"auto", PG_KV_NATIVE, PG_KV_NATIVE}, {"bf16", PG_KV_BF16_CPU, PG_KV_BF16},
        {"fp8", PG_KV_FP8_E4M3, PG_KV_FP8_E4M3}, {"f32", PG_KV_F32, -1},
        {"f16", PG_KV_F16, -1},               {"q8_0", PG_KV_Q8_0, -1},
        {"fp8_e4m3_scaled", PG_KV_FP8_E4M3_SCALED, -1},
    };
    if (!name) name = "auto";
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        if (strcmp(name, types[i].name)) continue;
        *out = on_cpu ? types[i].cpu : types[i].cuda;
        if (*out >= 0) return 0;
        if (on_cpu)
            return pg_err_set(PG_EUNSUPP, "--kv-cache-dtype %s needs --device cuda: the CPU backend's KV "
                                          "cache is f32, f16, bf16, q8_0, fp8 or fp8_e4m3_scaled (or auto)", name);
        return pg_err_set(PG_EUNSUPP, "--kv-cache-dtype %s is CPU-only: the CUDA backend's KV cache is bf16 "
                                      "or fp8 (or auto)", name);
    }
    return pg_err_set(PG_EINVAL, "KV cache dtype '%s' is not known (auto, f32, f16, bf16, q8_0, fp8, fp8_e4m3_scaled)",
                      name);
}

int pg_kv_dtype_resolve(const pg_engine_config *cfg, bool on_cpu, int32_t head_dim, int32_t *out) {
    int32_t d;
    PG_TRY(pg_kv_dtype_parse(cfg->kv_cache_dtype, on_cpu, &d));
    // auto on the CPU: f16 where the llama.cpp-compatible attention runs,
    // which rounds K and V to f16 anyway (so storing f16 changes no output
    // and halves the bytes, as llama.cpp's default cache); f32 in the exact
    // mode (the reference) and where that attention does not run.
    if (on_cpu && d == PG_KV_NATIVE)
        d = cfg->matmul_mode != PG_MATMUL_EXACT && head_dim % 8 == 0 && head_dim <= 512 ? PG_KV_F16 : PG_KV_F32;
    if (d == PG_KV_Q8_0 && head_dim % PG_KV_Q8_0_ELEMS)
        return pg_err_set(PG_EUNSUPP, "--kv-cache-dtype q8_0 needs a head dimension that is a multiple of 32 "
                                      "(blocks of 32 along head_dim): the model's head_dim is %d (use f16 or bf16)",
                          head_dim);
    *out = d;
    return 0;
}

// pg_cuda_decode_workspace_size depends on the SM count and the kernels'
// occupancy; its split-K partials (n_seqs x n_heads x splits x (head_dim +
// 1) floats) are only large while the grid is under about two waves, so
// this bound takes two waves of 4 CTAs on each of an H200's SMs, capped by
// what max_seqs sequences of max_len keys could split into (the plan's
// tiles and split limit, kernels/cuda/cuda_ops.h).
// Where a GPU is visible (`paged plan --device cuda` on the GPU host, a
// refused start-up) the backend's own function gives the exact figure.
static size_t cuda_attn_ws(int32_t max_seqs, int32_t nh, int32_t nkv, int32_t hd, int32_t len) {
    if (max_seqs <= 0 || nh <= 0 || nkv <= 0 || nh % nkv) return 0;
    size_t exact;
    if (pg_backend_cuda_attn_workspace(max_seqs, nh, nkv, hd, len, &exact)) return exact;
    // FlashInfer's prefill plan image, as the backend adds it on a Hopper GPU
    // (the default; PAGED_CUDA_PREFILL=paged adds none).
    const size_t fi = pg_cuda_fi_prefill_requested() ? pg_cuda_fi_prefill_ws_bytes(nh) : 0;
    const int64_t group = nh / nkv;
    const int64_t tiles = ((int64_t)len + PG_CUDA_DECODE_TILE_KEYS - 1) / PG_CUDA_DECODE_TILE_KEYS;
    const int64_t splits = tiles < PG_CUDA_DECODE_MAX_SPLITS ? tiles : PG_CUDA_DECODE_MAX_SPLITS;
    if (splits < 2) return fi;
    int64_t items = (int64_t)2 * H200_SMS * 4 * group; // (sequence, head, split) triples of two waves
    const int64_t cap = (int64_t)max_seqs * nh * splits;
    if (items > cap) items = cap;
    return pg_cuda_decode_split_ws_bytes(items, hd) + fi;
}

// The graph reserve (the runner's function), each graph at the probe's
// floor; none where graphs are off (the runner's reader of the mode and of
// PAGED_CUDA_GRAPHS).
static int cuda_graph_reserve(const pg_engine_config *cfg, int32_t max_seqs, int32_t max_len, bool lora,
                              int64_t *out) {
    pg_graph_mode mode;
    PG_TRY(pg_graph_mode_parse(cfg->cuda_graphs, &mode));
    *out = pg_runner_graphs_wanted(mode)
               ? pg_runner_graph_reserve(max_seqs, max_len, PG_RUNNER_GRAPH_MIN_BYTES, lora ? 2 : 1)
               : 0;
    return 0;
}

// --- the plan -------------------------------------------------------------------------

// The LoRA adapters named at start-up: read (their headers and shapes,
// checked against the model as start-up checks them), and each rank's
// share of the slots' worth added to its weights: with more adapters than
// slots, the largest as many as there are slots (the most the slots hold at
// once of these; engine/engine_lora.c brings the others in on demand).
static int plan_lora(const pg_engine_config *cfg, pg_memplan *p) {
    p->lora_slots = pg_engine_lora_slots(cfg);
    p->lora_adapters = cfg->enable_lora ? cfg->n_lora : 0;
    const int32_t n = p->lora_adapters, tp = p->tp;
    if (n == 0) return 0;
    int64_t *bytes = pg_xcalloc((size_t)n * (size_t)tp, sizeof(int64_t)); // [adapter][rank]
    int rc = 0;
    for (int32_t i = 0; i < n && rc == 0; i++) {
        pg_lora_adapter *ad = NULL;
        rc = pg_lora_adapter_load(cfg->lora_paths[i], &p->mc, pg_engine_max_lora_rank(cfg), &ad);
        for (int32_t r = 0; rc == 0 && r < tp; r++) {
            pg_model_shard sh;
            rc = pg_model_shard_plan(&p->mc, r, tp, cfg->expert_parallel, &sh);
            if (rc == 0) bytes[(size_t)i * tp + r] = pg_lora_rank_bytes(ad, &p->mc, &sh);
        }
        pg_lora_adapter_free(ad); // (NULL: nothing)
    }
    // The largest by rank 0's share (every rank's share scales alike).
    bool *taken = pg_xcalloc((size_t)n, sizeof(bool));
    for (int32_t k = 0; rc == 0 && k < n && k < p->lora_slots; k++) {
        int32_t best = -1;
        for (int32_t i = 0; i < n; i++)
            if (!taken[i] && (best < 0 || bytes[(size_t)i * tp] > bytes[(size_t)best * tp])) best = i;
        taken[best] = true;
        for (int32_t r = 0; r < tp; r++) {
            p->ranks[r].lora += bytes[(size_t)best * tp + r];
            p->ranks[r].weights += bytes[(size_t)best * tp + r];
        }
    }
    free(taken);
    free(bytes);
    return rc;
}

// Speculative decoding's draft model on rank 0 (engine/draft_model.h): its
// weights as the backend holds them, its KV blocks and its runner's
// workspace, as pg_draft_create allocates them (0 without one).
static int plan_draft(const pg_engine_config *cfg, const pg_backend_caps *caps, bool cuda, int32_t max_model_len,
                      int32_t kv_dtype, int64_t *bytes) {
    *bytes = 0;
    if (!cfg->spec.draft) return 0;
    const pg_model_load_opts mo = {.path = cfg->spec.draft_model};
    pg_model_config dmc;
    pg_offload_plan off;
    int64_t weights = 0, qmax = 0;
    PG_TRY(pg_model_weight_plan(&mo, 0, 1, caps, &dmc, &weights, &off, &qmax));
    const pg_draft_config dc = {.model_path = cfg->spec.draft_model, .k = cfg->spec.draft_k,
                                .max_model_len = max_model_len, .vocab_size = dmc.vocab_size,
                                .kv_dtype = kv_dtype, .max_seqs = cfg->spec.max_running_seqs};
    const pg_runner_config rc = pg_draft_runner_config(&dc);
    pg_model_shard sh;
    PG_TRY(pg_model_shard_plan(&dmc, 0, 1, false, &sh));
    int32_t max_tokens, max_seqs;
    pg_runner_ws_limits(&rc, &max_tokens, &max_seqs);
    const pg_runner_ws_sizes sizes = {
        .attn = cuda ? cuda_attn_ws(max_seqs, sh.n_heads, sh.n_kv_heads, dmc.head_dim, max_model_len) : 0,
        .sample = cuda ? pg_cuda_sample_workspace_size(max_seqs, dmc.vocab_size) : 0};
    pg_runner_ws_plan wp;
    pg_runner_workspace_plan(&dmc, &sh, &rc, cuda ? PG_DTYPE_BF16 : PG_DTYPE_F32, &sizes, &wp);
    const int64_t kv = (int64_t)pg_draft_kv_blocks(&dc) *
                       (int64_t)kv_block_bytes(cuda, kv_dtype, &dmc, dmc.n_layers, sh.n_kv_heads, rc.block_size);
    *bytes = weights + kv + (int64_t)wp.bytes;
    return 0;
}

int pg_memplan_compute(const pg_memplan_in *in, pg_memplan *p) {
    memset(p, 0, sizeof *p);
    const pg_engine_config *cfg = &in->cfg;
    const bool cuda = in->cuda;
    int32_t kv_parsed;
    PG_TRY(pg_kv_dtype_parse(cfg->kv_cache_dtype, !cuda, &kv_parsed));
    if (cuda && in->device_total <= 0)
        return pg_err_set(PG_EINVAL, "no GPU size to plan for: pass --device-memory BYTES (e.g. 141G for an H200)");
    const int32_t tp = cfg->tensor_parallel > 1 ? cfg->tensor_parallel : 1;
    if (tp > PG_MEMPLAN_MAX_RANKS) return pg_err_set(PG_EINVAL, "-tp %d: at most %d ranks", tp, PG_MEMPLAN_MAX_RANKS);
    const bool dummy = cfg->load_format && !strcmp(cfg->load_format, "dummy");
    const pg_model_load_opts mo = {.path = cfg->model_path, .dummy = dummy, .hf_config = cfg->hf_config,
                                   .quantization = cfg->quantization, .cpu_offload_bytes = cfg->cpu_offload_bytes,
                                   .expert_parallel = cfg->expert_parallel};
    // What the backend would do with each weight: asked of its kind
    // (kernels/backend.h pg_backend_caps), which a live backend answers too.
    const pg_backend_caps *caps = cuda ? pg_backend_cuda_caps() : pg_backend_cpu_caps();
    p->cuda = cuda;
    p->tp = tp;
    p->quantization = cfg->quantization;
    for (int32_t r = 0; r < tp; r++)
        PG_TRY(pg_model_weight_plan(&mo, r, tp, caps, &p->mc, &p->ranks[r].weights, &p->ranks[r].offload,
                                    &p->ranks[r].quant_max_elems));
    const pg_model_config *mc = &p->mc;
    PG_TRY(plan_lora(cfg, p));
    PG_TRY(pg_kv_dtype_resolve(cfg, !cuda, mc->head_dim, &p->kv_dtype));
    if (cuda) PG_TRY(pg_cuda_head_dim_check(mc->head_dim)); // start-up's refusal, said before loading
    p->kv_fp8 = p->kv_dtype == PG_KV_FP8_E4M3;

    // The limits start-up runs with (engine/setup.c).
    sched_config sc = pg_engine_sched_limits(cfg, !cuda);
    p->block_size = sc.block_size;
    p->max_num_seqs = sc.max_num_seqs;
    p->max_num_batched_tokens = sc.max_num_batched_tokens;
    p->max_model_len = cfg->max_model_len > 0 ? cfg->max_model_len : mc->max_pos;
    if (mc->sliding_window > 0 && p->max_model_len > mc->sliding_window && pg_model_attn_window(mc, caps) == 0)
        p->max_model_len = mc->sliding_window;
    p->plan_seq_len = in->plan_seq_len > 0 ? in->plan_seq_len : p->max_model_len;
    pg_kv_layout lay; // start-up's layer groups (engine/setup.c)
    pg_engine_kv_groups(cfg, mc, caps, &sc, &lay);
    p->kv_groups = lay.n_groups;
    p->kv_group_window = lay.window[lay.n_groups - 1];
    p->kv_layers_per_block = lay.n_slots;
    p->util = pg_engine_gpu_memory_utilization(cfg);
    p->device_total = cuda ? in->device_total : 0;
    const pg_runner_config rc = {.block_size = p->block_size, .max_num_seqs = p->max_num_seqs,
                                 .max_num_batched_tokens = p->max_num_batched_tokens,
                                 .max_model_len = p->max_model_len,
                                 .kv_dtype = p->kv_dtype, .kv_scales = cfg->kv_cache_scales};
    int32_t max_tokens, max_seqs;
    pg_runner_ws_limits(&rc, &max_tokens, &max_seqs);

    PG_TRY(plan_draft(cfg, caps, cuda, p->max_model_len, p->kv_dtype, &p->ranks[0].draft));
    int64_t budget = INT64_MAX;
    for (int32_t r = 0; r < tp; r++) {
        pg_model_shard sh;
        PG_TRY(pg_model_shard_plan(mc, r, tp, cfg->expert_parallel, &sh));
        pg_memplan_rank *k = &p->ranks[r];
        const size_t attn = cuda ? cuda_attn_ws(max_seqs, sh.n_heads, sh.n_kv_heads, mc->head_dim, p->max_model_len) : 0;
        const size_t samp = cuda ? pg_cuda_sample_workspace_size(max_seqs, mc->vocab_size) : 0;
        pg_runner_ws_plan wp;
        // The CPU's MoE workspace (CUDA has no MoE op yet: start-up refuses).
        const size_t moe = !cuda && mc->n_experts > 0
                               ? pg_cpu_moe_workspace_bytes(NULL, max_tokens, mc->hidden, sh.moe_ffn, mc->n_experts,
                                                            mc->n_experts_used)
                               : 0;
        // The lora_apply workspace, as the runner sizes it (engine/runner/runner.c):
        // the backend's lora_workspace_bytes for max_tokens rows at --max-lora-rank.
        const int32_t lw = pg_model_lora_width(mc, &sh), lrank = pg_engine_max_lora_rank(cfg);
        const size_t lora = p->lora_slots <= 0 ? 0
                            : cuda ? pg_cuda_lora_workspace_size(max_tokens, lw, lrank)
                                   : pg_cpu_lora_workspace_bytes(NULL, max_tokens, lw, lw, lrank, p->lora_slots);
        const pg_runner_ws_sizes sizes = {.attn = attn, .sample = samp, .moe = moe, .lora = lora};
        pg_runner_workspace_plan(mc, &sh, &rc, cuda ? PG_DTYPE_BF16 : PG_DTYPE_F32, &sizes, &wp);
        k->workspace_buffers = (int64_t)wp.bytes;
        // CUDA: the profiled extra, and for weights kept quantized the bf16
        // scratch their large-batch products dequantize into (backend_cuda.cu,
        // sized for the largest such matrix at the profiling forward).
        k->workspace_extra = cuda ? CUDA_PROFILE_EXTRA + 2 * k->quant_max_elems : 0;
        k->workspace = k->workspace_buffers + k->workspace_extra;
        if (r == 0) p->experts_per_rank = mc->n_experts > 0 ? sh.n_exp : 0;
        if (r == 0) p->per_block = kv_block_bytes(cuda, p->kv_dtype, mc, lay.n_slots, sh.n_kv_heads, p->block_size);
        if (!cuda) continue;
        if (p->lora_slots > 0) { // the slot table the decode graphs' LoRA reads (engine/model/lora.c)
            const int64_t tb = (int64_t)sizeof(pg_lora_dev_slot) * mc->n_layers * PG_LORA_MODULES * p->lora_slots;
            k->lora += tb;
            k->weights += tb;
        }
        PG_TRY(cuda_graph_reserve(cfg, max_seqs, p->max_model_len, p->lora_slots > 0, &k->graphs));
        k->other = in->device_other >= 0 ? in->device_other : CUDA_OTHER_ESTIMATE;
        k->reserved = in->device_total - (int64_t)(p->util * (double)in->device_total);
        // Start-up's budget (engine/setup.c) of what this rank would have in use.
        const int64_t b =
            pg_engine_gpu_kv_budget(cfg, in->device_total, k->other + k->weights + k->workspace + k->draft, k->graphs);
        if (b < budget) budget = b;
    }

    int64_t kv_bytes;
    if (cuda) {
        kv_bytes = cfg->kv_cache_bytes > 0 ? cfg->kv_cache_bytes : budget;
        if (kv_bytes < (int64_t)p->per_block * 2) {
            snprintf(p->why, sizeof p->why,
                     "no device memory left for the KV cache: %.2f GiB of %.2f GiB at --gpu-memory-utilization %.2f "
                     "go to weights, workspace, graphs and the CUDA context",
                     (double)(p->util * (double)in->device_total - (double)budget) / GiB,
                     (double)in->device_total / GiB, p->util);
            kv_bytes = 0;
        }
    } else {
        kv_bytes = pg_engine_cpu_kv_bytes(cfg, tp);
    }
    p->kv_blocks = pg_engine_kv_blocks(cfg, kv_bytes, p->per_block); // kv_bytes 0 (no room): 0 blocks
    p->kv_tokens = p->kv_blocks > 0 ? (int64_t)(p->kv_blocks - 1) * p->block_size : 0;
    p->host_blocks = pg_host_kv_blocks(cfg, cuda, p->kv_blocks, p->per_block, pg_host_ram_bytes());
    for (int32_t r = 0; r < tp; r++) {
        pg_memplan_rank *k = &p->ranks[r];
        k->kv = (int64_t)p->kv_blocks * (int64_t)p->per_block;
        if (cuda) k->free = in->device_total - k->other - k->weights - k->workspace - k->draft - k->graphs - k->kv;
    }
    // A sequence's blocks: with layer groups every group's (a windowed one
    // at most its window and a step's tokens: pg_engine_kv_blocks_needed).
    const int32_t per_seq = pg_engine_kv_blocks_needed(p->plan_seq_len, &sc) - 1;
    p->seqs = p->kv_blocks > 1 ? (int64_t)(p->kv_blocks - 1) / per_seq : 0;
    p->need_blocks = pg_engine_kv_blocks_needed(p->max_model_len, &sc);
    p->kv_group_gain = pg_engine_kv_group_gain(&sc, &lay, p->plan_seq_len);
    if (lay.n_groups > 1 || lay.window[0] > 0)
        p->kv_tokens = p->kv_blocks > 1 ? (int64_t)((double)(p->kv_blocks - 1) * p->plan_seq_len / per_seq) : 0;
    p->fits = !p->why[0] && p->kv_blocks >= p->need_blocks;
    if (!p->why[0] && !p->fits)
        snprintf(p->why, sizeof p->why,
                 "KV cache of %d blocks (%lld tokens) cannot hold one sequence of max model length %d",
                 p->kv_blocks, (long long)p->kv_tokens, p->max_model_len);
    if (cuda && p->ranks[0].free < 0 && p->fits) {
        p->fits = false;
        snprintf(p->why, sizeof p->why, "the KV cache (--kv-cache-memory) is larger than the %.2f GiB the GPU has left",
                 (double)(budget + p->ranks[0].reserved) / GiB);
    }
    return 0;
}

// --- advice ---------------------------------------------------------------------------

typedef struct {
    pg_memplan_advice *out;
    int n, cap;
} adv_list;

// Adds `flags` when the plan of `in` with them fits; true when it did.
static bool try_add(adv_list *a, const pg_memplan_in *in, const char *flags) {
    if (a->n >= a->cap) return false;
    pg_memplan_advice *x = &a->out[a->n];
    if (pg_memplan_compute(in, &x->plan) < 0 || !x->plan.fits) return false;
    snprintf(x->flags, sizeof x->flags, "%s", flags);
    a->n++;
    return true;
}

int pg_memplan_advise(const pg_memplan_in *in0, pg_memplan_advice *out, int cap) {
    pg_memplan *p = malloc(sizeof *p);
    if (!p) return 0;
    if (pg_memplan_compute(in0, p) < 0) {
        free(p);
        return 0;
    }
    adv_list a = {out, 0, cap};
    char f[96];
    // A shorter max model length: the tokens the pool holds (the workspace
    // shrinks with it, so a few rounds settle it).
    if (p->kv_blocks >= 2) {
        pg_memplan_in in = *in0;
        int64_t len = p->kv_tokens;
        for (int round = 0; round < 4 && len > 0 && len < p->max_model_len; round++) {
            in.cfg.max_model_len = (int32_t)len;
            snprintf(f, sizeof f, "--max-model-len %lld", (long long)len);
            if (try_add(&a, &in, f)) break;
            pg_memplan q;
            if (pg_memplan_compute(&in, &q) < 0 || q.kv_blocks < 2) break;
            len = q.kv_tokens < len ? q.kv_tokens : len - p->block_size;
        }
    }
    // A larger pool: the blocks one sequence needs.
    if (in0->cfg.kv_blocks > 0) {
        pg_memplan_in in = *in0;
        in.cfg.kv_blocks = p->need_blocks;
        snprintf(f, sizeof f, "--kv-blocks %d", p->need_blocks);
        try_add(&a, &in, f);
    } else if (!p->cuda || in0->cfg.kv_cache_bytes > 0) {
        pg_memplan_in in = *in0;
        const int64_t need = (int64_t)p->need_blocks * (int64_t)p->per_block * (p->cuda ? 1 : p->tp);
        in.cfg.kv_cache_bytes = (need + MiB - 1) / MiB * MiB;
        snprintf(f, sizeof f, "--kv-cache-memory %lldM", (long long)(in.cfg.kv_cache_bytes / MiB));
        try_add(&a, &in, f);
    }
    if (p->cuda) {
        if (!p->kv_fp8) {
            pg_memplan_in in = *in0;
            in.cfg.kv_cache_dtype = "fp8";
            try_add(&a, &in, "--kv-cache-dtype fp8");
        }
        for (int32_t t = 2; t <= 8; t *= 2) {
            if (t <= p->tp) continue;
            pg_memplan_in in = *in0;
            in.cfg.tensor_parallel = t;
            snprintf(f, sizeof f, "-tp %d", t);
            if (try_add(&a, &in, f)) break;
        }
        for (int32_t s = p->max_num_seqs / 2; s >= 1; s /= 2) {
            pg_memplan_in in = *in0;
            in.cfg.sched.max_num_seqs = s;
            snprintf(f, sizeof f, "--max-num-seqs %d", s);
            if (try_add(&a, &in, f)) break;
        }
        for (int32_t t = p->max_num_batched_tokens / 2; t >= 64; t /= 2) {
            pg_memplan_in in = *in0;
            in.cfg.sched.max_num_batched_tokens = t;
            in.cfg.batched_tokens_set = true;
            snprintf(f, sizeof f, "--max-num-batched-tokens %d", t);
            if (try_add(&a, &in, f)) break;
        }
        // CPU offload: the fewest whole GiB of layer weights in host memory
        // (doubling, then the exact count) that leave room for the KV cache.
        if (in0->cfg.cpu_offload_bytes <= 0 && p->ranks[0].weights > 0) {
            pg_memplan_in in = *in0;
            const int64_t max_gib = p->ranks[0].weights / GiB + 1;
            int64_t lo = 0, hi = 0;
            for (int64_t g = 1; g <= 2 * max_gib; g *= 2) {
                pg_memplan q;
                in.cfg.cpu_offload_bytes = g * GiB;
                if (pg_memplan_compute(&in, &q) == 0 && q.fits) {
                    hi = g;
                    break;
                }
                lo = g;
            }
            while (hi && hi - lo > 1) {
                const int64_t mid = (lo + hi) / 2;
                pg_memplan q;
                in.cfg.cpu_offload_bytes = mid * GiB;
                if (pg_memplan_compute(&in, &q) == 0 && q.fits) hi = mid;
                else lo = mid;
            }
            if (hi) {
                in.cfg.cpu_offload_bytes = hi * GiB;
                snprintf(f, sizeof f, "--cpu-offload-gb %lld", (long long)hi);
                try_add(&a, &in, f);
            }
        }
        if (p->util < 0.95 && in0->cfg.kv_cache_bytes <= 0) {
            pg_memplan_in in = *in0;
            in.cfg.gpu_memory_utilization = 0.95;
            try_add(&a, &in, "--gpu-memory-utilization 0.95");
        }
    }
    free(p);
    return a.n;
}

// --- output ---------------------------------------------------------------------------

// A growing string (server/sbuf.h is above this module).
typedef struct {
    char *p;
    size_t len, cap;
} sbuf_min;

__attribute__((format(printf, 2, 3))) static void sbm_printf(sbuf_min *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const size_t room = b->cap - b->len;
        const int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (b->p && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        b->cap = (b->cap ? b->cap : 1024) * 2 + (size_t)n;
        b->p = pg_xrealloc(b->p, b->cap);
    }
}

static char *sbm_take(sbuf_min *b) {
    if (!b->p) sbm_printf(b, "%s", "");
    return b->p;
}

static void put_size(sbuf_min *b, int64_t v) {
    if (v >= GiB || v <= -GiB)
        sbm_printf(b, "%9.2f GiB", (double)v / GiB);
    else
        sbm_printf(b, "%9.1f MiB", (double)v / MiB);
}

static void advice_line(sbuf_min *b, const pg_memplan_advice *x) {
    const pg_memplan *q = &x->plan;
    sbm_printf(b, "  %s: KV cache %lld tokens (%d blocks), %lld sequence%s of %d tokens (max model length %d)\n",
               x->flags, (long long)q->kv_tokens, q->kv_blocks - 1, (long long)q->seqs, q->seqs == 1 ? "" : "s",
               q->plan_seq_len, q->max_model_len);
}

char *pg_memplan_advice_text(const pg_memplan_advice *adv, int n) {
    sbuf_min b = {0};
    for (int i = 0; i < n; i++) advice_line(&b, &adv[i]);
    return sbm_take(&b);
}

char *pg_memplan_text(const pg_memplan *p, const pg_memplan_advice *adv, int n_adv) {
    sbuf_min b = {0};
    const pg_model_config *mc = &p->mc;
    sbm_printf(&b, "model %s (%s): %d layers, hidden %d, %d/%d heads (head dim %d), FFN %d, vocab %d, %d positions\n",
               mc->name[0] ? mc->name : "?", mc->arch, mc->n_layers, mc->hidden, mc->n_heads, mc->n_kv_heads,
               mc->head_dim, mc->ffn, mc->vocab_size, mc->max_pos);
    if (mc->n_experts > 0) {
        int64_t total, active;
        pg_config_params(mc, &total, &active);
        sbm_printf(&b, "experts: %d of FFN %d per MoE layer (every %d), %d used per token; parameters %.3g B total, "
                       "%.3g B active\n",
                   mc->n_experts, mc->moe_ffn, mc->moe_step, mc->n_experts_used, total / 1e9, active / 1e9);
        if (p->experts_per_rank < mc->n_experts)
            sbm_printf(&b, "expert parallel: %d whole experts per rank (weights below are per rank)\n",
                       p->experts_per_rank);
    }
    if (p->lora_slots > 0)
        sbm_printf(&b, "LoRA: %d slot%s (--max-loras), %d adapter%s named, %.1f MiB of them on rank 0 (in the weights "
                       "below)\n", p->lora_slots, p->lora_slots == 1 ? "" : "s", p->lora_adapters,
                   p->lora_adapters == 1 ? "" : "s", (double)p->ranks[0].lora / (1 << 20));
    if (p->cuda)
        sbm_printf(&b, "device cuda: %.2f GiB per GPU, --gpu-memory-utilization %.2f, %d rank%s\n",
                   (double)p->device_total / GiB, p->util, p->tp, p->tp > 1 ? "s" : "");
    else
        sbm_printf(&b, "device cpu: host memory, %d rank%s\n", p->tp, p->tp > 1 ? "s" : "");
    sbm_printf(&b, "limits: max model length %d, %d tokens / %d sequences per step, blocks of %d tokens\n",
               p->max_model_len, p->max_num_batched_tokens, p->max_num_seqs, p->block_size);
    for (int32_t r = 0; r < p->tp; r++) {
        const pg_memplan_rank *k = &p->ranks[r];
        if (r > 0 && !memcmp(k, &p->ranks[0], sizeof *k)) continue; // the same as rank 0
        if (p->tp > 1)
            sbm_printf(&b, "rank %d%s:\n", r, r == 0 ? " (and every rank the same as it)" : "");
        else
            sbm_printf(&b, "memory:\n");
        sbm_printf(&b, "  weights   "), put_size(&b, k->weights), sbm_printf(&b, "  (%s)\n",
            p->mc.ckpt_quant != PG_QUANT_NONE ? "layer matrices int4 from the AWQ / GPTQ checkpoint, the rest as stored"
            : p->quantization != PG_QUANT_NONE ? "layer matrices quantized at load, the rest as stored"
            : p->cuda ? (k->quant_max_elems ? "FP8 layer matrices as stored, the rest bf16 on the GPU"
                                            : "bf16 on the GPU: types it does not run in place are dequantized")
                      : "as stored, mapped");
        if (k->offload.n_layers)
            sbm_printf(&b, "  offloaded "), put_size(&b, k->offload.host_bytes),
                sbm_printf(&b, "  (--cpu-offload-gb: layers 0-%d in host memory, streamed through %d device "
                              "slot%s of %.1f MiB, which weights include)\n",
                           k->offload.n_layers - 1, k->offload.n_slots, k->offload.n_slots > 1 ? "s" : "",
                           (double)k->offload.slot_bytes / MiB);
        sbm_printf(&b, "  KV cache  "), put_size(&b, k->kv),
            sbm_printf(&b, "  (%s, %zu bytes per block)\n", kv_name(p), p->per_block);
        if (k->draft)
            sbm_printf(&b, "  draft     "), put_size(&b, k->draft),
                sbm_printf(&b, "  (speculative decoding's draft model: weights, its KV, its workspace)\n");
        sbm_printf(&b, "  workspace "), put_size(&b, k->workspace);
        if (p->cuda)
            sbm_printf(&b, "  (buffers %.1f MiB + profiled extra %.1f MiB, estimate)\n",
                       (double)k->workspace_buffers / MiB, (double)k->workspace_extra / MiB);
        else
            sbm_printf(&b, "  (buffers for %d tokens / %d sequences per step)\n", p->max_num_batched_tokens,
                       p->max_num_seqs);
        if (p->cuda) {
            sbm_printf(&b, "  graphs    "), put_size(&b, k->graphs), sbm_printf(&b, "  (reserve, estimate)\n");
            sbm_printf(&b, "  other     "), put_size(&b, k->other), sbm_printf(&b, "  (CUDA context, estimate)\n");
            sbm_printf(&b, "  free      "), put_size(&b, k->free),
                sbm_printf(&b, "  (of which %.2f GiB outside --gpu-memory-utilization %.2f)\n",
                           (double)k->reserved / GiB, p->util);
        }
    }
    if (p->kv_groups > 1 || p->kv_group_window > 0) // a block is one group's share of the layers
        sbm_printf(&b, "KV cache: %d blocks x %d tokens x %d layers = %lld tokens of %d-token sequences%s; swap %d blocks\n",
                   p->kv_blocks > 0 ? p->kv_blocks - 1 : 0, p->block_size, p->kv_layers_per_block,
                   (long long)p->kv_tokens, p->plan_seq_len, p->tp > 1 ? " (each rank: its heads of every block)" : "",
                   p->host_blocks);
    else
        sbm_printf(&b, "KV cache: %d blocks x %d tokens = %lld tokens%s; swap %d blocks\n", p->kv_blocks > 0 ? p->kv_blocks - 1 : 0,
                   p->block_size, (long long)p->kv_tokens, p->tp > 1 ? " (each rank: its heads of every block)" : "",
                   p->host_blocks);
    if (p->kv_groups > 1 || p->kv_group_window > 0)
        sbm_printf(&b,
                   "KV layer groups: %d block tables a sequence, %d layers a block, window %d: %.2fx the tokens of "
                   "%d-token sequences of one table for every layer (--disable-hybrid-kv-cache-manager)\n",
                   p->kv_groups, p->kv_layers_per_block, p->kv_group_window, p->kv_group_gain, p->plan_seq_len);
    sbm_printf(&b, "concurrent sequences of %d tokens: %lld\n", p->plan_seq_len, (long long)p->seqs);
    if (!p->fits) {
        sbm_printf(&b, "does not fit: %s\n", p->why);
        if (n_adv) {
            sbm_printf(&b, "would fit:\n");
            for (int i = 0; i < n_adv; i++) advice_line(&b, &adv[i]);
        } else {
            sbm_printf(&b, "no flag of this build makes it fit\n");
        }
    }
    return sbm_take(&b);
}

static void json_plan(sbuf_min *b, const pg_memplan *p) {
    sbm_printf(b, "{\"device\":\"%s\",\"tensor_parallel\":%d,\"kv_cache_dtype\":\"%s\",\"max_model_len\":%d,"
                  "\"max_num_seqs\":%d,\"max_num_batched_tokens\":%d,\"block_size\":%d,",
               p->cuda ? "cuda" : "cpu", p->tp, kv_name(p), p->max_model_len,
               p->max_num_seqs, p->max_num_batched_tokens, p->block_size);
    if (p->cuda)
        sbm_printf(b, "\"device_memory_bytes\":%lld,\"gpu_memory_utilization\":%.4f,", (long long)p->device_total,
                   p->util);
    sbm_printf(b, "\"ranks\":[");
    for (int32_t r = 0; r < p->tp; r++) {
        const pg_memplan_rank *k = &p->ranks[r];
        sbm_printf(b, "%s{\"rank\":%d,\"weights_bytes\":%lld,\"kv_cache_bytes\":%lld,\"workspace_bytes\":%lld,"
                      "\"workspace_buffers_bytes\":%lld,\"workspace_extra_bytes\":%lld,\"graphs_bytes\":%lld,"
                      "\"other_bytes\":%lld,\"reserved_bytes\":%lld,\"free_bytes\":%lld,"
                      "\"offloaded_layers\":%d,\"offloaded_host_bytes\":%lld,\"offload_slot_bytes\":%lld,"
                      "\"lora_bytes\":%lld,\"draft_bytes\":%lld}",
                   r ? "," : "", r, (long long)k->weights, (long long)k->kv, (long long)k->workspace,
                   (long long)k->workspace_buffers, (long long)k->workspace_extra, (long long)k->graphs,
                   (long long)k->other, (long long)k->reserved, (long long)k->free, k->offload.n_layers,
                   (long long)k->offload.host_bytes, (long long)k->offload.slot_bytes, (long long)k->lora,
                   (long long)k->draft);
    }
    sbm_printf(b, "],\"kv_block_bytes\":%zu,\"kv_bytes_per_token\":%zu,\"kv_blocks\":%d,\"kv_tokens\":%lld,"
                  "\"swap_blocks\":%d,\"plan_seq_len\":%d,\"sequences\":%lld,\"fits\":%s,"
                  "\"kv_groups\":%d,\"kv_group_window\":%d,\"kv_layers_per_block\":%d,\"kv_group_gain\":%.4f",
               p->per_block, p->per_block / (size_t)p->block_size, p->kv_blocks > 0 ? p->kv_blocks - 1 : 0,
               (long long)p->kv_tokens, p->host_blocks, p->plan_seq_len, (long long)p->seqs,
               p->fits ? "true" : "false", p->kv_groups, p->kv_group_window, p->kv_layers_per_block,
               p->kv_group_gain);
    if (!p->fits) {
        sbm_printf(b, ",\"why\":\"");
        for (const char *c = p->why; *c; c++) sbm_printf(b, *c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
        sbm_printf(b, "\"");
    }
    sbm_printf(b, "}");
}

char *pg_memplan_json(const pg_memplan *p, const pg_memplan_advice *adv, int n_adv) {
    sbuf_min b = {0};
    const pg_model_config *mc = &p->mc;
    sbm_printf(&b, "{\"model\":{\"arch\":\"%s\",\"n_layers\":%d,\"hidden\":%d,\"n_heads\":%d,\"n_kv_heads\":%d,"
                   "\"head_dim\":%d,\"ffn\":%d,\"vocab_size\":%d,\"max_position_embeddings\":%d",
               mc->arch, mc->n_layers, mc->hidden, mc->n_heads, mc->n_kv_heads, mc->head_dim, mc->ffn, mc->vocab_size,
               mc->max_pos);
    int64_t total, active;
    pg_config_params(mc, &total, &active);
    if (mc->n_experts > 0)
        sbm_printf(&b, ",\"n_experts\":%d,\"n_experts_used\":%d,\"moe_ffn\":%d,\"moe_step\":%d,\"experts_per_rank\":%d",
                   mc->n_experts, mc->n_experts_used, mc->moe_ffn, mc->moe_step, p->experts_per_rank);
    sbm_printf(&b, ",\"params_total\":%lld,\"params_active\":%lld},\"plan\":", (long long)total,
               (long long)active);
    json_plan(&b, p);
    sbm_printf(&b, ",\"advice\":[");
    for (int i = 0; i < n_adv; i++) {
        sbm_printf(&b, "%s{\"flags\":\"%s\",\"plan\":", i ? "," : "", adv[i].flags);
        json_plan(&b, &adv[i].plan);
        sbm_printf(&b, "}");
    }
    sbm_printf(&b, "]}\n");
    return sbm_take(&b);
}

int pg_memplan_refuse(const pg_engine_config *cfg, bool cuda, int64_t device_total, int64_t device_other, int code,
                      const char *msg) {
    char first[768];
    snprintf(first, sizeof first, "%s", msg);
    pg_memplan_in in = {.cfg = *cfg, .cuda = cuda, .device_total = device_total,
                        .device_other = cuda ? device_other : -1};
    pg_memplan_advice *adv = malloc(sizeof *adv * PG_MEMPLAN_MAX_ADVICE);
    const int n = adv ? pg_memplan_advise(&in, adv, PG_MEMPLAN_MAX_ADVICE) : 0;
    char flags[256] = "";
    size_t len = 0;
    if (n) PG_LOGE("would fit (`paged plan` with the same flags says more):");
    for (int i = 0; i < n; i++) {
        const pg_memplan *q = &adv[i].plan;
        PG_LOGE("  %s: KV cache %lld tokens (%d blocks), %lld sequence%s of %d tokens", adv[i].flags,
                (long long)q->kv_tokens, q->kv_blocks - 1, (long long)q->seqs, q->seqs == 1 ? "" : "s",
                q->plan_seq_len);
        int k = snprintf(flags + len, sizeof flags - len, "%s%s", i ? " | " : "", adv[i].flags);
        if (k > 0 && (size_t)k < sizeof flags - len) len += (size_t)k;
    }
    free(adv);
    return n ? pg_err_set(code, "%s; would fit: %s", first, flags) : pg_err_set(code, "%s", first);
}

int pg_memplan_local_gpu(int64_t *total, int64_t *in_use) {
    char why[160];
    if (pg_backend_cuda_probe(why, sizeof why) <= 0) return pg_err_set(PG_EUNSUPP, "no GPU here (%s)", why);
    pg_backend *be;
    PG_TRY(pg_backend_cuda_create(0, &be));
    int64_t free_b = 0;
    int rc = be->dev->mem_info(be, &free_b, total);
    be->dev->destroy(be);
    *in_use = *total - free_b;
    return rc;
}

// ---------------------------------------------------------------------------
// Host KV blocks

int64_t pg_host_ram_bytes(void) {
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (int64_t)pages * (int64_t)size : 0;
}

int32_t pg_host_kv_blocks(const pg_engine_config *cfg, bool cuda, int32_t kv_blocks, size_t per_block,
                          int64_t host_ram) {
    if (per_block == 0) return 0;
    int64_t host = 0;
    if (cfg->swap_bytes >= 0) {
        host = cfg->swap_bytes / (int64_t)per_block;
    } else if (cuda) {
        int64_t bytes = DEFAULT_GPU_SWAP_BYTES;
        if (host_ram > 0 && bytes > host_ram / 10) bytes = host_ram / 10;
        host = bytes / (int64_t)per_block;
    }
    if (cfg->sched.preemption_mode == SCHED_PREEMPT_SWAP && host == 0) {
        host = kv_blocks;
        if (cuda && host * (int64_t)per_block > DEFAULT_GPU_SWAP_BYTES) host = DEFAULT_GPU_SWAP_BYTES / (int64_t)per_block;
    }
    return host > INT32_MAX / 2 ? INT32_MAX / 2 : (int32_t)host;
}
