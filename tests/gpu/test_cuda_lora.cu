// tests/gpu/test_cuda_lora.cu - batched multi-adapter LoRA on the GPU
// (kernels/cuda/lora.cu, pg_cuda_lora_apply; contract in
// kernels/cuda/cuda_ops.h, semantics in docs/lora.md) against the CPU
// backend's lora_apply (kernels/cpu/lora.c) re-implemented on the host over
// the same bf16 inputs, as test_cuda_moe does (the CPU backend and its
// OpenBLAS are not linked into standalone GPU programs): per row of slot s,
// t = f32(x . a_s^T) (the CPU rounds the shrink to f32 before the expand),
// y = t . b_s^T, ref = out_before + scale_s * y, the sums in fp64.
//
// Slots: ranks 1, 8, 16 and 64 (scales 1, 0.5, 2, 1.5), one whose adapter
// leaves the projection alone (a NULL), one of rank 8 that no row names.
// Rows mix them with -1 in a random pattern; m = 1 .. 512. Shapes: 64 -> 32
// into columns 64..96 of 128 (a column slice, 16-byte paths), 96 -> 40 with
// x rows 101 apart and out columns 3..43 of 70 (unaligned: scalar paths),
// 4096 -> 1024 into the K slice (columns 4096..5120) of a Llama-8B Q|K|V row
// of 6144, 1024 -> 2816 into the up half of a gate|up row of 5632, 5000 ->
// 300 (three k splits of the grouped shrink, the last one short). "lora
// staged": one stage for two projections, and each row alone against the
// batch, bit for bit. Every case runs for both shapes of the kernels: BGMV
// (the default) and the grouped one (PAGED_CUDA_LORA_SGMV=1).
//
// Bound: |gpu - ref| <= 4e-3 * max_j |ref[i][j]| for every adapter row i.
// The inputs are the same bf16 values on both sides, so their rounding
// costs nothing here; what separates the two is the GPU's f32 sums in
// another order than fp64 (relative ~sqrt(in) * 2^-24, under 1e-5 for
// in = 4096 with these unit-scale values) and the one bf16 rounding of the
// output (half an ulp, 2^-9 = 1.95e-3 of |out|): ~2e-3 at worst. The adapter
// adds values as large as out's own (a ~ N(0, 1/in), b ~ N(0, 1/rank)), so
// a wrong slot, scale, row or transposition is off by O(1), and each case
// also checks that the adapters moved the rows (max |delta| / max |ref| >
// 0.1). Bit for bit: rows of slot -1 and of the slot without `a` (the
// whole fused row), the columns outside the view in adapter rows, two
// poisoned guard rows before and after the output, and x.
// Refusals write nothing: a slot out of range, rank 65, FP8 and f32
// adapters, more than PG_CUDA_LORA_MAX_SLOTS slots, no or a too small
// workspace, and any call under stream capture (not graph-safe, by
// contract); rows all -1 need no workspace and write nothing.
//
// Usage: build/gpu/test_cuda_lora [-k FILTER]   exit 0 pass, 1 fail, 77 no GPU.
#include <stdlib.h>
#include <string.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/gpu/gpu_util.h"
extern "C" {
#include "kernels/cuda/cuda_ops.h"
#include "kernels/dtype.h"
}

static const char *g_filter = "";
static const char *g_shape = "bgmv"; // the kernels' shape under test: PAGED_CUDA_LORA_SGMV=0 / 1
static int g_fail = 0, g_ok = 0;
static bool selected(const char *name) { return strstr(name, g_filter) != nullptr; }

static void report(const char *name, bool ok, const char *detail) {
    printf("%-4s %-58s %s\n", ok ? "ok" : "FAIL", name, detail);
    fflush(stdout);
    ok ? g_ok++ : g_fail++;
}

constexpr int N_SLOTS = 6; // ranks 1, 8, 16, 64; slot 4: a NULL; slot 5: rank 8, no rows
static const int k_rank[N_SLOTS] = {1, 8, 16, 64, 0, 8};
static const float k_scale[N_SLOTS] = {1.0f, 0.5f, 2.0f, 1.5f, 1.0f, 3.0f};
constexpr double BOUND = 4e-3;

