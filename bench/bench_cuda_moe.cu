// bench/bench_cuda_moe.cu - the CUDA mixture-of-experts feed-forward
// (pg_cuda_moe_ffn, kernels/cuda/moe.cu) over the batch size.
//
// Shapes: Qwen3-30B-A3B (hidden 2048, ffn 768, 128 experts, top 8) and
// Mixtral-8x7B (hidden 4096, ffn 14336, 8 experts, top 2), both with the
// RMSNorm and renormalized top-k weights, as the models run them. Random
// bf16 weights, each expert its own cudaMalloc (the contract's host arrays
// of device pointers, as the backend passes them); the router is scaled so
// its logits are ~N(0, 1), which spreads the routing over the experts the way
// a trained router roughly does (a flat or a peaked router would touch too
// many or too few experts and misstate the weight traffic).
//
// Per m: 3 warm-up calls, then `reps` back-to-back calls captured in one CUDA
// graph (the op is graph-safe, and the graph hides the host's launch cost,
// as in the decode loop); the time per call is the median over several
// replays (CUDA events) divided by reps. The routing of the warm-up gives
// the distinct experts the batch touches; "GB/s" counts those experts'
// weights (3 hidden ffn bf16 each) plus the router's, the bytes a call must
// read at least (activations left out: small beside the weights until m is
// large, where TFLOP/s is the measure); TFLOP/s counts 2 * 3 * m * top_k *
// hidden * ffn (the expert products; the router's is negligible).
//
// Usage: build/gpu/bench_cuda_moe [--quick] [--shape qwen3|mixtral|all]
//        [--m 1,8,64] [--reps N]      exit 77 = no CUDA device.
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/gpu/gpu_util.h"

struct Shape {
    const char *name, *key;
    int hidden, ffn, n_experts, top_k;
};
static const Shape SHAPES[] = {
    {"Qwen3-30B-A3B", "qwen3", 2048, 768, 128, 8},
    {"Mixtral-8x7B", "mixtral", 4096, 14336, 8, 2},
};

// bias + scale * u, u uniform in [-1, 1), from a hash of the index: fast on
// the device for the 2.8 GB of Mixtral's experts, and never all zeros (zeros
// can run faster than real data). The shared fill_random has no bias; the
// RMSNorm weights want ~1. (bench_cuda_util.cuh is not included: its
// timer is per-call events, this bench times graph replays.)
__global__ void fill_kernel(uint16_t *p, size_t n, uint64_t seed, float scale, float bias) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ (seed * 0xd1b54a32d192ed03ull);
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ull;
        x ^= x >> 29;
        const float u = (float)(x >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
        const uint32_t b = __float_as_uint(bias + u * scale);
        p[i] = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1)) >> 16);
    }
}
// Random e4m3 bytes for --fp8: any code but the NaNs (0x7F, 0xFF), with
// the exponent field kept below 8 (|value| < 2) so products stay finite;
// the row scales then set the size.
__global__ void fill_e4m3_kernel(uint8_t *p, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ (seed * 0xd1b54a32d192ed03ull);
        x ^= x >> 31;
        x *= 0xbf58476d1ce4e5b9ull;
        p[i] = (uint8_t)((x >> 56) & 0xBF); // bit 6 clear: exponent < 8
    }
}
__global__ void fill_const_kernel(float *p, size_t n, float v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = v;
}

// Uniform on [-a, a) has variance a^2 / 3: std s wants a = sqrt(3) s.
static void fill(void *p, size_t n, uint64_t seed, float std_dev, float bias = 0.0f) {
    fill_kernel<<<1024, 256>>>((uint16_t *)p, n, seed, std_dev * sqrtf(3.0f), bias);
    CK(cudaGetLastError());
}

