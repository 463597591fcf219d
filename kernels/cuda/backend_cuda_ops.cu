// kernels/cuda/backend_cuda_ops.cu - the CUDA backend's ops
// (kernels/backend.h pg_backend_ops): a step's compute as launches on the
// compute stream (GEMV or cuBLASLt, attention, the sampler).
#include <stddef.h>
#include <stdlib.h>

#include "kernels/cuda/backend_cuda_int.cuh"

// The decode kernel's split-K partials, after FlashInfer's plan image
// where its prefill is on (cu_attention_softcap carves it off the head).
static size_t cu_attn_ws(pg_backend *b, int32_t max_seqs, int32_t nh, int32_t nkv, int32_t hd, int32_t len) {
    return pg_cuda_decode_workspace_size(max_seqs, nh, nkv, hd, len) +
           (ctx_of(b)->fi_prefill ? pg_cuda_fi_prefill_ws_bytes(nh) : 0);
}

static size_t cu_sample_ws(pg_backend *b, int32_t max_seqs, int32_t vocab) {
    (void)b;
    return pg_cuda_sample_workspace_size(max_seqs, vocab);
}

// --- layer ops ------------------------------------------------------------------------------

static int cu_embed(pg_backend *b, pg_tensor out, const int32_t *ids, const pg_bweight *table, int32_t id0) {
    if (table->dtype != PG_DTYPE_BF16)
        return pg_err_set(PG_EUNSUPP, "cuda embed: a %s table (the embedding stays bf16)", pg_dtype_name(table->dtype));
    return pg_cuda_embed_shard(out.data, wdata(table), ids, out.rows, table->cols, table->rows, id0,
                               ctx_of(b)->stream);
}

static int cu_argmax_rows(pg_backend *b, pg_argmax *out, pg_tensor x) {
    return pg_cuda_argmax_rows(out, x.data, x.dtype, x.rows, x.cols, x.stride, ctx_of(b)->stream);
}

static int cu_argmax_pick(pg_backend *b, pg_sample_out *out, const pg_argmax *cand, int32_t n_ranks, int32_t n,
                          int32_t ids_per_rank) {
    return pg_cuda_argmax_pick(out, cand, n_ranks, n, ids_per_rank, ctx_of(b)->stream);
}

static int cu_topk_rows(pg_backend *b, pg_argmax *out, pg_tensor x, int32_t k, const pg_argmax *cand,
                        int32_t n_ranks, const pg_sample_params *params, int32_t col0) {
    return pg_cuda_topk_rows(out, x.data, x.dtype, x.rows, x.cols, x.stride, k, cand, n_ranks, params, col0,
                             ctx_of(b)->stream);
}

static int cu_topk_scatter(pg_backend *b, pg_tensor logits, const pg_argmax *cand, int32_t n_ranks, int32_t k) {
    return pg_cuda_topk_scatter(logits.data, logits.dtype, logits.rows, logits.cols, logits.stride, cand, n_ranks,
                                k, ctx_of(b)->stream);
}

static int cu_copy(pg_backend *b, pg_tensor dst, pg_tensor src) {
    PG_ARG(dst.rows == src.rows && dst.cols == src.cols && dst.dtype == src.dtype,
           "cuda copy: %lldx%lld into %lldx%lld", (long long)src.rows, (long long)src.cols, (long long)dst.rows,
           (long long)dst.cols);
    if (src.rows == 0 || src.cols == 0) return 0;
    const size_t el = src.dtype == PG_DTYPE_F32 ? 4 : 2;
    PG_CUDA_TRY(cudaMemcpy2DAsync(dst.data, (size_t)dst.stride * el, src.data, (size_t)src.stride * el,
                                  (size_t)src.cols * el, (size_t)src.rows, cudaMemcpyDeviceToDevice,
                                  ctx_of(b)->stream));
    return 0;
}

static int cu_gather(pg_backend *b, pg_tensor out, pg_tensor x, const int32_t *rows) {
    PG_ARG(x.stride == x.cols && out.stride == out.cols, "cuda gather: contiguous rows only");
    return pg_cuda_embed(out.data, x.data, rows, out.rows, x.cols, x.rows, ctx_of(b)->stream);
}

static int cu_rmsnorm(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *w, float eps) {
    PG_ARG(x.stride == x.cols && out.stride == out.cols, "cuda rmsnorm: contiguous rows only");
    return pg_cuda_add_rmsnorm(out.data, x.data, nullptr, wdata(w), x.rows, x.cols, eps, ctx_of(b)->stream);
}

// Small batches take the weight-streaming GEMV; a shape it declines
// (PG_EUNSUPP) and larger batches take cuBLASLt.
static int gemm(CudaCtx *c, void *out, int64_t ldo, const void *x, int64_t ldx, const void *w, int64_t rows,
                int64_t n, int64_t k, int accumulate) {
    if (rows <= c->gemv_rows) {
        int rc = pg_cuda_gemv_bf16(out, ldo, x, ldx, w, rows, n, k, accumulate, c->stream);
        if (rc != PG_EUNSUPP) return rc;
    }
    return pg_cuda_gemm_bf16(c->gemm, out, ldo, x, ldx, w, rows, n, k, accumulate, c->gemm_ws,
                             PG_CUDA_GEMM_WORKSPACE, c->stream);
}

// The scratch of quantized weights in larger steps, once, for the largest
// quantized matrix: every quantized weight is uploaded before the first
// step (upload_quant refuses a larger one afterwards), so a captured graph
// never sees this pointer change.
static int qscratch_ensure(CudaCtx *c, int64_t elems) {
    if (c->qscratch) return 0;
    if (c->qmax_elems > elems) elems = c->qmax_elems;
    cudaError_t e = cudaMalloc((void **)&c->qscratch, sizeof(bf16) * (size_t)elems);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        c->qscratch = nullptr;
        return pg_err_set(PG_ENOMEM, "cuda: %.2f MiB for the dequantized weight scratch: %s",
                          (double)elems * 2 / (1 << 20), cudaGetErrorString(e));
    }
    c->qscratch_elems = elems;
    PG_LOGI("cuda: %.1f MiB scratch for quantized weights in large batches (%lld bf16 elements)",
            (double)elems * 2 / (1 << 20), (long long)elems);
    return 0;
}

