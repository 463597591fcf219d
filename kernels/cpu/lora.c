// kernels/cpu/lora.c - batched multi-adapter LoRA on the CPU (kernels/backend.h
// lora_apply), the reference for the GPU's SGMV/BGMV kernels (Punica).
//
// A step's rows each name an adapter slot (or none). Laid out the way a
// GPU does it: sort the rows by slot (a counting sort, rows ascending
// within a slot, as moe.c sorts pairs by expert), then per slot that has
// rows: gather them, one shrink product with A ([m][rank]), one expand
// product with B ([m][out]), and add scale times each result row into its
// output row. The products are the same pg_cpu_matmul_weight that linear
// and moe use (threaded over the weight's rows, any stored type), so an
// adapter is read once per step however many rows use it, and slots no row
// names cost nothing. Every output row gets at most one slot's addition,
// and each product's elements do not depend on how its weight rows were
// split among threads: the result is the same for any thread count.
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu_backend.h"

// The workspace, carved in this order, each piece 64-byte aligned.
typedef struct {
    int32_t *start; // [n_slots + 1] first sorted row of each slot
    int32_t *fill;  // [n_slots] the counting sort's cursors
    int32_t *order; // [m] rows sorted by slot
    float *xg;      // [m][in] a slot's gathered rows
    float *t;       // [m][max_rank] the shrink x . A^T
    float *y;       // [m][out] the expand t . B^T
} lora_ws;

// Carves (or, with base NULL, only sizes: pieces NULL) the workspace; returns its bytes.
static size_t lora_ws_carve(lora_ws *w, char *base, int64_t m, int64_t in, int64_t out, int64_t rank,
                            int64_t n_slots) {
    size_t off = 0;
    w->start = pg_cpu_ws_piece(base, &off, sizeof *w->start, n_slots + 1);
    w->fill = pg_cpu_ws_piece(base, &off, sizeof *w->fill, n_slots);
    w->order = pg_cpu_ws_piece(base, &off, sizeof *w->order, m);
    w->xg = pg_cpu_ws_piece(base, &off, sizeof *w->xg, m * in);
    w->t = pg_cpu_ws_piece(base, &off, sizeof *w->t, m * rank);
    w->y = pg_cpu_ws_piece(base, &off, sizeof *w->y, m * out);
    return off;
}

size_t pg_cpu_lora_workspace_bytes(pg_backend *b, int32_t max_rows, int32_t in_cols, int32_t out_cols,
                                   int32_t max_rank, int32_t n_slots) {
    (void)b;
    return lora_ws_carve(&(lora_ws){0}, NULL, max_rows, in_cols, out_cols, max_rank, n_slots);
}

// Sorts the rows that have work by slot; rows of slot -1 or of a slot
// without A are left out.
static void sort_rows(lora_ws *w, const int32_t *row_slot, const pg_lora_slot *slots, int64_t m,
                      int32_t n_slots) {
    memset(w->start, 0, sizeof(int32_t) * (size_t)(n_slots + 1));
    for (int64_t i = 0; i < m; i++)
        if (row_slot[i] >= 0 && slots[row_slot[i]].a) w->start[row_slot[i] + 1]++;
    for (int32_t s = 0; s < n_slots; s++) w->start[s + 1] += w->start[s];
    memcpy(w->fill, w->start, sizeof(int32_t) * (size_t)n_slots);
    for (int64_t i = 0; i < m; i++)
        if (row_slot[i] >= 0 && slots[row_slot[i]].a) w->order[w->fill[row_slot[i]]++] = (int32_t)i;
}

int pg_cpu_lora_apply(pg_backend *b, pg_tensor out, pg_tensor x, const int32_t *row_slot,
                      const pg_lora_slot *slots, int32_t n_slots, void *workspace, size_t workspace_bytes) {
    pg_cpu_ctx *c = pg_cpu(b);
    const int64_t m = x.rows, in = x.cols, oc = out.cols;
    PG_ARG(x.dtype == PG_DTYPE_F32 && out.dtype == PG_DTYPE_F32, "cpu lora_apply: needs f32 rows");
    int64_t max_rank;
    PG_TRY(pg_lora_check("cpu lora_apply", out, x, row_slot, slots, n_slots, &max_rank));
    if (m == 0 || max_rank == 0) return 0; // no row has an adapter here
    lora_ws w;
    const size_t need = lora_ws_carve(&w, NULL, m, in, oc, max_rank, n_slots);
    PG_ARG(workspace && workspace_bytes >= need, "cpu lora_apply: workspace %zu bytes, %lld rows want %zu",
           workspace_bytes, (long long)m, need);
    lora_ws_carve(&w, workspace, m, in, oc, max_rank, n_slots);
    sort_rows(&w, row_slot, slots, m, n_slots);

    for (int32_t s = 0; s < n_slots; s++) {
        const int32_t r0 = w.start[s], n = w.start[s + 1] - r0;
        if (n == 0) continue;
        const pg_lora_slot *sl = &slots[s];
        for (int32_t j = 0; j < n; j++)
            memcpy(w.xg + (int64_t)j * in, (const float *)x.data + (int64_t)w.order[r0 + j] * x.stride,
                   sizeof(float) * (size_t)in);
        const int64_t rank = sl->a->rows;
        pg_cpu_matmul_weight(c, w.t, rank, w.xg, n, sl->a); // shrink: [n][rank]
        pg_cpu_matmul_weight(c, w.y, oc, w.t, n, sl->b);    // expand: [n][out]
        for (int32_t j = 0; j < n; j++) {
            float *o = (float *)out.data + (int64_t)w.order[r0 + j] * out.stride;
            const float *y = w.y + (int64_t)j * oc;
            for (int64_t d = 0; d < oc; d++) o[d] += sl->scale * y[d];
        }
    }
    return 0;
}

