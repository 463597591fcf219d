// kernels/cpu/attention.c - causal attention over the paged KV cache.
//
// Each task is one (sequence, query head, chunk of queries); keys are
// visited through the block table. Two numerics:
//  - exact (PG_MATMUL_EXACT): the reference, an online softmax over chunks
//    of positions in f32;
//  - llama.cpp-compatible (the other modes, kernels/cpu/llama_compat.h):
//    llama.cpp's attention without flash attention over an f16 KV cache -
//    q rounded to fp16 (K and V were rounded when written), scores as 8-lane
//    fma chains over head dimensions taken in llama.cpp's interleaved-pair
//    order, a two-pass softmax with ggml's expf, probabilities rounded to
//    fp16, and each output dimension as 8-lane fma chains over positions.
// The cache holds f32, f16, bf16, q8_0 or fp8 e4m3 (scale 1.0 or per head
// row) rows (kv_cache.c); they are read
// as f32 a row at a time into a tile on the stack (K, and V in the exact
// mode) or 8 lanes at a time in registers (V in the compatible mode), never
// as a dequantized copy of the cache. Every stored value is exactly an f32,
// so an f16 cache gives the f32 cache's results bit for bit when the values
// written were already f16 (the compatible mode rounds them so).
#include <math.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/llama_compat.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_AVX2 1
#endif

#define Q_PER_TASK 16
#define KEY_CHUNK  256

typedef struct {
    float *out;
    const float *q;
    int64_t q_stride;
    const pg_attn_seq *seqs;
    int32_t n_seqs, n_heads;
    float scale;
    const char *k_cache, *v_cache;
    pg_kv_shape kv;
    size_t row_bytes;  // one slot: n_kv_heads rows of head_dim elements in kv.dtype
    size_t head_bytes; // one head's row of head_dim elements
    const int64_t *task_start; // [n_seqs + 1] first task index of each sequence
    pg_cpu_ctx *c;             // per-thread scratch (compat scores)
    bool compat;               // llama.cpp-compatible numerics
    bool vec1;                 // compat, one query in the whole step: ggml_vec_dot_f16's sums
    const float *fp8;          // the e4m3 codes as f32 (pg_cpu_fp8_e4m3_table)
} attn_job;

static inline const void *kv_row(const attn_job *j, const char *cache, const int32_t *table,
                                 int32_t pos, int32_t kvh) {
    int64_t block = table[pos / j->kv.block_size];
    int64_t slot = block * j->kv.block_size + pos % j->kv.block_size;
    return cache + (size_t)slot * j->row_bytes + (size_t)kvh * j->head_bytes;
}

static inline bool kv_is_f32(int32_t dtype) {
    return dtype == PG_KV_NATIVE || dtype == PG_KV_F32;
}

// One head's row as f32: the cache itself when it is f32, else converted
// into `tile` [head_dim].
static inline const float *kv_row_f32(const attn_job *j, const char *cache, const int32_t *table,
                                      int32_t pos, int32_t kvh, float *tile) {
    const void *r = kv_row(j, cache, table, pos, kvh);
    if (kv_is_f32(j->kv.dtype)) return r;
    pg_cpu_kv_load_row(j->kv.dtype, r, tile, j->kv.head_dim);
    return tile;
}

// fp8 layer scales (pg_kv_shape.scales) of KV head kvh: K's multiplies the
// scores (q . (s k) = s (q . k)), V's the output (sum p (s v) = s sum p v).
static inline float k_scale(const attn_job *j, int32_t kvh) {
    return j->kv.dtype == PG_KV_FP8_E4M3 && j->kv.scales ? j->kv.scales[kvh] : 1.0f;
}
static inline float v_scale(const attn_job *j, int32_t kvh) {
    return j->kv.dtype == PG_KV_FP8_E4M3 && j->kv.scales ? j->kv.scales[j->kv.n_kv_heads + kvh] : 1.0f;
}

