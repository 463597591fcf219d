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
