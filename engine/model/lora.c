// engine/model/lora.c - LoRA adapters beside the base model (engine/model/model.h
// pg_model_lora; docs/lora.md): each PEFT adapter read and checked
// (engine/model/lora_adapter.c), its pairs cut to this rank's share and
// uploaded into one slot table per (layer, module), the form the batched
// op (kernels/backend.h lora_apply) takes.
//
// Tensor parallelism: a column-parallel projection (q, k, v, gate, up)
// holds this rank's output rows, so its B keeps those rows and A is whole;
// a row-parallel one (o, down) holds this rank's input columns, so its A
// keeps those columns and B is whole: each rank's (x_r . A_r^T) . B^T is
// its part of the sum the all-reduce completes, as the base product's is.
// No collective is added.
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/model/lora_adapter.h"
#include "engine/model/model.h"

_Static_assert(PG_LORA_MODULES == PG_LORA_N_MODULES, "one module list");

static void *lora_own(pg_model_lora *lo, void *p) {
    lo->owned = pg_xrealloc(lo->owned, sizeof(void *) * (size_t)(lo->n_owned + 1));
    lo->owned[lo->n_owned++] = p;
    return p;
}

// This rank's [lo, lo + n) of module m's sliced dimension (B's rows for a
// column-parallel projection, A's columns for a row-parallel one).
static void module_range(const pg_model *m, int module, int64_t *lo, int64_t *n) {
    const pg_model_shard *sh = &m->shard;
    const int64_t hd = m->cfg.head_dim;
    switch (module) {
    case PG_LORA_Q:
    case PG_LORA_O: *lo = sh->head0 * hd, *n = sh->n_heads * hd; return;
    case PG_LORA_K:
    case PG_LORA_V: *lo = sh->kv_head0 * hd, *n = sh->n_kv_heads * hd; return;
    default: *lo = sh->ffn0, *n = sh->ffn; return; // gate, up, down
    }
}

static bool row_parallel(int module) { return module == PG_LORA_O || module == PG_LORA_DOWN; }

// Columns [c0, c0 + n) of a plain (f32 / f16 / bf16) matrix, copied.
static pg_weight cut_cols(pg_model_lora *lo, const pg_weight *w, int64_t c0, int64_t n) {
    const size_t eb = pg_dtype_row_bytes(w->dtype, 1), rb = eb * (size_t)n;
    char *d = lora_own(lo, pg_xmalloc(rb * (size_t)w->rows));
    for (int64_t r = 0; r < w->rows; r++)
        memcpy(d + (size_t)r * rb, (const char *)w->data + (size_t)r * w->row_bytes + eb * (size_t)c0, rb);
    pg_weight o = *w;
    o.data = d;
    o.cols = n;
    o.row_bytes = rb;
    return o;
}

static int upload(pg_model *m, const pg_weight *w, const pg_bweight **out) {
    pg_model_lora *lo = &m->lora;
    pg_bweight *h;
    PG_TRY(m->be->store->weight_upload(m->be, w, 1, &h));
    lo->handles = pg_xrealloc(lo->handles, sizeof(pg_bweight *) * (size_t)(lo->n_handles + 1));
    lo->handles[lo->n_handles++] = h;
    *out = h;
    return 0;
}

// Adapter `ad` into slot s of every (layer, module) table.
static int place_adapter(pg_model *m, const pg_lora_adapter *ad, int32_t s) {
    pg_model_lora *lo = &m->lora;
    for (int32_t l = 0; l < m->cfg.n_layers; l++)
        for (int mod = 0; mod < PG_LORA_MODULES; mod++) {
            pg_lora_slot *slot = (pg_lora_slot *)pg_model_lora_slots(lo, l, mod) + s;
            *slot = (pg_lora_slot){.scale = ad->scale};
            const pg_weight *a = ad->layers[l].a[mod], *b = ad->layers[l].b[mod];
            if (!a) continue;
            pg_weight wa = *a, wb = *b;
            int64_t r0, n;
            module_range(m, mod, &r0, &n);
            if (row_parallel(mod)) {
                if (n != wa.cols) wa = cut_cols(lo, &wa, r0, n);
            } else if (n != wb.rows) {
                wb.data = (const char *)wb.data + (size_t)r0 * wb.row_bytes;
                wb.rows = n;
            }
            PG_TRY(upload(m, &wa, &slot->a));
            PG_TRY(upload(m, &wb, &slot->b));
        }
    return 0;
}

int pg_model_lora_load(pg_model *m, const pg_model_load_opts *o) {
    if (o->n_lora <= 0) return 0;
    pg_model_lora *lo = &m->lora;
    PG_ARG(m->be->ops->lora_apply && m->be->ops->silu_mul,
           "LoRA adapters: the %s backend has no LoRA op yet (docs/lora.md)", m->be->name);
    if (m->cfg.n_experts > 0)
        return pg_err_set(PG_EUNSUPP, "LoRA adapters: not supported for mixture-of-experts models yet");
    const int32_t max_rank = o->max_lora_rank > 0 ? o->max_lora_rank : 64;
    const int32_t n = o->n_lora;
    lo->table = pg_xcalloc((size_t)m->cfg.n_layers * PG_LORA_MODULES * (size_t)n, sizeof(pg_lora_slot));
    lo->adapters = pg_xcalloc((size_t)n, sizeof(*lo->adapters));
    lo->names = pg_xcalloc((size_t)n, sizeof(char *));
    lo->n_slots = n;
    for (int32_t i = 0; i < n; i++) {
        PG_TRY(pg_lora_adapter_load(o->lora_dirs[i], &m->cfg, max_rank, &lo->adapters[i]));
        lo->names[i] = pg_xstrdup(o->lora_names && o->lora_names[i] ? o->lora_names[i] : o->lora_dirs[i]);
        if (lo->adapters[i]->rank > lo->max_rank) lo->max_rank = lo->adapters[i]->rank;
        int rc = place_adapter(m, lo->adapters[i], i);
        if (rc < 0) return pg_err_wrap(rc, "%s: ", o->lora_dirs[i]);
    }
    return 0;
}

void pg_model_lora_free(pg_model *m) {
    pg_model_lora *lo = &m->lora;
    for (int32_t i = 0; i < lo->n_handles; i++) m->be->store->weight_free(m->be, lo->handles[i]);
    for (int32_t i = 0; i < lo->n_slots; i++) {
        if (lo->adapters) pg_lora_adapter_free(lo->adapters[i]);
        if (lo->names) free(lo->names[i]);
    }
    for (int32_t i = 0; i < lo->n_owned; i++) free(lo->owned[i]);
    free(lo->handles);
    free(lo->adapters);
    free(lo->names);
    free(lo->owned);
    free(lo->table);
    memset(lo, 0, sizeof *lo);
}
