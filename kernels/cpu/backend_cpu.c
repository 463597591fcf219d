// kernels/cpu/backend_cpu.c - the CPU backend: kernels/backend.h over the
// CPU kernels of this directory, f32 activations, weights as stored.
//
// Everything runs on the calling thread (with the pool's threads inside an
// op) before the op returns, so the step synchronisation calls are no-ops
// and "device" memory is host memory. Matrices are borrowed from the
// caller's host data (the mapped checkpoint: zero copy); vectors are copied
// to f32. The KV cache is f32 (native), f16, bf16 or q8_0 (kv_cache.c),
// calloc'ed so untouched blocks cost nothing.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/sampling.h"

// OpenBLAS is called from inside our own pool's tasks, so it must not start
// threads of its own.
extern void openblas_set_num_threads(int);

// A weight: up to three borrowed parts (a matrix), or an f32 vector.
typedef struct {
    pg_bweight base;
    int n_parts;
    pg_weight parts[3];
    float *vec;     // rows == 1: the values as f32 (owned unless offloaded)
    void *owned;    // weight_random's storage
    bool offloaded; // weight_offload: parts and vec point into memory the model owns
} cpu_weight;

static const cpu_weight *cw(const pg_bweight *w) {
    return (const cpu_weight *)w;
}

float *pg_cpu_scratch(pg_cpu_ctx *c, int t, size_t n) {
    if (c->scratch_cap[t] < n) {
        free(c->scratch[t]);
        c->scratch[t] = pg_xmalloc(n * sizeof(float));
        c->scratch_cap[t] = n;
    }
    return c->scratch[t];
}

// --- device and memory --------------------------------------------------------------

static void cpu_describe(pg_backend *b, char *out, size_t cap) {
    snprintf(out, cap, "cpu, %d threads, %s numerics", pg_cpu(b)->n_threads,
             pg_matmul_mode_name(pg_cpu(b)->mode));
}

static int cpu_mem_info(pg_backend *b, int64_t *free_bytes, int64_t *total_bytes) {
    (void)b;
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES), ps = sysconf(_SC_PAGESIZE);
    *total_bytes = pages > 0 && ps > 0 ? (int64_t)pages * ps : 0;
    *free_bytes = avail > 0 && ps > 0 ? (int64_t)avail * ps : 0;
    return 0;
}

static int cpu_alloc(pg_backend *b, size_t bytes, void **out) {
    (void)b;
    *out = NULL;
    if (posix_memalign(out, 64, bytes ? bytes : 64) != 0)
        return pg_err_set(PG_ENOMEM, "cpu: cannot allocate %zu MiB", bytes >> 20);
    return 0;
}

static void cpu_free(pg_backend *b, void *p) {
    (void)b;
    free(p);
}

static int cpu_bind_thread(pg_backend *b) {
    (void)b;
    return 0;
}

static int cpu_copy(pg_backend *b, void *dst, const void *src, size_t bytes) {
    (void)b;
    if (dst != src && bytes) memcpy(dst, src, bytes);
    return 0;
}

static int cpu_nop_slot(pg_backend *b, int slot) {
    (void)b, (void)slot;
    return 0;
}

static int cpu_sync(pg_backend *b) {
    (void)b;
    return 0;
}

// Op profiling: an op has run when it returns, so the clock is the timeline.
static int cpu_timer_mark(pg_backend *b, int32_t i) {
    pg_cpu_ctx *c = b->ctx;
    PG_ARG(i >= 0 && i < PG_PROF_MARKS, "timer mark %d", i);
    if (!c->prof_t) c->prof_t = pg_xcalloc(PG_PROF_MARKS, sizeof(double));
    c->prof_t[i] = (double)pg_now_ns() * 1e-6;
    return 0;
}

static int cpu_timer_read(pg_backend *b, int32_t i0, int32_t n, float *ms) {
    pg_cpu_ctx *c = b->ctx;
    PG_ARG(c->prof_t && i0 >= 0 && i0 < PG_PROF_MARKS && n >= 1 && n <= PG_PROF_MARKS, "timer read %d %d", i0, n);
    for (int32_t j = 0; j + 1 < n; j++)
        ms[j] = (float)(c->prof_t[(i0 + j + 1) % PG_PROF_MARKS] - c->prof_t[(i0 + j) % PG_PROF_MARKS]);
    return 0;
}

// --- weights ----------------------------------------------------------------------

// Every GGUF block type and paged's FP8 / int4 run as stored (matmul.c).
static bool cpu_runs_type_in_place(int dtype) { return pg_dtype_block_elems(dtype) > 0; }

static const pg_backend_caps CPU_CAPS = {
    .act_dtype = PG_DTYPE_F32,
    .kv_native = PG_DTYPE_F32,
    .weights_borrow = true,
    .measures_memory = false,
    .has_graphs = false,
    .attn_window = true,
    .runs_in_place = cpu_runs_type_in_place,
    .weight_dtype = PG_DTYPE_F32,
    .vector_bytes = 4,
};

