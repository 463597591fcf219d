// engine/model/model_load.c - every weight of a pg_model from a GGUF file, a
// Hugging Face directory, or random values, through one table.
//
// The table of a layer's tensors (engine/model/layer_tensors.c) names each
// once, with its GGUF and its Hugging Face name and its shape from the
// config; the three sources only say how to find a stored tensor by name.
// Fused weights (Q|K|V, gate|up) are uploaded as their parts, which the
// backend concatenates (or keeps apart, as the CPU backend does over the
// mapped file). GGUF Q and K rows of the "llama" architecture are
// interleaved for llama.cpp's RoPE; the forward uses the Hugging Face
// rotate-half layout, so those rows are put back in order (a row copy,
// valid for any block-quantized type since blocks run along rows). The
// same forward then serves every file. A mixture-of-experts layer adds its
// router and every expert's gate|up and down (docs/moe.md).
//
// Tensor parallelism: each rank reads only its slices (engine/model/model_shard.c
// says which): the rows of a column-parallel tensor (a pointer into the
// mapping), the columns of a row-parallel one (O, down: copied row by row,
// at block boundaries of the stored type), and dummy weights are made as
// windows of the whole tensor's random values, so a shard holds exactly the
// values it would have unsplit.
//
// AWQ / GPTQ checkpoints (engine/model/int4_ckpt.c): a quantized linear has no
// `x.weight` but `x.qweight`, `x.qzeros`, `x.scales`; it is repacked into
// int4 group blocks after its slice is known, so a rank repacks only its
// rows or columns (which must fall on group boundaries, as for any blocks).
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "common/progress.h"
#include "formats/gguf.h"
#include "engine/model/int4_ckpt.h"
#include "engine/model/family.h"
#include "engine/model/layer_tensors_int.h"
#include "engine/model/layers.h"
#include "engine/model/model.h"
#include "engine/model/model_source_int.h"
#include "formats/safetensors.h"

// --- helpers ------------------------------------------------------------------------

static void *own(pg_model *m, void *p) {
    if (m->n_owned == m->cap_owned) {
        m->cap_owned = m->cap_owned ? 2 * m->cap_owned : 64;
        m->owned = pg_xrealloc(m->owned, sizeof(void *) * (size_t)m->cap_owned);
    }
    m->owned[m->n_owned++] = p;
    return p;
}

// Rows [r0, r0 + n) of a stored tensor: a view into the same data.
static void slice_rows(pg_weight *w, int64_t r0, int64_t n) {
    if (w->data) w->data = (const char *)w->data + (size_t)r0 * w->row_bytes;
    if (w->scales) w->scales += r0; // per-row scales (FP8) follow their rows
    w->rows = n;
}

// pg_model_slice_cols, a copy owned by the model, errors naming the tensor.
static int slice_cols(pg_model *m, const char *path, const char *name, pg_weight *w, int64_t c0, int64_t n) {
    void *copy;
    const int rc = pg_model_slice_cols(w, c0, n, &copy);
    if (copy) own(m, copy);
    return rc < 0 ? pg_err_wrap(rc, "%s: tensor '%s' ", path, name) : 0;
}

// An FP8 checkpoint's `NAME_scale` (Hugging Face fp8 / compressed-tensors:
// `x.weight` in F8_E4M3 beside `x.weight_scale`, one f32/bf16/f16 value
// per tensor or per output row) as per-row f32 scales in memory the model
// owns (m NULL: checked only, for planning). `input_scale` (static
// activation scales) is ignored: activations are scaled per token at run
// time (dynamic), which needs none.
static int attach_fp8_scales(pg_model *m, const source *s, const char *name, pg_weight *w) {
    char sname[192];
    snprintf(sname, sizeof sname, "%s_scale", name);
    pg_weight sc;
    if (s->kind != SRC_HF || !pg_model_src_find(s, sname, &sc))
        return pg_err_set(PG_EFORMAT, "%s: FP8 tensor '%s' has no '%s'", s->path, name, sname);
    const int64_t n = sc.rows * sc.cols;
    if ((n != 1 && n != w->rows) || pg_dtype_block_elems(sc.dtype) != 1 || pg_dtype_has_row_scales(sc.dtype))
        return pg_err_set(PG_EFORMAT, "%s: '%s' has %lld values of type %s; expected 1 or %lld (f32, bf16, f16)",
                          s->path, sname, (long long)n, pg_dtype_name(sc.dtype), (long long)w->rows);
    if (!m) return 0;
    float *v = own(m, pg_xmalloc(sizeof(float) * (size_t)w->rows));
    pg_dequantize_row(sc.dtype, sc.data, v, n);
    for (int64_t r = n; r < w->rows; r++) v[r] = v[0]; // a per-tensor scale on every row
    w->scales = v;
    return 0;
}

