// engine/dist/node_config.h - what every node of a multi-node tensor-parallel
// group must agree on (engine/dist/remote.h): the model's identity and the
// engine options that change its shape, numerics or sharding, or node 0's
// step plans. Each node fills one from its own flags and model headers
// (engine/setup.c) and sends it in its hello; node 0 compares it with its
// own, field by field, and refuses a follower whose configuration differs
// with one line naming the field and both values.
//
// Every field is a fixed-size name or number: the struct crosses the wire
// as it is (every node runs the same build, which the hello checks).
#pragma once
#include <stddef.h>
#include <stdint.h>

#define PG_NODE_NAME 32

typedef struct pg_node_config {
    // The model (its headers: config.json, the GGUF header, the safetensors
    // tables), as the loader reads it.
    char arch[PG_NODE_NAME];         // "llama", "mixtral", ...
    char weight_dtype[PG_NODE_NAME]; // layer 0's Q projection as stored ("random" for dummy weights)
    char load_format[PG_NODE_NAME];  // --load-format: "auto" or "dummy"
    int32_t n_layers, hidden, vocab_size, n_heads, n_kv_heads, head_dim, ffn;
    int32_t n_experts, n_experts_used;
    // Numerics and sharding.
    char device[PG_NODE_NAME];          // "cpu" or "cuda" (--device, resolved)
    char matmul_mode[PG_NODE_NAME];     // --matmul-mode (the CPU's; "" on a GPU)
    char quantization[PG_NODE_NAME];    // --quantization
    int32_t expert_parallel;            // --enable-expert-parallel, on a model with experts
    char all2all_backend[PG_NODE_NAME]; // --all2all-backend
    char kv_cache_dtype[PG_NODE_NAME];  // --kv-cache-dtype, resolved
    char kv_cache_scales[PG_NODE_NAME]; // --kv-cache-scales ("" unless the KV cache is fp8)
    int32_t lora_slots, max_lora_rank;  // --enable-lora / --max-loras, --max-lora-rank
    // Node 0's plans: the limits each node's runners are sized for.
    int32_t max_model_len;           // --max-model-len, or the model's
    int32_t block_size, max_num_seqs, max_num_batched_tokens;
    int32_t chunked_prefill, prefix_caching, kv_layer_groups;
    char speculative[PG_NODE_NAME];  // --speculative-config: "none", "ngram k=5", "draft_model k=4"
} pg_node_config;

// Compares a follower's configuration `theirs` (node `node_rank`) with node
// 0's `ours`: 0 when they agree, else 1 with the first differing field in
// msg, "node 1: --all2all-backend alltoall here, allreduce on node 0".
int pg_node_config_diff(const pg_node_config *theirs, const pg_node_config *ours, int32_t node_rank, char *msg,
                        size_t cap);
// Sets a name field (truncated to PG_NODE_NAME - 1 bytes).
void pg_node_config_name(char dst[PG_NODE_NAME], const char *src);