// The first key query qi of s sees: 0, or with a sliding window the
// oldest of the `window` positions ending at its own.
static inline int32_t first_key(const pg_attn_seq *s, int32_t qi) {
    const int32_t lo = s->start_pos + qi + 1 - s->window;
    return s->window > 0 && lo > 0 ? lo : 0;
}

static void attend_one(const attn_job *j, const pg_attn_seq *s, int32_t h, int32_t qi) {
    const int32_t hd = j->kv.head_dim;
    const int32_t kvh = h / (j->n_heads / j->kv.n_kv_heads);
    const float scale = j->scale * k_scale(j, kvh);
    const float *q = j->q + (int64_t)(s->q_start + qi) * j->q_stride + (int64_t)h * hd;
    float *out = j->out + ((int64_t)(s->q_start + qi) * j->n_heads + h) * hd;
    const int32_t lo = first_key(s, qi), n_keys = s->start_pos + qi + 1; // causal: keys up to its own position
    float acc[512], ktile[512], vtile[512];
    float scores[KEY_CHUNK];
    float m = -INFINITY, l = 0.0f;
    memset(acc, 0, sizeof(float) * (size_t)hd);
    for (int32_t t0 = lo; t0 < n_keys; t0 += KEY_CHUNK) {
        int32_t n = n_keys - t0 < KEY_CHUNK ? n_keys - t0 : KEY_CHUNK;
        float cmax = -INFINITY;
        for (int32_t t = 0; t < n; t++) {
            const float *k = kv_row_f32(j, j->k_cache, s->block_table, t0 + t, kvh, ktile);
            float d = 0.0f;
            for (int32_t e = 0; e < hd; e++) d += q[e] * k[e];
            scores[t] = d * scale;
            if (s->softcap > 0) scores[t] = s->softcap * tanhf(scores[t] / s->softcap);
            if (scores[t] > cmax) cmax = scores[t];
        }
        float m_new = cmax > m ? cmax : m;
        float corr = expf(m - m_new); // 0 on the first chunk (m = -inf)
        l *= corr;
        for (int32_t e = 0; e < hd; e++) acc[e] *= corr;
        for (int32_t t = 0; t < n; t++) {
            float p = expf(scores[t] - m_new);
            l += p;
            const float *v = kv_row_f32(j, j->v_cache, s->block_table, t0 + t, kvh, vtile);
            for (int32_t e = 0; e < hd; e++) acc[e] += p * v[e];
        }
        m = m_new;
    }
    float inv = v_scale(j, kvh) / l;
    for (int32_t e = 0; e < hd; e++) out[e] = acc[e] * inv;
}

// --- llama.cpp-compatible attention -------------------------------------------------
//
// llama.cpp's GGUF stores Q and K rows with each rotary pair adjacent
// (dimension g of a head is rotate-half dimension g/2 for even g and
// hd/2 + g/2 for odd g), and its dot products run over that order in 8
// lanes of consecutive dimensions. The compatible RoPE/cache write
// (cpu_ops.c) therefore stores K in that order; q is permuted here.
// One task handles the query heads that share a KV head, so each K and V
// row is loaded once for all of them.

#define MAX_GROUP 64 // query heads per KV head (scratch and the q16 copy)

#ifdef HAVE_AVX2
// scores[g * stride] = hsum8(8-lane fma chain of k . q16[g]) * scale for the
// G heads of a group; G is a constant at every call site.
static inline __attribute__((always_inline)) void scores_avx2(const int G, const float *k,
                                                              const float *q16, int32_t hd,
                                                              float scale, float *scores,
                                                              size_t stride) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int g = 0; g < G; g++) acc[g] = _mm256_setzero_ps();
    for (int32_t c = 0; c < hd; c += 8) {
        const __m256 kc = _mm256_loadu_ps(k + c);
#pragma GCC unroll 8
        for (int g = 0; g < G; g++)
            acc[g] = _mm256_fmadd_ps(kc, _mm256_loadu_ps(q16 + (size_t)g * hd + c), acc[g]);
    }
