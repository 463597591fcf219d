// bench/bench_cpu_matmul.c - the CPU matmul on the default model's shapes.
//
// For SmolLM2-135M (hidden 576, FFN 1536, 3 KV heads of 64, vocab 49152;
// Q4_1 matrices, Q8_0 tied LM head) and m activation rows, times
// pg_backend.matmul in both numerical modes and with 1 and 2 threads, and
// prints the median time, GB/s of weights read and GFLOP/s (2 * rows * cols
// * m per call).
//
// Decode streams each matrix from DRAM (the model is 92 MiB, more than the
// L3), so by default every call reads a different copy of the weights out
// of a 96 MiB rotation; --hot reuses one copy (cache-resident, a ceiling).
//
// Usage: build/bench/bench_cpu_matmul [--quick] [--hot] [--threads 1,2]
//            [--m 1,16,64] [--json PATH] [--shape rows,cols,dtype] [--cputime]
// --cputime times with the thread's CPU clock (robust when other processes
// share the cores; use with --threads 1).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/half.h"
#include "kernels/dtype.h"
#include "kernels/cpu/cpu_backend.h"

#define ROTATION_BYTES (96u << 20)
#define MAX_LIST       16

typedef struct {
    const char *name;
    int64_t rows, cols;
    int dtype;
} mm_shape;

static mm_shape shapes[] = {
    {"attn_q/o 576x576", 576, 576, PG_DTYPE_Q4_1},
    {"attn_k/v 192x576", 192, 576, PG_DTYPE_Q4_1},
    {"ffn_gate/up 1536x576", 1536, 576, PG_DTYPE_Q4_1},
    {"ffn_down 576x1536", 576, 1536, PG_DTYPE_Q4_1},
    {"lm_head 49152x576", 49152, 576, PG_DTYPE_Q8_0},
};

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

// Random blocks: random codes under small random fp16 scales (and minimums).
static void fill_weights(uint8_t *p, size_t n_blocks, int dtype) {
    size_t bb = pg_dtype_block_bytes(dtype);
    for (size_t b = 0; b < n_blocks; b++, p += bb) {
        for (size_t k = 0; k < bb; k++) p[k] = (uint8_t)rnd();
        uint16_t d = pg_f32_to_f16(0.001f + 0.01f * (float)(rnd() % 1000) / 1000.0f);
        memcpy(p, &d, 2);
        if (dtype == PG_DTYPE_Q4_1) {
            uint16_t m = pg_f32_to_f16(-0.08f * (float)(rnd() % 1000) / 1000.0f);
            memcpy(p + 2, &m, 2);
        }
    }
}

