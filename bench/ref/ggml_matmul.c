// bench/ref/ggml_matmul.c - our quantized matmul against ggml's own
// (llama.cpp's CPU backend, the library built from the llama-cpp-python
// sdist): (1) bitwise comparison of the results for Q4_0/Q4_1/Q8_0 weights
// and several m; (2) ggml's speed on the default model's shapes, timed like
// bench/bench_cpu_matmul.c (median after warm-up, weights rotating through
// 96 MiB), for the "ours vs llama.cpp" table of docs/cpu_kernels.md.
// Not part of the build (it links libggml):
//
//   L=/work/ref/llama_cpp_python-0.3.36/vendor/llama.cpp
//   gcc -O2 -march=x86-64-v3 -I. -I$L/ggml/include bench/ref/ggml_matmul.c build/rel/libpaged.a
//       -L$L/build/bin -lggml -lggml-base -lggml-cpu -Wl,-rpath,$L/build/bin
//       -luv -lcjson -lopenblas -lpcre2-8 -lxxhash -lm -lpthread -o /tmp/ggml_matmul
//   /tmp/ggml_matmul [--threads 1,2]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "kernels/kernels.h"

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float normal(void) {
    float u = ((float)rnd() + 0.5f) / 4294967296.0f, v = ((float)rnd() + 0.5f) / 4294967296.0f;
    return sqrtf(-2 * logf(u)) * cosf(6.2831853f * v);
}
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// Computes the graph with a caller-owned work buffer.
static void compute(struct ggml_cgraph *g, int threads) {
    static void *work;
    static size_t cap;
    struct ggml_cplan plan = ggml_graph_plan(g, threads, NULL);
    if (plan.work_size > cap) {
        free(work);
        work = malloc(plan.work_size);
        cap = plan.work_size;
    }
    plan.work_data = work;
    ggml_graph_compute(g, &plan);
}

static int bitwise(int threads) {
    static const enum ggml_type types[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0};
    static const int ms[] = {1, 3, 5, 16, 64};
    pg_backend *be;
    if (pg_backend_cpu_create(threads, &be) < 0) return 1;
    be->matmul_mode = PG_MATMUL_QUANT_ACT;
    int bad = 0;
    for (int ti = 0; ti < 3; ti++)
        for (int mi = 0; mi < 5; mi++) {
            const int rows = 96, cols = 576, m = ms[mi];
            struct ggml_init_params ip = {64u << 20, NULL, false};
            struct ggml_context *ctx = ggml_init(ip);
            struct ggml_tensor *w = ggml_new_tensor_2d(ctx, types[ti], cols, rows);
            struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, m);
            float *src = malloc(sizeof(float) * (size_t)(rows * cols));
            for (int i = 0; i < rows * cols; i++) src[i] = 0.05f * normal();
            ggml_quantize_chunk(types[ti], src, w->data, 0, rows, cols, NULL);
            float *xd = x->data;
            for (int i = 0; i < cols * m; i++) xd[i] = normal() * (rnd() % 50 ? 1.0f : 10.0f);
            struct ggml_tensor *y = ggml_mul_mat(ctx, w, x);
            struct ggml_cgraph *g = ggml_new_graph(ctx);
            ggml_build_forward_expand(g, y);
            compute(g, threads);
            float *out = malloc(sizeof(float) * (size_t)(rows * m));
            pg_weight pw = {w->data, (int)types[ti], rows, cols, ggml_row_size(types[ti], cols),
                            NULL};
            be->matmul(be, out, rows, xd, m, &pw);
            int same = 0;
            for (int i = 0; i < rows * m; i++)
                same += memcmp(&out[i], &((float *)y->data)[i], 4) == 0;
            printf("%-5s m=%-3d bitwise equal %d/%d\n", ggml_type_name(types[ti]), m, same,
                   rows * m);
            bad |= same != rows * m;
            free(src);
            free(out);
            ggml_free(ctx);
        }
    be->dev->destroy(be);
    return bad;
}

