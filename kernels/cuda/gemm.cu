// kernels/cuda/gemm.cu - bf16 and FP8 (W8A8) GEMMs through cuBLASLt with
// cached plans.
//
// Row-major out[m][n] = x[m][k] . w[n][k]^T is, in cuBLAS's column-major
// terms, out^T (n x m, ld ldo) = op_T(W: k x n, ld k) * op_N(x^T: k x m,
// ld ldx). Each distinct (m, n, k, ldx, ldo, accumulate, alignment,
// workspace) gets its matmul descriptor, layouts and the heuristic's first
// algorithm once; later calls are a table lookup and cublasLtMatmul, which
// is also legal inside CUDA graph capture (the workspace is the caller's).
//
// The FP8 kind (pg_cuda_gemm_fp8) is the same product on Hopper's e4m3
// tensor cores: A = the e4m3 weight, B = the e4m3 activations, f32
// accumulation, the raw sums sum_t A[t][j] B[t][i] rounded to bf16, then
// pg_cuda_fp8_rescale multiplies them by the token's and the channel's
// scales (act_quant.cu). cuBLAS 13.1 on sm_90 declines the one-pass form,
// its "outer vector" scales (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F:
// CUBLAS_STATUS_INVALID_VALUE from the heuristic on the H200, session 11);
// docs/fp8_gemm.md has the figures and what would remove the extra pass.
#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"

#define PG_LT_TRY(call)                                                                    \
    do {                                                                                   \
        cublasStatus_t pg_s_ = (call);                                                     \
        if (pg_s_ != CUBLAS_STATUS_SUCCESS)                                                \
            return pg_err_set(PG_EIO, "%s:%d: %s: cuBLAS status %d", __FILE__, __LINE__,   \
                              #call, (int)pg_s_);                                          \
    } while (0)

namespace {

enum GemmKind { KIND_BF16 = 0, KIND_FP8 = 1, KIND_FP8_FAST = 2 };

struct GemmKey {
    int64_t m, n, k, ldx, ldo;
    int kind; // GemmKind
    int accumulate;
    int align; // min alignment in bytes of the three pointers (16..256)
    size_t ws;
    bool operator==(const GemmKey &o) const { return memcmp(this, &o, sizeof *this) == 0; }
};

struct GemmPlan {
    GemmKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    uint64_t last_use;
};

constexpr int CACHE = 128;

int ptr_align(const void *p) {
    uintptr_t v = (uintptr_t)p;
    int a = 256;
    while (a > 2 && (v % (uintptr_t)a)) a >>= 1;
    return a;
}

} // namespace

struct pg_cuda_gemm {
    cublasLtHandle_t lt;
    GemmPlan plans[CACHE];
    int n_plans;
    uint64_t clock;
};

static void plan_free(GemmPlan *p) {
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->c) cublasLtMatrixLayoutDestroy(p->c);
    if (p->desc) cublasLtMatmulDescDestroy(p->desc);
    p->a = p->b = p->c = nullptr;
    p->desc = nullptr;
}

