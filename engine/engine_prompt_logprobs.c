// engine/engine_prompt_logprobs.c - prompt logprobs on the engine thread:
// per live request, the scored prompt positions arrive step by step
// (chunked prefill: a chunk's rows in its step's pg_step_output.prompt_lp)
// and are kept by position; the request's first event with a token takes
// the array. Every prompt row is computed before the row that samples (the
// last prompt position, or later chunks), so by then every position is in.
// A recompute after a preemption scores positions again: the same values,
// stored over the old ones (or dropped once handed over).
#include <stdlib.h>

#include "common/err.h"
#include "engine/engine_int.h"

void eng_plp_start(live *l, const pg_gen_request *req) {
    if (!req->sp.want_prompt_logprobs || req->n_prompt < 1) return;
    l->n_prompt = req->n_prompt;
    l->plp = pg_xcalloc((size_t)req->n_prompt, sizeof(pg_prompt_logprob));
}

void eng_plp_store(pg_engine *e, const pg_step_output *out) {
    live *l = NULL;
    for (int32_t i = 0; i < out->n_prompt_lp; i++) {
        const pg_prompt_logprob *p = &out->prompt_lp[i];
        const int64_t id = p->seq_id / SCHED_MAX_N;
        if (!l || l->id != id) l = eng_live_find(e, id); // rows come grouped by sequence
        if (!l || !l->plp || p->pos < 1 || p->pos >= l->n_prompt) continue;
        l->plp[p->pos] = *p;
    }
}

void eng_plp_attach(live *l, pg_gen_event *g) {
    if (!g->ev.has_token || !l || !l->plp) return;
    g->prompt_lp = l->plp;
    g->n_prompt_lp = l->n_prompt;
    l->plp = NULL;
}
