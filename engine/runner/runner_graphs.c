// engine/runner/runner_graphs.c - CUDA graphs of decode steps, on any backend that
// captures (pg_backend.has_graphs).
//
// A step whose sequences all decode is padded to a batch bucket B (powers
// of two up to max_seqs) and a context bucket C (powers of two from 256 up
// to max_model_len; it bounds the decode split plan, which a graph bakes
// in). The embedding and every layer of such a step replay one graph per
// (B, C); the gather, final norm, LM head and sampler stay eager (their
// sizes follow the real batch). Pad rows read token 0 at position 0, write
// no KV (slot -1) and attend to one key of block 0, the pool's
// never-allocated null block. Because runner_pack's offsets depend only on
// the array sizes, every step of a bucket finds its inputs at the same
// device addresses. With KV layer groups the slots and block tables hold a
// copy per group ([G][B] and [G][B][stride], runner_int.h's layout), padded
// the same way in every group. Design and measurements: docs/cuda_runner.md.
//
// With LoRA adapters on a backend with graph-safe LoRA (lora_apply_dev;
// the model keeps its slot table in backend memory) a second set of
// buckets holds the forward with the adapters' kernels in: a decode step
// with an adapter row replays that set's graph (captured on first use),
// the rows' slots uploaded with the other inputs (pad rows: -1), and a
// step of base-model rows only replays the plain set as before
// (docs/lora.md "Graph-safe LoRA").
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/runner/runner_int.h"

int pg_graph_mode_parse(const char *name, pg_graph_mode *out) {
    if (!name || !strcmp(name, "on"))
        *out = PG_GRAPHS_STARTUP;
    else if (!strcmp(name, "off"))
        *out = PG_GRAPHS_OFF;
    else if (!strcmp(name, "lazy"))
        *out = PG_GRAPHS_LAZY;
    else
        return pg_err_set(PG_EINVAL, "cuda graphs '%s' is not known (on, off, lazy)", name);
    return 0;
}

bool pg_runner_graphs_wanted(pg_graph_mode mode) {
    const char *env = getenv("PAGED_CUDA_GRAPHS");
    return mode != PG_GRAPHS_OFF && !(env && env[0] == '0');
}

// The buckets of max_seqs x max_model_len: batches 1, 2, 4, ... below
// max_seqs, then max_seqs; contexts 256, 512, ... below max_model_len, then
// max_model_len; as many as the arrays hold.
static void graph_buckets(int32_t max_seqs, int32_t max_model_len, int32_t bb[RUNNER_MAX_BBUCKETS], int32_t *nb,
                          int32_t cb[RUNNER_MAX_CBUCKETS], int32_t *nc) {
    *nb = *nc = 0;
    for (int32_t b = 1; b < max_seqs && *nb < RUNNER_MAX_BBUCKETS - 1; b *= 2) bb[(*nb)++] = b;
    bb[(*nb)++] = max_seqs;
    for (int64_t c = 256; c < max_model_len && *nc < RUNNER_MAX_CBUCKETS - 1; c *= 2) cb[(*nc)++] = (int32_t)c;
    cb[(*nc)++] = max_model_len;
}

int64_t pg_runner_graph_reserve(int32_t max_seqs, int32_t max_model_len, int64_t per_graph, int32_t sets) {
    int32_t bb[RUNNER_MAX_BBUCKETS], cb[RUNNER_MAX_CBUCKETS], nb, nc;
    graph_buckets(max_seqs, max_model_len, bb, &nb, cb, &nc);
    const int64_t n_all = (int64_t)nb * nc * (sets > 1 ? sets : 1);
    return per_graph * n_all + per_graph * n_all / 2 + ((int64_t)16 << 20);
}

