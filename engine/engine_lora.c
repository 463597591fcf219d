// engine/engine_lora.c - the engine's LoRA slots (docs/lora.md): which adapter
// each slot holds, the adapter ids requests name, and vLLM's runtime
// loading and unloading.
//
// A request names an adapter by id (pg_engine_lora_find, on the caller's
// thread); at admission the engine thread turns the id into the slot it is
// in (sched_request.lora_id, what the runner reads) and its prefix-cache
// salt (the id itself: a slot reused by another adapter never shares KV
// with the one before). A load or unload is a submission like any other:
// the engine thread applies it between steps, in order with the requests
// around it, and on every rank (pg_executor_lora_set); its caller waits.
// An unload is refused while a live request uses the slot, and a request
// whose adapter went meanwhile is rejected at admission, so no step ever
// runs a slot whose weights are changing.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/engine_int.h"
#include "engine/model/lora_adapter.h"

void eng_lora_init(pg_engine *e) {
    pthread_mutex_init(&e->lora_mu, NULL);
    pthread_cond_init(&e->lora_cv, NULL);
    e->n_lora_slots = pg_engine_lora_slots(&e->cfg);
    e->lora_known_cap = pg_engine_lora_known_cap(&e->cfg);
    e->lora = pg_xcalloc((size_t)(e->n_lora_slots > 0 ? e->n_lora_slots : 1), sizeof(eng_lora));
    e->lora_used_ns = pg_xcalloc((size_t)(e->n_lora_slots > 0 ? e->n_lora_slots : 1), sizeof(int64_t));
    e->lora_parked = pg_xcalloc((size_t)(e->lora_known_cap > 0 ? e->lora_known_cap : 1), sizeof(eng_lora));
    // The first adapters named start in the slots (the model loaded them);
    // the rest wait for a request (more than --max-cpu-loras is refused by
    // set-up, with its reason).
    for (int32_t i = 0; i < e->cfg.n_lora && i < e->lora_known_cap; i++) {
        eng_lora a = {.uid = ++e->lora_next_uid, .name = pg_xstrdup(e->cfg.lora_names[i]),
                      .path = pg_xstrdup(e->cfg.lora_paths[i])};
        if (i < e->n_lora_slots)
            e->lora[i] = a;
        else
            e->lora_parked[e->n_lora_parked++] = a;
    }
}

void eng_lora_free(pg_engine *e) {
    for (int32_t i = 0; e->lora && i < e->n_lora_slots; i++) {
        free(e->lora[i].name);
        free(e->lora[i].path);
    }
    for (int32_t i = 0; e->lora_parked && i < e->n_lora_parked; i++) {
        free(e->lora_parked[i].name);
        free(e->lora_parked[i].path);
    }
    free(e->lora);
    free(e->lora_used_ns);
    free(e->lora_parked);
    e->lora = e->lora_parked = NULL;
    e->lora_used_ns = NULL;
    pthread_mutex_destroy(&e->lora_mu);
    pthread_cond_destroy(&e->lora_cv);
}

// Reads an adapter as a slot would (its files, shapes, rank), then drops it.
static int check_adapter(pg_engine *e, const char *path) {
    pg_lora_adapter *a = NULL;
    PG_TRY(pg_lora_adapter_load(path, &e->model->cfg, pg_engine_max_lora_rank(&e->cfg), &a));
    pg_lora_adapter_free(a);
    return 0;
}

int eng_lora_check(pg_engine *e) {
    for (int32_t i = 0; i < e->n_lora_parked; i++) PG_TRY(check_adapter(e, e->lora_parked[i].path));
    return 0;
}

// The parked adapter named `name` (or of id uid when name is NULL), or -1
// (lora_mu held).
static int32_t parked_of(const pg_engine *e, const char *name, int64_t uid) {
    for (int32_t i = 0; i < e->n_lora_parked; i++)
        if (name ? !strcmp(e->lora_parked[i].name, name) : e->lora_parked[i].uid == uid) return i;
    return -1;
}

static int32_t n_known(const pg_engine *e) {
    int32_t n = e->n_lora_parked;
    for (int32_t i = 0; i < e->n_lora_slots; i++) n += e->lora[i].uid != 0;
    return n;
}

// The slot serving `name`, or -1 (lora_mu held).
static int32_t slot_of(const pg_engine *e, const char *name) {
    for (int32_t i = 0; i < e->n_lora_slots; i++)
        if (e->lora[i].uid && !strcmp(e->lora[i].name, name)) return i;
    return -1;
}

int64_t pg_engine_lora_find(pg_engine *e, const char *name) {
    pthread_mutex_lock(&e->lora_mu);
    const int32_t s = slot_of(e, name), p = s >= 0 ? -1 : parked_of(e, name, 0);
    const int64_t uid = s >= 0 ? e->lora[s].uid : p >= 0 ? e->lora_parked[p].uid : 0;
    pthread_mutex_unlock(&e->lora_mu);
    return uid;
}

