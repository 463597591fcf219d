// engine/model/int4_ckpt.c - AWQ / GPTQ int4 checkpoints: quantization_config and
// the repack into paged's int4 group blocks (see engine/model/int4_ckpt.h).
//
// Why a repack and not kernels for the stored layout: paged's block keeps a
// group's scale and zero beside its nibbles along the row (one read per
// group, tensor-parallel column slices at block boundaries, the loaders'
// row copies), and both checkpoint layouts map into it exactly (f16 scales,
// integer zeros), so every consumer of int4 rows works on them unchanged.
// The formats are implemented from their description (docs/quantization.md),
// not from another implementation's code.
#include "engine/model/int4_ckpt.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/err.h"
#include "engine/model/model.h"
#include "engine/model/model_config.h"
#include "kernels/dtype.h"

const uint8_t PG_AWQ_ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7};

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void pg_int4_unpack_awq(const void *packed, int64_t n, uint8_t *q) {
    const uint8_t *p = packed;
    for (int64_t c = 0; c < n / 8; c++) {
        const uint32_t w = le32(p + 4 * c);
        for (int s = 0; s < 8; s++) q[8 * c + PG_AWQ_ORDER[s]] = (uint8_t)((w >> (4 * s)) & 15);
    }
}

void pg_int4_unpack_plain(const void *packed, int64_t n, uint8_t *q) {
    const uint8_t *p = packed;
    for (int64_t c = 0; c < n / 8; c++) {
        const uint32_t w = le32(p + 4 * c);
        for (int s = 0; s < 8; s++) q[8 * c + s] = (uint8_t)((w >> (4 * s)) & 15);
    }
}

// Element e (0..G-1) of a block goes to run e / 32; within it, the first 16
// to the low nibbles of the run's bytes, the next 16 to the high ones
// (Q4_0's order, kernels/dtype.h).
static void put_nibble(uint8_t *qs, int e, uint8_t v) {
    const int run = e / 32, j = e % 32;
    uint8_t *b = qs + 16 * run + (j & 15);
    *b = j < 16 ? (uint8_t)((*b & 0xf0) | v) : (uint8_t)((*b & 0x0f) | (v << 4));
}

void pg_int4_ckpt_repack(const pg_int4_ckpt_tensor *t, int64_t r0, int64_t nr, int64_t c0, int64_t nc, void *dst) {
    const int G = t->group;
    const int dtype = G == 128 ? PG_DTYPE_INT4_G128 : PG_DTYPE_INT4_G64;
    const size_t bb = pg_dtype_block_bytes(dtype), rb = pg_dtype_row_bytes(dtype, nc);
    const int64_t out = t->out, words = out / 8; // words per row of AWQ's qweight and of qzeros
    uint8_t *q = pg_xmalloc((size_t)G * (size_t)out); // one group's nibbles, [input row][output]
    uint8_t *z = pg_xmalloc((size_t)out);
    const uint8_t *qw = t->qweight, *qz = t->qzeros, *sc = t->scales;
    uint8_t *o = dst;
    memset(o, 0, rb * (size_t)nr);
    for (int64_t g = c0 / G; g < (c0 + nc) / G; g++) {
        if (t->gptq) // rows 8r..8r+7 of the group share one word per output
            for (int64_t r = g * G / 8; r < (g + 1) * G / 8; r++)
                for (int64_t c = 0; c < out; c++) {
                    uint8_t v[8];
                    pg_int4_unpack_plain(qw + 4 * ((size_t)r * (size_t)out + (size_t)c), 8, v);
                    for (int s = 0; s < 8; s++) q[(size_t)(8 * r + s - g * G) * (size_t)out + (size_t)c] = v[s];
                }
        else
            for (int64_t i = g * G; i < (g + 1) * G; i++)
                pg_int4_unpack_awq(qw + 4 * (size_t)i * (size_t)words, out, q + (size_t)(i - g * G) * (size_t)out);
        (t->gptq ? pg_int4_unpack_plain : pg_int4_unpack_awq)(qz + 4 * (size_t)g * (size_t)words, out, z);
        for (int64_t r = r0; r < r0 + nr; r++) {
            uint8_t *blk = o + (size_t)(r - r0) * rb + (size_t)(g - c0 / G) * bb;
            memcpy(blk, sc + 2 * ((size_t)g * (size_t)out + (size_t)r), 2); // f16 d, as stored
            blk[2] = (uint8_t)(z[r] + t->zero_offset);
            blk[3] = 0;
            for (int e = 0; e < G; e++) put_nibble(blk + 4, e, q[(size_t)e * (size_t)out + (size_t)r]);
        }
    }
    free(z);
    free(q);
}

