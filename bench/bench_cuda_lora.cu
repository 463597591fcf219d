// bench/bench_cuda_lora.cu - the CUDA LoRA ops of one llama3-8b layer over
// the batch size: BGMV (pg_cuda_lora_apply, the eager default), the
// graph-safe op (pg_cuda_lora_apply_dev) a CTA a row ("dev"), in tiles
// of one adapter on the tensor cores ("tiles": pg_cuda_lora_dev_tile_rows
// 1) and in one fused kernel a call ("fused": pg_cuda_lora_dev_fused_rows
// 1 << 30, lora_fused.cu), and runs of one adapter through cuBLASLt
// (pg_cuda_lora_apply_runs, min run 16), for rank-16 adapters in 8 slots.
//
// Groups, as a layer calls them: Q|K|V (4096 -> 4096 | 1024 | 1024, the
// graph-safe op with the RMSNorm fused), O (4096 -> 4096), gate|up (4096 ->
// 14336 | 14336), down (14336 -> 4096); BGMV and runs take one call a
// projection. Row patterns: "one" (every row slot 0: a prefill chunk of
// one adapter) and "mixed" (row i names slot i % 8: decode rows of 8
// adapters). Each figure is the median over 5 timings of 10 back-to-back
// eager calls (CUDA events; BGMV and runs are not graph-safe), in us a
// call of the group; "layer" sums the four groups. "fused" is meant for
// a few rows (PAGED_CUDA_LORA_FUSED=N): every CTA reads its projection's
// whole A, so its figures at large m show the crossover, not a shape to run.
//
// Usage: build/gpu/bench_cuda_lora [--m 1,8,64,256,1024,2048]   exit 77 = no CUDA device.
#include <stdlib.h>
#include <string.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/gpu/gpu_util.h"
#include "bench/bench_cuda_util.cuh"
extern "C" {
#include "kernels/cuda/cuda_ops.h"
#include "kernels/dtype.h"
}

constexpr int SLOTS = 8, RANK = 16;

struct Group {
    const char *name;
    int64_t in;
    int n;
    int64_t cols[3];
    bool norm; // the graph-safe op fuses the base product's RMSNorm
};
static const Group GROUPS[] = {
    {"qkv", 4096, 3, {4096, 1024, 1024}, true},
    {"o", 4096, 1, {4096}, false},
    {"gate_up", 4096, 2, {14336, 14336}, true},
    {"down", 14336, 1, {4096}, false},
};

// One projection's adapters in every slot: a [RANK][in], b [out][RANK].
struct Proj {
    std::unique_ptr<DBuf> a[SLOTS], b[SLOTS];
    pg_cuda_lora_slot host[SLOTS];
    std::unique_ptr<DBuf> table; // pg_cuda_lora_dev_slot [SLOTS]
    Proj(int64_t in, int64_t out, uint64_t seed) {
        pg_cuda_lora_dev_slot dev[SLOTS];
        for (int s = 0; s < SLOTS; s++) {
            a[s].reset(new DBuf((size_t)(RANK * in) * 2));
            b[s].reset(new DBuf((size_t)(out * RANK) * 2));
            fill_random(a[s]->p, (size_t)(RANK * in), seed + 2 * s, 1.0f / sqrtf((float)in));
            fill_random(b[s]->p, (size_t)(out * RANK), seed + 2 * s + 1, 0.25f);
            host[s] = pg_cuda_lora_slot{a[s]->p, b[s]->p, RANK, PG_DTYPE_BF16, 2.0f};
            dev[s] = pg_cuda_lora_dev_slot{a[s]->p, b[s]->p, RANK, 2.0f};
        }
        table.reset(new DBuf(sizeof dev));
        PK(pg_cuda_lora_table_write((pg_cuda_lora_dev_slot *)table->p, dev, SLOTS, nullptr));
    }
};

