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

#include "common/err.h"
#include "common/log.h"
#include "engine/engine_int.h"

void eng_lora_init(pg_engine *e) {
    pthread_mutex_init(&e->lora_mu, NULL);
    pthread_cond_init(&e->lora_cv, NULL);
    e->n_lora_slots = pg_engine_lora_slots(&e->cfg);
    e->lora = pg_xcalloc((size_t)(e->n_lora_slots > 0 ? e->n_lora_slots : 1), sizeof(eng_lora));
    // (More adapters named than slots is refused by set-up, with its reason.)
    for (int32_t i = 0; i < e->cfg.n_lora && i < e->n_lora_slots; i++)
        e->lora[i] = (eng_lora){.uid = ++e->lora_next_uid, .name = pg_xstrdup(e->cfg.lora_names[i]),
                                .path = pg_xstrdup(e->cfg.lora_paths[i])};
}

void eng_lora_free(pg_engine *e) {
    for (int32_t i = 0; e->lora && i < e->n_lora_slots; i++) {
        free(e->lora[i].name);
        free(e->lora[i].path);
    }
    free(e->lora);
    e->lora = NULL;
    pthread_mutex_destroy(&e->lora_mu);
    pthread_cond_destroy(&e->lora_cv);
}

// The slot serving `name`, or -1 (lora_mu held).
static int32_t slot_of(const pg_engine *e, const char *name) {
    for (int32_t i = 0; i < e->n_lora_slots; i++)
        if (e->lora[i].uid && !strcmp(e->lora[i].name, name)) return i;
    return -1;
}

int64_t pg_engine_lora_find(pg_engine *e, const char *name) {
    pthread_mutex_lock(&e->lora_mu);
    const int32_t s = slot_of(e, name);
    const int64_t uid = s >= 0 ? e->lora[s].uid : 0;
    pthread_mutex_unlock(&e->lora_mu);
    return uid;
}

void pg_engine_lora_list(pg_engine *e, void (*fn)(void *ctx, const char *name, const char *path), void *ctx) {
    pthread_mutex_lock(&e->lora_mu);
    for (int32_t i = 0; i < e->n_lora_slots; i++)
        if (e->lora[i].uid) fn(ctx, e->lora[i].name, e->lora[i].path);
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

static int do_load(pg_engine *e, const char *name, const char *path) {
    pthread_mutex_lock(&e->lora_mu);
    int32_t free_slot = -1;
    for (int32_t i = e->n_lora_slots - 1; i >= 0; i--)
        if (!e->lora[i].uid) free_slot = i;
    const bool taken = slot_of(e, name) >= 0;
    pthread_mutex_unlock(&e->lora_mu);
    if (taken) return pg_err_set(PG_EINVAL, "The lora adapter '%s' has already been loaded.", name);
    if (free_slot < 0)
        return pg_err_set(PG_EINVAL, "no free LoRA slot for '%s': all %d (--max-loras) hold adapters; unload one",
                          name, e->n_lora_slots);
    PG_TRY(pg_executor_lora_set(e->exec, free_slot, path));
    pthread_mutex_lock(&e->lora_mu);
    e->lora[free_slot] = (eng_lora){.uid = ++e->lora_next_uid, .name = pg_xstrdup(name), .path = pg_xstrdup(path)};
    pthread_mutex_unlock(&e->lora_mu);
    PG_LOGI("LoRA adapter '%s' loaded from %s (slot %d)", name, path, free_slot);
    return 0;
}

static int do_unload(pg_engine *e, const char *name) {
    pthread_mutex_lock(&e->lora_mu);
    const int32_t slot = slot_of(e, name);
    pthread_mutex_unlock(&e->lora_mu);
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
    if (e->subs_tail)
        e->subs_tail->next = s;
    else
        e->subs_head = s;
    e->subs_tail = s;
    pthread_cond_signal(&e->cv);
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
