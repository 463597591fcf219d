// kernels/cpu/quant_dot.h - matrix products with 8-bit quantized activations,
// numerically llama.cpp's CPU backend (ggml-cpu) for GGUF block weights.
//
// llama.cpp never multiplies a quantized weight with an f32 activation: it
// first quantizes each activation row per 32-element block to 8 bits
// (Q8_0 for Q4_0, Q5_0 and Q8_0 weights, Q8_1 for Q4_1 and Q5_1 weights),
// then takes integer dot products block by block. These kernels do the same
// arithmetic, operation by operation where it matters for rounding:
//
//   activation block x[32]:  amax = max |x|,  d = amax / 127  (f32),
//       q[j] = round_half_even(x[j] * (127 / amax))  (0 when amax == 0),
//       stored d16 = fp16(d),  s16 = fp16(d * sum(q))  (Q8_1 only)
//   per weight block b, the 32 products summed as 8 int32 lanes of 4
//       consecutive elements, lane[k] = sum_{e=4k..4k+3} w[e] * q[e],
//   acc[k] = fma(f32(d_w) * f32(d16), (float)lane[k], acc[k])   (f32)
//   result = ((acc0+acc4)+(acc2+acc6)) + ((acc1+acc5)+(acc3+acc7))
//            + summs,  summs = fma(f32(m_w), f32(s16), summs) over blocks
//            (Q4_1/Q5_1 only; Q4_1 weights are d_w * n + m_w with n in
//            0..15, Q5_1 the same with n in 0..31, Q4_0 are d_w * (n - 8),
//            Q5_0 d_w * (n - 16), Q8_0 d_w * q).
//
// That is how ggml's AVX2 quantize_row_q8_0/q8_1 and vec_dot_q4_0_q8_0,
// vec_dot_q4_1_q8_1, vec_dot_q5_0_q8_0, vec_dot_q5_1_q8_1,
// vec_dot_q8_0_q8_0 (and llamafile's tinyBLAS for Q8_0)
// compute on an x86-64-v3 machine; the scalar fallback here follows the same
// rules, so both builds give the same bits.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

// GGML block layouts the CPU kernels read. Blocks are packed byte arrays
// (Q4_0 is 18 bytes), so fields are read with memcpy at byte offsets rather
// than through structs that would promise 2-byte alignment.
#define Q4_0_BYTES 18 // fp16 d, 16 bytes of nibbles
#define Q4_1_BYTES 20 // fp16 d, fp16 m, 16 bytes of nibbles
#define Q5_0_BYTES 22 // fp16 d, 4 bytes of fifth bits, 16 bytes of nibbles
#define Q5_1_BYTES 24 // fp16 d, fp16 m, 4 bytes of fifth bits, 16 of nibbles
#define Q8_0_BYTES 34 // fp16 d, 32 int8

// The fp16 bits at p (any alignment).
static inline uint16_t ld16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

// Activation rows quantized per 32-element block. Block-major, so that the
// rows a kernel tile reads for one block are adjacent.
typedef struct {
    int64_t m;  // rows
    int64_t nb; // 32-element blocks per row
    int8_t *qs; // [nb][m][32]
    float *d;   // [nb][m] scale, already rounded through fp16
    float *s;   // [nb][m] d * sum(qs), rounded through fp16 (read for Q4_1/Q5_1)
} pg_xq;

// Bytes of memory pg_xq_init() needs for m rows of `cols` (a multiple of 32).
size_t pg_xq_bytes(int64_t m, int64_t cols);
// Lays xq out over `mem` (pg_xq_bytes(m, cols) bytes, 32-byte aligned).
void pg_xq_init(pg_xq *xq, void *mem, int64_t m, int64_t cols);
// Quantizes rows [i0, i1) of x (rows `ld` floats apart) into xq.
void pg_xq_quantize(pg_xq *xq, const float *x, int64_t ld, int64_t i0, int64_t i1);

// True when pg_qdot_rows() has a kernel for weights of this dtype.
bool pg_qdot_supported(int dtype);

