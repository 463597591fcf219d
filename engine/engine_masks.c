// engine/engine_masks.c - per-request token controls on the engine thread:
// logit_bias copies, structured-output matchers (text/grammar/structured.h) and
// allowed_token_ids masks.
//
// Each step, before the runner begins it, every constrained sequence that
// samples gets its mask: its matcher's allowed tokens (a copy of a cached
// per-state mask), ANDed with the request's allowed-token mask. After the
// step resolves, each matcher advances by its sequence's token; a grammar
// that is complete finishes its sequence. Constrained requests never run
// ahead under async scheduling (sched_can_run_ahead), so the token a mask
// depends on is always resolved before the mask is made.
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/engine_int.h"
#include "text/grammar/structured.h"

req_masks *eng_masks_from_request(const pg_engine *e, pg_gen_request *req) {
    pg_sampling_params *sp = &req->sp;
    if (!req->grammar && req->n_allowed <= 0 && sp->n_logit_bias <= 0 && req->n_bad <= 0) {
        sp->constrained = false;
        return NULL;
    }
    req_masks *x = pg_xcalloc(1, sizeof *x);
    if (sp->n_logit_bias > 0) {
        x->bias_ids = pg_xmalloc(sizeof(int32_t) * (size_t)sp->n_logit_bias);
        x->bias_values = pg_xmalloc(sizeof(float) * (size_t)sp->n_logit_bias);
        memcpy(x->bias_ids, sp->bias_ids, sizeof(int32_t) * (size_t)sp->n_logit_bias);
        memcpy(x->bias_values, sp->bias_values, sizeof(float) * (size_t)sp->n_logit_bias);
        sp->bias_ids = x->bias_ids;
        sp->bias_values = x->bias_values;
    }
    int32_t vocab = e->model->cfg.vocab_size, words = (vocab + 31) / 32;
    if (req->n_allowed > 0) {
        x->allowed = pg_xcalloc((size_t)words, sizeof(uint32_t));
        for (int32_t i = 0; i < req->n_allowed; i++) {
            int32_t t = req->allowed_ids[i];
            if (t >= 0 && t < vocab) x->allowed[t >> 5] |= 1u << (t & 31);
        }
    }
    req->allowed_ids = NULL;
    req->n_allowed = 0;
    if (req->n_bad > 0) {
        int32_t total = req->bad_off[req->n_bad];
        x->n_bad = req->n_bad;
        x->bad_off = pg_xmalloc(sizeof(int32_t) * (size_t)(req->n_bad + 1));
        x->bad_ids = pg_xmalloc(sizeof(int32_t) * (size_t)(total > 0 ? total : 1));
        memcpy(x->bad_off, req->bad_off, sizeof(int32_t) * (size_t)(req->n_bad + 1));
        if (total > 0) memcpy(x->bad_ids, req->bad_ids, sizeof(int32_t) * (size_t)total);
    }
    req->bad_off = req->bad_ids = NULL;
    req->n_bad = 0;
    if (req->grammar) {
        x->grammar = pg_grammar_ref(req->grammar);
        x->n = sp->n > 0 ? sp->n : 1;
        x->m = pg_xcalloc((size_t)x->n, sizeof(pg_matcher *));
    }
    req->grammar = NULL;
    sp->constrained = x->grammar || x->allowed || x->n_bad > 0;
    return x;
}

void eng_masks_free(req_masks *x) {
    if (!x) return;
    for (int32_t i = 0; i < x->n; i++) pg_matcher_free(x->m[i]);
    free(x->m);
    pg_grammar_unref(x->grammar);
    free(x->bias_ids);
    free(x->bias_values);
    free(x->allowed);
    free(x->bad_off);
    free(x->bad_ids);
    free(x);
}

live *eng_live_find(pg_engine *e, int64_t id) { return sched_request_owner(e->sched, id); }

static pg_matcher *matcher_of(req_masks *x, int32_t idx) {
    if (!x->grammar || idx < 0 || idx >= x->n) return NULL;
    if (!x->m[idx]) x->m[idx] = pg_matcher_create(x->grammar);
    return x->m[idx];
}

// bad_words: the last token of a sequence is banned where the output ends
// with the rest of it (vLLM's rule; the prompt does not count). The output
// is out[0 .. n_out).
static void ban_bad_words(const req_masks *x, const int32_t *out, int32_t n_out, uint32_t *w, int32_t words) {
    for (int32_t k = 0; k < x->n_bad; k++) {
        const int32_t *b = x->bad_ids + x->bad_off[k];
        int32_t len = x->bad_off[k + 1] - x->bad_off[k];
        if (len <= 0 || len - 1 > n_out) continue;
        if (len > 1 && memcmp(out + n_out - (len - 1), b, sizeof(int32_t) * (size_t)(len - 1))) continue;
        int32_t t = b[len - 1];
        if (t >= 0 && (t >> 5) < words) w[t >> 5] &= ~(1u << (t & 31));
    }
}

// One row's mask into w: the matcher's allowed tokens (or all), ANDed with
// the allowed set, bad words banned after the output out[0 .. n_out).
static void row_mask(const req_masks *x, pg_matcher *m, const int32_t *out, int32_t n_out, uint32_t *w,
                     int32_t words) {
    if (m) {
        memset(w, 0, sizeof(uint32_t) * (size_t)words);
        pg_matcher_fill_mask(m, w); // the tokenizer's words; the rest stay 0
    } else {
        memset(w, 0xff, sizeof(uint32_t) * (size_t)words);
    }
    if (x->allowed) {
        uint32_t acc = 0;
        for (int32_t k = 0; k < words; k++) acc |= w[k] & x->allowed[k];
        // A grammar and an allowed set with nothing in common: the
        // grammar wins, rather than a row with nothing to sample.
        if (acc)
            for (int32_t k = 0; k < words; k++) w[k] &= x->allowed[k];
    }
    ban_bad_words(x, out, n_out, w, words);
}