// An fp8-KV checkpoint's per-layer K and V scales (vLLM / llm-compressor:
// `self_attn.k_scale` and `v_scale`, an older single `kv_scale`, or
// compressed-tensors' `k_proj.output_scale` / `v_proj.output_scale`), one
// positive value each, into m->kv_scales [n_layers][2]; none in the file:
// left NULL (the runner calibrates). Either every layer has them or it is
// an error naming the first that has not.
static int load_kv_scales(pg_model *m, const source *s) {
    if (s->kind != SRC_HF) return 0;
    static const char *const names[][2] = {
        {"model.layers.%d.self_attn.k_scale", "model.layers.%d.self_attn.v_scale"},
        {"model.layers.%d.self_attn.kv_scale", "model.layers.%d.self_attn.kv_scale"},
        {"model.layers.%d.self_attn.k_proj.output_scale", "model.layers.%d.self_attn.v_proj.output_scale"},
    };
    const int32_t L = m->cfg.n_layers;
    char nm[160];
    pg_weight w;
    int form = -1;
    for (int f = 0; f < 3 && form < 0; f++) {
        snprintf(nm, sizeof nm, names[f][0], 0);
        if (pg_model_src_find(s, nm, &w)) form = f;
    }
    if (form < 0) return 0;
    float *v = pg_xmalloc(sizeof(float) * 2 * (size_t)L);
    for (int32_t l = 0; l < L; l++)
        for (int kv = 0; kv < 2; kv++) {
            snprintf(nm, sizeof nm, names[form][kv], l);
            if (!pg_model_src_find(s, nm, &w)) {
                free(v);
                return pg_err_set(PG_EFORMAT, "%s: fp8 KV scales: '%s' is missing (layer 0 has them)", s->path, nm);
            }
            if (w.rows * w.cols != 1 || pg_dtype_block_elems(w.dtype) != 1 || pg_dtype_has_row_scales(w.dtype)) {
                free(v);
                return pg_err_set(PG_EFORMAT, "%s: '%s' has %lld values of type %s; expected one f32, bf16 or f16",
                                  s->path, nm, (long long)(w.rows * w.cols), pg_dtype_name(w.dtype));
            }
            pg_dequantize_row(w.dtype, w.data, &v[2 * l + kv], 1);
            if (!(v[2 * l + kv] > 0.0f) || !isfinite(v[2 * l + kv])) {
                const double bad = v[2 * l + kv];
                free(v);
                return pg_err_set(PG_EFORMAT, "%s: '%s' is %g; a KV scale must be positive and finite", s->path, nm,
                                  bad);
            }
        }
    m->kv_scales = v;
    return 0;
}

static const char *ckpt_name(int q) { return q == PG_QUANT_GPTQ ? "GPTQ" : "AWQ"; }

// A quantized linear `NAME` ("x.weight", rows x cols) of an AWQ / GPTQ
// checkpoint, stored as x.qweight, x.qzeros, x.scales (and GPTQ's x.g_idx;
// layouts in engine/model/int4_ckpt.h): checks each one's type and shape and
// refuses act-order, describes the tensors in *t, and gives *w the int4
// type and shape it is repacked to, without data.
static int ckpt_find(const source *s, const char *name, int64_t rows, int64_t cols, pg_weight *w,
                     pg_int4_ckpt_tensor *t) {
    const pg_model_config *c = s->cfg;
    const bool gptq = c->ckpt_quant == PG_QUANT_GPTQ;
    const char *fmt = ckpt_name(c->ckpt_quant);
    const int64_t G = c->ckpt_group;
    static const char *const suffix[4] = {"qweight", "qzeros", "scales", "g_idx"};
    const int stem = (int)(strlen(name) - strlen("weight"));
    char nm[4][192];
    for (int k = 0; k < 4; k++) snprintf(nm[k], sizeof nm[k], "%.*s%s", stem, name, suffix[k]);
    pg_weight p[4];
    if (!pg_model_src_find(s, nm[0], &p[0]))
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s' is missing (nor is the %s checkpoint's '%s' there)", s->path,
                          name, fmt, nm[0]);
    if (cols % G || rows % 8)
        return pg_err_set(PG_EFORMAT, "%s: %s linear '%s' is %lldx%lld: the input dimension must be a multiple of "
                          "the group size %lld and the output one of 8", s->path, fmt, name, (long long)rows,
                          (long long)cols, (long long)G);
    // The stored [rows][cols] of qweight, qzeros, scales (W is [out = rows][in = cols]).
    const int64_t want[3][2] = {{gptq ? cols / 8 : cols, gptq ? rows : rows / 8}, {cols / G, rows / 8},
                                {cols / G, rows}};
    for (int k = 0; k < 3; k++) {
        if (k > 0 && !pg_model_src_find(s, nm[k], &p[k]))
            return pg_err_set(PG_EFORMAT, "%s: %s tensor '%s' is missing", s->path, fmt, nm[k]);
        const int dt = k == 2 ? PG_DTYPE_F16 : PG_DTYPE_I32;
        if (p[k].dtype != dt || p[k].rows != want[k][0] || p[k].cols != want[k][1])
            return pg_err_set(PG_EFORMAT, "%s: %s tensor '%s' is %s %lldx%lld; expected %s %lldx%lld", s->path, fmt,
                              nm[k], pg_dtype_name(p[k].dtype), (long long)p[k].rows, (long long)p[k].cols,
                              pg_dtype_name(dt), (long long)want[k][0], (long long)want[k][1]);
    }
    // GPTQ's g_idx: only the plain order (row i in group i / G) maps onto
    // groups of consecutive columns; act-order would need the columns (and
    // the activations) permuted.
    if (gptq && pg_model_src_find(s, nm[3], &p[3])) {
        if (p[3].dtype != PG_DTYPE_I32 || p[3].rows * p[3].cols != cols)
            return pg_err_set(PG_EFORMAT, "%s: GPTQ tensor '%s' is %s with %lld values; expected i32 with %lld",
                              s->path, nm[3], pg_dtype_name(p[3].dtype), (long long)(p[3].rows * p[3].cols),
                              (long long)cols);
        const uint8_t *g = p[3].data;
        for (int64_t i = 0; i < cols; i++) {
            const int32_t v = (int32_t)((uint32_t)g[4 * i] | (uint32_t)g[4 * i + 1] << 8 |
                                        (uint32_t)g[4 * i + 2] << 16 | (uint32_t)g[4 * i + 3] << 24);
            if (v != i / G)
                return pg_err_set(PG_EUNSUPP, "%s: GPTQ tensor '%s' is act-order (input row %lld is in group %d, "
                                  "not %lld): only g_idx = row / group_size is supported", s->path, nm[3],
                                  (long long)i, v, (long long)(i / G));
        }
    }
    *t = (pg_int4_ckpt_tensor){.gptq = gptq, .group = (int)G, .zero_offset = c->ckpt_zero_offset, .in = cols,
                               .out = rows, .qweight = p[0].data, .qzeros = p[1].data, .scales = p[2].data};
    const int dt = G == 128 ? PG_DTYPE_INT4_G128 : PG_DTYPE_INT4_G64;
    *w = (pg_weight){.dtype = dt, .rows = rows, .cols = cols, .row_bytes = pg_dtype_row_bytes(dt, cols)};
    return 0;
}

