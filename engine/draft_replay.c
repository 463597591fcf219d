// engine/draft_replay.c - the replay draft (engine/draft_replay.h): a
// recorded greedy run, indexed by prompt hash, rewriting the draft model's
// proposals.
#include "engine/draft_replay.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/err.h"
#include "common/file.h"
#include "kernels/sampling.h"

// One recorded request: ids[off .. off + n_prompt) its prompt, then n_out
// output tokens.
typedef struct rp_entry {
    uint64_t hash;
    int64_t off;
    int32_t n_prompt, n_out;
} rp_entry;

struct pg_replay {
    rp_entry *e; // [n] sorted by hash
    int32_t n, cap;
    int32_t *ids;
    int64_t n_ids, ids_cap, n_out;
    double rate;
    uint64_t seed;
    int32_t vocab;
    int64_t replaced, wrong;
};

static uint64_t prompt_hash(const int32_t *ids, int32_t n) {
    return XXH3_64bits(ids, sizeof(int32_t) * (size_t)n);
}

// Appends the token ids of the JSON array `a` to r->ids; PG_EINVAL (no
// message: the caller names the line) when it is not an array of ids
// below the vocabulary, or empty when `nonempty`.
static int append_ids(pg_replay *r, const cJSON *a, bool nonempty, int32_t *count) {
    if (!cJSON_IsArray(a)) return PG_EINVAL;
    const int32_t m = cJSON_GetArraySize(a);
    if (nonempty && m == 0) return PG_EINVAL;
    if (r->n_ids + m > r->ids_cap) {
        r->ids_cap = (r->n_ids + m) * 2;
        r->ids = pg_xrealloc(r->ids, sizeof(int32_t) * (size_t)r->ids_cap);
    }
    for (const cJSON *v = a->child; v; v = v->next) {
        const double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
        if (!(d >= 0 && d < r->vocab) || d != (int32_t)d) return PG_EINVAL;
        r->ids[r->n_ids++] = (int32_t)d;
    }
    *count = m;
    return 0;
}

// One line of the file: 0 when used, 1 when skipped (blank, or a failed
// request), < 0 with the reason set.
static int parse_line(pg_replay *r, const char *path, int lineno, const char *line) {
    if (strspn(line, " \t\r") == strlen(line)) return 1;
    cJSON *o = cJSON_Parse(line);
    int rc = 0;
    if (!cJSON_IsObject(o)) {
        rc = pg_err_set(PG_EINVAL, "replay file %s: line %d is not a JSON object", path, lineno);
    } else if (cJSON_GetObjectItemCaseSensitive(o, "error")) {
        rc = 1; // the recording run's request failed: nothing to replay
    } else {
        rp_entry e = {.off = r->n_ids};
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt_ids");
        const cJSON *out = cJSON_GetObjectItemCaseSensitive(o, "output_ids");
        if (!p || !out) {
            rc = pg_err_set(PG_EINVAL,
                            "replay file %s: line %d has no \"prompt_ids\" and \"output_ids\" (write it with "
                            "paged generate --prompts-file --record-ids)", path, lineno);
        } else if (append_ids(r, p, true, &e.n_prompt) < 0 || append_ids(r, out, false, &e.n_out) < 0) {
            rc = pg_err_set(PG_EINVAL, "replay file %s: line %d: \"prompt_ids\" and \"output_ids\" must be lists "
                            "of token ids below the vocabulary's %d (a non-empty prompt)", path, lineno, r->vocab);
        } else {
            e.hash = prompt_hash(r->ids + e.off, e.n_prompt);
            if (r->n == r->cap) {
                r->cap = r->cap ? 2 * r->cap : 16;
                r->e = pg_xrealloc(r->e, sizeof(rp_entry) * (size_t)r->cap);
            }
            r->e[r->n++] = e;
            r->n_out += e.n_out;
        }
    }
    cJSON_Delete(o);
    return rc;
}

static int by_hash(const void *a, const void *b) {
    const uint64_t x = ((const rp_entry *)a)->hash, y = ((const rp_entry *)b)->hash;
    return x < y ? -1 : x > y;
}

