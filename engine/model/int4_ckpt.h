// engine/model/int4_ckpt.h - AWQ and GPTQ int4 checkpoints: their config.json
// quantization_config, and the repack of their int32-packed tensors into
// paged's own int4 group blocks (PG_DTYPE_INT4_G128 / _G64, kernels/dtype.h),
// so the CPU int4 products run them unchanged. Layouts: docs/quantization.md.
//
// A quantized linear W [out][in] (paged's row convention) is stored as
//   AWQ (GEMM): qweight i32 [in][out/8]    8 nibbles per word along the OUTPUT
//                                          dimension, slot s -> column 8c + PG_AWQ_ORDER[s]
//   GPTQ:       qweight i32 [in/8][out]    8 nibbles per word along the INPUT
//                                          dimension, slot s -> row 8r + s
//   both:       qzeros  i32 [in/G][out/8]  along the output (AWQ's order / plain)
//               scales  f16 [in/G][out]
//   GPTQ:       g_idx   i32 [in]           the group of each input row
// with w[o][i] = (q - z) * scale; GPTQ's v1 format stores z - 1.
#pragma once
#include <stdint.h>

struct cJSON;
struct pg_model_config;

// AWQ's interleaving: nibble slot s (bits 4s..4s+3) of a word holds element
// 8c + PG_AWQ_ORDER[s] of its 8.
extern const uint8_t PG_AWQ_ORDER[8];

// The n values (n a multiple of 8) of n / 8 little-endian int32 words
// (`packed` needs no alignment), 0..15 each: AWQ's order, and the plain
// order (slot s -> element 8c + s) of GPTQ's qweight and qzeros.
void pg_int4_unpack_awq(const void *packed, int64_t n, uint8_t *q);
void pg_int4_unpack_plain(const void *packed, int64_t n, uint8_t *q);

// One stored quantized linear, shapes already checked.
typedef struct {
    int gptq;               // 0: AWQ's layout, 1: GPTQ's
    int group;              // 128 or 64
    int zero_offset;        // added to every stored zero: 1 for GPTQ v1, else 0
    int64_t in, out;        // W's input (columns) and output (rows) dimensions
    const void *qweight, *qzeros, *scales; // as stored (unaligned; scales f16)
} pg_int4_ckpt_tensor;

// Writes rows [r0, r0 + nr) x columns [c0, c0 + nc) of W (c0 and nc
// multiples of the group) as rows of PG_DTYPE_INT4_G128 / _G64 blocks, one
// after another, to dst (nr * pg_dtype_row_bytes(type, nc) bytes): the
// block's d is the stored f16 scale, z the stored zero plus zero_offset
// (0..16: 16 only from a v1 zero stored as 15, i.e. -1), q the nibbles.
void pg_int4_ckpt_repack(const pg_int4_ckpt_tensor *t, int64_t r0, int64_t nr, int64_t c0, int64_t nc, void *dst);

// Reads config.json's `quantization_config` (`qc`, may be NULL; `path`
// names the file in messages) into c->ckpt_quant, ckpt_group and
// ckpt_zero_offset. quant_method "awq" (version "gemm", zero_point true)
// and "gptq" with bits 4 and group_size 128 or 64 are read; any other bits,
// group size or AWQ version is PG_EUNSUPP naming the file and the value.
// Other methods (fp8: keyed on the tensors' type) leave ckpt_quant 0.
int pg_int4_ckpt_config(const struct cJSON *qc, const char *path, struct pg_model_config *c);