// The rows [r0, r0 + w->rows) x columns [c0, c0 + w->cols) of checkpoint
// tensor t, repacked into memory the model owns.
static void ckpt_repack(pg_model *m, const pg_int4_ckpt_tensor *t, int64_t r0, int64_t c0, pg_weight *w) {
    void *d = own(m, pg_xmalloc(w->row_bytes * (size_t)w->rows));
    pg_int4_ckpt_repack(t, r0, w->rows, c0, w->cols, d);
    w->data = d;
}

// Looks up and checks one stored tensor (rows x cols expected); FP8
// weights get their scales (see attach_fp8_scales). A quantized linear of
// an AWQ / GPTQ checkpoint is described in *pending (when not NULL) for the
// caller to repack once sliced; else it is repacked whole here (m NULL:
// checked only).
static int find_checked(pg_model *m, const source *s, const char *name, int64_t rows, int64_t cols, pg_weight *w,
                        pg_int4_ckpt_tensor *pending) {
    const size_t nl = strlen(name);
    if (s->kind == SRC_HF && s->cfg->ckpt_quant != PG_QUANT_NONE && !pg_model_src_find(s, name, w) && nl > 7 &&
        !strcmp(name + nl - 7, ".weight")) {
        pg_int4_ckpt_tensor t;
        PG_TRY(ckpt_find(s, name, rows, cols, w, &t));
        if (pending)
            *pending = t;
        else if (m)
            ckpt_repack(m, &t, 0, 0, w);
        return 0;
    }
    if (!pg_model_src_find(s, name, w))
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s' is missing", s->path, name);
    if (s->kind == SRC_DUMMY) {
        *w = (pg_weight){.data = NULL, .dtype = PG_DTYPE_BF16, .rows = rows, .cols = cols,
                         .row_bytes = (size_t)cols * 2};
        return 0;
    }
    if (w->rows != rows || w->cols != cols)
        return pg_err_set(PG_EFORMAT, "%s: tensor '%s' is %lldx%lld, expected %lldx%lld", s->path, name,
                          (long long)w->rows, (long long)w->cols, (long long)rows, (long long)cols);
    if (pg_dtype_block_elems(w->dtype) == 0 || w->row_bytes == 0)
        return pg_err_set(PG_EUNSUPP, "%s: tensor '%s' has type %s, which is not supported", s->path,
                          name, pg_dtype_name(w->dtype));
    if (pg_dtype_has_row_scales(w->dtype)) {
        if (rows == 1)
            return pg_err_set(PG_EUNSUPP, "%s: vector '%s' is stored in %s", s->path, name, pg_dtype_name(w->dtype));
        PG_TRY(attach_fp8_scales(m, s, name, w));
    }
    return 0;
}

// --quantization fp8|int4 (and the comparison's formats): the layers'
// matrices quantized at load; not awq|gptq, which name the checkpoint.
static bool online_quant(const pg_model_load_opts *o) {
    return o->quantization != PG_QUANT_NONE && !pg_quantization_is_checkpoint(o->quantization);
}

typedef struct {
    pg_model *m;
    const pg_model_load_opts *o;
    uint64_t tensor; // dummy: index of the next random tensor (its generator key)
    pg_progress pr;
} loader;

