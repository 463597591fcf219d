// kernels/cuda/elementwise.cu - RoPE + KV write, residual add + RMSNorm,
// bias add, per-head RMSNorm, SiLU*mul, row gather, block copies and dtype
// conversion.
//
// All are memory-bound: 16-byte loads and stores where the row length
// allows (a multiple of 8 bf16), fp32 arithmetic, one pass over the data.
// RoPE + KV write, add + RMSNorm and the row gather are launched with PDL
// (cuda_common.cuh): they wait for the previous grid first thing, in every
// CTA; bias add, per-head RMSNorm, SiLU*mul, block copies and conversions
// are launched plainly.
// CPU references: kernels/cpu/cpu_ops.c and backend_cpu.c (same formulas in f32).
#include <cuda_fp8.h>
#include <math.h>

#include "kernels/cuda/cuda_common.cuh"

namespace {

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// --- RoPE fused with the cache write ---------------------------------------------------

// One CTA per token. cos/sin of pos * inv_freq[j] are computed once per
// token into shared memory (sincosf: exact range reduction, positions reach
// 1e5 radians), then each thread rotates a pair of pairs (j, j+1) and
// (j + half, j + 1 + half) of one head of q or k.
// F8: the cache is e4m3 bytes (scale 1, saturating, round to nearest even);
// k is converted from the fp32 rotation (q and k in place stay bf16), v
// from its bf16 values.
template <bool F8>
__global__ void rope_kv_write_kernel(bf16 *q, int64_t q_stride, bf16 *k, int64_t k_stride, const bf16 *v,
                                     int64_t v_stride, const int32_t *pos, const int32_t *slots,
                                     int n_heads, int n_kv, int hd, const float *inv_freq, void *k_cache,
                                     void *v_cache, const float *scales) {
    extern __shared__ float cs[]; // [half] cos, [half] sin
    pg_pdl_wait(); // PDL: q/k/v, pos and slots may be the previous kernel's output
    pg_pdl_trigger();
    const int i = blockIdx.x, half = hd / 2;
    const float pf = (float)pos[i];
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        float a = pf * inv_freq[j];
        float sn, cn;
        sincosf(a, &sn, &cn);
        cs[j] = cn;
        cs[half + j] = sn;
    }
    __syncthreads();
    const int slot = slots[i];
    const int pairs = half / 2; // bf16x2 units per half-head
    const int n_items = (n_heads + n_kv) * pairs;
    for (int it = threadIdx.x; it < n_items; it += blockDim.x) {
        int h = it / pairs, j = (it % pairs) * 2;
        bool is_q = h < n_heads;
        bf16 *x = is_q ? q + (size_t)i * q_stride + (size_t)h * hd : k + (size_t)i * k_stride + (size_t)(h - n_heads) * hd;
        float2 x0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(x + j));
        float2 x1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(x + j + half));
        float c0 = cs[j], c1 = cs[j + 1], s0 = cs[half + j], s1 = cs[half + j + 1];
        const float2 r0 = make_float2(x0.x * c0 - x1.x * s0, x0.y * c1 - x1.y * s1);
        const float2 r1 = make_float2(x1.x * c0 + x0.x * s0, x1.y * c1 + x0.y * s1);
        __nv_bfloat162 y0 = __floats2bfloat162_rn(r0.x, r0.y);
        __nv_bfloat162 y1 = __floats2bfloat162_rn(r1.x, r1.y);
        *reinterpret_cast<__nv_bfloat162 *>(x + j) = y0;
        *reinterpret_cast<__nv_bfloat162 *>(x + j + half) = y1;
        if (!is_q && slot >= 0) {
            const size_t ci = ((size_t)slot * n_kv + (h - n_heads)) * hd;
            if constexpr (F8) { // j even: 2-byte aligned pairs
                __nv_fp8x2_storage_t *c = reinterpret_cast<__nv_fp8x2_storage_t *>(static_cast<uint8_t *>(k_cache) + ci);
                // The layer's scale for this KV head (pg_kv_shape.scales): x / s is stored.
                const float ks = scales ? scales[h - n_heads] : 1.0f;
                c[j / 2] = __nv_cvt_float2_to_fp8x2(make_float2(r0.x / ks, r0.y / ks), __NV_SATFINITE, __NV_E4M3);
                c[(j + half) / 2] =
                    __nv_cvt_float2_to_fp8x2(make_float2(r1.x / ks, r1.y / ks), __NV_SATFINITE, __NV_E4M3);
            } else {
                bf16 *c = static_cast<bf16 *>(k_cache) + ci;
                *reinterpret_cast<__nv_bfloat162 *>(c + j) = y0;
                *reinterpret_cast<__nv_bfloat162 *>(c + j + half) = y1;
            }
        }
    }
    if (slot < 0) return;
    // v: a straight copy of the token's n_kv * hd values (F8: converted).
    const int n_v = n_kv * hd;
    const bf16 *vs = v + (size_t)i * v_stride;
    if constexpr (F8) {
        uint8_t *vd = static_cast<uint8_t *>(v_cache) + (size_t)slot * n_v;
        if ((n_v % 8) == 0 && ((uintptr_t)vs & 15) == 0 && ((uintptr_t)vd & 7) == 0) {
            for (int e = threadIdx.x * 8; e < n_v; e += blockDim.x * 8) {
                float f[8];
                pg_unpack8(*reinterpret_cast<const uint4 *>(vs + e), f);
                if (scales) { // the 8 never straddle a head: hd % 8 == 0 here
                    const float s = scales[n_kv + e / hd];
#pragma unroll
                    for (int t = 0; t < 8; t++) f[t] /= s;
                }
                uint2 o;
                o.x = (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(f[0], f[1]), __NV_SATFINITE, __NV_E4M3) |
                      ((uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(f[2], f[3]), __NV_SATFINITE, __NV_E4M3) << 16);
                o.y = (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(f[4], f[5]), __NV_SATFINITE, __NV_E4M3) |
                      ((uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(f[6], f[7]), __NV_SATFINITE, __NV_E4M3) << 16);
                *reinterpret_cast<uint2 *>(vd + e) = o;
            }
        } else {
            for (int e = threadIdx.x; e < n_v; e += blockDim.x)
                vd[e] = __nv_cvt_float_to_fp8(__bfloat162float(vs[e]) / (scales ? scales[n_kv + e / hd] : 1.0f),
                                              __NV_SATFINITE, __NV_E4M3);
        }
        return;
    }
    bf16 *vd = static_cast<bf16 *>(v_cache) + (size_t)slot * n_v;
    if ((n_v % 8) == 0 && ((uintptr_t)vs & 15) == 0 && ((uintptr_t)vd & 15) == 0) {
        for (int e = threadIdx.x * 8; e < n_v; e += blockDim.x * 8)
            *reinterpret_cast<uint4 *>(vd + e) = *reinterpret_cast<const uint4 *>(vs + e);
    } else {
        for (int e = threadIdx.x; e < n_v; e += blockDim.x) vd[e] = vs[e];
    }
}