// --- FP8 weights in larger steps: W8A8 (docs/fp8_gemm.md) ---------------------------------
//
// A step's quantized activations live in qscratch: e4m3 rows [rows][k],
// then their f32 scales, then (a product that accumulates into the
// residual) its raw sums [rows][n] bf16. Who quantizes: the RMSNorm before
// QKV and gate/up (pg_cuda_rmsnorm_quant_fp8), the SiLU * mul before down
// (pg_cuda_silu_mul_quant_fp8, which also writes h; c->fp8_ready remembers
// that h's rows are already in the scratch, for the down projection that
// reads h next), else a pass of its own (pg_cuda_quant_rows_fp8: O).

struct Fp8Act {
    uint8_t *xq;
    float *xs;
    void *raw;
    size_t raw_bytes;
};

// The layout for `rows` of `k` (and raw sums of n when accumulating), or
// false when it does not fit the scratch (the caller takes the bf16 path).
static bool fp8_layout(const CudaCtx *c, int64_t rows, int64_t k, int64_t n, int accumulate, Fp8Act *a) {
    auto up256 = [](size_t v) { return (v + 255) / 256 * 256; };
    const size_t q_bytes = up256((size_t)rows * (size_t)k), s_bytes = up256((size_t)rows * sizeof(float));
    a->raw_bytes = accumulate ? (size_t)rows * (size_t)n * 2 : 0;
    if (!c->qscratch || q_bytes + s_bytes + a->raw_bytes > (size_t)c->qscratch_elems * sizeof(bf16)) return false;
    a->xq = (uint8_t *)c->qscratch;
    a->xs = (float *)(a->xq + q_bytes);
    a->raw = accumulate ? (void *)(a->xq + q_bytes + s_bytes) : nullptr;
    return true;
}

// Whether an FP8 weight takes the W8A8 product at this many rows.
static bool fp8_w8a8(const CudaCtx *c, const pg_bweight *w, int64_t rows) {
    return w->dtype == PG_DTYPE_FP8_E4M3 && c->fp8_gemm && rows > c->qgemv_rows;
}

// The product over activations already in the scratch. PG_EUNSUPP when
// cuBLASLt declines: then the path is off for good (logged once).
static int fp8_product(CudaCtx *c, void *out, int64_t ldo, const Fp8Act &a, const CudaWeight *w, int64_t rows,
                       int accumulate) {
    const int64_t n = w->base.rows, k = w->base.cols;
    if (c->fp8_cutlass) {
        // The one-pass CUTLASS kernel, which adds the residual in its
        // epilogue: PAGED_CUDA_FP8_CUTLASS=2 in the configuration picked for
        // the shape, or cuBLASLt where the sweep said so; =1 in
        // PAGED_CUDA_FP8_CUTLASS_CFG's (c0) for every shape.
        // A shape it declines (PG_EUNSUPP: alignment, no CUTLASS built)
        // takes cuBLASLt below.
        int cfg = c->fp8_cutlass_cfg, sw = 1, ra = 0;
        const bool use = c->fp8_cutlass == 1 || pg_cuda_gemm_fp8_cutlass_pick(rows, n, k, &cfg, &sw, &ra) == 0;
        if (use) {
            int rc = pg_cuda_gemm_fp8_cutlass_cfg(cfg, sw, ra, out, ldo, a.xq, a.xs, w->data, w->scales, rows, n, k,
                                                  accumulate, c->gemm_ws, PG_CUDA_GEMM_WORKSPACE, c->stream);
            if (rc != PG_EUNSUPP) return rc;
        }
    }
    int rc = pg_cuda_gemm_fp8(c->gemm, out, ldo, a.xq, k, a.xs, w->data, w->scales, rows, n, k, accumulate,
                              c->fp8_fast, a.raw, a.raw_bytes, c->gemm_ws, PG_CUDA_GEMM_WORKSPACE, c->stream);
    if (rc == PG_EUNSUPP) {
        PG_LOGW("cuda: FP8 weights take the bf16 product from now on: %s", pg_err_msg());
        c->fp8_gemm = false;
    }
    return rc;
}

// x (bf16 [rows][ldx]) quantized, unless it is the h whose rows
// pg_cuda_silu_mul_quant_fp8 left in the scratch, then the product.
static int fp8_gemm(CudaCtx *c, void *out, int64_t ldo, const void *x, int64_t ldx, const CudaWeight *w,
                    int64_t rows, int accumulate) {
    const int64_t n = w->base.rows, k = w->base.cols;
    Fp8Act a;
    if (!fp8_layout(c, rows, k, n, accumulate, &a)) return PG_EUNSUPP;
    const Fp8Ready r = c->fp8_ready;
    c->fp8_ready = Fp8Ready{};
    if (!(r.h == x && r.rows == rows && r.k == k && ldx == k))
        PG_TRY(pg_cuda_quant_rows_fp8(a.xq, k, a.xs, x, ldx, rows, k, c->stream));
    return fp8_product(c, out, ldo, a, w, rows, accumulate);
}

// out = RMSNorm(x) * norm . w^T for an FP8 weight: the norm quantizes.
static int fp8_gemm_normed(CudaCtx *c, void *out, int64_t ldo, const void *x, const pg_bweight *norm, float eps,
                           const CudaWeight *w, int64_t rows, void *scratch) {
    const int64_t n = w->base.rows, k = w->base.cols;
    Fp8Act a;
    if (!fp8_layout(c, rows, k, n, 0, &a)) return PG_EUNSUPP;
    c->fp8_ready = Fp8Ready{};
    int rc = pg_cuda_rmsnorm_quant_fp8(a.xq, k, a.xs, x, wdata(norm), rows, k, eps, c->stream);
    if (rc == PG_EUNSUPP) { // an odd width: the chain
        PG_TRY(pg_cuda_add_rmsnorm(scratch, (void *)x, nullptr, wdata(norm), rows, k, eps, c->stream));
        rc = pg_cuda_quant_rows_fp8(a.xq, k, a.xs, scratch, k, rows, k, c->stream);
    }
    PG_TRY(rc);
    return fp8_product(c, out, ldo, a, w, rows, 0);
}