// Makes a backend weight from stored parts (random ones for dummy weights:
// matrices N(0, std^2) in the windows `win` of the whole tensor, norms 1,
// biases 0). An RMSNorm weight (norm) gets the config's norm_add (Gemma's
// Hugging Face w becomes the 1 + w the rmsnorm op multiplies by).
static int make(loader *ld, const source *s, const pg_weight *parts, const pg_rand_window *win, int n,
                bool vector, bool norm, pg_bweight **out) {
    pg_backend *be = ld->m->be;
    const float dummy_fill = norm ? 1.0f : 0.0f, add = norm ? ld->m->cfg.norm_add : 0.0f;
    int rc;
    if (s->kind == SRC_DUMMY) {
        const float std = ld->o->dummy_std > 0 ? ld->o->dummy_std : 0.02f;
        uint64_t key = 0;
        if (!vector) key = ld->o->dummy_seed * 0x9e3779b97f4a7c15ull + (++ld->tensor) * 0xd1b54a32d192ed03ull;
        int64_t len = 0;
        for (int i = 0; i < n; i++) len += parts[i].cols;
        const pg_rand_window vec = {.rows = 1, .cols = len, .full_cols = len};
        rc = vector ? be->store->weight_random(be, &vec, 1, 0, 0.0f, dummy_fill, out)
                    : be->store->weight_random(be, win, n, key, std, 0.0f, out);
    } else if (vector && (n > 1 || add != 0.0f)) {
        // Concatenated vectors (Q|K|V biases) and shifted norms become one
        // f32 vector (the shift added in f32, as transformers' 1.0 + w.float()).
        int64_t len = 0;
        for (int i = 0; i < n; i++) len += parts[i].cols;
        float *v = own(ld->m, pg_xmalloc(sizeof(float) * (size_t)len));
        for (int i = 0, off = 0; i < n; off += (int)parts[i].cols, i++)
            pg_dequantize_row(parts[i].dtype, parts[i].data, v + off, parts[i].cols);
        for (int64_t i = 0; i < len; i++) v[i] += add;
        pg_weight one = {.data = v, .dtype = PG_DTYPE_F32, .rows = 1, .cols = len,
                         .row_bytes = sizeof(float) * (size_t)len};
        rc = be->store->weight_upload(be, &one, 1, out);
    } else {
        rc = be->store->weight_upload(be, parts, n, out);
    }
    if (rc < 0) return rc;
    ld->m->weight_bytes += (int64_t)(*out)->bytes;
    int64_t stored = 0;
    for (int i = 0; i < n; i++) stored += parts[i].rows * (int64_t)parts[i].row_bytes;
    pg_progress_add(&ld->pr, stored, 1);
    return 0;
}

// One stored tensor of a layer, found, checked and cut to this rank's part
// (an expert's rows of a stacked tensor first): *w that part, *rw its
// window of the whole (fused) tensor for random weights, whose rows before
// this part are fused_row0.
static int load_part(loader *ld, const source *s, const pg_layer_tensor *lt, int64_t fused_row0, pg_weight *w,
                     pg_rand_window *rw) {
    pg_model *m = ld->m;
    const pg_model_config *c = &m->cfg;
    pg_int4_ckpt_tensor ck = {0};
    PG_TRY(find_checked(m, s, lt->name, lt->stored_rows, lt->cols, w, &ck));
    if (lt->stored_rows != lt->rows) slice_rows(w, lt->row0, lt->rows);
    // This rank's slice, and where it sits in the whole (fused) tensor.
    // (A checkpoint's int4 tensor has no data yet: the slices set its
    // shape, and it is repacked from r0, c0 below.)
    int64_t lo = 0, n = 0, r0 = 0, c0 = 0;
    *rw = (pg_rand_window){.rows = lt->rows, .cols = lt->cols, .row0 = fused_row0, .full_cols = lt->cols};
    if (pg_lt_shard_range(c, &m->shard, lt->rows_dim, &lo, &n)) {
        slice_rows(w, lo, n);
        rw->rows = n;
        rw->row0 += lo;
        r0 = lo;
    } else if (pg_lt_shard_range(c, &m->shard, lt->cols_dim, &lo, &n)) {
        PG_TRY(slice_cols(m, s->path, lt->name, w, lo, n));
        rw->cols = n;
        rw->col0 = lo;
        c0 = lo;
    }
    if (ck.qweight) ckpt_repack(m, &ck, r0, c0, w);
    if (s->kind == SRC_GGUF && lt->unpermute && !strcmp(c->arch, "llama"))
        own(m, pg_model_unpermute_rows(w, lt->unpermute == 1 ? m->shard.n_heads : m->shard.n_kv_heads));
    return 0;
}

// Makes layer l's weight of lt's field (and expert) from its n parts:
// quantized first under --quantization (not the router: routing stays in
// the stored precision, as vLLM keeps it), random for dummy weights (norms
// 1, biases 0).
static int make_weight(loader *ld, const source *s, int32_t l, const pg_layer_tensor *lt, pg_weight *parts,
                       const pg_rand_window *win, int n) {
    pg_model *m = ld->m;
    const pg_lt_field f = lt->field;
    const bool vector = parts[0].rows == 1;
    if (!vector && f != F_ROUTER && online_quant(ld->o) && s->kind != SRC_DUMMY)
        for (int p = 0; p < n; p++) {
            void *qd;
            float *qs;
            char name[200];
            snprintf(name, sizeof name, "%s (layer %d)", lt->name, l);
            PG_TRY(pg_quantize_weight(ld->o->quantization, name, &parts[p], &qd, &qs));
            if (qd) own(m, qd);
            if (qs) own(m, qs);
        }
    pg_bweight **dst = pg_lt_field_ptr(&m->layers[l], f, lt->expert);
    int rc = make(ld, s, parts, win, n, vector, lt->norm, dst);
    if (rc < 0) return pg_err_wrap(rc, "layer %d: ", l);
    // Layer 0's matrices for the start-up log and the plan (a MoE layer:
    // its first expert's, this rank's first under expert parallelism).
    const int slot = f == F_QKV ? 0 : f == F_O ? 1 : f == F_GATE_UP || f == F_EXP_GATE_UP ? 2
                    : f == F_DOWN || f == F_EXP_DOWN ? 3 : -1;
    if (l == 0 && slot >= 0 && (lt->expert < 0 || lt->expert == m->shard.exp0)) {
        m->layer_bytes[slot] = (int64_t)(*dst)->bytes;
        m->layer_dtypes[slot] = parts[0].dtype;
    }
    if (l == 0 && f == F_QKV) m->layer_dtype = parts[0].dtype;
    return 0;
}

