// kernels/cpu/cpu_ops.c - the CPU backend's element-wise ops: RMSNorm, SiLU * mul,
// RoPE + KV write (exact, and llama.cpp-compatible; every KV element type), and
// the numerics modes.
#include <math.h>
#include <string.h>

#include "common/err.h"
#include "kernels/dtype.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/llama_compat.h"


// --- matmul modes ----------------------------------------------------------------

const char *pg_matmul_mode_name(pg_matmul_mode mode) {
    switch (mode) {
    case PG_MATMUL_DEFAULT:
        return "default";
    case PG_MATMUL_EXACT:
        return "exact";
    case PG_MATMUL_QUANT_ACT:
        return "quant";
    }
    return "unknown";
}

int pg_matmul_mode_parse(const char *name, pg_matmul_mode *out) {
    static const pg_matmul_mode modes[] = {PG_MATMUL_DEFAULT, PG_MATMUL_EXACT, PG_MATMUL_QUANT_ACT};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (strcmp(name, pg_matmul_mode_name(modes[i])) == 0) {
            *out = modes[i];
            return 0;
        }
    return pg_err_set(PG_EINVAL, "unknown matmul mode '%s' (default, exact, quant)", name);
}

// --- element-wise ops (rows in parallel) ---------------------------------------

typedef struct {
    float *out;
    const float *x, *y;
    int64_t dim;
    float eps;
    const int32_t *ids;
    const pg_weight *w;
    bool compat; // llama.cpp-compatible numerics
} rows_job;

static void rmsnorm_task(void *ctx, int64_t i, int thread) {
    rows_job *j = ctx;
    const float *x = j->x + i * j->dim;
    float *o = j->out + i * j->dim;
    if (j->compat) {
        pg_lc_rmsnorm_row(o, x, j->y, j->dim, j->eps);
        return;
    }
    double ss = 0.0;
    for (int64_t e = 0; e < j->dim; e++) ss += (double)x[e] * x[e];
    float r = 1.0f / sqrtf((float)(ss / (double)j->dim) + j->eps);
    for (int64_t e = 0; e < j->dim; e++) o[e] = x[e] * r * j->y[e];
}

void pg_cpu_rmsnorm(pg_cpu_ctx *c, float *out, const float *x, const float *weight, int64_t m,
                    int64_t dim, float eps) {
    rows_job j = {
        .out = out, .x = x, .y = weight, .dim = dim, .eps = eps, .compat = pg_cpu_llama_compat(c)};
    pg_pool_run(c->pool, m, rmsnorm_task, &j);
}

void pg_cpu_silu_mul(pg_cpu_ctx *c, float *out, const float *gate_up, int64_t m, int64_t ffn) {
    if (pg_cpu_llama_compat(c)) {
        for (int64_t i = 0; i < m; i++)
            pg_lc_swiglu_row(out + i * ffn, gate_up + i * 2 * ffn, gate_up + i * 2 * ffn + ffn,
                             ffn);
        return;
    }
    for (int64_t i = 0; i < m; i++) {
        const float *g = gate_up + i * 2 * ffn, *u = g + ffn;
        float *o = out + i * ffn;
        for (int64_t e = 0; e < ffn; e++) o[e] = g[e] / (1.0f + expf(-g[e])) * u[e];
    }
}

static void rope_rotate(float *x, int32_t hd, int32_t pos, const float *inv_freq) {
    int32_t half = hd / 2;
    for (int32_t i = 0; i < half; i++) {
        float a = (float)pos * inv_freq[i];
        float c = cosf(a), s = sinf(a);
        float x0 = x[i], x1 = x[i + half];
        x[i] = x0 * c - x1 * s;
        x[i + half] = x1 * c + x0 * s;
    }
}

// llama.cpp's rope angles advance by theta_scale = powf(base, -2/hd) per
// pair; the loader's inv_freq[i] = base^(-2i/hd) (computed in double) gives
// it as inv_freq[1] when the frequencies are plain powers (no rope
// scaling). Returns 0 when they are not.
static float compat_theta_scale(const float *inv_freq, int32_t half) {
    if (half < 2 || inv_freq[0] != 1.0f) return 0.0f;
    double ts = inv_freq[1];
    for (int32_t i = 2; i < half; i++)
        if (fabs(inv_freq[i] - pow(ts, i)) > 1e-5 * pow(ts, i)) return 0.0f;
    return inv_freq[1];
}

// Whether the compatible mode rounds K and V through fp16 before they are
// stored: llama.cpp's f16 cache does, so f32 and f16 caches hold the same
// values (and give the same output); bf16 and q8_0 caches round from f32
// as llama.cpp's -ctk bf16 / q8_0 would.
static bool compat_rounds_f16(int32_t dtype) {
    return dtype == PG_KV_NATIVE || dtype == PG_KV_F32 || dtype == PG_KV_F16;
}

