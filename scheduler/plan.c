// scheduler/plan.c - defaults for the plan contract types.
#include "scheduler/plan.h"

#include <string.h>

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
