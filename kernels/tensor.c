// kernels/tensor.c - tensor views (kernels/backend.h) and the KV dtype names (kernels/kernels.h).
#include "kernels/backend.h"

#include "common/err.h"

pg_tensor pg_tensor_view(pg_tensor t, int64_t r0, int64_t n, int64_t c0, int64_t nc) {
    const size_t elem = t.dtype == PG_DTYPE_F32 ? 4 : 2;
    pg_tensor v = t;
    v.data = (char *)t.data + ((size_t)r0 * (size_t)t.stride + (size_t)c0) * elem;
    v.rows = n;
    v.cols = nc;
    return v;
}

const char *pg_kv_dtype_name(int32_t dtype) {
    switch (dtype) {
    case PG_KV_NATIVE:
        return "native";
    case PG_KV_FP8_E4M3:
        return "fp8 e4m3";
    case PG_KV_F32:
        return "f32";
    case PG_KV_F16:
        return "f16";
    case PG_KV_BF16_CPU:
        return "bf16";
    case PG_KV_Q8_0:
        return "q8_0";
    case PG_KV_FP8_E4M3_SCALED:
        return "fp8 e4m3 scaled";
    }
    return "unknown";
}

size_t pg_kv_row_bytes(int32_t dtype, int64_t n, bool native_f32) {
    switch (dtype) {
    case PG_KV_NATIVE: return (size_t)n * (native_f32 ? sizeof(float) : sizeof(uint16_t));
    case PG_KV_FP8_E4M3: return (size_t)n;
    case PG_KV_F32: return (size_t)n * sizeof(float);
    case PG_KV_F16:
    case PG_KV_BF16_CPU: return (size_t)n * sizeof(uint16_t);
    case PG_KV_Q8_0: return n % PG_KV_Q8_0_ELEMS ? 0 : (size_t)(n / PG_KV_Q8_0_ELEMS) * PG_KV_Q8_0_BYTES;
    case PG_KV_FP8_E4M3_SCALED: return (size_t)n + sizeof(float); // n is one head's head_dim
    }
    return 0;
}

size_t pg_kv_layer_block_bytes(pg_kv_shape s, bool native_f32) {
    return (size_t)s.block_size * (size_t)s.n_kv_heads * pg_kv_row_bytes(s.dtype, s.head_dim, native_f32);
}

size_t pg_kv_block_bytes(int32_t n_layers, pg_kv_shape s, bool native_f32) {
    return (size_t)2 * (size_t)n_layers * pg_kv_layer_block_bytes(s, native_f32);
}

int pg_rand_windows_rows(const pg_rand_window *w, int n, const char *who, int64_t *rows) {
    PG_ARG(n >= 1, "%s weight_random: no windows", who);
    *rows = 0;
    for (int p = 0; p < n; p++) {
        PG_ARG(w[p].cols == w[0].cols && w[p].rows >= 0 && w[p].col0 >= 0 && w[p].col0 + w[p].cols <= w[p].full_cols,
               "%s weight_random: window %d of %lldx%lld at (%lld, %lld) in %lld columns", who, p,
               (long long)w[p].rows, (long long)w[p].cols, (long long)w[p].row0, (long long)w[p].col0,
               (long long)w[p].full_cols);
        *rows += w[p].rows;
    }
    return 0;
}

int pg_lora_check(const char *who, pg_tensor out, pg_tensor x, const int32_t *row_slot, const pg_lora_slot *slots,
                  int32_t n_slots, int64_t *max_rank) {
    *max_rank = 0;
    PG_ARG(out.rows == x.rows, "%s: %lld output rows for %lld input rows", who, (long long)out.rows,
           (long long)x.rows);
    PG_ARG(n_slots >= 0 && (x.rows == 0 || (row_slot && (slots || n_slots == 0))), "%s: no slot table", who);
    for (int64_t i = 0; i < x.rows; i++) {
        const int32_t s = row_slot[i];
        PG_ARG(s >= -1 && s < n_slots, "%s: row %lld names slot %d of %d", who, (long long)i, s, n_slots);
        if (s < 0 || !slots[s].a) continue;
        const pg_bweight *a = slots[s].a, *bw = slots[s].b;
        PG_ARG(a->cols == x.cols && a->rows >= 1, "%s: slot %d's A is %lldx%lld for %lld inputs", who, s,
               (long long)a->rows, (long long)a->cols, (long long)x.cols);
        PG_ARG(bw && bw->rows == out.cols && bw->cols == a->rows, "%s: slot %d's B is %lldx%lld, wants %lldx%lld",
               who, s, bw ? (long long)bw->rows : 0LL, bw ? (long long)bw->cols : 0LL, (long long)out.cols,
               (long long)a->rows);
        if (a->rows > *max_rank) *max_rank = a->rows;
    }
    return 0;
}
