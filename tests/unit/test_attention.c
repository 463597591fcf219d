// tests/unit/test_attention.c - the CPU paged attention and RoPE/cache write
// against a dense, unpaged reference in double precision, on random inputs.
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/cpu_backend.h"
#include "tests/unit/rng_test_util.h"

// Gemma 2's soft-capping of the scores in both the reference and the
// kernel's sequences (0: none); test_softcap sets it.
static float g_softcap = 0.0f;

// Dense causal attention over contiguous K/V [ctx][n_kv][hd] for queries at
// positions start..start+n_q-1; window > 0: the query at p sees keys
// (p - window, p] only.
static void ref_attention(double *out, const float *q, const float *k, const float *v, int n_q,
                          int start, int n_heads, int n_kv, int hd, float scale, int window) {
    int g = n_heads / n_kv;
    double *s = malloc(sizeof(double) * (size_t)(start + n_q));
    for (int i = 0; i < n_q; i++)
        for (int h = 0; h < n_heads; h++) {
            int n_keys = start + i + 1, lo = window > 0 && n_keys > window ? n_keys - window : 0;
            double mx = -INFINITY;
            for (int t = lo; t < n_keys; t++) {
                double d = 0;
                for (int e = 0; e < hd; e++)
                    d += (double)q[((size_t)i * n_heads + h) * hd + e] * k[((size_t)t * n_kv + h / g) * hd + e];
                s[t] = d * scale;
                if (g_softcap > 0) s[t] = g_softcap * tanh(s[t] / g_softcap);
                mx = s[t] > mx ? s[t] : mx;
            }
            double sum = 0;
            for (int t = lo; t < n_keys; t++) sum += (s[t] = exp(s[t] - mx));
            for (int e = 0; e < hd; e++) {
                double acc = 0;
                for (int t = lo; t < n_keys; t++) acc += s[t] * v[((size_t)t * n_kv + h / g) * hd + e];
                out[((size_t)i * n_heads + h) * hd + e] = acc / sum;
            }
        }
    free(s);
}

