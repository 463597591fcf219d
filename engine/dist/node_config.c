// engine/dist/node_config.c - the comparison of two nodes' configurations
// (engine/dist/node_config.h), field by field, in the struct's order.
#include "engine/dist/node_config.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

typedef enum { F_NAME, F_INT, F_ONOFF } field_kind;

typedef struct {
    const char *label; // as the flag reads, or what of the model
    size_t off;
    field_kind kind;
} field;

#define NAME(l, m) {l, offsetof(pg_node_config, m), F_NAME}
#define INT(l, m) {l, offsetof(pg_node_config, m), F_INT}
#define ONOFF(l, m) {l, offsetof(pg_node_config, m), F_ONOFF}

static const field fields[] = {
    NAME("the model's architecture", arch),
    NAME("--load-format", load_format),
    INT("the model's layers", n_layers),
    INT("the model's hidden size", hidden),
    INT("the model's vocabulary", vocab_size),
    INT("the model's attention heads", n_heads),
    INT("the model's KV heads", n_kv_heads),
    INT("the model's head dim", head_dim),
    INT("the model's FFN size", ffn),
    INT("the model's experts", n_experts),
    INT("the model's experts per token", n_experts_used),
    NAME("the model's weight type", weight_dtype),
    NAME("--device", device),
    NAME("--matmul-mode", matmul_mode),
    NAME("--quantization", quantization),
    ONOFF("--enable-expert-parallel", expert_parallel),
    NAME("--all2all-backend", all2all_backend),
    NAME("--kv-cache-dtype", kv_cache_dtype),
    NAME("--kv-cache-scales", kv_cache_scales),
    INT("LoRA slots (--enable-lora, --max-loras)", lora_slots),
    INT("--max-lora-rank", max_lora_rank),
    INT("--max-model-len", max_model_len),
    INT("--block-size", block_size),
    INT("--max-num-seqs", max_num_seqs),
    INT("--max-num-batched-tokens", max_num_batched_tokens),
    ONOFF("chunked prefill (--no-chunked-prefill)", chunked_prefill),
    ONOFF("prefix caching (--no-prefix-caching)", prefix_caching),
    ONOFF("KV layer groups (--disable-hybrid-kv-cache-manager)", kv_layer_groups),
    NAME("--speculative-config", speculative),
};

// A field's value as text ("" names show as "none").
static void value(const pg_node_config *c, const field *f, char *out, size_t cap) {
    const char *p = (const char *)c + f->off;
    if (f->kind == F_NAME) {
        snprintf(out, cap, "%.*s", PG_NODE_NAME - 1, p[0] ? p : "none");
        return;
    }
    int32_t v;
    memcpy(&v, p, sizeof v);
    if (f->kind == F_ONOFF)
        snprintf(out, cap, "%s", v ? "on" : "off");
    else
        snprintf(out, cap, "%d", v);
}

int pg_node_config_diff(const pg_node_config *theirs, const pg_node_config *ours, int32_t node_rank, char *msg,
                        size_t cap) {
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        const field *f = &fields[i];
        const char *a = (const char *)theirs + f->off, *b = (const char *)ours + f->off;
        const bool same = f->kind == F_NAME ? strncmp(a, b, PG_NODE_NAME) == 0 : memcmp(a, b, sizeof(int32_t)) == 0;
        if (same) continue;
        char va[PG_NODE_NAME + 16], vb[PG_NODE_NAME + 16];
        value(theirs, f, va, sizeof va);
        value(ours, f, vb, sizeof vb);
        snprintf(msg, cap, "node %d: %s %s here, %s on node 0", node_rank, f->label, va, vb);
        return 1;
    }
    return 0;
}

void pg_node_config_name(char dst[PG_NODE_NAME], const char *src) {
    snprintf(dst, PG_NODE_NAME, "%s", src ? src : "");
}
