// engine/model/model_offload.c - --cpu-offload-gb: layer weights in host memory,
// streamed into two device slots one layer ahead (engine/model/model.h
// pg_model_offload; design: docs/memory_planning.md "CPU weight offload").
//
// A layer's weights are packed back to back (256-byte aligned) into one
// host block, in the layout they take in a slot, so one copy per layer
// moves them. Layer l always runs from slot l % 2: its weights point there
// for good, which keeps captured graphs valid. The forward starts the
// copies of layers 0 and 1, and after queuing layer l's ops the copy of
// layer l + 2 into the slot layer l is using (the copy waits for those
// ops; it runs beside layer l + 1's).
//
// vLLM reads offloaded weights in place over PCIe (unified addressing);
// copying whole layers instead keeps every kernel reading HBM, so prefill
// and large batches run at full speed once the copy is hidden, at the cost
// of two slots of device memory.
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/model/model.h"

#define SLOT_ALIGN 256

static size_t align_up(size_t n) { return (n + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN; }

int pg_model_layer_weights(const pg_model_layer *L, pg_bweight **out) {
    pg_bweight *all[] = {L->attn_norm, L->qkv, L->qkv_bias, L->q_norm, L->k_norm,
                         L->o,         L->ffn_norm, L->gate_up, L->down, L->post_attn_norm,
                         L->post_ffn_norm};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) out[n++] = all[i];
    return n;
}

int pg_model_layer_all_weights(const pg_model_layer *L, int32_t n_experts, pg_bweight ***out) {
    const int64_t cap = PG_LAYER_WEIGHTS_MAX + 1 + (L->exp_gate_up ? 2 * (int64_t)n_experts : 0);
    pg_bweight **ws = pg_xmalloc(sizeof(pg_bweight *) * (size_t)cap);
    int n = pg_model_layer_weights(L, ws);
    if (L->router) ws[n++] = L->router;
    for (int32_t e = 0; L->exp_gate_up && e < n_experts; e++) {
        if (L->exp_gate_up[e]) ws[n++] = L->exp_gate_up[e];
        if (L->exp_down[e]) ws[n++] = L->exp_down[e];
    }
    *out = ws;
    return n;
}

int pg_model_offload_layer(pg_model *m, int32_t l) {
    pg_backend *be = m->be;
    pg_model_offload *o = &m->offload;
    PG_ARG(be->store->weight_offload && be->store->weight_point && be->store->stream_in,
           "--cpu-offload-gb: the %s backend cannot offload weights", be->name);
    PG_ARG(l == o->n_layers && l < m->cfg.n_layers, "offload: layer %d after %d offloaded layers", l, o->n_layers);
    pg_bweight **ws;
    const int n = pg_model_layer_all_weights(&m->layers[l], m->cfg.n_experts, &ws);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += align_up(be->store->weight_pack_bytes(be, ws[i]));
    void *host;
    int rc = be->dev->host_alloc(be, total, &host);
    if (rc < 0) {
        free(ws);
        return pg_err_wrap(rc, "--cpu-offload-gb: layer %d: ", l);
    }
    o->host = pg_xrealloc(o->host, sizeof(void *) * (size_t)(l + 1));
    o->bytes = pg_xrealloc(o->bytes, sizeof(size_t) * (size_t)(l + 1));
    o->host[l] = host;
    o->bytes[l] = total;
    o->n_layers = l + 1;
    o->host_bytes += (int64_t)total;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const size_t pack = be->store->weight_pack_bytes(be, ws[i]);
        const int64_t had = (int64_t)ws[i]->bytes;
        if ((rc = be->store->weight_offload(be, ws[i], (char *)host + off)) < 0) {
            free(ws);
            return pg_err_wrap(rc, "--cpu-offload-gb: layer %d: ", l);
        }
        m->weight_bytes -= had;
        off += align_up(pack);
    }
    free(ws);
    return 0;
}

