// kernels/cuda/gemm.cu - bf16 GEMM through cuBLASLt with cached plans.
//
// Row-major out[m][n] = x[m][k] . w[n][k]^T is, in cuBLAS's column-major
// terms, out^T (n x m, ld ldo) = op_T(W: k x n, ld k) * op_N(x^T: k x m,
// ld ldx). Each distinct (m, n, k, ldx, ldo, accumulate, alignment,
// workspace) gets its matmul descriptor, layouts and the heuristic's first
// algorithm once; later calls are a table lookup and cublasLtMatmul, which
// is also legal inside CUDA graph capture (the workspace is the caller's).
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

struct GemmKey {
    int64_t m, n, k, ldx, ldo;
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
        // A = W stored k x n (column-major, ld k); B = x^T k x m (ld ldx); C = out^T n x m (ld ldo).
        PG_LT_TRY(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, (uint64_t)key.k, (uint64_t)key.n, key.k));
        PG_LT_TRY(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, (uint64_t)key.k, (uint64_t)key.m, key.ldx));
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
            return pg_err_set(PG_EUNSUPP, "gemm: no cuBLASLt algorithm for m %lld n %lld k %lld (status %d)",
                              (long long)key.m, (long long)key.n, (long long)key.k, (int)st);
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

extern "C" int pg_cuda_gemm_bf16(pg_cuda_gemm *g, void *out, int64_t ldo, const void *x, int64_t ldx,
                                 const void *w, int64_t m, int64_t n, int64_t k, int accumulate,
                                 void *workspace, size_t workspace_bytes, void *stream) {
    PG_ARG(g && out && x && w, "gemm: null pointer");
    PG_ARG(m >= 0 && n > 0 && k > 0 && ldx >= k && ldo >= n, "gemm: m %lld n %lld k %lld ldx %lld ldo %lld",
           (long long)m, (long long)n, (long long)k, (long long)ldx, (long long)ldo);
    if (m == 0) return 0;
    if (!workspace) workspace_bytes = 0;
    GemmKey key;
    memset(&key, 0, sizeof key); // padding compared by memcmp
    key.m = m;
    key.n = n;
    key.k = k;
    key.ldx = ldx;
    key.ldo = ldo;
    key.accumulate = accumulate ? 1 : 0;
    int al = ptr_align(out);
    if (ptr_align(x) < al) al = ptr_align(x);
    if (ptr_align(w) < al) al = ptr_align(w);
    // Row strides change the alignment of every row after the first.
    int sal = ptr_align((const void *)(uintptr_t)(ldx * 2)), sol = ptr_align((const void *)(uintptr_t)(ldo * 2)),
        skl = ptr_align((const void *)(uintptr_t)(k * 2));
    if (sal < al) al = sal;
    if (sol < al) al = sol;
    if (skl < al) al = skl;
    key.align = al;
    key.ws = workspace_bytes;
    GemmPlan *p = nullptr;
    for (int i = 0; i < g->n_plans; i++)
        if (g->plans[i].key == key) {
            p = &g->plans[i];
            break;
        }
    if (!p) {
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
            return rc;
        }
        p = &g->plans[slot];
    }
    p->last_use = ++g->clock;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    PG_LT_TRY(cublasLtMatmul(g->lt, p->desc, &alpha, w, p->a, x, p->b, &beta, out, p->c, out, p->c, &p->algo,
                             workspace, workspace_bytes, pg_stream(stream)));
    return 0;
}
