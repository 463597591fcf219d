// engine/sizing.c - the engine's defaults and sizing rules (engine/engine.h):
// the step limits, the GPU memory share, the CPU KV budget, KV blocks, the
// device choice, the LoRA slots and rank. One place, read by set-up (engine/setup.c) and by the
// memory plan (engine/memplan.c, `paged plan`), which must reach the same
// numbers without starting an engine; below both, so neither calls into
// the other for them.
#include <stdint.h>
#include <string.h>

#include "engine/engine.h"

sched_config pg_engine_sched_limits(const pg_engine_config *cfg, bool on_cpu) {
    sched_config sc = cfg->sched;
    if (sc.block_size <= 0) sc.block_size = SCHED_DEFAULT_BLOCK_SIZE;
    // The step budget per device: on the CPU 2048 tokens are seconds of
    // work, during which every running stream waits; 256 keeps a step near a
    // few hundred milliseconds on the default model (issue 18's measurements,
    // docs/benchmarks.md), and the long-prefill cap follows at a quarter.
    // Without chunked prefill a prompt must fit one step: keep the larger one.
    if (!cfg->batched_tokens_set && on_cpu && sc.enable_chunked_prefill)
        sc.max_num_batched_tokens = PG_DEFAULT_CPU_BATCHED_TOKENS;
    return sc;
}

double pg_engine_gpu_memory_utilization(const pg_engine_config *cfg) {
    return cfg->gpu_memory_utilization > 0 ? cfg->gpu_memory_utilization : PG_DEFAULT_GPU_MEMORY_UTILIZATION;
}

int64_t pg_engine_cpu_kv_bytes(const pg_engine_config *cfg, int32_t tp) {
    return (cfg->kv_cache_bytes > 0 ? cfg->kv_cache_bytes : (int64_t)PG_DEFAULT_CPU_KV_GIB << 30) / tp;
}

int64_t pg_engine_gpu_kv_budget(const pg_engine_config *cfg, int64_t total, int64_t in_use, int64_t graphs_reserved) {
    return (int64_t)(pg_engine_gpu_memory_utilization(cfg) * (double)total) - in_use - graphs_reserved;
}

int32_t pg_engine_kv_blocks(const pg_engine_config *cfg, int64_t kv_bytes, size_t per_block) {
    const int64_t n = cfg->kv_blocks > 0 ? cfg->kv_blocks : kv_bytes / (int64_t)per_block;
    return n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

int32_t pg_engine_kv_blocks_needed(int32_t max_model_len, const sched_config *sc) {
    kvp_config kc;
    kvp_config_default(&kc);
    kc.block_size = sc->block_size;
    kc.n_groups = sc->kv_groups;
    memcpy(kc.group_window, sc->kv_group_window, sizeof kc.group_window);
    const int64_t n = kvp_config_blocks_for(&kc, max_model_len, sc->max_num_batched_tokens) + 1;
    return n > INT32_MAX ? INT32_MAX : (int32_t)n;
}

double pg_engine_kv_group_gain(const sched_config *sc, const pg_kv_layout *lay, int32_t n_tokens) {
    const int64_t plain = (int64_t)(n_tokens + sc->block_size - 1) / sc->block_size * lay->n_layers;
    const int64_t grouped = (pg_engine_kv_blocks_needed(n_tokens, sc) - 1) * (int64_t)lay->n_slots;
    return grouped > 0 ? (double)plain / (double)grouped : 1.0;
}

void pg_engine_kv_groups(const pg_engine_config *cfg, const pg_model_config *mc, const pg_backend_caps *caps,
                         sched_config *sc, pg_kv_layout *lay) {
    pg_kv_layout_make(mc, !cfg->disable_kv_layer_groups && caps->attn_window, lay);
    sc->kv_groups = lay->n_groups;
    memcpy(sc->kv_group_window, lay->window, sizeof sc->kv_group_window);
}

const char *pg_engine_config_device(const pg_engine_config *cfg) {
    return cfg->device ? cfg->device : "auto";
}

int32_t pg_engine_lora_slots(const pg_engine_config *cfg) {
    if (!cfg->enable_lora) return 0;
    const int32_t n = cfg->max_loras > 0 ? cfg->max_loras : cfg->n_lora;
    return n > 0 ? n : 1;
}

int32_t pg_engine_lora_known_cap(const pg_engine_config *cfg) {
    if (!cfg->enable_lora) return 0;
    if (cfg->max_cpu_loras > 0) return cfg->max_cpu_loras;
    const int32_t slots = pg_engine_lora_slots(cfg);
    return cfg->n_lora > slots ? cfg->n_lora : slots;
}

int32_t pg_engine_max_lora_rank(const pg_engine_config *cfg) {
    return cfg->max_lora_rank > 0 ? cfg->max_lora_rank : PG_DEFAULT_MAX_LORA_RANK;
}
