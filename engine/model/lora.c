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

// What one slot holds: its adapter (kept open: a backend may borrow the
// mapped data), the handles uploaded from it and the sliced copies.
typedef struct pg_lora_slot_res {
    pg_lora_adapter *adapter;
    pg_bweight **handles;
    int32_t n_handles;
    void **owned;
    int32_t n_owned;
} pg_lora_slot_res;

static void *slot_own(pg_lora_slot_res *r, void *p) {
    r->owned = pg_xrealloc(r->owned, sizeof(void *) * (size_t)(r->n_owned + 1));
    r->owned[r->n_owned++] = p;
    return p;
}

// This rank's [lo, lo + n) of module m's sliced dimension (B's rows for a
// column-parallel projection, A's columns for a row-parallel one).
static void module_range(const pg_model_config *c, const pg_model_shard *sh, int module, int64_t *lo, int64_t *n) {
    const int64_t hd = c->head_dim;
    switch (module) {
    case PG_LORA_Q:
    case PG_LORA_O: *lo = sh->head0 * hd, *n = sh->n_heads * hd; return;
    case PG_LORA_K:
    case PG_LORA_V: *lo = sh->kv_head0 * hd, *n = sh->n_kv_heads * hd; return;
    default: *lo = sh->ffn0, *n = sh->ffn; return; // gate, up, down
    }
}

static bool row_parallel(int module) { return module == PG_LORA_O || module == PG_LORA_DOWN; }

static int upload(pg_model *m, pg_lora_slot_res *r, const pg_weight *w, const pg_bweight **out) {
    pg_bweight *h;
    PG_TRY(m->be->store->weight_upload(m->be, w, 1, &h));
    r->handles = pg_xrealloc(r->handles, sizeof(pg_bweight *) * (size_t)(r->n_handles + 1));
    r->handles[r->n_handles++] = h;
    *out = h;
    return 0;
}

// Empties slot s: its table entries, handles, copies and adapter.
static void slot_clear(pg_model *m, int32_t s) {
    pg_model_lora *lo = &m->lora;
    for (int32_t l = 0; l < m->cfg.n_layers; l++)
        for (int mod = 0; mod < PG_LORA_MODULES; mod++)
            ((pg_lora_slot *)pg_model_lora_slots(lo, l, mod))[s] = (pg_lora_slot){0};
    pg_lora_slot_res *r = &lo->res[s];
    for (int32_t i = 0; i < r->n_handles; i++) m->be->store->weight_free(m->be, r->handles[i]);
    for (int32_t i = 0; i < r->n_owned; i++) free(r->owned[i]);
    free(r->handles);
    free(r->owned);
    pg_lora_adapter_free(r->adapter);
    *r = (pg_lora_slot_res){0};
}

// Adapter r->adapter into slot s of every (layer, module) table.
static int place_adapter(pg_model *m, int32_t s) {
    pg_model_lora *lo = &m->lora;
    pg_lora_slot_res *r = &lo->res[s];
    const pg_lora_adapter *ad = r->adapter;
    for (int32_t l = 0; l < m->cfg.n_layers; l++)
        for (int mod = 0; mod < PG_LORA_MODULES; mod++) {
            pg_lora_slot *slot = (pg_lora_slot *)pg_model_lora_slots(lo, l, mod) + s;
            const pg_weight *a = ad->layers[l].a[mod], *b = ad->layers[l].b[mod];
            if (!a) continue;
            pg_weight wa = *a, wb = *b;
            int64_t r0, n;
            module_range(&m->cfg, &m->shard, mod, &r0, &n);
            if (row_parallel(mod)) {
                void *copy = NULL;
                if (n != wa.cols) PG_TRY(pg_model_slice_cols(&wa, r0, n, &copy)); // plain types: never refused
                if (copy) slot_own(r, copy);
            } else if (n != wb.rows) {
                wb.data = (const char *)wb.data + (size_t)r0 * wb.row_bytes;
                wb.rows = n;
            }
            const pg_bweight *ha, *hb;
            PG_TRY(upload(m, r, &wa, &ha));
            PG_TRY(upload(m, r, &wb, &hb));
            // Set last: a slot entry is either empty or whole.
            *slot = (pg_lora_slot){.a = ha, .b = hb, .scale = ad->scale};
        }
    return 0;
}