// Dummy weights: an expert's random values must not depend on which rank
// makes it or how many experts the rank skipped (expert parallelism), so
// expert e's gate|up and down take the keys they have when every expert is
// made: two per expert after the router's (recorded in *moe_key0).
static void dummy_key_at(loader *ld, const pg_layer_tensor *lt, uint64_t *moe_key0) {
    if (lt->field == F_ROUTER) *moe_key0 = ld->tensor + 1; // make() takes ++tensor for it
    else if (lt->expert >= 0) ld->tensor = *moe_key0 + 2 * (uint64_t)lt->expert + (lt->field == F_EXP_DOWN);
}

static int load_layers(loader *ld, const source *s) {
    pg_model *m = ld->m;
    const pg_model_config *c = &m->cfg;
    pg_layer_tensor *lts = pg_xmalloc(sizeof *lts * (size_t)pg_layer_tensors_max(c));
    int rc = 0;
    for (int32_t l = 0; l < c->n_layers && rc == 0; l++) {
        pg_model_layer *L = &m->layers[l];
        if (pg_config_layer_is_moe(c, l)) {
            L->exp_gate_up = pg_xcalloc((size_t)c->n_experts, sizeof(pg_bweight *));
            L->exp_down = pg_xcalloc((size_t)c->n_experts, sizeof(pg_bweight *));
        }
        // The parts of one weight are next to each other in the list: each
        // weight is made once its last part is read.
        const int nt = pg_layer_tensors(c, &m->shard, s->kind == SRC_GGUF, l, lts);
        pg_weight parts[3];
        pg_rand_window win[3];
        int np = 0;
        int64_t fused = 0; // rows of the whole fused tensor before this part
        uint64_t moe_key0 = 0; // dummy: the generator key after the router
        for (int t = 0; t < nt && rc == 0; t++) {
            const pg_layer_tensor *lt = &lts[t];
            if ((rc = load_part(ld, s, lt, fused, &parts[np], &win[np])) < 0) break;
            if (l == 0 && lt->field == F_QKV && lt->part == 0 && s->kind != SRC_DUMMY)
                snprintf(m->format, sizeof m->format, "%s %s", s->kind == SRC_GGUF ? "gguf" : "safetensors",
                         pg_dtype_name(parts[np].dtype));
            fused += lt->rows;
            np++;
            if (t + 1 < nt && lts[t + 1].field == lt->field && lts[t + 1].expert == lt->expert) continue;
            dummy_key_at(ld, lt, &moe_key0);
            rc = make_weight(ld, s, l, lt, parts, win, np);
            np = 0;
            fused = 0;
        }
        if (pg_config_layer_is_moe(c, l)) ld->tensor = moe_key0 + 2 * (uint64_t)c->n_experts; // past every expert
        // --cpu-offload-gb: layers move out as they load, so the device
        // never holds more than the resident layers and one more.
        const int64_t moved = m->offload.host_bytes;
        if (rc == 0 && ld->o->cpu_offload_bytes > 0 && moved < ld->o->cpu_offload_bytes)
            rc = pg_model_offload_layer(m, l);
    }
    free(lts);
    return rc < 0 ? rc : pg_model_offload_finish(m);
}

// Bytes of the weights as stored (for the progress bar); bf16 sizes for
// dummy weights.
static int64_t stored_bytes(const source *s, const pg_model_config *c) {
    const int64_t H = c->hidden;
    int64_t total = (int64_t)c->vocab_size * H * 2 * (c->tie_embeddings ? 1 : 2);
    pg_layer_tensor *lts = pg_xmalloc(sizeof *lts * (size_t)pg_layer_tensors_max(c));
    for (int32_t l = 0; l < c->n_layers; l++) {
        const int nt = pg_layer_tensors(c, NULL, s->kind == SRC_GGUF, l, lts); // all: the bar divides by ranks
        for (int t = 0; t < nt; t++) {
            pg_weight w;
            if (s->kind != SRC_DUMMY && pg_model_src_find(s, lts[t].name, &w))
                total += w.row_bytes * lts[t].rows; // an expert's share of a stacked tensor
            else
                total += lts[t].rows * lts[t].cols * 2;
        }
    }
    free(lts);
    return total;
}

// Bytes a weight of these (sliced) parts takes on a backend of caps `r`:
// what make() above would upload, without the data.
static int64_t planned_bytes(const pg_backend_caps *r, src_kind kind, const pg_weight *parts, int n, bool vector) {
    int64_t b = 0;
    for (int i = 0; i < n; i++) {
        const int64_t elems = parts[i].rows * parts[i].cols;
        if (vector) // norms and biases: the backend's vector type
            b += elems * r->vector_bytes;
        else if (kind == SRC_DUMMY) // random weights are made in bf16 (weight_random)
            b += elems * 2;
        else if (r->runs_in_place(parts[i].dtype)) // as stored, FP8's row scales included
            b += parts[i].rows * ((int64_t)parts[i].row_bytes +
                                  (pg_dtype_has_row_scales(parts[i].dtype) ? (int64_t)sizeof(float) : 0));
        else
            b += elems * (int64_t)pg_dtype_row_bytes(r->weight_dtype, 1);
    }
    return b;
}