void pg_engine_lora_list(pg_engine *e, void (*fn)(void *ctx, const char *name, const char *path), void *ctx) {
    pthread_mutex_lock(&e->lora_mu);
    for (int32_t i = 0; i < e->n_lora_slots; i++)
        if (e->lora[i].uid) fn(ctx, e->lora[i].name, e->lora[i].path);
    for (int32_t i = 0; i < e->n_lora_parked; i++) fn(ctx, e->lora_parked[i].name, e->lora_parked[i].path);
    pthread_mutex_unlock(&e->lora_mu);
}

void pg_engine_lora_names(pg_engine *e, uint64_t slot_mask, char *buf, size_t cap) {
    if (!cap) return;
    buf[0] = 0;
    size_t n = 0;
    pthread_mutex_lock(&e->lora_mu);
    for (int32_t i = 0; i < e->n_lora_slots && i < 64; i++)
        if ((slot_mask >> i & 1) && e->lora[i].uid) {
            int w = snprintf(buf + n, cap - n, "%s%s", n ? "," : "", e->lora[i].name);
            if (w < 0 || (size_t)w >= cap - n) break; // truncated: keep what fits
            n += (size_t)w;
        }
    pthread_mutex_unlock(&e->lora_mu);
}

int32_t eng_lora_slot(pg_engine *e, int64_t uid) {
    if (uid == 0) return -1;
    pthread_mutex_lock(&e->lora_mu);
    int32_t slot = -2;
    for (int32_t i = 0; i < e->n_lora_slots; i++)
        if (e->lora[i].uid == uid) slot = i;
    if (slot == -2 && parked_of(e, NULL, uid) >= 0) slot = -3;
    if (slot >= 0) e->lora_used_ns[slot] = pg_now_ns();
    pthread_mutex_unlock(&e->lora_mu);
    return slot;
}

// sched_for_each_owner's callback: counts the live requests of one slot.
typedef struct {
    int32_t slot, n;
} slot_count;

static void count_slot(void *owner, void *ctx) {
    slot_count *c = ctx;
    if (((const live *)owner)->lora_slot == c->slot) c->n++;
}

static int32_t live_in_slot(pg_engine *e, int32_t slot) {
    slot_count c = {slot, 0};
    sched_for_each_owner(e->sched, count_slot, &c);
    return c.n;
}

int eng_lora_make_resident(pg_engine *e, int64_t uid, int32_t *slot) {
    *slot = -1;
    // A free slot, else the least recently used one that no live request
    // uses (its adapter is parked: its prefix-cache blocks stay valid, being
    // keyed by the adapter's id, not the slot).
    int32_t v = -1;
    for (int32_t i = 0; i < e->n_lora_slots && v < 0; i++)
        if (!e->lora[i].uid) v = i;
    if (v < 0)
        for (int32_t i = 0; i < e->n_lora_slots; i++)
            if (live_in_slot(e, i) == 0 && (v < 0 || e->lora_used_ns[i] < e->lora_used_ns[v])) v = i;
    if (v < 0) return 0; // every slot serves live requests: wait
    pthread_mutex_lock(&e->lora_mu);
    const int32_t p = parked_of(e, NULL, uid);
    eng_lora in = p >= 0 ? e->lora_parked[p] : (eng_lora){0};
    pthread_mutex_unlock(&e->lora_mu);
    if (p < 0) return pg_err_set(PG_EINVAL, "the LoRA adapter this request names was unloaded");
    const int rc = pg_executor_lora_set(e->exec, v, in.path);
    pthread_mutex_lock(&e->lora_mu);
    const eng_lora out = e->lora[v];
    // The slot's adapter (if any) takes the parked place of the one coming
    // in, so the known count never changes. A failed load leaves the slot
    // empty, the new adapter parked and the old one parked beside it (the
    // place it held in the slot is counted in --max-cpu-loras).
    if (rc == 0) {
        e->lora[v] = in;
        if (out.uid)
            e->lora_parked[p] = out;
        else
            e->lora_parked[p] = e->lora_parked[--e->n_lora_parked];
        e->lora_used_ns[v] = pg_now_ns();
    } else {
        e->lora[v] = (eng_lora){0};
        if (out.uid) e->lora_parked[e->n_lora_parked++] = out; // room: the slot's place was counted
    }
    pthread_mutex_unlock(&e->lora_mu);
    if (rc < 0) return rc;
    if (out.uid)
        PG_LOGI("LoRA adapter '%s' into slot %d in place of '%s' (least recently used)", in.name, v, out.name);
    else
        PG_LOGI("LoRA adapter '%s' into slot %d", in.name, v);
    *slot = v;
    return 0;
}