// One configuration: `n_seqs` sequences with random context lengths, each
// contributing a chunk of queries at the end of its context, KV spread over
// shuffled blocks; window > 0: sliding-window attention. mode: the exact f32
// path (the reference, within 1e-5) or the llama.cpp-compatible one (fp16
// roundings: within tol).
static void check_window(int n_seqs, int n_heads, int n_kv, int hd, int bs, int max_ctx, uint64_t seed,
                         int window, pg_matmul_mode mode, double tol) {
    pg_backend *be;
    assert_int_equal(pg_backend_cpu_create(2, mode, &be), 0);
    int blocks_per_seq = (max_ctx + bs - 1) / bs;
    int n_blocks = 1 + n_seqs * blocks_per_seq;
    pg_kv_shape kv = {n_blocks, bs, n_kv, hd, PG_KV_BF16, NULL, false, 0, 0.0f};
    size_t cache_n = (size_t)n_blocks * bs * n_kv * hd;
    float *kc = calloc(cache_n, sizeof(float)), *vc = calloc(cache_n, sizeof(float));
    // A random permutation of blocks 1..n_blocks-1 handed out to sequences.
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_blocks);
    for (int i = 0; i < n_blocks - 1; i++) perm[i] = i + 1;
    for (int i = n_blocks - 2; i > 0; i--) {
        int j = (int)((seed = seed * 6364136223846793005ull + 1) >> 33) % (i + 1);
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    pg_attn_seq *seqs = calloc((size_t)n_seqs, sizeof(pg_attn_seq));
    int *ctx = malloc(sizeof(int) * (size_t)n_seqs), total_q = 0;
    float **ks = malloc(sizeof(float *) * (size_t)n_seqs), **vs = malloc(sizeof(float *) * (size_t)n_seqs);
    for (int s = 0; s < n_seqs; s++) {
        ctx[s] = 1 + (int)((seed = seed * 6364136223846793005ull + 1) >> 33) % max_ctx;
        int n_q = s % 3 == 0 ? ctx[s] : (s % 3 == 1 ? 1 : 1 + ctx[s] / 3); // prefill, decode, chunk
        seqs[s] = (pg_attn_seq){total_q, n_q, ctx[s] - n_q, perm + s * blocks_per_seq, window, g_softcap};
        total_q += n_q;
        size_t n = (size_t)ctx[s] * n_kv * hd;
        ks[s] = malloc(n * sizeof(float));
        vs[s] = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) ks[s][i] = lcg_frand(&seed), vs[s][i] = lcg_frand(&seed);
        for (int t = 0; t < ctx[s]; t++) {
            int32_t slot = seqs[s].block_table[t / bs] * bs + t % bs;
            // The compatible mode keeps K in llama.cpp's pair order (its RoPE
            // write stores it so): dimension d is rotate-half's d/2 or hd/2 + d/2.
            for (int e = 0; e < n_kv * hd; e++) {
                const int d = e % hd, src = mode == PG_MATMUL_EXACT ? d : d % 2 ? hd / 2 + d / 2 : d / 2;
                kc[(size_t)slot * n_kv * hd + e] = ks[s][(size_t)t * n_kv * hd + e - d + src];
            }
            memcpy(vc + (size_t)slot * n_kv * hd, vs[s] + (size_t)t * n_kv * hd, sizeof(float) * n_kv * hd);
        }
    }
    size_t qn = (size_t)total_q * n_heads * hd;
    float *q = malloc(qn * sizeof(float)), *out = malloc(qn * sizeof(float));
    double *ref = malloc(qn * sizeof(double));
    for (size_t i = 0; i < qn; i++) q[i] = lcg_frand(&seed) * 2.0f;
    float scale = 1.0f / sqrtf((float)hd);
    pg_cpu_attention(pg_cpu(be), out, q, (int64_t)n_heads * hd, seqs, n_seqs, n_heads, scale, kc, vc, kv);
    for (int s = 0; s < n_seqs; s++)
        ref_attention(ref + (size_t)seqs[s].q_start * n_heads * hd, q + (size_t)seqs[s].q_start * n_heads * hd,
                      ks[s], vs[s], seqs[s].n_q, seqs[s].start_pos, n_heads, n_kv, hd, scale, window);
    double num = 0, den = 0;
    for (size_t i = 0; i < qn; i++) num += (out[i] - ref[i]) * (out[i] - ref[i]), den += ref[i] * ref[i];
    double rel = sqrt(num / den);
    print_message("attention seqs=%d heads=%d/%d hd=%d bs=%d ctx<=%d window=%d %s: rel err %.2e\n", n_seqs,
                  n_heads, n_kv, hd, bs, max_ctx, window, pg_matmul_mode_name(mode), rel);
    assert_true(rel < tol);
    for (int s = 0; s < n_seqs; s++) free(ks[s]), free(vs[s]);
    free(ks), free(vs), free(ctx), free(seqs), free(perm), free(q), free(out), free(ref), free(kc), free(vc);
    be->dev->destroy(be);
}

static void check_config(int n_seqs, int n_heads, int n_kv, int hd, int bs, int max_ctx, uint64_t seed) {
    check_window(n_seqs, n_heads, n_kv, hd, bs, max_ctx, seed, 0, PG_MATMUL_EXACT, 1e-5);
}

static void test_attention_matches_dense_reference(void **state) {
    check_config(1, 1, 1, 64, 16, 1, 1);          // a single key
    check_config(3, 9, 3, 64, 16, 100, 2);        // the default model's heads
    check_config(5, 8, 8, 128, 16, 300, 3);       // MHA, head 128, > KEY_CHUNK keys
    check_config(7, 32, 8, 128, 32, 70, 4);       // Llama-3 8B heads, block 32
    check_config(4, 4, 1, 64, 1, 40, 5);          // MQA, block size 1
}

