// tests/unit/test_kv_cache.c - the CPU KV cache's element types (f16, bf16,
// q8_0, fp8 e4m3 with scale 1.0 and with a scale per head row;
// kernels/cpu/kv_cache.c): the row codecs, the q8_0 block layout and round
// trip, the fp8 rows (saturation at scale 1.0, the per-row scale), attention over each type against the f32 cache on random
// inputs (both numerics, several head dims, GQA groups, context lengths,
// prefill and decode), and the byte moves (swap out / in, copy-on-write).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/half.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dtype.h"
#include "tests/unit/rng_test_util.h"

// One stream for both: uniform in [-1, 1), and in [0, n).
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { return lcg_frand(&rng); }
static uint32_t urand(uint32_t n) { return lcg_u31(&rng) % n; }

// --- row codecs ----------------------------------------------------------------------

// f16 and bf16 rows read back as the scalar round-to-nearest-even of every
// element (the AVX2 body and the scalar tail alike: n = 37).
static void test_half_rows_round_trip(void **state) {
    enum { N = 37 };
    float x[N], y[N];
    uint16_t h[N];
    for (int i = 0; i < N; i++) x[i] = frand() * (i % 5 == 0 ? 1e4f : 1.0f);
    x[3] = 0.0f, x[4] = -0.0f, x[5] = 1e-6f; // zero, negative zero, an fp16 subnormal
    assert_int_equal(pg_cpu_kv_row_bytes(PG_KV_F16, N), 2 * N);
    pg_cpu_kv_store_row(PG_KV_F16, h, x, N);
    pg_cpu_kv_load_row(PG_KV_F16, h, y, N);
    for (int i = 0; i < N; i++) assert_true(y[i] == pg_f16_to_f32(pg_f32_to_f16(x[i])));
    pg_cpu_kv_store_row(PG_KV_BF16_CPU, h, x, N);
    pg_cpu_kv_load_row(PG_KV_BF16_CPU, h, y, N);
    for (int i = 0; i < N; i++) assert_true(y[i] == pg_bf16_to_f32(pg_f32_to_bf16(x[i])));
    // f32 (and the native type) are copies.
    pg_cpu_kv_store_row(PG_KV_F32, y, x, N);
    assert_memory_equal(x, y, sizeof x);
    assert_int_equal(pg_cpu_kv_row_bytes(PG_KV_NATIVE, N), 4 * N);
}

// fp8 e4m3 at scale 1.0 (the CUDA cache's bytes): each element is
// pg_f32_to_fp8_e4m3 (round to nearest even), read back exactly as that
// code's value; beyond +-448 it saturates to +-448 (0x7e / 0xfe), never
// NaN; storing what was read gives the same bytes. n = 37: the AVX2 body
// and the scalar tail.
static void test_fp8_rows_saturate(void **state) {
    enum { N = 37 };
    float x[N], y[N], z[N];
    uint8_t b[N], b2[N];
    assert_int_equal(pg_cpu_kv_row_bytes(PG_KV_FP8_E4M3, N), N);
    for (int trial = 0; trial < 50; trial++) {
        const float mag = powf(10.0f, (float)urand(7) - 3.0f); // 1e-3 .. 1e3
        for (int i = 0; i < N; i++) x[i] = frand() * mag;
        x[0] = 1000.0f, x[1] = -1e6f, x[2] = 448.0f, x[3] = 0.0f, x[4] = 0.3f * 0x1p-6f; // a subnormal
        x[5] = 1.0625f; // halfway between 1 and 1.125: rounds to even (1)
        pg_cpu_kv_store_row(PG_KV_FP8_E4M3, b, x, N);
        pg_cpu_kv_load_row(PG_KV_FP8_E4M3, b, y, N);
        for (int i = 0; i < N; i++) {
            assert_int_equal(b[i], pg_f32_to_fp8_e4m3(x[i]));
            assert_true(y[i] == pg_fp8_e4m3_to_f32(b[i]));
            assert_true(fabsf(y[i]) <= 448.0f);
            if (fabsf(x[i]) >= 0x1p-6f && fabsf(x[i]) <= 448.0f) // normal: within half a step, 2^-4 relative
                assert_true(fabsf(y[i] - x[i]) <= 0x1p-4f * fabsf(x[i]));
        }
        assert_int_equal(b[0], 0x7e);
        assert_int_equal(b[1], 0xfe);
        assert_true(y[0] == 448.0f && y[1] == -448.0f && y[2] == 448.0f && y[3] == 0.0f && y[5] == 1.0f);
        pg_cpu_kv_store_row(PG_KV_FP8_E4M3, b2, y, N);
        assert_memory_equal(b, b2, sizeof b);
        pg_cpu_kv_load_row(PG_KV_FP8_E4M3, b2, z, N);
        assert_memory_equal(y, z, sizeof y);
    }
}