#pragma GCC unroll 8
    for (int g = 0; g < G; g++) {
        __m128 r = _mm_add_ps(_mm256_extractf128_ps(acc[g], 1), _mm256_castps256_ps128(acc[g]));
        r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        r = _mm_add_ss(r, _mm_movehdup_ps(r));
        scores[(size_t)g * stride] = _mm_cvtss_f32(r) * scale;
    }
}

// Dimensions [e0, e0 + 8) of a cache row of type DT as f32 (e0 a multiple
// of 8, so the 8 lanes never straddle a q8_0 block); fp8 codes through the
// table `fp8`. DT is a constant at every call site.
static inline __attribute__((always_inline)) __m256 load8(const int DT, const void *row, int32_t e0,
                                                          const float *fp8) {
    switch (DT) {
    case PG_KV_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + e0)));
    case PG_KV_BF16_CPU: {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + e0)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    }
    case PG_KV_Q8_0: {
        const uint8_t *blk = (const uint8_t *)row + (size_t)(e0 / PG_KV_Q8_0_ELEMS) * PG_KV_Q8_0_BYTES;
        uint16_t dh;
        memcpy(&dh, blk, 2);
        __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + e0 % PG_KV_Q8_0_ELEMS)));
        return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dh)), _mm256_cvtepi32_ps(q));
    }
    case PG_KV_FP8_E4M3: {
        __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)((const uint8_t *)row + e0)));
        return _mm256_i32gather_ps(fp8, idx, 4);
    }
    case PG_KV_FP8_E4M3_SCALED: {
        float sc;
        memcpy(&sc, row, sizeof sc);
        const uint8_t *q = (const uint8_t *)row + sizeof sc + e0;
        __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
        return _mm256_mul_ps(_mm256_set1_ps(sc), _mm256_i32gather_ps(fp8, idx, 4));
    }
    default:
        return _mm256_loadu_ps((const float *)row + e0);
    }
}

// out[e] = sum over positions t of vrow[t][e] * p[t]: lane t % 8 of an fma
// chain per dimension, the lanes summed like ggml's hsum.
static inline __attribute__((always_inline)) void vsum_avx2(const int DT, const void *const *vrow,
                                                            const float *p, int32_t n_keys,
                                                            int32_t hd, const float *fp8, float *out) {
    for (int32_t e0 = 0; e0 < hd; e0 += 8) {
        __m256 acc[8];
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) acc[l] = _mm256_setzero_ps();
        int32_t t0 = 0;
        for (; t0 + 8 <= n_keys; t0 += 8)
#pragma GCC unroll 8
            for (int l = 0; l < 8; l++)
                acc[l] = _mm256_fmadd_ps(load8(DT, vrow[t0 + l], e0, fp8), _mm256_broadcast_ss(p + t0 + l),
                                         acc[l]);
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++)
            if (t0 + l < n_keys)
                acc[l] = _mm256_fmadd_ps(load8(DT, vrow[t0 + l], e0, fp8), _mm256_broadcast_ss(p + t0 + l),
                                         acc[l]);
        __m256 r = _mm256_add_ps(
            _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6])),
            _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7])));
        _mm256_storeu_ps(out + e0, r);
    }
}
#else
// Element e of a cache row as f32 (the scalar build's V reads).
static inline float kv_elem(int32_t dtype, const void *row, int32_t e, const float *fp8) {
    float x;
    switch (dtype) {
    case PG_KV_F16:
        return pg_f16_to_f32(((const uint16_t *)row)[e]);
    case PG_KV_BF16_CPU:
        return pg_bf16_to_f32(((const uint16_t *)row)[e]);
    case PG_KV_Q8_0: {
        const uint8_t *blk = (const uint8_t *)row + (size_t)(e / PG_KV_Q8_0_ELEMS) * PG_KV_Q8_0_BYTES;
        uint16_t dh;
        memcpy(&dh, blk, 2);
        return pg_f16_to_f32(dh) * (float)(int8_t)blk[2 + e % PG_KV_Q8_0_ELEMS];
    }
    case PG_KV_FP8_E4M3:
        return fp8[((const uint8_t *)row)[e]];
    case PG_KV_FP8_E4M3_SCALED:
        memcpy(&x, row, sizeof x);
        return x * fp8[((const uint8_t *)row)[sizeof x + (size_t)e]];
    default:
        memcpy(&x, (const float *)row + e, sizeof x);
        return x;
    }
}
#endif