int main(int argc, char **argv) {
    std::vector<int64_t> ms = {1, 8, 64, 256, 1024, 2048};
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--m") && i + 1 < argc) {
            ms.clear();
            for (char *t = strtok(argv[++i], ","); t; t = strtok(nullptr, ",")) ms.push_back(atoll(t));
        }
    if (!gpu_announce()) return 77;
    printf("rank %d, %d slots\n", RANK, SLOTS);
    int64_t mmax = 1, inmax = 1, ldomax = 1;
    for (int64_t m : ms) mmax = std::max(mmax, m);
    std::vector<std::vector<std::unique_ptr<Proj>>> projs;
    uint64_t seed = 1;
    for (const Group &g : GROUPS) {
        projs.emplace_back();
        int64_t ld = 0;
        for (int p = 0; p < g.n; p++) {
            projs.back().emplace_back(new Proj(g.in, g.cols[p], seed += 100));
            ld += g.cols[p];
        }
        inmax = std::max(inmax, g.in);
        ldomax = std::max(ldomax, ld);
    }
    DBuf x((size_t)(mmax * inmax) * 2), out((size_t)(mmax * ldomax) * 2), nw((size_t)inmax * 2), rows_dev(mmax * 4);
    fill_random(x.p, (size_t)(mmax * inmax), 7);
    fill_random(out.p, (size_t)(mmax * ldomax), 8);
    fill_random(nw.p, (size_t)inmax, 9);
    const size_t wsb = pg_cuda_lora_workspace_size(mmax, inmax, RANK);
    DBuf ws(wsb), gws(PG_CUDA_GEMM_WORKSPACE);
    pg_cuda_gemm *gm = nullptr;
    PK(pg_cuda_gemm_create(&gm));
    printf("%-8s %6s %-6s %10s %10s %10s %10s %10s\n", "group", "m", "rows", "bgmv us", "dev us", "tiles us",
           "fused us", "runs us");
    for (int64_t m : ms)
        for (const char *pat : {"one", "mixed"}) {
            std::vector<int32_t> rows((size_t)m);
            for (int64_t i = 0; i < m; i++) rows[(size_t)i] = strcmp(pat, "one") ? (int32_t)(i % SLOTS) : 0;
            CK(cudaMemcpy(rows_dev.p, rows.data(), (size_t)m * 4, cudaMemcpyHostToDevice));
            double lay[5] = {0, 0, 0, 0, 0};
            for (size_t gi = 0; gi < sizeof GROUPS / sizeof GROUPS[0]; gi++) {
                const Group &g = GROUPS[gi];
                int64_t ldo = 0;
                for (int p = 0; p < g.n; p++) ldo += g.cols[p];
                const std::vector<std::unique_ptr<Proj>> &pr = projs[gi];
                const pg_cuda_lora_dev_slot *tabs[3] = {};
                for (int p = 0; p < g.n; p++) tabs[p] = (const pg_cuda_lora_dev_slot *)pr[(size_t)p]->table->p;
                uint16_t *o = out.as<uint16_t>();
                const double t_bgmv = time_ms(3, 5, 10, [&](int) {
                    for (int p = 0, c0 = 0; p < g.n; c0 += (int)g.cols[p], p++)
                        PK(pg_cuda_lora_apply(o + c0, ldo, x.p, g.in, m, g.in, g.cols[p], rows.data(),
                                              pr[(size_t)p]->host, SLOTS, ws.p, wsb, 0, nullptr));
                });
                auto dev = [&](int) {
                    PK(pg_cuda_lora_apply_dev(o, ldo, x.p, g.in, m, g.in, g.norm ? nw.p : nullptr, 1e-5f, g.cols, g.n,
                                              rows_dev.as<int32_t>(), tabs, SLOTS, RANK, ws.p, wsb, nullptr));
                };
                const int64_t was = pg_cuda_lora_dev_tile_rows(0), fused_was = pg_cuda_lora_dev_fused_rows(0);
                const double t_dev = time_ms(3, 5, 10, dev);
                pg_cuda_lora_dev_tile_rows(1);
                const double t_tiles = time_ms(3, 5, 10, dev);
                pg_cuda_lora_dev_fused_rows((int64_t)1 << 30); // before the tiles: every call
                const double t_fused = time_ms(3, 5, 10, dev);
                pg_cuda_lora_dev_tile_rows(was);
                pg_cuda_lora_dev_fused_rows(fused_was);
                const double t_runs = time_ms(3, 5, 10, [&](int) {
                    for (int p = 0, c0 = 0; p < g.n; c0 += (int)g.cols[p], p++)
                        PK(pg_cuda_lora_apply_runs(gm, gws.p, gws.n, 16, o + c0, ldo, x.p, g.in, m, g.in, g.cols[p],
                                                   rows.data(), pr[(size_t)p]->host, SLOTS, ws.p, wsb, nullptr));
                });
                lay[0] += t_bgmv, lay[1] += t_dev, lay[2] += t_tiles, lay[3] += t_fused, lay[4] += t_runs;
                printf("%-8s %6lld %-6s %10.1f %10.1f %10.1f %10.1f %10.1f\n", g.name, (long long)m, pat,
                       t_bgmv * 1e3, t_dev * 1e3, t_tiles * 1e3, t_fused * 1e3, t_runs * 1e3);
            }
            printf("%-8s %6lld %-6s %10.1f %10.1f %10.1f %10.1f %10.1f\n", "layer", (long long)m, pat, lay[0] * 1e3,
                   lay[1] * 1e3, lay[2] * 1e3, lay[3] * 1e3, lay[4] * 1e3);
            fflush(stdout);
        }
    pg_cuda_gemm_destroy(gm);
    return 0;
}
