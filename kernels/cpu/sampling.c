// kernels/cpu/sampling.c - penalties, filters and seeded sampling on the CPU
// (the reference of kernels/cuda/sampling.cu; rules in kernels/sampling.h).
#include "kernels/cpu/sampling.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

// Tokens whose logit is this far below the maximum have probability below
// e^-30 relative to the best token; dropping them before sorting changes
// nothing at float precision and keeps top-p sorts short.
#define LOGIT_WINDOW 30.0f

typedef struct {
    float logit;
    int32_t id;
} cand;

struct pg_sampler {
    int32_t vocab;
    cand *cands;          // [vocab]
    uint32_t *count;      // [vocab] output occurrences for the current call
    uint8_t *in_history;  // [vocab] token seen in prompt or output
};

int pg_sampler_create(int32_t vocab, pg_sampler **out) {
    pg_sampler *s = pg_xcalloc(1, sizeof *s);
    s->vocab = vocab;
    s->cands = pg_xmalloc(sizeof(cand) * (size_t)vocab);
    s->count = pg_xcalloc((size_t)vocab, sizeof(uint32_t));
    s->in_history = pg_xcalloc((size_t)vocab, 1);
    *out = s;
    return 0;
}

int32_t pg_sampler_vocab(const pg_sampler *s) { return s->vocab; }

void pg_sampler_free(pg_sampler *s) {
    if (!s) return;
    free(s->cands);
    free(s->count);
    free(s->in_history);
    free(s);
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

double pg_sampler_uniform(uint64_t seed, uint64_t counter) {
    uint64_t r = splitmix64(splitmix64(seed) ^ splitmix64(counter + 0x632be59bd9b4e019ull));
    return (double)(r >> 11) * (1.0 / 9007199254740992.0); // 53 random bits
}

static int cmp_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->id - y->id; // stable tie-break: lower id first
}

// log-softmax of the raw logits for the sampled token and the top entries.
static void fill_logprobs(pg_sampler *s, const pg_sample_params *p, const float *logits,
                          pg_sample_out *out) {
    int32_t v = s->vocab;
    float mx = -INFINITY;
    for (int32_t i = 0; i < v; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < v; i++) sum += exp((double)(logits[i] - mx));
    float lse = mx + (float)log(sum);
    out->logprob = logits[out->token] - lse;
    out->n_top = 0;
    int32_t k = p->logprobs;
    if (k <= 0) return;
    if (k > PG_SAMPLE_MAX_LOGPROBS) k = PG_SAMPLE_MAX_LOGPROBS;
    // Insertion into a k-long sorted list: vocab * k at worst, k <= 20.
    for (int32_t i = 0; i < v; i++) {
        float l = logits[i];
        int32_t n = out->n_top;
        if (n == k && l <= out->top_logprobs[n - 1]) continue;
        int32_t at = n < k ? n : k - 1;
        while (at > 0 && out->top_logprobs[at - 1] < l) {
            out->top_logprobs[at] = out->top_logprobs[at - 1];
            out->top_ids[at] = out->top_ids[at - 1];
            at--;
        }
        out->top_logprobs[at] = l;
        out->top_ids[at] = i;
        if (n < k) out->n_top++;
    }
    for (int32_t i = 0; i < out->n_top; i++) out->top_logprobs[i] -= lse;
}

// A forced row (prompt logprobs): the given token's logprob, rank and the
// top entries of the raw logits; nothing is sampled or modified.
static void score_forced(pg_sampler *s, const pg_sample_params *p, const float *logits,
                         pg_sample_out *out) {
    int32_t t = p->forced_token;
    out->token = t;
    if (p->logprobs < 0 || t < 0 || t >= s->vocab) return;
    fill_logprobs(s, p, logits, out);
    int32_t above = 0; // strictly greater, as vLLM's (logprobs > token's).sum() + 1
    for (int32_t i = 0; i < s->vocab; i++) above += logits[i] > logits[t];
    out->rank = above + 1;
}