int runner_graphs_setup(pg_runner *r) {
    r->graphs_on = r->be->caps->has_graphs && pg_runner_graphs_wanted(r->cfg.graphs);
    if (!r->graphs_on) return 0;
    const int32_t S = r->max_seqs, bs = r->cfg.block_size;
    const size_t G = (size_t)r->kv_layout.n_groups;
    graph_buckets(S, r->cfg.max_model_len, r->bbuckets, &r->n_bbuckets, r->cbuckets, &r->n_cbuckets);
    r->g_max_bt = (r->cfg.max_model_len + bs - 1) / bs;
    // PAGED_LORA_GRAPHS=0: LoRA decode steps run eagerly, as before session 24.
    const char *lg = getenv("PAGED_LORA_GRAPHS");
    r->n_graph_sets = r->model->lora.dev_table && !(lg && lg[0] == '0') ? 2 : 1;
    const size_t ng = (size_t)r->n_bbuckets * (size_t)r->n_cbuckets * (size_t)r->n_graph_sets;
    r->graph_exec = pg_xcalloc(ng, sizeof(void *));
    r->graph_state = pg_xcalloc(ng, 1);
    r->g_lora = pg_xcalloc((size_t)S, 4);
    r->g_tok = pg_xcalloc((size_t)S, 4), r->g_pos = pg_xcalloc((size_t)S, 4);
    r->g_slots = pg_xcalloc((size_t)S * G, 4), r->g_lens = pg_xcalloc((size_t)S, 4);
    r->g_start = pg_xcalloc((size_t)S, 4);
    r->g_bt = pg_xcalloc((size_t)S * (size_t)r->g_max_bt * G, 4);
    return 0;
}

void runner_graphs_free(pg_runner *r) {
    for (int32_t i = 0; r->graph_state && i < r->n_bbuckets * r->n_cbuckets * r->n_graph_sets; i++)
        if (r->graph_state[i] == 1) r->be->dev->graph_free(r->be, r->graph_exec[i]);
    free(r->graph_exec), free(r->graph_state);
    free(r->g_tok), free(r->g_pos), free(r->g_slots), free(r->g_lens), free(r->g_start), free(r->g_bt);
    free(r->g_lora);
}

// Pad rows [from, B): one key of the null block, no KV write (in every
// group), no adapter.
static void pad_rows(pg_runner *r, int32_t from, int32_t B, int32_t stride) {
    const int32_t G = r->kv_layout.n_groups;
    for (int32_t i = from; i < B; i++) {
        r->g_tok[i] = 0, r->g_pos[i] = 0, r->g_lens[i] = 1, r->g_start[i] = 0, r->g_lora[i] = -1;
        for (int32_t g = 0; g < G; g++) {
            r->g_slots[(size_t)g * B + i] = -1;
            r->g_bt[((size_t)g * B + i) * stride] = 0;
        }
    }
}

static void padded_desc(pg_runner *r, const step_desc *s, int32_t B, int32_t C, int32_t stride,
                        step_desc *ps) {
    static const int32_t zero = 0;
    if (s)
        *ps = *s;
    else
        memset(ps, 0, sizeof *ps);
    ps->n_tokens = ps->n_seqs = ps->n_decode = B;
    ps->tokens = r->g_tok, ps->pos = r->g_pos, ps->slots = r->g_slots;
    ps->seq_lens = r->g_lens, ps->start_pos = r->g_start;
    ps->block_tables = r->g_bt, ps->bt_stride = stride;
    ps->kv_groups = r->kv_layout.n_groups;
    ps->max_decode_ctx = C;
    // The LoRA set's steps: the rows' slots go to the device with the rest.
    ps->lora_rows = s && s->lora_rows ? r->g_lora : NULL;
    ps->lora_on_dev = ps->lora_rows != NULL;
    if (!s) {
        ps->cu_q = &zero;
        ps->sample_tokens = r->g_tok; // n_sample 0: nothing sampled
    }
}