// --- residual add + RMSNorm ------------------------------------------------------------

// The norm's arithmetic: cuda_common.cuh (pg_rms_factor, pg_rms_vec_plan).

// One CTA per row; each thread keeps VPT 16-byte vectors of the row in
// registers between the sum of squares and the scaling (one read of x).
template <int VPT>
__global__ void add_rmsnorm_vec_kernel(bf16 *out, bf16 *x, const bf16 *residual, const bf16 *w, int dim,
                                       float eps) {
    __shared__ float sh[32];
    pg_pdl_wait(); // PDL: x and residual are earlier kernels' outputs
    pg_pdl_trigger();
    const size_t row = blockIdx.x;
    const int nvec = dim / 8;
    uint4 *xr = reinterpret_cast<uint4 *>(x + row * dim);
    const uint4 *rr = residual ? reinterpret_cast<const uint4 *>(residual + row * dim) : nullptr;
    float vals[VPT][8];
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        int vi = threadIdx.x + u * blockDim.x;
        if (vi < nvec) {
            pg_unpack8(xr[vi], vals[u]);
            if (rr) {
                float r[8];
                pg_unpack8(rr[vi], r);
#pragma unroll
                for (int e = 0; e < 8; e++) vals[u][e] += r[e];
                uint4 nx = pack8(vals[u]);
                xr[vi] = nx;
                pg_unpack8(nx, vals[u]); // the norm sees the stored (rounded) residual
            }
#pragma unroll
            for (int e = 0; e < 8; e++) ss += vals[u][e] * vals[u][e];
        }
    }
    const float rs = pg_rms_factor(ss, dim, eps, sh);
    const uint4 *wr = reinterpret_cast<const uint4 *>(w);
    uint4 *orow = reinterpret_cast<uint4 *>(out + row * dim);
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        int vi = threadIdx.x + u * blockDim.x;
        if (vi < nvec) {
            float wf[8], o[8];
            pg_unpack8(wr[vi], wf);
#pragma unroll
            for (int e = 0; e < 8; e++) o[e] = vals[u][e] * rs * wf[e];
            orow[vi] = pack8(o);
        }
    }
}

