// kernels/backend_prof.c - the op profiler (kernels/backend_prof.h): a copy
// of a backend's three tables whose entries stamp the compute timeline
// before they call the backend's own, and read the stamps back where the
// caller waits for the device anyway.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "kernels/backend_prof.h"
#include "kernels/dtype.h"

#define PROF_LABELS 128 // distinct op names; later ones are charged to the last, "other"
#define PROF_MAX 16     // backends wrapped at once (tensor-parallel ranks)

// The interval from a step's end (or a wait for the device) to the next op
// issued: time the device had nothing queued.
#define IDLE "idle (nothing queued)"
// An idle interval longer than this is not a step's host gap but start-up
// (between its profiling forward and the first request) or a time with no
// requests: charged apart, so the idle line says what steps wait.
#define GAP_MS 50.0f
#define GAP "idle over 50 ms (start-up, no requests)"

typedef struct prof_label {
    char name[56];
    int64_t calls;
    double ms, rows;
} prof_label;

typedef struct prof {
    pg_backend *be;
    const pg_backend_dev *dev0; // the backend's own tables
    const pg_backend_store *store0;
    const pg_backend_ops *ops0;
    pg_backend_dev dev; // the wrapping ones
    pg_backend_store store;
    pg_backend_ops ops;
    // The stamps, a ring: stamp a (a count since wrapping) sits in slot
    // a % PG_PROF_MARKS with the op it opens and its rows. [head, next) are
    // not read back yet; head's interval is the first to charge.
    int16_t label[PG_PROF_MARKS];
    int64_t rows[PG_PROF_MARKS];
    float ms[PG_PROF_MARKS];
    int64_t head, next;
    int64_t recorded[2]; // dev->record(slot): the stamps issued before it
    bool capturing, failed;
    prof_label labels[PROF_LABELS];
    int32_t n_labels;
    int16_t idle_id, gap_id; // IDLE's interval, charged to GAP when it is long
    int64_t reads;
    double ms_total;
} prof;

// Filled when a backend is wrapped (before any thread issues ops on it) and
// cleared when it is destroyed: readers only scan.
static prof *g_prof[PROF_MAX];

static prof *prof_of(const pg_backend *b) {
    for (int i = 0; i < PROF_MAX; i++)
        if (g_prof[i] && g_prof[i]->be == b) return g_prof[i];
    return NULL;
}

bool pg_backend_prof_wanted(void) {
    const char *e = getenv("PAGED_PROFILE_OPS");
    return e && *e && strcmp(e, "0") != 0;
}

static int16_t label_id(prof *p, const char *name) {
    for (int32_t i = 0; i < p->n_labels; i++)
        if (!strcmp(p->labels[i].name, name)) return (int16_t)i;
    if (p->n_labels == PROF_LABELS) return PROF_LABELS - 1;
    prof_label *l = &p->labels[p->n_labels];
    snprintf(l->name, sizeof l->name, "%s", p->n_labels == PROF_LABELS - 1 ? "other" : name);
    return (int16_t)p->n_labels++;
}

// Profiling never fails an op: a timer error stops the profile, logged once.
static void prof_fail(prof *p) {
    if (!p->failed) PG_LOGW("op profile: the timer failed (%s); profiling stops here", pg_err_msg());
    p->failed = true;
}

// Charges the intervals between stamps [head, end) (waiting for stamp end
// - 1) to the ops they open; stamp end - 1 becomes the head, its interval
// charged by a later read.
static void read_upto(prof *p, pg_backend *b, int64_t end) {
    if (p->failed || end - p->head < 2) return;
    const int32_t n = (int32_t)(end - p->head), h = (int32_t)(p->head % PG_PROF_MARKS);
    if (p->dev0->timer_read(b, h, n, p->ms) < 0) {
        prof_fail(p);
        return;
    }
    for (int32_t j = 0; j + 1 < n; j++) {
        const int32_t slot = (h + j) % PG_PROF_MARKS;
        const int16_t id = p->label[slot] == p->idle_id && p->ms[j] > GAP_MS ? p->gap_id : p->label[slot];
        prof_label *l = &p->labels[id];
        l->calls++;
        l->ms += p->ms[j];
        l->rows += (double)p->rows[slot];
        p->ms_total += p->ms[j];
    }
    p->head = end - 1;
    p->reads++;
}

