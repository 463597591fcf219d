// kvpool/kvpool_plan.c - what a pool of a config holds, before one exists
// (admission limits, the engine's sizing and `paged plan`).
#include "kvpool/kvpool.h"

int64_t kvp_config_group_blocks_for(const kvp_config *c, int32_t g, int64_t n_tokens, int32_t chunk) {
    if (n_tokens <= 0) return 0;
    const int64_t bs = c->block_size, full = (n_tokens + bs - 1) / bs;
    const int64_t piece = chunk > 0 ? chunk : n_tokens;
    // A windowed group holds, while a piece is computed, the blocks of
    // the window before the piece and of the piece (slid before each
    // step): w - 1 + piece positions, one block more where misaligned.
    const int64_t w = c->group_window[g], held = w > 0 ? (w - 1 + piece + bs - 1) / bs + 1 : full;
    return held < full ? held : full;
}

int64_t kvp_config_blocks_for(const kvp_config *c, int64_t n_tokens, int32_t chunk) {
    const int32_t groups = c->n_groups > 1 ? c->n_groups : 1;
    int64_t sum = 0;
    for (int32_t g = 0; g < groups; g++) sum += kvp_config_group_blocks_for(c, g, n_tokens, chunk);
    return sum;
}