// Whether an FP8 weight takes gemv.cu's FP8 GEMV at this many rows.
static bool fp8_gemv(const CudaCtx *c, const pg_bweight *w, int64_t rows) {
    return w->dtype == PG_DTYPE_FP8_E4M3 && c->fp8_gemv && rows <= c->qgemv_rows;
}

// The same for a quantized weight (FP8 / int4): for small batches gemv.cu's
// FP8 GEMV (PAGED_CUDA_FP8_GEMV) or pg_cuda_qgemv (a shape they decline
// falls through); else FP8 through the W8A8
// product (fp8_gemm), and int4, or what that declines, dequantized into the
// bf16 scratch and cuBLASLt.
static int qgemm(CudaCtx *c, void *out, int64_t ldo, const void *x, int64_t ldx, const pg_bweight *bw, int64_t rows,
                 int accumulate) {
    const CudaWeight *w = (const CudaWeight *)bw;
    const int64_t n = bw->rows, k = bw->cols;
    if (rows <= c->qgemv_rows) {
        int rc = PG_EUNSUPP;
        if (fp8_gemv(c, bw, rows))
            rc = pg_cuda_gemv_fp8(out, ldo, x, ldx, w->data, w->scales, rows, n, k, accumulate, c->stream);
        if (rc == PG_EUNSUPP)
            rc = pg_cuda_qgemv(out, ldo, x, ldx, w->data, w->scales, bw->dtype, rows, n, k, accumulate, c->stream);
        if (rc != PG_EUNSUPP) return rc;
    }
    if (rows == 0) return 0;
    PG_TRY(qscratch_ensure(c, n * k));
    if (fp8_w8a8(c, bw, rows)) {
        int rc = fp8_gemm(c, out, ldo, x, ldx, w, rows, accumulate);
        if (rc != PG_EUNSUPP) return rc;
    }
    c->fp8_ready = Fp8Ready{}; // the scratch is about to hold a bf16 weight
    PG_ARG(n * k <= c->qscratch_elems, "cuda linear: a %lldx%lld weight over the %lld-element scratch", (long long)n,
           (long long)k, (long long)c->qscratch_elems);
    PG_TRY(pg_cuda_qdequant_bf16(c->qscratch, w->data, w->scales, bw->dtype, n, k, c->stream));
    return pg_cuda_gemm_bf16(c->gemm, out, ldo, x, ldx, c->qscratch, rows, n, k, accumulate, c->gemm_ws,
                             PG_CUDA_GEMM_WORKSPACE, c->stream);
}

static int cu_linear(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *norm, float eps,
                     const pg_bweight *w, const pg_bweight *bias, bool accumulate, pg_tensor scratch) {
    CudaCtx *c = ctx_of(b);
    const int64_t rows = x.rows, n = w->rows, k = w->cols;
    PG_ARG(!(norm && accumulate), "cuda linear: a norm and accumulate in one call");
    if (is_quant(w->dtype)) {
        // FP8 decode: the GEMV with the norm in its prologue; FP8 W8A8: the
        // norm quantizes (fp8_gemm_normed); else add_rmsnorm into scratch,
        // then the product.
        int rc = PG_EUNSUPP;
        if (norm && fp8_gemv(c, w, rows)) {
            const CudaWeight *cw = (const CudaWeight *)w;
            rc = pg_cuda_gemv_rmsnorm_fp8(out.data, out.stride, x.data, x.stride, wdata(norm), eps, cw->data,
                                          cw->scales, rows, n, k, c->stream);
        } else if (norm && fp8_w8a8(c, w, rows)) {
            PG_TRY(qscratch_ensure(c, n * k));
            rc = fp8_gemm_normed(c, out.data, out.stride, x.data, norm, eps, (const CudaWeight *)w, rows,
                                 scratch.data);
        }
        if (rc != PG_EUNSUPP) {
            PG_TRY(rc);
        } else if (norm) {
            PG_TRY(pg_cuda_add_rmsnorm(scratch.data, x.data, nullptr, wdata(norm), rows, k, eps, c->stream));
            PG_TRY(qgemm(c, out.data, out.stride, scratch.data, k, w, rows, 0));
        } else {
            PG_TRY(qgemm(c, out.data, out.stride, x.data, x.stride, w, rows, accumulate ? 1 : 0));
        }
    } else if (norm) {
        // out = RMSNorm(x) * norm . w^T: the GEMV with the norm in its
        // prologue for small batches, else add_rmsnorm into scratch and the
        // GEMM (the same numbers either way).
        int rc = PG_EUNSUPP;
        if (rows <= c->gemv_rows)
            rc = pg_cuda_gemv_rmsnorm_bf16(out.data, out.stride, x.data, x.stride, wdata(norm), eps, wdata(w),
                                           rows, n, k, c->stream);
        if (rc == PG_EUNSUPP) {
            PG_TRY(pg_cuda_add_rmsnorm(scratch.data, x.data, nullptr, wdata(norm), rows, k, eps, c->stream));
            rc = gemm(c, out.data, out.stride, scratch.data, k, wdata(w), rows, n, k, 0);
        }
        PG_TRY(rc);
    } else {
        PG_TRY(gemm(c, out.data, out.stride, x.data, x.stride, wdata(w), rows, n, k, accumulate ? 1 : 0));
    }
    if (bias) PG_TRY(pg_cuda_add_bias(out.data, out.stride, wdata(bias), rows, n, c->stream));
    return 0;
}

