// engine/model/family.c - which family builds which architecture
// (engine/model/family.h).
#include "engine/model/family.h"

#include <string.h>

#include "common/err.h"

static const struct {
    const char *arch;
    const pg_model_family *family;
} FAMILIES[] = {
    {"llama", &pg_llama_family},
    {"mistral", &pg_llama_family},
    {"qwen2", &pg_llama_family},
    {"qwen3", &pg_llama_family},
    {"mixtral", &pg_moe_family},
    {"qwen3moe", &pg_moe_family},
    {"gemma2", &pg_gemma_family},
    {"gemma3", &pg_gemma_family},
};

const pg_model_family *pg_model_family_of(const pg_model_config *cfg) {
    if (cfg->n_experts > 0) return &pg_moe_family;
    for (size_t i = 0; i < sizeof FAMILIES / sizeof FAMILIES[0]; i++)
        if (!strcmp(cfg->arch, FAMILIES[i].arch)) return FAMILIES[i].family;
    pg_err_set(PG_EUNSUPP, "architecture '%s' has no model family here (llama, mistral, qwen2, qwen3, mixtral, qwen3moe, gemma2, gemma3)", cfg->arch);
    return NULL;
}