int pg_replay_load(const pg_replay_config *c, pg_replay **out) {
    *out = NULL;
    PG_ARG(c->path && c->path[0], "replay: a file is needed");
    PG_ARG(c->error_rate >= 0 && c->error_rate <= 1, "replay file %s: replay_error_rate %g is outside [0, 1]",
           c->path, c->error_rate);
    PG_ARG(c->vocab_size > 0, "replay file %s: no vocabulary", c->path);
    char *text;
    size_t len;
    if (pg_read_file(c->path, (size_t)1 << 32, &text, &len) < 0) return pg_err_wrap(PG_EINVAL, "replay file ");
    pg_replay *r = pg_xcalloc(1, sizeof *r);
    *r = (pg_replay){.rate = c->error_rate, .seed = c->seed, .vocab = c->vocab_size};
    int rc = 0, lineno = 0;
    for (char *line = text, *next; rc >= 0 && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        rc = parse_line(r, c->path, ++lineno, line);
    }
    free(text);
    if (rc >= 0 && r->n == 0) rc = pg_err_set(PG_EINVAL, "replay file %s: no request to replay", c->path);
    if (rc < 0) {
        pg_replay_free(r);
        return rc;
    }
    // Stable order for equal hashes is not needed: a lookup compares the
    // prompts and the first equal one wins; greedy duplicates agree.
    qsort(r->e, (size_t)r->n, sizeof(rp_entry), by_hash);
    *out = r;
    return 0;
}

void pg_replay_free(pg_replay *r) {
    if (!r) return;
    free(r->e);
    free(r->ids);
    free(r);
}

void pg_replay_size(const pg_replay *r, int32_t *requests, int64_t *tokens) {
    *requests = r->n;
    *tokens = r->n_out;
}

void pg_replay_counts(const pg_replay *r, int64_t *replaced, int64_t *wrong) {
    *replaced = r->replaced;
    *wrong = r->wrong;
}

// The recorded request whose prompt is prompt[0 .. n), or NULL.
static const rp_entry *find(const pg_replay *r, const int32_t *prompt, int32_t n) {
    const uint64_t h = prompt_hash(prompt, n);
    int32_t lo = 0, hi = r->n;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (r->e[mid].hash < h) lo = mid + 1;
        else hi = mid;
    }
    for (; lo < r->n && r->e[lo].hash == h; lo++) {
        const rp_entry *e = &r->e[lo];
        if (e->n_prompt == n && !memcmp(r->ids + e->off, prompt, sizeof(int32_t) * (size_t)n)) return e;
    }
    return NULL;
}

// The token to propose at output position p of e: the recorded one, or,
// with probability rate, another id. Both draws are counter-based on (seed
// mixed with the prompt, p), so a position is wrong or right whatever the
// batch, the draft length and how often it is proposed again.
static int32_t token_at(pg_replay *r, const rp_entry *e, int32_t p) {
    const int32_t t = r->ids[e->off + e->n_prompt + p];
    const uint64_t seed = r->seed ^ e->hash;
    if (r->vocab < 2 || !(pg_sampler_uniform(seed, (uint64_t)p) < r->rate)) return t;
    const int32_t shift = 1 + (int32_t)(pg_sampler_uniform(seed, (uint64_t)p | (1ull << 63)) * (r->vocab - 1));
    r->wrong++;
    return (int32_t)(((int64_t)t + (shift < r->vocab ? shift : r->vocab - 1)) % r->vocab);
}

int32_t pg_replay_apply(pg_replay *r, const int32_t *history, int32_t n, int32_t n_prompt, int32_t *out,
                        int32_t got) {
    if (!r || n_prompt <= 0 || n_prompt > n || got <= 0) return 0;
    const rp_entry *e = find(r, history, n_prompt);
    const int32_t done = n - n_prompt; // output tokens so far
    if (!e || done >= e->n_out) return 0;
    // An output that left the recording (another target, another run) has
    // no recorded continuation: the draft's proposal stands.
    if (memcmp(history + n_prompt, r->ids + e->off + e->n_prompt, sizeof(int32_t) * (size_t)done)) return 0;
    int32_t i = 0;
    for (; i < got && done + i < e->n_out; i++) out[i] = token_at(r, e, done + i);
    r->replaced += i;
    return i;
}
