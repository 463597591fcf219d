// scheduler/sched_update.c - a step's results: sched_advance takes the
// plan in flight as run (computed positions, placeholders for the sampled
// tokens, requests ended meanwhile unlinked), sched_resolve fills in the
// tokens, applies the stop rules and emits the events, sched_update does
// both, sched_can_run_ahead says whether the next plan may come first.
// Calls sched_req.c and sched_spec.c.
#include "scheduler/sched_int.h"

#include <string.h>

#include "common/err.h"

// ---------------------------------------------------------------------------
// Update

// Whether `out` answers the advanced step: one output per sampled
// sequence, in plan order.
static int check_output(const sched *s, const pg_step_output *out) {
    if (out->n != s->n_ures_seq)
        return pg_err_set(PG_EINVAL, "sched_resolve: %d outputs for %d sampled sequences", out->n,
                          s->n_ures_seq);
    for (int32_t k = 0; k < out->n; k++)
        if (out->outs[k].seq_id != s->ures_seq[k])
            return pg_err_set(PG_EINVAL, "sched_resolve: output %d does not answer seq %lld", k,
                              (long long)s->ures_seq[k]);
    return 0;
}

static bool has_penalties(const pg_sampling_params *sp) {
    return (sp->repetition_penalty != 1.0f && sp->repetition_penalty > 0) ||
           sp->presence_penalty != 0.0f || sp->frequency_penalty != 0.0f;
}

// A live request by id and one of its sequences by seq_id, or NULL (the
// request finished and was freed since the id was recorded).
static req *req_by_id(const sched *s, int64_t id) { return sched_idmap_get(&s->ids, id); }

int sched_advance(sched *s) {
    if (!s->in_flight) return pg_err_set(PG_EINVAL, "sched_advance: no plan in flight");
    if (s->advanced) return pg_err_set(PG_EINVAL, "sched_advance: the previous step is not resolved");
    s->now = sched_clock(s);
    s->n_ures_seq = s->n_ures_req = 0;
    for (int32_t i = 0; i < s->plan.n_seqs; i++) {
        seq *q = s->pref[i];
        req *r = q->rq;
        int32_t n_sched = q->n_sched;
        q->n_sched = 0;
        // Every sampled entry has an output to match (sched_resolve drops
        // those of sequences that are no longer waiting for one).
        if (s->pseqs[i].sample) s->ures_seq[s->n_ures_seq++] = q->seq_id;
        // Ended since the plan was made (sched_resolve of the step before):
        // its blocks are gone and its output will be dropped.
        if (r->abort_pending || q->finish != SCHED_FINISH_NONE) continue;
        // A draft's slots stay unaccounted until its verification is known:
        // only the last token's position is surely computed.
        q->spec_held = q->n_draft;
        q->n_computed += n_sched - q->n_draft;
        q->n_draft = 0;
        if (!s->pseqs[i].sample || q->pending != SCHED_FINISH_NONE) continue;
        // The token is not known yet: its place in the history holds
        // PG_TOKEN_PENDING, which the next plan may feed to the runner (it
        // takes the value from this step's output). Only the length limits
        // can be checked now.
        sched_append_token(r, q, PG_TOKEN_PENDING);
        q->unres = true;
        q->stopping = q->n_hist - r->n_prompt >= r->sp.max_tokens || q->n_hist >= s->cfg.max_model_len;
    }

    s->n_dead = 0;
    for (int32_t j = 0; j < s->n_preq; j++) {
        req *r = s->preq[j];
        r->in_flight = false;
        for (int32_t i = 0; i < r->n; i++) {
            seq *q = &r->seqs[i];
            if (q->finish != SCHED_FINISH_NONE) continue;
            if (r->abort_pending)
                sched_seq_end(s, r, q, SCHED_FINISH_ABORT, -1);
            else if (q->pending != SCHED_FINISH_NONE)
                sched_seq_end(s, r, q, q->pending, -1);
        }
        if (r->n_live > 0) {
            s->ures_req[s->n_ures_req++] = r->id; // its events come with sched_resolve
            continue;
        }
        sched_emit_events(s, &s->pending, r);
        sched_req_unlink(s, r, false);
        s->dead = grow_array(s->dead, &s->dead_cap, s->n_dead + 1, sizeof(req *));
        s->dead[s->n_dead++] = r;
    }
    if (s->n_dead) {
        int32_t w = 0;
        for (int32_t i = 0; i < s->n_run; i++) {
            req *r = s->run[i];
            if (r->state != RQ_RUNNING) continue;
            r->qpos = w;
            s->run[w++] = r;
        }
        s->n_run = w;
        for (int32_t i = 0; i < s->n_dead; i++) sched_req_free(s, s->dead[i]);
        s->n_dead = 0;
    }
    s->in_flight = false;
    s->advanced = true;
    s->plan.n_seqs = 0;
    return 0;
}

