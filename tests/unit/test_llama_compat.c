// tests/unit/test_llama_compat.c - the llama.cpp-compatible CPU numerics
// (kernels/cpu/llama_compat.h, the compat attention and RoPE/cache write)
// against the same arithmetic written out plainly here, and against exact
// math for accuracy. Bit-exactness with llama.cpp itself is checked end to
// end by test_llama_logits (identical logits on the golden prompts).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "kernels/cpu/llama_compat.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/unit/rng_test_util.h"

// Uniform in [-1, 1) before the rounding to float (lcg_frand53).
static uint64_t rng = 0x853c49e6748fea9bull;
static float frand(void) { return lcg_frand53(&rng); }

static int32_t ulp_diff(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0) ia = INT32_MIN - ia;
    if (ib < 0) ib = INT32_MIN - ib;
    return ia > ib ? ia - ib : ib - ia;
}

// --- expf --------------------------------------------------------------------------

// The 8-lane path and the one-lane path give the same bits, and both stay
// within 2 ulp of libm over the normal range, with ggml's limits outside it.
static void test_expf_lanes_agree_and_are_accurate(void **state) {
    enum { N = 1 << 16 };
    float *x = malloc(sizeof(float) * N), *v = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) x[i] = frand() * 110.0f - 10.0f; // [-120, 100)
    x[0] = 0.0f, x[1] = -INFINITY, x[2] = 89.0f, x[3] = -104.5f, x[4] = -87.5f, x[5] = 88.3f;
    pg_lc_expf(v, x, N); // vector lanes
    int32_t worst = 0;
    for (int i = 0; i < N; i++) {
        float one;
        pg_lc_expf(&one, x + i, 1); // scalar lane
        if (memcmp(&one, &v[i], 4) != 0)
            fail_msg("x=%.9g: lanes give %.9g and %.9g", x[i], v[i], one);
        if (x[i] > -87.0f && x[i] < 88.0f) {
            int32_t d = ulp_diff(v[i], expf(x[i]));
            if (d > worst) worst = d;
        }
    }
    assert_true(worst <= 2);
    assert_true(v[0] == 1.0f);
    assert_true(v[1] == 0.0f && !signbit(v[1]));
    assert_true(isinf(v[2]));
    assert_true(v[3] >= 0.0f && v[3] < 1e-44f);
    assert_true(fabsf(v[4] - expf(-87.5f)) <= 1e-43f);
    print_message("expf: worst %d ulp vs libm on (-87, 88)\n", worst);
    free(x);
    free(v);
}

// --- row ops -----------------------------------------------------------------------

static void test_rmsnorm_swiglu_softmax_follow_ggml_formulas(void **state) {
    enum { N = 1536 + 5 };
    float x[N], w[N], y[N], g[N], u[N], o[N];
    for (int i = 0; i < N; i++)
        x[i] = 3 * frand(), w[i] = frand(), g[i] = 8 * frand(), u[i] = frand();
    // RMSNorm: f32 squares summed in double, f32 scale, (x * scale) * w.
    pg_lc_rmsnorm_row(y, x, w, 576, 1e-5f);
    double ss = 0;
    for (int i = 0; i < 576; i++) ss += (double)(float)(x[i] * x[i]);
    float scale = 1.0f / sqrtf((float)(ss / 576) + 1e-5f);
    for (int i = 0; i < 576; i++) assert_true(y[i] == x[i] * scale * w[i]);
    // SwiGLU: vector silu over whole groups of 8, libm expf for the tail.
    pg_lc_swiglu_row(o, g, u, N);
    for (int i = 0; i < N; i++) {
        float e;
        float neg = 0.0f - g[i];
        if (i < N - N % 8)
            pg_lc_expf(&e, &neg, 1);
        else
            e = expf(-g[i]);
        float want = g[i] / (1.0f + e) * u[i];
        if (memcmp(&want, &o[i], 4) != 0) fail_msg("swiglu %d: %.9g vs %.9g", i, o[i], want);
    }
    // Softmax over 8-position chunks.
    for (int n = 1; n <= 40; n += 3) {
        float s[40], p[40];
        for (int i = 0; i < n; i++) s[i] = 6 * frand();
        pg_lc_softmax_row(p, s, n);
        float mx = s[0];
        for (int i = 1; i < n; i++) mx = fmaxf(mx, s[i]);
        double sum = 0, total = 0;
        float e[40];
        for (int c = 0; c < n; c += 8) {
            float chunk[8] = {0};
            for (int k = 0; k < 8 && c + k < n; k++) {
                float d = s[c + k] - mx;
                pg_lc_expf(&e[c + k], &d, 1);
                chunk[k] = e[c + k];
            }
            sum += (double)pg_lc_hsum8(chunk);
        }
        float inv = (float)(1.0 / sum);
        for (int i = 0; i < n; i++) {
            assert_true(p[i] == e[i] * inv);
            total += p[i];
        }
        assert_true(fabs(total - 1.0) < 1e-6);
    }
}