static void stamp(prof *p, pg_backend *b, const char *name, int64_t rows) {
    if (p->capturing || p->failed) return;
    // A full ring is read back whole (this waits for the device: rare, a
    // step issues a few hundred ops).
    if (p->next - p->head >= PG_PROF_MARKS) read_upto(p, b, p->next);
    const int32_t slot = (int32_t)(p->next % PG_PROF_MARKS);
    if (p->dev0->timer_mark(b, slot) < 0) {
        prof_fail(p);
        return;
    }
    p->label[slot] = label_id(p, name);
    p->rows[slot] = rows;
    p->next++;
}


static const char *attn_name(const pg_attn_batch *ab) {
    return ab->n_decode == ab->n_seqs ? "attention decode" : ab->n_decode == 0 ? "attention prefill" : "attention mixed";
}

// --- the wrapping entries --------------------------------------------------------------------

// An op that stamps under a fixed name with `rows` rows, then runs.
#define PROF_OP(tbl, fn, name, rows, params, args) \
    static int prof_##fn params {                  \
        prof *p = prof_of(b);                      \
        stamp(p, b, name, rows);                   \
        return p->tbl##0->fn args;                 \
    }

PROF_OP(ops, embed, "embed", out.rows,
        (pg_backend * b, pg_tensor out, const int32_t *ids, const pg_bweight *table, int32_t id0),
        (b, out, ids, table, id0))
PROF_OP(ops, copy, "copy", dst.rows, (pg_backend * b, pg_tensor dst, pg_tensor src), (b, dst, src))
PROF_OP(ops, gather, "gather", out.rows, (pg_backend * b, pg_tensor out, pg_tensor x, const int32_t *rows),
        (b, out, x, rows))
PROF_OP(ops, rmsnorm, "rmsnorm", x.rows, (pg_backend * b, pg_tensor out, pg_tensor x, const pg_bweight *w, float eps),
        (b, out, x, w, eps))
PROF_OP(ops, silu_mul, "silu_mul", h.rows, (pg_backend * b, pg_tensor h, pg_tensor gu), (b, h, gu))
PROF_OP(ops, rmsnorm_add, "rmsnorm_add", x.rows,
        (pg_backend * b, pg_tensor x, pg_tensor y, const pg_bweight *w, float eps), (b, x, y, w, eps))
PROF_OP(ops, scale, "scale", x.rows, (pg_backend * b, pg_tensor x, float s), (b, x, s))
PROF_OP(ops, softcap, "softcap", x.rows, (pg_backend * b, pg_tensor x, float cap), (b, x, cap))
PROF_OP(ops, attention_softcap, attn_name(ab), q.rows,
        (pg_backend * b, pg_tensor out, pg_tensor q, const pg_attn_batch *ab, const void *k_cache,
         const void *v_cache, pg_kv_shape shape, int32_t n_heads, float scale, int32_t window, float softcap),
        (b, out, q, ab, k_cache, v_cache, shape, n_heads, scale, window, softcap))
PROF_OP(ops, moe_ffn, "moe_ffn", x.rows,
        (pg_backend * b, pg_tensor out, pg_tensor x, const pg_bweight *norm, float eps, const pg_bweight *router,
         const pg_bweight *const *gate_up, const pg_bweight *const *down, int32_t n_experts, int32_t top_k,
         bool renorm, bool accumulate, void *workspace, size_t workspace_bytes),
        (b, out, x, norm, eps, router, gate_up, down, n_experts, top_k, renorm, accumulate, workspace,
         workspace_bytes))
PROF_OP(ops, lora_apply, "lora_apply", x.rows,
        (pg_backend * b, pg_tensor out, pg_tensor x, const int32_t *row_slot, const pg_lora_slot *slots,
         int32_t n_slots, void *workspace, size_t workspace_bytes),
        (b, out, x, row_slot, slots, n_slots, workspace, workspace_bytes))
PROF_OP(ops, head_rmsnorm, "head_rmsnorm", x.rows,
        (pg_backend * b, pg_tensor x, int32_t n_heads, const pg_bweight *w, float eps), (b, x, n_heads, w, eps))
PROF_OP(ops, rope_kv_write, "rope_kv_write", q.rows,
        (pg_backend * b, pg_tensor q, pg_tensor k, pg_tensor v, const int32_t *pos, const int32_t *slots,
         int32_t n_heads, const pg_bweight *inv_freq, void *k_cache, void *v_cache, pg_kv_shape shape),
        (b, q, k, v, pos, slots, n_heads, inv_freq, k_cache, v_cache, shape))
