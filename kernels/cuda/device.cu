// kernels/cuda/device.cu - device queries shared by the launchers.
#include <stdio.h>

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