bool runner_graph_step(pg_runner *r, const step_desc *s, step_desc *ps, int32_t *slot) {
    if (!r->graphs_on || s->n_seqs <= 0 || s->n_decode != s->n_seqs || s->n_tokens != s->n_seqs)
        return false;
    int32_t bi = 0, ci = 0;
    while (bi < r->n_bbuckets - 1 && r->bbuckets[bi] < s->n_seqs) bi++;
    while (ci < r->n_cbuckets - 1 && r->cbuckets[ci] < s->max_decode_ctx) ci++;
    const int32_t B = r->bbuckets[bi], C = r->cbuckets[ci], bs = r->cfg.block_size;
    if (B < s->n_seqs || C < s->max_decode_ctx) return false;
    // Steps with adapter rows take the LoRA set (when there is one).
    if (s->lora_rows && r->n_graph_sets < 2) return false;
    *slot = bi * r->n_cbuckets + ci + (s->lora_rows ? r->n_bbuckets * r->n_cbuckets : 0);
    if (r->graph_state[*slot] < 0) return false;
    const int32_t stride = (C + bs - 1) / bs, n = s->n_seqs;
    if (stride < s->bt_stride) return false;
    memcpy(r->g_tok, s->tokens, sizeof(int32_t) * (size_t)n);
    memcpy(r->g_pos, s->pos, sizeof(int32_t) * (size_t)n);
    memcpy(r->g_lens, s->seq_lens, sizeof(int32_t) * (size_t)n);
    memcpy(r->g_start, s->start_pos, sizeof(int32_t) * (size_t)n);
    if (s->lora_rows) memcpy(r->g_lora, s->lora_rows, sizeof(int32_t) * (size_t)n);
    for (int32_t g = 0; g < r->kv_layout.n_groups; g++) { // the step's [G][n] -> the bucket's [G][B]
        memcpy(r->g_slots + (size_t)g * B, s->slots + (size_t)g * n, sizeof(int32_t) * (size_t)n);
        for (int32_t i = 0; i < n; i++)
            memcpy(r->g_bt + ((size_t)g * B + i) * stride, s->block_tables + ((size_t)g * n + i) * s->bt_stride,
                   sizeof(int32_t) * (size_t)((s->seq_lens[i] + bs - 1) / bs));
    }
    pad_rows(r, n, B, stride);
    padded_desc(r, s, B, C, stride, ps);
    return true;
}

// The decode step of bucket (bi, ci) made of pad rows only: what start-up
// capture records. A real step of the bucket puts its rows in the same host
// arrays, so runner_pack gives it the same device addresses.
static void pad_step(pg_runner *r, int32_t bi, int32_t ci, step_desc *ps) {
    const int32_t B = r->bbuckets[bi], C = r->cbuckets[ci], bs = r->cfg.block_size;
    const int32_t stride = (C + bs - 1) / bs;
    pad_rows(r, 0, B, stride);
    padded_desc(r, NULL, B, C, stride, ps);
}

// Captures runner_layers into *exec; false (and nothing kept) on failure.
static bool capture(pg_runner *r, const step_desc *ps, const dev_in *d, void **exec, int *rc_out) {
    pg_backend *be = r->be;
    *exec = NULL;
    int rc = be->dev->graph_begin(be);
    if (rc == 0) {
        int lrc = runner_layers(r, ps, d);
        rc = be->dev->graph_end(be, exec); // always ends the capture
        if (lrc < 0) rc = lrc;
    }
    if (rc == 0) rc = be->dev->sync(be);
    if (rc < 0 && *exec) {
        be->dev->graph_free(be, *exec);
        *exec = NULL;
    }
    *rc_out = rc;
    return rc == 0;
}

void runner_graph_capture(pg_runner *r, const step_desc *ps, const dev_in *d, int32_t slot) {
    int64_t f0 = 0, f1 = 0, t = 0;
    r->be->dev->mem_info(r->be, &f0, &t);
    void *exec;
    int rc;
    if (!capture(r, ps, d, &exec, &rc)) {
        r->graph_state[slot] = -1;
        PG_LOGW("graph for %d decode sequences, context <= %d: capture failed (%s); that "
                "bucket runs eagerly",
                ps->n_seqs, ps->max_decode_ctx, pg_err_msg());
        return;
    }
    r->graph_exec[slot] = exec;
    r->graph_state[slot] = 1;
    r->n_graphs++;
    r->be->dev->mem_info(r->be, &f1, &t);
    if (f0 > f1) r->graph_bytes += f0 - f1;
}