// The model's hint that w is read soon (backend.h): under
// PAGED_CUDA_L2_PREFETCH=1 its bytes go to the L2 when the step is one the
// GEMV runs (few rows: the product streams weights, and what runs before
// it leaves HBM idle). An offloaded weight's slot may not hold it yet.
static int cu_prefetch(pg_backend *b, const pg_bweight *w, int64_t rows) {
    CudaCtx *c = ctx_of(b);
    const CudaWeight *cw = (const CudaWeight *)w;
    const int64_t small = is_quant(w->dtype) ? c->qgemv_rows : c->gemv_rows;
    if (!c->l2_prefetch || rows > small || cw->offloaded || !cw->data) return 0;
    return pg_cuda_l2_prefetch(cw->data, cw->pack ? cw->pack : w->bytes, c->stream);
}

// h = silu(gate) * up of RMSNorm(x) * norm through the fused [gate|up]
// weight: one GEMV for small batches, else add_rmsnorm, the GEMM into gu
// and silu_mul.
static int cu_gate_up_silu(pg_backend *b, pg_tensor h, pg_tensor x, const pg_bweight *norm, float eps,
                           const pg_bweight *w, pg_tensor sxn, pg_tensor sgu) {
    CudaCtx *c = ctx_of(b);
    const int64_t rows = x.rows, H = x.cols, ffn = w->rows / 2;
    if (is_quant(w->dtype)) {
        if (fp8_gemv(c, w, rows)) {
            const CudaWeight *cw = (const CudaWeight *)w;
            int rc = pg_cuda_gemv_rmsnorm_silu_fp8(h.data, h.stride, x.data, x.stride, wdata(norm), eps, cw->data,
                                                   cw->scales, rows, ffn, H, c->stream);
            if (rc != PG_EUNSUPP) return rc;
        }
        if (fp8_w8a8(c, w, rows)) {
            // The norm quantizes for gate/up, and the SiLU * mul for down
            // (h's rows stay in the scratch: fp8_ready).
            PG_TRY(qscratch_ensure(c, w->rows * w->cols));
            int rc = fp8_gemm_normed(c, sgu.data, sgu.stride, x.data, norm, eps, (const CudaWeight *)w, rows,
                                     sxn.data);
            if (rc != PG_EUNSUPP) {
                PG_TRY(rc);
                Fp8Act a;
                if (sgu.stride == 2 * ffn && h.stride == ffn && fp8_layout(c, rows, ffn, 0, 0, &a)) {
                    rc = pg_cuda_silu_mul_quant_fp8(h.data, a.xq, ffn, a.xs, sgu.data, rows, ffn, c->stream);
                    if (rc == 0) c->fp8_ready = Fp8Ready{h.data, rows, ffn};
                    if (rc != PG_EUNSUPP) return rc;
                }
                return pg_cuda_silu_mul(h.data, sgu.data, rows, ffn, c->stream);
            }
        }
        PG_TRY(pg_cuda_add_rmsnorm(sxn.data, x.data, nullptr, wdata(norm), rows, H, eps, c->stream));
        PG_TRY(qgemm(c, sgu.data, sgu.stride, sxn.data, sxn.stride, w, rows, 0));
        return pg_cuda_silu_mul(h.data, sgu.data, rows, ffn, c->stream);
    }
    if (rows <= c->gemv_rows) {
        int rc = pg_cuda_gemv_rmsnorm_silu_bf16(h.data, h.stride, x.data, x.stride, wdata(norm), eps, wdata(w),
                                                rows, ffn, H, c->stream);
        if (rc != PG_EUNSUPP) return rc;
    }
    PG_TRY(pg_cuda_add_rmsnorm(sxn.data, x.data, nullptr, wdata(norm), rows, H, eps, c->stream));
    PG_TRY(gemm(c, sgu.data, sgu.stride, sxn.data, sxn.stride, wdata(w), rows, 2 * ffn, H, 0));
    return pg_cuda_silu_mul(h.data, sgu.data, rows, ffn, c->stream);
}

// h[i][j] = silu(gu[i][j]) * gu[i][ffn + j] (backend.h): gate_up_silu's
// activation alone, for the LoRA FFN, which adds the gate and up adapters'
// products into gu first (engine/model/layers.c). Contiguous bf16 rows, as
// the CPU's op wants contiguous f32 ones (one row may have any stride):
// pg_cuda_silu_mul, the kernel gate_up_silu's GEMM path ends with.
static int cu_silu_mul(pg_backend *b, pg_tensor h, pg_tensor gu) {
    CudaCtx *c = ctx_of(b);
    PG_ARG(h.dtype == PG_DTYPE_BF16 && gu.dtype == PG_DTYPE_BF16 && (h.rows <= 1 || h.stride == h.cols) &&
               (gu.rows <= 1 || gu.stride == gu.cols),
           "cuda silu_mul: needs contiguous bf16 rows");
    PG_ARG(gu.rows == h.rows && gu.cols == 2 * h.cols, "cuda silu_mul: %lldx%lld from %lldx%lld", (long long)h.rows,
           (long long)h.cols, (long long)gu.rows, (long long)gu.cols);
    // h is rewritten: quantized rows an FP8 gate_up_silu left for the down
    // projection (fp8_ready) are no longer h's.
    c->fp8_ready = Fp8Ready{};
    return pg_cuda_silu_mul(h.data, gu.data, h.rows, h.cols, c->stream);
}

static int cu_head_rmsnorm(pg_backend *b, pg_tensor x, int32_t n_heads, const pg_bweight *w, float eps) {
    return pg_cuda_head_rmsnorm(x.data, x.stride, n_heads, (int32_t)w->cols, wdata(w), eps, x.rows,
                                ctx_of(b)->stream);
}

static int cu_rope_kv_write(pg_backend *b, pg_tensor q, pg_tensor k, pg_tensor v, const int32_t *pos,
                            const int32_t *slots, int32_t n_heads, const pg_bweight *inv_freq, void *k_cache,
                            void *v_cache, pg_kv_shape shape) {
    PG_ARG(inv_freq->dtype == PG_DTYPE_F32, "cuda rope: inv_freq must be f32 (vector_f32)");
    return pg_cuda_rope_kv_write(q.data, q.stride, k.data, k.stride, v.data, v.stride, pos, slots,
                                 (int32_t)q.rows, n_heads, (const float *)wdata(inv_freq), k_cache, v_cache,
                                 shape, ctx_of(b)->stream);
}

