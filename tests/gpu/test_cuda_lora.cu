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
// "lora graph": the graph-safe op (pg_cuda_lora_apply_dev) against the
// fp64 reference (with the fused RMSNorm), and its replays from one
// captured graph over two slot patterns and a rewritten table bit for bit
// against its eager runs (graph_case below); past 8 rows, where a CTA runs
// a tile of rows, the same checks and each row alone against the batch bit
// for bit (graph_rows_case); both cases run three times: a CTA a row, in
// tiles of one adapter at every m (" [tiles]", lora_tiles.cu), and in one
// fused kernel a call at every m (" [fused]", lora_fused.cu: each CTA
// computes its row's t itself; the captured graphs of that pass hold the
// fused kernel too). "lora runs": pg_cuda_lora_apply_runs (runs of one
// adapter through cuBLASLt) against the reference and BGMV.
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
static const char *g_tag = ""; // " [tiles]" / " [fused]" while the graph cases run those shapes
static int g_fail = 0, g_ok = 0;
static bool selected(const char *name) { return strstr(name, g_filter) != nullptr; }

static void report(const char *name, bool ok, const char *detail) {
    printf("%-4s %-58s %s\n", ok ? "ok" : "FAIL", (std::string(name) + g_tag).c_str(), detail);
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
    // The same slots as the graph-safe op's table entries (host side).
    void dev_table(pg_cuda_lora_dev_slot *t) const {
        for (int s = 0; s < N_SLOTS; s++)
            t[s] = k_rank[s] ? pg_cuda_lora_dev_slot{da[s]->p, db[s]->p, k_rank[s], k_scale[s]}
                             : pg_cuda_lora_dev_slot{nullptr, nullptr, 0, 1.0f};
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

// Graph-safe LoRA (pg_cuda_lora_apply_dev, kernels/cuda/lora_graph.cu).
// dev_ref: the fp64 reference of one call over projections side by side,
// checked as run_case checks: |gpu - ref| <= BOUND of each adapter row's
// largest |ref|, and every bit outside the adapter rows' projection
// columns unchanged. src[p][s]: the adapter slot whose pair (and scale)
// slot s holds for projection p, -1: none. nw: the norm weight or empty.
struct DevRef {
    double worst = 0, dmax = 0, rmax = 0;
    int64_t changed = 0;
};
static DevRef dev_ref(const std::vector<uint16_t> &o, const std::vector<uint16_t> &g, const std::vector<uint16_t> &x,
                      int64_t ldx, int64_t in, const std::vector<uint16_t> &nw, float eps, const int32_t *pat,
                      int64_t m, int np, const int64_t *cols, int64_t ldo, int64_t col0,
                      const std::vector<std::unique_ptr<Adapters>> &ad, const int (*src)[N_SLOTS]) {
    DevRef d;
    std::vector<uint8_t> mine((size_t)(m * ldo), 0);
    for (int64_t i = 0; i < m; i++) {
        const int s = pat[i];
        if (s < 0) continue;
        std::vector<double> xn((size_t)in);
        double ss = 0;
        for (int64_t k = 0; k < in; k++) ss += (double)bf2f(x[(size_t)(i * ldx + k)]) * bf2f(x[(size_t)(i * ldx + k)]);
        const double inv = nw.empty() ? 1.0 : 1.0 / sqrt(ss / (double)in + (double)eps);
        for (int64_t k = 0; k < in; k++)
            xn[(size_t)k] = (double)bf2f(x[(size_t)(i * ldx + k)]) * inv * (nw.empty() ? 1.0 : bf2f(nw[(size_t)k]));
        for (int p = 0, c0 = (int)col0; p < np; c0 += (int)cols[p], p++) {
            const int a_s = src[p][s];
            if (a_s < 0 || !k_rank[a_s]) continue;
            const Adapters &A = *ad[(size_t)p];
            const int R = k_rank[a_s];
            std::vector<double> t((size_t)R);
            for (int q = 0; q < R; q++) {
                double acc = 0;
                for (int64_t k = 0; k < in; k++) acc += xn[(size_t)k] * bf2f(A.a[a_s][(size_t)(q * in + k)]);
                t[(size_t)q] = (double)(float)acc;
            }
            double err = 0, rmax = 0, dmax = 0;
            for (int64_t j = 0; j < cols[p]; j++) {
                double y = 0;
                for (int q = 0; q < R; q++) y += t[(size_t)q] * bf2f(A.b[a_s][(size_t)(j * R + q)]);
                const size_t at = (size_t)(i * ldo + c0 + j);
                mine[at] = 1;
                const double ref = (double)bf2f(o[at]) + (double)k_scale[a_s] * y, gv = bf2f(g[at]);
                err = std::max(err, std::isnan(gv) ? INFINITY : fabs(gv - ref));
                rmax = std::max(rmax, fabs(ref));
                dmax = std::max(dmax, fabs((double)k_scale[a_s] * y));
            }
            d.worst = std::max(d.worst, err / rmax);
            d.rmax = std::max(d.rmax, rmax);
            d.dmax = std::max(d.dmax, dmax);
        }
    }
    for (size_t at = 0; at < o.size(); at++) d.changed += !mine[at] && g[at] != o[at];
    return d;
}

// Three projections side by side (a Q|K|V row of 4096 -> 2048 | 512 | 512,
// 16 columns past them that nothing may touch; projection K's table has no
// `a` in slot 1, as an adapter on q and v only), the rows' slots and the
// tables in device memory, the adapters reading rmsnorm(x, w): run
// eagerly against the fp64 reference for two slot patterns and after slot
// 0's entries were rewritten (slot 2's pairs: an adapter loaded later);
// one graph captured once and replayed over the same three, bit for bit
// against the eager runs (the rows rewritten in device memory between
// replays, as the runner's upload does); the unaligned 96 -> 40 shape
// (scalar paths) as one projection without a norm, at rank 8 and 64
// launches (max_rank 8 cuts slot 3's rank 64 to 8: by contract, the
// loader refuses such adapters; the reference is checked at 64 only).
// Then its refusals.
static void graph_case() {
    if (!selected("lora graph")) return;
    constexpr int NP = 3;
    const int64_t in = 4096, cols[NP] = {2048, 512, 512}, ldo = 3072 + 16, m = 8;
    const float eps = 1e-5f;
    std::vector<std::unique_ptr<Adapters>> ad;
    for (int p = 0; p < NP; p++) ad.emplace_back(new Adapters(in, cols[p], 7000 + p));
    int src[NP][N_SLOTS], src2[NP][N_SLOTS];
    pg_cuda_lora_dev_slot dev[NP][N_SLOTS];
    auto fill = [&](const int (*sr)[N_SLOTS]) {
        for (int p = 0; p < NP; p++)
            for (int s = 0; s < N_SLOTS; s++) {
                const int a = sr[p][s];
                const Adapters &A = *ad[(size_t)p];
                dev[p][s] = a >= 0 && k_rank[a] ? pg_cuda_lora_dev_slot{A.da[a]->p, A.db[a]->p, k_rank[a], k_scale[a]}
                                                : pg_cuda_lora_dev_slot{nullptr, nullptr, 0, 1.0f};
            }
    };
    for (int p = 0; p < NP; p++)
        for (int s = 0; s < N_SLOTS; s++) src[p][s] = p == 1 && s == 1 ? -1 : s;
    for (int p = 0; p < NP; p++)
        for (int s = 0; s < N_SLOTS; s++) src2[p][s] = s == 0 ? src[p][2] : src[p][s];
    std::vector<std::unique_ptr<DBuf>> dtab;
    for (int p = 0; p < NP; p++) dtab.emplace_back(new DBuf(sizeof dev[p]));
    auto write_tables = [&](const int (*sr)[N_SLOTS]) {
        fill(sr);
        for (int p = 0; p < NP; p++)
            PK(pg_cuda_lora_table_write((pg_cuda_lora_dev_slot *)dtab[(size_t)p]->p, dev[p], N_SLOTS, nullptr));
    };
    write_tables(src);
    const pg_cuda_lora_dev_slot *tabs[NP] = {(const pg_cuda_lora_dev_slot *)dtab[0]->p,
                                             (const pg_cuda_lora_dev_slot *)dtab[1]->p,
                                             (const pg_cuda_lora_dev_slot *)dtab[2]->p};
    Rng r(31);
    std::vector<uint16_t> x((size_t)(m * in)), o((size_t)(m * ldo)), nw((size_t)in);
    for (auto &v : x) v = f2bf((float)(3.0 * r.normal())); // rms 3: the norm matters
    for (auto &v : o) v = f2bf((float)r.normal());
    for (auto &v : nw) v = f2bf((float)(1.0 + 0.2 * r.normal()));
    const int32_t pat_a[m] = {0, 1, -1, 2, 3, 4, 5, 1}, pat_b[m] = {3, -1, 1, 1, 0, 2, -1, 0};
    const size_t wsb = pg_cuda_lora_workspace_size(m, in, 64);
    DBuf dx, dnw, dgo, rows(m * 4), ws(wsb);
    dx.up(x), dnw.up(nw);
    auto dev_call = [&](cudaStream_t st) {
        return pg_cuda_lora_apply_dev(dgo.p, ldo, dx.p, in, m, in, dnw.p, eps, cols, NP, (const int32_t *)rows.p, tabs,
                                      N_SLOTS, 64, ws.p, wsb, st);
    };
    auto got = [&]() {
        CK(cudaDeviceSynchronize());
        std::vector<uint16_t> g(o.size());
        dgo.down(g);
        return g;
    };
    auto set_rows = [&](const int32_t *pat) { CK(cudaMemcpy(rows.p, pat, m * 4, cudaMemcpyHostToDevice)); };
    auto eager = [&](const int32_t *pat) {
        dgo.up(o), set_rows(pat);
        PK(dev_call(nullptr));
        return got();
    };
    auto differ = [&](const std::vector<uint16_t> &a, const std::vector<uint16_t> &b) {
        int64_t d = 0;
        for (size_t i = 0; i < a.size(); i++) d += a[i] != b[i];
        return d;
    };
    const std::vector<uint16_t> ga = eager(pat_a), gb = eager(pat_b);
    const DevRef ra = dev_ref(o, ga, x, in, in, nw, eps, pat_a, m, NP, cols, ldo, 0, ad, src);
    const DevRef rb = dev_ref(o, gb, x, in, in, nw, eps, pat_b, m, NP, cols, ldo, 0, ad, src);
    // One capture, replayed over both patterns.
    cudaStream_t cs;
    CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed));
    const int rc_cap = dev_call(cs);
    const int rc_tw = pg_cuda_lora_table_write((pg_cuda_lora_dev_slot *)dtab[0]->p, dev[0], N_SLOTS, cs);
    cudaGraph_t graph;
    CK(cudaStreamEndCapture(cs, &graph));
    cudaGraphExec_t exec;
    CK(cudaGraphInstantiate(&exec, graph, 0));
    auto replay = [&](const int32_t *pat) {
        dgo.up(o), set_rows(pat);
        CK(cudaGraphLaunch(exec, cs));
        CK(cudaStreamSynchronize(cs));
        return got();
    };
    const int64_t d_ga = differ(replay(pat_a), ga), d_gb = differ(replay(pat_b), gb);
    // Slot 0 now holds slot 2's pairs in every projection: the same graph.
    write_tables(src2);
    const std::vector<uint16_t> gc = eager(pat_b);
    const DevRef rc = dev_ref(o, gc, x, in, in, nw, eps, pat_b, m, NP, cols, ldo, 0, ad, src2);
    const int64_t d_gc = differ(replay(pat_b), gc), moved = differ(gc, gb);
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(cs));
    const bool moved_ok = ra.dmax > 0.1 * ra.rmax && rb.dmax > 0.1 * rb.rmax && moved > 0;
    char detail[320];
    snprintf(detail, sizeof detail, "max_rel %.3e / %.3e / %.3e (bound %.0e), bits changed outside %lld; replays "
             "differ %lld / %lld / %lld; capture %d, table write in capture %d", ra.worst, rb.worst, rc.worst, BOUND,
             (long long)(ra.changed + rb.changed + rc.changed), (long long)d_ga, (long long)d_gb, (long long)d_gc,
             rc_cap, rc_tw);
    report("lora graph: Q|K|V with the norm, eager / replayed / new table",
           ra.worst <= BOUND && rb.worst <= BOUND && rc.worst <= BOUND && ra.changed + rb.changed + rc.changed == 0 &&
               d_ga == 0 && d_gb == 0 && d_gc == 0 && moved_ok && rc_cap == 0 && rc_tw == PG_EUNSUPP,
           detail);

    // The unaligned shape as one projection, no norm.
    {
        const Shape sh = {"96->40 x ld 101, cols 3..43 of 70", 96, 40, 101, 70, 3};
        std::vector<std::unique_ptr<Adapters>> au;
        au.emplace_back(new Adapters(sh.in, sh.out, 555));
        int su[1][N_SLOTS];
        pg_cuda_lora_dev_slot du[N_SLOTS];
        for (int s = 0; s < N_SLOTS; s++) su[0][s] = s;
        au[0]->dev_table(du);
        DBuf dtu(sizeof du), ux, uo, urows(m * 4);
        PK(pg_cuda_lora_table_write((pg_cuda_lora_dev_slot *)dtu.p, du, N_SLOTS, nullptr));
        std::vector<uint16_t> xu((size_t)(m * sh.ldx)), ou((size_t)(m * sh.ldo)), gu(ou.size()), none;
        for (auto &v : xu) v = f2bf((float)r.normal());
        for (auto &v : ou) v = f2bf((float)r.normal());
        ux.up(xu), uo.up(ou);
        CK(cudaMemcpy(urows.p, pat_a, m * 4, cudaMemcpyHostToDevice));
        const pg_cuda_lora_dev_slot *tu = (const pg_cuda_lora_dev_slot *)dtu.p;
        PK(pg_cuda_lora_apply_dev(uo.as<uint16_t>() + sh.col0, sh.ldo, ux.p, sh.ldx, m, sh.in, nullptr, 0.0f, &sh.out,
                                  1, (const int32_t *)urows.p, &tu, N_SLOTS, 64, ws.p, wsb, nullptr));
        CK(cudaDeviceSynchronize());
        uo.down(gu);
        const DevRef ru = dev_ref(ou, gu, xu, sh.ldx, sh.in, none, 0.0f, pat_a, m, 1, &sh.out, sh.ldo, sh.col0, au, su);
        // rank 8 launches: slot 3 (rank 64) cut to 8 by contract; nothing past the columns or rows moves.
        uo.up(ou);
        PK(pg_cuda_lora_apply_dev(uo.as<uint16_t>() + sh.col0, sh.ldo, ux.p, sh.ldx, m, sh.in, nullptr, 0.0f, &sh.out,
                                  1, (const int32_t *)urows.p, &tu, N_SLOTS, 8, ws.p, wsb, nullptr));
        CK(cudaDeviceSynchronize());
        std::vector<uint16_t> g8(ou.size());
        uo.down(g8);
        int64_t outside8 = 0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < sh.ldo; j++) {
                const bool view = pat_a[i] >= 0 && k_rank[pat_a[i]] && j >= sh.col0 && j < sh.col0 + sh.out;
                outside8 += !view && g8[(size_t)(i * sh.ldo + j)] != ou[(size_t)(i * sh.ldo + j)];
            }
        snprintf(detail, sizeof detail, "max_rel %.3e (bound %.0e), delta/ref %.2f, bits changed outside %lld (rank-8 "
                 "launch %lld)", ru.worst, BOUND, ru.rmax > 0 ? ru.dmax / ru.rmax : 0.0, (long long)ru.changed,
                 (long long)outside8);
        report("lora graph: 96->40 unaligned, one projection",
               ru.worst <= BOUND && ru.changed == 0 && ru.dmax > 0.1 * ru.rmax && outside8 == 0, detail);
    }

    // Refusals of the dev op write nothing.
    CK(cudaMemset(dgo.p, 0x5a, dgo.n));
    set_rows(pat_a);
    const int64_t four[4] = {1024, 1024, 512, 512};
    const int64_t wide[NP] = {2048, 512, 512 + 17};
    const pg_cuda_lora_dev_slot *tabs_null[NP] = {tabs[0], nullptr, tabs[2]};
    auto dev_with = [&](const int64_t *c, int32_t n, const pg_cuda_lora_dev_slot *const *t, int32_t rank, size_t wb,
                        int32_t n_slots = N_SLOTS) {
        return pg_cuda_lora_apply_dev(dgo.p, ldo, dx.p, in, m, in, dnw.p, eps, c, n, (const int32_t *)rows.p, t,
                                      n_slots, rank, ws.p, wb, nullptr);
    };
    const Refusal c[] = {
        {"dev: 0 projections", dev_with(cols, 0, tabs, 64, wsb), PG_EINVAL},
        {"dev: 4 projections", dev_with(four, 4, tabs, 64, wsb), PG_EINVAL},
        {"dev: max rank 65", dev_with(cols, NP, tabs, 65, wsb), PG_EINVAL},
        {"dev: a NULL table", dev_with(cols, NP, tabs_null, 64, wsb), PG_EINVAL},
        {"dev: columns past ldo", dev_with(wide, NP, tabs, 64, wsb), PG_EINVAL},
        {"dev: 0 slots", dev_with(cols, NP, tabs, 64, wsb, 0), PG_EINVAL},
        {"dev: 65 slots", dev_with(cols, NP, tabs, 64, wsb, PG_CUDA_LORA_MAX_SLOTS + 1), PG_EINVAL},
        {"dev: small workspace", dev_with(cols, NP, tabs, 64, pg_cuda_lora_workspace_size(m, in, 64) / 4), PG_EINVAL},
        {"dev: m = 0", pg_cuda_lora_apply_dev(dgo.p, ldo, dx.p, in, 0, in, nullptr, 0.0f, cols, NP, nullptr, tabs,
                                              N_SLOTS, 64, nullptr, 0, nullptr), 0},
    };
    std::string rdetail;
    const bool rok = refusals_ok(dgo, c, rdetail);
    report("lora graph: refusals", rok, rdetail.c_str());
}