PROF_OP(ops, attention, attn_name(ab), q.rows,
        (pg_backend * b, pg_tensor out, pg_tensor q, const pg_attn_batch *ab, const void *k_cache,
         const void *v_cache, pg_kv_shape shape, int32_t n_heads, float scale, int32_t window),
        (b, out, q, ab, k_cache, v_cache, shape, n_heads, scale, window))
PROF_OP(ops, sample, "sample", logits.rows,
        (pg_backend * b, pg_sample_out *out, pg_tensor logits, const pg_sample_params *params,
         const int32_t *tokens, void *workspace, size_t workspace_bytes),
        (b, out, logits, params, tokens, workspace, workspace_bytes))
PROF_OP(ops, argmax_rows, "argmax_rows", x.rows, (pg_backend * b, pg_argmax *out, pg_tensor x), (b, out, x))
PROF_OP(ops, argmax_pick, "argmax_pick", n,
        (pg_backend * b, pg_sample_out *out, const pg_argmax *cand, int32_t n_ranks, int32_t n, int32_t ids_per_rank),
        (b, out, cand, n_ranks, n, ids_per_rank))
PROF_OP(ops, topk_rows, "topk_rows", x.rows,
        (pg_backend * b, pg_argmax *out, pg_tensor x, int32_t k, const pg_argmax *cand, int32_t n_ranks,
         const pg_sample_params *params, int32_t col0),
        (b, out, x, k, cand, n_ranks, params, col0))
PROF_OP(ops, topk_scatter, "topk_scatter", logits.rows,
        (pg_backend * b, pg_tensor logits, const pg_argmax *cand, int32_t n_ranks, int32_t k),
        (b, logits, cand, n_ranks, k))
PROF_OP(ops, feed_tokens, "feed_tokens", n,
        (pg_backend * b, int32_t *tokens, const pg_sample_out *prev, const int32_t *pairs, int32_t n),
        (b, tokens, prev, pairs, n))
PROF_OP(dev, upload, "upload", 0, (pg_backend * b, void *dst, const void *src_host, size_t bytes),
        (b, dst, src_host, bytes))
PROF_OP(dev, download, "download", 0, (pg_backend * b, void *dst_host, const void *src, size_t bytes),
        (b, dst_host, src, bytes))
PROF_OP(dev, graph_launch, "graph (a captured decode step)", 0, (pg_backend * b, void *graph), (b, graph))
PROF_OP(store, kv_copy, "kv_copy", n, (pg_backend * b, pg_bkv *kv, const int32_t *pairs, int32_t n),
        (b, kv, pairs, n))

static int prof_kv_swap(pg_backend *b, pg_bkv *kv, const int32_t *pairs, int32_t n, bool to_host) {
    prof *p = prof_of(b);
    stamp(p, b, to_host ? "kv_swap to host" : "kv_swap to device", n);
    return p->store0->kv_swap(b, kv, pairs, n, to_host);
}

// Linear layers by weight: "linear NxK type" (+norm: the RMSNorm fused in
// front; +res: accumulating into the residual).
static void weight_name(char *buf, size_t cap, const char *what, const pg_bweight *w, const pg_bweight *norm,
                        bool accumulate) {
    snprintf(buf, cap, "%s %lldx%lld %s%s%s", what, (long long)w->rows, (long long)w->cols, pg_dtype_name(w->dtype),
             norm ? " +norm" : "", accumulate ? " +res" : "");
}

static int prof_linear(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *norm, float eps,
                       const pg_bweight *w, const pg_bweight *bias, bool accumulate, pg_tensor scratch) {
    prof *p = prof_of(b);
    char name[56];
    weight_name(name, sizeof name, "linear", w, norm, accumulate);
    stamp(p, b, name, x.rows);
    return p->ops0->linear(b, out, x, norm, eps, w, bias, accumulate, scratch);
}

// gate_up_silu and gate_up_gelu share a signature: one body, the op picked.
typedef int (*gate_up_fn)(pg_backend *b, pg_tensor h, pg_tensor x, const pg_bweight *norm, float eps,
                          const pg_bweight *w, pg_tensor scratch_xn, pg_tensor scratch_gu);