// --- RoPE and the cache write ----------------------------------------------------------

static pg_backend *backend(pg_matmul_mode mode) {
    pg_backend *b;
    assert_int_equal(pg_backend_cpu_create(2, mode, &b), 0);
    return b;
}

// Compat RoPE: angles by the f32 recurrence, rotation with ggml's fused
// multiply-adds; K and V land in the cache rounded to fp16.
static void test_rope_kv_write_compat(void **state) {
    enum { M = 4, NH = 3, NKV = 1, HD = 64, BS = 16 };
    const float base = 100000.0f;
    float inv_freq[HD / 2];
    for (int i = 0; i < HD / 2; i++) inv_freq[i] = (float)(1.0 / pow(base, 2.0 * i / HD));
    float q[M * NH * HD], k[M * NKV * HD], v[M * NKV * HD], q0[M * NH * HD], k0[M * NKV * HD];
    for (int i = 0; i < M * NH * HD; i++) q[i] = q0[i] = frand();
    for (int i = 0; i < M * NKV * HD; i++) k[i] = k0[i] = frand(), v[i] = frand();
    float *kc = calloc(4 * BS * NKV * HD, sizeof(float)),
          *vc = calloc(4 * BS * NKV * HD, sizeof(float));
    int32_t pos[M] = {0, 1, 37, 1000}, slots[M] = {16, 17, 40, 5};
    pg_backend *b = backend(PG_MATMUL_QUANT_ACT);
    pg_cpu_rope_kv_write(pg_cpu(b), q, NH * HD, k, NKV * HD, v, NKV * HD, pos, slots, M, NH, inv_freq, kc, vc,
                     (pg_kv_shape){4, BS, NKV, HD, PG_KV_BF16, NULL, false, 0, 0.0f});
    const float theta_scale = powf(base, -2.0f / HD);
    assert_true(theta_scale == inv_freq[1]);
    for (int t = 0; t < M; t++) {
        float theta = (float)pos[t];
        for (int i = 0; i < HD / 2; i++) {
            float c = cosf(theta), s = sinf(theta);
            for (int h = 0; h < NH + NKV; h++) {
                const float *x = h < NH ? q0 + (t * NH + h) * HD : k0 + (t * NKV + h - NH) * HD;
                const float *got = h < NH ? q + (t * NH + h) * HD : k + (t * NKV + h - NH) * HD;
                float x1s = x[i + HD / 2] * s, x1c = x[i + HD / 2] * c;
                assert_true(got[i] == fmaf(x[i], c, -x1s));
                assert_true(got[i + HD / 2] == fmaf(x[i], s, x1c));
                // and close to the exact rotation
                double a = (double)pos[t] * pow(base, -2.0 * i / HD);
                assert_true(fabs(got[i] - (x[i] * cos(a) - x[i + HD / 2] * sin(a))) < 1e-4);
            }
            theta *= theta_scale;
        }
        // K in llama.cpp's dimension order (rotary pairs adjacent), V as is.
        for (int h = 0; h < NKV; h++)
            for (int d = 0; d < HD; d++) {
                int ours = d % 2 ? HD / 2 + d / 2 : d / 2;
                assert_true(kc[(slots[t] * NKV + h) * HD + d] ==
                            pg_lc_f16(k[(t * NKV + h) * HD + ours]));
                assert_true(vc[(slots[t] * NKV + h) * HD + d] ==
                            pg_lc_f16(v[(t * NKV + h) * HD + d]));
            }
    }
    free(kc);
    free(vc);
    b->dev->destroy(b);
}

// --- attention -----------------------------------------------------------------------------