struct Shape {
    const char *name;
    int64_t in, out, ldx, ldo, col0; // out: columns [col0, col0 + out) of rows ldo apart
};

// One projection's adapters: host bf16 copies and their device buffers.
struct Adapters {
    int64_t in, out;
    std::vector<uint16_t> a[N_SLOTS], b[N_SLOTS];
    std::unique_ptr<DBuf> da[N_SLOTS], db[N_SLOTS];
    Adapters(int64_t in_, int64_t out_, uint64_t seed) : in(in_), out(out_) {
        Rng r(seed);
        for (int s = 0; s < N_SLOTS; s++) {
            da[s].reset(new DBuf());
            db[s].reset(new DBuf());
            if (!k_rank[s]) continue;
            a[s].resize((size_t)(k_rank[s] * in));
            b[s].resize((size_t)(out * k_rank[s]));
            for (auto &v : a[s]) v = f2bf((float)(r.normal() / sqrt((double)in)));
            for (auto &v : b[s]) v = f2bf((float)(r.normal() / sqrt((double)k_rank[s])));
            da[s]->up(a[s]);
            db[s]->up(b[s]);
        }
    }
    void table(pg_cuda_lora_slot *t) const {
        for (int s = 0; s < N_SLOTS; s++)
            t[s] = k_rank[s] ? pg_cuda_lora_slot{da[s]->p, db[s]->p, k_rank[s], PG_DTYPE_BF16, k_scale[s]}
                             : pg_cuda_lora_slot{nullptr, nullptr, 0, PG_DTYPE_BF16, 1.0f};
    }
};

constexpr int GUARD = 2; // poisoned rows before and after the output
constexpr uint16_t POISON = 0x7fa5; // a NaN no kernel writes

