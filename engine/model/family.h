// engine/model/family.h - model families: one builder file each over the
// shared layer helpers (engine/model/layers.h).
//
// A family is what a config's architecture names: its forward through the
// layers. The Llama family (engine/model/llama.c) serves Llama 2/3/3.1,
// Mistral, Qwen2 and Qwen3, whose differences are config flags (QKV bias,
// q/k norms, RoPE scaling), not code. A new family (Gemma, a mixture of
// experts) is one new file with its own forward and an entry in
// engine/model/family.c, not flags in the Llama loop.
#pragma once

#include "engine/model/model.h"

typedef struct pg_model_family {
    const char *name;
    // The embedding and every layer for the step's rows: the contract of
    // pg_model_forward_layers (engine/model/model.h).
    int (*forward_layers)(const pg_model *m, pg_bkv *kv, const pg_fwd_buffers *bufs, const pg_fwd_step *s);
} pg_model_family;

extern const pg_model_family pg_llama_family;
extern const pg_model_family pg_moe_family; // Mixtral, Qwen3-MoE (engine/model/moe.c)
extern const pg_model_family pg_gemma_family; // Gemma 3 (engine/model/gemma.c)

// The family of a config's architecture (cfg->arch; any config with
// experts, such as a GGUF Mixtral, which calls itself "llama": the MoE
// family), or NULL with PG_EUNSUPP
// set, naming it.
const pg_model_family *pg_model_family_of(const pg_model_config *cfg);
