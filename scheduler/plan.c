// scheduler/plan.c - defaults and checks for the plan contract types.
#include "scheduler/plan.h"

#include <string.h>

#include "common/err.h"

void pg_sampling_params_default(pg_sampling_params *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->top_k = 0;
    p->min_p = 0.0f;
    p->repetition_penalty = 1.0f;
    p->n = 1;
    p->max_tokens = 16;
    p->logprobs = -1;
}

int pg_block_moves_check(const pg_block_move *mv, int32_t n, int32_t n_from, int32_t n_to,
                         const char *what) {
    for (int32_t i = 0; i < n; i++)
        if (mv[i].from < 0 || mv[i].from >= n_from || mv[i].to < 0 || mv[i].to >= n_to)
            return pg_err_set(PG_EINVAL, "plan: %s move %d -> %d out of range", what, mv[i].from,
                              mv[i].to);
    return 0;
}