// Bytes of scratch pg_qdot_rows() needs for rows of `cols` elements.
size_t pg_qdot_scratch_bytes(int dtype, int64_t cols);

// out[i * ldo + r] = dot(weight row r, activation row i) for r in [r0, r1)
// and every row i of xq, where weight row r starts at w + r * row_bytes.
// Single-threaded (the matmul splits rows over the pool); `scratch` holds
// pg_qdot_scratch_bytes() bytes private to the calling thread.
void pg_qdot_rows(int dtype, const void *w, size_t row_bytes, int64_t r0, int64_t r1,
                  const pg_xq *xq, float *out, int64_t ldo, void *scratch);

// --- K-quants (Q4_K, Q5_K, Q6_K) with Q8_K activations ---------------------------------
//
// For K-quant weights llama.cpp's CPU backend quantizes each activation row
// per 256 elements to Q8_K and takes ggml_vec_dot_q4_K_q8_K /
// ggml_vec_dot_q6_K_q8_K. These reproduce that arithmetic (ggml's AVX2
// versions; the integer parts are exact, so only the float steps matter):
//
//   Q8_K block x[256] (ggml's quantize_row_q8_K_ref, which the x86 build
//   calls): max = the element of largest |x| (the first one on ties),
//       iscale = -127 / max (the sign makes the largest element -127),
//       q[j] = min(127, round_half_even(iscale * x[j])), d = 1 / iscale,
//       bsums[k] = sum of q[16k..16k+15]; an all-zero block has d = 0, q = 0.
//   Per weight block, 8 int32 lanes: lane l sums, over each 32-element
//   (Q4_K) or 16-element (Q6_K) sub-block s, scale_s * sum of w[e] * q[e]
//   for the 4-element groups e = 32c + 4l..4l+3 of that sub-block's 32-element
//   chunk c (Q6_K: w in 0..63 with the 32 * scale_s * bsums correction
//   subtracted from lanes 2s/2 -> lane l gets bsums[2l], bsums[2l+1]).
//   acc[l] = fma(d_x * f32(d_w), (float)lane[l], acc[l]);
//   Q4_K also: accm[t] = fma(-d_x * f32(dmin_w), (float)(min_{2t} * S_{2t}
//       + min_{2t+1} * S_{2t+1}), accm[t]) (S_k: activation sum of
//       sub-block k, from bsums), t in 0..3.
//   result = hsum8(acc) (+ ((accm0 + accm2) + (accm1 + accm3)) for Q4_K).
//   Q5_K (ggml_vec_dot_q5_K_q8_K): Q4_K's lanes with 5-bit codes, but the
//   mins in one scalar chain, summs = fma(-d_x * f32(dmin_w), (float)(sum_s
//   min_s * S_s), summs) (ggml's summs += dmin * int, contracted by gcc),
//   result = hsum8(acc) + summs.
//
// Q4_K matrices whose row count is a multiple of 8 are re-laid by llama.cpp's
// CPU "repack" buffer (llama.cpp's default) as q4_K_8x8 and multiplied by
// ggml_gemv/gemm_q4_K_8x8_q8_K, which sum differently: per block the whole
// integer dot sumi and the whole mins term summ = sum_s min_s * S_s, then
//   acc = fma((float)sumi, f32(d_w) * d_x, acc),
//   accm = fma((float)summ, f32(dmin_w) * d_x, accm),  result = acc - accm.
// (Its 4-rows-at-a-time AVX2 quantizer, used for m >= 4, gives the same
// Q8_K blocks except when +max and -max tie for the largest |x|.)
#define QK_K_ELEMS 256
#define Q4_K_BYTES 144 // fp16 d, fp16 dmin, 12 bytes of 6-bit scales/mins, 128 of nibbles
#define Q5_K_BYTES 176 // Q4_K's 16 bytes, 32 bytes of fifth bits, 128 of nibbles
#define Q6_K_BYTES 210 // 128 bytes low nibbles, 64 bytes high 2 bits, 16 int8 scales, fp16 d