// Decode sequences (rows [0, n_decode)) through the split-K decode kernel,
// prefill chunks through the varlen prefill kernel (FlashInfer's with
// PAGED_CUDA_PREFILL=flashinfer where it runs the case: its plan's image
// takes the head of the workspace, the decode kernel the rest); a sliding
// window and a soft-cap travel in the shape (cuda_ops.h).
static int cu_attention_softcap(pg_backend *b, pg_tensor out, pg_tensor q, const pg_attn_batch *ab,
                                const void *k_cache, const void *v_cache, pg_kv_shape shape, int32_t n_heads,
                                float scale, int32_t window, float softcap) {
    CudaCtx *c = ctx_of(b);
    shape.window = window;
    shape.softcap = softcap;
    const int32_t n_dec = ab->n_decode, n_pre = ab->n_seqs - ab->n_decode;
    const int64_t q_dim = (int64_t)n_heads * shape.head_dim;
    PG_ARG(out.stride == q_dim, "cuda attention: the output rows must be contiguous");
    char *dec_ws = (char *)ab->workspace;
    size_t dec_ws_bytes = ab->workspace_bytes;
    const size_t fi_bytes = c->fi_prefill ? pg_cuda_fi_prefill_ws_bytes(n_heads) : 0;
    const bool fi_room = fi_bytes && dec_ws && dec_ws_bytes >= fi_bytes;
    if (fi_room) dec_ws += fi_bytes, dec_ws_bytes -= fi_bytes;
    if (n_dec > 0)
        PG_TRY(pg_cuda_paged_decode_attention(out.data, q.data, q.stride, k_cache, v_cache, shape,
                                              ab->block_tables, ab->bt_stride, ab->seq_lens, n_dec, n_heads,
                                              scale, ab->max_decode_ctx, dec_ws, dec_ws_bytes, c->stream));
    if (n_pre > 0 && fi_room && ab->host_cu_q && ab->host_start_pos) {
        int rc = pg_cuda_fi_prefill_run(
            c->fi_prefill, (bf16 *)out.data + (size_t)n_dec * q_dim, (const bf16 *)q.data + (size_t)n_dec * q.stride,
            q.stride, k_cache, v_cache, shape, ab->block_tables + (size_t)n_dec * ab->bt_stride, ab->bt_stride,
            ab->host_cu_q, ab->host_start_pos + n_dec, n_pre, n_heads, scale, ab->workspace, fi_bytes, c->stream);
        if (rc != PG_EUNSUPP) return rc;
    }
    if (n_pre > 0)
        PG_TRY(pg_cuda_paged_prefill_attention(
            (bf16 *)out.data + (size_t)n_dec * q_dim, (const bf16 *)q.data + (size_t)n_dec * q.stride,
            q.stride, k_cache, v_cache, shape, ab->block_tables + (size_t)n_dec * ab->bt_stride, ab->bt_stride,
            ab->cu_q, ab->start_pos + n_dec, n_pre, n_heads, scale, ab->max_prefill_q, c->stream));
    return 0;
}

static int cu_attention(pg_backend *b, pg_tensor out, pg_tensor q, const pg_attn_batch *ab, const void *k_cache,
                        const void *v_cache, pg_kv_shape shape, int32_t n_heads, float scale, int32_t window) {
    return cu_attention_softcap(b, out, q, ab, k_cache, v_cache, shape, n_heads, scale, window, 0.0f);
}

// --- Gemma's ops (gemma_ops.cu; docs/gemma3.md) ---

// h = gelu_tanh(g) * u over [g | u] = RMSNorm(x) * norm . Wgu^T: the plain
// linear path (any weight type, the GEMV for small batches) into the
// scratch rows, then one elementwise pass.
static int cu_gate_up_gelu(pg_backend *b, pg_tensor h, pg_tensor x, const pg_bweight *norm, float eps,
                           const pg_bweight *w, pg_tensor sxn, pg_tensor sgu) {
    const int64_t rows = x.rows, ffn = w->rows / 2;
    PG_ARG(h.stride == ffn && sgu.stride == 2 * ffn && sgu.rows >= rows,
           "cuda gate_up_gelu: h and the scratch must be contiguous rows of %lld and %lld", (long long)ffn,
           (long long)(2 * ffn));
    pg_tensor gu = sgu;
    gu.rows = rows;
    gu.cols = 2 * ffn;
    PG_TRY(cu_linear(b, gu, x, norm, eps, w, NULL, false, sxn));
    return pg_cuda_gelu_mul(h.data, gu.data, rows, ffn, ctx_of(b)->stream);
}

static int cu_rmsnorm_add(pg_backend *b, pg_tensor x, pg_tensor y, const pg_bweight *w, float eps) {
    PG_ARG(x.rows == y.rows && x.cols == y.cols && w->cols == x.cols && x.stride == x.cols && y.stride == y.cols,
           "cuda rmsnorm_add: needs contiguous rows of one shape");
    return pg_cuda_rmsnorm_add(x.data, y.data, wdata(w), x.rows, x.cols, eps, ctx_of(b)->stream);
}

static int cu_scale(pg_backend *b, pg_tensor x, float s) {
    return pg_cuda_scale(x.data, x.stride, x.rows, x.cols, s, ctx_of(b)->stream);
}

static int cu_softcap(pg_backend *b, pg_tensor x, float cap) {
    return pg_cuda_softcap(x.data, x.stride, x.rows, x.cols, cap, ctx_of(b)->stream);
}

// The mixture-of-experts feed-forward (moe.cu; docs/moe.md): bf16 or FP8
// experts (all of one type; FP8 weight-only, with their row scales), the
// router bf16; the experts' device pointers go to the launcher, which
// passes them to its kernels as parameters.
static size_t cu_moe_ws(pg_backend *b, int32_t max_rows, int32_t hidden, int32_t ffn, int32_t n_experts,
                        int32_t top_k) {
    (void)b;
    return pg_cuda_moe_workspace_size(max_rows, hidden, ffn, n_experts, top_k);
}

