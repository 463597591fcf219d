// kernels/cpu/gemma_ops.c - the CPU versions of the ops Gemma 3 adds to
// kernels/backend.h (docs/gemma3.md): the GeGLU feed-forward, the
// post-norms' RMSNorm-then-add, and the embedding scale. The exact mode
// runs PyTorch's gelu-tanh in f32 (transformers' arithmetic); the
// llama.cpp-compatible modes run ggml's: the GELU from its fp16 lookup
// table (kernels/cpu/llama_compat.h). The norms, the adds, the scale and
// the soft-cap are the same operations in both (ggml's ggml_scale, tanh,
// ggml_scale for the cap; one f32 multiply for the scale).
#include <math.h>
#include <stdlib.h>

#include "common/err.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/llama_compat.h"

#define F32(t) ((float *)(t).data)

static int check_f32(pg_tensor t, const char *what) {
    PG_ARG(t.dtype == PG_DTYPE_F32 && (t.rows <= 1 || t.stride >= t.cols), "cpu %s: needs f32 rows", what);
    return 0;
}

float pg_cpu_gelu_tanh(float x) {
    // PyTorch's gelu(approximate="tanh"): sqrt(2/pi) as it computes it
    // (M_SQRT2 * M_2_SQRTPI * 0.5), the cube as x * x * x, all in f32.
    const float beta = (float)(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = 0.044715f;
    const float inner = beta * (x + kappa * (x * x * x));
    return 0.5f * x * (1.0f + tanhf(inner));
}

typedef struct {
    float *h;
    const float *gu;
    int64_t ffn, h_stride;
    bool compat; // ggml's table GELU (llama.cpp-compatible modes)
} geglu_job;

static void geglu_task(void *ctx, int64_t i, int thread) {
    (void)thread;
    const geglu_job *j = ctx;
    const float *g = j->gu + i * 2 * j->ffn, *u = g + j->ffn;
    float *o = j->h + i * j->h_stride;
    if (j->compat) {
        pg_lc_geglu_row(o, g, u, j->ffn);
        return;
    }
    for (int64_t e = 0; e < j->ffn; e++) o[e] = pg_cpu_gelu_tanh(g[e]) * u[e];
}

int pg_cpu_gate_up_gelu(pg_backend *b, pg_tensor h, pg_tensor x, const pg_bweight *norm, float eps,
                        const pg_bweight *w, pg_tensor sxn, pg_tensor sgu) {
    pg_cpu_ctx *c = pg_cpu(b);
    const int64_t m = x.rows, ffn = w->rows / 2;
    PG_TRY(check_f32(x, "gate_up_gelu"));
    PG_TRY(check_f32(h, "gate_up_gelu"));
    PG_ARG(x.rows <= 1 || x.stride == x.cols, "cpu gate_up_gelu: x rows must be contiguous");
    pg_cpu_rmsnorm(c, F32(sxn), F32(x), pg_cpu_weight_vec(norm), m, x.cols, eps);
    pg_cpu_matmul_weight(c, F32(sgu), w->rows, F32(sxn), m, w);
    geglu_job j = {.h = F32(h), .gu = F32(sgu), .ffn = ffn, .h_stride = h.stride,
                   .compat = pg_cpu_llama_compat(c)};
    pg_pool_run(c->pool, m, geglu_task, &j);
    return 0;
}

int pg_cpu_rmsnorm_add(pg_backend *b, pg_tensor x, pg_tensor y, const pg_bweight *w, float eps) {
    PG_TRY(check_f32(x, "rmsnorm_add"));
    PG_TRY(check_f32(y, "rmsnorm_add"));
    PG_ARG(x.rows == y.rows && x.cols == y.cols && w->cols == x.cols, "cpu rmsnorm_add: shapes");
    PG_ARG(y.rows <= 1 || y.stride == y.cols, "cpu rmsnorm_add: y rows must be contiguous");
    // The normalised rows first (the rmsnorm kernel's numerics), then the add.
    float *t = pg_xmalloc(sizeof(float) * (size_t)(y.rows * y.cols));
    pg_cpu_rmsnorm(pg_cpu(b), t, F32(y), pg_cpu_weight_vec(w), y.rows, y.cols, eps);
    for (int64_t i = 0; i < x.rows; i++) {
        float *o = F32(x) + i * x.stride;
        const float *n = t + i * y.cols;
        for (int64_t e = 0; e < x.cols; e++) o[e] += n[e];
    }
    free(t);
    return 0;
}

int pg_cpu_softcap(pg_backend *b, pg_tensor x, float cap) {
    (void)b;
    PG_TRY(check_f32(x, "softcap"));
    PG_ARG(cap > 0, "softcap: cap %g", (double)cap);
    const float inv = 1.0f / cap;
    for (int64_t i = 0; i < x.rows; i++) {
        float *o = F32(x) + i * x.stride;
        for (int64_t e = 0; e < x.cols; e++) o[e] = cap * tanhf(o[e] * inv);
    }
    return 0;
}

int pg_cpu_scale(pg_backend *b, pg_tensor x, float s) {
    (void)b;
    PG_TRY(check_f32(x, "scale"));
    for (int64_t i = 0; i < x.rows; i++) {
        float *o = F32(x) + i * x.stride;
        for (int64_t e = 0; e < x.cols; e++) o[e] *= s;
    }
    return 0;
}