bool sched_can_run_ahead(const sched *s) {
    for (int32_t k = 0; k < s->n_ures_seq; k++) {
        const req *r = req_by_id(s, s->ures_seq[k] / SCHED_MAX_N);
        if (r && (has_penalties(&r->sp) || r->sp.constrained || spec_wants_token(s, r))) return false;
    }
    return true;
}

int sched_resolve(sched *s, const pg_step_output *out, sched_events *evs) {
    evs->n = 0;
    evs->ev = NULL;
    if (!s->advanced) return pg_err_set(PG_EINVAL, "sched_resolve: no step advanced");
    s->now = sched_clock(s);
    s->ev.n = 0;
    s->ev.v = grow_array(s->ev.v, &s->ev.cap, s->pending.n, sizeof(sched_event));
    if (s->pending.n) memcpy(s->ev.v, s->pending.v, sizeof(sched_event) * (size_t)s->pending.n);
    s->ev.n = s->pending.n;
    s->pending.n = 0;

    int rc = out ? check_output(s, out) : 0;
    bool failed = !out || rc < 0;
    // The forward that wrote the step's positions is over: offer their full
    // blocks to the prefix cache (before a stop below releases them).
    for (int32_t j = 0; j < s->n_ures_req && !failed; j++) {
        req *r = req_by_id(s, s->ures_req[j]);
        for (int32_t i = 0; r && i < r->n; i++) {
            seq *q = &r->seqs[i];
            if (q->finish == SCHED_FINISH_NONE && !q->table.swapped)
                kvp_table_commit(s->pool, &q->table, q->hist, q->n_computed);
        }
    }
    for (int32_t k = 0; k < s->n_ures_seq; k++) {
        req *r = req_by_id(s, s->ures_seq[k] / SCHED_MAX_N);
        if (!r) continue;
        seq *q = &r->seqs[s->ures_seq[k] % SCHED_MAX_N];
        if (!q->unres) continue; // its output is dropped
        q->unres = q->stopping = false;
        // Ended meanwhile (abort, stop string, the failure below): the
        // placeholder is the last token, drop it.
        if (q->finish != SCHED_FINISH_NONE || r->abort_pending || failed) {
            q->n_hist--;
            if (q->spec_held && q->finish == SCHED_FINISH_NONE)
                kvp_table_truncate(s->pool, &q->table, q->n_computed);
            q->spec_held = 0;
            continue;
        }
        const pg_seq_output *o = &out->outs[k];
        if (q->spec_held) {
            spec_resolve(s, r, q, o);
            continue;
        }
        q->hist[q->n_hist - 1] = o->token;
        q->ev_out = o;
        if (!r->usage.first_token_ns) r->usage.first_token_ns = s->now;
        int32_t stop_token;
        sched_finish_reason fin = sched_check_stop(s, r, q, o->token, &stop_token);
        // A request already in the next plan keeps its slot there (that
        // entry is skipped by the next sched_advance, which unlinks it).
        if (fin != SCHED_FINISH_NONE) sched_seq_end(s, r, q, fin, stop_token);
    }
    for (int32_t j = 0; j < s->n_ures_req; j++) {
        req *r = req_by_id(s, s->ures_req[j]);
        if (!r) continue;
        for (int32_t i = 0; i < r->n; i++) {
            seq *q = &r->seqs[i];
            if (q->finish != SCHED_FINISH_NONE) continue;
            if (failed) sched_seq_end(s, r, q, SCHED_FINISH_ERROR, -1);
        }
        sched_emit_events(s, &s->ev, r);
        if (r->n_live == 0 && !r->in_flight) {
            sched_req_unlink(s, r, true);
            sched_req_free(s, r);
        }
    }
    s->advanced = false;
    // No plan in flight: every move was performed, the holds can go (so
    // that the counts settle when the engine goes idle).
    if (!s->in_flight) kvp_release_holds(s->pool);
    evs->n = s->ev.n;
    evs->ev = s->ev.v;
    return rc;
}

int sched_update(sched *s, const pg_step_output *out, sched_events *evs) {
    evs->n = 0;
    evs->ev = NULL;
    PG_TRY(sched_advance(s));
    return sched_resolve(s, out, evs);
}