static int cu_moe_ffn(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *norm, float eps,
                      const pg_bweight *router, const pg_bweight *const *gate_up, const pg_bweight *const *down,
                      int32_t n_experts, int32_t top_k, bool renorm, bool accumulate, void *ws, size_t ws_bytes) {
    PG_ARG(n_experts >= 1 && n_experts <= PG_CUDA_MOE_MAX_EXPERTS, "cuda moe_ffn: %d experts (at most %d)",
           n_experts, PG_CUDA_MOE_MAX_EXPERTS);
    PG_ARG(x.dtype == PG_DTYPE_BF16 && out.dtype == PG_DTYPE_BF16 && x.stride == x.cols && out.stride == out.cols &&
               out.rows == x.rows && out.cols == x.cols,
           "cuda moe_ffn: needs contiguous bf16 rows of one shape");
    PG_ARG(router && router->dtype == PG_DTYPE_BF16 && router->rows == n_experts && router->cols == x.cols,
           "cuda moe_ffn: the router must be bf16 [%d][%lld]", n_experts, (long long)x.cols);
    const void *gu[PG_CUDA_MOE_MAX_EXPERTS], *dn[PG_CUDA_MOE_MAX_EXPERTS];
    const float *gus[PG_CUDA_MOE_MAX_EXPERTS], *dns[PG_CUDA_MOE_MAX_EXPERTS];
    int64_t ffn = 0;
    int dtype = -1; // the held experts' type
    for (int32_t e = 0; e < n_experts && !ffn; e++) ffn = down[e] ? down[e]->cols : 0;
    for (int32_t e = 0; e < n_experts; e++) {
        gu[e] = dn[e] = nullptr;
        gus[e] = dns[e] = nullptr;
        if (!gate_up[e] && !down[e]) continue; // another rank's expert
        const pg_bweight *g = gate_up[e], *d = down[e];
        const bool ok_type = g && d && g->dtype == d->dtype &&
                             (g->dtype == PG_DTYPE_BF16 || g->dtype == PG_DTYPE_FP8_E4M3) &&
                             (dtype < 0 || g->dtype == dtype);
        if (!ok_type)
            return pg_err_set(PG_EUNSUPP, "cuda moe_ffn: expert %d's weights are %s / %s; the GPU runs bf16 or FP8 "
                              "experts, all of one type (docs/moe.md)", e, g ? pg_dtype_name(g->dtype) : "missing",
                              d ? pg_dtype_name(d->dtype) : "missing");
        dtype = g->dtype;
        PG_ARG(g->rows == 2 * ffn && g->cols == x.cols && d->rows == x.cols && d->cols == ffn,
               "cuda moe_ffn: expert %d is %lldx%lld / %lldx%lld, wants %lldx%lld / %lldx%lld", e, (long long)g->rows,
               (long long)g->cols, (long long)d->rows, (long long)d->cols, (long long)(2 * ffn), (long long)x.cols,
               (long long)x.cols, (long long)ffn);
        gu[e] = wdata(g);
        dn[e] = wdata(d);
        gus[e] = ((const CudaWeight *)g)->scales;
        dns[e] = ((const CudaWeight *)d)->scales;
    }
    if (!ffn || x.rows == 0) { // no expert here: the sum is empty
        if (!accumulate && x.rows)
            PG_CUDA_TRY(cudaMemsetAsync(out.data, 0, (size_t)out.rows * out.cols * 2, ctx_of(b)->stream));
        else if (accumulate && out.data != x.data)
            PG_TRY(cu_copy(b, out, x));
        return 0;
    }
    const void *nw = norm ? wdata(norm) : nullptr;
    if (dtype == PG_DTYPE_FP8_E4M3)
        return pg_cuda_moe_ffn_fp8(out.data, x.data, x.rows, x.cols, ffn, nw, eps, wdata(router), gu, gus, dn, dns,
                                   n_experts, top_k, renorm ? 1 : 0, accumulate ? 1 : 0, ws, ws_bytes,
                                   ctx_of(b)->stream);
    return pg_cuda_moe_ffn(out.data, x.data, x.rows, x.cols, ffn, nw, eps, wdata(router), gu, dn, n_experts, top_k,
                           renorm ? 1 : 0, accumulate ? 1 : 0, ws, ws_bytes, ctx_of(b)->stream);
}

// Batched multi-adapter LoRA (lora.cu; docs/lora.md): bf16 rows and bf16
// adapters (weight_upload makes f32 / f16 adapters bf16; FP8 / int4 ones
// are refused by the launcher), at most PG_CUDA_LORA_MAX_SLOTS slots of
// rank <= PG_CUDA_LORA_MAX_RANK. The slots' device pointers go to the
// launcher, which passes them to its kernels as a parameter. In the
// grouped shape (PAGED_CUDA_LORA_SGMV=1) the rows' slots (host) are staged
// and sorted into the workspace once for all the projections of a step: a
// call whose rows equal the last staged ones (same workspace, same count,
// same bytes) skips the staging; BGMV (the default) stages in every call.
// Not graph-safe: refused under stream capture (graph steps take
// cu_lora_apply_dev below).
static size_t cu_lora_ws(pg_backend *b, int32_t max_rows, int32_t in_cols, int32_t out_cols, int32_t max_rank,
                         int32_t n_slots) {
    (void)b, (void)out_cols, (void)n_slots;
    return pg_cuda_lora_workspace_size(max_rows, in_cols, max_rank);
}