// fp8 e4m3 scaled: a head row is the f32 s = max|x| / 448 (bytes 0-3) then
// head_dim codes q = e4m3(x * (1 / s)), as pg_quantize_row_fp8 makes FP8
// weight rows; it reads back as s * e4m3(q). So the largest element comes
// back within an f32 rounding, nothing saturates at any magnitude (1e-4 ..
// 1e6 here, where scale 1.0 clips everything above 448), normal elements
// are within 2^-4 relative, and an all-zero row is zeros (s = 1). The row
// is head_dim + 4 bytes.
static void test_fp8_scaled_rows(void **state) {
    enum { HD = 64 };
    assert_int_equal(pg_cpu_kv_row_bytes(PG_KV_FP8_E4M3_SCALED, HD), HD + 4);
    assert_int_equal(pg_cpu_kv_row_bytes(PG_KV_FP8_E4M3_SCALED, 40), 44);
    for (int trial = 0; trial < 200; trial++) {
        float x[HD], y[HD], z[HD];
        uint8_t b[HD + 4], b2[HD + 4], q[HD];
        const float mag = powf(10.0f, (float)urand(11) - 4.0f); // 1e-4 .. 1e6
        for (int i = 0; i < HD; i++) x[i] = frand() * mag;
        if (trial % 7 == 0) memset(x, 0, sizeof x);
        if (trial % 5 == 1) x[17] = -30.0f * mag; // an outlier
        pg_cpu_kv_store_row(PG_KV_FP8_E4M3_SCALED, b, x, HD);
        pg_cpu_kv_load_row(PG_KV_FP8_E4M3_SCALED, b, y, HD);
        float amax = 0.0f, s, want;
        for (int i = 0; i < HD; i++) amax = fmaxf(amax, fabsf(x[i]));
        memcpy(&s, b, 4);
        pg_quantize_row_fp8(x, HD, q, &want);
        assert_true(s == want && s == (amax > 0 ? amax / 448.0f : 1.0f));
        assert_memory_equal(b + 4, q, HD);
        for (int i = 0; i < HD; i++) {
            assert_true(y[i] == s * pg_fp8_e4m3_to_f32(b[4 + i]));
            if (fabsf(x[i]) == amax) assert_true(fabsf(fabsf(y[i]) - amax) <= 1e-6f * amax);
            if (fabsf(x[i]) >= 0x1p-6f * s) // normal after scaling
                assert_true(fabsf(y[i] - x[i]) <= 0x1p-4f * fabsf(x[i]) * (1 + 1e-6f));
            else
                assert_true(fabsf(y[i] - x[i]) <= 0x1p-10f * s * (1 + 1e-6f)); // half a subnormal step
        }
        if (amax == 0.0f)
            for (int i = 0; i < HD; i++) assert_true(y[i] == 0.0f);
        // Storing what was read gives the same codes (the scale may differ
        // by an f32 rounding of the largest element: the values match).
        pg_cpu_kv_store_row(PG_KV_FP8_E4M3_SCALED, b2, y, HD);
        pg_cpu_kv_load_row(PG_KV_FP8_E4M3_SCALED, b2, z, HD);
        for (int i = 0; i < HD; i++) assert_true(fabsf(z[i] - y[i]) <= 1e-6f * amax);
    }
}