// llama.cpp's attention for one query and head, plainly: dimension g of
// llama.cpp's head is our g/2 (even g) or hd/2 + g/2 (odd g).
static void ref_attention_compat(float *out, const float *q, const float *k, const float *v,
                                 int n_keys, int n_kv, int kvh, int hd, float scale) {
    float qg[128], s[256], e[256];
    for (int g = 0; g < hd; g++) qg[g] = pg_lc_f16(q[g % 2 ? hd / 2 + g / 2 : g / 2]);
    float mx = -INFINITY;
    for (int t = 0; t < n_keys; t++) {
        const float *kt = k + ((size_t)t * n_kv + kvh) * hd;
        float a[8] = {0};
        for (int g = 0; g < hd; g++)
            a[g % 8] = fmaf(kt[g % 2 ? hd / 2 + g / 2 : g / 2], qg[g], a[g % 8]);
        s[t] = pg_lc_hsum8(a) * scale;
        mx = fmaxf(mx, s[t]);
    }
    double sum = 0;
    for (int c = 0; c < n_keys; c += 8) {
        float chunk[8] = {0};
        for (int l = 0; l < 8 && c + l < n_keys; l++) {
            float d = s[c + l] - mx;
            pg_lc_expf(&e[c + l], &d, 1);
            chunk[l] = e[c + l];
        }
        sum += (double)pg_lc_hsum8(chunk);
    }
    float inv = (float)(1.0 / sum);
    for (int t = 0; t < n_keys; t++) e[t] = pg_lc_f16(e[t] * inv);
    for (int d = 0; d < hd; d++) {
        float a[8] = {0};
        for (int t = 0; t < n_keys; t++)
            a[t % 8] = fmaf(v[((size_t)t * n_kv + kvh) * hd + d], e[t], a[t % 8]);
        out[d] = pg_lc_hsum8(a);
    }
}

static void test_attention_compat_matches_plain_reference(void **state) {
    enum { HD = 64, NH = 9, NKV = 3, BS = 16, CTX = 150, NBLK = 12 };
    const int n_q = 6, start = CTX - n_q;
    float *k = malloc(sizeof(float) * CTX * NKV * HD), *v = malloc(sizeof(float) * CTX * NKV * HD);
    for (int i = 0; i < CTX * NKV * HD; i++) k[i] = pg_lc_f16(frand()), v[i] = pg_lc_f16(frand());
    float *kc = calloc((size_t)NBLK * BS * NKV * HD, sizeof(float)),
          *vc = calloc((size_t)NBLK * BS * NKV * HD, sizeof(float));
    int32_t table[NBLK - 1];
    for (int i = 0; i < NBLK - 1; i++) table[i] = NBLK - 1 - i; // blocks in reverse order
    // The caches as the compat cache write leaves them (K in llama.cpp's
    // order), and for the exact mode's comparison in our order.
    float *kx = calloc((size_t)NBLK * BS * NKV * HD, sizeof(float));
    for (int t = 0; t < CTX; t++) {
        size_t slot = (size_t)table[t / BS] * BS + t % BS;
        for (int h = 0; h < NKV; h++)
            for (int d = 0; d < HD; d++)
                kc[(slot * NKV + h) * HD + d] =
                    k[((size_t)t * NKV + h) * HD + (d % 2 ? HD / 2 + d / 2 : d / 2)];
        memcpy(kx + slot * NKV * HD, k + (size_t)t * NKV * HD, sizeof(float) * NKV * HD);
        memcpy(vc + slot * NKV * HD, v + (size_t)t * NKV * HD, sizeof(float) * NKV * HD);
    }
    float q[6 * NH * HD], out[6 * NH * HD], ref[HD], exact_out[6 * NH * HD];
    for (int i = 0; i < n_q * NH * HD; i++) q[i] = 2 * frand();
    pg_attn_seq seq = {0, n_q, start, table, 0, 0.0f};
    const pg_kv_shape kv = {NBLK, BS, NKV, HD, PG_KV_BF16, NULL, false, 0, 0.0f};
    const float scale = 0.125f;
    pg_backend *b = backend(PG_MATMUL_DEFAULT), *x = backend(PG_MATMUL_EXACT);
    pg_cpu_attention(pg_cpu(b), out, q, NH * HD, &seq, 1, NH, scale, kc, vc, kv);
    pg_cpu_attention(pg_cpu(x), exact_out, q, NH * HD, &seq, 1, NH, scale, kx, vc, kv);
    double num = 0, den = 0;
    for (int i = 0; i < n_q; i++)
        for (int h = 0; h < NH; h++) {
            ref_attention_compat(ref, q + (i * NH + h) * HD, k, v, start + i + 1, NKV, h / 3, HD,
                                 scale);
            assert_memory_equal(out + (i * NH + h) * HD, ref, sizeof ref);
            for (int d = 0; d < HD; d++) {
                double df = out[(i * NH + h) * HD + d] - exact_out[(i * NH + h) * HD + d];
                num += df * df;
                den += (double)exact_out[(i * NH + h) * HD + d] * exact_out[(i * NH + h) * HD + d];
            }
        }
    // fp16 rounding of q and of the probabilities: close to exact, not equal.
    print_message("compat vs exact attention: rel %.2e\n", sqrt(num / den));
    assert_true(sqrt(num / den) < 3e-3);
    free(k), free(v), free(kc), free(kx), free(vc);
    b->dev->destroy(b);
    x->dev->destroy(x);
}