// A draft's rows (speculative decoding): row t's mask is the one plain
// decoding would use after the first t drafts, so the matcher is advanced
// through them (and brought back: the tokens the step keeps advance it
// for real, eng_masks_advance), and bad words see them as output. A draft
// the grammar refuses, or one after the end, leaves the rows after it the
// last mask: its row's token differs from it, so nothing past is kept.
static void draft_masks(pg_engine *e, const req_masks *x, pg_matcher *m, const pg_plan_seq *s, uint32_t *w,
                        int32_t words) {
    const int32_t k = s->n_draft, n_out = s->n_history - s->n_prompt;
    const int32_t *drafts = s->tokens + s->n_tokens - k;
    if (e->cap_mask_hist < n_out + k) {
        e->cap_mask_hist = n_out + k;
        e->mask_hist = pg_xrealloc(e->mask_hist, sizeof(int32_t) * (size_t)e->cap_mask_hist);
    }
    memcpy(e->mask_hist, s->history + s->n_prompt, sizeof(int32_t) * (size_t)n_out);
    memcpy(e->mask_hist + n_out, drafts, sizeof(int32_t) * (size_t)k);
    pg_matcher_pos at;
    if (m) pg_matcher_save(m, &at);
    row_mask(x, m, e->mask_hist, n_out, w, words);
    bool ok = true;
    for (int32_t t = 1; t <= k; t++) {
        uint32_t *row = w + (size_t)t * (size_t)words;
        ok = ok && (!m || (!pg_matcher_is_terminated(m) && pg_matcher_advance(m, drafts[t - 1]) == 0));
        if (ok)
            row_mask(x, m, e->mask_hist, n_out + t, row, words);
        else
            memcpy(row, row - words, sizeof(uint32_t) * (size_t)words);
    }
    if (m) pg_matcher_restore(m, &at);
}

void eng_masks_fill(pg_engine *e, const pg_batch_plan *plan) {
    int32_t words = (e->model->cfg.vocab_size + 31) / 32;
    // A row per sampled position: one per entry, n_draft + 1 for a draft.
    int32_t rows = 0;
    for (int32_t i = 0; i < plan->n_seqs; i++) rows += plan->seqs[i].sample ? plan->seqs[i].n_draft + 1 : 0;
    if (rows > e->cap_masks || plan->n_seqs > e->cap_masks) {
        e->cap_masks = 2 * (rows > plan->n_seqs ? rows : plan->n_seqs);
        e->mask_buf = pg_xrealloc(e->mask_buf, sizeof(uint32_t) * (size_t)e->cap_masks * (size_t)words);
        e->mask_ptr = pg_xrealloc(e->mask_ptr, sizeof(uint32_t *) * (size_t)e->cap_masks);
    }
    e->mask_words = words;
    bool any = false;
    int32_t row = 0;
    for (int32_t i = 0; i < plan->n_seqs; i++) {
        const pg_plan_seq *s = &plan->seqs[i];
        e->mask_ptr[i] = NULL;
        if (!s->sample) continue;
        uint32_t *w = e->mask_buf + (size_t)row * (size_t)words;
        row += s->n_draft + 1;
        if (!s->sp->constrained) continue;
        live *l = eng_live_find(e, s->seq_id / SCHED_MAX_N);
        if (!l || !l->x) continue;
        req_masks *x = l->x;
        pg_matcher *m = matcher_of(x, (int32_t)(s->seq_id % SCHED_MAX_N));
        if (s->n_draft > 0)
            draft_masks(e, x, m, s, w, words);
        else
            row_mask(x, m, s->history + s->n_prompt, s->n_history - s->n_prompt, w, words);
        e->mask_ptr[i] = w;
        any = true;
    }
    // The plan carries them to every rank and node (pg_plan_seq.mask).
    if (any && sched_set_masks(e->sched, e->mask_ptr, words) < 0)
        PG_LOGE("token masks: %s", pg_err_msg()); // a broken step order: the sequences run unmasked
}

void eng_masks_advance(pg_engine *e, const sched_events *evs) {
    for (int32_t k = 0; k < evs->n; k++) {
        const sched_event *ev = &evs->ev[k];
        // Every token the scheduler took (an output it dropped belongs to a
        // sequence that has ended: its matcher has no further use).
        if (!ev->has_token) continue;
        const pg_seq_output *o = &ev->out;
        int64_t req_id = ev->req_id;
        int32_t idx = ev->seq_index;
        live *l = ev->owner;
        if (!l || !l->x || !l->x->grammar) continue;
        pg_matcher *m = matcher_of(l->x, idx);
        if (pg_matcher_is_terminated(m)) continue;
        if (pg_matcher_advance(m, o->token) < 0) {
            // Only a sampler that ignored the mask gets here.
            PG_LOGE("structured output: request %lld: %s", (long long)req_id, pg_err_msg());
            sched_finish_seq(e->sched, req_id, idx, SCHED_FINISH_ERROR);
            continue;
        }
        // A complete output stops here; EOS itself is the scheduler's stop.
        if (pg_matcher_is_terminated(m) && o->token != pg_tokenizer_eos(e->tok))
            sched_finish_seq(e->sched, req_id, idx, SCHED_FINISH_STOP);  // fails if already finished
    }
}