static int gate_up(pg_backend *b, bool gelu, pg_tensor h, pg_tensor x, const pg_bweight *norm, float eps,
                   const pg_bweight *w, pg_tensor scratch_xn, pg_tensor scratch_gu) {
    prof *p = prof_of(b);
    char name[56];
    weight_name(name, sizeof name, gelu ? "gate_up_gelu" : "gate_up_silu", w, norm, false);
    stamp(p, b, name, x.rows);
    const gate_up_fn f = gelu ? p->ops0->gate_up_gelu : p->ops0->gate_up_silu;
    return f(b, h, x, norm, eps, w, scratch_xn, scratch_gu);
}

static int prof_gate_up_silu(pg_backend *b, pg_tensor h, pg_tensor x, const pg_bweight *norm, float eps,
                             const pg_bweight *w, pg_tensor scratch_xn, pg_tensor scratch_gu) {
    return gate_up(b, false, h, x, norm, eps, w, scratch_xn, scratch_gu);
}

static int prof_gate_up_gelu(pg_backend *b, pg_tensor h, pg_tensor x, const pg_bweight *norm, float eps,
                             const pg_bweight *w, pg_tensor scratch_xn, pg_tensor scratch_gu) {
    return gate_up(b, true, h, x, norm, eps, w, scratch_xn, scratch_gu);
}

// A step ends with dev->record(slot) and is waited for with dev->wait(slot):
// the stamps issued before the record are complete when the wait returns,
// so they are read back there, whatever later steps have been issued since.
static int prof_record(pg_backend *b, int slot) {
    prof *p = prof_of(b);
    stamp(p, b, IDLE, 0);
    p->recorded[slot & 1] = p->next;
    return p->dev0->record(b, slot);
}

static int prof_wait(pg_backend *b, int slot) {
    prof *p = prof_of(b);
    const int rc = p->dev0->wait(b, slot);
    if (rc == 0 && !p->capturing) read_upto(p, b, p->recorded[slot & 1]);
    return rc;
}

static int prof_sync(pg_backend *b) {
    prof *p = prof_of(b);
    stamp(p, b, IDLE, 0);
    const int64_t end = p->next;
    const int rc = p->dev0->sync(b);
    if (rc == 0 && !p->capturing) read_upto(p, b, end);
    return rc;
}

// Synchronous: everything before it has run when it returns.
static int prof_read_f32(pg_backend *b, pg_tensor t, int64_t n, float *out) {
    prof *p = prof_of(b);
    stamp(p, b, "read_f32", n);
    const int rc = p->ops0->read_f32(b, t, n, out);
    stamp(p, b, IDLE, 0);
    if (rc == 0 && !p->capturing) read_upto(p, b, p->next);
    return rc;
}

// Nothing is stamped inside a capture: the events would become graph nodes.
static int prof_graph_begin(pg_backend *b) {
    prof *p = prof_of(b);
    stamp(p, b, IDLE, 0);
    const int rc = p->dev0->graph_begin(b);
    if (rc == 0) p->capturing = true;
    return rc;
}

static int prof_graph_end(pg_backend *b, void **graph) {
    prof *p = prof_of(b);
    p->capturing = false; // graph_end always ends the capture
    return p->dev0->graph_end(b, graph);
}

static void prof_destroy(pg_backend *b) {
    prof *p = prof_of(b);
    pg_backend_prof_report(b);
    for (int i = 0; i < PROF_MAX; i++)
        if (g_prof[i] == p) g_prof[i] = NULL;
    b->dev = p->dev0, b->store = p->store0, b->ops = p->ops0;
    free(p);
    b->dev->destroy(b);
}

// Replaces an entry the backend has (a NULL one stays NULL: "not supported").
#define WRAP(tbl, fn) \
    if (p->tbl.fn) p->tbl.fn = prof_##fn

