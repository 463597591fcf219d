// kernels/cuda/device.cu - device queries shared by the launchers.
#include <stdio.h>
#include <stdlib.h>

#include <atomic>

#include "kernels/cuda/cuda_common.cuh"

int pg_cuda_sm_count(void) {
    static std::atomic<int> cache[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 132;
    int v = cache[dev & 63].load(std::memory_order_relaxed);
    if (v > 0) return v;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0) v = 132;
    cache[dev & 63].store(v, std::memory_order_relaxed);
    return v;
}

// PDL: -1 = the environment's default, 0 off, 1 on (where supported).
static std::atomic<int> g_pdl_mode{-1};
static std::atomic<int> g_pdl_env{-1}; // PAGED_CUDA_PDL, read once: 0 off, 1 on

void pg_cuda_pdl_set(int mode) { g_pdl_mode.store(mode < 0 ? -1 : mode ? 1 : 0, std::memory_order_relaxed); }

int pg_cuda_pdl_enabled(void) {
    static std::atomic<int> cc9[64]; // per device: 0 unknown, 1 sm >= 90, 2 older
    int mode = g_pdl_mode.load(std::memory_order_relaxed);
    if (mode == 0) return 0;
    if (mode < 0) {
        int env = g_pdl_env.load(std::memory_order_relaxed);
        if (env < 0) {
            const char *e = getenv("PAGED_CUDA_PDL");
            env = (e && e[0] == '0' && e[1] == 0) ? 0 : 1;
            g_pdl_env.store(env, std::memory_order_relaxed);
        }
        if (!env) return 0;
    }
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    int v = cc9[dev & 63].load(std::memory_order_relaxed);
    if (v == 0) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            major = 0;
        }
        v = major >= 9 ? 1 : 2;
        cc9[dev & 63].store(v, std::memory_order_relaxed);
    }
    return v == 1;
}

extern "C" int pg_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); // clear "no driver" so later calls start clean
        return 0;
    }
    return n;
}

extern "C" int pg_cuda_device_describe(char *name, size_t cap) {
    PG_ARG(name && cap > 0, "device_describe: no buffer");
    int dev = 0;
    PG_CUDA_TRY(cudaGetDevice(&dev));
    cudaDeviceProp pr;
    PG_CUDA_TRY(cudaGetDeviceProperties(&pr, dev));
    int drv = 0, rt = 0;
    PG_CUDA_TRY(cudaDriverGetVersion(&drv));
    PG_CUDA_TRY(cudaRuntimeGetVersion(&rt));
    snprintf(name, cap, "%s, %d SMs, %.1f GiB, sm_%d%d, L2 %d MiB, driver %d, runtime %d", pr.name,
             pr.multiProcessorCount, (double)pr.totalGlobalMem / (1 << 30), pr.major, pr.minor,
             pr.l2CacheSize >> 20, drv, rt);
    return 0;
}