static float rnd_normal(void) {
    float u = ((float)rnd() + 0.5f) / 4294967296.0f, v = ((float)rnd() + 0.5f) / 4294967296.0f;
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

// CPU time of the calling thread: on a shared machine it leaves out the
// time the thread waited for a core (meaningful with --threads 1 only).
static int64_t thread_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int parse_list(const char *s, int *out) {
    int n = 0;
    while (*s && n < MAX_LIST) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}

typedef struct {
    const char *shape;
    const char *mode;
    int threads;
    int64_t m;
    double us, gbs, gflops;
} result;

int main(int argc, char **argv) {
    int threads[MAX_LIST] = {1, 2}, n_threads = 2;
    int ms[MAX_LIST] = {1, 16, 64}, n_ms = 3;
    int quick = 0, hot = 0, cputime = 0;
    const char *json = NULL;
    int n_shapes = sizeof shapes / sizeof shapes[0];
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--hot"))
            hot = 1;
        else if (!strcmp(argv[i], "--cputime"))
            cputime = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            n_threads = parse_list(argv[++i], threads);
        else if (!strcmp(argv[i], "--m") && i + 1 < argc)
            n_ms = parse_list(argv[++i], ms);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            // One custom shape instead of the model's: rows,cols,dtype-number.
            int v[3] = {0, 0, PG_DTYPE_Q4_1};
            parse_list(argv[++i], v);
            shapes[0] = (mm_shape){"custom", v[0], v[1], v[2]};
            n_shapes = 1;
        } else {
            fprintf(stderr,
                    "usage: %s [--quick] [--hot] [--threads 1,2] [--m 1,16,64] [--json PATH] "
                    "[--shape rows,cols,dtype] [--cputime]\n",
                    argv[0]);
            return 2;
        }
    }
    const double min_time = quick ? 0.05 : 0.3;
    const int min_runs = quick ? 5 : 21;
    static const pg_matmul_mode modes[] = {PG_MATMUL_EXACT, PG_MATMUL_QUANT_ACT};
    result *res = calloc((size_t)(n_shapes * n_ms * n_threads * 2), sizeof *res);
    int n_res = 0;

    printf("%-22s %4s %-5s %2s %10s %8s %9s\n", "shape", "m", "mode", "t", "median us", "GB/s",
           "GFLOP/s");
    for (int s = 0; s < n_shapes; s++) {
        const mm_shape *sh = &shapes[s];
        size_t rb = pg_dtype_row_bytes(sh->dtype, sh->cols), bytes = rb * (size_t)sh->rows;
        size_t copies = hot ? 1 : (ROTATION_BYTES + bytes - 1) / bytes;
        uint8_t *w = malloc(bytes * copies);
        fill_weights(w, bytes * copies / pg_dtype_block_bytes(sh->dtype), sh->dtype);
        for (int mi = 0; mi < n_ms; mi++) {
            const int64_t m = ms[mi];
            float *x = malloc(sizeof(float) * (size_t)(m * sh->cols));
            float *out = malloc(sizeof(float) * (size_t)(m * sh->rows));
            for (int64_t k = 0; k < m * sh->cols; k++) x[k] = rnd_normal();
            for (int ti = 0; ti < n_threads; ti++) {
                for (int md = 0; md < 2; md++) {
                    pg_backend *b;
                    if (pg_backend_cpu_create(threads[ti], modes[md], &b) != 0) return 1;
                    double times[4096];
                    int n = 0;
                    size_t c = 0;
                    double t_start = pg_now_s();
                    for (int it = 0; n < 4096; it++) {
                        pg_weight wt = {
                            w + (c++ % copies) * bytes, sh->dtype, sh->rows, sh->cols, rb, NULL};
                        int64_t t0 = cputime ? thread_ns() : pg_now_ns();
                        pg_cpu_matmul(pg_cpu(b), out, sh->rows, x, m, &wt);
                        int64_t t1 = cputime ? thread_ns() : pg_now_ns();
                        if (it < 5) continue; // warm-up
                        times[n++] = (double)(t1 - t0) * 1e-3;
                        if (n >= min_runs && pg_now_s() - t_start > min_time) break;
                    }
                    qsort(times, (size_t)n, sizeof times[0], cmp_double);
                    double us = times[n / 2];
                    result *r = &res[n_res++];
                    *r = (result){sh->name,
                                  pg_matmul_mode_name(modes[md]),
                                  threads[ti],
                                  m,
                                  us,
                                  (double)bytes / (us * 1e3),
                                  2.0 * (double)sh->rows * (double)sh->cols * (double)m /
                                      (us * 1e3)};
                    printf("%-22s %4lld %-5s %2d %10.1f %8.2f %9.2f\n", sh->name, (long long)m,
                           r->mode, r->threads, r->us, r->gbs, r->gflops);
                    fflush(stdout);
                    b->dev->destroy(b);
                }
            }
            free(x);
            free(out);
        }
        free(w);
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            perror(json);
            return 1;
        }
        fprintf(f, "{\"bench\": \"bench_cpu_matmul\", \"weights\": \"%s\", \"results\": [\n",
                hot ? "hot" : "cold");
        for (int i = 0; i < n_res; i++)
            fprintf(f,
                    "  {\"shape\": \"%s\", \"m\": %lld, \"mode\": \"%s\", \"threads\": %d, "
                    "\"median_us\": %.2f, "
                    "\"weight_GBps\": %.3f, \"GFLOPs\": %.3f}%s\n",
                    res[i].shape, (long long)res[i].m, res[i].mode, res[i].threads, res[i].us,
                    res[i].gbs, res[i].gflops, i + 1 < n_res ? "," : "");
        fprintf(f, "]}\n");
        fclose(f);
    }
    free(res);
    return 0;
}
