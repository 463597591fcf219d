// engine/llama_load_hf.c - Hugging Face directory loader (config.json +
// safetensors). Filled in once the safetensors reader lands.
#include "common/err.h"
#include "engine/llama.h"

int pg_llama_load_hf(const char *dir, pg_llama *m);

int pg_llama_load_hf(const char *dir, pg_llama *m) {
    return pg_err_set(PG_EUNSUPP, "%s: Hugging Face directories are not supported yet", dir);
}
