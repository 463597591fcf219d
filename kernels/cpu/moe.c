// kernels/cpu/moe.c - the mixture-of-experts feed-forward on the CPU
// (kernels/backend.h moe_ffn), the reference for the GPU's grouped product.
//
// Laid out the way a GPU does it (vLLM's moe_align): route every row, sort
// the (row, expert) pairs by expert, then per expert that has rows: gather
// them, one gate|up product over them, SiLU * up, one down product, and add
// each row's result times its weight into an f32 accumulator. A product
// over a gathered block of rows is the same pg_cpu_matmul_weight that
// linear uses (threaded over the weight's rows, any stored type), so an
// expert is read once per step however many rows chose it, and experts no
// row chose cost nothing. Experts run in ascending id order and the
// accumulator adds a row's experts in that order: the result does not
// depend on the thread count. Routing and the scatter-add are serial:
// O(rows * (n_experts + top_k * hidden)), nothing beside the products.
//
// Expert parallelism (docs/moe.md): an expert whose gate_up and down are
// NULL is not on this rank. Routing is unchanged (every expert competes,
// the weights are the full top-k's), the pairs that chose it are skipped,
// so each rank adds its own experts' share and the all-reduce sums them.
#include <math.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu_backend.h"

// The workspace, carved in this order, each piece 64-byte aligned.
typedef struct {
    float *xn;      // [m][hidden] normalised rows
    float *acc;     // [m][hidden] the sum over a row's experts (out may be x)
    float *probs;   // [m][n_experts] router softmax
    int32_t *sel;   // [m][top_k] chosen experts, best first
    float *sel_w;   // [m][top_k] their weights
    int32_t *start; // [n_experts + 1] first pair of each expert in the sorted order
    int32_t *fill;  // [n_experts] the counting sort's cursors
    int32_t *pair;  // [m * top_k] sorted pairs: row * top_k + slot
    float *xg;      // [m][hidden] an expert's gathered rows, then its down product
    float *gu;      // [m][2 ffn] gate | up
    float *h;       // [m][ffn] silu(gate) * up
} moe_ws;

// Carves (or, with base NULL, only sizes: pieces NULL) the workspace; returns its bytes.
static size_t moe_ws_carve(moe_ws *w, char *base, int64_t m, int64_t hidden, int64_t ffn, int64_t n_exp,
                           int64_t k) {
    size_t off = 0;
    w->xn = pg_cpu_ws_piece(base, &off, sizeof *w->xn, m * hidden);
    w->acc = pg_cpu_ws_piece(base, &off, sizeof *w->acc, m * hidden);
    w->probs = pg_cpu_ws_piece(base, &off, sizeof *w->probs, m * n_exp);
    w->sel = pg_cpu_ws_piece(base, &off, sizeof *w->sel, m * k);
    w->sel_w = pg_cpu_ws_piece(base, &off, sizeof *w->sel_w, m * k);
    w->start = pg_cpu_ws_piece(base, &off, sizeof *w->start, n_exp + 1);
    w->fill = pg_cpu_ws_piece(base, &off, sizeof *w->fill, n_exp);
    w->pair = pg_cpu_ws_piece(base, &off, sizeof *w->pair, m * k);
    w->xg = pg_cpu_ws_piece(base, &off, sizeof *w->xg, m * hidden);
    w->gu = pg_cpu_ws_piece(base, &off, sizeof *w->gu, m * 2 * ffn);
    w->h = pg_cpu_ws_piece(base, &off, sizeof *w->h, m * ffn);
    return off;
}

size_t pg_cpu_moe_workspace_bytes(pg_backend *b, int32_t max_rows, int32_t hidden, int32_t ffn,
                                  int32_t n_experts, int32_t top_k) {
    (void)b;
    return moe_ws_carve(&(moe_ws){0}, NULL, max_rows, hidden, ffn, n_experts, top_k);
}

// probs[0:n] = softmax(logits[0:n]) in place (max subtracted; f32, libm exp).
static void softmax_row(float *p, int64_t n) {
    float mx = p[0];
    for (int64_t e = 1; e < n; e++) mx = p[e] > mx ? p[e] : mx;
    float sum = 0.0f;
    for (int64_t e = 0; e < n; e++) sum += p[e] = expf(p[e] - mx);
    const float inv = 1.0f / sum;
    for (int64_t e = 0; e < n; e++) p[e] *= inv;
}

// sel[0:k] = the k experts of largest p, best first, ties to the lower id
// (an insertion into a sorted list of k: k and n_experts are small);
// sel_w their weights, renormalised to sum 1 when `renorm`.
static void route_row(const float *p, int32_t n_exp, int32_t k, bool renorm, int32_t *sel, float *sel_w) {
    int32_t n = 0;
    for (int32_t e = 0; e < n_exp; e++) {
        // Strictly greater moves ahead: an equal p keeps the earlier, lower id first.
        int32_t at = n;
        while (at > 0 && p[e] > p[sel[at - 1]]) at--;
        if (at >= k) continue;
        for (int32_t t = (n < k ? n : k - 1); t > at; t--) sel[t] = sel[t - 1];
        sel[at] = e;
        if (n < k) n++;
    }
    float sum = 0.0f;
    for (int32_t t = 0; t < k; t++) sum += p[sel[t]];
    const float inv = renorm ? 1.0f / sum : 1.0f;
    for (int32_t t = 0; t < k; t++) sel_w[t] = p[sel[t]] * inv;
}

