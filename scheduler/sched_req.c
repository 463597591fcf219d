// scheduler/sched_req.c - the scheduler's requests: the containers that
// hold them (waiting and swapped heaps, the running array, the id map; see
// sched.c for their rules) and their end: a sequence's end, a request's
// unlink and free, its events, the stop rules and the history a sampled
// token joins. Used by sched.c (planning, the public API), sched_update.c
// (a step's results) and sched_spec.c; it calls none of them.
#include "scheduler/sched_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

// ---------------------------------------------------------------------------
// Heaps (indexed: req->qpos is the position, for O(log n) removal)

static void heap_set(rheap *h, int32_t i, req *r) {
    h->v[i] = r;
    r->qpos = i;
}

static void heap_up(rheap *h, int32_t i) {
    req *r = h->v[i];
    while (i > 0) {
        int32_t parent = (i - 1) / 2;
        if (!req_before(r, h->v[parent])) break;
        heap_set(h, i, h->v[parent]);
        i = parent;
    }
    heap_set(h, i, r);
}

static void heap_down(rheap *h, int32_t i) {
    req *r = h->v[i];
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && req_before(h->v[c + 1], h->v[c])) c++;
        if (!req_before(h->v[c], r)) break;
        heap_set(h, i, h->v[c]);
        i = c;
    }
    heap_set(h, i, r);
}

void sched_heap_push(rheap *h, req *r) {
    h->v = grow_array(h->v, &h->cap, h->n + 1, sizeof(req *));
    h->v[h->n] = r;
    heap_up(h, h->n++);
}

void sched_heap_remove(rheap *h, req *r) {
    int32_t i = r->qpos;
    PG_CHECK(i >= 0 && i < h->n && h->v[i] == r);
    req *last = h->v[--h->n];
    if (i == h->n) return;
    heap_set(h, i, last);
    heap_down(h, i);
    heap_up(h, last->qpos);
}

// ---------------------------------------------------------------------------
// Running array (sorted by key)

