// engine/runner/runner_kv_scales.c - the scales of an fp8 e4m3 KV cache: one per
// layer, K or V, and KV head, in backend memory for the forward
// (pg_fwd_buffers.kv_scales -> pg_kv_shape.scales; docs/engine.md, "fp8 KV
// scales").
//
// e4m3 keeps 3 mantissa bits from 2^-6 to 448; below 2^-6 its steps are a
// fixed 2^-9. At scale 1.0 (vLLM's default without scales) small V rows
// (0.6 at most in layer 0 of the default model) sit half in that
// subnormal range, and a model with outliers past 448 saturates. So the
// cache stores x / s with s chosen per head:
//   - from the checkpoint when it has k_scale / v_scale (per layer, as
//     vLLM's fp8 checkpoints give them: the same s for every head);
//   - else calibrated here, once, before the KV pool exists: one sequence
//     of CALIB_TOKENS token ids spread over the vocabulary, prefilled (in
//     chunks of the step limit) through the real forward on a temporary
//     native-dtype pool, the largest |K| (after
//     RoPE) and |V| per layer and head read back, s = amax / 200 for K and
//     amax / 100 for V (vLLM's --calculate-kv-scales ranges: the largest
//     value seen lands at 200 or 100, leaving 2.2x / 4.5x of headroom
//     below 448 for text that exceeds it);
//   - or 1.0 with --kv-cache-scales one (the old behaviour, the benchmark
//     baseline).
// The scales never change afterwards, so every block (swapped, offloaded
// to the host tier, copied on write) stays valid; graphs capture the
// pointer. Each tensor-parallel rank calibrates its own heads (the
// forward's collectives keep the ranks in step).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/runner/runner_int.h"

#define CALIB_TOKENS 512
#define K_RANGE      200.0f
#define V_RANGE      100.0f

int pg_kv_scales_parse(const char *s, int32_t *out) {
    if (!strcmp(s, "auto")) return *out = PG_KV_SCALES_AUTO, 0;
    if (!strcmp(s, "one") || !strcmp(s, "1") || !strcmp(s, "1.0")) return *out = PG_KV_SCALES_ONE, 0;
    return pg_err_set(PG_EINVAL, "--kv-cache-scales must be auto (the checkpoint's, else calibrated) or one, not '%s'",
                      s);
}

// The largest |K| and |V| per layer and KV head over one sequence of n
// tokens, prefilled in chunks of the workspace's max_tokens, into amax
// [n_layers][2][n_kv].
static int calibrate(pg_runner *r, int32_t n, float *amax) {
    pg_backend *be = r->be;
    const pg_model_config *mc = &r->model->cfg;
    // One block table for every layer while calibrating, whatever the
    // runner's KV layer groups: the temporary pool has a tensor per layer
    // and keeps every block (the windows still apply in the forward), so
    // each layer's amax is its own, not a slot shared between groups.
    const pg_kv_layout groups = r->kv_layout;
    pg_kv_layout_make(mc, false, &r->kv_layout);
    const int32_t bs = r->cfg.block_size, nb = (n + bs - 1) / bs, chunk = r->max_tokens;
    int32_t *tok = pg_xmalloc(sizeof(int32_t) * (size_t)n), *pos = pg_xmalloc(sizeof(int32_t) * (size_t)n);
    int32_t *slots = pg_xmalloc(sizeof(int32_t) * (size_t)n), *bt = pg_xmalloc(sizeof(int32_t) * (size_t)nb);
    for (int32_t t = 0; t < n; t++) {
        // Ids spread over the vocabulary (a fixed, text-free sample: the
        // same scales at every start).
        tok[t] = (int32_t)(((int64_t)t * 7919 + 13) % mc->vocab_size);
        pos[t] = t;
        slots[t] = (1 + t / bs) * bs + t % bs;
    }
    for (int32_t b = 0; b < nb; b++) bt[b] = 1 + b;
    pg_kv_shape ks = {nb + 1, bs, r->model->shard.n_kv_heads, mc->head_dim, PG_KV_NATIVE, NULL, false, 0, 0.0f};
    int rc = be->store->kv_create(be, mc->n_layers, ks, 0, &r->kv);
    r->bufs.kv_amax = amax;
    for (int32_t t0 = 0; t0 < n && rc == 0; t0 += chunk) {
        const int32_t m = n - t0 < chunk ? n - t0 : chunk;
        int32_t lens[1] = {t0 + m}, start[1] = {t0}, cu[2] = {0, m};
        step_desc st = {.n_tokens = m, .tokens = tok + t0, .pos = pos + t0, .slots = slots + t0, .n_seqs = 1,
                        .n_decode = 0, .block_tables = bt, .bt_stride = nb, .seq_lens = lens, .start_pos = start,
                        .cu_q = cu, .max_prefill_q = m};
        dev_in d;
        if ((rc = runner_pack(r, &st, &d)) == 0 && (rc = runner_layers(r, &st, &d)) == 0) rc = be->dev->sync(be);
    }
    r->bufs.kv_amax = NULL;
    r->kv_layout = groups;
    if (r->kv) be->store->kv_free(be, r->kv);
    r->kv = NULL;
    free(tok), free(pos), free(slots), free(bt);
    if (rc < 0) pg_err_wrap(rc, "fp8 KV scale calibration (%d tokens): ", n);
    return rc;
}