static int plan_make(pg_cuda_gemm *g, const GemmKey &key, GemmPlan *p) {
    memset(p, 0, sizeof *p);
    p->key = key;
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulHeuristicResult_t res;
    int n_res = 0;
    auto build = [&]() -> int {
        PG_LT_TRY(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        PG_LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        PG_LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        const cudaDataType_t in_t = key.kind == KIND_BF16 ? CUDA_R_16BF : CUDA_R_8F_E4M3;
        if (key.kind != KIND_BF16) {
            // No scale pointers: the scalar scales default to 1, so D
            // holds the raw sums. Fast accumulation keeps the products in
            // the tensor core's own accumulator (no periodic promotion to
            // f32): faster, less exact over long k. Off unless asked for
            // (PAGED_CUDA_FP8_FAST).
            int8_t fast = key.kind == KIND_FP8_FAST ? 1 : 0;
            PG_LT_TRY(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
        }
        // A = W stored k x n (column-major, ld k); B = x^T k x m (ld ldx); C = out^T n x m (ld ldo).
        PG_LT_TRY(cublasLtMatrixLayoutCreate(&p->a, in_t, (uint64_t)key.k, (uint64_t)key.n, key.k));
        PG_LT_TRY(cublasLtMatrixLayoutCreate(&p->b, in_t, (uint64_t)key.k, (uint64_t)key.m, key.ldx));
        PG_LT_TRY(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_16BF, (uint64_t)key.n, (uint64_t)key.m, key.ldo));
        PG_LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t ws = key.ws;
        uint32_t al = (uint32_t)key.align;
        PG_LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        PG_LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
        PG_LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al));
        PG_LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
        PG_LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g->lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &res, &n_res);
        if (st != CUBLAS_STATUS_SUCCESS || n_res == 0)
            return pg_err_set(PG_EUNSUPP, "gemm: no cuBLASLt %s algorithm for m %lld n %lld k %lld (status %d)",
                              key.kind == KIND_BF16 ? "bf16" : "fp8", (long long)key.m, (long long)key.n,
                              (long long)key.k, (int)st);
        return 0;
    };
    int rc = build();
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (rc < 0) {
        plan_free(p);
        return rc;
    }
    p->algo = res.algo;
    return 0;
}

extern "C" int pg_cuda_gemm_create(pg_cuda_gemm **out) {
    PG_ARG(out, "gemm_create: null out");
    *out = nullptr;
    pg_cuda_gemm *g = (pg_cuda_gemm *)calloc(1, sizeof *g);
    if (!g) return pg_err_set(PG_ENOMEM, "gemm_create: out of host memory");
    cublasStatus_t st = cublasLtCreate(&g->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(g);
        return pg_err_set(PG_EIO, "cublasLtCreate: status %d", (int)st);
    }
    *out = g;
    return 0;
}

extern "C" void pg_cuda_gemm_destroy(pg_cuda_gemm *g) {
    if (!g) return;
    for (int i = 0; i < g->n_plans; i++) plan_free(&g->plans[i]);
    cublasLtDestroy(g->lt);
    free(g);
}

// The cached plan for `key` (made on first use; the least recently used
// one evicted when the table is full), or null with the error set.
static GemmPlan *plan_get(pg_cuda_gemm *g, const GemmKey &key, int *rc_out) {
    for (int i = 0; i < g->n_plans; i++)
        if (g->plans[i].key == key) {
            g->plans[i].last_use = ++g->clock;
            return &g->plans[i];
        }
    int slot = g->n_plans;
    if (slot == CACHE) { // evict the least recently used plan
        slot = 0;
        for (int i = 1; i < CACHE; i++)
            if (g->plans[i].last_use < g->plans[slot].last_use) slot = i;
        plan_free(&g->plans[slot]);
    } else {
        g->n_plans++;
    }
    int rc = plan_make(g, key, &g->plans[slot]);
    if (rc < 0) {
        // Keep the table dense: move the last plan into the hole.
        if (slot != g->n_plans - 1 && g->n_plans > 0) g->plans[slot] = g->plans[g->n_plans - 1];
        g->n_plans--;
        *rc_out = rc;
        return nullptr;
    }
    g->plans[slot].last_use = ++g->clock;
    return &g->plans[slot];
}

// The key of one call: shape, kind, and the smallest alignment of the
// three pointers and of every row after the first (el: bytes per input
// element; out is bf16).
static GemmKey key_of(int kind, const void *out, int64_t ldo, const void *x, int64_t ldx, const void *w, int64_t m,
                      int64_t n, int64_t k, int accumulate, size_t workspace_bytes) {
    const int64_t el = kind == KIND_BF16 ? 2 : 1;
    GemmKey key;
    memset(&key, 0, sizeof key); // padding compared by memcmp
    key.m = m;
    key.n = n;
    key.k = k;
    key.ldx = ldx;
    key.ldo = ldo;
    key.kind = kind;
    key.accumulate = accumulate ? 1 : 0;
    int al = ptr_align(out);
    if (ptr_align(x) < al) al = ptr_align(x);
    if (ptr_align(w) < al) al = ptr_align(w);
    // Row strides change the alignment of every row after the first.
    int sal = ptr_align((const void *)(uintptr_t)(ldx * el)), sol = ptr_align((const void *)(uintptr_t)(ldo * 2)),
        skl = ptr_align((const void *)(uintptr_t)(k * el));
    if (sal < al) al = sal;
    if (sol < al) al = sol;
    if (skl < al) al = skl;
    key.align = al;
    key.ws = workspace_bytes;
    return key;
}