// Any dim: scalar, two passes over the row.
__global__ void add_rmsnorm_scalar_kernel(bf16 *out, bf16 *x, const bf16 *residual, const bf16 *w, int dim,
                                          float eps) {
    __shared__ float sh[32];
    pg_pdl_wait(); // PDL: as the vector kernel
    pg_pdl_trigger();
    const size_t row = blockIdx.x;
    bf16 *xr = x + row * dim;
    float ss = 0.0f;
    for (int e = threadIdx.x; e < dim; e += blockDim.x) {
        float v = __bfloat162float(xr[e]);
        if (residual) {
            bf16 nb = __float2bfloat16(v + __bfloat162float(residual[row * dim + e]));
            xr[e] = nb;
            v = __bfloat162float(nb);
        }
        ss += v * v;
    }
    const float rs = pg_rms_factor(ss, dim, eps, sh);
    for (int e = threadIdx.x; e < dim; e += blockDim.x)
        out[row * dim + e] = __float2bfloat16(__bfloat162float(xr[e]) * rs * __bfloat162float(w[e]));
}

// --- bias add ---------------------------------------------------------------------------

// Grid-stride over (row, 8-column vector) units (VEC: n, ldo multiples of
// 8 and both pointers 16-byte aligned) or single elements.
template <bool VEC>
__global__ void add_bias_kernel(bf16 *out, int64_t ldo, const bf16 *bias, int64_t m, int64_t n) {
    const int64_t per_row = VEC ? n / 8 : n, total = m * per_row;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / per_row, c = i % per_row;
        if constexpr (VEC) {
            uint4 *o = reinterpret_cast<uint4 *>(out + row * ldo) + c;
            float a[8], b[8];
            pg_unpack8(*o, a);
            pg_unpack8(reinterpret_cast<const uint4 *>(bias)[c], b);
#pragma unroll
            for (int e = 0; e < 8; e++) a[e] += b[e];
            *o = pack8(a);
        } else {
            bf16 *o = out + row * ldo + c;
            *o = __float2bfloat16(__bfloat162float(*o) + __bfloat162float(bias[c]));
        }
    }
}

// --- per-head RMSNorm (q_norm / k_norm) -------------------------------------------------

constexpr int HEAD_NORM_MAX_HD = 256;

