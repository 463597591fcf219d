// engine/model/kv_layout.c - which layers share a KV block table (layer
// groups, docs/kv_layer_groups.md): the layout the runner's KV tensors,
// the scheduler's pool and the memory plan all follow.
#include <string.h>

#include "engine/model/model.h"

int32_t pg_config_layer_window(const pg_model_config *c, int32_t l) {
    if (pg_config_layer_is_local(c, l)) return c->swa_window;
    // Qwen2's window covers only the layers past max_window_layers: it is
    // capped instead (pg_model_attn_window).
    const bool mistral = !strcmp(c->arch, "mistral") || !strcmp(c->arch, "mixtral");
    return mistral && c->sliding_window > 0 ? c->sliding_window : 0;
}

static void layout_plain(const pg_model_config *c, pg_kv_layout *o) {
    o->n_groups = 1;
    o->n_slots = c->n_layers;
    for (int32_t l = 0; l < c->n_layers; l++) o->group[l] = 0, o->slot[l] = (int16_t)l;
}

void pg_kv_layout_make(const pg_model_config *c, bool groups, pg_kv_layout *o) {
    memset(o, 0, sizeof *o);
    o->n_layers = c->n_layers;
    // The layer types: distinct windows, full attention (0) first.
    int32_t win[PG_MAX_KV_GROUPS + 1], cnt[PG_MAX_KV_GROUPS + 1], n_types = 1;
    win[0] = 0, cnt[0] = 0;
    bool any = false;
    for (int32_t l = 0; groups && l < c->n_layers; l++) {
        const int32_t w = pg_config_layer_window(c, l);
        int32_t t = 0;
        while (t < n_types && win[t] != w) t++;
        if (t == n_types) {
            if (n_types == PG_MAX_KV_GROUPS) { // more kinds of window than groups: plain
                any = false;
                break;
            }
            win[n_types] = w, cnt[n_types++] = 0;
        }
        cnt[t]++;
        any |= w > 0;
    }
    if (!any) {
        layout_plain(c, o);
        return;
    }
    // Layers per group: the smallest type's count (every group then fills
    // its blocks but for one partial group per type), raised while the
    // groups are too many.
    int32_t per = c->n_layers;
    for (int32_t t = 0; t < n_types; t++)
        if (cnt[t] > 0 && cnt[t] < per) per = cnt[t];
    for (;;) {
        int32_t n = 0;
        for (int32_t t = 0; t < n_types; t++) n += (cnt[t] + per - 1) / per;
        if (n <= PG_MAX_KV_GROUPS) break;
        per++;
    }
    o->n_slots = per;
    for (int32_t t = 0; t < n_types; t++) {
        int32_t in_group = per; // layers placed in the type's current group
        for (int32_t l = 0; l < c->n_layers; l++) {
            if (pg_config_layer_window(c, l) != win[t]) continue;
            if (in_group == per) o->window[o->n_groups++] = win[t], in_group = 0;
            o->group[l] = (int16_t)(o->n_groups - 1);
            o->slot[l] = (int16_t)in_group++;
        }
    }
}