void sched_run_insert(sched *s, req *r) {
    s->run = grow_array(s->run, &s->run_cap, s->n_run + 1, sizeof(req *));
    int32_t lo = 0, hi = s->n_run; // first position whose request is after r
    while (lo < hi) {
        int32_t mid = (lo + hi) / 2;
        if (req_before(s->run[mid], r)) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    memmove(s->run + lo + 1, s->run + lo, sizeof(req *) * (size_t)(s->n_run - lo));
    s->run[lo] = r;
    s->n_run++;
    for (int32_t i = lo; i < s->n_run; i++) s->run[i]->qpos = i;
}

static void run_remove(sched *s, req *r) {
    int32_t i = r->qpos;
    PG_CHECK(i >= 0 && i < s->n_run && s->run[i] == r);
    memmove(s->run + i, s->run + i + 1, sizeof(req *) * (size_t)(s->n_run - i - 1));
    s->n_run--;
    for (int32_t j = i; j < s->n_run; j++) s->run[j]->qpos = j;
}

// ---------------------------------------------------------------------------
// Id map (linear probing, backward-shift deletion)

req *sched_idmap_get(const idmap *m, int64_t id) {
    if (!m->n) return NULL;
    for (uint64_t i = mix64((uint64_t)id) & m->mask;; i = (i + 1) & m->mask) {
        if (!m->vals[i]) return NULL;
        if (m->keys[i] == id) return m->vals[i];
    }
}

static void idmap_put_raw(idmap *m, int64_t id, req *r) {
    uint64_t i = mix64((uint64_t)id) & m->mask;
    while (m->vals[i]) i = (i + 1) & m->mask;
    m->keys[i] = id;
    m->vals[i] = r;
    m->n++;
}

void sched_idmap_put(idmap *m, int64_t id, req *r) {
    if (!m->vals || (uint64_t)(m->n + 1) * 2 > m->mask + 1) {
        uint64_t old_slots = m->vals ? m->mask + 1 : 0, slots = old_slots ? old_slots * 2 : 64;
        int64_t *keys = m->keys;
        req **vals = m->vals;
        m->keys = pg_xcalloc(slots, sizeof(int64_t));
        m->vals = pg_xcalloc(slots, sizeof(req *));
        m->mask = slots - 1;
        m->n = 0;
        for (uint64_t i = 0; i < old_slots; i++)
            if (vals[i]) idmap_put_raw(m, keys[i], vals[i]);
        free(keys);
        free(vals);
    }
    idmap_put_raw(m, id, r);
}

static void idmap_del(idmap *m, int64_t id) {
    uint64_t i = mix64((uint64_t)id) & m->mask;
    while (m->keys[i] != id || !m->vals[i]) {
        PG_CHECK(m->vals[i]);
        i = (i + 1) & m->mask;
    }
    for (uint64_t j = (i + 1) & m->mask; m->vals[j]; j = (j + 1) & m->mask) {
        uint64_t home = mix64((uint64_t)m->keys[j]) & m->mask;
        bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        m->keys[i] = m->keys[j];
        m->vals[i] = m->vals[j];
        i = j;
    }
    m->vals[i] = NULL;
    m->n--;
}

// ---------------------------------------------------------------------------
// Requests and events

void sched_req_free(sched *s, req *r) {
    for (int32_t i = 0; i < r->n; i++) {
        kvp_table_release(s->pool, &r->seqs[i].table);
        kvp_table_fini(&r->seqs[i].table);
        free(r->seqs[i].hist);
        free(r->seqs[i].draft);
    }
    free(r);
}

static void usage_fill(const req *r, sched_usage *u) {
    *u = r->usage;
    u->completion_tokens = 0;
    for (int32_t i = 0; i < r->n; i++)
        u->completion_tokens += r->seqs[i].n_hist - r->seqs[i].unres - r->n_prompt;
}

// Emits, in index order, an event for every sequence of r that got a token
// or ended since the last call; the last one carries req_finished when the
// request is over.
void sched_emit_events(sched *s, evbuf *b, req *r) {
    int32_t first = b->n;
    if (r->n_live == 0 && !r->usage.finish_ns) r->usage.finish_ns = s->now;
    for (int32_t i = 0; i < r->n; i++) {
        seq *q = &r->seqs[i];
        if (!q->ev_end && !q->ev_out) continue;
        // A verified draft emits several tokens: one event each, as if they
        // came one per step (the last one carries the finish).
        int32_t n_tok = q->ev_out && q->ev_ntok > 1 ? q->ev_ntok : 1;
        b->v = grow_array(b->v, &b->cap, b->n + n_tok, sizeof(sched_event));
        for (int32_t j = 0; j < n_tok; j++) {
            sched_event *e = &b->v[b->n++];
            bool last = j == n_tok - 1;
            memset(e, 0, sizeof *e);
            e->req_id = r->id;
            e->owner = r->owner;
            e->seq_index = i;
            if (q->ev_out) {
                e->has_token = true;
                e->out = *q->ev_out;
                e->out.seq_id = q->seq_id;
                e->out.spec_rows = NULL; // the runner's memory: not past this update
                if (n_tok > 1 && q->ev_out->spec_rows) { // its row's logprob and top entries
                    e->out = q->ev_out->spec_rows[j];
                    e->out.seq_id = q->seq_id;
                    e->out.spec_rows = NULL;
                } else if (n_tok > 1) {
                    e->out.token = q->ev_out->spec_tokens[j];
                    e->out.logprob = q->ev_out->spec_logprobs[j];
                }
            }
            e->n_generated = q->n_hist - q->unres - r->n_prompt - (n_tok - 1 - j);
            e->finish = q->ev_end && last ? q->finish : SCHED_FINISH_NONE;
            e->stop_token = q->ev_end && last ? q->stop_token : -1;
        }
        q->ev_end = false;
        q->ev_out = NULL;
        q->ev_ntok = 0;
    }
    if (b->n == first) return;
    sched_usage u;
    usage_fill(r, &u);
    for (int32_t k = first; k < b->n; k++) b->v[k].usage = u;
    b->v[b->n - 1].req_finished = r->n_live == 0;
}

// Ends live sequence q of r: blocks back to the pool now. Before the fork,
// the lead hands the prompt's blocks to the next live sequence.
void sched_seq_end(sched *s, req *r, seq *q, sched_finish_reason reason, int32_t stop_token) {
    PG_CHECK(q->finish == SCHED_FINISH_NONE && reason != SCHED_FINISH_NONE);
    q->finish = reason;
    q->stop_token = stop_token;
    q->pending = SCHED_FINISH_NONE;
    q->ev_end = true;
    r->n_live--;
    if (r->state == RQ_RUNNING) s->running_seqs--;
    if (!r->forked && q->index == r->lead && r->n_live > 0) {
        seq *nl = &r->seqs[first_live(r)];
        kvp_table_move_blocks(s->pool, &nl->table, &q->table, r->n_prompt);
        nl->n_computed = q->n_computed;
        r->lead = nl->index;
    }
    kvp_table_release(s->pool, &q->table);
    q->n_computed = 0;
    q->n_sched = 0; // ended by sched_resolve while in the next plan: that entry is skipped
    if (reason == SCHED_FINISH_ABORT && r->n_live == 0) s->st.n_aborted++;
}

// Takes a request with no live sequence out of its container (running only
// when `unlink_running`; sched_update compacts running itself) and the map.
void sched_req_unlink(sched *s, req *r, bool unlink_running) {
    PG_CHECK(r->n_live == 0);
    if (r->state == RQ_WAITING) sched_heap_remove(&s->waiting, r);
    if (r->state == RQ_SWAPPED) sched_heap_remove(&s->swapped, r);
    if (r->state == RQ_RUNNING && unlink_running) run_remove(s, r);
    r->state = RQ_FINISHED;
    idmap_del(&s->ids, r->id);
    s->st.n_finished++;
}

// Ends sequences of a request that is not in flight (abort / finish_seq):
// events go to the pending list, the request is freed when it is over.
void sched_end_now(sched *s, req *r, int32_t only_index, sched_finish_reason reason) {
    s->now = sched_clock(s);
    for (int32_t i = 0; i < r->n; i++)
        if ((only_index < 0 || i == only_index) && r->seqs[i].finish == SCHED_FINISH_NONE)
            sched_seq_end(s, r, &r->seqs[i], reason, -1);
    sched_emit_events(s, &s->pending, r);
    if (r->n_live == 0) {
        sched_req_unlink(s, r, true);
        sched_req_free(s, r);
    }
}

// Stop rules after a sequence sampled `tok` (vLLM's check_stop order).
sched_finish_reason sched_check_stop(const sched *s, const req *r, const seq *q, int32_t tok,
                                      int32_t *stop_token) {
    int32_t n_out = q->n_hist - r->n_prompt;
    *stop_token = -1;
    if (n_out >= r->sp.min_tokens) {
        if (r->eos_id >= 0 && tok == r->eos_id) {
            *stop_token = tok;
            return SCHED_FINISH_STOP;
        }
        for (int32_t i = 0; i < r->sp.n_stop_ids; i++) {
            if (tok == r->sp.stop_ids[i]) {
                *stop_token = tok;
                return SCHED_FINISH_STOP;
            }
        }
    }
    if (n_out >= r->sp.max_tokens || q->n_hist >= s->cfg.max_model_len) return SCHED_FINISH_LENGTH;
    return SCHED_FINISH_NONE;
}

void sched_append_token(req *r, seq *q, int32_t tok) {
    PG_CHECK(q->n_hist < r->n_prompt + r->sp.max_tokens);
    if (q->n_hist == q->hist_cap) { // no plan the runner still reads points into hist
        int32_t cap = q->hist_cap + (q->hist_cap - r->n_prompt > 16 ? q->hist_cap - r->n_prompt : 16);
        if (cap > r->n_prompt + r->sp.max_tokens) cap = r->n_prompt + r->sp.max_tokens;
        q->hist = pg_xrealloc(q->hist, sizeof(int32_t) * (size_t)cap);
        q->hist_cap = cap;
    }
    q->hist[q->n_hist++] = tok;
}