// One warp per (row, head): lane l holds the value pairs (2(l + 32u),
// 2(l + 32u) + 1) of the head in registers between the sum of squares and
// the scaling. PAIR: bf16x2 loads and stores (x, stride and w allow 4-byte
// access); else 2-byte ones.
template <bool PAIR>
__global__ void head_rmsnorm_kernel(bf16 *x, int64_t stride, int n_heads, int hd, const bf16 *w, float eps,
                                    int64_t items) {
    const int64_t item = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (item >= items) return; // the whole warp: item is per warp
    bf16 *v = x + (item / n_heads) * stride + (item % n_heads) * (int64_t)hd;
    constexpr int PER = HEAD_NORM_MAX_HD / 64; // pairs per lane at most
    float2 f[PER];
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < PER; u++) {
        const int j = 2 * (lane + 32 * u);
        if (j < hd) {
            f[u] = PAIR ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(v + j))
                        : make_float2(__bfloat162float(v[j]), __bfloat162float(v[j + 1]));
            ss += f[u].x * f[u].x + f[u].y * f[u].y;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float rs = 1.0f / sqrtf(ss / (float)hd + eps);
#pragma unroll
    for (int u = 0; u < PER; u++) {
        const int j = 2 * (lane + 32 * u);
        if (j < hd) {
            const float2 wf = PAIR ? __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(w + j))
                                   : make_float2(__bfloat162float(w[j]), __bfloat162float(w[j + 1]));
            const __nv_bfloat162 y = __floats2bfloat162_rn(f[u].x * rs * wf.x, f[u].y * rs * wf.y);
            if (PAIR) {
                *reinterpret_cast<__nv_bfloat162 *>(v + j) = y;
            } else {
                v[j] = y.x;
                v[j + 1] = y.y;
            }
        }
    }
}

// --- SiLU * mul -------------------------------------------------------------------------

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

__global__ void silu_mul_vec_kernel(bf16 *out, const bf16 *gate_up, int64_t m, int64_t ffn) {
    const int64_t nvec = ffn / 8, total = m * nvec;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i / nvec, c = i % nvec;
        const uint4 *g4 = reinterpret_cast<const uint4 *>(gate_up + row * 2 * ffn);
        float g[8], u[8], o[8];
        pg_unpack8(g4[c], g);
        pg_unpack8(g4[nvec + c], u);
#pragma unroll
        for (int e = 0; e < 8; e++) o[e] = silu(g[e]) * u[e];
        reinterpret_cast<uint4 *>(out + row * ffn)[c] = pack8(o);
    }
}

__global__ void silu_mul_scalar_kernel(bf16 *out, const bf16 *gate_up, int64_t m, int64_t ffn) {
    const int64_t total = m * ffn;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i / ffn, c = i % ffn;
        float g = __bfloat162float(gate_up[row * 2 * ffn + c]), u = __bfloat162float(gate_up[row * 2 * ffn + ffn + c]);
        out[i] = __float2bfloat16(silu(g) * u);
    }
}

// --- row gather -------------------------------------------------------------------------

__global__ void embed_kernel(bf16 *out, const bf16 *table, const int32_t *ids, int64_t dim, int64_t n_rows,
                             int32_t id0, bool vec) {
    pg_pdl_wait(); // PDL: ids and (a row gather) the table may be earlier kernels' output
    pg_pdl_trigger();
    const int64_t i = blockIdx.x;
    const int64_t id = (int64_t)ids[i] - id0;
    bf16 *o = out + i * dim;
    const bool ok = id >= 0 && id < n_rows;
    const bf16 *t = table + (ok ? (int64_t)id : 0) * dim;
    if (vec) {
        const uint4 z = make_uint4(0, 0, 0, 0);
        for (int64_t e = threadIdx.x; e < dim / 8; e += blockDim.x)
            reinterpret_cast<uint4 *>(o)[e] = ok ? reinterpret_cast<const uint4 *>(t)[e] : z;
    } else {
        for (int64_t e = threadIdx.x; e < dim; e += blockDim.x) o[e] = ok ? t[e] : __float2bfloat16(0.0f);
    }
}

// --- block copies (copy-on-write, swap) -------------------------------------------------