const pg_backend_caps *pg_backend_cpu_caps(void) { return &CPU_CAPS; }

static bool cpu_runs_in_place(pg_backend *b, int dtype) {
    (void)b;
    return CPU_CAPS.runs_in_place(dtype);
}

static int cpu_weight_upload(pg_backend *b, const pg_weight *parts, int n_parts, pg_bweight **out) {
    (void)b;
    *out = NULL;
    PG_ARG(n_parts >= 1 && n_parts <= 3, "cpu weight: %d parts", n_parts);
    cpu_weight *w = pg_xcalloc(1, sizeof *w);
    w->n_parts = n_parts;
    w->base.cols = parts[0].cols;
    w->base.dtype = parts[0].dtype;
    for (int i = 0; i < n_parts; i++) {
        if (parts[i].cols != w->base.cols || !parts[i].data || !cpu_runs_in_place(b, parts[i].dtype)) {
            free(w);
            return pg_err_set(PG_EINVAL, "cpu weight: part %d is %lldx%lld of type %s", i,
                              (long long)parts[i].rows, (long long)parts[i].cols,
                              pg_dtype_name(parts[i].dtype));
        }
        w->parts[i] = parts[i];
        w->base.rows += parts[i].rows;
        w->base.bytes += parts[i].row_bytes * (size_t)parts[i].rows;
        if (parts[i].scales) w->base.bytes += sizeof(float) * (size_t)parts[i].rows; // FP8 row scales
    }
    if (w->base.rows == 1) { // a vector: f32, owned
        w->vec = pg_xmalloc(sizeof(float) * (size_t)w->base.cols);
        pg_dequantize_row(parts[0].dtype, parts[0].data, w->vec, w->base.cols);
        w->base.dtype = PG_DTYPE_F32;
        w->base.bytes = sizeof(float) * (size_t)w->base.cols;
    }
    *out = &w->base;
    return 0;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// The device generator of kernels/cuda/backend_cuda.cu, element for element
// (Box-Muller on 2 x 24 bits of splitmix64(key ^ splitmix64(i))), stored as
// bf16 like the GPU's weights.
static int cpu_weight_random(pg_backend *b, const pg_rand_window *win, int n_win, uint64_t key, float std,
                             float fill, pg_bweight **out) {
    int64_t rows;
    PG_TRY(pg_rand_windows_rows(win, n_win, "cpu", &rows));
    const int64_t cols = win[0].cols;
    const int64_t n = rows * cols;
    uint16_t *data = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
    if (!data) return pg_err_set(PG_ENOMEM, "cpu: cannot allocate %lldx%lld random weights",
                                 (long long)rows, (long long)cols);
    uint16_t *o = data;
    for (int p = 0; p < n_win; p++)
        for (int64_t i = 0; i < win[p].rows; i++)
            for (int64_t j = 0; j < cols; j++) {
                const uint64_t e = (uint64_t)((win[p].row0 + i) * win[p].full_cols + win[p].col0 + j);
                float v = fill;
                if (std > 0) {
                    uint64_t r = splitmix64(key ^ splitmix64(e));
                    float u1 = ((float)(r >> 40) + 1.0f) * (1.0f / 16777216.0f);
                    float u2 = (float)(r & 0xffffffu) * (1.0f / 16777216.0f);
                    v = sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2) * std;
                }
                uint32_t bits;
                memcpy(&bits, &v, 4);
                bits += 0x7fffu + ((bits >> 16) & 1u); // round to nearest even (finite values)
                *o++ = (uint16_t)(bits >> 16);
            }
    pg_weight w = {.data = data, .dtype = PG_DTYPE_BF16, .rows = rows, .cols = cols,
                   .row_bytes = (size_t)cols * 2};
    int rc = cpu_weight_upload(b, &w, 1, out);
    if (rc < 0) {
        free(data);
        return rc;
    }
    cpu_weight *cwt = (cpu_weight *)*out;
    if (cwt->vec) free(data); // copied to f32
    else cwt->owned = data;
    return 0;
}

static int cpu_vector_f32(pg_backend *b, const float *v, int64_t n, pg_bweight **out) {
    pg_weight p = {.data = v, .dtype = PG_DTYPE_F32, .rows = 1, .cols = n, .row_bytes = sizeof(float) * (size_t)n};
    return cpu_weight_upload(b, &p, 1, out);
}

static void cpu_weight_free(pg_backend *b, pg_bweight *bw) {
    (void)b;
    if (!bw) return;
    cpu_weight *w = (cpu_weight *)bw;
    if (!w->offloaded) free(w->vec);
    free(w->owned);
    free(w);
}

