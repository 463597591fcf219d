// tests/gpu/test_cuda_runner.c - the one runner on the CUDA backend against
// the same runner on the CPU backend (the reference), on the same weights,
// step by step (in the spirit of llama.cpp's test-backend-ops).
//
//   build/gpu/test_cuda_runner MODEL_DIR [--tol 2e-2] [--gap 0.1] [--gap-sigmas K] [--json FILE]
//       [--cpu-offload-gb G] [--quantization fp8|int4] [--cpu-matmul exact|quant] [--lora DIR[,DIR...]]
//       [--kv-cache-dtype bf16|fp8] [--kv-cache-scales auto|one]
//
// --kv-cache-dtype fp8 [--kv-cache-scales auto|one]: both runners keep an
// fp8 e4m3 cache (scales calibrated at start-up by each, or 1.0), so the
// difference is the CUDA kernels' arithmetic over it (ours converts the
// codes to bf16, as with PAGED_CUDA_FI_FP8=0; FlashInfer's fp8 prefill, the
// default, multiplies e4m3 Q and P too).
// --gap-sigmas K (0, off): a greedy flip counts as hard only past both --gap
// and K standard deviations of the difference of two logits' errors in its
// row (sqrt(2) x the row's rms logit error), for W8A8, whose errors are
// spread over every logit of a row.
// --cpu-offload-gb: the GPU model's first layers live in pinned host memory
// and stream through two device slots (engine/model/model_offload.c), graphs
// included; the CPU reference keeps them resident.
// --quantization: both models quantize the layers' matrices at load the
// same way (engine/model/model_quant.c), so both hold the same FP8 / int4 bytes:
// the GPU runs them as stored (kernels/cuda/qgemv.cu)
// and the CPU, in the exact mode, dequantizes them to f32: the same
// weight-only product, so the tolerance stays bf16's. Except FP8 in steps
// of more than 8 rows, which the GPU runs W8A8 (its activations rounded to
// e4m3 per token, kernels/cuda/act_quant.cu) unless PAGED_CUDA_FP8_GEMM=0:
// run_gpu_tests.sh checks that with --tol 0.1.
// --cpu-matmul quant: the CPU reference in its quantized mode, where FP8
// weights are W8A8 for every row count (kernels/cpu/matmul.c, fp8_matmul:
// the GPU's per-token e4m3 rule); with PAGED_CUDA_QGEMV=0 the GPU takes
// its W8A8 product for every step too, so the two compute the same
// products up to the order of the sums and bf16 storage. That is not a
// bf16-level check: W8A8 is not continuous in its input, and any
// upstream difference (bf16 storage included) makes the two activation
// roundings independent, so they differ by about sqrt(2) times W8A8's own
// error (6.3e-2 mean on an H100; the CPU alone, from bf16-rounded vs f32
// activations, 6.4e-2): run it with W8A8's --tol 0.1 (docs/fp8_gemm.md, Tests).
// --lora: both models load the PEFT adapters named (engine/model/lora.c,
// one slot each; tests/gpu/make_lora_adapters.py writes some) and sequence
// k (A B C D F = 0..4; E, forked from B, as B) asks for adapter
// k % (n + 1) (0: none), so steps mix rows of every adapter with rows of
// none; the GPU runs its steps that mix prefill rows in eagerly (lora_apply
// over the host rows) and its decode-only steps (4 to 23) as replays of
// the LoRA set's graphs (lora_apply_dev over the rows and the slot table
// in device memory, engine/runner/runner_graphs.c), the CPU its own
// lora_apply. Same checks and bounds (docs/lora.md, "On CUDA" and
// "Graph-safe LoRA").
//
// Both execute the same hand-made plans over 24 steps: prefills of
// several lengths in one step, a prompt chunked over four steps next to
// decode tokens (so each step mixes decode and prefill rows), a context
// long enough for split-K decode, a swap-out + swap-in of one sequence to
// other device blocks, a copy ahead (plan.h n_swap_out_ahead: on CUDA
// beside the step, kv_swap_ahead) loaded back the next step, a fork whose partial block is copied on write, a
// repetition penalty, banned ids, and logprobs. Each step's input token is
// the CPU's pick (teacher forcing), so one near-tie cannot derail the rest.
// Checks per sampled sequence: the GPU's token equals the CPU's (where the
// CPU's top-2 gap exceeds --gap, 0.1; a closer call is reported, not failed; the
// gap is taken over the logits as the sampler sees them: C's repetition
// penalty applied, D's banned ids removed, so a tie that the penalty makes
// is not mistaken for a clear pick), and the logits' relative error
// ||gpu - cpu|| / ||cpu|| stays under --tol (every sequence: both samplers
// work on a copy, so the logits stay as computed), and the logprobs of A
// (top 5) agree within 0.1 + 2% of their value (--tol of it). The CPU runs
// --matmul-mode exact (f32) unless --cpu-matmul says otherwise. Exit 0
// pass, 1 fail, 77 skipped (no CUDA in the build or no device).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/memplan.h"
#include "engine/model/model.h"
#include "engine/runner/runner.h"