int pg_backend_prof_wrap(pg_backend *be) {
    PG_ARG(be && !prof_of(be), "op profile: no backend, or wrapped already");
    if (!be->dev->timer_mark || !be->dev->timer_read)
        return pg_err_set(PG_EUNSUPP, "op profile: the %s backend has no timer", be->name);
    int slot = -1;
    for (int i = 0; i < PROF_MAX && slot < 0; i++)
        if (!g_prof[i]) slot = i;
    if (slot < 0) return pg_err_set(PG_EUNSUPP, "op profile: more than %d backends", PROF_MAX);
    prof *p = pg_xcalloc(1, sizeof *p);
    p->be = be;
    p->dev0 = be->dev, p->store0 = be->store, p->ops0 = be->ops;
    p->dev = *be->dev, p->store = *be->store, p->ops = *be->ops;
    p->idle_id = label_id(p, IDLE);
    p->gap_id = label_id(p, GAP);
    WRAP(ops, embed);
    WRAP(ops, copy);
    WRAP(ops, gather);
    WRAP(ops, rmsnorm);
    WRAP(ops, linear);
    WRAP(ops, gate_up_silu);
    WRAP(ops, silu_mul);
    WRAP(ops, gate_up_gelu);
    WRAP(ops, rmsnorm_add);
    WRAP(ops, scale);
    WRAP(ops, softcap);
    WRAP(ops, attention_softcap);
    WRAP(ops, moe_ffn);
    WRAP(ops, lora_apply);
    WRAP(ops, head_rmsnorm);
    WRAP(ops, rope_kv_write);
    WRAP(ops, attention);
    WRAP(ops, sample);
    WRAP(ops, argmax_rows);
    WRAP(ops, argmax_pick);
    WRAP(ops, topk_rows);
    WRAP(ops, topk_scatter);
    WRAP(ops, feed_tokens);
    WRAP(ops, read_f32);
    WRAP(dev, upload);
    WRAP(dev, download);
    WRAP(dev, record);
    WRAP(dev, wait);
    WRAP(dev, sync);
    WRAP(dev, graph_begin);
    WRAP(dev, graph_end);
    WRAP(dev, graph_launch);
    WRAP(dev, destroy);
    WRAP(store, kv_swap);
    WRAP(store, kv_copy);
    g_prof[slot] = p;
    be->dev = &p->dev, be->store = &p->store, be->ops = &p->ops;
    PG_LOGI("op profile on (PAGED_PROFILE_OPS) for the %s backend: the table goes to the log at exit", be->name);
    return 0;
}

static int by_ms_desc(const void *a, const void *b) {
    const prof_label *x = *(const prof_label *const *)a, *y = *(const prof_label *const *)b;
    return x->ms < y->ms ? 1 : x->ms > y->ms ? -1 : 0;
}

// Everything issued so far, read back (the device is waited for).
static void read_all(prof *p, pg_backend *b) {
    if (p->capturing || p->failed) return;
    stamp(p, b, IDLE, 0);
    const int64_t end = p->next;
    if (p->dev0->sync(b) == 0) read_upto(p, b, end);
}

double pg_backend_prof_report(pg_backend *be) {
    prof *p = prof_of(be);
    if (!p) return -1;
    read_all(p, be);
    const prof_label *order[PROF_LABELS];
    const double idle = p->labels[p->idle_id].ms, gap = p->labels[p->gap_id].ms;
    for (int32_t i = 0; i < p->n_labels; i++) order[i] = &p->labels[i];
    qsort(order, (size_t)p->n_labels, sizeof order[0], by_ms_desc);
    // Shares are of the timeline less the long gaps: the steps and what
    // they waited for.
    const double busy = p->ms_total - gap;
    PG_LOGI("op profile, %s backend: %.1f ms of device timeline from the first op to the last read; %.1f ms of it in "
            "steps: %.1f ms (%.1f%%) in ops, %.1f ms (%.1f%%) idle between them; %.1f ms in gaps over %.0f ms "
            "(start-up, no requests); %lld reads",
            be->name, p->ms_total, busy, busy - idle, busy > 0 ? 100.0 * (busy - idle) / busy : 0.0, idle,
            busy > 0 ? 100.0 * idle / busy : 0.0, gap, (double)GAP_MS, (long long)p->reads);
    PG_LOGI("  %-46s %9s %11s %6s %10s %9s", "op", "calls", "total ms", "share", "mean us", "mean rows");
    for (int32_t i = 0; i < p->n_labels; i++) {
        const prof_label *l = order[i];
        if (!l->calls) continue;
        const bool is_gap = l == &p->labels[p->gap_id];
        PG_LOGI("  %-46s %9lld %11.2f %5.1f%% %10.2f %9.1f", l->name, (long long)l->calls, l->ms,
                busy > 0 && !is_gap ? 100.0 * l->ms / busy : 0.0, 1000.0 * l->ms / (double)l->calls,
                l->rows / (double)l->calls);
    }
    return p->ms_total;
}

int64_t pg_backend_prof_calls(pg_backend *be, const char *name, double *ms) {
    prof *p = prof_of(be);
    if (!p) return -1;
    read_all(p, be);
    for (int32_t i = 0; i < p->n_labels; i++)
        if (!strcmp(p->labels[i].name, name)) {
            if (ms) *ms = p->labels[i].ms;
            return p->labels[i].calls;
        }
    return -1;
}