// Sliding-window attention (Gemma's local layers): windows shorter and
// longer than the contexts, of one key, across block and KEY_CHUNK
// boundaries, in both numerics.
// Gemma 2's attention soft-capping (score -> cap * tanh(score / cap)), a
// cap small enough that most scores bend, with and without a window, on
// both paths.
static void test_softcap_matches_dense_reference(void **state) {
    (void)state;
    g_softcap = 0.3f;
    check_window(5, 4, 1, 32, 16, 70, 21, 0, PG_MATMUL_EXACT, 1e-5);
    check_window(5, 4, 1, 32, 16, 70, 22, 8, PG_MATMUL_EXACT, 1e-5);
    check_window(4, 8, 2, 64, 16, 300, 23, 40, PG_MATMUL_DEFAULT, 3e-3);
    g_softcap = 0.0f;
}

static void test_sliding_window_matches_dense_reference(void **state) {
    check_window(5, 4, 1, 32, 16, 70, 11, 8, PG_MATMUL_EXACT, 1e-5);   // Gemma's test shape, window 8
    check_window(3, 9, 3, 64, 4, 100, 12, 1, PG_MATMUL_EXACT, 1e-5);   // one key: out = v[p]
    check_window(4, 8, 8, 128, 16, 600, 13, 300, PG_MATMUL_EXACT, 1e-5); // window > KEY_CHUNK
    check_window(3, 4, 2, 64, 16, 50, 14, 1000, PG_MATMUL_EXACT, 1e-5);  // window longer than any context
    check_window(5, 4, 1, 64, 16, 90, 15, 8, PG_MATMUL_DEFAULT, 3e-3);   // llama.cpp-compatible path
    check_window(4, 8, 2, 64, 16, 300, 16, 40, PG_MATMUL_DEFAULT, 3e-3);
}

// RoPE (rotate-half) and the cache write against a direct formula.
static void test_rope_kv_write(void **state) {
    pg_backend *be;
    assert_int_equal(pg_backend_cpu_create(1, PG_MATMUL_EXACT, &be), 0);
    const int m = 5, nh = 4, nkv = 2, hd = 8, bs = 4;
    pg_kv_shape kv = {4, bs, nkv, hd, PG_KV_BF16, NULL, false, 0, 0.0f};
    float q[5 * 4 * 8], k[5 * 2 * 8], v[5 * 2 * 8], q0[5 * 4 * 8], k0[5 * 2 * 8];
    float kc[4 * 4 * 2 * 8] = {0}, vc[4 * 4 * 2 * 8] = {0};
    uint64_t seed = 9;
    for (int i = 0; i < m * nh * hd; i++) q[i] = q0[i] = lcg_frand(&seed);
    for (int i = 0; i < m * nkv * hd; i++) k[i] = k0[i] = lcg_frand(&seed), v[i] = lcg_frand(&seed);
    int32_t pos[5] = {0, 1, 7, 100, 3000}, slots[5] = {4, 5, 15, 8, 9};
    float inv_freq[4];
    for (int i = 0; i < 4; i++) inv_freq[i] = powf(10000.0f, -2.0f * i / hd);
    pg_cpu_rope_kv_write(pg_cpu(be), q, nh * hd, k, nkv * hd, v, nkv * hd, pos, slots, m, nh, inv_freq, kc, vc, kv);
    for (int t = 0; t < m; t++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < hd / 2; i++) {
                double a = (double)pos[t] * inv_freq[i];
                const float *x = q0 + (t * nh + h) * hd;
                assert_float_equal(q[(t * nh + h) * hd + i], x[i] * cos(a) - x[i + 4] * sin(a), 1e-4);
                assert_float_equal(q[(t * nh + h) * hd + i + 4], x[i + 4] * cos(a) + x[i] * sin(a), 1e-4);
            }
    for (int t = 0; t < m; t++) {
        assert_memory_equal(kc + slots[t] * nkv * hd, k + t * nkv * hd, sizeof(float) * nkv * hd);
        assert_memory_equal(vc + slots[t] * nkv * hd, v + t * nkv * hd, sizeof(float) * nkv * hd);
    }
    be->dev->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_matches_dense_reference),
        cmocka_unit_test(test_sliding_window_matches_dense_reference),
        cmocka_unit_test(test_softcap_matches_dense_reference),
        cmocka_unit_test(test_rope_kv_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