// Stages row_slot unless the workspace holds it already; 1 when it does
// (then or now), the launcher's `staged`.
static int lora_stage_once(CudaCtx *c, const int32_t *row_slot, int64_t m, int32_t n_slots, void *ws,
                           size_t ws_bytes) {
    if (m > c->lora_cap) {
        int8_t *p = (int8_t *)realloc(c->lora_staged, (size_t)m);
        if (!p) return pg_err_set(PG_ENOMEM, "cuda lora_apply: %lld bytes of staged slots", (long long)m);
        c->lora_staged = p, c->lora_cap = m;
    }
    bool same = c->lora_ws == ws && c->lora_m == m;
    for (int64_t i = 0; i < m; i++) {
        const int8_t v = (int8_t)row_slot[i]; // -1 .. n_slots - 1 (pg_lora_check)
        same = same && c->lora_staged[i] == v;
        c->lora_staged[i] = v;
    }
    if (same) return 1;
    c->lora_ws = nullptr; // invalid until the stage is enqueued
    PG_TRY(pg_cuda_lora_stage(row_slot, m, n_slots, ws, ws_bytes, c->stream));
    c->lora_ws = ws, c->lora_m = m;
    return 1;
}

// Eager LoRA takes runs of N or more rows of one adapter (prefill chunks)
// through cuBLASLt (pg_cuda_lora_apply_runs; docs/lora.md "Runs of one
// adapter through cuBLASLt"), the rest through BGMV: N = 16 by default
// (session 26: served W4 with 8 adapters 2,953 -> 3,420 tok/s on an
// H200), PAGED_CUDA_LORA_GEMM_RUNS=N to change it, 0 for BGMV alone
// (read once).
static int64_t lora_gemm_runs(void) {
    static int64_t n = -1;
    if (n < 0) {
        const char *e = getenv("PAGED_CUDA_LORA_GEMM_RUNS");
        n = e && *e ? atoll(e) : 16;
        if (n < 0) n = 0;
    }
    return n;
}

static int cu_lora_apply(pg_backend *b, pg_tensor out, pg_tensor x, const int32_t *row_slot,
                         const pg_lora_slot *slots, int32_t n_slots, void *ws, size_t ws_bytes) {
    PG_ARG(x.dtype == PG_DTYPE_BF16 && out.dtype == PG_DTYPE_BF16, "cuda lora_apply: needs bf16 rows");
    int64_t max_rank;
    PG_TRY(pg_lora_check("cuda lora_apply", out, x, row_slot, slots, n_slots, &max_rank));
    if (n_slots > PG_CUDA_LORA_MAX_SLOTS)
        return pg_err_set(PG_EUNSUPP, "cuda lora_apply: %d adapter slots, the GPU takes at most %d", n_slots,
                          PG_CUDA_LORA_MAX_SLOTS);
    if (max_rank == 0 || x.rows == 0) return 0; // no row has an adapter here: nothing staged, nothing run
    pg_cuda_lora_slot cs[PG_CUDA_LORA_MAX_SLOTS];
    for (int32_t s = 0; s < n_slots; s++) {
        const pg_bweight *a = slots[s].a, *bw = slots[s].b;
        // the type the launcher judges: a's, or b's where a is bf16 and b is not
        const int32_t dt = a && bw && a->dtype == PG_DTYPE_BF16 ? bw->dtype : a ? a->dtype : PG_DTYPE_BF16;
        cs[s] = (pg_cuda_lora_slot){a ? wdata(a) : nullptr, bw ? wdata(bw) : nullptr,
                                    a ? (int32_t)a->rows : 0, dt, slots[s].scale};
    }
    CudaCtx *c = ctx_of(b);
    const int64_t runs = lora_gemm_runs();
    if (runs > 0 && !pg_cuda_lora_grouped())
        return pg_cuda_lora_apply_runs(c->gemm, c->gemm_ws, PG_CUDA_GEMM_WORKSPACE, runs, out.data, out.stride,
                                       x.data, x.stride, x.rows, x.cols, out.cols, row_slot, cs, n_slots, ws,
                                       ws_bytes, c->stream);
    const int staged = pg_cuda_lora_grouped() ? lora_stage_once(c, row_slot, x.rows, n_slots, ws, ws_bytes) : 0;
    if (staged < 0) return staged;
    return pg_cuda_lora_apply(out.data, out.stride, x.data, x.stride, x.rows, x.cols, out.cols, row_slot, cs,
                              n_slots, ws, ws_bytes, staged, c->stream);
}

// Graph-safe LoRA (lora_graph.cu): the engine's table entries are the
// launcher's, field for field.
static_assert(sizeof(pg_lora_dev_slot) == sizeof(pg_cuda_lora_dev_slot) &&
                  offsetof(pg_lora_dev_slot, b) == offsetof(pg_cuda_lora_dev_slot, b) &&
                  offsetof(pg_lora_dev_slot, rank) == offsetof(pg_cuda_lora_dev_slot, rank) &&
                  offsetof(pg_lora_dev_slot, scale) == offsetof(pg_cuda_lora_dev_slot, scale),
              "one slot-table entry layout");
static_assert(PG_LORA_DEV_MAX_PROJ == PG_CUDA_LORA_MAX_PROJ, "one projection limit");

static int cu_lora_apply_dev(pg_backend *b, pg_tensor out, pg_tensor x, const pg_bweight *norm, float eps,
                             const int32_t *row_slot, const pg_lora_dev_slot *const *tables, int32_t n_slots,
                             const int64_t *cols, int32_t n_proj, int32_t max_rank, void *ws, size_t ws_bytes) {
    PG_ARG(x.dtype == PG_DTYPE_BF16 && out.dtype == PG_DTYPE_BF16, "cuda lora_apply_dev: needs bf16 rows");
    PG_ARG(out.rows == x.rows, "cuda lora_apply_dev: %lld output rows for %lld", (long long)out.rows,
           (long long)x.rows);
    int64_t total = 0;
    for (int32_t p = 0; p < n_proj && p < PG_LORA_DEV_MAX_PROJ; p++) total += cols[p];
    PG_ARG(total == out.cols, "cuda lora_apply_dev: the projections' %lld columns, out has %lld", (long long)total,
           (long long)out.cols);
    PG_ARG(!norm || (norm->dtype == PG_DTYPE_BF16 && norm->rows * norm->cols == x.cols),
           "cuda lora_apply_dev: the norm weight is not bf16 [%lld]", (long long)x.cols);
    return pg_cuda_lora_apply_dev(out.data, out.stride, x.data, x.stride, x.rows, x.cols, norm ? wdata(norm) : nullptr,
                                  eps, cols, n_proj, row_slot,
                                  (const pg_cuda_lora_dev_slot *const *)tables, n_slots, max_rank, ws, ws_bytes,
                                  ctx_of(b)->stream);
}