// q8_0 is llama.cpp's block_q8_0: bytes 0-1 the fp16 d = amax / 127, then
// 32 int8 q = round_half_even(x * 127 / amax). Each element reads back
// within half a step d of the input (plus the scale's fp16 rounding, at most
// 127 |fp16(d) - d|), i.e. about 1/254 of the block's max; and storing what
// was read gives the same bytes again.
static void test_q8_0_block_round_trip(void **state) {
    enum { HD = 128, NB = HD / 32 };
    assert_int_equal(pg_cpu_kv_row_bytes(PG_KV_Q8_0, HD), NB * 34);
    assert_int_equal(pg_cpu_kv_row_bytes(PG_KV_Q8_0, 48), 0); // not whole blocks
    for (int trial = 0; trial < 200; trial++) {
        float x[HD], y[HD], z[HD];
        uint8_t b[NB * 34], b2[NB * 34];
        const float mag = powf(10.0f, (float)urand(9) - 4.0f); // 1e-4 .. 1e4
        for (int i = 0; i < HD; i++) x[i] = frand() * mag;
        if (trial % 7 == 0)
            for (int i = 0; i < 32; i++) x[i] = 0.0f; // an all-zero block
        if (trial % 5 == 0) x[40] = 50.0f * mag;                  // one outlier in block 1
        pg_cpu_kv_store_row(PG_KV_Q8_0, b, x, HD);
        pg_cpu_kv_load_row(PG_KV_Q8_0, b, y, HD);
        for (int k = 0; k < NB; k++) {
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[k * 32 + i]));
            uint16_t dh;
            memcpy(&dh, b + k * 34, 2);
            assert_int_equal(dh, pg_f32_to_f16(amax / 127.0f));
            const float d = amax / 127.0f, d16 = pg_f16_to_f32(dh);
            for (int i = 0; i < 32; i++) {
                const float xi = x[k * 32 + i];
                const int8_t q = (int8_t)b[k * 34 + 2 + i];
                assert_int_equal(q, amax > 0 ? (int)nearbyintf(xi * (127.0f / amax)) : 0);
                assert_true(y[k * 32 + i] == d16 * (float)q);
                const double bound = 0.5 * d * (1 + 1e-5) + 127.0 * fabs((double)d16 - d) + 1e-30;
                if (fabs((double)y[k * 32 + i] - xi) > bound)
                    fail_msg("block %d elem %d: %g -> %g (d %g)", k, i, xi, y[k * 32 + i], d);
            }
        }
        pg_cpu_kv_store_row(PG_KV_Q8_0, b2, y, HD);
        assert_memory_equal(b, b2, sizeof b);
        pg_cpu_kv_load_row(PG_KV_Q8_0, b2, z, HD);
        assert_memory_equal(y, z, sizeof y);
    }
}

// --- attention over each type against the f32 cache -----------------------------------

typedef struct {
    int32_t dtype;
    const char *name;
    double bound; // relative RMS difference from the f32 cache's output
} kv_type;

