// bench/cuda/bench_fi_prefill.cu - FlashInfer's sm90 paged prefill (FA3-style:
// wgmma, TMA for Q, warp specialization) beside our prefill kernel, on OUR
// paged KV cache in place (issue 29; docs/cuda_kernels.md, "FlashInfer's
// sm90 prefill beside ours").
//
// One configuration is instantiated: head_dim 128, bf16 Q/K/V/O, causal,
// page size 16 (our block_size), 32 query heads / 8 KV heads (GQA 4),
// FlashInfer's StandardAttention variant (no soft cap, no window). The KV
// cache is ours as the runner allocates it: one K and one V tensor of
// [n_blocks][16][n_kv][128] bf16 (FlashInfer's NHD page layout), and the
// padded block tables [n_seqs][bt_stride] int32 are FlashInfer's kv_indices
// as they are, with kv_indptr[s] = s * bt_stride (the kernel reads
// kv_indices + kv_indptr[s]; no gather into a CSR array, no KV copy).
// Causal is bottom-right aligned (query i of a chunk of q_len over kv_len
// keys sees keys <= kv_len - q_len + i), which is our start_pos + i.
//
// 1. Correctness: 3 sequences (300 and 77 tokens all new; 50 new tokens
//    after 150 cached, the chunked-prefill offset) against an fp32 host
//    reference on the bf16 inputs, FlashInfer and ours; bound 1e-2 relative
//    (‖out − ref‖ / ‖ref‖), outputs poisoned first. Exit 1 on a failure.
// 2. Timing on the issue's shapes (all of the prompt new): 1 x 4096,
//    2 x 8192, 8 x 4096, 1 x 32768; TFLOP/s with causal FLOPs
//    2 * 2 * heads * head_dim * sum L(L+1)/2, FlashInfer's run (its host
//    plan, PrefillSM90Plan, once per shape outside the timing; its cost is
//    printed apart) and our pg_cuda_paged_prefill_attention (v2).
//
// Built only where FlashInfer's headers are found (PyPI's flashinfer-python,
// which deploy/quickstart.sh puts in .venv where nvcc is; FLASHINFER_INC
// overrides: tools/nvcc_or_stub.sh); otherwise a stub that exits 77.
//
// Usage: build/gpu/bench_fi_prefill [--quick | --check]    exit 77 = skipped
//   --quick: fewer repetitions; --check: step 1 alone (for compute-sanitizer)
#include <stdio.h>

#ifndef PG_HAVE_FLASHINFER

int main(void) {
    printf("skipped: bench_fi_prefill was built without FlashInfer's headers (pip install flashinfer-python)\n");
    return 77;
}

#else

#include <chrono>
#include <flashinfer/attention/hopper/prefill_sm90.cuh>
#include <flashinfer/attention/hopper/variants.cuh>
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/cutlass_utils.cuh>

#include "tests/gpu/gpu_util.h"
#include "bench/bench_cuda_util.cuh"

using namespace flashinfer;

namespace {

constexpr int HD = 128, H = 32, KV = 8, BS = 16;

// What batch_prefill_sm90_customize_config.jinja generates for bf16, int32
// ids and the default (non-fp8) variant.
struct PagedParams {
    using DTypeQ = cutlass::bfloat16_t;
    using DTypeKV = cutlass::bfloat16_t;
    using DTypeO = cutlass::bfloat16_t;
    using IdType = int32_t;
    DTypeQ *q_ptr;
    DTypeKV *k_ptr;
    DTypeKV *v_ptr;
    DTypeO *o_ptr;
    float *lse_ptr;

    IdType *qo_tile_indices;
    IdType *qo_indptr;
    IdType *kv_indptr;
    IdType *kv_indices;
    IdType *qo_lens;
    IdType *kv_lens;
    IdType *head_indices;
    IdType *work_indptr;
    IdType *batch_indices;

    struct AdditionalParams {
        uint32_t *maybe_prefix_len_ptr;
        uint16_t *maybe_token_pos_in_items_ptr;
        uint16_t *maybe_max_item_len_ptr;
        float *maybe_scale_v;
        double logits_soft_cap;
        double sm_scale;
        double scale_v_scalar;
        int64_t token_pos_in_items_len;
    } additional_params;

    int64_t q_stride_n;
    int64_t k_stride_n;
    int64_t v_stride_n;
    int64_t o_stride_n;
    int64_t q_stride_h;
    int64_t k_stride_h;
    int64_t v_stride_h;
    int64_t o_stride_h;
    int64_t nnz_qo;
    int64_t k_page_stride;
    int64_t v_page_stride;

    int head_dim;
    int num_qo_heads;
    int num_kv_heads;
    int group_size;
    int page_size;
    int window_left;