// llama.cpp when its ubatch holds one token (a lone decode step): tinyBLAS
// declines n = 1, so the scores and the value sums are ggml_vec_dot_f16's
// (llama_compat.h pg_lc_dot_f16: 32 accumulators over the head dimensions,
// resp. over the positions, lane = position mod 32). The rest as the batched
// path: softmax, fp16 probabilities. Each K and V row is read (and
// converted) once for the G heads of its group. ws: (32 G + 1) * head_dim
// floats of scratch. Gemma layers only (kv.lc_gemma): for the Llama family
// this order cost 4-10% of a batch-1 decode step on the default model
// (bench_cpu_decode --seqs 1: 5.5 -> 5.8 ms) and its greedy continuations
// equal llama.cpp's either way (test_llama_logits), so Llama keeps the
// batched order.
static void attend_vec1(const attn_job *j, const pg_attn_seq *s, int32_t kvh, int32_t lo, int32_t n_keys,
                        const float *q16, float *p, size_t n_p, float *ws, float scale, float vs, int64_t row) {
    const int32_t hd = j->kv.head_dim, G = j->n_heads / j->kv.n_kv_heads;
    // acc[g][c][e]: head g, position class c, dimension e; then one row tile.
    float *acc = ws, *tile = ws + 32 * (size_t)G * hd;
    for (int32_t t = 0; t < n_keys; t++) {
        const float *k = kv_row_f32(j, j->k_cache, s->block_table, lo + t, kvh, tile);
        for (int32_t g = 0; g < G; g++) p[g * n_p + t] = pg_lc_dot_f16(k, q16 + (size_t)g * hd, hd) * scale;
    }
    for (int32_t g = 0; g < G; g++) {
        float *pg = p + g * n_p;
        if (s->softcap > 0) {
            const float inv = 1.0f / s->softcap;
            for (int32_t t = 0; t < n_keys; t++) pg[t] = s->softcap * tanhf(pg[t] * inv);
        }
        pg_lc_softmax_row(pg, pg, n_keys);
        for (int32_t t = 0; t < n_keys; t++) pg[t] = pg_lc_f16(pg[t]);
    }
    memset(acc, 0, sizeof(float) * 32 * (size_t)G * hd);
    for (int32_t t = 0; t < n_keys; t++) {
        const float *v = kv_row_f32(j, j->v_cache, s->block_table, lo + t, kvh, tile);
        for (int32_t g = 0; g < G; g++) {
            const float pt = p[g * n_p + t];
            float *a = acc + ((size_t)g * 32 + (size_t)(t % 32)) * hd;
            int32_t e = 0;
#ifdef HAVE_AVX2
            const __m256 p8 = _mm256_set1_ps(pt);
            for (; e + 8 <= hd; e += 8)
                _mm256_storeu_ps(a + e, _mm256_fmadd_ps(_mm256_loadu_ps(v + e), p8, _mm256_loadu_ps(a + e)));
#endif
            for (; e < hd; e++) a[e] = fmaf(v[e], pt, a[e]);
        }
    }
    for (int32_t g = 0; g < G; g++) {
        const float *ag = acc + (size_t)g * 32 * hd;
        float *out = j->out + (row + g) * hd;
        int32_t e = 0;
#ifdef HAVE_AVX2
        // pg_lc_dot_f16_reduce for 8 dimensions at once: the same sums per lane.
        for (; e + 8 <= hd; e += 8) {
            __m256 x[8];
#define A(c) _mm256_loadu_ps(ag + (size_t)(c) * hd + e)
            for (int l = 0; l < 8; l++)
                x[l] = _mm256_add_ps(_mm256_add_ps(A(l), A(16 + l)), _mm256_add_ps(A(8 + l), A(24 + l)));
#undef A
            __m256 r = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(x[0], x[4]), _mm256_add_ps(x[1], x[5])),
                                     _mm256_add_ps(_mm256_add_ps(x[2], x[6]), _mm256_add_ps(x[3], x[7])));
            if (vs != 1.0f) r = _mm256_mul_ps(r, _mm256_set1_ps(vs));
            _mm256_storeu_ps(out + e, r);
        }