// grid (n_pairs, n_tensors): one CTA copies one block of one tensor (a
// layer's K or V) from src[t] + from * block_bytes to dst[t] + to *
// block_bytes. Copy-on-write passes the same arrays twice; a swap passes
// the device cache's and the (mapped, pinned) host mirror's, so one launch
// moves every layer of every block however scattered the block ids are.
__global__ void move_blocks_kernel(const void *const *src_t, void *const *dst_t, const int32_t *pairs,
                                   int64_t block_bytes) {
    const int p = blockIdx.x, t = blockIdx.y;
    const int64_t from = pairs[2 * p], to = pairs[2 * p + 1];
    const uint4 *src = reinterpret_cast<const uint4 *>((const char *)src_t[t] + from * block_bytes);
    uint4 *dst = reinterpret_cast<uint4 *>((char *)dst_t[t] + to * block_bytes);
    for (int64_t e = threadIdx.x; e < block_bytes / 16; e += blockDim.x) dst[e] = src[e];
}

// --- conversions --------------------------------------------------------------------------

__global__ void f32_to_bf16_kernel(bf16 *out, const float *in, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(in[i]);
}
__global__ void bf16_to_f32_kernel(float *out, const bf16 *in, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(in[i]);
}

} // namespace

// --- C API -------------------------------------------------------------------------------

extern "C" int pg_cuda_rope_kv_write(void *q, int64_t q_stride, void *k, int64_t k_stride, const void *v,
                                     int64_t v_stride, const int32_t *pos, const int32_t *slots, int32_t m,
                                     int32_t n_heads, const float *inv_freq, void *k_cache, void *v_cache,
                                     pg_kv_shape kv, void *stream) {
    PG_ARG(q && k && v && pos && slots && inv_freq && k_cache && v_cache, "rope_kv_write: null pointer");
    PG_ARG(m >= 0 && n_heads > 0 && kv.n_kv_heads > 0, "rope_kv_write: m %d, heads %d/%d", m, n_heads, kv.n_kv_heads);
    if (kv.head_dim % 4 != 0) return pg_err_set(PG_EUNSUPP, "rope_kv_write: head_dim %d (a multiple of 4)", kv.head_dim);
    PG_ARG(q_stride >= (int64_t)n_heads * kv.head_dim && k_stride >= (int64_t)kv.n_kv_heads * kv.head_dim &&
               v_stride >= (int64_t)kv.n_kv_heads * kv.head_dim && q_stride % 2 == 0 && k_stride % 2 == 0,
           "rope_kv_write: strides q %lld k %lld v %lld", (long long)q_stride, (long long)k_stride, (long long)v_stride);
    PG_ARG(kv.dtype == PG_KV_BF16 || kv.dtype == PG_KV_FP8_E4M3, "rope_kv_write: KV cache dtype %d", kv.dtype);
    if (m == 0) return 0;
    PG_CUDA_TRY(pg_launch_pdl(kv.dtype == PG_KV_FP8_E4M3 ? rope_kv_write_kernel<true> : rope_kv_write_kernel<false>,
                              dim3((unsigned)m), dim3(128), kv.head_dim * sizeof(float), pg_stream(stream), (bf16 *)q,
                              q_stride, (bf16 *)k, k_stride, (const bf16 *)v, v_stride, pos, slots, n_heads,
                              kv.n_kv_heads, kv.head_dim, inv_freq, k_cache, v_cache,
                              kv.dtype == PG_KV_FP8_E4M3 ? kv.scales : (const float *)nullptr));
    PG_CUDA_LAUNCHED("rope_kv_write_kernel");
    return 0;
}

extern "C" int pg_cuda_add_rmsnorm(void *out, void *x, const void *residual, const void *w, int64_t m,
                                   int64_t dim, float eps, void *stream) {
    PG_ARG(out && x && w, "add_rmsnorm: null pointer");
    PG_ARG(m >= 0 && dim > 0 && dim <= (1 << 20), "add_rmsnorm: m %lld dim %lld", (long long)m, (long long)dim);
    if (m == 0) return 0;
    cudaStream_t st = pg_stream(stream);
    const int64_t nvec = dim / 8;
    const bool vec = dim % 8 == 0 && aligned16(out) && aligned16(x) && aligned16(w) &&
                     (!residual || aligned16(residual)) && nvec <= 4 * 1024;
    if (vec) {
        int threads;
        const int vpt = pg_rms_vec_plan(nvec, &threads);
        PG_CUDA_TRY(pg_launch_pdl(vpt == 1   ? add_rmsnorm_vec_kernel<1>
                                  : vpt == 2 ? add_rmsnorm_vec_kernel<2>
                                             : add_rmsnorm_vec_kernel<4>,
                                  dim3((unsigned)m), dim3(threads), 0, st, (bf16 *)out, (bf16 *)x,
                                  (const bf16 *)residual, (const bf16 *)w, (int)dim, eps));
    } else {
        PG_CUDA_TRY(pg_launch_pdl(add_rmsnorm_scalar_kernel, dim3((unsigned)m), dim3(256), 0, st, (bf16 *)out,
                                  (bf16 *)x, (const bf16 *)residual, (const bf16 *)w, (int)dim, eps));
    }
    PG_CUDA_LAUNCHED("add_rmsnorm_kernel");
    return 0;
}