// --- weight offload ---------------------------------------------------------------
// The pack of a weight: each part's rows, then its row scales (FP8), each
// 64-byte aligned; a vector is its f32 values. The CPU's "device" is host
// memory, so offload here saves nothing: it runs the model's slot logic
// (which layer is in which slot when) on the reference backend.

#define PACK_ALIGN 64
static size_t pack_align(size_t n) { return (n + PACK_ALIGN - 1) & ~(size_t)(PACK_ALIGN - 1); }

static size_t cpu_weight_pack_bytes(pg_backend *b, const pg_bweight *bw) {
    (void)b;
    const cpu_weight *w = cw(bw);
    if (w->vec) return pack_align(sizeof(float) * (size_t)w->base.cols);
    size_t n = 0;
    for (int i = 0; i < w->n_parts; i++) {
        n += pack_align(w->parts[i].row_bytes * (size_t)w->parts[i].rows);
        if (w->parts[i].scales) n += pack_align(sizeof(float) * (size_t)w->parts[i].rows);
    }
    return n;
}

// Points w's parts (or vector) at the pack at `base` (host copy or slot).
static void pack_point(cpu_weight *w, char *base) {
    if (w->vec) {
        w->vec = (float *)base;
        return;
    }
    for (int i = 0; i < w->n_parts; i++) {
        pg_weight *p = &w->parts[i];
        p->data = base;
        base += pack_align(p->row_bytes * (size_t)p->rows);
        if (p->scales) {
            p->scales = (const float *)base;
            base += pack_align(sizeof(float) * (size_t)p->rows);
        }
    }
}

static int cpu_weight_offload(pg_backend *b, pg_bweight *bw, void *host) {
    (void)b;
    cpu_weight *w = (cpu_weight *)bw;
    PG_ARG(!w->offloaded, "cpu: weight offloaded twice");
    char *o = host;
    if (w->vec) {
        memcpy(o, w->vec, sizeof(float) * (size_t)w->base.cols);
        free(w->vec);
    } else {
        for (int i = 0; i < w->n_parts; i++) {
            const pg_weight *p = &w->parts[i];
            memcpy(o, p->data, p->row_bytes * (size_t)p->rows);
            o += pack_align(p->row_bytes * (size_t)p->rows);
            if (p->scales) {
                memcpy(o, p->scales, sizeof(float) * (size_t)p->rows);
                o += pack_align(sizeof(float) * (size_t)p->rows);
            }
        }
    }
    free(w->owned); // weight_random's values: now in the host copy
    w->owned = NULL;
    pack_point(w, host); // until weight_point: nothing dangles
    w->offloaded = true;
    w->base.bytes = 0;
    return 0;
}

static int cpu_weight_point(pg_backend *b, pg_bweight *bw, void *dst) {
    (void)b;
    cpu_weight *w = (cpu_weight *)bw;
    PG_ARG(w->offloaded, "cpu: weight_point on a weight that is not offloaded");
    pack_point(w, dst);
    return 0;
}

static int cpu_stream_in(pg_backend *b, void *dst, const void *src_host, size_t bytes, int slot) {
    (void)b, (void)slot;
    if (bytes) memcpy(dst, src_host, bytes);
    return 0;
}

// --- KV cache ---------------------------------------------------------------------

// Bytes of one block of one layer's K (or V) in the CPU's types (f32
// native); 0 for a type the CPU does not store.
static size_t layer_block_bytes(pg_kv_shape s) { return pg_kv_layer_block_bytes(s, true); }

static size_t cpu_kv_block_bytes(pg_backend *b, int32_t n_layers, pg_kv_shape s) {
    (void)b;
    return pg_kv_block_bytes(n_layers, s, true);
}