// One configuration: n_seqs sequences with random contexts (prefill,
// decode and chunked queries), K and V written through pg_cpu_rope_kv_write
// into shuffled blocks of a cache of each type, attention compared with the
// f32 cache's. Returns nothing; asserts each type's bound.
static void check_types(pg_matmul_mode mode, int n_seqs, int n_heads, int n_kv, int hd, int bs, int max_ctx) {
    pg_backend *be;
    assert_int_equal(pg_backend_cpu_create(2, mode, &be), 0);
    pg_cpu_ctx *c = pg_cpu(be);
    const bool compat = pg_cpu_attention_compat(c, hd);
    // Bounds. An element of an f16 cache is the f32 one within half an ulp,
    // 2^-12 relative (2.4e-4), bf16 2^-9 (2.0e-3); the output is a
    // softmax-weighted mean of V rows (error at most V's) plus the scores'
    // change through K, a sum of hd such errors with random signs, so its
    // relative RMS stays near one half-ulp (measured 0.9x): bound 2x, 5e-4
    // for f16 and 4e-3 for bf16. q8_0: each element within half a step of
    // 1/127 of its block's max (uniform values: RMS error 1/254 of the RMS
    // value; measured 1/225 with K's part): bound 1/127. In the compatible
    // mode f32 and f16 caches hold the same f16-rounded values: identical.
    // fp8 e4m3: 3 mantissa bits, each normal element within 2^-4
    // relative, RMS about 2^-4 / sqrt(3) of |x| for uniform mantissas;
    // values below 2^-6 are subnormal at scale 1.0 (steps of 2^-9): bound
    // 0.05 for both, measured 0.024 .. 0.029 (uniform values in [-1, 1):
    // the per-row scale gains nothing where scale 1.0 neither saturates nor
    // goes much into subnormals).
    const kv_type types[] = {
        {PG_KV_F16, "f16", compat ? 0.0 : 5e-4},
        {PG_KV_BF16_CPU, "bf16", 4e-3},
        {PG_KV_FP8_E4M3, "fp8", 0.05},
        {PG_KV_FP8_E4M3_SCALED, "fp8s", 0.05},
        {PG_KV_Q8_0, "q8_0", 1.0 / 127}, // last: only with head_dim % 32 == 0
    };
    const int nt = hd % 32 == 0 ? 5 : 4;
    const int blocks_per_seq = (max_ctx + bs - 1) / bs, n_blocks = 1 + n_seqs * blocks_per_seq;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks - 1; i++) perm[i] = i + 1;
    for (int i = n_blocks - 2; i > 0; i--) {
        int j = (int)urand((uint32_t)i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    pg_attn_seq *seqs = calloc((size_t)n_seqs, sizeof(pg_attn_seq));
    int total_q = 0, total_kv = 0;
    for (int s = 0; s < n_seqs; s++) {
        int ctx = 1 + (int)urand((uint32_t)max_ctx);
        if (s == 0) ctx = max_ctx; // the longest context is always there
        int n_q = s % 3 == 0 ? ctx : (s % 3 == 1 ? 1 : 1 + ctx / 3); // prefill, decode, chunk
        seqs[s] = (pg_attn_seq){total_q, n_q, ctx - n_q, perm + s * blocks_per_seq, 0, 0.0f};
        total_q += n_q;
        total_kv += ctx;
    }
    // Every cached token: its slot and position, K and V rows.
    const size_t row = (size_t)n_kv * hd;
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)total_kv), *pos = malloc(sizeof(int32_t) * (size_t)total_kv);
    float *k0 = malloc(sizeof(float) * row * (size_t)total_kv), *v0 = malloc(sizeof(float) * row * (size_t)total_kv);
    float *kw = malloc(sizeof(float) * row * (size_t)total_kv);
    for (int s = 0, n = 0; s < n_seqs; s++)
        for (int t = 0; t < seqs[s].start_pos + seqs[s].n_q; t++, n++) {
            slots[n] = seqs[s].block_table[t / bs] * bs + t % bs;
            pos[n] = t;
        }
    for (size_t i = 0; i < row * (size_t)total_kv; i++) k0[i] = frand(), v0[i] = frand();
    float inv_freq[256];
    for (int i = 0; i < hd / 2; i++) inv_freq[i] = powf(10000.0f, -2.0f * (float)i / (float)hd);
    const size_t qn = (size_t)total_q * n_heads * hd;
    float *q = malloc(sizeof(float) * qn), *ref = malloc(sizeof(float) * qn), *out = malloc(sizeof(float) * qn);
    for (size_t i = 0; i < qn; i++) q[i] = frand() * 2.0f;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int ti = -1; ti < nt; ti++) { // -1: the f32 reference
        const int32_t dt = ti < 0 ? PG_KV_F32 : types[ti].dtype;
        const pg_kv_shape kv = {n_blocks, bs, n_kv, hd, dt, NULL, false, 0, 0.0f};
        const size_t bytes = (size_t)n_blocks * bs * n_kv * pg_cpu_kv_row_bytes(dt, hd); // rows of one head
        void *kc = calloc(bytes, 1), *vc = calloc(bytes, 1);
        memcpy(kw, k0, sizeof(float) * row * (size_t)total_kv); // RoPE rotates k in place
        float no_q[1] = {0}; // n_heads 0: no q is rotated
        pg_cpu_rope_kv_write(c, no_q, 0, kw, (int64_t)row, v0, (int64_t)row, pos, slots, total_kv, 0, inv_freq,
                             kc, vc, kv);
        pg_cpu_attention(c, ti < 0 ? ref : out, q, (int64_t)n_heads * hd, seqs, n_seqs, n_heads, scale, kc, vc, kv);
        free(kc), free(vc);
        if (ti < 0) continue;
        double num = 0, den = 0, worst = 0;
        for (size_t i = 0; i < qn; i++) {
            double d = (double)out[i] - ref[i];
            num += d * d, den += (double)ref[i] * ref[i];
            worst = fabs(d) > worst ? fabs(d) : worst;
        }
        const double rel = sqrt(num / den);
        print_message("%s %-4s seqs=%d heads=%d/%d hd=%d bs=%d ctx<=%d: rel rms %.2e (bound %.1e), max abs %.2e\n",
                      compat ? "compat" : "exact ", types[ti].name, n_seqs, n_heads, n_kv, hd, bs, max_ctx, rel,
                      types[ti].bound, worst);
        if (types[ti].bound == 0.0)
            assert_memory_equal(out, ref, sizeof(float) * qn);
        else
            assert_true(rel < types[ti].bound);
    }
    free(q), free(ref), free(out), free(k0), free(v0), free(kw), free(slots), free(pos), free(seqs), free(perm);
    be->dev->destroy(be);
}