int pg_model_weight_plan(const pg_model_load_opts *o, int32_t rank, int32_t size, const pg_backend_caps *caps,
                         pg_model_config *cfg, int64_t *bytes, pg_offload_plan *off, int64_t *quant_max_elems) {
    *bytes = 0;
    if (quant_max_elems) *quant_max_elems = 0;
    pg_offload_plan op = {0};
    pg_model m = {0}; // only cfg and shard: what the slicing rules read
    pg_layer_tensor *lts = NULL;
    source s;
    int rc = pg_model_src_open(o, &s, &m.cfg);
    if (rc == 0) rc = pg_model_shard_plan(&m.cfg, rank, size, o->expert_parallel, &m.shard);
    if (rc < 0) goto done;
    const pg_model_config *c = &m.cfg;
    const int64_t H = c->hidden, V = c->vocab_size;
    pg_weight w;
    // The embedding and the LM head (one weight when tied), as the loader
    // decides it.
    const char *emb_name = s.kind == SRC_GGUF ? "token_embd.weight" : "model.embed_tokens.weight";
    if ((rc = find_checked(NULL, &s, emb_name, V, H, &w, NULL)) < 0) goto done;
    w.data = NULL;
    slice_rows(&w, m.shard.vocab0, m.shard.vocab);
    *bytes += planned_bytes(caps, s.kind, &w, 1, false);
    const char *head_name = s.kind == SRC_GGUF ? "output.weight" : "lm_head.weight";
    const bool has_head = s.kind == SRC_DUMMY ? !c->tie_embeddings : pg_model_src_find(&s, head_name, &w);
    if (has_head && !(s.kind == SRC_HF && c->tie_embeddings)) {
        if ((rc = find_checked(NULL, &s, head_name, V, H, &w, NULL)) < 0) goto done;
        w.data = NULL;
        slice_rows(&w, m.shard.vocab0, m.shard.vocab);
        *bytes += planned_bytes(caps, s.kind, &w, 1, false);
    } else {
        m.cfg.tie_embeddings = true;
    }
    const char *norm_name = s.kind == SRC_GGUF ? "output_norm.weight" : "model.norm.weight";
    if ((rc = find_checked(NULL, &s, norm_name, 1, H, &w, NULL)) < 0)
        goto done;
    *bytes += planned_bytes(caps, s.kind, &w, 1, true);
    lts = pg_xmalloc(sizeof *lts * (size_t)pg_layer_tensors_max(c));
    for (int32_t l = 0; l < c->n_layers; l++) {
        // The layer's weights as the loader makes them (a fused weight's
        // parts summed), and as offload packs them (each 256-byte aligned).
        int64_t fused = 0, layer = 0, packed = 0, qelems = 0;
        const int nt = pg_layer_tensors(c, &m.shard, s.kind == SRC_GGUF, l, lts);
        for (int t = 0; t < nt; t++) {
            const pg_layer_tensor *lt = &lts[t];
            if ((rc = find_checked(NULL, &s, lt->name, lt->stored_rows, lt->cols, &w, NULL)) < 0) {
                pg_err_wrap(rc, "layer %d: ", l);
                goto done;
            }
            w.data = NULL; // slice the shape only: no data is copied or read
            if (lt->stored_rows != lt->rows) slice_rows(&w, lt->row0, lt->rows);
            int64_t lo = 0, n = 0;
            if (pg_lt_shard_range(c, &m.shard, lt->rows_dim, &lo, &n))
                slice_rows(&w, lo, n);
            else if (pg_lt_shard_range(c, &m.shard, lt->cols_dim, &lo, &n) &&
                     (rc = slice_cols(NULL, s.path, lt->name, &w, lo, n)) < 0)
                goto done;
            const bool quant_now = w.rows > 1 && lt->field != F_ROUTER && online_quant(o) && s.kind != SRC_DUMMY;
            const int64_t b = quant_now ? pg_quantized_bytes(o->quantization, w.rows, w.cols)
                                        : planned_bytes(caps, s.kind, &w, 1, w.rows == 1);
            fused += b;
            layer += b;
            const bool quantized = w.rows > 1 && s.kind != SRC_DUMMY &&
                                   (quant_now || ((w.dtype == PG_DTYPE_FP8_E4M3 || pg_dtype_is_int4(w.dtype)) &&
                                                  caps->runs_in_place(w.dtype)));
            if (quantized) qelems += w.rows * w.cols;
            if (t + 1 < nt && lts[t + 1].field == lt->field && lts[t + 1].expert == lt->expert) continue;
            // The weight is complete.
            if (quant_max_elems && qelems > *quant_max_elems) *quant_max_elems = qelems;
            packed += (fused + 255) / 256 * 256;
            fused = qelems = 0;
        }
        *bytes += layer;
        // engine/model/model_offload.c's rule: layers move until the budget is met.
        if (o->cpu_offload_bytes > 0 && op.host_bytes < o->cpu_offload_bytes) {
            op.n_layers++;
            op.host_bytes += packed;
            if (packed > op.slot_bytes) op.slot_bytes = packed;
            *bytes -= layer;
        }
    }
    op.n_slots = op.n_layers > 1 ? 2 : op.n_layers;
    *bytes += op.slot_bytes * op.n_slots;
    if (off) *off = op;
    // (The rotary frequencies, head_dim / 2 floats, are not counted: nor
    // are they in pg_model.weight_bytes.)
    *cfg = m.cfg;
done:
    free(lts);
    pg_model_src_close(&s);
    return rc;
}