static void cpu_kv_free(pg_backend *b, pg_bkv *kv) {
    (void)b;
    if (!kv) return;
    for (int32_t l = 0; l < 2 * kv->n_layers; l++) { // device blocks, then host blocks
        free(kv->k[l]);
        free(kv->v[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv);
}

static int cpu_kv_create(pg_backend *b, int32_t n_layers, pg_kv_shape s, int32_t n_host_blocks,
                         pg_bkv **out) {
    *out = NULL;
    PG_ARG(n_layers > 0 && s.n_blocks > 0 && s.block_size > 0 && n_host_blocks >= 0,
           "cpu KV cache: %d layers, %d blocks", n_layers, s.n_blocks);
    if (s.dtype == PG_KV_Q8_0 && s.head_dim % PG_KV_Q8_0_ELEMS)
        return pg_err_set(PG_EUNSUPP, "cpu KV cache: q8_0 needs head_dim a multiple of %d, the model's is %d",
                          PG_KV_Q8_0_ELEMS, s.head_dim);
    if (layer_block_bytes(s) == 0)
        return pg_err_set(PG_EINVAL, "cpu KV cache: element type %d is not known", s.dtype);
    pg_bkv *kv = pg_xcalloc(1, sizeof *kv);
    kv->shape = s;
    kv->n_layers = n_layers;
    kv->n_host_blocks = n_host_blocks;
    // k[0..L) device blocks, k[L..2L) host blocks (the same for v).
    kv->k = pg_xcalloc(2 * (size_t)n_layers, sizeof(void *));
    kv->v = pg_xcalloc(2 * (size_t)n_layers, sizeof(void *));
    const size_t n = (size_t)s.n_blocks * layer_block_bytes(s), nh = (size_t)n_host_blocks * layer_block_bytes(s);
    for (int32_t l = 0; l < n_layers; l++) {
        // calloc: untouched pages cost nothing until blocks are used.
        kv->k[l] = calloc(n, 1);
        kv->v[l] = calloc(n, 1);
        if (nh) {
            kv->k[n_layers + l] = calloc(nh, 1);
            kv->v[n_layers + l] = calloc(nh, 1);
        }
        if (!kv->k[l] || !kv->v[l] || (nh && (!kv->k[n_layers + l] || !kv->v[n_layers + l]))) {
            cpu_kv_free(b, kv);
            return pg_err_set(PG_ENOMEM, "KV cache: cannot allocate %d blocks (%zu MiB)", s.n_blocks,
                              cpu_kv_block_bytes(b, n_layers, s) * (size_t)s.n_blocks >> 20);
        }
    }
    kv->bytes = cpu_kv_block_bytes(b, n_layers, s) * (size_t)s.n_blocks;
    kv->host_bytes = cpu_kv_block_bytes(b, n_layers, s) * (size_t)n_host_blocks;
    *out = kv;
    return 0;
}

// Whole blocks as bytes: every element type (q8_0's scales included) is
// moved unchanged.
static void move_blocks(pg_bkv *kv, void **dst, void **src, const int32_t *pairs, int32_t n) {
    const size_t bb = layer_block_bytes(kv->shape);
    for (int32_t l = 0; l < kv->n_layers; l++)
        for (int32_t i = 0; i < n; i++)
            memcpy((char *)dst[l] + (size_t)pairs[2 * i + 1] * bb, (const char *)src[l] + (size_t)pairs[2 * i] * bb,
                   bb);
}

static int cpu_kv_swap(pg_backend *b, pg_bkv *kv, const int32_t *pairs, int32_t n, bool to_host) {
    (void)b;
    PG_ARG(n == 0 || kv->n_host_blocks > 0, "cpu KV cache: swap without swap space");
    void **dk = kv->k, **dv = kv->v, **hk = kv->k + kv->n_layers, **hv = kv->v + kv->n_layers;
    if (to_host) {
        move_blocks(kv, hk, dk, pairs, n);
        move_blocks(kv, hv, dv, pairs, n);
    } else {
        move_blocks(kv, dk, hk, pairs, n);
        move_blocks(kv, dv, hv, pairs, n);
    }
    return 0;
}

static int cpu_kv_copy(pg_backend *b, pg_bkv *kv, const int32_t *pairs, int32_t n) {
    (void)b;
    move_blocks(kv, kv->k, kv->k, pairs, n);
    move_blocks(kv, kv->v, kv->v, pairs, n);
    return 0;
}

// --- graphs and workspaces --------------------------------------------------------

static int cpu_no_graph(pg_backend *b) {
    (void)b;
    return pg_err_set(PG_EUNSUPP, "the CPU backend has no graphs");
}
static int cpu_graph_end(pg_backend *b, void **g) {
    *g = NULL;
    return cpu_no_graph(b);
}
static int cpu_graph_launch(pg_backend *b, void *g) {
    (void)g;
    return cpu_no_graph(b);
}
static void cpu_graph_free(pg_backend *b, void *g) {
    (void)b, (void)g;
}
static size_t cpu_attn_ws(pg_backend *b, int32_t s, int32_t h, int32_t kvh, int32_t hd, int32_t len) {
    (void)b, (void)s, (void)h, (void)kvh, (void)hd, (void)len;
    return 0;
}
static size_t cpu_sample_ws(pg_backend *b, int32_t s, int32_t v) {
    (void)b, (void)s, (void)v;
    return 0;
}

// --- layer ops --------------------------------------------------------------------

#define F32(t) ((float *)(t).data)

static int check_rows(pg_tensor t, const char *what) {
    PG_ARG(t.dtype == PG_DTYPE_F32 && (t.rows <= 1 || t.stride == t.cols),
           "cpu %s: needs contiguous f32 rows", what);
    return 0;
}

static int cpu_argmax_rows(pg_backend *b, pg_argmax *out, pg_tensor x) {
    (void)b;
    PG_ARG(x.dtype == PG_DTYPE_F32 && x.cols > 0, "cpu argmax_rows: f32 rows");
    for (int64_t i = 0; i < x.rows; i++) {
        const float *row = F32(x) + i * x.stride;
        pg_argmax best = {row[0], 0};
        for (int64_t j = 1; j < x.cols; j++)
            if (row[j] > best.value) best = (pg_argmax){row[j], (int32_t)j};
        out[i] = best;
    }
    return 0;
}

static int cpu_argmax_pick(pg_backend *b, pg_sample_out *out, const pg_argmax *cand, int32_t n_ranks, int32_t n,
                           int32_t ids_per_rank) {
    (void)b;
    for (int32_t i = 0; i < n; i++) {
        int32_t best = 0;
        for (int32_t r = 1; r < n_ranks; r++)
            if (cand[(size_t)r * n + i].value > cand[(size_t)best * n + i].value) best = r;
        memset(&out[i], 0, sizeof out[i]);
        out[i].token = best * ids_per_rank + cand[(size_t)best * n + i].index;
    }
    return 0;
}

// The sampler's candidate order (kernels/cpu/sampling.c cmp_desc): larger
// scaled value, then lower column.
static bool topk_before(float s, int64_t j, float bs, int64_t bj) { return s > bs || (s == bs && j < bj); }

static int cpu_topk_rows(pg_backend *b, pg_argmax *out, pg_tensor x, int32_t k, const pg_argmax *cand,
                         int32_t n_ranks, const pg_sample_params *params, int32_t col0) {
    (void)b;
    PG_ARG(x.dtype == PG_DTYPE_F32 && x.cols > 0, "cpu topk_rows: f32 rows");
    PG_ARG(k >= 1 && k <= PG_TOPK_EXCHANGE_MAX && n_ranks >= 1, "cpu topk_rows: k %d, %d ranks", k, n_ranks);
    float *sc = pg_xmalloc(sizeof(float) * (size_t)x.cols);
    for (int64_t i = 0; i < x.rows; i++) {
        const float *row = F32(x) + i * x.stride;
        float mx = cand[i].value;
        for (int32_t r = 1; r < n_ranks; r++)
            if (cand[(size_t)r * (size_t)x.rows + (size_t)i].value > mx) mx = cand[(size_t)r * (size_t)x.rows + (size_t)i].value;
        const pg_sample_params *p = &params[i];
        const float inv_t = p->temperature <= 0.0f || p->top_k == 1 ? 1.0f : 1.0f / p->temperature;
        for (int64_t j = 0; j < x.cols; j++) {
            float s = (row[j] - mx) * inv_t;
            sc[j] = s != s ? -INFINITY : s == 0.0f ? 0.0f : s; // NaN last; -0 ties +0
        }
        // k passes, each the best entry after the previous one: k is small.
        pg_argmax *o = out + i * k;
        float ps = INFINITY;
        int64_t pj = -1;
        for (int32_t t = 0; t < k; t++) {
            float bs = -INFINITY;
            int64_t bj = -1;
            for (int64_t j = 0; j < x.cols; j++) {
                if (pj >= 0 && !topk_before(ps, pj, sc[j], j)) continue; // not after the previous pick
                if (bj < 0 || topk_before(sc[j], j, bs, bj)) bs = sc[j], bj = j;
            }
            if (bj < 0) {
                for (; t < k; t++) o[t] = (pg_argmax){-INFINITY, -1};
                break;
            }
            o[t] = (pg_argmax){row[bj], (int32_t)(col0 + bj)};
            ps = bs, pj = bj;
        }
    }
    free(sc);
    return 0;
}

static int cpu_topk_scatter(pg_backend *b, pg_tensor logits, const pg_argmax *cand, int32_t n_ranks, int32_t k) {
    (void)b;
    PG_ARG(logits.dtype == PG_DTYPE_F32, "cpu topk_scatter: f32 rows");
    const int64_t n = logits.rows;
    for (int64_t i = 0; i < n; i++) {
        float *row = F32(logits) + i * logits.stride;
        for (int64_t j = 0; j < logits.cols; j++) row[j] = -INFINITY;
        for (int32_t r = 0; r < n_ranks; r++)
            for (int32_t t = 0; t < k; t++) {
                const pg_argmax c = cand[((size_t)r * (size_t)n + (size_t)i) * (size_t)k + (size_t)t];
                if (c.index >= 0 && c.index < logits.cols) row[c.index] = c.value;
            }
    }
    return 0;
}

static int cpu_embed(pg_backend *b, pg_tensor out, const int32_t *ids, const pg_bweight *table, int32_t id0) {
    (void)b;
    const pg_weight *e = &cw(table)->parts[0];
    for (int64_t i = 0; i < out.rows; i++) {
        float *o = F32(out) + i * out.stride;
        const int64_t id = (int64_t)ids[i] - id0;
        if (id < 0 || id >= e->rows)
            memset(o, 0, sizeof(float) * (size_t)e->cols);
        else
            pg_dequantize_row(e->dtype, (const char *)e->data + (size_t)id * e->row_bytes, o, e->cols);
    }
    return 0;
}

static int cpu_copy_view(pg_backend *b, pg_tensor dst, pg_tensor src) {
    (void)b;
    PG_ARG(dst.rows == src.rows && dst.cols == src.cols && dst.dtype == src.dtype && dst.dtype == PG_DTYPE_F32,
           "cpu copy: %lldx%lld into %lldx%lld", (long long)src.rows, (long long)src.cols, (long long)dst.rows,
           (long long)dst.cols);
    for (int64_t i = 0; i < src.rows; i++)
        memcpy(F32(dst) + i * dst.stride, F32(src) + i * src.stride, sizeof(float) * (size_t)src.cols);
    return 0;
}

static int cpu_gather(pg_backend *b, pg_tensor out, pg_tensor x, const int32_t *rows) {
    (void)b;
    for (int64_t i = 0; i < out.rows; i++)
        memcpy(F32(out) + i * out.stride, F32(x) + (int64_t)rows[i] * x.stride,
               sizeof(float) * (size_t)x.cols);
    return 0;
}

static int cpu_rmsnorm_op(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *w, float eps) {
    PG_TRY(check_rows(out, "rmsnorm"));
    PG_TRY(check_rows(x, "rmsnorm"));
    pg_cpu_rmsnorm(pg_cpu(b), F32(out), F32(x), cw(w)->vec, x.rows, x.cols, eps);
    return 0;
}

// Part by part into column ranges (cpu_backend.h).
void pg_cpu_matmul_weight(pg_cpu_ctx *c, float *out, int64_t ldo, const float *x, int64_t m,
                          const pg_bweight *bw) {
    const cpu_weight *w = cw(bw);
    int64_t off = 0;
    for (int i = 0; i < w->n_parts; i++) {
        pg_cpu_matmul(c, out + off, ldo, x, m, &w->parts[i]);
        off += w->parts[i].rows;
    }
}

const float *pg_cpu_weight_vec(const pg_bweight *w) { return cw(w)->vec; }

static int cpu_linear(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *norm, float eps,
                      const pg_bweight *w, const pg_bweight *bias, bool accumulate, pg_tensor scratch) {
    pg_cpu_ctx *c = pg_cpu(b);
    const int64_t m = x.rows;
    PG_ARG(!(norm && accumulate), "cpu linear: a norm and accumulate in one call");
    PG_TRY(check_rows(x, "linear"));
    PG_ARG(out.dtype == PG_DTYPE_F32 && out.cols >= w->rows, "cpu linear: output view");
    const float *src = F32(x);
    if (norm) {
        pg_cpu_rmsnorm(c, F32(scratch), F32(x), cw(norm)->vec, m, x.cols, eps);
        src = F32(scratch);
    }
    if (accumulate) {
        // The product goes to scratch, then into the residual stream.
        pg_cpu_matmul_weight(c, F32(scratch), w->rows, src, m, w);
        for (int64_t i = 0; i < m; i++) {
            float *o = F32(out) + i * out.stride;
            const float *p = F32(scratch) + i * w->rows;
            for (int64_t j = 0; j < w->rows; j++) o[j] += p[j];
        }
    } else {
        pg_cpu_matmul_weight(c, F32(out), out.stride, src, m, w);
    }
    if (bias)
        for (int64_t i = 0; i < m; i++) {
            float *o = F32(out) + i * out.stride;
            for (int64_t j = 0; j < w->rows; j++) o[j] += cw(bias)->vec[j];
        }
    return 0;
}

static int cpu_silu_mul(pg_backend *b, pg_tensor h, pg_tensor gu) {
    PG_TRY(check_rows(h, "silu_mul"));
    PG_TRY(check_rows(gu, "silu_mul"));
    PG_ARG(gu.rows == h.rows && gu.cols == 2 * h.cols, "cpu silu_mul: %lldx%lld from %lldx%lld",
           (long long)h.rows, (long long)h.cols, (long long)gu.rows, (long long)gu.cols);
    pg_cpu_silu_mul(pg_cpu(b), F32(h), F32(gu), h.rows, h.cols);
    return 0;
}

static int cpu_gate_up_silu(pg_backend *b, pg_tensor h, pg_tensor x, const pg_bweight *norm, float eps,
                            const pg_bweight *w, pg_tensor sxn, pg_tensor sgu) {
    pg_cpu_ctx *c = pg_cpu(b);
    const int64_t m = x.rows, ffn = w->rows / 2;
    PG_TRY(check_rows(x, "gate_up_silu"));
    PG_TRY(check_rows(h, "gate_up_silu"));
    pg_cpu_rmsnorm(c, F32(sxn), F32(x), cw(norm)->vec, m, x.cols, eps);
    pg_cpu_matmul_weight(c, F32(sgu), w->rows, F32(sxn), m, w);
    pg_cpu_silu_mul(c, F32(h), F32(sgu), m, ffn);
    return 0;
}

static int cpu_head_rmsnorm(pg_backend *b, pg_tensor x, int32_t n_heads, const pg_bweight *w, float eps) {
    const int64_t hd = w->cols;
    PG_ARG(x.dtype == PG_DTYPE_F32 && x.cols == n_heads * hd, "cpu head_rmsnorm: view");
    for (int64_t i = 0; i < x.rows; i++) {
        float *row = F32(x) + i * x.stride;
        pg_cpu_rmsnorm(pg_cpu(b), row, row, cw(w)->vec, n_heads, hd, eps);
    }
    return 0;
}

static int cpu_rope_kv_write(pg_backend *b, pg_tensor q, pg_tensor k, pg_tensor v, const int32_t *pos,
                             const int32_t *slots, int32_t n_heads, const pg_bweight *inv_freq,
                             void *k_cache, void *v_cache, pg_kv_shape s) {
    pg_cpu_rope_kv_write(pg_cpu(b), F32(q), q.stride, F32(k), k.stride, F32(v), v.stride, pos, slots,
                         q.rows, n_heads, cw(inv_freq)->vec, k_cache, v_cache, s);
    return 0;
}

static int cpu_attention_softcap(pg_backend *b, pg_tensor out, pg_tensor q, const pg_attn_batch *ab,
                                 const void *k_cache, const void *v_cache, pg_kv_shape s, int32_t n_heads,
                                 float scale, int32_t window, float softcap) {
    PG_TRY(check_rows(out, "attention"));
    pg_attn_seq stack[64];
    pg_attn_seq *seqs = ab->n_seqs <= 64 ? stack : pg_xmalloc(sizeof(pg_attn_seq) * (size_t)ab->n_seqs);
    for (int32_t i = 0; i < ab->n_seqs; i++) {
        const int32_t *bt = ab->block_tables + (int64_t)i * ab->bt_stride;
        if (i < ab->n_decode) {
            seqs[i] = (pg_attn_seq){i, 1, ab->start_pos[i], bt, window, softcap};
        } else {
            const int32_t p = i - ab->n_decode;
            seqs[i] = (pg_attn_seq){ab->n_decode + ab->cu_q[p], ab->cu_q[p + 1] - ab->cu_q[p],
                                    ab->start_pos[i], bt, window, softcap};
        }
    }
    pg_cpu_attention(pg_cpu(b), F32(out), F32(q), q.stride, seqs, ab->n_seqs, n_heads, scale,
                     k_cache, v_cache, s);
    if (seqs != stack) free(seqs);
    return 0;
}

static int cpu_attention(pg_backend *b, pg_tensor out, pg_tensor q, const pg_attn_batch *ab,
                         const void *k_cache, const void *v_cache, pg_kv_shape s, int32_t n_heads,
                         float scale, int32_t window) {
    return cpu_attention_softcap(b, out, q, ab, k_cache, v_cache, s, n_heads, scale, window, 0.0f);
}

static int cpu_sample(pg_backend *b, pg_sample_out *out, pg_tensor logits, const pg_sample_params *params,
                      const int32_t *tokens, void *ws, size_t ws_bytes) {
    (void)ws, (void)ws_bytes;
    pg_cpu_ctx *c = pg_cpu(b);
    const int32_t vocab = (int32_t)logits.cols;
    if (c->sampler && pg_sampler_vocab(c->sampler) != vocab) {
        pg_sampler_free(c->sampler);
        c->sampler = NULL;
    }
    if (!c->sampler) PG_TRY(pg_sampler_create(vocab, &c->sampler));
    if (c->sample_cap < vocab) {
        free(c->sample_row);
        c->sample_row = pg_xmalloc(sizeof(float) * (size_t)vocab);
        c->sample_cap = vocab;
    }
    // The sampler works in place on a copy: the logits stay as computed.
    for (int64_t i = 0; i < logits.rows; i++) {
        memcpy(c->sample_row, F32(logits) + i * logits.stride, sizeof(float) * (size_t)vocab);
        pg_sampler_sample(c->sampler, &params[i], tokens, c->sample_row, &out[i]);
    }
    return 0;
}

static int cpu_feed_tokens(pg_backend *b, int32_t *tokens, const pg_sample_out *prev,
                           const int32_t *pairs, int32_t n) {
    (void)b;
    for (int32_t i = 0; i < n; i++) tokens[pairs[2 * i]] = prev[pairs[2 * i + 1]].token;
    return 0;
}

static int cpu_read_f32(pg_backend *b, pg_tensor t, int64_t n, float *out) {
    (void)b;
    PG_ARG(t.dtype == PG_DTYPE_F32 && n <= t.rows, "cpu read: %lld rows of %lld", (long long)n,
           (long long)t.rows);
    for (int64_t i = 0; i < n; i++)
        memcpy(out + i * t.cols, F32(t) + i * t.stride, sizeof(float) * (size_t)t.cols);
    return 0;
}

// --- life cycle -------------------------------------------------------------------

static void cpu_destroy(pg_backend *b) {
    if (!b) return;
    pg_cpu_ctx *c = b->ctx;
    if (c) {
        for (int t = 0; t < c->n_threads; t++) free(c->scratch[t]);
        free(c->scratch);
        free(c->scratch_cap);
        free(c->xq_mem);
        free(c->sample_row);
        free(c->prof_t);
        pg_sampler_free(c->sampler);
        pg_pool_destroy(c->pool);
        free(c);
    }
    free(b);
}

// --- the three tables (kernels/backend.h) ---------------------------------------

static const pg_backend_dev cpu_dev = {
    .destroy = cpu_destroy,
    .bind_thread = cpu_bind_thread,
    .describe = cpu_describe,
    .mem_info = cpu_mem_info,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .host_alloc = cpu_alloc,
    .host_free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .record = cpu_nop_slot,
    .wait = cpu_nop_slot,
    .sync = cpu_sync,
    .graph_begin = cpu_no_graph,
    .graph_end = cpu_graph_end,
    .graph_launch = cpu_graph_launch,
    .graph_free = cpu_graph_free,
    .timer_mark = cpu_timer_mark,
    .timer_read = cpu_timer_read,
};

static const pg_backend_store cpu_store = {
    .runs_in_place = cpu_runs_in_place,
    .weight_upload = cpu_weight_upload,
    .weight_random = cpu_weight_random,
    .vector_f32 = cpu_vector_f32,
    .weight_free = cpu_weight_free,
    .weight_pack_bytes = cpu_weight_pack_bytes,
    .weight_offload = cpu_weight_offload,
    .weight_point = cpu_weight_point,
    .stream_in = cpu_stream_in,
    .stream_in_wait = cpu_nop_slot,
    .kv_block_bytes = cpu_kv_block_bytes,
    .kv_create = cpu_kv_create,
    .kv_free = cpu_kv_free,
    .kv_swap = cpu_kv_swap,
    .kv_copy = cpu_kv_copy,
};

static const pg_backend_ops cpu_ops = {
    .attn_workspace_bytes = cpu_attn_ws,
    .sample_workspace_bytes = cpu_sample_ws,
    .embed = cpu_embed,
    .copy = cpu_copy_view,
    .gather = cpu_gather,
    .rmsnorm = cpu_rmsnorm_op,
    .linear = cpu_linear,
    .gate_up_silu = cpu_gate_up_silu,
    .silu_mul = cpu_silu_mul,
    .gate_up_gelu = pg_cpu_gate_up_gelu,
    .rmsnorm_add = pg_cpu_rmsnorm_add,
    .scale = pg_cpu_scale,
    .softcap = pg_cpu_softcap,
    .attention_softcap = cpu_attention_softcap,
    .moe_ffn = pg_cpu_moe_ffn,
    .moe_workspace_bytes = pg_cpu_moe_workspace_bytes,
    .lora_apply = pg_cpu_lora_apply,
    .lora_workspace_bytes = pg_cpu_lora_workspace_bytes,
    .lora_apply_dev = pg_cpu_lora_apply_dev,
    .lora_table_write = pg_cpu_lora_table_write,
    .head_rmsnorm = cpu_head_rmsnorm,
    .rope_kv_write = cpu_rope_kv_write,
    .attention = cpu_attention,
    .sample = cpu_sample,
    .argmax_rows = cpu_argmax_rows,
    .argmax_pick = cpu_argmax_pick,
    .topk_rows = cpu_topk_rows,
    .topk_scatter = cpu_topk_scatter,
    .feed_tokens = cpu_feed_tokens,
    .read_f32 = cpu_read_f32,
};

int pg_backend_cpu_create(int n_threads, pg_matmul_mode mode, pg_backend **out) {
    *out = NULL;
    pg_cpu_ctx *c = pg_xcalloc(1, sizeof *c);
    int rc = pg_pool_create(n_threads, &c->pool);
    if (rc < 0) {
        free(c);
        return rc;
    }
    c->n_threads = pg_pool_threads(c->pool);
    c->mode = mode;
    c->scratch = pg_xcalloc((size_t)c->n_threads, sizeof(float *));
    c->scratch_cap = pg_xcalloc((size_t)c->n_threads, sizeof(size_t));
    openblas_set_num_threads(1);
    pg_backend *b = pg_xcalloc(1, sizeof *b);
    *b = (pg_backend){
        .name = "cpu",
        .ctx = c,
        .caps = &CPU_CAPS,
        .dev = &cpu_dev,
        .store = &cpu_store,
        .ops = &cpu_ops,
    };
    *out = b;
    return 0;
}
