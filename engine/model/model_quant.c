// engine/model/model_quant.c - online quantization of a model's linear weights at
// load (--quantization fp8|int4), from whatever type they are stored in.
//
// Only the matrices of the layers (Q|K|V, O, gate|up, down) are quantized;
// the embedding, the LM head and the norms stay as stored, as in vLLM's fp8
// and AWQ paths (the head is the most sensitive matrix and, tied, is also
// the embedding). A stored type is dequantized to f32 row by row first, so
// a GGUF file can be requantized for the quality comparison (the error then
// adds to the file's own). Formats: kernels/dtype.h, docs/quantization.md.
#include <math.h>
#include <string.h>

#include "common/half.h"

#include "common/err.h"
#include "engine/model/model.h"
#include "kernels/dtype.h"

const char *pg_quantization_name(int q) {
    switch (q) {
    case PG_QUANT_NONE: return "none";
    case PG_QUANT_FP8: return "fp8";
    case PG_QUANT_INT4: return "int4";
    case PG_QUANT_BF16: return "bf16";
    case PG_QUANT_Q8_0: return "q8_0";
    case PG_QUANT_Q4_0: return "q4_0";
    case PG_QUANT_AWQ: return "awq";
    case PG_QUANT_GPTQ: return "gptq";
    default: return "unknown";
    }
}

int pg_quantization_parse(const char *s, int *out) {
    static const int flags[] = {PG_QUANT_NONE, PG_QUANT_FP8, PG_QUANT_INT4, PG_QUANT_AWQ, PG_QUANT_GPTQ};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) // the flag's choices only
        if (!strcmp(s, pg_quantization_name(flags[i]))) return *out = flags[i], 0;
    return pg_err_set(PG_EINVAL, "--quantization must be fp8, int4, awq, gptq or none, not '%s'", s);
}

int pg_quantization_dtype(int q) {
    switch (q) {
    case PG_QUANT_FP8: return PG_DTYPE_FP8_E4M3;
    case PG_QUANT_INT4: return PG_DTYPE_INT4_G128;
    case PG_QUANT_BF16: return PG_DTYPE_BF16;
    case PG_QUANT_Q8_0: return PG_DTYPE_Q8_0;
    case PG_QUANT_Q4_0: return PG_DTYPE_Q4_0;
    default: return -1;
    }
}

// GGML's reference quantizers (quantize_row_q8_0_ref, _q4_0_ref), for the
// comparison only.
static void quantize_q8_0(const float *x, int64_t n, uint8_t *o) {
    for (int64_t b = 0; b < n / 32; b++, x += 32, o += 34) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        const uint16_t dh = pg_f32_to_f16(d);
        memcpy(o, &dh, 2);
        for (int j = 0; j < 32; j++) o[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

static void quantize_q4_0(const float *x, int64_t n, uint8_t *o) {
    for (int64_t b = 0; b < n / 32; b++, x += 32, o += 18) {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
        const float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
        const uint16_t dh = pg_f32_to_f16(d);
        memcpy(o, &dh, 2);
        for (int j = 0; j < 16; j++) {
            int q0 = (int)(x[j] * id + 8.5f), q1 = (int)(x[j + 16] * id + 8.5f);
            q0 = q0 > 15 ? 15 : q0, q1 = q1 > 15 ? 15 : q1;
            o[2 + j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

int64_t pg_quantized_bytes(int q, int64_t rows, int64_t cols) {
    int dt = pg_quantization_dtype(q);
    if (dt == PG_DTYPE_INT4_G128 && cols % 128) dt = PG_DTYPE_INT4_G64; // as pg_quantize_weight
    if (dt < 0) return -1;
    return rows * (int64_t)pg_dtype_row_bytes(dt, cols) +
           (pg_dtype_has_row_scales(dt) ? rows * (int64_t)sizeof(float) : 0);
}

int pg_quantize_weight(int q, const char *name, pg_weight *w, void **data_out, float **scales_out) {
    *data_out = NULL, *scales_out = NULL;
    int dt = pg_quantization_dtype(q);
    // int4: groups of 128 (AWQ's and GPTQ's usual size) where the input
    // dimension allows, else 64 (SmolLM2-135M's hidden 576 = 4.5 x 128).
    if (dt == PG_DTYPE_INT4_G128 && w->cols % 128) dt = PG_DTYPE_INT4_G64;
    PG_CHECK(dt >= 0);
    if (w->dtype == dt || (q == PG_QUANT_INT4 && pg_dtype_is_int4(w->dtype))) return 0; // already in this format (a pre-quantized checkpoint)
    if (pg_dtype_has_row_scales(w->dtype))
        return pg_err_set(PG_EUNSUPP, "--quantization %s: tensor '%s' is stored in %s; requantizing it is not supported",
                          pg_quantization_name(q), name, pg_dtype_name(w->dtype));
    if (w->cols % pg_dtype_block_elems(dt))
        return pg_err_set(PG_EINVAL, "--quantization %s: tensor '%s' has %lld columns, not a multiple of the "
                          "group size %d", pg_quantization_name(q), name, (long long)w->cols,
                          pg_dtype_block_elems(dt));
    const size_t rb = pg_dtype_row_bytes(dt, w->cols);
    uint8_t *data = pg_xmalloc(rb * (size_t)w->rows + 1);
    float *scales = pg_dtype_has_row_scales(dt) ? pg_xmalloc(sizeof(float) * (size_t)w->rows) : NULL;
    float *row = pg_xmalloc(sizeof(float) * (size_t)w->cols);
    for (int64_t r = 0; r < w->rows; r++) {
        pg_dequantize_row(w->dtype, (const char *)w->data + (size_t)r * w->row_bytes, row, w->cols);
        uint8_t *o = data + (size_t)r * rb;
        switch (dt) {
        case PG_DTYPE_FP8_E4M3: pg_quantize_row_fp8(row, w->cols, o, &scales[r]); break;
        case PG_DTYPE_INT4_G128: pg_quantize_row_int4(row, w->cols, 128, o); break;
        case PG_DTYPE_INT4_G64: pg_quantize_row_int4(row, w->cols, 64, o); break;
        case PG_DTYPE_Q8_0: quantize_q8_0(row, w->cols, o); break;
        case PG_DTYPE_Q4_0: quantize_q4_0(row, w->cols, o); break;
        default: // BF16
            for (int64_t j = 0; j < w->cols; j++) {
                const uint16_t h = pg_f32_to_bf16(row[j]);
                memcpy(o + 2 * j, &h, 2);
            }
        }
    }
    free(row);
    *w = (pg_weight){.data = data, .dtype = dt, .rows = w->rows, .cols = w->cols, .row_bytes = rb, .scales = scales};
    *data_out = data, *scales_out = scales;
    return 0;
}