// One head's row into the cache; with an fp8 layer scale s (not 1), x / s
// is what is converted (the CUDA write divides the same way).
static void store_row(pg_kv_shape kv, char *dst, const float *x, float s) {
    if (s == 1.0f) {
        pg_cpu_kv_store_row(kv.dtype, dst, x, kv.head_dim);
        return;
    }
    float t[512];
    for (int32_t d = 0; d < kv.head_dim; d++) t[d] = x[d] / s;
    pg_cpu_kv_store_row(kv.dtype, dst, t, kv.head_dim);
}

// One token's K and V of every KV head into its slot, a head at a time
// (fp8 e4m3 scaled keeps a scale per head row; fp8 e4m3 may have a scale
// per layer and KV head, kv.scales).
static void store_heads(pg_kv_shape kv, char *kd, char *vd, const float *k, const float *v) {
    const size_t hb = pg_cpu_kv_row_bytes(kv.dtype, kv.head_dim);
    const float *sc = kv.dtype == PG_KV_FP8_E4M3 ? kv.scales : NULL;
    for (int32_t h = 0; h < kv.n_kv_heads; h++) {
        store_row(kv, kd + (size_t)h * hb, k + (size_t)h * kv.head_dim, sc ? sc[h] : 1.0f);
        store_row(kv, vd + (size_t)h * hb, v + (size_t)h * kv.head_dim, sc ? sc[kv.n_kv_heads + h] : 1.0f);
    }
}

void pg_cpu_rope_kv_write(pg_cpu_ctx *c, float *q, int64_t q_stride, float *k, int64_t k_stride,
                          const float *v, int64_t v_stride, const int32_t *pos,
                          const int32_t *slots, int64_t m, int32_t n_heads, const float *inv_freq,
                          void *k_cache, void *v_cache, pg_kv_shape kv) {
    const int32_t hd = kv.head_dim, nkv = kv.n_kv_heads;
    const size_t row = (size_t)nkv * (size_t)hd, head_bytes = pg_cpu_kv_row_bytes(kv.dtype, hd);
    const size_t row_bytes = (size_t)nkv * head_bytes;
    char *kb = k_cache, *vb = v_cache;
    if (pg_cpu_attention_compat(c, hd)) {
        // llama.cpp: ggml's rope (or, with scaled frequencies, ours), then K
        // and V stored in the cache; K in llama.cpp's dimension order
        // (attention.c reads it so): the interleaved pairs of its permuted
        // Llama rows, or for Gemma (NEOX) the rows' own.
        const float theta_scale = compat_theta_scale(inv_freq, hd / 2);
        const bool f16 = compat_rounds_f16(kv.dtype);
        float cs[512];
        float *tk = pg_cpu_scratch(c, 0, 2 * row), *tv = tk + row; // the rows as stored, in f32
        for (int64_t i = 0; i < m; i++) {
            if (theta_scale != 0.0f) {
                pg_lc_rope_cache(pos[i], theta_scale, hd / 2, cs);
                for (int32_t h = 0; h < n_heads; h++)
                    pg_lc_rope_row(q + i * q_stride + h * hd, hd / 2, cs);
                for (int32_t h = 0; h < nkv; h++)
                    pg_lc_rope_row(k + i * k_stride + h * hd, hd / 2, cs);
            } else {
                for (int32_t h = 0; h < n_heads; h++)
                    rope_rotate(q + i * q_stride + h * hd, hd, pos[i], inv_freq);
                for (int32_t h = 0; h < nkv; h++)
                    rope_rotate(k + i * k_stride + h * hd, hd, pos[i], inv_freq);
            }
            if (slots[i] < 0) continue;
            const float *ki = k + i * k_stride, *vi = v + i * v_stride;
            for (int32_t h = 0; h < nkv; h++)
                for (int32_t d = 0; d < hd; d++) {
                    float x = ki[h * hd + (kv.lc_gemma ? d : d % 2 ? hd / 2 + d / 2 : d / 2)];
                    tk[h * hd + d] = f16 ? pg_lc_f16(x) : x;
                }
            for (size_t e = 0; e < row; e++) tv[e] = f16 ? pg_lc_f16(vi[e]) : vi[e];
            store_heads(kv, kb + (size_t)slots[i] * row_bytes, vb + (size_t)slots[i] * row_bytes, tk, tv);
        }
        return;
    }
    for (int64_t i = 0; i < m; i++) {
        for (int32_t h = 0; h < n_heads; h++) rope_rotate(q + i * q_stride + h * hd, hd, pos[i], inv_freq);
        for (int32_t h = 0; h < nkv; h++) rope_rotate(k + i * k_stride + h * hd, hd, pos[i], inv_freq);
        if (slots[i] < 0) continue;
        store_heads(kv, kb + (size_t)slots[i] * row_bytes, vb + (size_t)slots[i] * row_bytes, k + i * k_stride,
                    v + i * v_stride);
    }
}