// The whole host table into the backend's (when it keeps one): every
// (layer, module, slot) entry, after the steps that read the old ones.
static int dev_table_write(pg_model *m) {
    pg_model_lora *lo = &m->lora;
    if (!lo->dev_table) return 0;
    return m->be->ops->lora_table_write(m->be, lo->dev_table, lo->table,
                                        (int64_t)m->cfg.n_layers * PG_LORA_MODULES * lo->n_slots);
}

int pg_model_lora_set(pg_model *m, int32_t slot, const char *dir) {
    pg_model_lora *lo = &m->lora;
    PG_ARG(slot >= 0 && slot < lo->n_slots, "LoRA slot %d of %d", slot, lo->n_slots);
    // slot_clear frees the slot's weights before the backend's table
    // forgets them; nothing reads them in between: the free waits for the
    // queued steps (cudaFree synchronises), and the table is rewritten
    // before the next step is queued.
    slot_clear(m, slot);
    int rc = dev_table_write(m);
    if (rc < 0 || !dir) return rc;
    rc = pg_lora_adapter_load(dir, &m->cfg, lo->max_rank, &lo->res[slot].adapter);
    if (rc == 0 && (rc = place_adapter(m, slot)) < 0) pg_err_wrap(rc, "%s: ", dir);
    if (rc == 0 && (rc = dev_table_write(m)) < 0) pg_err_wrap(rc, "%s: ", dir);
    if (rc < 0) {
        slot_clear(m, slot);
        (void)dev_table_write(m); // the entries it may have written go too
    }
    return rc;
}

int pg_model_lora_load(pg_model *m, const pg_model_load_opts *o) {
    const int32_t n = o->lora_slots > o->n_lora ? o->lora_slots : o->n_lora;
    if (n <= 0) return 0;
    pg_model_lora *lo = &m->lora;
    PG_ARG(m->be->ops->lora_apply && m->be->ops->silu_mul,
           "LoRA adapters: the %s backend has no LoRA op yet (%s; docs/lora.md)", m->be->name,
           m->be->ops->lora_apply ? "silu_mul" : "lora_apply");
    if (m->cfg.n_experts > 0 || pg_config_is_gemma(&m->cfg))
        return pg_err_set(PG_EUNSUPP, "LoRA adapters: not supported for %s models yet (Llama-family only)",
                          m->cfg.n_experts > 0 ? "mixture-of-experts" : m->cfg.arch);
    lo->max_rank = o->max_lora_rank > 0 ? o->max_lora_rank : PG_MODEL_LORA_RANK_CAP;
    lo->table = pg_xcalloc((size_t)m->cfg.n_layers * PG_LORA_MODULES * (size_t)n, sizeof(pg_lora_slot));
    lo->res = pg_xcalloc((size_t)n, sizeof *lo->res);
    lo->n_slots = n;
    if (m->be->ops->lora_apply_dev && m->be->ops->lora_table_write) {
        const size_t bytes = sizeof(pg_lora_dev_slot) * (size_t)m->cfg.n_layers * PG_LORA_MODULES * (size_t)n;
        PG_TRY(m->be->dev->alloc(m->be, bytes, (void **)&lo->dev_table));
        PG_TRY(dev_table_write(m)); // every entry empty
    }
    for (int32_t i = 0; i < o->n_lora; i++) PG_TRY(pg_model_lora_set(m, i, o->lora_dirs[i]));
    return 0;
}

void pg_model_lora_free(pg_model *m) {
    pg_model_lora *lo = &m->lora;
    for (int32_t i = 0; lo->res && i < lo->n_slots; i++) slot_clear(m, i);
    if (lo->dev_table) m->be->dev->free(m->be, lo->dev_table);
    free(lo->res);
    free(lo->table);
    memset(lo, 0, sizeof *lo);
}

int64_t pg_lora_rank_bytes(const pg_lora_adapter *ad, const pg_model_config *c, const pg_model_shard *sh) {
    int64_t bytes = 0;
    for (int32_t l = 0; l < c->n_layers; l++)
        for (int mod = 0; mod < PG_LORA_MODULES; mod++) {
            const pg_weight *a = ad->layers[l].a[mod], *b = ad->layers[l].b[mod];
            if (!a) continue;
            int64_t r0, n;
            module_range(c, sh, mod, &r0, &n);
            (void)r0;
            // This rank's A columns (row-parallel) or B rows (column-parallel).
            bytes += row_parallel(mod) ? a->rows * (int64_t)pg_dtype_row_bytes(a->dtype, n) + b->rows * (int64_t)b->row_bytes
                                       : a->rows * (int64_t)a->row_bytes + n * (int64_t)b->row_bytes;
        }
    return bytes;
}