#endif
        for (; e < hd; e++) {
            float a32[32];
            for (int c = 0; c < 32; c++) a32[c] = ag[(size_t)c * hd + e];
            out[e] = pg_lc_dot_f16_reduce(a32);
            if (vs != 1.0f) out[e] *= vs;
        }
    }
}

static void attend_group_compat(const attn_job *j, const pg_attn_seq *s, int32_t kvh, int32_t qi,
                                int thread) {
    const int32_t hd = j->kv.head_dim, half = hd / 2, G = j->n_heads / j->kv.n_kv_heads;
    // Keys at positions lo + t, t < n_keys (scores and probabilities
    // indexed by t).
    const int32_t lo = first_key(s, qi), n_keys = s->start_pos + qi + 1 - lo;
    // Gemma: llama.cpp scales q before rounding it to fp16 and the scores
    // by 1 (k_scale is 1 there: fp8 caches scale the scores, as before).
    const float qs = j->kv.lc_gemma ? j->scale : 1.0f;
    const float scale = (j->kv.lc_gemma ? 1.0f : j->scale) * k_scale(j, kvh), vs = v_scale(j, kvh);
    const int64_t row = (int64_t)(s->q_start + qi) * j->n_heads + (int64_t)kvh * G; // first head
    // Scratch: q in llama.cpp's order rounded to fp16, one K row as f32
    // (a cache of another type), the scores of every head of the group (then
    // their probabilities), the value rows.
    const size_t n_p = ((size_t)n_keys + 7) & ~(size_t)7;
    const size_t extra = j->vec1 ? (32 * (size_t)G + 1) * hd : 0; // ggml_vec_dot_f16's 32 accumulators per head, a row
    float *q16 = pg_cpu_scratch(j->c, thread,
                                (size_t)G * hd + hd + (size_t)G * n_p + 2 * (size_t)n_keys + 8 + extra);
    float *ktile = q16 + (size_t)G * hd;
    float *p = ktile + hd;
    const void **vrow = (const void **)(void *)(p + (size_t)G * n_p +
                                                ((uintptr_t)(p + (size_t)G * n_p) % 8 ? 1 : 0));
    for (int32_t g = 0; g < G; g++) {
        const float *q = j->q + (int64_t)(s->q_start + qi) * j->q_stride + ((int64_t)kvh * G + g) * hd;
        for (int32_t d = 0; d < hd; d++)
            q16[g * hd + d] = pg_lc_f16(q[j->kv.lc_gemma ? d : d % 2 ? half + d / 2 : d / 2] * qs);
    }
    if (j->vec1) {
        attend_vec1(j, s, kvh, lo, n_keys, q16, p, n_p, (float *)(vrow + n_keys + 1), scale, vs, row);
        return;
    }
    // Scores: per head, 8-lane fma chains over the dimensions (tinyBLAS's
    // f16 gemm), the lanes summed like ggml's hsum.
    for (int32_t t = 0; t < n_keys; t++) {
        const float *k = kv_row_f32(j, j->k_cache, s->block_table, lo + t, kvh, ktile);
        vrow[t] = kv_row(j, j->v_cache, s->block_table, lo + t, kvh);
#ifdef HAVE_AVX2
        // The cache streams from DRAM at long contexts: fetch a few rows ahead.
        if (t + 4 < n_keys) {
            const char *kn = kv_row(j, j->k_cache, s->block_table, lo + t + 4, kvh);
            const char *vn = kv_row(j, j->v_cache, s->block_table, lo + t + 4, kvh);
            for (size_t o = 0; o < j->head_bytes; o += 64) {
                _mm_prefetch(kn + o, _MM_HINT_T0);
                _mm_prefetch(vn + o, _MM_HINT_T0);
            }
        }
        switch (G) { // a constant group size keeps the accumulators in registers
        case 1:
            scores_avx2(1, k, q16, hd, scale, p + t, n_p);
            break;
        case 2:
            scores_avx2(2, k, q16, hd, scale, p + t, n_p);
            break;
        case 3:
            scores_avx2(3, k, q16, hd, scale, p + t, n_p);
            break;
        case 4:
            scores_avx2(4, k, q16, hd, scale, p + t, n_p);
            break;
        case 5:
            scores_avx2(5, k, q16, hd, scale, p + t, n_p);
            break;
        case 6:
            scores_avx2(6, k, q16, hd, scale, p + t, n_p);
            break;
        case 7:
            scores_avx2(7, k, q16, hd, scale, p + t, n_p);
            break;
        case 8:
            scores_avx2(8, k, q16, hd, scale, p + t, n_p);
            break;
        default:
            for (int32_t g0 = 0; g0 < G; g0 += 8) {
                int32_t n = G - g0 < 8 ? G - g0 : 8;
                for (int32_t g = 0; g < n; g++)
                    scores_avx2(1, k, q16 + (size_t)(g0 + g) * hd, hd, scale,
                                p + (size_t)(g0 + g) * n_p + t, n_p);
            }
        }
#else
        for (int32_t g = 0; g < G; g++) {
            float a[8] = {0};
            for (int32_t d = 0; d < hd; d++) a[d % 8] = fmaf(k[d], q16[g * hd + d], a[d % 8]);
            p[g * n_p + t] = pg_lc_hsum8(a) * scale;
        }
#endif
    }
    for (int32_t g = 0; g < G; g++) {
        float *pg = p + g * n_p;
        if (s->softcap > 0) { // Gemma 2: scores capped before the softmax, as ggml_scale, tanh, ggml_scale
            const float inv = 1.0f / s->softcap;
            for (int32_t t = 0; t < n_keys; t++) pg[t] = s->softcap * tanhf(pg[t] * inv);
        }
        pg_lc_softmax_row(pg, pg, n_keys);
        for (int32_t t = 0; t < n_keys; t++) pg[t] = pg_lc_f16(pg[t]);
    }
    // out[e] = sum over positions t of v[t][e] * p[t] (vsum_avx2).
    for (int32_t g = 0; g < G; g++) {
        const float *pg = p + g * n_p;
        float *out = j->out + (row + g) * hd;
#ifdef HAVE_AVX2
        switch (j->kv.dtype) { // a constant type keeps the conversion inline
        case PG_KV_F16:
            vsum_avx2(PG_KV_F16, vrow, pg, n_keys, hd, j->fp8, out);
            break;
        case PG_KV_BF16_CPU:
            vsum_avx2(PG_KV_BF16_CPU, vrow, pg, n_keys, hd, j->fp8, out);
            break;
        case PG_KV_Q8_0:
            vsum_avx2(PG_KV_Q8_0, vrow, pg, n_keys, hd, j->fp8, out);
            break;
        case PG_KV_FP8_E4M3:
            vsum_avx2(PG_KV_FP8_E4M3, vrow, pg, n_keys, hd, j->fp8, out);
            break;
        case PG_KV_FP8_E4M3_SCALED:
            vsum_avx2(PG_KV_FP8_E4M3_SCALED, vrow, pg, n_keys, hd, j->fp8, out);
            break;
        default:
            vsum_avx2(PG_KV_F32, vrow, pg, n_keys, hd, j->fp8, out);
        }
#else
        for (int32_t e = 0; e < hd; e++) {
            float a[8] = {0};
            for (int32_t t = 0; t < n_keys; t++)
                a[t % 8] = fmaf(kv_elem(j->kv.dtype, vrow[t], e, j->fp8), pg[t], a[t % 8]);
            out[e] = pg_lc_hsum8(a);
        }
#endif
        if (vs != 1.0f)
            for (int32_t e = 0; e < hd; e++) out[e] *= vs;
    }
}