static void test_attention_types_match_f32_exact(void **state) {
    check_types(PG_MATMUL_EXACT, 1, 1, 1, 32, 16, 1);    // a single key
    check_types(PG_MATMUL_EXACT, 3, 9, 3, 64, 16, 100);  // the default model's heads (group 3)
    check_types(PG_MATMUL_EXACT, 5, 8, 8, 128, 16, 300); // MHA, > KEY_CHUNK keys
    check_types(PG_MATMUL_EXACT, 4, 32, 8, 128, 32, 70); // group 4, block 32
    check_types(PG_MATMUL_EXACT, 3, 4, 2, 40, 8, 50);    // head_dim 40: f16 and bf16 only
}

static void test_attention_types_match_f32_compat(void **state) {
    check_types(PG_MATMUL_QUANT_ACT, 1, 1, 1, 32, 16, 1);
    check_types(PG_MATMUL_QUANT_ACT, 3, 9, 3, 64, 16, 100);   // the default model's heads
    check_types(PG_MATMUL_QUANT_ACT, 4, 16, 2, 64, 16, 600);  // group 8, long context
    check_types(PG_MATMUL_QUANT_ACT, 5, 8, 8, 128, 16, 300);  // MHA, head 128
    check_types(PG_MATMUL_QUANT_ACT, 3, 40, 4, 96, 32, 90);   // group 10 (the generic score loop), hd 96
    check_types(PG_MATMUL_QUANT_ACT, 2, 4, 1, 64, 1, 40);     // MQA, block size 1
}

// fp8 e4m3 with a scale per layer and KV head (pg_kv_shape.scales): heads
// whose K and V live far below 1 (most of e4m3's subnormal range at scale
// 1.0), near 1, and far above 448 (saturated at scale 1.0). With scales of
// amax / 200 (K) and amax / 100 (V), as the runner's calibration makes
// them, every head is within e4m3's normal range: the attention output is
// within fp8's bound of the f32 cache's, where scale 1.0 is far off; and
// scales of exactly 1.0 give the bytes and outputs of no scales.
static double fp8_scaled_err(pg_matmul_mode mode, const float *sc, double *err_one) {
    pg_backend *be;
    assert_int_equal(pg_backend_cpu_create(1, mode, &be), 0);
    pg_cpu_ctx *c = pg_cpu(be);
    const int n_kv = 3, n_heads = 9, hd = 64, bs = 16, ctx = 90, n_blocks = 8;
    const float mag[3] = {0.004f, 1.0f, 900.0f}; // per KV head
    const size_t row = (size_t)n_kv * hd;
    int32_t table[8] = {3, 1, 6, 2, 7, 5, 4, 0}, slots[90], pos[90];
    float *k0 = malloc(sizeof(float) * row * ctx), *v0 = malloc(sizeof(float) * row * ctx);
    float *kw = malloc(sizeof(float) * row * ctx);
    for (int t = 0; t < ctx; t++) slots[t] = table[t / bs] * bs + t % bs, pos[t] = t;
    for (size_t i = 0; i < row * ctx; i++) {
        const float m = mag[(i % row) / (size_t)hd];
        k0[i] = frand() * m, v0[i] = frand() * m;
    }
    float inv_freq[32], q[9 * 64], ref[9 * 64], out[9 * 64], out1[9 * 64];
    for (int i = 0; i < hd / 2; i++) inv_freq[i] = powf(10000.0f, -2.0f * (float)i / (float)hd);
    for (int i = 0; i < n_heads * hd; i++) q[i] = frand() / mag[(i / hd) / 3]; // scores of order 1
    pg_attn_seq seq = {0, 1, ctx - 1, table, 0, 0.0f};
    const size_t bytes = (size_t)n_blocks * bs * row * 4;
    const float ones[6] = {1, 1, 1, 1, 1, 1};
    double rel[3];
    for (int pass = 0; pass < 4; pass++) { // f32, fp8 scaled, fp8 at 1.0, fp8 with scales of 1.0
        const pg_kv_shape kv = {n_blocks, bs, n_kv, hd, pass == 0 ? PG_KV_F32 : PG_KV_FP8_E4M3,
                                pass == 1 ? sc : pass == 3 ? ones : NULL, false, 0, 0.0f};
        void *kc = calloc(bytes, 1), *vc = calloc(bytes, 1);
        memcpy(kw, k0, sizeof(float) * row * ctx); // RoPE rotates k in place
        float no_q[1] = {0};
        pg_cpu_rope_kv_write(c, no_q, 0, kw, (int64_t)row, v0, (int64_t)row, pos, slots, ctx, 0, inv_freq, kc, vc, kv);
        float *o = pass == 0 ? ref : pass == 3 ? out1 : out;
        pg_cpu_attention(c, o, q, (int64_t)n_heads * hd, &seq, 1, n_heads, 1.0f / sqrtf((float)hd), kc, vc, kv);
        free(kc), free(vc);
        if (pass == 0) continue;
        if (pass == 3) {
            assert_memory_equal(out1, out, sizeof out); // 1.0 scales = no scales, bit for bit
            continue;
        }
        // Relative RMS per head group, worst group (the heads differ by 10^5 in size).
        double worst = 0;
        for (int h = 0; h < n_heads; h++) {
            double num = 0, den = 0;
            for (int e = 0; e < hd; e++) {
                const double d = (double)o[h * hd + e] - ref[h * hd + e];
                num += d * d, den += (double)ref[h * hd + e] * ref[h * hd + e];
            }
            if (sqrt(num / den) > worst) worst = sqrt(num / den);
        }
        rel[pass] = worst;
    }
    *err_one = rel[2];
    free(k0), free(v0), free(kw);
    be->dev->destroy(be);
    return rel[1];
}