    bool causal;
};

// A batch: sequence s has q_len[s] new tokens after start[s] cached ones.
struct Batch {
    std::vector<int> q_len, start;
    int n_seqs() const { return (int)q_len.size(); }
    int tokens() const {
        int t = 0;
        for (int l : q_len) t += l;
        return t;
    }
};

// Everything both kernels read, laid out as the runner lays it out.
struct Setup {
    Batch b;
    int n_blocks = 0, bt_stride = 0, max_q = 0;
    std::vector<int32_t> bt, cu, sp; // padded block tables, cu_q, start_pos
    DBuf kc, vc, q, out_fi, out_pg, dbt, dcu, dsp;
    // FlashInfer's plan
    DBuf fws, iws;
    void *iws_h = nullptr;
    PrefillPlanSM90Info plan;
    std::vector<int32_t> qo_indptr, kv_indptr, kv_len;
    double plan_ms = 0;

    ~Setup() {
        if (iws_h) cudaFreeHost(iws_h);
    }
};

const size_t FWS_BYTES = (size_t)128 << 20, IWS_BYTES = (size_t)8 << 20; // FlashInfer's defaults

void setup(Setup &S, const Batch &b, uint64_t seed, bool host_fill, std::vector<uint16_t> *hk, std::vector<uint16_t> *hv,
           std::vector<uint16_t> *hq) {
    S.b = b;
    const int n = b.n_seqs();
    int max_blocks = 0;
    for (int s = 0; s < n; s++) {
        max_blocks = std::max(max_blocks, (b.start[s] + b.q_len[s] + BS - 1) / BS);
        S.max_q = std::max(S.max_q, b.q_len[s]);
    }
    S.bt_stride = max_blocks + 3; // padded rows, as the runner's
    S.n_blocks = 1 + n * max_blocks; // block 0 is the null block
    // Blocks handed out in a shuffled order: pages are not contiguous.
    std::vector<int32_t> perm(S.n_blocks - 1);
    for (size_t i = 0; i < perm.size(); i++) perm[i] = (int32_t)i + 1;
    Rng r(seed);
    for (size_t i = perm.size(); i > 1; i--) std::swap(perm[i - 1], perm[r.below((int)i)]);
    S.bt.assign((size_t)n * S.bt_stride, 0);
    size_t next = 0;
    for (int s = 0; s < n; s++)
        for (int j = 0; j < (b.start[s] + b.q_len[s] + BS - 1) / BS; j++) S.bt[(size_t)s * S.bt_stride + j] = perm[next++];
    S.cu.assign(n + 1, 0);
    S.sp.assign(n, 0);
    for (int s = 0; s < n; s++) {
        S.cu[s + 1] = S.cu[s] + b.q_len[s];
        S.sp[s] = b.start[s];
    }
    const size_t kv_elems = (size_t)S.n_blocks * BS * KV * HD, q_elems = (size_t)b.tokens() * H * HD;
    S.kc.alloc(kv_elems * 2);
    S.vc.alloc(kv_elems * 2);
    S.q.alloc(q_elems * 2);
    S.out_fi.alloc(q_elems * 2);
    S.out_pg.alloc(q_elems * 2);
    if (host_fill) {
        hk->resize(kv_elems);
        hv->resize(kv_elems);
        hq->resize(q_elems);
        fill_bf16(*hk, r, 1.0f);
        fill_bf16(*hv, r, 1.0f);
        fill_bf16(*hq, r, 2.0f);
        S.kc.up(*hk);
        S.vc.up(*hv);
        S.q.up(*hq);
    } else {
        fill_random(S.kc.p, kv_elems, seed + 1, 1.0f);
        fill_random(S.vc.p, kv_elems, seed + 2, 1.0f);
        fill_random(S.q.p, q_elems, seed + 3, 2.0f);
    }
    S.dbt.up(S.bt);
    S.dcu.up(S.cu);
    S.dsp.up(S.sp);

    // FlashInfer's plan: qo_indptr = cu_q; kv_indptr in pages = the row
    // offsets of our padded tables; kv_len = start + q_len.
    S.qo_indptr = S.cu;
    S.kv_indptr.assign(n + 1, 0);
    S.kv_len.assign(n, 0);
    for (int s = 0; s <= n; s++) S.kv_indptr[s] = s * S.bt_stride;
    for (int s = 0; s < n; s++) S.kv_len[s] = b.start[s] + b.q_len[s];
    S.fws.alloc(FWS_BYTES);
    S.iws.alloc(IWS_BYTES);
    CK(cudaMallocHost(&S.iws_h, IWS_BYTES));
    auto t0 = std::chrono::steady_clock::now();
    CK(PrefillSM90Plan<int32_t>(S.fws.p, FWS_BYTES, S.iws.p, S.iws_h, IWS_BYTES, S.plan, S.qo_indptr.data(),
                                S.kv_indptr.data(), S.kv_len.data(), (uint32_t)b.tokens(), (uint32_t)n, H, KV, HD, HD,
                                BS, /*causal=*/true, /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/2, nullptr));
    CK(cudaStreamSynchronize(nullptr));
    S.plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void run_fi(Setup &S) {
    PagedParams p;
    memset(&p, 0, sizeof p);
    p.q_ptr = S.q.as<cutlass::bfloat16_t>();
    p.k_ptr = S.kc.as<cutlass::bfloat16_t>();
    p.v_ptr = S.vc.as<cutlass::bfloat16_t>();
    p.o_ptr = S.out_fi.as<cutlass::bfloat16_t>();
    p.lse_ptr = nullptr;
    p.q_stride_n = H * HD; // a fused QKV row would give its own stride here
    p.q_stride_h = HD;
    p.o_stride_n = H * HD;
    p.o_stride_h = HD;
    // Our cache, per layer: [n_blocks][16][n_kv][128] = FlashInfer's NHD.
    p.k_stride_n = KV * HD;
    p.k_stride_h = HD;
    p.v_stride_n = KV * HD;
    p.v_stride_h = HD;
    p.k_page_stride = (int64_t)BS * KV * HD;
    p.v_page_stride = (int64_t)BS * KV * HD;
    p.nnz_qo = S.b.tokens();
    p.num_qo_heads = H;
    p.num_kv_heads = KV;
    p.group_size = H / KV;
    p.page_size = BS;
    p.window_left = -1;
    p.causal = true;
    p.head_dim = HD;
    char *ib = (char *)S.iws.p;
    p.qo_tile_indices = (int32_t *)(ib + S.plan.qo_tile_indices_offset);
    p.qo_indptr = (int32_t *)(ib + S.plan.qo_indptr_offset);
    p.kv_indptr = (int32_t *)(ib + S.plan.kv_indptr_offset);
    p.qo_lens = (int32_t *)(ib + S.plan.qo_len_offset);
    p.kv_lens = (int32_t *)(ib + S.plan.kv_len_offset);
    p.head_indices = (int32_t *)(ib + S.plan.head_indices_offset);
    p.work_indptr = (int32_t *)(ib + S.plan.work_indptr_offset);
    p.batch_indices = (int32_t *)(ib + S.plan.batch_indices_offset);
    p.kv_indices = S.dbt.as<int32_t>(); // our padded block tables, as they are
    p.additional_params.sm_scale = 1.0 / sqrt((double)HD);
    p.additional_params.logits_soft_cap = 0.0;
    p.additional_params.scale_v_scalar = 1.0;
    cudaError_t e;
    if (S.plan.same_schedule_for_all_heads)
        e = BatchPrefillWithPagedKVCacheDispatched<HD, HD, MaskMode::kCausal, false, true, StandardAttention, PagedParams>(
            p, /*enable_pdl=*/false, nullptr);
    else
        e = BatchPrefillWithPagedKVCacheDispatched<HD, HD, MaskMode::kCausal, false, false, StandardAttention, PagedParams>(
            p, /*enable_pdl=*/false, nullptr);
    CK(e);
}

void run_pg(Setup &S) {
    pg_kv_shape shape = {S.n_blocks, BS, KV, HD, PG_KV_BF16, nullptr, false, 0, 0.0f};
    PK(pg_cuda_paged_prefill_attention(S.out_pg.p, S.q.p, H * HD, S.kc.p, S.vc.p, shape, S.dbt.as<int32_t>(), S.bt_stride,
                                       S.dcu.as<int32_t>(), S.dsp.as<int32_t>(), S.b.n_seqs(), H, 1.0f / sqrtf((float)HD),
                                       S.max_q, nullptr));
}

// ‖out − ref‖ / ‖ref‖ (inf when a value is not finite).
double rel_err(const std::vector<uint16_t> &out, const std::vector<float> &ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        double o = bf2f(out[i]);
        if (!std::isfinite(o)) return INFINITY;
        num += (o - ref[i]) * (o - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

bool check() {
    Batch b{{300, 77, 50}, {0, 0, 150}};
    Setup S;
    std::vector<uint16_t> hk, hv, hq;
    setup(S, b, 7, true, &hk, &hv, &hq);
    const size_t q_elems = (size_t)b.tokens() * H * HD;
    CK(cudaMemset(S.out_fi.p, 0xff, q_elems * 2)); // bf16 NaN
    CK(cudaMemset(S.out_pg.p, 0xff, q_elems * 2));
    run_fi(S);
    run_pg(S);
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> ofi(q_elems), opg(q_elems);
    CK(cudaMemcpy(ofi.data(), S.out_fi.p, q_elems * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(opg.data(), S.out_pg.p, q_elems * 2, cudaMemcpyDeviceToHost));

    // fp32 reference on the bf16 inputs, through the block tables.
    std::vector<float> ref(q_elems);
    const float scale = 1.0f / sqrtf((float)HD);
    parallel_for((int64_t)b.tokens() * H, [&](int64_t i) {
        const int t = (int)(i / H), h = (int)(i % H), kvh = h / (H / KV);
        int s = 0;
        while (t >= S.cu[s + 1]) s++;
        const int pos = S.sp[s] + (t - S.cu[s]);
        std::vector<float> sc(pos + 1);
        float mx = -INFINITY;
        for (int j = 0; j <= pos; j++) {
            const size_t slot = (size_t)S.bt[(size_t)s * S.bt_stride + j / BS] * BS + j % BS;
            float d = 0;
            for (int e = 0; e < HD; e++)
                d += bf2f(hq[((size_t)t * H + h) * HD + e]) * bf2f(hk[(slot * KV + kvh) * HD + e]);
            sc[j] = d * scale;
            mx = std::max(mx, sc[j]);
        }
        float sum = 0;
        std::vector<float> acc(HD, 0.0f);
        for (int j = 0; j <= pos; j++) {
            const float w = expf(sc[j] - mx);
            sum += w;
            const size_t slot = (size_t)S.bt[(size_t)s * S.bt_stride + j / BS] * BS + j % BS;
            for (int e = 0; e < HD; e++) acc[e] += w * bf2f(hv[(slot * KV + kvh) * HD + e]);
        }
        for (int e = 0; e < HD; e++) ref[((size_t)t * H + h) * HD + e] = acc[e] / sum;
    });
    const double efi = rel_err(ofi, ref), epg = rel_err(opg, ref);
    const bool ok = efi < 1e-2 && epg < 1e-2;
    printf("check (300 + 77 new, 50 after 150 cached; fp32 reference): flashinfer rel err %.2e, ours %.2e: %s\n", efi,
           epg, ok ? "ok" : "FAIL");
    return ok;
}

} // namespace

int main(int argc, char **argv) {
    bool quick = false, check_only = false; // --check: the correctness case alone (compute-sanitizer)
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--check")) check_only = true;
    }
    if (!gpu_announce()) return 77;
    int major = 0;
    CK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    if (major != 9) {
        printf("skipped: FlashInfer's sm90 prefill needs compute capability 9.x\n");
        return 77;
    }
    const bool ok = check();
    if (check_only) return ok ? 0 : 1;

    struct Shape {
        int n, len;
    } shapes[] = {{1, 4096}, {2, 8192}, {8, 4096}, {1, 32768}};
    printf("causal prefill, head_dim %d, %d q heads / %d KV heads, bf16, page %d, all of the prompt new\n", HD, H, KV, BS);
    printf("%-12s %14s %14s %10s %12s %10s\n", "shape", "flashinfer", "ours (v2)", "fi/ours", "fi plan ms", "fi vs ours");
    for (const Shape &sh : shapes) {
        Batch b;
        for (int s = 0; s < sh.n; s++) {
            b.q_len.push_back(sh.len);
            b.start.push_back(0);
        }
        Setup S;
        setup(S, b, 100 + sh.n, false, nullptr, nullptr, nullptr);
        double pairs = 0;
        for (int l : b.q_len) pairs += (double)l * (l + 1) / 2.0;
        const double flops = 2.0 * 2.0 * H * HD * pairs;
        const int reps = quick ? 3 : 11;
        double ms_fi = time_ms(2, reps, 3, [&](int) { run_fi(S); });
        double ms_pg = time_ms(2, reps, 3, [&](int) { run_pg(S); });
        // The two outputs of the shape against each other (both bf16).
        const size_t q_elems = (size_t)b.tokens() * H * HD;
        std::vector<uint16_t> a(q_elems), c(q_elems);
        CK(cudaMemcpy(a.data(), S.out_fi.p, q_elems * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(c.data(), S.out_pg.p, q_elems * 2, cudaMemcpyDeviceToHost));
        std::vector<float> cf(q_elems);
        for (size_t i = 0; i < q_elems; i++) cf[i] = bf2f(c[i]);
        char name[32];
        snprintf(name, sizeof name, "%d x %d", sh.n, sh.len);
        printf("%-12s %9.1f TF/s %9.1f TF/s %9.2fx %12.3f %10.1e\n", name, flops / ms_fi * 1e-9, flops / ms_pg * 1e-9,
               ms_pg / ms_fi, S.plan_ms, rel_err(a, cf));
    }
    return ok ? 0 : 1;
}

#endif // PG_HAVE_FLASHINFER