// The entries go through a host copy in the launcher's form; bf16 adapters
// only (what the kernels read), checked here, at load.
static int cu_lora_table_write(pg_backend *b, pg_lora_dev_slot *dst, const pg_lora_slot *src, int64_t n) {
    PG_ARG(n >= 0 && (n == 0 || (dst && src)), "cuda lora_table_write: %lld entries", (long long)n);
    pg_cuda_lora_dev_slot *h = (pg_cuda_lora_dev_slot *)calloc((size_t)(n ? n : 1), sizeof *h);
    if (!h) return pg_err_set(PG_ENOMEM, "cuda lora_table_write: %lld entries", (long long)n);
    int rc = 0;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        const pg_bweight *a = src[i].a, *bw = src[i].b;
        if (!a) continue;
        if (!bw || a->dtype != PG_DTYPE_BF16 || bw->dtype != PG_DTYPE_BF16 || a->rows < 1 ||
            a->rows > PG_CUDA_LORA_MAX_RANK) {
            rc = pg_err_set(PG_EUNSUPP, "cuda lora_table_write: entry %lld: %s adapter of rank %lld; the GPU runs "
                                        "bf16 adapters of rank 1 to %d", (long long)i,
                            pg_dtype_name(bw && a->dtype == PG_DTYPE_BF16 ? bw->dtype : a->dtype),
                            (long long)a->rows, PG_CUDA_LORA_MAX_RANK);
            break;
        }
        h[i] = (pg_cuda_lora_dev_slot){wdata(a), wdata(bw), (int32_t)a->rows, src[i].scale};
    }
    if (rc == 0) rc = pg_cuda_lora_table_write((pg_cuda_lora_dev_slot *)dst, h, n, ctx_of(b)->stream);
    free(h);
    return rc;
}

static int cu_sample(pg_backend *b, pg_sample_out *out, pg_tensor logits, const pg_sample_params *params,
                     const int32_t *tokens, void *ws, size_t ws_bytes) {
    return pg_cuda_sample(out, logits.data, PG_CUDA_BF16, logits.stride, (int32_t)logits.rows,
                          (int32_t)logits.cols, params, tokens, ws, ws_bytes, ctx_of(b)->stream);
}

static int cu_feed_tokens(pg_backend *b, int32_t *tokens, const pg_sample_out *prev, const int32_t *pairs,
                          int32_t n) {
    return pg_cuda_feed_tokens(tokens, prev, pairs, n, ctx_of(b)->stream);
}

static int cu_read_f32(pg_backend *b, pg_tensor t, int64_t n, float *out) {
    CudaCtx *c = ctx_of(b);
    PG_ARG(n >= 0 && n <= t.rows, "cuda read: %lld rows of %lld", (long long)n, (long long)t.rows);
    if (n == 0) return 0;
    // A view's last row ends at its columns, not at the stride (a column
    // view of a wider buffer, as the K and V of the fused QKV rows).
    const size_t count = (size_t)(n - 1) * (size_t)t.stride + (size_t)t.cols;
    float *tmp = nullptr;
    if (t.dtype == PG_DTYPE_F32) {
        PG_CUDA_TRY(cudaMemcpy2DAsync(out, (size_t)t.cols * 4, t.data, (size_t)t.stride * 4, (size_t)t.cols * 4,
                                      (size_t)n, cudaMemcpyDeviceToHost, c->stream));
        PG_CUDA_TRY(cudaStreamSynchronize(c->stream));
        return 0;
    }
    PG_CUDA_TRY(cudaMalloc((void **)&tmp, count * sizeof(float)));
    int rc = pg_cuda_bf16_to_f32(tmp, t.data, (int64_t)count, c->stream);
    cudaError_t e = cudaSuccess;
    if (rc == 0) // rows of `stride` on the device, of `cols` in `out`
        e = cudaMemcpy2DAsync(out, (size_t)t.cols * sizeof(float), tmp, (size_t)t.stride * sizeof(float),
                              (size_t)t.cols * sizeof(float), (size_t)n, cudaMemcpyDeviceToHost, c->stream);
    if (rc == 0 && e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    cudaFree(tmp);
    if (rc < 0) return rc;
    PG_CUDA_TRY(e);
    return 0;
}

const pg_backend_ops pg_cuda_ops_table = {
    .attn_workspace_bytes = cu_attn_ws,
    .sample_workspace_bytes = cu_sample_ws,
    .embed = cu_embed,
    .copy = cu_copy,
    .gather = cu_gather,
    .rmsnorm = cu_rmsnorm,
    .linear = cu_linear,
    .prefetch = cu_prefetch,
    .gate_up_silu = cu_gate_up_silu,
    .silu_mul = cu_silu_mul, // the LoRA FFN (engine/model/layers.c)
    .gate_up_gelu = cu_gate_up_gelu,
    .rmsnorm_add = cu_rmsnorm_add,
    .scale = cu_scale,
    .softcap = cu_softcap,
    .attention_softcap = cu_attention_softcap,
    .moe_ffn = cu_moe_ffn,
    .moe_workspace_bytes = cu_moe_ws,
    .lora_apply = cu_lora_apply, // lora.cu
    .lora_workspace_bytes = cu_lora_ws,
    .lora_apply_dev = cu_lora_apply_dev, // lora_graph.cu
    .lora_table_write = cu_lora_table_write,
    .head_rmsnorm = cu_head_rmsnorm,
    .rope_kv_write = cu_rope_kv_write,
    .attention = cu_attention,
    .sample = cu_sample,
    .argmax_rows = cu_argmax_rows,
    .argmax_pick = cu_argmax_pick,
    .topk_rows = cu_topk_rows,
    .topk_scatter = cu_topk_scatter,
    .feed_tokens = cu_feed_tokens,
    .read_f32 = cu_read_f32,
};