static void test_fp8_layer_scales(void **state) {
    const float mag[3] = {0.004f, 1.0f, 900.0f};
    float sc[6];
    for (int h = 0; h < 3; h++) sc[h] = mag[h] / 200.0f, sc[3 + h] = mag[h] / 100.0f; // amax / 200, / 100
    for (int m = 0; m < 2; m++) {
        double one;
        const double scaled = fp8_scaled_err(m ? PG_MATMUL_QUANT_ACT : PG_MATMUL_EXACT, sc, &one);
        print_message("%s: worst head's rel rms against f32: scaled %.3e, scale 1.0 %.3e\n", m ? "compat" : "exact ",
                      scaled, one);
        assert_true(scaled < 0.05);   // fp8's bound (check_types)
        assert_true(one > 4 * scaled); // the subnormal and saturated heads are far off at 1.0
    }
}

// --- block moves -----------------------------------------------------------------------

// kv_block_bytes follows each layout, and swap out / swap in / copy-on-write
// move whole blocks unchanged (q8_0's and fp8 scaled's scales included): random bytes in
// every device block, moved, compared.
static void test_swap_and_copy_preserve_bytes(void **state) {
    pg_backend *be;
    assert_int_equal(pg_backend_cpu_create(1, PG_MATMUL_DEFAULT, &be), 0);
    const int32_t L = 3, bs = 16, nkv = 3, hd = 64, nb = 8, nh = 4;
    const struct {
        int32_t dtype;
        size_t row; // bytes of one head's row
    } types[] = {{PG_KV_NATIVE, 256},  {PG_KV_F32, 256},    {PG_KV_F16, 128},
                 {PG_KV_BF16_CPU, 128}, {PG_KV_Q8_0, 68},    {PG_KV_FP8_E4M3, 64},
                 {PG_KV_FP8_E4M3_SCALED, 68}};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const pg_kv_shape s = {nb, bs, nkv, hd, types[ti].dtype, NULL, false, 0, 0.0f};
        const size_t lbb = (size_t)bs * nkv * types[ti].row; // one layer's K block
        assert_int_equal(be->store->kv_block_bytes(be, L, s), 2 * (size_t)L * lbb);
        pg_bkv *kv;
        assert_int_equal(be->store->kv_create(be, L, s, nh, &kv), 0);
        assert_int_equal(kv->bytes, 2 * (size_t)L * lbb * nb);
        for (int32_t l = 0; l < L; l++)
            for (size_t i = 0; i < lbb * nb; i++)
                ((uint8_t *)kv->k[l])[i] = (uint8_t)urand(256), ((uint8_t *)kv->v[l])[i] = (uint8_t)urand(256);
        uint8_t *before_k = malloc(lbb * nb * L), *before_v = malloc(lbb * nb * L);
        for (int32_t l = 0; l < L; l++)
            memcpy(before_k + l * lbb * nb, kv->k[l], lbb * nb), memcpy(before_v + l * lbb * nb, kv->v[l], lbb * nb);
#define DEV_K(l, b) ((uint8_t *)kv->k[l] + (size_t)(b) * lbb)
#define DEV_V(l, b) ((uint8_t *)kv->v[l] + (size_t)(b) * lbb)
#define OLD_K(l, b) (before_k + (l) * lbb * nb + (size_t)(b) * lbb)
#define OLD_V(l, b) (before_v + (l) * lbb * nb + (size_t)(b) * lbb)
        // Swap device blocks 2, 5, 7 out to host blocks 3, 0, 1.
        const int32_t out_pairs[] = {2, 3, 5, 0, 7, 1};
        assert_int_equal(be->store->kv_swap(be, kv, out_pairs, 3, true), 0);
        for (int32_t l = 0; l < L; l++)
            for (int i = 0; i < 3; i++) {
                assert_memory_equal((uint8_t *)kv->k[L + l] + (size_t)out_pairs[2 * i + 1] * lbb,
                                    OLD_K(l, out_pairs[2 * i]), lbb);
                assert_memory_equal((uint8_t *)kv->v[L + l] + (size_t)out_pairs[2 * i + 1] * lbb,
                                    OLD_V(l, out_pairs[2 * i]), lbb);
            }
        // Swap them back in to device blocks 1, 4, 6 (overwritten).
        const int32_t in_pairs[] = {3, 1, 0, 4, 1, 6};
        assert_int_equal(be->store->kv_swap(be, kv, in_pairs, 3, false), 0);
        for (int32_t l = 0; l < L; l++)
            for (int i = 0; i < 3; i++) {
                assert_memory_equal(DEV_K(l, in_pairs[2 * i + 1]), OLD_K(l, out_pairs[2 * i]), lbb);
                assert_memory_equal(DEV_V(l, in_pairs[2 * i + 1]), OLD_V(l, out_pairs[2 * i]), lbb);
            }
        // Copy-on-write: block 2 -> 3, 5 -> 0; every other block unchanged.
        const int32_t cow[] = {2, 3, 5, 0};
        assert_int_equal(be->store->kv_copy(be, kv, cow, 2), 0);
        for (int32_t l = 0; l < L; l++) {
            assert_memory_equal(DEV_K(l, 3), OLD_K(l, 2), lbb);
            assert_memory_equal(DEV_V(l, 0), OLD_V(l, 5), lbb);
            assert_memory_equal(DEV_K(l, 2), OLD_K(l, 2), lbb);
            assert_memory_equal(DEV_V(l, 7), OLD_V(l, 7), lbb);
        }
#undef DEV_K
#undef DEV_V
#undef OLD_K
#undef OLD_V
        free(before_k), free(before_v);
        be->store->kv_free(be, kv);
    }
    // Refusals: q8_0 with head_dim 48 names it; an unknown type.
    pg_bkv *kv = NULL;
    assert_int_equal(be->store->kv_create(be, L, (pg_kv_shape){nb, bs, nkv, 48, PG_KV_Q8_0, NULL, false, 0, 0.0f}, 0, &kv), PG_EUNSUPP);
    assert_non_null(strstr(pg_err_msg(), "head_dim"));
    assert_non_null(strstr(pg_err_msg(), "48"));
    assert_int_equal(be->store->kv_create(be, L, (pg_kv_shape){nb, bs, nkv, hd, 99, NULL, false, 0, 0.0f}, 0, &kv), PG_EINVAL);
    assert_null(kv);
    be->dev->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_rows_round_trip),
        cmocka_unit_test(test_q8_0_block_round_trip),
        cmocka_unit_test(test_fp8_rows_saturate),
        cmocka_unit_test(test_fp8_scaled_rows),
        cmocka_unit_test(test_attention_types_match_f32_exact),
        cmocka_unit_test(test_attention_types_match_f32_compat),
        cmocka_unit_test(test_fp8_layer_scales),
        cmocka_unit_test(test_swap_and_copy_preserve_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