static std::vector<int> parse_list(const char *s) {
    std::vector<int> v;
    for (const char *p = s; *p;) {
        char *end;
        const long x = strtol(p, &end, 10);
        if (end == p || x < 1 || x > (1 << 20)) {
            fprintf(stderr, "--m: bad list '%s' (comma-separated positive integers)\n", s);
            exit(2);
        }
        v.push_back((int)x);
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            fprintf(stderr, "--m: bad list '%s'\n", s);
            exit(2);
        }
    }
    return v;
}

static void usage() {
    fprintf(stderr, "usage: bench_cuda_moe [--quick] [--shape qwen3|mixtral|all] [--m LIST] [--reps N] [--fp8]\n");
    exit(2);
}

static void bench_shape(const Shape &s, const std::vector<int> &ms, int reps, int replays, bool fp8,
                        cudaStream_t st) {
    const int H = s.hidden, F = s.ffn, E = s.n_experts, K = s.top_k;
    const int max_m = *std::max_element(ms.begin(), ms.end());
    const size_t expert_elems = (size_t)3 * H * F; // gate_up [2F][H] + down [H][F]
    const size_t wbytes = fp8 ? 1 : 2;              // bytes a weight
    // One allocation per expert and matrix, as the backend's weights are
    // (FP8: the row scales in allocations of their own).
    std::vector<DBuf> gu_buf(E), dn_buf(E), gus_buf(E), dns_buf(E);
    std::vector<const void *> gu(E), dn(E);
    std::vector<const float *> gus(E), dns(E);
    for (int e = 0; e < E; e++) {
        gu_buf[e].alloc((size_t)2 * F * H * wbytes);
        dn_buf[e].alloc((size_t)H * F * wbytes);
        if (fp8) {
            gus_buf[e].alloc((size_t)2 * F * 4);
            dns_buf[e].alloc((size_t)H * 4);
            fill_e4m3_kernel<<<1024, 256>>>((uint8_t *)gu_buf[e].p, (size_t)2 * F * H, 100 + 2 * e);
            fill_e4m3_kernel<<<1024, 256>>>((uint8_t *)dn_buf[e].p, (size_t)H * F, 101 + 2 * e);
            fill_const_kernel<<<8, 256>>>((float *)gus_buf[e].p, (size_t)2 * F, 1.0f / sqrtf((float)H));
            fill_const_kernel<<<8, 256>>>((float *)dns_buf[e].p, (size_t)H, 1.0f / sqrtf((float)F));
            CK(cudaGetLastError());
            gus[e] = (const float *)gus_buf[e].p;
            dns[e] = (const float *)dns_buf[e].p;
        } else {
            // std 1/sqrt(fan-in): g, u and y stay ~N(0, 1), no overflow to inf.
            fill(gu_buf[e].p, (size_t)2 * F * H, 100 + 2 * e, 1.0f / sqrtf((float)H));
            fill(dn_buf[e].p, (size_t)H * F, 101 + 2 * e, 1.0f / sqrtf((float)F));
        }
        gu[e] = gu_buf[e].p;
        dn[e] = dn_buf[e].p;
    }
    DBuf router((size_t)E * H * 2), norm((size_t)H * 2), x((size_t)max_m * H * 2), out((size_t)max_m * H * 2);
    fill(router.p, (size_t)E * H, 1, 1.0f / sqrtf((float)H)); // logits ~N(0, 1) for unit rows
    fill(norm.p, H, 2, 0.05f, 1.0f);
    fill(x.p, (size_t)max_m * H, 3, 1.0f);
    // The workspace for the largest m serves every smaller one.
    const size_t ws_bytes = pg_cuda_moe_workspace_size(max_m, H, F, E, K);
    DBuf ws(ws_bytes);
    CK(cudaDeviceSynchronize());

    printf("\n%s: hidden %d, ffn %d, %d experts, top %d (renorm, RMSNorm), %s experts; %.1f MB an expert, "
           "median of %d replays of %d calls in a graph\n\n",
           s.name, H, F, E, K, fp8 ? "FP8" : "bf16", expert_elems * wbytes / 1e6, replays, reps);
    printf("| m | distinct experts | us | GB/s | TFLOP/s | us/row |\n");
    printf("|---:|---:|---:|---:|---:|---:|\n");
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int m : ms) {
        // accumulate on and out != x: the residual add the model asks for,
        // without feeding each call's output into the next call's routing.
        auto call = [&] {
            if (fp8)
                return pg_cuda_moe_ffn_fp8(out.p, x.p, m, H, F, norm.p, 1e-6f, router.p, gu.data(), gus.data(),
                                           dn.data(), dns.data(), E, K, 1, 1, ws.p, ws_bytes, st);
            return pg_cuda_moe_ffn(out.p, x.p, m, H, F, norm.p, 1e-6f, router.p, gu.data(), dn.data(), E, K, 1, 1,
                                   ws.p, ws_bytes, st);
        };
        for (int i = 0; i < 3; i++) PK(call());
        CK(cudaStreamSynchronize(st));
        std::vector<int32_t> sel((size_t)m * K);
        std::vector<float> w((size_t)m * K);
        PK(pg_cuda_moe_routing(sel.data(), w.data(), ws.p, m, H, F, E, K, st));
        std::vector<char> hit(E, 0);
        for (int32_t e : sel)
            if (e >= 0 && e < E) hit[e] = 1;
        const int distinct = (int)std::count(hit.begin(), hit.end(), 1);

        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        int rc = 0;
        for (int i = 0; i < reps && rc == 0; i++) rc = call();
        CK(cudaStreamEndCapture(st, &g));
        if (rc != 0) {
            printf("| %d | error: %s |\n", m, pg_err_msg());
            CK(cudaGraphDestroy(g));
            continue;
        }
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphDestroy(g));
        CK(cudaGraphUpload(ge, st));
        CK(cudaGraphLaunch(ge, st)); // one untimed replay: first-launch costs
        std::vector<double> t;
        for (int r = 0; r < replays; r++) {
            CK(cudaEventRecord(a, st));
            CK(cudaGraphLaunch(ge, st));
            CK(cudaEventRecord(b, st));
            CK(cudaEventSynchronize(b));
            float ms_;
            CK(cudaEventElapsedTime(&ms_, a, b));
            t.push_back(ms_ * 1e3 / reps);
        }
        CK(cudaGetLastError());
        CK(cudaGraphExecDestroy(ge));
        std::sort(t.begin(), t.end());
        const double us = t[t.size() / 2];
        const double bytes = (double)distinct * expert_elems * wbytes + (double)E * H * 2;
        const double flops = 2.0 * 3.0 * m * K * (double)H * F;
        printf("| %d | %d | %.1f | %.0f | %.2f | %.3f |\n", m, distinct, us, bytes / (us * 1e-6) / 1e9,
               flops / (us * 1e-6) / 1e12, us / m);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
}

int main(int argc, char **argv) {
    bool quick = false;
    std::string shape = "all";
    std::vector<int> ms;
    int reps = 20;
    bool fp8 = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--fp8")) fp8 = true;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) shape = argv[++i];
        else if (!strcmp(argv[i], "--m") && i + 1 < argc) ms = parse_list(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else usage();
    }
    if (shape != "all" && shape != "qwen3" && shape != "mixtral") usage();
    if (reps < 1) usage();
    char dev[256];
    if (!gpu_announce(dev, sizeof dev)) return 77;
    if (ms.empty()) {
        if (quick) ms = {1, 8, 64, 256, 1024, 4096};
        else ms = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
    }
    const int replays = quick ? 5 : 11;
    // Graph capture needs a stream other than the legacy default one.
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (const Shape &s : SHAPES)
        if (shape == "all" || shape == s.key) bench_shape(s, ms, reps, replays, fp8, st);
    CK(cudaStreamDestroy(st));
    printf("\ndevice: %s\n", dev);
    return 0;
}
