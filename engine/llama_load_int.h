// engine/llama_load_int.h - helpers shared by the model loaders (internal).
#pragma once
#include "engine/llama.h"

// Records `p` as owned by the model (freed by pg_llama_free) and returns it.
void *pg_llama_own(pg_llama *m, void *p);

// A linear layer made of `n` stored matrices concatenated on the output dimension.
void pg_linear_init(pg_linear *lin, int n, const pg_weight *parts);