// The graph-safe op's contract on the CPU (backend.h lora_apply_dev): the
// reference that the engine's dev-row paths (graph steps, and on the GPU
// PAGED_LORA_DEV_EAGER / PAGED_LORA_SPLIT) are checked against here. The
// table's entries hold the slot's pg_bweight pointers (this backend's
// addressing, so any type lora_apply takes runs); the op is the norm, then
// lora_apply over each projection's column range.
int pg_cpu_lora_table_write(pg_backend *b, pg_lora_dev_slot *dst, const pg_lora_slot *src, int64_t n) {
    (void)b;
    PG_ARG(n >= 0 && (n == 0 || (dst && src)), "cpu lora_table_write: %lld entries", (long long)n);
    for (int64_t i = 0; i < n; i++)
        dst[i] = (pg_lora_dev_slot){.a = src[i].a, .b = src[i].b, .rank = src[i].a ? (int32_t)src[i].a->rows : 0,
                                    .scale = src[i].scale};
    return 0;
}

int pg_cpu_lora_apply_dev(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *norm, float eps,
                          const int32_t *row_slot, const pg_lora_dev_slot *const *tables, int32_t n_slots,
                          const int64_t *cols, int32_t n_proj, int32_t max_rank, void *workspace,
                          size_t workspace_bytes) {
    PG_ARG(n_proj >= 1 && n_proj <= PG_LORA_DEV_MAX_PROJ && cols && tables && n_slots >= 1 && max_rank >= 1,
           "cpu lora_apply_dev: %d projections, %d slots, max rank %d", n_proj, n_slots, max_rank);
    PG_ARG(out.rows == x.rows && x.dtype == PG_DTYPE_F32, "cpu lora_apply_dev: %lld output rows for %lld f32 rows",
           (long long)out.rows, (long long)x.rows);
    int64_t total = 0;
    for (int32_t p = 0; p < n_proj; p++) total += cols[p];
    PG_ARG(total == out.cols, "cpu lora_apply_dev: the projections' %lld columns, out has %lld", (long long)total,
           (long long)out.cols);
    if (x.rows == 0) return 0;
    // The slots of one projection, then (with a norm: the fused base
    // product's) the normed rows after them.
    const size_t sb = sizeof(pg_lora_slot) * (size_t)n_slots;
    char *scratch = malloc(sb + (norm ? sizeof(float) * (size_t)(x.rows * x.cols) : 0));
    if (!scratch) return pg_err_set(PG_ENOMEM, "cpu lora_apply_dev: %lld rows of %lld", (long long)x.rows,
                                    (long long)x.cols);
    pg_lora_slot *slots = (pg_lora_slot *)scratch;
    pg_tensor xin = x;
    int rc = 0;
    if (norm) {
        xin = (pg_tensor){.data = scratch + sb, .dtype = PG_DTYPE_F32, .rows = x.rows, .cols = x.cols,
                          .stride = x.cols};
        rc = b->ops->rmsnorm(b, xin, x, norm, eps);
    }
    for (int32_t p = 0, c0 = 0; p < n_proj && rc == 0; c0 += (int)cols[p], p++) {
        for (int32_t s = 0; s < n_slots; s++)
            slots[s] = (pg_lora_slot){.a = tables[p][s].a, .b = tables[p][s].b, .scale = tables[p][s].scale};
        rc = pg_cpu_lora_apply(b, pg_tensor_view(out, 0, out.rows, c0, cols[p]), xin, row_slot, slots, n_slots,
                               workspace, workspace_bytes);
    }
    free(scratch);
    return rc;
}