static int check_weight(const pg_bweight *w, int64_t rows, int64_t cols, const char *what, int32_t e) {
    PG_ARG(w && w->rows == rows && w->cols == cols, "cpu moe_ffn: %s of expert %d is %lldx%lld, wants %lldx%lld",
           what, e, w ? (long long)w->rows : 0LL, w ? (long long)w->cols : 0LL, (long long)rows,
           (long long)cols);
    return 0;
}

int pg_cpu_moe_ffn(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *norm, float eps,
                   const pg_bweight *router, const pg_bweight *const *gate_up,
                   const pg_bweight *const *down, int32_t n_experts, int32_t top_k, bool renorm,
                   bool accumulate, void *workspace, size_t workspace_bytes) {
    pg_cpu_ctx *c = pg_cpu(b);
    const int64_t m = x.rows, hidden = x.cols;
    PG_ARG(x.dtype == PG_DTYPE_F32 && (m <= 1 || x.stride == hidden), "cpu moe_ffn: needs contiguous f32 rows");
    PG_ARG(out.dtype == PG_DTYPE_F32 && out.rows == m && out.cols == hidden,
           "cpu moe_ffn: output %lldx%lld for %lldx%lld rows", (long long)out.rows, (long long)out.cols,
           (long long)m, (long long)hidden);
    PG_ARG(n_experts >= 1 && top_k >= 1 && top_k <= n_experts, "cpu moe_ffn: top %d of %d experts", top_k,
           n_experts);
    PG_ARG(router && router->rows == n_experts && router->cols == hidden,
           "cpu moe_ffn: the router is not [%d experts][%lld]", n_experts, (long long)hidden);
    PG_ARG(down && gate_up, "cpu moe_ffn: no expert weights");
    int64_t ffn = 0; // the first expert held here gives the width (none held: nothing to add)
    for (int32_t e = 0; e < n_experts && !ffn; e++) ffn = down[e] ? down[e]->cols : 0;
    for (int32_t e = 0; e < n_experts; e++) {
        if (!gate_up[e] && !down[e]) continue; // not on this rank
        PG_TRY(check_weight(gate_up[e], 2 * ffn, hidden, "gate_up", e));
        PG_TRY(check_weight(down[e], hidden, ffn, "down", e));
    }
    if (m == 0) return 0;
    moe_ws w;
    const size_t need = moe_ws_carve(&w, NULL, m, hidden, ffn, n_experts, top_k);
    PG_ARG(workspace && workspace_bytes >= need, "cpu moe_ffn: workspace %zu bytes, %lld rows want %zu",
           workspace_bytes, (long long)m, need);
    moe_ws_carve(&w, workspace, m, hidden, ffn, n_experts, top_k);

    // Route: the router product over every row, then softmax and top-k.
    if (norm)
        pg_cpu_rmsnorm(c, w.xn, (const float *)x.data, pg_cpu_weight_vec(norm), m, hidden, eps);
    else
        memcpy(w.xn, x.data, sizeof(float) * (size_t)(m * hidden));
    pg_cpu_matmul_weight(c, w.probs, n_experts, w.xn, m, router);
    for (int64_t i = 0; i < m; i++) {
        softmax_row(w.probs + i * n_experts, n_experts);
        route_row(w.probs + i * n_experts, n_experts, top_k, renorm, w.sel + i * top_k, w.sel_w + i * top_k);
    }

    // Sort the pairs by expert (a counting sort: rows ascending within an expert).
    memset(w.start, 0, sizeof(int32_t) * (size_t)(n_experts + 1));
    for (int64_t q = 0; q < m * top_k; q++) w.start[w.sel[q] + 1]++;
    for (int32_t e = 0; e < n_experts; e++) w.start[e + 1] += w.start[e];
    memcpy(w.fill, w.start, sizeof(int32_t) * (size_t)n_experts);
    for (int64_t q = 0; q < m * top_k; q++) w.pair[w.fill[w.sel[q]]++] = (int32_t)q;

    // Per expert held here with rows: gather, gate|up, SiLU * up, down, weighted add.
    memset(w.acc, 0, sizeof(float) * (size_t)(m * hidden));
    for (int32_t e = 0; e < n_experts; e++) {
        const int32_t p0 = w.start[e], n = w.start[e + 1] - p0;
        if (n == 0 || !down[e]) continue; // no rows, or another rank's expert
        for (int32_t j = 0; j < n; j++)
            memcpy(w.xg + (int64_t)j * hidden, w.xn + (int64_t)(w.pair[p0 + j] / top_k) * hidden,
                   sizeof(float) * (size_t)hidden);
        pg_cpu_matmul_weight(c, w.gu, 2 * ffn, w.xg, n, gate_up[e]);
        pg_cpu_silu_mul(c, w.h, w.gu, n, ffn);
        pg_cpu_matmul_weight(c, w.xg, hidden, w.h, n, down[e]); // xg's rows are no longer needed
        for (int32_t j = 0; j < n; j++) {
            const int32_t q = w.pair[p0 + j];
            const float wt = w.sel_w[q];
            float *a = w.acc + (int64_t)(q / top_k) * hidden;
            const float *y = w.xg + (int64_t)j * hidden;
            for (int64_t d = 0; d < hidden; d++) a[d] += wt * y[d];
        }
    }

    // Last, so that out may be x.
    for (int64_t i = 0; i < m; i++) {
        float *o = (float *)out.data + i * out.stride;
        const float *a = w.acc + i * hidden;
        if (accumulate)
            for (int64_t d = 0; d < hidden; d++) o[d] += a[d];
        else
            memcpy(o, a, sizeof(float) * (size_t)hidden);
    }
    return 0;
}