// --all2all-backend alltoall (engine/model/moe_a2a.c): expert parallelism
// over a communicator in host memory. Nothing to do for a model without
// experts or one rank (as --enable-expert-parallel is ignored there); else
// one line naming what is missing.
static int moe_alltoall_check(pg_model *m, const pg_model_load_opts *o, pg_backend *be) {
    if (m->cfg.n_experts <= 0 || !o->comm || o->comm->size < 2) return 0;
    if (!m->shard.expert_parallel)
        return pg_err_set(PG_EINVAL, "--all2all-backend alltoall: needs --enable-expert-parallel on a model "
                                     "with experts (this one: %d experts, expert parallel %s)",
                          m->cfg.n_experts, o->expert_parallel ? "asked" : "not asked");
    if (strcmp(be->name, "cpu") || !strcmp(o->comm->name, "nccl"))
        return pg_err_set(PG_EUNSUPP, "--all2all-backend alltoall: runs on the cpu device with the cpu or tcp "
                                      "communicator for now (here: %s device, %s communicator)",
                          be->name, o->comm->name);
    m->shard.moe_alltoall = true;
    return pg_moe_a2a_init(m);
}

int pg_model_load(const pg_model_load_opts *o, pg_backend *be, pg_model **out) {
    *out = NULL;
    pg_model *m = pg_xcalloc(1, sizeof *m);
    m->be = be;
    source s;
    int rc = pg_model_src_open(o, &s, &m->cfg);
    if (s.gguf) m->source = s.gguf, m->source_close = pg_model_src_close_gguf;
    if (s.st) m->source = s.st, m->source_close = pg_model_src_close_st;
    if (s.kind == SRC_DUMMY) snprintf(m->format, sizeof m->format, "dummy (random bf16)");
    if (rc < 0) goto fail;
    pg_model_config *c = &m->cfg;
    if (!(m->family = pg_model_family_of(c))) {
        rc = PG_EUNSUPP;
        goto fail;
    }
    if (c->n_experts > 0 && !be->ops->moe_ffn) {
        rc = pg_err_set(PG_EUNSUPP, "%s: a mixture-of-experts model; the %s backend has no MoE op yet (docs/moe.md)",
                        s.path, be->name);
        goto fail;
    }
    if (pg_config_is_gemma(c)) { // Gemma's ops (docs/gemma3.md)
        const bool capped = c->attn_softcap > 0 || c->final_softcap > 0;
        if (!be->ops->gate_up_gelu || !be->ops->rmsnorm_add || !be->ops->scale ||
            (capped && (!be->ops->softcap || !be->ops->attention_softcap))) {
            rc = pg_err_set(PG_EUNSUPP, "%s: a %s model; the %s backend has no Gemma ops yet (docs/gemma3.md)",
                            s.path, c->arch, be->name);
            goto fail;
        }
    }
    m->attn_window = pg_model_attn_window(c, be->caps);
    // Under tensor parallelism a model that cannot be split stops here,
    // before any weight is read.
    m->comm = o->comm;
    if ((rc = pg_model_shard_plan(c, o->comm ? o->comm->rank : 0, o->comm ? o->comm->size : 1, o->expert_parallel,
                                  &m->shard)) < 0)
        goto fail;
    m->shard.comm = o->comm != NULL;
    if (o->moe_alltoall && (rc = moe_alltoall_check(m, o, be)) < 0) goto fail;
    m->layers = pg_xcalloc((size_t)c->n_layers, sizeof(pg_model_layer));
    loader ld = {.m = m, .o = o};
    // Weights are read from the mapping here (the pages come in as the
    // backend converts or copies them): a progress bar on a terminal.
    // (None when the backend borrows the mapping: nothing is read now.)
    // (Under tensor parallelism rank 0 shows its share; the others none.)
    const bool show = !be->caps->weights_borrow && m->shard.rank == 0;
    pg_progress_begin(&ld.pr, "loading weights", show ? stored_bytes(&s, c) / m->shard.size : 0,
                      show ? stderr : NULL);
    const int64_t H = c->hidden, V = c->vocab_size;
    // The embedding and the LM head: this rank's vocabulary rows.
    const pg_rand_window vwin = {.rows = m->shard.vocab, .cols = H, .row0 = m->shard.vocab0, .full_cols = H};
    pg_weight w;
    const char *emb_name = s.kind == SRC_GGUF ? "token_embd.weight" : "model.embed_tokens.weight";
    if ((rc = find_checked(m, &s, emb_name, V, H, &w, NULL)) < 0) goto fail_progress;
    if (pg_dtype_has_row_scales(w.dtype)) { // the embed op reads rows without scales
        rc = pg_err_set(PG_EUNSUPP, "%s: the embedding '%s' is stored in %s, which is not supported", s.path,
                        emb_name, pg_dtype_name(w.dtype));
        goto fail_progress;
    }
    slice_rows(&w, m->shard.vocab0, m->shard.vocab);
    if ((rc = make(&ld, &s, &w, &vwin, 1, false, false, &m->tok_emb)) < 0) goto fail_progress;
    // The LM head: its own tensor, else the embedding (tied).
    const char *head_name = s.kind == SRC_GGUF ? "output.weight" : "lm_head.weight";
    pg_weight hw;
    const bool has_head = s.kind == SRC_DUMMY ? !c->tie_embeddings : pg_model_src_find(&s, head_name, &hw);
    if (s.kind == SRC_HF && c->tie_embeddings) {
        // tie_word_embeddings wins over a stored copy (HF ignores it too).
    } else if (has_head) {
        if ((rc = find_checked(m, &s, head_name, V, H, &hw, NULL)) < 0) goto fail_progress;
        slice_rows(&hw, m->shard.vocab0, m->shard.vocab);
        if ((rc = make(&ld, &s, &hw, &vwin, 1, false, false, &m->lm_head)) < 0) goto fail_progress;
    }
    if (!m->lm_head) {
        m->lm_head = m->tok_emb;
        c->tie_embeddings = true;
    }
    const char *norm_name = s.kind == SRC_GGUF ? "output_norm.weight" : "model.norm.weight";
    if ((rc = find_checked(m, &s, norm_name, 1, H, &w, NULL)) < 0 ||
        (rc = make(&ld, &s, &w, NULL, 1, true, true, &m->final_norm)) < 0)
        goto fail_progress;
    if (o->quantization != PG_QUANT_NONE && s.kind == SRC_DUMMY) {
        rc = pg_err_set(PG_EUNSUPP, "--quantization %s: not with --load-format dummy (random weights are made "
                        "on the device in bf16)", pg_quantization_name(o->quantization));
        goto fail_progress;
    }
    // An AWQ / GPTQ checkpoint names its own format (check_quant_flag made
    // an explicit flag agree with it).
    m->quantization = c->ckpt_quant != PG_QUANT_NONE ? c->ckpt_quant : o->quantization;
    if ((rc = load_layers(&ld, &s)) < 0 || (rc = load_kv_scales(m, &s)) < 0) goto fail_progress;
    if (c->ckpt_quant != PG_QUANT_NONE) {
        const size_t len = strlen(m->format);
        snprintf(m->format + len, sizeof m->format - len, " (%s checkpoint, group %d, repacked at load)",
                 pg_quantization_name(c->ckpt_quant), c->ckpt_group);
    } else if (o->quantization != PG_QUANT_NONE) {
        const size_t len = strlen(m->format);
        snprintf(m->format + len, sizeof m->format - len, ", layers %s (--quantization %s)",
                 pg_dtype_name(m->layer_dtype), pg_quantization_name(o->quantization));
    }
    // Rotary frequencies (Llama-3 GGUF files carry the frequency scaling as
    // a tensor of divisors).
    {
        float *inv = own(m, pg_xmalloc(sizeof(float) * (size_t)(c->head_dim / 2)));
        pg_config_rope_inv_freq(c, inv);
        const gguf_tensor *rf = s.kind == SRC_GGUF ? gguf_find_tensor(s.gguf, "rope_freqs.weight") : NULL;
        if (rf) {
            if (rf->type != PG_DTYPE_F32 || rf->dims[0] != (uint64_t)(c->head_dim / 2)) {
                rc = pg_err_set(PG_EFORMAT, "%s: rope_freqs.weight has an unexpected shape", o->path);
                goto fail_progress;
            }
            for (int32_t i = 0; i < c->head_dim / 2; i++) inv[i] /= ((const float *)rf->data)[i];
        }
        if ((rc = be->store->vector_f32(be, inv, c->head_dim / 2, &m->inv_freq)) < 0) goto fail_progress;
        if (c->swa_window > 0) { // Gemma's local layers: their own base, unscaled
            pg_config_rope_inv_freq_local(c, inv);
            if ((rc = be->store->vector_f32(be, inv, c->head_dim / 2, &m->inv_freq_local)) < 0) goto fail_progress;
        }
    }
    {
        double secs = pg_progress_end(&ld.pr);
        if (!o->dummy && !be->caps->weights_borrow && m->shard.rank == 0)
            PG_LOGI("loaded %lld tensors, %.2f GB in %.2f s (%.2f GB/s, read and copied to the %s)",
                    (long long)ld.pr.items, (double)ld.pr.done / 1e9, secs,
                    secs > 0 ? (double)ld.pr.done / 1e9 / secs : 0.0, be->name);
    }
    if ((rc = pg_model_lora_load(m, o)) < 0) goto fail;
    // A backend that copied the weights needs neither the mapping nor the
    // loader's host copies any more.
    if (!be->caps->weights_borrow) {
        for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
        m->n_owned = 0;
        if (m->source_close) m->source_close(m->source);
        m->source = NULL;
        m->source_close = NULL;
    }
    *out = m;
    return 0;
fail_progress:
    pg_progress_end(&ld.pr);
fail:
    pg_model_free(m);
    return rc;
}