static void run_case(const Shape &sh, const Adapters &ad, int64_t m, uint64_t seed) {
    char name[160];
    snprintf(name, sizeof name, "lora %s %s m=%lld", g_shape, sh.name, (long long)m);
    if (!selected(name)) return;
    Rng r(seed);
    std::vector<int32_t> slot((size_t)m);
    for (int64_t i = 0; i < m; i++) slot[(size_t)i] = i < 6 && m >= 6 ? (int32_t)i - 1 : r.below(6) - 1; // -1..4
    if (m >= 6) // shuffle so slots are unsorted
        for (int64_t i = m - 1; i > 0; i--) std::swap(slot[(size_t)i], slot[(size_t)r.below((int)i + 1)]);
    std::vector<uint16_t> x((size_t)(m * sh.ldx)), o((size_t)((m + 2 * GUARD) * sh.ldo));
    for (auto &v : x) v = f2bf((float)r.normal());
    for (int64_t i = 0; i < m + 2 * GUARD; i++)
        for (int64_t j = 0; j < sh.ldo; j++)
            o[(size_t)(i * sh.ldo + j)] = i < GUARD || i >= m + GUARD ? POISON : f2bf((float)r.normal());
    DBuf dx, dout;
    dx.up(x);
    dout.up(o);
    pg_cuda_lora_slot tab[N_SLOTS];
    ad.table(tab);
    const size_t wsb = pg_cuda_lora_workspace_size(m, sh.in, 64);
    DBuf ws(wsb);
    uint16_t *out0 = dout.as<uint16_t>() + GUARD * sh.ldo + sh.col0;
    PK(pg_cuda_lora_apply(out0, sh.ldo, dx.p, sh.ldx, m, sh.in, sh.out, slot.data(), tab, N_SLOTS, ws.p, wsb, 0,
                          nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> go(o.size()), gx(x.size());
    dout.down(go);
    dx.down(gx);

    std::vector<double> row_err((size_t)m, 0), row_delta((size_t)m, 0), row_ref((size_t)m, 0);
    parallel_for(m, [&](int64_t i) {
        const int s = slot[(size_t)i];
        if (s < 0 || !k_rank[s]) return;
        const int R = k_rank[s];
        std::vector<float> t((size_t)R);
        for (int q = 0; q < R; q++) {
            double acc = 0;
            for (int64_t k = 0; k < sh.in; k++)
                acc += (double)bf2f(x[(size_t)(i * sh.ldx + k)]) * (double)bf2f(ad.a[s][(size_t)(q * sh.in + k)]);
            t[(size_t)q] = (float)acc; // the CPU's f32 shrink
        }
        double err = 0, dmax = 0, rmax = 0;
        for (int64_t j = 0; j < sh.out; j++) {
            double y = 0;
            for (int q = 0; q < R; q++) y += (double)t[(size_t)q] * (double)bf2f(ad.b[s][(size_t)(j * R + q)]);
            const size_t at = (size_t)((i + GUARD) * sh.ldo + sh.col0 + j);
            const double ref = (double)bf2f(o[at]) + (double)k_scale[s] * y;
            const double g = (double)bf2f(go[at]);
            err = std::max(err, std::isnan(g) ? INFINITY : fabs(g - ref));
            dmax = std::max(dmax, fabs((double)k_scale[s] * y));
            rmax = std::max(rmax, fabs(ref));
        }
        row_err[(size_t)i] = err / rmax;
        row_delta[(size_t)i] = dmax;
        row_ref[(size_t)i] = rmax;
    });
    // Bit for bit: every element outside the adapter rows' views.
    int64_t changed = 0;
    for (int64_t i = 0; i < m + 2 * GUARD; i++) {
        const int64_t row = i - GUARD;
        const bool adapter_row = row >= 0 && row < m && slot[(size_t)row] >= 0 && k_rank[slot[(size_t)row]];
        for (int64_t j = 0; j < sh.ldo; j++) {
            if (adapter_row && j >= sh.col0 && j < sh.col0 + sh.out) continue;
            changed += go[(size_t)(i * sh.ldo + j)] != o[(size_t)(i * sh.ldo + j)];
        }
    }
    const bool x_same = gx == x;
    double worst = 0, dmax = 0, rmax = 0;
    int64_t n_ad = 0;
    for (int64_t i = 0; i < m; i++) {
        worst = std::max(worst, row_err[(size_t)i]);
        dmax = std::max(dmax, row_delta[(size_t)i]);
        rmax = std::max(rmax, row_ref[(size_t)i]);
        n_ad += row_ref[(size_t)i] > 0;
    }
    const bool moved = n_ad == 0 || dmax > 0.1 * rmax;
    const bool ok = worst <= BOUND && changed == 0 && x_same && moved;
    char detail[256];
    snprintf(detail, sizeof detail, "max_rel %.3e (bound %.0e), %lld adapter rows, delta/ref %.2f, %lld bits changed "
             "outside%s", worst, BOUND, (long long)n_ad, rmax > 0 ? dmax / rmax : 0.0, (long long)changed,
             x_same ? "" : ", x WRITTEN");
    report(name, ok, detail);
}

// Staged once, applied for two projections (the backend's way: one stage a
// step): the same bits as staging in the call; a table whose slot 1 has
// no `a` leaves slot 1's rows alone and writes the others' as before; and
// each row alone (m = 1) gets the bits it got in the batch.
static void staged_case() {
    char name[64];
    snprintf(name, sizeof name, "lora %s staged", g_shape);
    if (!selected(name)) return;
    const Shape sh = {"4096->1024", 4096, 1024, 4096, 1024, 0};
    const Adapters ad(sh.in, sh.out, 4242);
    const int64_t m = 100;
    Rng r(77);
    std::vector<int32_t> slot((size_t)m);
    for (auto &v : slot) v = r.below(5) - 1; // -1..3
    std::vector<uint16_t> x((size_t)(m * sh.ldx)), o((size_t)(m * sh.ldo));
    for (auto &v : x) v = f2bf((float)r.normal());
    for (auto &v : o) v = f2bf((float)r.normal());
    pg_cuda_lora_slot tab[N_SLOTS], tab2[N_SLOTS];
    ad.table(tab);
    memcpy(tab2, tab, sizeof tab);
    tab2[1].a = nullptr;
    const size_t wsb = pg_cuda_lora_workspace_size(m, sh.in, 64);
    DBuf dx, d1, d2, d3, d4, ws(wsb);
    dx.up(x), d1.up(o), d2.up(o), d3.up(o), d4.up(o);
    auto apply = [&](DBuf &d, const pg_cuda_lora_slot *t, int staged) {
        return pg_cuda_lora_apply(d.p, sh.ldo, dx.p, sh.ldx, m, sh.in, sh.out, slot.data(), t, N_SLOTS, ws.p, wsb,
                                  staged, nullptr);
    };
    PK(apply(d1, tab, 0));
    PK(pg_cuda_lora_stage(slot.data(), m, N_SLOTS, ws.p, wsb, nullptr));
    PK(apply(d2, tab, 1));
    PK(apply(d3, tab2, 1));
    for (int64_t i = 0; i < m; i++) // each row alone, into d4's row
        PK(pg_cuda_lora_apply(d4.as<uint16_t>() + i * sh.ldo, sh.ldo, dx.as<uint16_t>() + i * sh.ldx, sh.ldx, 1,
                              sh.in, sh.out, &slot[(size_t)i], tab, N_SLOTS, ws.p, wsb, 0, nullptr));
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> g1(o.size()), g2(o.size()), g3(o.size()), g4(o.size());
    d1.down(g1), d2.down(g2), d3.down(g3), d4.down(g4);
    int64_t diff_staged = 0, diff_null = 0, diff_alone = 0, moved = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < sh.ldo; j++) {
            const size_t at = (size_t)(i * sh.ldo + j);
            diff_staged += g1[at] != g2[at];
            diff_null += g3[at] != (slot[(size_t)i] == 1 ? o[at] : g1[at]);
            diff_alone += g4[at] != g1[at];
            moved += g1[at] != o[at];
        }
    char detail[200];
    snprintf(detail, sizeof detail, "differ: staged %lld, slot 1 without a %lld, rows alone %lld (of %lld; %lld moved)",
             (long long)diff_staged, (long long)diff_null, (long long)diff_alone, (long long)(m * sh.ldo),
             (long long)moved);
    report(name, diff_staged == 0 && diff_null == 0 && diff_alone == 0 && moved > m * sh.ldo / 4, detail);
}

static void refusals() {
    if (!selected("lora refusals")) return;
    const Adapters ad(64, 32, 99);
    pg_cuda_lora_slot tab[N_SLOTS];
    ad.table(tab);
    const int64_t m = 8, ldo = 40;
    DBuf x(m * 64 * 2), o(m * ldo * 2);
    CK(cudaMemset(x.p, 0, x.n));
    CK(cudaMemset(o.p, 0x5a, o.n));
    const size_t need = pg_cuda_lora_workspace_size(m, 64, 64);
    DBuf ws(need);
    auto call = [&](const int32_t *rs, const pg_cuda_lora_slot *t, int32_t n, void *w, size_t wb, void *stream) {
        return pg_cuda_lora_apply(o.p, ldo, x.p, 64, m, 64, 32, rs, t, n, w, wb, 0, stream);
    };
    const int32_t good[m] = {0, 1, -1, 2, 3, 4, -1, 0};
    int32_t bad_hi[m], bad_lo[m];
    memcpy(bad_hi, good, sizeof good);
    memcpy(bad_lo, good, sizeof good);
    bad_hi[5] = N_SLOTS, bad_lo[2] = -2;
    const int32_t none[m] = {-1, -1, 4, -1, -1, 4, -1, -1};
    pg_cuda_lora_slot r65[N_SLOTS], fp8[N_SLOTS], f32[N_SLOTS];
    memcpy(r65, tab, sizeof tab), memcpy(fp8, tab, sizeof tab), memcpy(f32, tab, sizeof tab);
    r65[1].rank = 65;
    fp8[2].dtype = PG_DTYPE_FP8_E4M3;
    f32[3].dtype = PG_DTYPE_F32;
    std::vector<pg_cuda_lora_slot> many(PG_CUDA_LORA_MAX_SLOTS + 1, tab[0]);
    cudaStream_t cs;
    CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed));
    const int rc_cap = call(good, tab, N_SLOTS, ws.p, need, cs);
    const int rc_cap_stage = pg_cuda_lora_stage(good, m, N_SLOTS, ws.p, need, cs);
    cudaGraph_t g;
    CK(cudaStreamEndCapture(cs, &g));
    CK(cudaGraphDestroy(g));
    CK(cudaStreamDestroy(cs));
    const Refusal c[] = {
        {"slot out of range", call(bad_hi, tab, N_SLOTS, ws.p, need, nullptr), PG_EINVAL},
        {"slot -2", call(bad_lo, tab, N_SLOTS, ws.p, need, nullptr), PG_EINVAL},
        {"rank 65", call(good, r65, N_SLOTS, ws.p, need, nullptr), PG_EUNSUPP},
        {"fp8 adapter", call(good, fp8, N_SLOTS, ws.p, need, nullptr), PG_EUNSUPP},
        {"f32 adapter", call(good, f32, N_SLOTS, ws.p, need, nullptr), PG_EUNSUPP},
        {"65 slots", call(good, many.data(), PG_CUDA_LORA_MAX_SLOTS + 1, ws.p, need, nullptr), PG_EUNSUPP},
        {"no workspace", call(good, tab, N_SLOTS, nullptr, 0, nullptr), PG_EINVAL},
        {"small workspace", call(good, tab, N_SLOTS, ws.p, pg_cuda_lora_workspace_size(m, 64, 16), nullptr), PG_EINVAL},
        {"under capture", rc_cap, PG_EUNSUPP},
        {"stage under capture", rc_cap_stage, PG_EUNSUPP},
        {"stage: slot out of range", pg_cuda_lora_stage(bad_hi, m, N_SLOTS, ws.p, need, nullptr), PG_EINVAL},
        {"stage: small workspace", pg_cuda_lora_stage(good, m, N_SLOTS, ws.p, 16, nullptr), PG_EINVAL},
        {"rows all -1 / a NULL (no workspace)", call(none, tab, N_SLOTS, nullptr, 0, nullptr), 0},
        {"m = 0", pg_cuda_lora_apply(o.p, ldo, x.p, 64, 0, 64, 32, nullptr, nullptr, 0, nullptr, 0, 0, nullptr), 0},
    };
    std::string detail;
    const bool ok = refusals_ok(o, c, detail);
    report("lora refusals", ok, detail.c_str());
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-k") && i + 1 < argc) g_filter = argv[++i];
    if (!gpu_announce()) return 77;
    const Shape shapes[] = {
        {"64->32 cols 64..96 of 128", 64, 32, 64, 128, 64},
        {"96->40 x ld 101, cols 3..43 of 70", 96, 40, 101, 70, 3},
        {"4096->1024 K slice of 6144", 4096, 1024, 4096, 6144, 4096},
        {"1024->2816 up half of 5632", 1024, 2816, 1024, 5632, 2816},
        {"5000->300 (3 k splits, the last short)", 5000, 300, 5000, 300, 0},
    };
    const int64_t ms[] = {1, 2, 3, 5, 6, 8, 17, 64, 100, 255, 511, 512};
    for (const char *shape : {"bgmv", "sgmv"}) { // the default, then the grouped kernels
        g_shape = shape;
        setenv("PAGED_CUDA_LORA_SGMV", strcmp(shape, "sgmv") ? "0" : "1", 1);
        uint64_t seed = 1;
        for (const Shape &sh : shapes) {
            const Adapters ad(sh.in, sh.out, 1000 + seed);
            for (int64_t m : ms) run_case(sh, ad, m, seed++);
        }
        staged_case();
    }
    unsetenv("PAGED_CUDA_LORA_SGMV");
    refusals();
    CK(cudaDeviceSynchronize());
    printf("%s: %d passed, %d failed\n", g_fail ? "FAIL" : "PASS", g_ok, g_fail);
    return g_fail ? 1 : 0;
}