extern "C" int pg_cuda_gemm_bf16(pg_cuda_gemm *g, void *out, int64_t ldo, const void *x, int64_t ldx,
                                 const void *w, int64_t m, int64_t n, int64_t k, int accumulate,
                                 void *workspace, size_t workspace_bytes, void *stream) {
    PG_ARG(g && out && x && w, "gemm: null pointer");
    PG_ARG(m >= 0 && n > 0 && k > 0 && ldx >= k && ldo >= n, "gemm: m %lld n %lld k %lld ldx %lld ldo %lld",
           (long long)m, (long long)n, (long long)k, (long long)ldx, (long long)ldo);
    if (m == 0) return 0;
    if (!workspace) workspace_bytes = 0;
    int rc = 0;
    GemmPlan *p = plan_get(g, key_of(KIND_BF16, out, ldo, x, ldx, w, m, n, k, accumulate, workspace_bytes), &rc);
    if (!p) return rc;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    PG_LT_TRY(cublasLtMatmul(g->lt, p->desc, &alpha, w, p->a, x, p->b, &beta, out, p->c, out, p->c, &p->algo,
                             workspace, workspace_bytes, pg_stream(stream)));
    return 0;
}

extern "C" int pg_cuda_gemm_fp8(pg_cuda_gemm *g, void *out, int64_t ldo, const void *xq, int64_t ldx,
                                const float *xscales, const void *w, const float *wscales, int64_t m, int64_t n,
                                int64_t k, int accumulate, int fast_accum, void *tmp, size_t tmp_bytes,
                                void *workspace, size_t workspace_bytes, void *stream) {
    PG_ARG(g && out && xq && w && xscales && wscales, "gemm fp8: null pointer");
    PG_ARG(m >= 0 && n > 0 && k > 0 && ldx >= k && ldo >= n, "gemm fp8: m %lld n %lld k %lld ldx %lld ldo %lld",
           (long long)m, (long long)n, (long long)k, (long long)ldx, (long long)ldo);
    // cuBLASLt's FP8 kernels want 16-byte rows (k and the leading
    // dimensions multiples of 16 for 8-bit types).
    if (k % 16 || ldx % 16 || ldo % 8)
        return pg_err_set(PG_EUNSUPP, "gemm fp8: k %lld, ldx %lld and ldo %lld must be multiples of 16, 16 and 8",
                          (long long)k, (long long)ldx, (long long)ldo);
    // The raw sums go to `out` itself, or with `accumulate` (out holds the
    // residual) to tmp, [m][n] contiguous.
    const size_t raw_bytes = (size_t)m * (size_t)n * 2;
    if (accumulate && (!tmp || tmp_bytes < raw_bytes))
        return pg_err_set(PG_EUNSUPP, "gemm fp8: accumulating needs %zu bytes of tmp, %zu given", raw_bytes,
                          tmp ? tmp_bytes : (size_t)0);
    if (m == 0) return 0;
    if (!workspace) workspace_bytes = 0;
    void *raw = accumulate ? tmp : out;
    const int64_t ldr = accumulate ? n : ldo;
    int rc = 0;
    GemmPlan *p = plan_get(
        g, key_of(fast_accum ? KIND_FP8_FAST : KIND_FP8, raw, ldr, xq, ldx, w, m, n, k, 0, workspace_bytes), &rc);
    if (!p) return rc;
    const float alpha = 1.0f, beta = 0.0f;
    PG_LT_TRY(cublasLtMatmul(g->lt, p->desc, &alpha, w, p->a, xq, p->b, &beta, raw, p->c, raw, p->c, &p->algo,
                             workspace, workspace_bytes, pg_stream(stream)));
    return pg_cuda_fp8_rescale(out, ldo, raw, ldr, xscales, wscales, m, n, accumulate, stream);
}