void pg_model_free(pg_model *m) {
    if (!m) return;
    pg_backend *be = m->be;
    if (m->layers)
        for (int32_t l = 0; l < m->cfg.n_layers; l++) {
            pg_model_layer *L = &m->layers[l];
            pg_bweight *ws[PG_LAYER_WEIGHTS_MAX];
            const int n = pg_model_layer_weights(L, ws);
            for (int i = 0; i < n; i++) be->store->weight_free(be, ws[i]);
            if (L->router) be->store->weight_free(be, L->router);
            for (int32_t e = 0; L->exp_gate_up && e < m->cfg.n_experts; e++) {
                if (L->exp_gate_up[e]) be->store->weight_free(be, L->exp_gate_up[e]);
                if (L->exp_down[e]) be->store->weight_free(be, L->exp_down[e]);
            }
            free(L->exp_gate_up);
            free(L->exp_down);
        }
    pg_model_offload_free(m);
    pg_model_lora_free(m);
    pg_moe_a2a_free(m);
    if (m->lm_head && m->lm_head != m->tok_emb) be->store->weight_free(be, m->lm_head);
    if (m->tok_emb) be->store->weight_free(be, m->tok_emb);
    if (m->final_norm) be->store->weight_free(be, m->final_norm);
    if (m->inv_freq) be->store->weight_free(be, m->inv_freq);
    if (m->inv_freq_local) be->store->weight_free(be, m->inv_freq_local);
    free(m->layers);
    free(m->kv_scales);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    if (m->source_close) m->source_close(m->source);
    free(m);
}