static int do_load(pg_engine *e, const char *name, const char *path) {
    pthread_mutex_lock(&e->lora_mu);
    int32_t free_slot = -1;
    for (int32_t i = e->n_lora_slots - 1; i >= 0; i--)
        if (!e->lora[i].uid) free_slot = i;
    const bool taken = slot_of(e, name) >= 0 || parked_of(e, name, 0) >= 0;
    const int32_t known = n_known(e);
    pthread_mutex_unlock(&e->lora_mu);
    if (taken) return pg_err_set(PG_EINVAL, "The lora adapter '%s' has already been loaded.", name);
    if (known >= e->lora_known_cap)
        return pg_err_set(PG_EINVAL,
                          "no room for LoRA adapter '%s': %d adapters are loaded (--max-cpu-loras %d); unload one",
                          name, known, e->lora_known_cap);
    if (free_slot < 0) {
        // Known, not in a slot: read once now (a bad directory is refused
        // here, naming its file), brought into a slot by its first request.
        PG_TRY(check_adapter(e, path));
        pthread_mutex_lock(&e->lora_mu);
        e->lora_parked[e->n_lora_parked++] =
            (eng_lora){.uid = ++e->lora_next_uid, .name = pg_xstrdup(name), .path = pg_xstrdup(path)};
        pthread_mutex_unlock(&e->lora_mu);
        PG_LOGI("LoRA adapter '%s' loaded from %s (in no slot until a request names it)", name, path);
        return 0;
    }
    PG_TRY(pg_executor_lora_set(e->exec, free_slot, path));
    pthread_mutex_lock(&e->lora_mu);
    e->lora[free_slot] = (eng_lora){.uid = ++e->lora_next_uid, .name = pg_xstrdup(name), .path = pg_xstrdup(path)};
    pthread_mutex_unlock(&e->lora_mu);
    PG_LOGI("LoRA adapter '%s' loaded from %s (slot %d)", name, path, free_slot);
    return 0;
}

static int do_unload(pg_engine *e, const char *name) {
    pthread_mutex_lock(&e->lora_mu);
    const int32_t slot = slot_of(e, name), p = slot >= 0 ? -1 : parked_of(e, name, 0);
    eng_lora gone = p >= 0 ? e->lora_parked[p] : (eng_lora){0};
    if (p >= 0) e->lora_parked[p] = e->lora_parked[--e->n_lora_parked];
    pthread_mutex_unlock(&e->lora_mu);
    if (p >= 0) { // in no slot: nothing runs it
        PG_LOGI("LoRA adapter '%s' unloaded", name);
        free(gone.name);
        free(gone.path);
        return 0;
    }
    if (slot < 0) return pg_err_set(PG_ENOTFOUND, "The lora adapter '%s' cannot be found.", name);
    slot_count c = {slot, 0};
    sched_for_each_owner(e->sched, count_slot, &c);
    if (c.n > 0)
        return pg_err_set(PG_ENOSPC, "The lora adapter '%s' is in use by %d request%s; unload it when they end.",
                          name, c.n, c.n == 1 ? "" : "s");
    // Gone for new requests first, then the weights.
    pthread_mutex_lock(&e->lora_mu);
    eng_lora old = e->lora[slot];
    e->lora[slot] = (eng_lora){0};
    pthread_mutex_unlock(&e->lora_mu);
    int rc = pg_executor_lora_set(e->exec, slot, NULL);
    free(old.name);
    free(old.path);
    if (rc == 0) PG_LOGI("LoRA adapter '%s' unloaded (slot %d)", name, slot);
    return rc;
}

void eng_lora_apply(pg_engine *e, lora_cmd *c) {
    int rc = c->path ? do_load(e, c->name, c->path) : do_unload(e, c->name);
    pthread_mutex_lock(&e->mu);
    c->rc = rc;
    if (rc < 0) snprintf(c->err, sizeof c->err, "%s", pg_err_msg());
    c->done = true;
    pthread_cond_broadcast(&e->lora_cv);
    pthread_mutex_unlock(&e->mu);
}

// Queues the command and waits for the engine thread to apply it.
static int run_cmd(pg_engine *e, lora_cmd *c) {
    if (e->n_lora_slots == 0) return pg_err_set(PG_EINVAL, "LoRA is off: start the server with --enable-lora");
    sub *s = pg_xcalloc(1, sizeof *s);
    s->kind = SUB_LORA;
    s->lora = c;
    pthread_mutex_lock(&e->mu);
    eng_enqueue_locked(e, s);
    while (!c->done && !e->stop) pthread_cond_wait(&e->lora_cv, &e->mu);
    const bool done = c->done;
    pthread_mutex_unlock(&e->mu);
    if (!done) return pg_err_set(PG_EIO, "the engine stopped before the LoRA change");
    return c->rc < 0 ? pg_err_set(c->rc, "%s", c->err) : 0;
}

int pg_engine_lora_load(pg_engine *e, const char *name, const char *path) {
    lora_cmd c = {.name = name, .path = path};
    return run_cmd(e, &c);
}

int pg_engine_lora_unload(pg_engine *e, const char *name) {
    lora_cmd c = {.name = name};
    return run_cmd(e, &c);
}