#define BS         16
#define N_BLOCKS   512
#define N_HOST     64
#define MAX_SEQS   8
#define MAX_TOKENS 256
#define MAX_LEN    1024
#define N_STEPS    24
#define NBT        (MAX_LEN / BS)

typedef struct {
    const char *name;
    int32_t n_prompt;
    int32_t hist[MAX_LEN];
    int32_t n_hist;   // prompt + generated
    int32_t computed; // tokens whose KV is written
    int32_t bt[NBT];
    pg_sampling_params sp;
    bool mask_eos, live;
    int32_t n_generated;
} seq;

static int32_t next_block = 1;

static void seq_init(seq *s, const char *name, int32_t n_prompt, int32_t vocab, uint32_t salt) {
    memset(s, 0, sizeof *s);
    s->name = name;
    s->n_prompt = s->n_hist = n_prompt;
    for (int32_t i = 0; i < n_prompt; i++)
        s->hist[i] = (int32_t)((i * 7919u + salt * 104729u) % (uint32_t)vocab);
    for (int32_t b = 0; b < NBT; b++) s->bt[b] = next_block++;
    pg_sampling_params_default(&s->sp);
    s->sp.temperature = 0;
    s->live = true;
}

// The top-2 gap of a row of logits as the sampler sees them: the sequence's
// repetition penalty on every token of its history (l / p above 0, l * p
// below, once per token), its banned ids (EOS 3 and the stop ids while
// mask_eos) out.
static float sampler_gap(const seq *s, const float *logits, int32_t V, float *tmp) {
    memcpy(tmp, logits, sizeof(float) * (size_t)V);
    const float p = s->sp.repetition_penalty;
    if (p != 1.0f && p > 0) {
        bool *seen = calloc((size_t)V, 1);
        for (int32_t i = 0; i < s->n_hist; i++) {
            int32_t t = s->hist[i];
            if (t < 0 || t >= V || seen[t]) continue;
            seen[t] = true;
            tmp[t] = tmp[t] > 0 ? tmp[t] / p : tmp[t] * p;
        }
        free(seen);
    }
    if (s->mask_eos) {
        if (3 < V) tmp[3] = -INFINITY;
        for (int32_t i = 0; i < s->sp.n_stop_ids; i++)
            if (s->sp.stop_ids[i] >= 0 && s->sp.stop_ids[i] < V) tmp[s->sp.stop_ids[i]] = -INFINITY;
    }
    float b1 = -INFINITY, b2 = -INFINITY;
    for (int32_t v = 0; v < V; v++) {
        if (tmp[v] > b1)
            b2 = b1, b1 = tmp[v];
        else if (tmp[v] > b2)
            b2 = tmp[v];
    }
    return b1 - b2;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *json = NULL;
    enum { MAX_LORA = 8 };
    const char *lora_dirs[MAX_LORA];
    int32_t n_lora = 0;
    char *lora_arg = NULL;
    double tol = 2e-2, offload_gb = 0, hard_gap = 0.1, gap_sigmas = 0;
    int quant = 0;
    int32_t kv_dtype = PG_KV_BF16, kv_scales = PG_KV_SCALES_AUTO;
    pg_matmul_mode cpu_mode = PG_MATMUL_EXACT;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--gap") && i + 1 < argc)
            hard_gap = atof(argv[++i]);
        else if (!strcmp(argv[i], "--gap-sigmas") && i + 1 < argc)
            gap_sigmas = atof(argv[++i]);
        else if (!strcmp(argv[i], "--tol") && i + 1 < argc)
            tol = atof(argv[++i]);
        else if (!strcmp(argv[i], "--cpu-offload-gb") && i + 1 < argc)
            offload_gb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--quantization") && i + 1 < argc) {
            if (pg_quantization_parse(argv[++i], &quant) < 0) return fprintf(stderr, "%s\n", pg_err_msg()), 2;
        } else if (!strcmp(argv[i], "--kv-cache-dtype") && i + 1 < argc) {
            // The engine's names and rules (engine/memplan.c), less auto:
            // the runner takes the cache's type as given.
            if (pg_kv_dtype_parse(argv[++i], false, &kv_dtype) < 0) return fprintf(stderr, "%s\n", pg_err_msg()), 2;
            if (kv_dtype != PG_KV_BF16 && kv_dtype != PG_KV_FP8_E4M3)
                return fprintf(stderr, "--kv-cache-dtype: bf16 or fp8, not '%s'\n", argv[i]), 2;
        } else if (!strcmp(argv[i], "--kv-cache-scales") && i + 1 < argc) {
            if (pg_kv_scales_parse(argv[++i], &kv_scales) < 0) return fprintf(stderr, "%s\n", pg_err_msg()), 2;
        } else if (!strcmp(argv[i], "--cpu-matmul") && i + 1 < argc) {
            if (pg_matmul_mode_parse(argv[++i], &cpu_mode) < 0) return fprintf(stderr, "%s\n", pg_err_msg()), 2;
        } else if (!strcmp(argv[i], "--lora") && i + 1 < argc) {
            lora_arg = strdup(argv[++i]);
            for (char *save = NULL, *t = strtok_r(lora_arg, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (n_lora == MAX_LORA) return fprintf(stderr, "--lora: at most %d adapters\n", MAX_LORA), 2;
                lora_dirs[n_lora++] = t;
            }
            if (n_lora == 0) return fprintf(stderr, "--lora: no adapter directory\n"), 2;
        } else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else
            dir = argv[i];
    }
    if (!dir) {
        fprintf(stderr, "usage: test_cuda_runner MODEL_DIR [--tol T] [--gap G] [--gap-sigmas K] [--json FILE]\n"
                        "       [--cpu-offload-gb G] [--kv-cache-dtype bf16|fp8] [--kv-cache-scales auto|one]\n"
                        "       [--quantization fp8|int4] [--cpu-matmul exact|quant] [--lora DIR[,DIR...]]\n");
        return 2;
    }
    char why[160];
    if (pg_backend_cuda_probe(why, sizeof why) <= 0) {
        printf("skipped: %s\n", why);
        return 77;
    }
    pg_backend *cbe, *gbe;
    if (pg_backend_cpu_create(0, cpu_mode, &cbe) < 0 || pg_backend_cuda_create(0, &gbe) < 0)
        return fprintf(stderr, "FAIL: backends: %s\n", pg_err_msg()), 1;
    pg_model *cmodel, *gmodel;
    pg_model_load_opts mo = {.path = dir, .quantization = quant, .lora_dirs = lora_dirs, .n_lora = n_lora},
                       gmo = {.path = dir, .quantization = quant, .cpu_offload_bytes = (int64_t)(offload_gb * (1 << 30)),
                              .lora_dirs = lora_dirs, .n_lora = n_lora};
    if (pg_model_load(&mo, cbe, &cmodel) < 0 || pg_model_load(&gmo, gbe, &gmodel) < 0) {
        fprintf(stderr, "FAIL: load %s: %s\n", dir, pg_err_msg());
        return 1;
    }
    const pg_model_config *c = &cmodel->cfg;
    const int32_t V = c->vocab_size;
    printf("model %s: hidden %d, %d layers, %d/%d heads of %d, ffn %d, vocab %d, weights %s%s; cpu matmul %s\n",
           dir, c->hidden, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn, V,
           cmodel->format, c->tie_embeddings ? ", tied" : "", pg_matmul_mode_name(cpu_mode));
    if (offload_gb > 0)
        printf("cuda: %d of %d layers offloaded (%.1f MiB in pinned host memory, slots of %.1f MiB), "
               "host-to-device %.1f GB/s\n",
               gmodel->offload.n_layers, c->n_layers, gmodel->offload.host_bytes / 1048576.0,
               gmodel->offload.slot_bytes / 1048576.0, gmodel->offload.h2d_gbps);
    for (int32_t i = 0; i < n_lora; i++)
        printf("lora %d: %s (sequences A..F numbered 0..4 with k %% %d == %d; E as B)\n", i + 1, lora_dirs[i],
               n_lora + 1, i + 1);

    pg_runner *cpu, *gpu;
    pg_runner_config rc = {.block_size = BS,
                           .max_num_seqs = MAX_SEQS,
                           .max_num_batched_tokens = MAX_TOKENS,
                           .max_model_len = MAX_LEN,
                           .kv_dtype = kv_dtype,
                           .kv_scales = kv_scales,
                           .graphs = PG_GRAPHS_STARTUP};
    if (pg_runner_create(cmodel, &rc, &cpu) < 0 || pg_runner_alloc_kv(cpu, N_BLOCKS, N_HOST) < 0)
        return fprintf(stderr, "FAIL: cpu runner: %s\n", pg_err_msg()), 1;
    if (pg_runner_create(gmodel, &rc, &gpu) < 0 || pg_runner_alloc_kv(gpu, N_BLOCKS, N_HOST) < 0) {
        fprintf(stderr, "FAIL: cuda runner: %s\n", pg_err_msg());
        return 1;
    }
    pg_runner_mem ms;
    pg_runner_mem_get(gpu, &ms);
    printf("device %s: weights %.1f MiB, workspace %.1f MiB (buffers %.1f), KV %.1f MiB, "
           "graphs %d captured at start-up, %.1f MiB (%.1f MiB still reserved), other %.1f MiB\n",
           ms.device, ms.weights / 1048576.0, ms.workspace / 1048576.0,
           ms.workspace_buffers / 1048576.0, ms.kv / 1048576.0, ms.n_graphs,
           ms.graphs / 1048576.0, ms.graphs_reserved / 1048576.0, ms.other / 1048576.0);
    const int32_t graphs0 = ms.n_graphs;

    // A 37, B 16, C 5 (repetition penalty, swapped at step 10), D 100 (chunked, EOS/stop ids
    // banned), F 700 (chunked over 4 steps: split-K decode afterwards), E forked from B at step 12.
    enum { A, B, C, D, F, E, NS };
    static seq S[NS];
    seq_init(&S[A], "A", 37, V, 1);
    seq_init(&S[B], "B", 16, V, 2);
    seq_init(&S[C], "C", 5, V, 3);
    seq_init(&S[D], "D", 100, V, 4);
    seq_init(&S[F], "F", 700, V, 5);
    S[E].live = false;
    S[A].sp.logprobs = 5;
    S[C].sp.repetition_penalty = 1.3f;
    S[D].mask_eos = true;
    S[D].sp.n_stop_ids = 2;
    S[D].sp.stop_ids[0] = 5;
    S[D].sp.stop_ids[1] = 7;
    // Prefill chunk sizes per step for D and F (0 = decode when the prompt is done).
    const int32_t chunk_d[] = {64, 36}, chunk_f[] = {130, 200, 200, 170};

    float *glog = malloc(sizeof(float) * (size_t)MAX_SEQS * (size_t)V);
    float *clog = malloc(sizeof(float) * (size_t)MAX_SEQS * (size_t)V);
    float *gap_tmp = malloc(sizeof(float) * (size_t)V);
    double worst = 0, sum_err = 0;
    int n_err = 0, mismatches = 0, hard_mismatches = 0, lp_bad = 0, failed = 0;
    int32_t host_next = 1, ahead_host = -1;
    for (int step = 0; step < N_STEPS && !failed; step++) {
        pg_plan_seq ps[NS];
        int32_t idx[NS];
        int n = 0, n_tokens = 0;
        pg_block_move swap_out[8], swap_in[8], copies[2];
        int n_out = 0, n_in = 0, n_cp = 0, n_ahead = 0;
        if (step == 14) { // B's first (full) block as a host tier's copy ahead: this step only reads it
            swap_out[n_out++] = (pg_block_move){S[B].bt[0], ahead_host = host_next++};
            n_ahead = 1;
        }
        if (step == 15) { // ... loaded back into a fresh block, which this step reads: the copy must be done
            int32_t fresh = next_block++;
            swap_in[n_in++] = (pg_block_move){ahead_host, fresh};
            S[B].bt[0] = fresh;
        }
        if (step == 10) { // C's blocks to host and back to fresh device blocks
            int32_t nb = (S[C].computed + BS - 1) / BS;
            for (int32_t b = 0; b < nb; b++) {
                swap_out[n_out++] = (pg_block_move){S[C].bt[b], host_next + b};
                int32_t fresh = next_block++;
                swap_in[n_in++] = (pg_block_move){host_next + b, fresh};
                S[C].bt[b] = fresh;
            }
            host_next += nb;
        }
        if (step == 12) { // E forks from B: shares full blocks, copies the partial last one
            S[E] = S[B];  // live from this step on
            S[E].name = "E";
            int32_t last = (S[B].computed - 1) / BS;
            int32_t fresh = next_block++;
            copies[n_cp++] = (pg_block_move){S[B].bt[last], fresh};
            S[E].bt[last] = fresh;
            for (int32_t b = last + 1; b < NBT; b++) S[E].bt[b] = next_block++;
            // E continues with a different last token than B would.
            S[E].hist[S[E].n_hist - 1] = (S[E].hist[S[E].n_hist - 1] + 1) % V;
        }
        for (int k = 0; k < NS; k++) {
            seq *s = &S[k];
            if (!s->live) continue;
            int32_t todo = s->n_hist - s->computed, nt;
            if (k == D && s->computed < s->n_prompt)
                nt = chunk_d[step];
            else if (k == F && s->computed < s->n_prompt)
                nt = chunk_f[step];
            else
                nt = todo;
            if (nt <= 0) continue;
            bool sample = s->computed + nt == s->n_hist;
            ps[n] = (pg_plan_seq){.seq_id = k,
                                  .tokens = s->hist + s->computed,
                                  .n_tokens = nt,
                                  .start_pos = s->computed,
                                  .block_table = s->bt,
                                  .n_blocks = (s->computed + nt + BS - 1) / BS,
                                  .sample = sample,
                                  .sp = &s->sp,
                                  .history = s->hist,
                                  .n_history = s->n_hist,
                                  .n_prompt = s->n_prompt,
                                  .n_generated = s->n_generated,
                                  .rng_seed = 1234 + (uint64_t)k,
                                  .mask_eos = s->mask_eos,
                                  .eos_id = s->mask_eos ? 3 : -1,
                                  .lora_id = (k == E ? B : k) % (n_lora + 1)}; // a fork keeps B's
            idx[n++] = k;
            n_tokens += nt;
        }
        pg_batch_plan plan = {.n_seqs = n,
                              .seqs = ps,
                              .n_tokens = n_tokens,
                              .n_swap_out = n_out,
                              .n_swap_in = n_in,
                              .n_copies = n_cp,
                              .n_swap_out_ahead = n_ahead,
                              .swap_out = swap_out,
                              .swap_in = swap_in,
                              .copies = copies};
        pg_step_output co, go;
        if (pg_runner_execute(cpu, &plan, &co) < 0 || pg_runner_last_logits(cpu, clog, co.n) < 0) {
            fprintf(stderr, "FAIL: step %d cpu: %s\n", step, pg_err_msg());
            failed = 1;
            break;
        }
        if (pg_runner_execute(gpu, &plan, &go) < 0 || pg_runner_last_logits(gpu, glog, go.n) < 0) {
            fprintf(stderr, "FAIL: step %d cuda: %s\n", step, pg_err_msg());
            failed = 1;
            break;
        }
        if (co.n != go.n) {
            fprintf(stderr, "FAIL: step %d: %d sampled on the cpu, %d on the gpu\n", step, co.n,
                    go.n);
            failed = 1;
            break;
        }
        printf("step %2d: %3d tokens, %d seqs%s%s:", step, n_tokens, n, n_out ? " +swap" : "",
               n_cp ? " +copy" : "");
        for (int j = 0; j < co.n; j++) {
            int k = (int)co.outs[j].seq_id;
            seq *s = &S[k];
            const float *cl = clog + (size_t)j * V, *gl = glog + (size_t)j * V;
            int32_t ct = co.outs[j].token, gt = go.outs[j].token;
            if (go.outs[j].seq_id != co.outs[j].seq_id) {
                fprintf(stderr, "FAIL: output order differs\n");
                failed = 1;
            }
            double num = 0, den = 0;
            for (int32_t v = 0; v < V; v++) {
                double d = (double)gl[v] - cl[v];
                num += d * d;
                den += (double)cl[v] * cl[v];
            }
            // --gap-sigmas K: K times the spread of the difference of two
            // logits' errors (sqrt(2) x this row's rms error), for the flip
            // and logprob rules below.
            const double band = gap_sigmas * sqrt(2.0 * num / V);
            if (ct != gt) {
                // --gap-sigmas K: a flip is hard only where the gap is also
                // past K times the spread of the difference of two logits'
                // errors (sqrt(2) x this row's rms error): W8A8's errors are
                // spread over the whole row, so a flip inside that band is
                // what its error bound allows, not a defect.
                const float gap = sampler_gap(s, cl, V, gap_tmp);
                mismatches++;
                if (gap > hard_gap && gap > band) hard_mismatches++;
                printf(" [%s: cpu %d gpu %d, gap %.3f", s->name, ct, gt, gap);
                if (gap_sigmas > 0) printf(", band %.3f", band);
                printf("]");
            }
            const double err = sqrt(num / (den > 0 ? den : 1));
            if (!(err <= worst)) worst = err; // NaN sticks
            sum_err += err;
            n_err++;
            printf(" %s %.1e", s->name, err);
            if (s->sp.logprobs > 0) {
                // bf16 logits carry a relative error: a logprob of -200 (a
                // tied-embedding model) may be off by more than 0.1, so the
                // bound grows with the value, by --tol (2e-2 for bf16; W8A8's
                // e4m3 activations are looser, run_gpu_tests.sh). With
                // --gap-sigmas (e4m3 activations or an fp8 cache, whose
                // rounding spreads over the whole row) it also takes the
                // flip rule's band: a logprob is a logit minus the row's
                // log-sum-exp, so its error is of the order of the
                // difference of two logits' errors, what the band bounds.
                const pg_seq_output *a = &co.outs[j], *g = &go.outs[j];
#define LP_OFF(x, y) (fabsf((x) - (y)) > 0.1f + (float)band + (float)tol * fabsf(x))
                if (a->n_top != g->n_top || LP_OFF(a->logprob, g->logprob)) {
                    lp_bad++;
                    printf(" [%s logprob: cpu %.3f gpu %.3f, %d/%d top]", s->name, a->logprob, g->logprob,
                           a->n_top, g->n_top);
                }
                for (int t = 0; t < a->n_top && t < g->n_top; t++)
                    if (a->top_ids[t] == g->top_ids[t] &&
                        LP_OFF(a->top_logprobs[t], g->top_logprobs[t])) {
                        lp_bad++;
                        printf(" [%s top %d logprob: cpu %.3f gpu %.3f]", s->name, t, a->top_logprobs[t],
                               g->top_logprobs[t]);
                    }
#undef LP_OFF
            }
            // Teacher forcing: both continue with the CPU's token.
            s->hist[s->n_hist++] = ct;
            s->n_generated++;
        }
        printf("\n");
        for (int i = 0; i < n; i++) S[idx[i]].computed += ps[i].n_tokens;
    }
    // With adapters, the decode-only steps replayed graphs of the LoRA set,
    // captured on their first use (engine/runner/runner_graphs.c): a
    // capture that failed would have left them eager, unchecked here.
    pg_runner_mem_get(gpu, &ms);
    const bool graphs_ok = !n_lora || !pg_runner_graphs_wanted(PG_GRAPHS_STARTUP) || ms.n_graphs > graphs0;
    printf("graphs: %d after the steps, %d at start-up%s%s\n", ms.n_graphs, graphs0,
           n_lora ? " (those since: the LoRA set's, captured on first use)" : "",
           graphs_ok ? "" : "; FAIL: no LoRA graph was captured");
    if (!graphs_ok) failed = 1;
    bool tok_ok = hard_mismatches == 0, err_ok = worst <= tol, lp_ok = lp_bad == 0;
    printf("%s: worst logits rel. error %.2e (mean %.2e over %d rows, bound %.1e); token "
           "mismatches %d (%d with a CPU top-2 gap > %g); logprob mismatches %d\n",
           (!failed && tok_ok && err_ok && lp_ok) ? "PASS" : "FAIL", worst,
           n_err ? sum_err / n_err : 0, n_err, tol, mismatches, hard_mismatches, hard_gap, lp_bad);
    if (json) {
        FILE *f = fopen(json, "w");
        if (f) {
            fprintf(
                f,
                "{\"model\": \"%s\", \"head_dim\": %d, \"lora_adapters\": %d, \"steps\": %d, \"worst_rel_err\": %.4e, "
                "\"mean_rel_err\": %.4e, \"rows\": %d, \"tol\": %.1e, \"token_mismatches\": %d, "
                "\"hard_token_mismatches\": %d, \"logprob_mismatches\": %d, \"pass\": %s}\n",
                dir, c->head_dim, n_lora, N_STEPS, worst, n_err ? sum_err / n_err : 0, n_err, tol,
                mismatches, hard_mismatches, lp_bad,
                (!failed && tok_ok && err_ok && lp_ok) ? "true" : "false");
            fclose(f);
        }
    }
    free(glog);
    free(clog);
    free(gap_tmp);
    free(lora_arg);
    pg_runner_free(gpu);
    pg_runner_free(cpu);
    pg_model_free(gmodel);
    pg_model_free(cmodel);
    gbe->dev->destroy(gbe);
    cbe->dev->destroy(cbe);
    return (!failed && tok_ok && err_ok && lp_ok) ? 0 : 1;
}