static void speed(int threads) {
    static const struct {
        const char *name;
        int rows, cols;
        enum ggml_type type;
    } shapes[] = {{"attn_q/o 576x576", 576, 576, GGML_TYPE_Q4_1},
                  {"attn_k/v 192x576", 192, 576, GGML_TYPE_Q4_1},
                  {"ffn_gate/up 1536x576", 1536, 576, GGML_TYPE_Q4_1},
                  {"ffn_down 576x1536", 576, 1536, GGML_TYPE_Q4_1},
                  {"lm_head 49152x576", 49152, 576, GGML_TYPE_Q8_0}};
    static const int ms[] = {1, 16, 64};
    for (int s = 0; s < 5; s++)
        for (int mi = 0; mi < 3; mi++) {
            const int rows = shapes[s].rows, cols = shapes[s].cols, m = ms[mi];
            const size_t wb = ggml_row_size(shapes[s].type, cols) * (size_t)rows;
            int copies = (int)((96u << 20) / wb) + 1;
            struct ggml_init_params ip = {
                wb * (size_t)copies + (size_t)cols * m * 4 + (size_t)rows * m * 4 * (size_t)copies +
                    (size_t)copies * (ggml_graph_overhead() + 4 * ggml_tensor_overhead()) +
                    (16u << 20),
                NULL, false};
            struct ggml_context *ctx = ggml_init(ip);
            struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, m);
            for (int i = 0; i < cols * m; i++) ((float *)x->data)[i] = normal();
            struct ggml_cgraph **gs = malloc(sizeof *gs * (size_t)copies);
            for (int c = 0; c < copies; c++) {
                struct ggml_tensor *w = ggml_new_tensor_2d(ctx, shapes[s].type, cols, rows);
                uint8_t *p = w->data;
                for (size_t k = 0; k < wb; k++) p[k] = (uint8_t)rnd();
                size_t bb = ggml_type_size(shapes[s].type);
                for (size_t k = 0; k < wb; k += bb) { // small positive d (and negative m)
                    p[k] = 0, p[k + 1] = 0x20;
                    if (shapes[s].type == GGML_TYPE_Q4_1) p[k + 2] = 0, p[k + 3] = 0xa4;
                }
                gs[c] = ggml_new_graph(ctx);
                ggml_build_forward_expand(gs[c], ggml_mul_mat(ctx, w, x));
            }
            double t[4096];
            int n = 0;
            double t0 = pg_now_s();
            for (int it = 0; n < 4096; it++) {
                int64_t a = pg_now_ns();
                compute(gs[it % copies], threads);
                int64_t b = pg_now_ns();
                if (it < 5) continue;
                t[n++] = (double)(b - a) * 1e-3;
                if (n >= 21 && pg_now_s() - t0 > 0.3) break;
            }
            qsort(t, (size_t)n, sizeof t[0], cmp_double);
            double us = t[n / 2];
            printf("%-22s %4d ggml  %2d %10.1f %8.2f %9.2f\n", shapes[s].name, m, threads, us,
                   (double)wb / (us * 1e3), 2.0 * rows * cols * m / (us * 1e3));
            fflush(stdout);
            free(gs);
            ggml_free(ctx);
        }
}

int main(int argc, char **argv) {
    int threads[8] = {1, 2}, n_threads = 2;
    if (argc == 3 && !strcmp(argv[1], "--threads")) {
        n_threads = 0;
        for (char *p = strtok(argv[2], ","); p && n_threads < 8; p = strtok(NULL, ","))
            threads[n_threads++] = atoi(p);
    }
    int bad = bitwise(2);
    printf("%-22s %4s %-5s %2s %10s %8s %9s\n", "shape", "m", "impl", "t", "median us", "GB/s",
           "GFLOP/s");
    for (int i = 0; i < n_threads; i++) speed(threads[i]);
    return bad;
}
