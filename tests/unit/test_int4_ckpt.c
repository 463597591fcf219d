// tests/unit/test_int4_ckpt.c - AWQ / GPTQ int4 checkpoints (engine/model/int4_ckpt.h):
// the two nibble orders against hand-made words, and the repack into
// paged's int4 blocks against the formats' definition w = (q - z) * scale,
// through pg_dequantize_row (so the block layout is checked too). The
// packers here are written from the documented layouts.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
// cmocka needs the headers above first.
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "engine/model/int4_ckpt.h"
#include "kernels/dtype.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}

static void put32(uint8_t *p, uint32_t w) {
    for (int b = 0; b < 4; b++) p[b] = (uint8_t)(w >> (8 * b));
}

// 0x76543210: nibble slot s holds the value s.
static void test_nibble_orders(void **state) {
    (void)state;
    uint8_t buf[9], q[8];
    put32(buf + 1, 0x76543210u); // unaligned on purpose
    pg_int4_unpack_plain(buf + 1, 8, q);
    for (int s = 0; s < 8; s++) assert_int_equal(q[s], s);
    // AWQ: slot s -> element 0,2,4,6,1,3,5,7.
    pg_int4_unpack_awq(buf + 1, 8, q);
    const uint8_t want[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    for (int e = 0; e < 8; e++) assert_int_equal(q[e], want[e]);
    // Two words, every value 0..15 in every slot.
    for (int t = 0; t < 100; t++) {
        uint8_t v[16], w[8], got[16];
        for (int e = 0; e < 16; e++) v[e] = (uint8_t)(rnd() & 15);
        uint32_t pa[2] = {0, 0}, pp[2] = {0, 0};
        for (int c = 0; c < 2; c++)
            for (int s = 0; s < 8; s++) {
                pa[c] |= (uint32_t)v[8 * c + PG_AWQ_ORDER[s]] << (4 * s);
                pp[c] |= (uint32_t)v[8 * c + s] << (4 * s);
            }
        put32(w, pa[0]), put32(w + 4, pa[1]);
        pg_int4_unpack_awq(w, 16, got);
        assert_memory_equal(got, v, 16);
        put32(w, pp[0]), put32(w + 4, pp[1]);
        pg_int4_unpack_plain(w, 16, got);
        assert_memory_equal(got, v, 16);
    }
}

// A random W [out][in] as q [out][in], stored zeros [in/G][out] and f16
// scales [in/G][out]; packed as AWQ or GPTQ; repacked in a window; each
// row dequantized must be (q - (stored + offset)) * scale exactly.
static void check_repack(int gptq, int G, int zero_offset, int64_t out, int64_t in, int64_t r0, int64_t nr,
                         int64_t c0, int64_t nc) {
    const int64_t ng = in / G;
    uint8_t *q = malloc((size_t)(out * in)), *zs = malloc((size_t)(ng * out));
    uint16_t *d = malloc(sizeof(uint16_t) * (size_t)(ng * out));
    for (int64_t i = 0; i < out * in; i++) q[i] = (uint8_t)(rnd() & 15);
    for (int64_t i = 0; i < ng * out; i++) {
        zs[i] = (uint8_t)(rnd() & 15); // with zero_offset 1, a stored 15 (v1's -1) reads 16
        d[i] = pg_f32_to_f16((float)(rnd() % 1000 + 1) * 1e-4f);
    }
    // Packing, from the layouts (engine/model/int4_ckpt.h).
    const int64_t qw_words = out * in / 8;
    uint8_t *qw = calloc((size_t)qw_words * 4 + 1, 1), *qz = calloc((size_t)(ng * out / 8) * 4 + 1, 1);
    uint8_t *qwp = qw + 1, *qzp = qz + 1; // unaligned, as in a safetensors mapping
    for (int64_t i = 0; i < in; i++)
        for (int64_t o = 0; o < out; o++) {
            int64_t word, slot;
            if (gptq) { // [in/8][out], along the input
                word = (i / 8) * out + o, slot = i % 8;
            } else { // [in][out/8], along the output in AWQ's order
                int64_t s = 0;
                while (PG_AWQ_ORDER[s] != o % 8) s++;
                word = i * (out / 8) + o / 8, slot = s;
            }
            uint32_t w = 0;
            memcpy(&w, qwp + 4 * word, 4);
            w |= (uint32_t)q[o * in + i] << (4 * slot);
            memcpy(qwp + 4 * word, &w, 4);
        }
    for (int64_t g = 0; g < ng; g++)
        for (int64_t o = 0; o < out; o++) {
            int64_t s = o % 8;
            if (!gptq)
                for (s = 0; PG_AWQ_ORDER[s] != o % 8; s++) {}
            uint32_t w = 0;
            memcpy(&w, qzp + 4 * (g * (out / 8) + o / 8), 4);
            w |= (uint32_t)zs[g * out + o] << (4 * s);
            memcpy(qzp + 4 * (g * (out / 8) + o / 8), &w, 4);
        }
    const pg_int4_ckpt_tensor t = {.gptq = gptq, .group = G, .zero_offset = zero_offset, .in = in, .out = out,
                                   .qweight = qwp, .qzeros = qzp, .scales = d};
    const int dt = G == 128 ? PG_DTYPE_INT4_G128 : PG_DTYPE_INT4_G64;
    const size_t rb = pg_dtype_row_bytes(dt, nc);
    uint8_t *blocks = malloc(rb * (size_t)nr);
    pg_int4_ckpt_repack(&t, r0, nr, c0, nc, blocks);
    float *row = malloc(sizeof(float) * (size_t)nc);
    for (int64_t r = 0; r < nr; r++) {
        pg_dequantize_row(dt, blocks + (size_t)r * rb, row, nc);
        const int64_t o = r0 + r;
        for (int64_t j = 0; j < nc; j++) {
            const int64_t i = c0 + j, g = i / G;
            const float want = (float)((int)q[o * in + i] - (int)zs[g * out + o] - zero_offset) *
                               pg_f16_to_f32(d[g * out + o]);
            if (row[j] != want) fail_msg("gptq %d G %d: w[%lld][%lld] = %g, want %g", gptq, G, (long long)o,
                                         (long long)i, row[j], want);
        }
    }
    free(row), free(blocks), free(qw), free(qz), free(q), free(zs), free(d);
}

static void test_awq_repack(void **state) {
    (void)state;
    check_repack(0, 128, 0, 24, 256, 0, 24, 0, 256);
    check_repack(0, 64, 0, 16, 192, 0, 16, 0, 192);
    check_repack(0, 64, 0, 32, 256, 8, 16, 64, 128); // a tensor-parallel window
}

static void test_gptq_repack(void **state) {
    (void)state;
    check_repack(1, 128, 1, 24, 256, 0, 24, 0, 256); // v1: stored zeros + 1 (15 -> 16)
    check_repack(1, 64, 0, 16, 192, 0, 16, 0, 192);  // v2
    check_repack(1, 64, 1, 32, 256, 3, 17, 128, 128);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nibble_orders),
        cmocka_unit_test(test_awq_repack),
        cmocka_unit_test(test_gptq_repack),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