// Copies layer 0 into slot 0 three times (host -> device, waited for):
// the median rate, in GB/s.
static int measure(pg_model *m, double *gbps) {
    pg_backend *be = m->be;
    const pg_model_offload *o = &m->offload;
    double t[3];
    for (int i = 0; i < 3; i++) {
        const int64_t t0 = pg_now_ns();
        PG_TRY(be->store->stream_in(be, o->slot[0], o->host[0], o->bytes[0], 0));
        PG_TRY(be->store->stream_in_wait(be, 0));
        PG_TRY(be->dev->sync(be));
        t[i] = (double)(pg_now_ns() - t0) * 1e-9;
    }
    const double lo = t[0] < t[1] ? t[0] : t[1], hi = t[0] < t[1] ? t[1] : t[0];
    const double med = t[2] < lo ? lo : t[2] > hi ? hi : t[2];
    *gbps = med > 0 ? (double)o->bytes[0] / med / 1e9 : 0;
    return 0;
}

int pg_model_offload_finish(pg_model *m) {
    pg_backend *be = m->be;
    pg_model_offload *o = &m->offload;
    if (o->n_layers == 0) return 0;
    for (int32_t l = 0; l < o->n_layers; l++)
        if (o->bytes[l] > o->slot_bytes) o->slot_bytes = o->bytes[l];
    const int n_slots = o->n_layers > 1 ? 2 : 1;
    for (int s = 0; s < n_slots; s++) {
        int rc = be->dev->alloc(be, o->slot_bytes, &o->slot[s]);
        if (rc < 0)
            return pg_err_wrap(rc, "--cpu-offload-gb: the %d device slot%s of %.1f MiB for the offloaded layers: ",
                               n_slots, n_slots > 1 ? "s" : "", (double)o->slot_bytes / (1 << 20));
        m->weight_bytes += (int64_t)o->slot_bytes;
        o->slots_bytes += (int64_t)o->slot_bytes;
    }
    for (int32_t l = 0; l < o->n_layers; l++) {
        pg_bweight **ws;
        const int n = pg_model_layer_all_weights(&m->layers[l], m->cfg.n_experts, &ws);
        char *slot = o->slot[l % 2];
        size_t off = 0;
        int rc = 0;
        for (int i = 0; i < n && rc == 0; i++) {
            rc = be->store->weight_point(be, ws[i], slot + off);
            off += align_up(be->store->weight_pack_bytes(be, ws[i]));
        }
        free(ws);
        PG_TRY(rc);
    }
    PG_TRY(measure(m, &o->h2d_gbps));
    if (m->shard.rank == 0) {
        const double per_step_ms = o->h2d_gbps > 0 ? (double)o->host_bytes / (o->h2d_gbps * 1e9) * 1e3 : 0;
        const int64_t saved = o->host_bytes - (int64_t)o->slot_bytes * n_slots;
        const bool cpu = strcmp(be->name, "cpu") == 0;
        PG_LOGI("cpu offload: layers 0-%d (%d of %d), %.1f MiB in %s host memory, streamed through %d device "
                "slot%s of %.1f MiB (device memory saved: %.1f MiB); host-to-device %.1f GB/s measured now, so "
                "%.1f ms of copies per step, hidden only behind a step whose compute takes longer%s",
                o->n_layers - 1, o->n_layers, m->cfg.n_layers, (double)o->host_bytes / (1 << 20),
                cpu ? "plain" : "pinned", n_slots, n_slots > 1 ? "s" : "",
                (double)o->slot_bytes / (1 << 20), (double)saved / (1 << 20), o->h2d_gbps, per_step_ms,
                !cpu ? ""
                     : " (the CPU backend's weights are in host memory already: this copies "
                                      "them every step and saves nothing)");
    }
    return 0;
}

void pg_model_offload_free(pg_model *m) {
    pg_backend *be = m->be;
    pg_model_offload *o = &m->offload;
    for (int s = 0; s < 2; s++)
        if (o->slot[s]) be->dev->free(be, o->slot[s]);
    for (int32_t l = 0; l < o->n_layers; l++) be->dev->host_free(be, o->host[l]);
    free(o->host);
    free(o->bytes);
    memset(o, 0, sizeof *o);
}

int pg_model_offload_prefetch(const pg_model *m, int32_t l) {
    const pg_model_offload *o = &m->offload;
    if (l >= o->n_layers) return 0;
    return m->be->store->stream_in(m->be, o->slot[l % 2], o->host[l], o->bytes[l], l % 2);
}

int pg_model_offload_wait(const pg_model *m, int32_t l) {
    if (l >= m->offload.n_layers) return 0;
    return m->be->store->stream_in_wait(m->be, l % 2);
}
