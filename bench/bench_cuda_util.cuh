// bench/bench_cuda_util.cuh - what the CUDA benchmarks share: a median
// event timer and a random bf16 fill on the device (never zeros: they can
// run faster than real data). Include after tests/gpu/gpu_util.h (CK).
#pragma once
#include <algorithm>
#include <vector>

// --- timing -----------------------------------------------------------------------------

// Median over `reps` timings of `inner` back-to-back calls of f(i), in ms per call.
template <typename F> static double time_ms(int warm, int reps, int inner, F f) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    int it = 0;
    for (int i = 0; i < warm; i++) f(it++);
    CK(cudaDeviceSynchronize());
    std::vector<double> t;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(a));
        for (int i = 0; i < inner; i++) f(it++);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms / inner);
    }
    CK(cudaGetLastError());
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

// --- device helpers ------------------------------------------------------------------------

__global__ void fill_random_kernel(uint16_t *p, size_t n, uint64_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ull;
        x ^= x >> 29;
        float u = (float)(x >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
        uint32_t b = __float_as_uint(u * scale);
        p[i] = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1)) >> 16);
    }
}
static void fill_random(void *p, size_t n_bf16, uint64_t seed, float scale = 1.0f) {
    fill_random_kernel<<<1024, 256>>>((uint16_t *)p, n_bf16, seed, scale);
    CK(cudaGetLastError());
}