// --- config.json ----------------------------------------------------------------------

// An integer field under either of two names (AutoAWQ's own names are
// w_bit / q_group_size); `*found` false when neither is there.
static int int_field(const cJSON *qc, const char *a, const char *b, const char *path, int *v, bool *found) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(qc, a);
    if (!it && b) it = cJSON_GetObjectItemCaseSensitive(qc, b);
    *found = it != NULL;
    if (!it) return 0;
    if (!cJSON_IsNumber(it) || it->valuedouble != (double)(int)it->valuedouble)
        return pg_err_set(PG_EFORMAT, "%s: quantization_config.%s must be an integer", path, a);
    *v = (int)it->valuedouble;
    return 0;
}

int pg_int4_ckpt_config(const cJSON *qc, const char *path, pg_model_config *c) {
    c->ckpt_quant = PG_QUANT_NONE, c->ckpt_group = 0, c->ckpt_zero_offset = 0;
    if (!cJSON_IsObject(qc)) return 0;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(qc, "quant_method");
    const char *method = cJSON_IsString(m) ? m->valuestring : "";
    const bool awq = !strcmp(method, "awq"), gptq = !strcmp(method, "gptq");
    if (!awq && !gptq) return 0;
    int bits = 0, group = 0;
    bool has_bits, has_group;
    PG_TRY(int_field(qc, "bits", "w_bit", path, &bits, &has_bits));
    PG_TRY(int_field(qc, "group_size", "q_group_size", path, &group, &has_group));
    if (!has_bits) return pg_err_set(PG_EINVAL, "%s: quantization_config has no bits for %s", path, method);
    if (!has_group) return pg_err_set(PG_EINVAL, "%s: quantization_config has no group_size for %s", path, method);
    if (bits != 4)
        return pg_err_set(PG_EUNSUPP, "%s: quantization_config.bits is %d for %s; only 4-bit is supported", path,
                          bits, method);
    if (group != 128 && group != 64)
        return pg_err_set(PG_EUNSUPP, "%s: quantization_config.group_size is %d for %s; only 128 and 64 are supported",
                          path, group, method);
    if (awq) {
        // GEMV / Marlin / ExLlama variants pack differently; only GEMM's is read.
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(qc, "version");
        if (cJSON_IsString(v) && strcasecmp(v->valuestring, "gemm"))
            return pg_err_set(PG_EUNSUPP, "%s: quantization_config.version is '%s' for awq; only 'gemm' is supported",
                              path, v->valuestring);
        if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(qc, "zero_point")))
            return pg_err_set(PG_EUNSUPP, "%s: quantization_config.zero_point is false for awq; only AWQ with zero "
                              "points is supported", path);
    } else {
        // v1 ("gptq", and every checkpoint without the field: most published
        // ones) stores each zero minus one; v2 stores it as it is.
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(qc, "checkpoint_format");
        const char *fmt = cJSON_IsString(f) ? f->valuestring : "gptq";
        if (strcmp(fmt, "gptq") && strcmp(fmt, "gptq_v2"))
            return pg_err_set(PG_EUNSUPP, "%s: quantization_config.checkpoint_format is '%s'; only 'gptq' (v1) and "
                              "'gptq_v2' are supported", path, fmt);
        c->ckpt_zero_offset = !strcmp(fmt, "gptq") ? 1 : 0;
    }
    // (desc_act: act-order is refused per tensor, by its g_idx, at load:
    // a checkpoint with desc_act true whose g_idx is plain loads.)
    c->ckpt_quant = awq ? PG_QUANT_AWQ : PG_QUANT_GPTQ;
    c->ckpt_group = group;
    return 0;
}
