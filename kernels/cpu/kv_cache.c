// kernels/cpu/kv_cache.c - the CPU KV cache's element types: how one row of
// a cache (one token's K or V of one or more heads) is stored and read back.
//
// f32 (native), f16 and bf16 round to nearest even; q8_0 is llama.cpp's
// block_q8_0 as its AVX2 quantize_row_q8_0 makes it (amax = max |x|,
// q = round_half_even(x * (127 / amax)), d = fp16(amax / 127)), so a cache
// row is exactly what llama.cpp's -ctk q8_0 would hold. fp8 e4m3 is
// kernels/dtype.h's conversion (round to nearest even, saturating at 448),
// the same bytes as the CUDA cache's fp8: scale 1.0, or (fp8 e4m3 scaled)
// one f32 scale max|x| / 448 per head row as pg_quantize_row_fp8 makes it
// for FP8 weights. Rows are written once per token and read once per query
// step, so stores are plain scalar code; loads are AVX2 where it exists.
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "common/half.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/dtype.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_AVX2 1
#endif

size_t pg_cpu_kv_row_bytes(int32_t dtype, int64_t n) {
    return pg_kv_row_bytes(dtype, n, true);
}

// e4m3 decodes through a table: 256 values, and the AVX2 loads gather from it.
static float fp8_table[256];
static void fp8_table_init(void) {
    for (int i = 0; i < 256; i++) fp8_table[i] = pg_fp8_e4m3_to_f32((uint8_t)i);
}
const float *pg_cpu_fp8_e4m3_table(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, fp8_table_init);
    return fp8_table;
}

// dst[0:n] = s * table[q[0:n]].
static void load_fp8(const uint8_t *q, float s, float *dst, int64_t n) {
    const float *t = pg_cpu_fp8_e4m3_table();
    int64_t i = 0;
#ifdef HAVE_AVX2
    const __m256 vs = _mm256_set1_ps(s);
    for (; i + 8 <= n; i += 8) {
        __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)));
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(vs, _mm256_i32gather_ps(t, idx, 4)));
    }
#endif
    for (; i < n; i++) dst[i] = s * t[q[i]];
}

static void store_q8_0_block(uint8_t *dst, const float *x) {
    float amax = 0.0f;
    for (int i = 0; i < PG_KV_Q8_0_ELEMS; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const uint16_t d = pg_f32_to_f16(amax / 127.0f);
    memcpy(dst, &d, 2);
    for (int i = 0; i < PG_KV_Q8_0_ELEMS; i++)
        dst[2 + i] = (uint8_t)(int8_t)nearbyintf(x[i] * id); // |x * id| <= 127
}

void pg_cpu_kv_store_row(int32_t dtype, void *dst, const float *src, int64_t n) {
    switch (dtype) {
    case PG_KV_F16: {
        uint16_t *o = dst;
        for (int64_t i = 0; i < n; i++) o[i] = pg_f32_to_f16(src[i]);
        return;
    }
    case PG_KV_BF16_CPU: {
        uint16_t *o = dst;
        for (int64_t i = 0; i < n; i++) o[i] = pg_f32_to_bf16(src[i]);
        return;
    }
    case PG_KV_Q8_0:
        for (int64_t b = 0; b < n / PG_KV_Q8_0_ELEMS; b++)
            store_q8_0_block((uint8_t *)dst + b * PG_KV_Q8_0_BYTES, src + b * PG_KV_Q8_0_ELEMS);
        return;
    case PG_KV_FP8_E4M3: {
        uint8_t *o = dst;
        for (int64_t i = 0; i < n; i++) o[i] = pg_f32_to_fp8_e4m3(src[i]);
        return;
    }
    case PG_KV_FP8_E4M3_SCALED: { // one head: the scale, then the elements
        float sc;
        pg_quantize_row_fp8(src, n, (uint8_t *)dst + sizeof sc, &sc);
        memcpy(dst, &sc, sizeof sc);
        return;
    }
    default: // f32
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

void pg_cpu_kv_load_row(int32_t dtype, const void *src, float *dst, int64_t n) {
    int64_t i = 0;
    switch (dtype) {
    case PG_KV_F16: {
        const uint16_t *s = src;
#ifdef HAVE_AVX2
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
        for (; i < n; i++) dst[i] = pg_f16_to_f32(s[i]);
        return;
    }
    case PG_KV_BF16_CPU: {
        const uint16_t *s = src;
#ifdef HAVE_AVX2
        for (; i + 8 <= n; i += 8) {
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
#endif
        for (; i < n; i++) dst[i] = pg_bf16_to_f32(s[i]);
        return;
    }
    case PG_KV_Q8_0:
        for (int64_t b = 0; b < n / PG_KV_Q8_0_ELEMS; b++) {
            const uint8_t *blk = (const uint8_t *)src + b * PG_KV_Q8_0_BYTES;
            uint16_t dh;
            memcpy(&dh, blk, 2);
            const float d = pg_f16_to_f32(dh);
            const int8_t *q = (const int8_t *)(blk + 2);
            float *o = dst + b * PG_KV_Q8_0_ELEMS;
#ifdef HAVE_AVX2
            const __m256 vd = _mm256_set1_ps(d);
            for (int c = 0; c < PG_KV_Q8_0_ELEMS; c += 8) {
                __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + c)));
                _mm256_storeu_ps(o + c, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(w)));
            }
#else
            for (int c = 0; c < PG_KV_Q8_0_ELEMS; c++) o[c] = d * (float)q[c];
#endif
        }
        return;
    case PG_KV_FP8_E4M3:
        load_fp8(src, 1.0f, dst, n);
        return;
    case PG_KV_FP8_E4M3_SCALED: {
        float sc;
        memcpy(&sc, src, sizeof sc);
        load_fp8((const uint8_t *)src + sizeof sc, sc, dst, n);
        return;
    }
    default: // f32
        memcpy(dst, src, (size_t)n * sizeof(float));
    }
}