int runner_kv_scales_init(pg_runner *r) {
    const pg_model *m = r->model;
    const int32_t L = m->cfg.n_layers, nkv = m->shard.n_kv_heads;
    const size_t n = (size_t)L * 2 * (size_t)nkv;
    if (r->cfg.kv_dtype != PG_KV_FP8_E4M3) return 0;
    if (r->cfg.kv_scales == PG_KV_SCALES_ONE) {
        if (m->shard.rank == 0) PG_LOGI("fp8 KV cache: scale 1.0 (--kv-cache-scales one)");
        return 0;
    }
    float *h = pg_xcalloc(n, sizeof(float));
    int rc = 0;
    const char *from;
    if (m->kv_scales) {
        for (int32_t l = 0; l < L; l++)
            for (int t = 0; t < 2; t++)
                for (int32_t k = 0; k < nkv; k++) h[((size_t)l * 2 + (size_t)t) * (size_t)nkv + (size_t)k] = m->kv_scales[2 * l + t];
        from = "the checkpoint's k_scale / v_scale";
    } else {
        int32_t nt = CALIB_TOKENS;
        if (nt > r->cfg.max_model_len) nt = r->cfg.max_model_len;
        if ((rc = calibrate(r, nt, h)) < 0) goto done;
        for (size_t i = 0; i < n; i++) {
            const bool is_v = (i / (size_t)nkv) % 2 == 1;
            // A head that never exceeded 2^-20 (or saw NaN) keeps 1.0.
            const float s = h[i] / (is_v ? V_RANGE : K_RANGE);
            h[i] = isfinite(s) && h[i] > 0x1p-20f ? s : 1.0f;
        }
        from = "calibrated";
    }
    PG_CHECK(r->kv_scales_dev != NULL); // carved when kv_dtype is fp8 (pg_runner_workspace_plan)
    if ((rc = r->be->dev->upload(r->be, r->kv_scales_dev, h, sizeof(float) * n)) < 0 || (rc = r->be->dev->sync(r->be)) < 0)
        goto done;
    r->bufs.kv_scales = r->kv_scales_dev;
    if (m->shard.rank == 0) {
        float kmin = INFINITY, kmax = 0, vmin = INFINITY, vmax = 0;
        for (size_t i = 0; i < n; i++) {
            const bool is_v = (i / (size_t)nkv) % 2 == 1;
            float *lo = is_v ? &vmin : &kmin, *hi = is_v ? &vmax : &kmax;
            if (h[i] < *lo) *lo = h[i];
            if (h[i] > *hi) *hi = h[i];
        }
        PG_LOGI("fp8 KV cache: scales per layer and KV head %s%s: K %.3g..%.3g, V %.3g..%.3g", from,
                m->kv_scales ? "" : " at start-up (one prefill of fixed ids; --kv-cache-scales one for 1.0)", kmin,
                kmax, vmin, vmax);
    }
done:
    free(h);
    return rc;
}