extern "C" int pg_cuda_add_bias(void *out, int64_t ldo, const void *bias, int64_t m, int64_t n, void *stream) {
    PG_ARG(out && bias, "add_bias: null pointer");
    PG_ARG(m >= 0 && n > 0 && ldo >= n, "add_bias: m %lld n %lld ldo %lld", (long long)m, (long long)n,
           (long long)ldo);
    if (m == 0) return 0;
    cudaStream_t st = pg_stream(stream);
    if (n % 8 == 0 && ldo % 8 == 0 && aligned16(out) && aligned16(bias))
        add_bias_kernel<true><<<pg_grid_for(m * (n / 8), 256), 256, 0, st>>>((bf16 *)out, ldo, (const bf16 *)bias, m, n);
    else
        add_bias_kernel<false><<<pg_grid_for(m * n, 256), 256, 0, st>>>((bf16 *)out, ldo, (const bf16 *)bias, m, n);
    PG_CUDA_LAUNCHED("add_bias_kernel");
    return 0;
}

extern "C" int pg_cuda_head_rmsnorm(void *x, int64_t stride, int32_t n_heads, int32_t head_dim, const void *w,
                                    float eps, int64_t m, void *stream) {
    PG_ARG(x && w, "head_rmsnorm: null pointer");
    PG_ARG(m >= 0 && n_heads > 0 && head_dim > 0, "head_rmsnorm: m %lld, %d heads of %d", (long long)m, n_heads,
           head_dim);
    if (head_dim % 2 != 0 || head_dim > HEAD_NORM_MAX_HD)
        return pg_err_set(PG_EUNSUPP, "head_rmsnorm: head_dim %d (even, at most %d)", head_dim, HEAD_NORM_MAX_HD);
    PG_ARG(stride >= (int64_t)n_heads * head_dim, "head_rmsnorm: stride %lld < %d heads x %d", (long long)stride,
           n_heads, head_dim);
    const int64_t warps = 4; // (row, head) items per CTA
    PG_ARG(m <= (int64_t)INT32_MAX * warps / n_heads, "head_rmsnorm: m %lld x %d heads too large for one launch",
           (long long)m, n_heads);
    if (m == 0) return 0;
    const int64_t items = m * n_heads;
    const bool pair = ((uintptr_t)x & 3) == 0 && stride % 2 == 0 && ((uintptr_t)w & 3) == 0;
    const unsigned blocks = (unsigned)((items + warps - 1) / warps);
    if (pair)
        head_rmsnorm_kernel<true><<<blocks, 32 * warps, 0, pg_stream(stream)>>>((bf16 *)x, stride, n_heads, head_dim,
                                                                                (const bf16 *)w, eps, items);
    else
        head_rmsnorm_kernel<false><<<blocks, 32 * warps, 0, pg_stream(stream)>>>((bf16 *)x, stride, n_heads, head_dim,
                                                                                 (const bf16 *)w, eps, items);
    PG_CUDA_LAUNCHED("head_rmsnorm_kernel");
    return 0;
}