// "lora graph: m 2100 / 300": steps past 8 rows (the eager steps' sizes
// with PAGED_LORA_DEV_EAGER=1, and the larger decode buckets). m = 2,100
// with the slots in runs of 1-300 rows, as a prefill chunk of one adapter
// sits beside decode rows, at max ranks 64, 16 and 8 (each rank template;
// slots of a larger rank not named), and m = 300 with a slot drawn for
// every row: each against the fp64 reference, 24 of its rows run alone
// (m = 1) bit for bit against the batch, and m = 300 captured once and
// replayed bit for bit. Then m = 40 on an unaligned shape (the scalar
// paths), every row alone against the batch.
static void graph_rows_case() {
    if (!selected("lora graph")) return;
    constexpr int NP = 3;
    const int64_t in = 4096, cols[NP] = {2048, 512, 512}, ldo = 3072 + 16, mmax = 2100;
    const float eps = 1e-5f;
    std::vector<std::unique_ptr<Adapters>> ad;
    for (int p = 0; p < NP; p++) ad.emplace_back(new Adapters(in, cols[p], 7100 + p));
    int src[NP][N_SLOTS];
    pg_cuda_lora_dev_slot dev[NP][N_SLOTS];
    std::vector<std::unique_ptr<DBuf>> dtab;
    const pg_cuda_lora_dev_slot *tabs[NP];
    for (int p = 0; p < NP; p++) {
        const Adapters &A = *ad[(size_t)p];
        for (int s = 0; s < N_SLOTS; s++) {
            src[p][s] = p == 1 && s == 1 ? -1 : s; // K without `a` in slot 1
            const int a = src[p][s];
            dev[p][s] = a >= 0 && k_rank[a] ? pg_cuda_lora_dev_slot{A.da[a]->p, A.db[a]->p, k_rank[a], k_scale[a]}
                                            : pg_cuda_lora_dev_slot{nullptr, nullptr, 0, 1.0f};
        }
        dtab.emplace_back(new DBuf(sizeof dev[p]));
        PK(pg_cuda_lora_table_write((pg_cuda_lora_dev_slot *)dtab[(size_t)p]->p, dev[p], N_SLOTS, nullptr));
        tabs[p] = (const pg_cuda_lora_dev_slot *)dtab[(size_t)p]->p;
    }
    Rng r(41);
    std::vector<uint16_t> x((size_t)(mmax * in)), o((size_t)(mmax * ldo)), nw((size_t)in);
    for (auto &v : x) v = f2bf((float)(3.0 * r.normal()));
    for (auto &v : o) v = f2bf((float)r.normal());
    for (auto &v : nw) v = f2bf((float)(1.0 + 0.2 * r.normal()));
    const size_t wsb = pg_cuda_lora_workspace_size(mmax, in, 64);
    DBuf dx, dnw, dgo, rows(mmax * 4), ws(wsb);
    dx.up(x), dnw.up(nw);
    struct Run {
        int64_t m;
        int32_t max_rank; // the launch's; slots of a larger rank are not named
    };
    for (const Run run : {Run{mmax, 64}, Run{mmax, 16}, Run{mmax, 8}, Run{300, 16}}) {
        const int64_t m = run.m;
        const int32_t mr = run.max_rank;
        auto draw = [&]() {
            const int s = r.below(N_SLOTS + 1) - 1;
            return s >= 0 && k_rank[s] > mr ? 1 : s; // slot 1: rank 8
        };
        std::vector<int32_t> pat((size_t)m);
        if (m == mmax) {
            for (int64_t i = 0; i < m;) {
                const int64_t len = 1 + r.below(300);
                const int s = draw();
                for (int64_t k = 0; k < len && i < m; k++) pat[(size_t)i++] = s;
            }
        } else {
            for (auto &v : pat) v = draw();
        }
        CK(cudaMemcpy(rows.p, pat.data(), (size_t)m * 4, cudaMemcpyHostToDevice));
        const std::vector<uint16_t> om(o.begin(), o.begin() + m * ldo);
        auto call = [&](int64_t i0, int64_t mm, cudaStream_t st) {
            return pg_cuda_lora_apply_dev(dgo.as<uint16_t>() + i0 * ldo, ldo, dx.as<uint16_t>() + i0 * in, in, mm, in,
                                          dnw.p, eps, cols, NP, rows.as<int32_t>() + i0, tabs, N_SLOTS, mr, ws.p, wsb,
                                          st);
        };
        auto got = [&]() {
            CK(cudaDeviceSynchronize());
            std::vector<uint16_t> g(om.size());
            dgo.down(g);
            return g;
        };
        dgo.up(om);
        PK(call(0, m, nullptr));
        const std::vector<uint16_t> g = got();
        const DevRef rf = dev_ref(om, g, x, in, in, nw, eps, pat.data(), m, NP, cols, ldo, 0, ad, src);
        // 24 rows alone, each from the untouched output.
        dgo.up(om);
        std::vector<int64_t> alone;
        for (int q = 0; q < 24; q++) alone.push_back((int64_t)q * m / 24 + r.below((int)(m / 24)));
        for (int64_t i : alone) PK(call(i, 1, nullptr));
        const std::vector<uint16_t> g1 = got();
        int64_t d_alone = 0, n_adapter = 0;
        for (int64_t i : alone) {
            n_adapter += pat[(size_t)i] >= 0;
            for (int64_t j = 0; j < ldo; j++) d_alone += g1[(size_t)(i * ldo + j)] != g[(size_t)(i * ldo + j)];
        }
        // m = 300 captured once, replayed.
        int64_t d_replay = -1;
        if (m != mmax) {
            cudaStream_t cs;
            CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
            CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed));
            const int rc_cap = call(0, m, cs);
            cudaGraph_t graph;
            CK(cudaStreamEndCapture(cs, &graph));
            cudaGraphExec_t exec;
            CK(cudaGraphInstantiate(&exec, graph, 0));
            dgo.up(om);
            CK(cudaGraphLaunch(exec, cs));
            CK(cudaStreamSynchronize(cs));
            const std::vector<uint16_t> gr = got();
            d_replay = rc_cap ? -2 : 0;
            for (size_t k = 0; k < gr.size() && !rc_cap; k++) d_replay += gr[k] != g[k];
            CK(cudaGraphExecDestroy(exec));
            CK(cudaGraphDestroy(graph));
            CK(cudaStreamDestroy(cs));
        }
        const bool moved = rf.dmax > 0.1 * rf.rmax;
        char name[96], detail[320];
        snprintf(name, sizeof name, "lora graph: m %lld (%s), max rank %d", (long long)m,
                 m == mmax ? "slots in runs" : "a slot a row", mr);
        snprintf(detail, sizeof detail, "max_rel %.3e (bound %.0e), bits changed outside %lld; 24 rows alone (%lld "
                 "with an adapter) differ %lld; replay differs %lld", rf.worst, BOUND, (long long)rf.changed,
                 (long long)n_adapter, (long long)d_alone, (long long)d_replay);
        report(name, rf.worst <= BOUND && rf.changed == 0 && moved && n_adapter > 0 && d_alone == 0 &&
                         (m == mmax || d_replay == 0), detail);
    }

    // Past 8 rows on an unaligned shape: x's rows 101 apart (the shrink's
    // pieces a column at a time on odd rows), out from column 3 of 70, one
    // projection, no norm, max rank 64: against the reference, and every
    // row alone bit for bit against the batch.
    {
        const int64_t mu = 40, uin = 96, uout = 40, uldx = 101, uldo = 70, ucol0 = 3;
        std::vector<std::unique_ptr<Adapters>> au;
        au.emplace_back(new Adapters(uin, uout, 556));
        int su[1][N_SLOTS];
        pg_cuda_lora_dev_slot du[N_SLOTS];
        for (int s = 0; s < N_SLOTS; s++) su[0][s] = s;
        au[0]->dev_table(du);
        DBuf dtu(sizeof du), ux, uo, urows(mu * 4);
        PK(pg_cuda_lora_table_write((pg_cuda_lora_dev_slot *)dtu.p, du, N_SLOTS, nullptr));
        const pg_cuda_lora_dev_slot *tu = (const pg_cuda_lora_dev_slot *)dtu.p;
        std::vector<int32_t> pu((size_t)mu);
        for (auto &v : pu) v = r.below(N_SLOTS + 1) - 1;
        std::vector<uint16_t> xu((size_t)(mu * uldx)), ou((size_t)(mu * uldo)), none;
        for (auto &v : xu) v = f2bf((float)r.normal());
        for (auto &v : ou) v = f2bf((float)r.normal());
        ux.up(xu);
        CK(cudaMemcpy(urows.p, pu.data(), (size_t)mu * 4, cudaMemcpyHostToDevice));
        auto callu = [&](int64_t i0, int64_t mm) {
            PK(pg_cuda_lora_apply_dev(uo.as<uint16_t>() + i0 * uldo + ucol0, uldo, ux.as<uint16_t>() + i0 * uldx,
                                      uldx, mm, uin, nullptr, 0.0f, &uout, 1, urows.as<int32_t>() + i0, &tu,
                                      N_SLOTS, 64, ws.p, wsb, nullptr));
        };
        auto gotu = [&]() {
            CK(cudaDeviceSynchronize());
            std::vector<uint16_t> g(ou.size());
            uo.down(g);
            return g;
        };
        uo.up(ou);
        callu(0, mu);
        const std::vector<uint16_t> gb = gotu();
        const DevRef ru = dev_ref(ou, gb, xu, uldx, uin, none, 0.0f, pu.data(), mu, 1, &uout, uldo, ucol0, au, su);
        uo.up(ou);
        for (int64_t i = 0; i < mu; i++) callu(i, 1);
        const std::vector<uint16_t> g1 = gotu();
        int64_t d_alone = 0;
        for (size_t k = 0; k < g1.size(); k++) d_alone += g1[k] != gb[k];
        char detail[200];
        snprintf(detail, sizeof detail, "max_rel %.3e (bound %.0e), bits changed outside %lld; rows alone differ %lld",
                 ru.worst, BOUND, (long long)ru.changed, (long long)d_alone);
        report("lora graph: m 40 unaligned 96->40", ru.worst <= BOUND && ru.changed == 0 && ru.dmax > 0.1 * ru.rmax &&
                                                     d_alone == 0, detail);
    }
}