static void apply_penalties(pg_sampler *s, const pg_sample_params *p, const int32_t *history,
                            float *logits) {
    bool rep = p->repetition_penalty != 1.0f && p->repetition_penalty > 0;
    bool pres = p->presence_penalty != 0.0f, freq = p->frequency_penalty != 0.0f;
    if (!rep && !pres && !freq) return;
    for (int32_t i = p->n_prompt; i < p->n_history; i++) s->count[history[i]]++;
    if (rep)
        for (int32_t i = 0; i < p->n_history; i++) s->in_history[history[i]] = 1;
    // Visit each distinct token once: clear the marks as we go.
    for (int32_t i = 0; i < p->n_history; i++) {
        int32_t t = history[i];
        if (rep && s->in_history[t]) {
            logits[t] = logits[t] > 0 ? logits[t] / p->repetition_penalty
                                      : logits[t] * p->repetition_penalty;
            s->in_history[t] = 0;
        }
        if (s->count[t]) {
            logits[t] -= freq ? p->frequency_penalty * (float)s->count[t] : 0.0f;
            logits[t] -= pres ? p->presence_penalty : 0.0f;
            s->count[t] = 0;
        }
    }
}

void pg_sampler_sample(pg_sampler *s, const pg_sample_params *p, const int32_t *tokens,
                       float *logits, pg_sample_out *out) {
    const int32_t v = s->vocab;
    memset(out, 0, sizeof *out);
    if (p->forced) {
        score_forced(s, p, logits, out);
        return;
    }
    // Raw logprobs are computed after the token is known; keep a copy of
    // the raw logit of every token only if logprobs were asked for.
    float *raw = NULL;
    if (p->logprobs >= 0) {
        raw = pg_xmalloc(sizeof(float) * (size_t)v);
        memcpy(raw, logits, sizeof(float) * (size_t)v);
    }
    if (p->n_history > 0) apply_penalties(s, p, tokens + p->hist_offset, logits);
    for (int32_t i = 0; i < p->n_ban; i++) {
        int32_t t = tokens[p->ban_offset + i];
        if (t >= 0 && t < v) logits[t] = -INFINITY;
    }
    for (int32_t i = 0; i < p->n_bias; i++) {
        int32_t t = tokens[p->bias_offset + 2 * i];
        float b;
        memcpy(&b, &tokens[p->bias_offset + 2 * i + 1], sizeof b);
        if (t >= 0 && t < v) logits[t] += b;
    }
    if (p->n_mask > 0) {
        const uint32_t *m = (const uint32_t *)(tokens + p->mask_offset);
        for (int32_t i = 0; i < v; i++)
            if ((i >> 5) >= p->n_mask || !(m[i >> 5] >> (i & 31) & 1)) logits[i] = -INFINITY;
    }
    int32_t best = 0;
    for (int32_t i = 1; i < v; i++)
        if (logits[i] > logits[best]) best = i;
    if (p->temperature <= 0.0f || p->top_k == 1) {
        out->token = best;
    } else {
        // Candidates within the window of the best logit, scaled by 1/T.
        float mx = logits[best], inv_t = 1.0f / p->temperature;
        int32_t n = 0;
        for (int32_t i = 0; i < v; i++)
            if ((logits[i] - mx) * inv_t > -LOGIT_WINDOW)
                s->cands[n++] = (cand){(logits[i] - mx) * inv_t, i};
        qsort(s->cands, (size_t)n, sizeof(cand), cmp_desc);
        if (p->top_k > 0 && p->top_k < n) n = p->top_k;
        double total = 0;
        for (int32_t i = 0; i < n; i++) total += exp((double)s->cands[i].logit);
        if (p->top_p < 1.0f) {
            double cum = 0;
            int32_t keep = n;
            for (int32_t i = 0; i < n; i++) {
                cum += exp((double)s->cands[i].logit) / total;
                if (cum >= p->top_p) {
                    keep = i + 1;
                    break;
                }
            }
            n = keep;
        }
        if (p->min_p > 0.0f) {
            // Relative to the most likely token: p_i >= min_p * p_max.
            double thresh = log((double)p->min_p) + s->cands[0].logit;
            int32_t keep = 1;
            while (keep < n && s->cands[keep].logit >= thresh) keep++;
            n = keep;
        }
        total = 0;
        for (int32_t i = 0; i < n; i++) total += exp((double)s->cands[i].logit);
        double u = pg_sampler_uniform(p->seed, (uint64_t)p->n_generated) * total;
        int32_t pick = n - 1;
        for (int32_t i = 0; i < n; i++) {
            u -= exp((double)s->cands[i].logit);
            if (u < 0) {
                pick = i;
                break;
            }
        }
        out->token = s->cands[pick].id;
    }
    if (raw) {
        fill_logprobs(s, p, raw, out);
        free(raw);
    }
}