static void attn_task(void *ctx, int64_t t, int thread) {
    const attn_job *j = ctx;
    int32_t si = 0;
    while (j->task_start[si + 1] <= t) si++;
    const pg_attn_seq *s = &j->seqs[si];
    int64_t local = t - j->task_start[si];
    int32_t n_chunks = (s->n_q + Q_PER_TASK - 1) / Q_PER_TASK;
    // h: the query head, or in the compatible mode the KV head.
    int32_t h = (int32_t)(local / n_chunks), c = (int32_t)(local % n_chunks);
    int32_t q1 = (c + 1) * Q_PER_TASK < s->n_q ? (c + 1) * Q_PER_TASK : s->n_q;
    for (int32_t qi = c * Q_PER_TASK; qi < q1; qi++) {
        if (j->compat)
            attend_group_compat(j, s, h, qi, thread);
        else
            attend_one(j, s, h, qi);
    }
}

void pg_cpu_attention(pg_cpu_ctx *c, float *out, const float *q, int64_t q_stride,
                      const pg_attn_seq *seqs, int32_t n_seqs, int32_t n_heads, float scale,
                      const void *k_cache, const void *v_cache, pg_kv_shape kv) {
    PG_CHECK(kv.head_dim <= 512 && n_heads % kv.n_kv_heads == 0);
    const size_t head_bytes = pg_cpu_kv_row_bytes(kv.dtype, kv.head_dim);
    PG_CHECK(head_bytes > 0); // kv_create refused the others
    const bool compat =
        pg_cpu_attention_compat(c, kv.head_dim) && n_heads / kv.n_kv_heads <= MAX_GROUP;
    const int32_t units = compat ? kv.n_kv_heads : n_heads; // tasks per chunk of queries
    int64_t stack_starts[65];
    int64_t *starts =
        n_seqs < 65 ? stack_starts : pg_xmalloc(sizeof(int64_t) * (size_t)(n_seqs + 1));
    starts[0] = 0;
    for (int32_t i = 0; i < n_seqs; i++)
        starts[i + 1] = starts[i] + (int64_t)units * ((seqs[i].n_q + Q_PER_TASK - 1) / Q_PER_TASK);
    attn_job j = {.out = out, .q = q, .q_stride = q_stride, .seqs = seqs, .n_seqs = n_seqs,
                  .n_heads = n_heads, .scale = scale, .k_cache = k_cache, .v_cache = v_cache, .kv = kv,
                  .row_bytes = head_bytes * (size_t)kv.n_kv_heads, .head_bytes = head_bytes,
                  .task_start = starts, .c = c, .compat = compat,
                  .vec1 = compat && kv.lc_gemma && n_seqs == 1 && seqs[0].n_q == 1, .fp8 = pg_cpu_fp8_e4m3_table()};
    pg_pool_run(c->pool, starts[n_seqs], attn_task, &j);
    if (starts != stack_starts) free(starts);
}