// --- GeGLU (Gemma) -------------------------------------------------------------------

// ggml_gelu_f32 written out, with the fma gcc makes of 1 + a*x*x.
static float ref_gelu_f32(float x) {
    return 0.5f * x * (1.0f + tanhf(0.79788456080286535587989211986876f * x * fmaf(0.044715f * x, x, 1.0f)));
}

// ggml_vec_geglu_f32 with GGML_GELU_FP16: 0 at or below -10, x at or above
// 10, else the f16 rounding of gelu(f16 rounding of x).
static float ref_gelu_table(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return pg_lc_f16(ref_gelu_f32(pg_lc_f16(x)));
}

static bool same_bits(float a, float b) {
    return memcmp(&a, &b, sizeof a) == 0;
}

static void test_gelu_table_and_geglu_follow_ggml(void **state) {
    (void)state;
    // Every finite f16 value: the table entry.
    for (uint32_t h = 0; h < 65536; h++) {
        const float x = pg_f16_to_f32((uint16_t)h);
        if (!isfinite(x)) continue;
        if (!same_bits(pg_lc_gelu(x), ref_gelu_table(x)))
            fail_msg("gelu(%a) = %a, ggml's table %a", (double)x, (double)pg_lc_gelu(x), (double)ref_gelu_table(x));
        assert_true(same_bits(pg_lc_gelu_f32(x), ref_gelu_f32(x)));
    }
    // f32 values between the codes and around the clamps.
    static const float edges[] = {-10.0f, 10.0f, -9.999f, 9.999f, -10.001f, 10.001f, 0.0f, -0.0f, 1e-8f, -1e-8f, 65519.0f, 1e30f, -1e30f};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        assert_true(same_bits(pg_lc_gelu(edges[i]), ref_gelu_table(edges[i])));
    assert_true(pg_lc_gelu(-10.0f) == 0.0f && pg_lc_gelu(10.0f) == 10.0f && pg_lc_gelu(1e30f) == 1e30f);
    // The table is not the plain formula: somewhere they part.
    int differ = 0;
    for (int i = 0; i < 20000; i++) {
        const float x = 12.0f * frand();
        assert_true(same_bits(pg_lc_gelu(x), ref_gelu_table(x)));
        differ += !same_bits(pg_lc_gelu(x), ref_gelu_f32(x));
    }
    assert_true(differ > 1000);
    // The row: out = gelu(g) * u, one multiply; out may alias g.
    enum { N = 37 };
    float g[N], u[N], out[N];
    for (int i = 0; i < N; i++) g[i] = 14.0f * frand(), u[i] = 3.0f * frand();
    pg_lc_geglu_row(out, g, u, N);
    for (int i = 0; i < N; i++) assert_true(same_bits(out[i], ref_gelu_table(g[i]) * u[i]));
    pg_lc_geglu_row(g, g, u, N);
    assert_memory_equal(g, out, sizeof out);
}

// --- ggml_vec_dot_f16 ------------------------------------------------------------------

static void test_dot_f16_follows_ggml_order(void **state) {
    (void)state;
    static const int ns[] = {1, 7, 32, 64, 80, 256, 300};
    float x[300], y[300];
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        const int n = ns[k];
        for (int i = 0; i < n; i++) x[i] = pg_lc_f16(4 * frand()), y[i] = pg_lc_f16(frand());
        // Written out: 4 vectors of 8 accumulators over each 32, reduced
        // (0 + 2) + (1 + 3), then ((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7)),
        // the tail in double.
        float acc[4][8] = {{0}};
        const int np = n / 32 * 32;
        for (int i = 0; i < np; i++) acc[(i % 32) / 8][i % 8] = fmaf(x[i], y[i], acc[(i % 32) / 8][i % 8]);
        float l[8];
        for (int j = 0; j < 8; j++) l[j] = (acc[0][j] + acc[2][j]) + (acc[1][j] + acc[3][j]);
        double want = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
        for (int i = np; i < n; i++) want += (double)(x[i] * y[i]);
        assert_true(same_bits(pg_lc_dot_f16(x, y, n), (float)want));
    }
}