// "lora runs": pg_cuda_lora_apply_runs (lora_runs.cu), runs of one
// adapter through cuBLASLt. 4096 -> 1024 into the K slice of a 6144-wide
// Q|K|V row, m = 700 in runs of 1-200 rows of a slot drawn from -1..5
// (slot 0 has rank 1 and slot 4 no `a`: never a run), min_run 16: the run
// rows against the fp64 reference within RUNS_BOUND, the other rows bit
// for bit as pg_cuda_lora_apply alone writes them, nothing outside the
// adapter rows' view touched. RUNS_BOUND: t is rounded to bf16 twice
// (cuBLASLt's output, then scale * t), 2^-8 of each t value at worst; over
// rank terms that is about 2e-3 of a typical delta and 7e-3 at the tail of
// 1,024 columns, a third of that against a row's largest |ref|, plus the
// output's half ulp (2e-3): about 5e-3 at worst, and a wrong slot, scale
// or row is off by O(1).
constexpr double RUNS_BOUND = 1e-2;
static void runs_case() {
    if (!selected("lora runs")) return;
    const Shape sh = {"4096->1024 K slice of 6144", 4096, 1024, 4096, 6144, 4096};
    const int64_t m = 700, min_run = 16;
    std::vector<std::unique_ptr<Adapters>> ad;
    ad.emplace_back(new Adapters(sh.in, sh.out, 8100));
    int src[1][N_SLOTS];
    for (int q = 0; q < N_SLOTS; q++) src[0][q] = q;
    pg_cuda_lora_slot tab[N_SLOTS];
    ad[0]->table(tab);
    Rng r(51);
    std::vector<int32_t> pat((size_t)m);
    for (int64_t i = 0; i < m;) {
        const int64_t len = 1 + r.below(200);
        const int q = r.below(N_SLOTS + 1) - 1;
        for (int64_t k = 0; k < len && i < m; k++) pat[(size_t)i++] = q;
    }
    std::vector<uint16_t> x((size_t)(m * sh.ldx)), o((size_t)(m * sh.ldo)), none;
    for (auto &v : x) v = f2bf((float)r.normal());
    for (auto &v : o) v = f2bf((float)r.normal());
    const size_t wsb = pg_cuda_lora_workspace_size(m, sh.in, 64);
    DBuf dx, dout, ws(wsb), gws(PG_CUDA_GEMM_WORKSPACE);
    dx.up(x);
    pg_cuda_gemm *g = nullptr;
    PK(pg_cuda_gemm_create(&g));
    auto got = [&]() {
        CK(cudaDeviceSynchronize());
        std::vector<uint16_t> v(o.size());
        dout.down(v);
        return v;
    };
    dout.up(o);
    PK(pg_cuda_lora_apply_runs(g, gws.p, gws.n, min_run, dout.as<uint16_t>() + sh.col0, sh.ldo, dx.p, sh.ldx, m,
                               sh.in, sh.out, pat.data(), tab, N_SLOTS, ws.p, wsb, nullptr));
    const std::vector<uint16_t> gr = got();
    dout.up(o);
    PK(pg_cuda_lora_apply(dout.as<uint16_t>() + sh.col0, sh.ldo, dx.p, sh.ldx, m, sh.in, sh.out, pat.data(), tab,
                          N_SLOTS, ws.p, wsb, 0, nullptr));
    const std::vector<uint16_t> gb = got();
    pg_cuda_gemm_destroy(g);
    // Which rows were runs: the rule of lora_runs.cu over this pattern.
    std::vector<uint8_t> in_run((size_t)m, 0);
    int64_t run_rows = 0, rest_rows = 0;
    for (int64_t i = 0; i < m;) {
        int64_t j = i + 1;
        while (j < m && pat[(size_t)j] == pat[(size_t)i]) j++;
        const int q = pat[(size_t)i];
        const bool run = q >= 0 && k_rank[q] >= 8 && k_rank[q] % 8 == 0 && j - i >= min_run;
        for (int64_t k = i; k < j; k++) in_run[(size_t)k] = run;
        if (run) run_rows += j - i;
        else if (q >= 0 && k_rank[q]) rest_rows += j - i;
        i = j;
    }
    std::vector<int32_t> pat_runs(pat); // the run rows alone, for the reference
    for (int64_t i = 0; i < m; i++)
        if (!in_run[(size_t)i]) pat_runs[(size_t)i] = -1;
    const DevRef rr = dev_ref(o, gr, x, sh.ldx, sh.in, none, 0.0f, pat_runs.data(), m, 1, &sh.out, sh.ldo, sh.col0,
                              ad, src);
    int64_t rest_differ = 0;
    for (int64_t i = 0; i < m; i++)
        if (!in_run[(size_t)i])
            for (int64_t j = 0; j < sh.ldo; j++) rest_differ += gr[(size_t)(i * sh.ldo + j)] != gb[(size_t)(i * sh.ldo + j)];
    // (rr.changed counts the rest rows' views too, which BGMV moved: count
    // what lies outside every adapter row's view instead.)
    int64_t outside = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < sh.ldo; j++) {
            const int q = pat[(size_t)i];
            const bool view = q >= 0 && k_rank[q] && j >= sh.col0 && j < sh.col0 + sh.out;
            outside += !view && gr[(size_t)(i * sh.ldo + j)] != o[(size_t)(i * sh.ldo + j)];
        }
    char detail[320];
    snprintf(detail, sizeof detail, "run rows %lld: max_rel %.3e (bound %.0e), delta/ref %.2f; other adapter rows "
             "%lld: differ from BGMV %lld; bits changed outside %lld", (long long)run_rows, rr.worst, RUNS_BOUND,
             rr.rmax > 0 ? rr.dmax / rr.rmax : 0.0, (long long)rest_rows, (long long)rest_differ, (long long)outside);
    report("lora runs: cuBLASLt for runs of one adapter, BGMV for the rest",
           run_rows >= 100 && rest_rows > 0 && rr.worst <= RUNS_BOUND && rr.dmax > 0.1 * rr.rmax && rest_differ == 0 &&
               outside == 0,
           detail);
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
    // The graph-safe op in its three shapes: a CTA a row (tile rows 0,
    // fused rows 0), then tiles of one adapter at every size (1: rows alone
    // take them too, so the alone-against-the-batch checks compare tiles
    // with tiles), then the fused kernel at every size (fused rows 1 << 30:
    // checked before the tiles, so it takes every call, alone or batched,
    // eager or captured).
    struct Pass {
        int64_t tiles, fused;
        const char *tag;
    };
    const int64_t tiles_was = pg_cuda_lora_dev_tile_rows(-1), fused_was = pg_cuda_lora_dev_fused_rows(-1);
    for (const Pass ps : {Pass{0, 0, ""}, Pass{1, 0, " [tiles]"}, Pass{0, (int64_t)1 << 30, " [fused]"}}) {
        pg_cuda_lora_dev_tile_rows(ps.tiles);
        pg_cuda_lora_dev_fused_rows(ps.fused);
        g_tag = ps.tag;
        graph_case();
        graph_rows_case();
    }
    pg_cuda_lora_dev_tile_rows(tiles_was);
    pg_cuda_lora_dev_fused_rows(fused_was);
    g_tag = "";
    runs_case();
    refusals();
    CK(cudaDeviceSynchronize());
    printf("%s: %d passed, %d failed\n", g_fail ? "FAIL" : "PASS", g_ok, g_fail);
    return g_fail ? 1 : 0;
}