extern "C" int pg_cuda_silu_mul(void *out, const void *gate_up, int64_t m, int64_t ffn, void *stream) {
    PG_ARG(out && gate_up, "silu_mul: null pointer");
    PG_ARG(m >= 0 && ffn > 0, "silu_mul: m %lld ffn %lld", (long long)m, (long long)ffn);
    if (m == 0) return 0;
    cudaStream_t st = pg_stream(stream);
    if (ffn % 8 == 0 && aligned16(out) && aligned16(gate_up))
        silu_mul_vec_kernel<<<pg_grid_for(m * ffn / 8, 256), 256, 0, st>>>((bf16 *)out, (const bf16 *)gate_up, m, ffn);
    else
        silu_mul_scalar_kernel<<<pg_grid_for(m * ffn, 256), 256, 0, st>>>((bf16 *)out, (const bf16 *)gate_up, m, ffn);
    PG_CUDA_LAUNCHED("silu_mul_kernel");
    return 0;
}

extern "C" int pg_cuda_embed(void *out, const void *table, const int32_t *ids, int64_t m, int64_t dim,
                             int64_t n_rows, void *stream) {
    return pg_cuda_embed_shard(out, table, ids, m, dim, n_rows, 0, stream);
}

extern "C" int pg_cuda_embed_shard(void *out, const void *table, const int32_t *ids, int64_t m, int64_t dim,
                                   int64_t n_rows, int32_t id0, void *stream) {
    PG_ARG(out && table && ids, "embed: null pointer");
    PG_ARG(m >= 0 && dim > 0 && n_rows > 0, "embed: m %lld dim %lld rows %lld", (long long)m, (long long)dim,
           (long long)n_rows);
    if (m == 0) return 0;
    bool vec = dim % 8 == 0 && aligned16(out) && aligned16(table);
    int threads = vec ? (dim / 8 >= 256 ? 256 : (int)((dim / 8 + 31) / 32 * 32)) : 256;
    PG_CUDA_TRY(pg_launch_pdl(embed_kernel, dim3((unsigned)m), dim3(threads), 0, pg_stream(stream), (bf16 *)out,
                              (const bf16 *)table, ids, dim, n_rows, id0, vec));
    PG_CUDA_LAUNCHED("embed_kernel");
    return 0;
}

extern "C" int pg_cuda_move_blocks(const void *const *src, void *const *dst, int32_t n_tensors,
                                   const int32_t *pairs, int32_t n_pairs, int64_t block_bytes, void *stream) {
    PG_ARG(src && dst && pairs, "move_blocks: null pointer");
    PG_ARG(n_tensors >= 0 && n_pairs >= 0 && n_tensors <= 65535, "move_blocks: %d tensors, %d pairs", n_tensors,
           n_pairs);
    PG_ARG(block_bytes > 0 && block_bytes % 16 == 0, "move_blocks: block_bytes %lld (a multiple of 16)",
           (long long)block_bytes);
    if (n_tensors == 0 || n_pairs == 0) return 0;
    dim3 grid((unsigned)n_pairs, (unsigned)n_tensors);
    move_blocks_kernel<<<grid, 256, 0, pg_stream(stream)>>>(src, dst, pairs, block_bytes);
    PG_CUDA_LAUNCHED("move_blocks_kernel");
    return 0;
}

extern "C" int pg_cuda_f32_to_bf16(void *out, const float *in, int64_t n, void *stream) {
    PG_ARG(out && in && n >= 0, "f32_to_bf16: bad arguments");
    if (n == 0) return 0;
    f32_to_bf16_kernel<<<pg_grid_for(n, 256), 256, 0, pg_stream(stream)>>>((bf16 *)out, in, n);
    PG_CUDA_LAUNCHED("f32_to_bf16_kernel");
    return 0;
}

extern "C" int pg_cuda_bf16_to_f32(float *out, const void *in, int64_t n, void *stream) {
    PG_ARG(out && in && n >= 0, "bf16_to_f32: bad arguments");
    if (n == 0) return 0;
    bf16_to_f32_kernel<<<pg_grid_for(n, 256), 256, 0, pg_stream(stream)>>>(out, (const bf16 *)in, n);
    PG_CUDA_LAUNCHED("bf16_to_f32_kernel");
    return 0;
}