// A lone query (one sequence, one token: llama.cpp's n = 1 path) against
// the formulas: scores as ggml_vec_dot_f16 over the dimensions, softmax,
// fp16 probabilities, each output dimension as ggml_vec_dot_f16 over the
// positions, in Gemma's layout (lc_gemma: the rows' order, q scaled before
// its fp16 rounding). The Llama family keeps the batched order for a lone
// query (kernels/cpu/attention.c, attend_vec1: speed), so the Llama layout
// is not checked here.
static void test_attention_single_query_follows_vec_dot_f16(void **state) {
    (void)state;
    enum { HD = 64, NH = 4, NKV = 2, BS = 16, CTX = 77, NBLK = 6 };
    float *k = malloc(sizeof(float) * CTX * NKV * HD), *v = malloc(sizeof(float) * CTX * NKV * HD);
    for (int i = 0; i < CTX * NKV * HD; i++) k[i] = pg_lc_f16(frand()), v[i] = pg_lc_f16(frand());
    int32_t table[NBLK];
    for (int i = 0; i < NBLK; i++) table[i] = NBLK - 1 - i;
    float *kc = calloc((size_t)NBLK * BS * NKV * HD, sizeof(float)), *vc = calloc((size_t)NBLK * BS * NKV * HD, sizeof(float));
    float q[NH * HD], out[NH * HD];
    for (int i = 0; i < NH * HD; i++) q[i] = 2 * frand();
    pg_backend *b = backend(PG_MATMUL_DEFAULT);
    for (int gemma = 1; gemma < 2; gemma++) {
        for (int t = 0; t < CTX; t++) { // K as the compat cache write stores it
            const size_t slot = (size_t)table[t / BS] * BS + t % BS;
            for (int h = 0; h < NKV; h++)
                for (int d = 0; d < HD; d++)
                    kc[(slot * NKV + h) * HD + d] =
                        k[((size_t)t * NKV + h) * HD + (gemma ? d : d % 2 ? HD / 2 + d / 2 : d / 2)];
            memcpy(vc + slot * NKV * HD, v + (size_t)t * NKV * HD, sizeof(float) * NKV * HD);
        }
        const float scale = 0.125f;
        pg_attn_seq seq = {0, 1, CTX - 1, table, 0, 0.0f};
        pg_kv_shape kv = {NBLK, BS, NKV, HD, PG_KV_F32, NULL, gemma, 0, 0.0f};
        pg_cpu_attention(pg_cpu(b), out, q, NH * HD, &seq, 1, NH, scale, kc, vc, kv);
        for (int h = 0; h < NH; h++) {
            const int kvh = h / (NH / NKV);
            float q16[HD], kr[HD], p[CTX], col[CTX], pr[CTX];
            for (int d = 0; d < HD; d++)
                q16[d] = gemma ? pg_lc_f16(q[h * HD + d] * scale) : pg_lc_f16(q[h * HD + (d % 2 ? HD / 2 + d / 2 : d / 2)]);
            for (int t = 0; t < CTX; t++) {
                for (int d = 0; d < HD; d++)
                    kr[d] = k[((size_t)t * NKV + kvh) * HD + (gemma ? d : d % 2 ? HD / 2 + d / 2 : d / 2)];
                p[t] = pg_lc_dot_f16(kr, q16, HD) * (gemma ? 1.0f : scale);
            }
            pg_lc_softmax_row(p, p, CTX);
            for (int t = 0; t < CTX; t++) p[t] = pg_lc_f16(p[t]);
            // Positions past CTX are llama.cpp's padding: probability 0.
            float pad[96] = {0}, vpad[96] = {0};
            memcpy(pr, p, sizeof p);
            for (int e = 0; e < HD; e++) {
                for (int t = 0; t < CTX; t++) col[t] = v[((size_t)t * NKV + kvh) * HD + e];
                memcpy(pad, pr, sizeof(float) * CTX);
                memcpy(vpad, col, sizeof(float) * CTX);
                const float want = pg_lc_dot_f16(vpad, pad, 96);
                if (!same_bits(out[h * HD + e], want))
                    fail_msg("gemma=%d head %d dim %d: %a vs %a", gemma, h, e, (double)out[h * HD + e], (double)want);
            }
        }
    }
    free(k), free(v), free(kc), free(vc);
    b->dev->destroy(b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expf_lanes_agree_and_are_accurate),
        cmocka_unit_test(test_rmsnorm_swiglu_softmax_follow_ggml_formulas),
        cmocka_unit_test(test_rope_kv_write_compat),
        cmocka_unit_test(test_attention_compat_matches_plain_reference),
        cmocka_unit_test(test_gelu_table_and_geglu_follow_ggml),
        cmocka_unit_test(test_dot_f16_follows_ggml_order),
        cmocka_unit_test(test_attention_single_query_follows_vec_dot_f16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