// Graphs are captured after the KV pool is sized, so their memory is
// planned before it: on the profiling pool, a few captures of the largest
// bucket (one warm-up step first) are measured and destroyed; the reserve
// covers every bucket, lazily captured ones too, with a margin. The free
// memory counts 2 MiB pages, hence several probes. Failures only log: the
// reserve falls back to 8 MiB per graph.
void runner_graphs_probe(pg_runner *r) {
    enum { N_PROBE = 8 };
    pg_backend *be = r->be;
    const int64_t n_all = (int64_t)r->n_bbuckets * r->n_cbuckets * r->n_graph_sets;
    int64_t per = (int64_t)8 << 20, f0 = 0, f1 = 0, t = 0;
    void *ex[N_PROBE] = {0};
    int n_ok = 0, rc;
    step_desc ps;
    pad_step(r, r->n_bbuckets - 1, r->n_cbuckets - 1, &ps);
    dev_in d;
    rc = runner_pack(r, &ps, &d);
    if (rc == 0) rc = runner_layers(r, &ps, &d);
    if (rc == 0) rc = be->dev->sync(be);
    if (rc == 0) rc = be->dev->mem_info(be, &f0, &t);
    for (int i = 0; rc == 0 && i < N_PROBE; i++)
        if (capture(r, &ps, &d, &ex[i], &rc)) n_ok++;
    if (n_ok == N_PROBE && be->dev->mem_info(be, &f1, &t) == 0)
        per = f0 > f1 ? (f0 - f1) / N_PROBE : 0;
    else
        PG_LOGW("graphs: the memory probe failed (%s); reserving %lld MiB per graph", pg_err_msg(),
                (long long)(per >> 20));
    for (int i = 0; i < N_PROBE; i++)
        if (ex[i]) be->dev->graph_free(be, ex[i]);
    // The probe sees 2 MiB pages: on the H200 at llama3-8b-shape it measured
    // 0.5 MiB per graph where 90 captures took 0.93 MiB each. Hence a floor of
    // 1 MiB per graph and a 1.5x margin (pg_runner_graph_reserve).
    if (per < PG_RUNNER_GRAPH_MIN_BYTES) per = PG_RUNNER_GRAPH_MIN_BYTES;
    r->graph_reserve = pg_runner_graph_reserve(r->max_seqs, r->cfg.max_model_len, per, r->n_graph_sets);
    PG_LOGI("%s graphs: %.2f MiB per graph measured; %.1f MiB reserved for %lld buckets", be->name,
            (double)per / (1 << 20), (double)r->graph_reserve / (1 << 20), (long long)n_all);
}

int runner_graphs_capture_all(pg_runner *r) {
    if (!r->graphs_on || r->cfg.graphs != PG_GRAPHS_STARTUP) return 0;
    pg_backend *be = r->be;
    // Context buckets up to the start-up bound; larger ones on first use.
    int32_t max_ctx = r->cfg.max_model_len, n_ci = 0;
    const char *env = getenv("PAGED_CUDA_GRAPH_STARTUP_CTX");
    if (env && atoi(env) > 0) max_ctx = atoi(env);
    while (n_ci < r->n_cbuckets && (n_ci == 0 || r->cbuckets[n_ci] <= max_ctx)) n_ci++;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int64_t bytes0 = r->graph_bytes;
    const int32_t n0 = r->n_graphs;
    for (int32_t bi = 0; bi < r->n_bbuckets; bi++)
        for (int32_t ci = 0; ci < n_ci; ci++) {
            const int32_t slot = bi * r->n_cbuckets + ci;
            if (r->graph_state[slot] != 0) continue;
            step_desc ps;
            pad_step(r, bi, ci, &ps);
            dev_in d;
            PG_TRY(runner_pack(r, &ps, &d));
            // One eager step per batch bucket at the smallest and the largest
            // context (GEMM plans of this batch size, both decode paths: one
            // pass and split + reduce), so the capture loads no kernel.
            if (ci == 0 || ci == n_ci - 1) PG_TRY(runner_layers(r, &ps, &d));
            PG_TRY(be->dev->sync(be)); // idle stream; the host image is reused
            runner_graph_capture(r, &ps, &d, slot);
        }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    const double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    char more[96] = "";
    if (n_ci < r->n_cbuckets)
        snprintf(more, sizeof more, "; contexts above %d captured on first use", r->cbuckets[n_ci - 1]);
    PG_LOGI("%s graphs: %d captured in %.2f s, %.1f MiB (batch buckets 1..%d x context buckets "
            "%d..%d%s)",
            be->name, r->n_graphs - n0, secs, (double)(r->graph_bytes - bytes0) / (1 << 20),
            r->bbuckets[r->n_bbuckets - 1], r->cbuckets[0], r->cbuckets[n_ci - 1], more);
    if (r->graph_reserve > 0 && r->graph_bytes > r->graph_reserve)
        PG_LOGW("graphs: %.1f MiB captured, above the %.1f MiB reserved for them",
                (double)r->graph_bytes / (1 << 20), (double)r->graph_reserve / (1 << 20));
    return 0;
}
