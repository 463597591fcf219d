// engine/model/lora_adapter.h - a LoRA adapter, PEFT's directory
// (adapter_config.json + adapter_model.safetensors) or llama.cpp's GGUF file
// (convert_lora_to_gguf.py's: general.type "adapter", adapter.type "lora",
// adapter.lora.alpha, tensors blk.L.<tensor>.weight.lora_a / lora_b), read
// and checked against the base model's shapes, for the batched LoRA op
// (kernels/backend.h lora_apply). What is accepted and refused: docs/lora.md.
//
// The A and B matrices are pg_weight views into the mapped safetensors
// file, in its stored type (f32, f16 or bf16): a backend's weight_upload
// takes them as any other checkpoint weight. Every failure is one line,
// "PATH: reason", naming the file at fault (pg_err_msg).
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/model/model_config.h"
#include "kernels/kernels.h" // pg_weight

struct pg_st_file;

// The projections of a Llama-family layer an adapter may target, in the
// order of their PEFT names (pg_lora_module_name).
typedef enum {
    PG_LORA_Q = 0,
    PG_LORA_K,
    PG_LORA_V,
    PG_LORA_O,
    PG_LORA_GATE,
    PG_LORA_UP,
    PG_LORA_DOWN,
    PG_LORA_N_MODULES
} pg_lora_module;

// "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj".
const char *pg_lora_module_name(int module);

// One layer's pairs: a[m] [rank][in] (lora_A) and b[m] [out][rank]
// (lora_B) of module m, both NULL where the adapter leaves it alone.
typedef struct pg_lora_layer {
    const pg_weight *a[PG_LORA_N_MODULES];
    const pg_weight *b[PG_LORA_N_MODULES];
} pg_lora_layer;

typedef struct pg_lora_adapter {
    char *dir;            // as given
    char *base_model;     // base_model_name_or_path ("" when absent or null)
    int32_t rank;         // r: every pair's rank
    float alpha;          // lora_alpha
    bool rslora;          // use_rslora: scale = alpha / sqrt(r), else alpha / r
    float scale;          // what the product is multiplied by
    uint32_t module_mask; // bit m: target_modules names module m
    int32_t n_layers;     // the base model's
    int32_t n_pairs;      // (layer, module) pairs the file holds
    pg_lora_layer *layers; // [n_layers]
    struct pg_st_file *st; // the mapped adapter_model.safetensors (a PEFT directory)
    struct gguf_file *gg;  // or the mapped GGUF file (llama.cpp's LoRA format)
    void **owned;          // copies made at load (GGUF: q/k lora_b rows put back in order)
    int32_t n_owned;
    pg_weight *views;     // [n_layers][PG_LORA_N_MODULES][2] the pairs' storage
} pg_lora_adapter;

// Reads the adapter in `dir` (a directory, or a .gguf file) and checks it
// against the base model `cfg`:
// every pair's shapes against the projections', layer indices below
// cfg->n_layers, r <= max_rank. On failure returns a negative PG_E* code
// with a one-line "FILE: reason" and leaves *out NULL.
int pg_lora_adapter_load(const char *dir, const pg_model_config *cfg, int32_t max_rank, pg_lora_adapter **out);

// Unmaps and frees everything. NULL ok.
void pg_lora_adapter_free(pg_lora_adapter *a);

struct pg_model_shard;
// The bytes of `ad`'s pairs a tensor-parallel rank of shard `sh` holds
// (engine/model/lora.c's slicing), for `paged plan`.
int64_t pg_lora_rank_bytes(const pg_lora_adapter *ad, const pg_model_config *c, const struct pg_model_shard *sh);