typedef struct {
    float d;
    int8_t qs[QK_K_ELEMS];
    int16_t bsums[QK_K_ELEMS / 16];
} pg_q8k_block;

// (kernels/cpu/kquant_dot.c: AVX2 kernels in an AVX2 build, the scalar
// reference otherwise; both give the same bits.)

// True when pg_kdot_row() has a kernel for weights of this dtype.
bool pg_kdot_supported(int dtype);
// Quantizes x[cols] (a multiple of 256) into cols / 256 Q8_K blocks.
void pg_q8k_quantize_row(const float *x, int64_t cols, pg_q8k_block *y);
// Dot product of one weight row (nb K-quant blocks) with one Q8_K row;
// rows8: the matrix has a multiple of 8 rows (Q4_K: the repacked order).
float pg_kdot_row(int dtype, const uint8_t *w, const pg_q8k_block *y, int64_t nb, bool rows8);
// out[i * ldo + r] = pg_kdot_row_ref(dtype, weight row r, x + i * nb, nb,
// pg_kdot_order(dtype, rows8, m, i)) for r in [r0, r1) and i in [0, m),
// where weight row r starts at w + r * row_bytes and x holds m rows of nb
// blocks: as llama.cpp's CPU backend orders the sums for an m-row product.
// Single-threaded (the matmul splits rows over the pool); each result is
// the same whatever r0 and r1, and depends on m only through that rule.
void pg_kdot_rows(int dtype, const void *w, size_t row_bytes, int64_t r0, int64_t r1,
                  const pg_q8k_block *x, int64_t m, int64_t nb, bool rows8, float *out,
                  int64_t ldo);

// The scalar reference versions of the two above (the kernels of a build
// without AVX2; the unit tests hold the AVX2 kernels to them bit for bit).
// order: for Q4_K, how the block sums are taken in f32 (Q5_K and Q6_K
// have PG_KDOT_VEC and PG_KDOT_TILED):
//  PG_KDOT_VEC      ggml's vec_dot_q4_K_q8_K (8 lanes, 4 mins lanes);
//  PG_KDOT_8X8      the repack's gemv, ggml_gemv_q4_K_8x8_q8_K: one fma
//                   per block for the products, one for the mins;
//  PG_KDOT_8X8_GEMM the repack's gemm, ggml_gemm_q4_K_8x8_q8_K: one fma per
//                   64 elements (two sub-blocks) for each.
//  PG_KDOT_TILED    llama.cpp's "tiled" kernels (ggml-cpu/tiled, AVX2
//                   microtile), for Q4_K, Q5_K and Q6_K: per block the
//                   whole integer dot s1 (and Q4_K's/Q5_K's mins term s2),
//                   res = f32(d_w) * s1 (Q4_K, Q5_K: fma(-f32(dmin_w), s2,
//                   res)), then acc = fma(res, d_x, acc).
// (true and false, as rows8, are PG_KDOT_8X8 and PG_KDOT_VEC.)
enum { PG_KDOT_VEC = 0, PG_KDOT_8X8 = 1, PG_KDOT_8X8_GEMM = 2, PG_KDOT_TILED = 3 };
// The order llama.cpp's CPU backend (AVX2) takes for activation row i of
// an m-row product: with m >= 8, Q5_K, Q6_K (neither repacked on AVX2)
// and Q4_K matrices the repack does not take (!rows8) go to the tiled
// kernels (ggml_tiled_min_batch);
// otherwise Q4_K with rows8 takes the repack's gemm for the rows
// i < m - m % 4 when m >= 4 (4 at a time) and its gemv for the rest; all
// else vec_dot_q4_K_q8_K / vec_dot_q5_K_q8_K / vec_dot_q6_K_q8_K.
int pg_kdot_order(int dtype, bool rows8, int64_t m, int64_t i);
void pg_q8k_quantize_row_ref(const float *x, int64_t cols, pg_q8k_block *y);
float pg_kdot_row_ref(int dtype, const uint8_t *w, const pg_q8k_block *y, int64_t nb, int order);
