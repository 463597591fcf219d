// kvpool/kvpool.c - block pool: free list, ref counts, prefix cache, tables.
//
// Data structures (all O(1) per block operation):
//   - blocks[]: per device block its ref count, free-list links and its
//     prefix-cache hash; blocks[num_blocks] is the free list's sentinel.
//   - map: open addressing (linear probing, backward-shift deletion) from a
//     128-bit hash to the block id holding it; at most one block per hash.
//   - host blocks: the same metadata, their own free list and map (the host
//     tier: evicted prefix blocks stay findable by hash in host memory).
//   - holds: host blocks a plan's moves read or write, kept out of the free
//     list until kvp_release_holds (host tier only).
//   - scratch arrays (one int per block, all zero between calls) for the
//     de-duplicating passes of kvp_grow_cost and the swaps.
//   - tables: rows of one entry per layer group, row-major (allocation
//     goes row by row, so one group and no window is the plain pool); a
//     windowed group's dropped blocks are null entries, a prefix of its
//     column. Each group keys its blocks by kvpi_group_key of the token
//     hash, in the device and host maps alike.
//
// Swap, the host tier's plan moves and kvp_check live in kvpool_swap.c.
#include "kvpool/kvpool.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/err.h"
#include "kvpool/kvpool_int.h"

// Parent of a sequence's first block.
static const kvp_hash ROOT_HASH = {0x9e3779b97f4a7c15ull, 0x6a09e667f3bcc909ull};

// ---------------------------------------------------------------------------
// Free list (doubly linked through blocks[], sentinel at index n)

// `a` is blocks[] or hblocks[]; `sent` its sentinel index (n or n_host).
static void fl_unlink(blk *a, int32_t b) {
    blk *x = &a[b];
    a[x->prev].next = x->next;
    a[x->next].prev = x->prev;
}

static void fl_insert_after(blk *a, int32_t at, int32_t b) {
    blk *x = &a[b];
    x->prev = at;
    x->next = a[at].next;
    a[x->next].prev = b;
    a[at].next = b;
}

static void fl_push_tail(blk *a, int32_t sent, int32_t b) { fl_insert_after(a, a[sent].prev, b); }
static void fl_push_head(blk *a, int32_t sent, int32_t b) { fl_insert_after(a, sent, b); }

// ---------------------------------------------------------------------------
// Prefix-cache map

static void map_init(kvmap *m, int32_t n_blocks) {
    uint64_t slots = 16;
    while (slots < 2 * (uint64_t)n_blocks) slots *= 2;
    m->s = pg_xmalloc(sizeof(map_slot) * slots);
    for (uint64_t i = 0; i < slots; i++) m->s[i].id = -1;
    m->mask = slots - 1;
    m->n = 0;
}

// Block id holding `h`, or -1.
int32_t kvpi_map_find(const kvmap *m, kvp_hash h) {
    for (uint64_t i = h.lo & m->mask;; i = (i + 1) & m->mask) {
        const map_slot *s = &m->s[i];
        if (s->id < 0) return -1;
        if (s->lo == h.lo && s->hi == h.hi) return s->id;
    }
}

static void map_insert(kvmap *m, kvp_hash h, int32_t id) {
    uint64_t i = h.lo & m->mask;
    while (m->s[i].id >= 0) i = (i + 1) & m->mask;
    m->s[i] = (map_slot){h.lo, h.hi, id};
    m->n++;
}

// Removes `h` (which must be present), shifting later probes back so that
// no tombstones are needed.
static void map_remove(kvmap *m, kvp_hash h) {
    uint64_t i = h.lo & m->mask;
    while (!(m->s[i].lo == h.lo && m->s[i].hi == h.hi)) {
        PG_CHECK(m->s[i].id >= 0);
        i = (i + 1) & m->mask;
    }
    for (uint64_t j = (i + 1) & m->mask;; j = (j + 1) & m->mask) {
        if (m->s[j].id < 0) break;
        uint64_t home = m->s[j].lo & m->mask;
        // Entry j may move to the hole i if its home is not in (i, j].
        bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        m->s[i] = m->s[j];
        i = j;
    }
    m->s[i].id = -1;
    m->n--;
}

// ---------------------------------------------------------------------------
// Hashing

static kvp_hash hash_block(kvp_pool *p, kvp_hash parent, const int32_t *tokens) {
    memcpy(p->hbuf, &parent.lo, 8);
    memcpy(p->hbuf + 8, &parent.hi, 8);
    memcpy(p->hbuf + 16, tokens, sizeof(int32_t) * (size_t)p->bs);
    XXH128_hash_t h = XXH3_128bits(p->hbuf, 16 + sizeof(int32_t) * (size_t)p->bs);
    return (kvp_hash){h.low64, h.high64};
}

// Extends t->hashes to cover the first `n_blocks` full blocks of `tokens`.
static void ensure_hashes(kvp_pool *p, kvp_table *t, const int32_t *tokens, int32_t n_blocks) {
    if (t->n_hashes >= n_blocks) return;
    if (n_blocks > t->hash_cap) {
        int32_t cap = t->hash_cap ? t->hash_cap : 8;
        while (cap < n_blocks) cap *= 2;
        t->hashes = pg_xrealloc(t->hashes, sizeof(kvp_hash) * (size_t)cap);
        t->hash_cap = cap;
    }
    for (int32_t i = t->n_hashes; i < n_blocks; i++) {
        kvp_hash parent = i ? t->hashes[i - 1] : ROOT_HASH;
        if (i == 0 && t->salt) parent.lo ^= t->salt * 0xd1b54a32d192ed03ull, parent.hi += t->salt;
        t->hashes[i] = hash_block(p, parent, tokens + (size_t)i * (size_t)p->bs);
    }
    t->n_hashes = n_blocks;
}

// Enters block b (held) under hash h, unless h is cached already (another
// block computed the same content) or b already has a hash.
void kvpi_cache_offer(kvp_pool *p, int32_t b, kvp_hash h) {
    blk *x = &p->blocks[b];
    if (x->hashed || kvpi_map_find(&p->map, h) >= 0) return;
    map_insert(&p->map, h, b);
    x->hashed = true;
    x->hash = h;
}

// ---------------------------------------------------------------------------
// Device and host block primitives

// Host block h (ref 0, in the host free list) leaves the list.
static void host_unlink(kvp_pool *p, int32_t h) {
    fl_unlink(p->hblocks, h);
    p->n_host_free--;
    if (p->hblocks[h].hashed) p->n_host_cached_free--;
}

// Host block h has no owner left: back in the host free list, a cached one
// at the tail (host LRU), an empty one at the head.
void kvpi_host_to_free(kvp_pool *p, int32_t h) {
    p->n_host_free++;
    if (p->hblocks[h].hashed) {
        p->n_host_cached_free++;
        fl_push_tail(p->hblocks, p->n_host, h);
    } else {
        fl_push_head(p->hblocks, p->n_host, h);
    }
}

// One more ref on host block h, owned by the current plan (its moves read
// or write h) until kvp_release_holds: no other move of the plan may
// overwrite it.
static void held_push(kvp_pool *p, int32_t h) {
    if (p->n_held == p->held_cap) {
        p->held_cap = p->held_cap ? p->held_cap * 2 : 16;
        p->held = pg_xrealloc(p->held, sizeof(int32_t) * (size_t)p->held_cap);
    }
    p->held[p->n_held++] = h;
}

static void host_hold(kvp_pool *p, int32_t h) {
    if (p->hblocks[h].ref++ == 0) host_unlink(p, h);
    held_push(p, h);
}

// Pops the host free-list head (evicting its host-cached hash) with ref 1.
int32_t kvpi_host_alloc(kvp_pool *p) {
    int32_t h = p->hblocks[p->n_host].next;
    PG_CHECK(h != p->n_host);
    host_unlink(p, h);
    blk *x = &p->hblocks[h];
    if (x->hashed) {
        map_remove(&p->hmap, x->hash);
        x->hashed = false;
        p->host_evictions++;
    }
    x->ref = 1;
    return h;
}

void kvpi_host_decref(kvp_pool *p, int32_t h) {
    PG_CHECK(h >= 0 && h < p->n_host && p->hblocks[h].ref > 0);
    if (p->hblocks[h].ref > 1) {
        p->hblocks[h].ref--;
    } else if (p->tier) {
        // With the host tier any allocation of this plan may take a free
        // host block as an offload's destination: the last ref goes to the
        // plan so that a block a swap-in of this plan still reads is never
        // written by its swap-outs (which run first).
        held_push(p, h); // the ref stays, owned by the plan now
    } else {
        p->hblocks[h].ref = 0;
        kvpi_host_to_free(p, h);
    }
}

// Copies device block b (hashed, not on the host) to a host block, findable
// there by its hash; the move is one of this plan's swap-outs, so it runs
// before anything of the plan writes b. False (nothing done) when every host
// block is held, or with host_tier_reused_only for a block never hit.
bool kvpi_offload_copy(kvp_pool *p, int32_t b) {
    kvp_hash h = p->blocks[b].hash;
    if (p->n_host_free == 0) return false; // every host block is held: forget it
    if (p->cfg.host_tier_reused_only && !p->blocks[b].reused) return false; // never hit: not worth the copy
    int32_t hb = kvpi_host_alloc(p);
    held_push(p, hb); // its ref: written by this plan
    p->hblocks[hb].hashed = true;
    p->hblocks[hb].hash = h;
    map_insert(&p->hmap, h, hb);
    kvpi_moves_push(&p->tier_out, b, hb);
    p->offloads++;
    return true;
}

// Device block b (hashed, ref 0) is being evicted: with the host tier and
// host room, its content goes to a host block first, unless the host has it
// already (it came from there, or was copied ahead).
static void offload(kvp_pool *p, int32_t b) {
    int32_t hb = kvpi_map_find(&p->hmap, p->blocks[b].hash);
    if (hb >= 0) { // refresh its LRU place
        if (p->hblocks[hb].ref == 0) {
            fl_unlink(p->hblocks, hb);
            fl_push_tail(p->hblocks, p->n_host, hb);
        }
        return;
    }
    kvpi_offload_copy(p, b);
}

// Pops the free-list head (evicting its cached hash) with ref 1.
int32_t kvpi_block_alloc(kvp_pool *p) {
    int32_t b = p->blocks[p->n].next;
    PG_CHECK(b != p->n);
    fl_unlink(p->blocks, b);
    p->n_free--;
    p->plan_allocs++;
    blk *x = &p->blocks[b];
    if (x->hashed) {
        if (p->tier) offload(p, b);
        map_remove(&p->map, x->hash);
        x->hashed = false;
        x->reused = false;
        p->n_cached_free--;
        p->evictions++;
    }
    x->ref = 1;
    return b;
}

// Adds an owner to block b, taking it out of the free list if needed.
static void block_incref(kvp_pool *p, int32_t b) {
    blk *x = &p->blocks[b];
    if (x->ref == 0) {
        fl_unlink(p->blocks, b);
        p->n_free--;
        if (x->hashed) p->n_cached_free--;
    }
    x->ref++;
}

void kvpi_block_decref(kvp_pool *p, int32_t b) {
    blk *x = &p->blocks[b];
    PG_CHECK(b > 0 && x->ref > 0);
    if (--x->ref > 0) return;
    p->n_free++;
    if (x->hashed) {
        p->n_cached_free++;
        fl_push_tail(p->blocks, p->n, b); // keep for reuse as long as possible (LRU)
    } else {
        fl_push_head(p->blocks, p->n, b); // nothing worth keeping: hand out first
    }
}

void kvpi_moves_push(kvp_moves *m, int32_t from, int32_t to) {
    if (m->n == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 16;
        m->v = pg_xrealloc(m->v, sizeof(kvp_move) * (size_t)m->cap);
    }
    m->v[m->n++] = (kvp_move){from, to};
}

// Room for n_rows rows of G entries (one per group).
static void table_reserve(const kvp_pool *p, kvp_table *t, int32_t n_rows) {
    if (n_rows <= t->cap) return;
    int32_t cap = t->cap ? t->cap : 4;
    while (cap < n_rows) cap *= 2;
    t->blocks = pg_xrealloc(t->blocks, sizeof(int32_t) * (size_t)cap * (size_t)p->G);
    t->cap = cap;
}

static int32_t cdiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

// The first block group g still needs for a query at position `pos`: the
// one holding pos - window + 1, the earliest key the query sees (0 for a
// full group).
static int32_t window_first(const kvp_pool *p, int32_t g, int64_t pos) {
    int64_t first = pos - p->win[g] + 1;
    if (p->win[g] == 0 || first <= 0) return 0;
    return (int32_t)(first / p->bs);
}

// ---------------------------------------------------------------------------
// Pool

void kvp_config_default(kvp_config *c) {
    memset(c, 0, sizeof *c);
    c->block_size = 16;
    c->enable_prefix_caching = true;
}

int kvp_create(const kvp_config *cfg, kvp_pool **out) {
    *out = NULL;
    if (cfg->num_blocks < 2)
        return pg_err_set(PG_EINVAL, "kvpool: num_blocks %d < 2 (block 0 is reserved)",
                          cfg->num_blocks);
    if (cfg->block_size < 1 || cfg->block_size > 4096)
        return pg_err_set(PG_EINVAL, "kvpool: block_size %d out of [1, 4096]", cfg->block_size);
    if (cfg->num_host_blocks < 0)
        return pg_err_set(PG_EINVAL, "kvpool: num_host_blocks %d < 0", cfg->num_host_blocks);
    if (cfg->num_blocks > (1 << 30) || cfg->num_host_blocks > (1 << 30))
        return pg_err_set(PG_EINVAL, "kvpool: too many blocks");
    if (cfg->n_groups < 0 || cfg->n_groups > KVP_MAX_GROUPS)
        return pg_err_set(PG_EINVAL, "kvpool: n_groups %d out of [1, %d] (0 counts as 1)",
                          cfg->n_groups, KVP_MAX_GROUPS);
    const int32_t n_groups = cfg->n_groups > 0 ? cfg->n_groups : 1;
    for (int32_t g = 0; g < n_groups; g++)
        if (cfg->group_window[g] < 0)
            return pg_err_set(PG_EINVAL, "kvpool: group %d window %d < 0 (0: full attention)", g,
                              cfg->group_window[g]);

    kvp_pool *p = pg_xcalloc(1, sizeof *p);
    p->cfg = *cfg;
    p->bs = cfg->block_size;
    p->G = n_groups;
    for (int32_t g = 0; g < n_groups; g++) {
        p->win[g] = cfg->group_window[g];
        p->windowed |= p->win[g] > 0;
    }
    p->n = cfg->num_blocks;
    p->n_host = cfg->num_host_blocks;
    p->tier = cfg->enable_host_tier && cfg->enable_prefix_caching && p->n_host > 0;
    p->blocks = pg_xcalloc((size_t)p->n + 1, sizeof(blk));
    p->hblocks = pg_xcalloc((size_t)p->n_host + 1, sizeof(blk));
    p->dev_scratch = pg_xcalloc((size_t)p->n, sizeof(int32_t));
    p->host_scratch = pg_xcalloc((size_t)p->n_host, sizeof(int32_t));
    p->hbuf = pg_xmalloc(16 + sizeof(int32_t) * (size_t)p->bs);

    // Free lists 1, 2, ..., n-1 and 0, ..., n_host-1 so that allocation
    // hands out ascending ids.
    blk *s = &p->blocks[p->n];
    s->prev = s->next = p->n;
    for (int32_t b = 1; b < p->n; b++) fl_push_tail(p->blocks, p->n, b);
    p->n_free = p->n - 1;
    s = &p->hblocks[p->n_host];
    s->prev = s->next = p->n_host;
    for (int32_t h = 0; h < p->n_host; h++) fl_push_tail(p->hblocks, p->n_host, h);
    p->n_host_free = p->n_host;

    map_init(&p->map, p->n);
    map_init(&p->hmap, p->tier ? p->n_host : 0);
    *out = p;
    return 0;
}

void kvp_destroy(kvp_pool *p) {
    if (!p) return;
    free(p->blocks);
    free(p->hblocks);
    free(p->dev_scratch);
    free(p->host_scratch);
    free(p->hbuf);
    free(p->map.s);
    free(p->hmap.s);
    free(p->held);
    kvp_moves_fini(&p->tier_out);
    kvp_moves_fini(&p->tier_in);
    free(p);
}

int32_t kvp_block_size(const kvp_pool *p) { return p->bs; }
int32_t kvp_num_usable(const kvp_pool *p) { return p->n - 1; }
int32_t kvp_num_groups(const kvp_pool *p) { return p->G; }

int32_t kvp_group_window(const kvp_pool *p, int32_t g) {
    PG_CHECK(g >= 0 && g < p->G);
    return p->win[g];
}

int64_t kvp_blocks_for(const kvp_pool *p, int64_t n_tokens, int32_t chunk) {
    return kvp_config_blocks_for(&p->cfg, n_tokens, chunk);
}
int64_t kvp_group_blocks_for(const kvp_pool *p, int32_t g, int64_t n_tokens, int32_t chunk) {
    PG_CHECK(g >= 0 && g < kvp_num_groups(p));
    return kvp_config_group_blocks_for(&p->cfg, g, n_tokens, chunk);
}
int32_t kvp_num_free(const kvp_pool *p) { return p->n_free; }
int32_t kvp_num_host_free(const kvp_pool *p) { return p->n_host_free; }
int32_t kvp_num_host_blocks(const kvp_pool *p) { return p->n_host; }
bool kvp_prefix_caching(const kvp_pool *p) { return p->cfg.enable_prefix_caching; }

int32_t kvp_block_ref(const kvp_pool *p, int32_t id) {
    PG_CHECK(id >= 0 && id < p->n);
    return p->blocks[id].ref;
}

int32_t kvp_host_ref(const kvp_pool *p, int32_t id) {
    PG_CHECK(id >= 0 && id < p->n_host);
    return p->hblocks[id].ref;
}

bool kvp_host_cached(const kvp_pool *p, int32_t id) {
    PG_CHECK(id >= 0 && id < p->n_host);
    return p->hblocks[id].hashed;
}

bool kvp_host_tier(const kvp_pool *p) { return p->tier; }

bool kvp_block_cached(const kvp_pool *p, int32_t id) {
    PG_CHECK(id >= 0 && id < p->n);
    return p->blocks[id].hashed;
}

void kvp_stats_get(const kvp_pool *p, kvp_stats *o) {
    memset(o, 0, sizeof *o);
    o->num_blocks = p->n - 1;
    o->num_free = p->n_free;
    o->num_used = p->n - 1 - p->n_free;
    o->num_cached = p->map.n;
    o->num_cached_free = p->n_cached_free;
    o->usage = (double)o->num_used / (double)o->num_blocks;
    o->num_host_blocks = p->n_host;
    o->num_host_free = p->n_host_free;
    o->num_host_cached = p->hmap.n;
    o->num_host_cached_free = p->n_host_cached_free;
    o->num_host_used = p->n_host - p->n_host_free;
    // Cached host blocks count as used: they hold KV worth keeping (the
    // device's usage, by contrast, counts only blocks tables hold).
    o->host_usage = p->n_host ? (double)(p->n_host - p->n_host_free + p->n_host_cached_free) / p->n_host : 0.0;
    o->prefix_queries = p->prefix_queries;
    o->prefix_hits = p->prefix_hits;
    o->evictions = p->evictions;
    o->host_hits = p->host_hits;
    o->offloads = p->offloads;
    o->offloads_ahead = p->offloads_ahead;
    o->host_evictions = p->host_evictions;
}

// ---------------------------------------------------------------------------
// Tables

void kvp_table_init(kvp_table *t) { memset(t, 0, sizeof *t); }

void kvp_table_set_salt(kvp_table *t, uint64_t salt) {
    PG_CHECK(t->n_hashes == 0);
    t->salt = salt;
}

void kvp_table_fini(kvp_table *t) {
    PG_CHECK(t->n_blocks == 0);
    free(t->blocks);
    free(t->hashes);
    memset(t, 0, sizeof *t);
}

// Whether group g's block of token hash h is cached on the device or, with
// the host tier, on the host (kvp_grow loads it).
static bool block_present(const kvp_pool *p, kvp_hash h, int32_t g) {
    kvp_hash key = kvpi_group_key(h, g);
    return kvpi_map_find(&p->map, key) >= 0 || (p->tier && kvpi_map_find(&p->hmap, key) >= 0);
}

int32_t kvp_table_lookup(kvp_pool *p, kvp_table *t, const int32_t *tokens, int32_t n_tokens) {
    if (!p->cfg.enable_prefix_caching || t->n_blocks > 0 || n_tokens <= 0) return 0;
    int32_t max_blocks = (n_tokens - 1) / p->bs;
    ensure_hashes(p, t, tokens, max_blocks);
    // A full group needs every block of the prefix: it ends at the first
    // block some full group lacks.
    int32_t hits = max_blocks;
    for (int32_t g = 0; g < p->G; g++) {
        if (p->win[g] != 0) continue;
        int32_t j = 0;
        while (j < hits && block_present(p, t->hashes[j], g)) j++;
        hits = j;
    }
    // A windowed group needs only the blocks its window sees from the first
    // position left to compute, hits * bs. Where one lacks block j, every
    // prefix of (j, hits] blocks needs it too: continue below j.
    while (p->windowed && hits > 0) {
        int32_t miss = -1;
        for (int32_t g = 0; g < p->G && miss < 0; g++) {
            if (p->win[g] == 0) continue;
            int32_t lo = window_first(p, g, (int64_t)hits * p->bs);
            for (int32_t j = hits - 1; j >= lo; j--)
                if (!block_present(p, t->hashes[j], g)) {
                    miss = j;
                    break;
                }
        }
        if (miss < 0) break;
        hits = miss;
    }
    return hits;
}

void kvp_note_lookup(kvp_pool *p, int32_t n_query_tokens, int32_t n_hit_tokens) {
    if (!p->cfg.enable_prefix_caching) return;
    p->prefix_queries += n_query_tokens;
    p->prefix_hits += n_hit_tokens;
}

// Walks the batch like kvp_grow would, counting consumed free blocks in
// *cost; `reset` clears the scratch marks left by a counting pass instead.
static void grow_walk(const kvp_pool *p, const kvp_grow_item *items, int32_t n, int32_t *cost,
                      bool reset) {
    const int32_t bs = p->bs, G = p->G;
    for (int32_t i = 0; i < n; i++) {
        const kvp_table *t = items[i].t;
        int32_t n_tok = t->n_tokens, n_blk = t->n_blocks, k = items[i].n_hits;
        if (k > 0) {
            PG_CHECK(t->n_blocks == 0 && !t->swapped && k <= t->n_hashes);
            for (int32_t g = 0; g < G; g++)
                for (int32_t j = window_first(p, g, (int64_t)k * bs); j < k; j++) {
                    kvp_hash key = kvpi_group_key(t->hashes[j], g);
                    int32_t b = kvpi_map_find(&p->map, key);
                    if (b < 0) { // on the host only: one device block to load it into
                        int32_t h = p->tier ? kvpi_map_find(&p->hmap, key) : -1;
                        PG_CHECK(h >= 0);
                        if (reset) {
                            p->host_scratch[h] = 0;
                        } else if (p->host_scratch[h]++ == 0) {
                            (*cost)++;
                        }
                    } else if (reset) {
                        p->dev_scratch[b] = 0;
                    } else if (p->dev_scratch[b]++ == 0 && p->blocks[b].ref == 0) {
                        (*cost)++; // leaves the free list
                    }
                }
            n_tok = k * bs;
            n_blk = k;
        }
        if (items[i].n_new <= 0) continue;
        for (int32_t g = 0; n_tok % bs != 0 && g < G; g++) {
            // Partial tail: the k-th writer copies while others still hold it.
            int32_t tail = t->blocks[(n_blk - 1) * G + g];
            PG_CHECK(!kvpi_entry_null(t, tail)); // slid past positions still to be written
            int32_t *scratch = t->swapped ? p->host_scratch : p->dev_scratch;
            int32_t ref = t->swapped ? p->hblocks[tail].ref : p->blocks[tail].ref;
            if (reset) {
                scratch[tail] = 0;
            } else if (++scratch[tail] < ref) {
                (*cost)++;
            }
        }
        if (!reset) *cost += G * (cdiv(n_tok + items[i].n_new, bs) - n_blk);
    }
}

int32_t kvp_grow_cost(const kvp_pool *p, const kvp_grow_item *items, int32_t n) {
    int32_t cost = 0;
    grow_walk(p, items, n, &cost, false);
    grow_walk(p, items, n, NULL, true);
    return cost;
}

int kvp_grow(kvp_pool *p, const kvp_grow_item *items, int32_t n, kvp_moves *copies) {
    int32_t cost = kvp_grow_cost(p, items, n);
    if (cost > p->n_free) return PG_ENOSPC;
    const int32_t bs = p->bs, G = p->G;
    // Adopt all device hits and hold all host hits first, so that no
    // allocation below can evict them; host hits are marked -1 - host id.
    // A windowed group adopts only the blocks its window sees from position
    // n_hits * bs on; those before stay null.
    bool any_host = false;
    for (int32_t i = 0; i < n; i++) {
        kvp_table *t = items[i].t;
        int32_t k = items[i].n_hits;
        if (k <= 0) continue;
        table_reserve(p, t, k);
        for (int32_t j = 0; j < k; j++)
            for (int32_t g = 0; g < G; g++) {
                int32_t *e = &t->blocks[j * G + g];
                if (j < window_first(p, g, (int64_t)k * bs)) {
                    *e = 0;
                    continue;
                }
                kvp_hash key = kvpi_group_key(t->hashes[j], g);
                int32_t b = kvpi_map_find(&p->map, key);
                if (b > 0) {
                    block_incref(p, b);
                    p->blocks[b].reused = true;
                    *e = b;
                } else {
                    int32_t h = kvpi_map_find(&p->hmap, key);
                    host_hold(p, h); // read by this plan's swap-in
                    *e = -1 - h;
                    any_host = true;
                }
            }
        t->n_blocks = t->n_cached = k;
        t->n_tokens = k * bs;
    }
    // Host hits: a fresh device block each and a (host, device) swap-in
    // move, which runs before this plan's forward reads it; so the block
    // enters the device cache now (a same-plan hit on it is safe), and the
    // host copy stays cached too (evicting the device block again costs no
    // copy). An earlier item of the batch may have loaded the same hash.
    for (int32_t i = 0; any_host && i < n; i++) {
        kvp_table *t = items[i].t;
        for (int32_t j = 0; j < items[i].n_hits; j++) {
            bool loaded = false; // the row's tokens count once, however many groups load
            for (int32_t g = 0; g < G; g++) {
                int32_t *e = &t->blocks[j * G + g];
                if (*e >= 0) continue;
                int32_t h = -1 - *e;
                kvp_hash key = kvpi_group_key(t->hashes[j], g);
                int32_t b = kvpi_map_find(&p->map, key);
                if (b > 0) {
                    block_incref(p, b);
                } else {
                    b = kvpi_block_alloc(p);
                    kvpi_moves_push(&p->tier_in, h, b);
                    kvpi_cache_offer(p, b, key);
                    loaded = true;
                }
                *e = b;
            }
            if (loaded) p->host_hits += bs;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        kvp_table *t = items[i].t;
        int32_t n_new = items[i].n_new;
        PG_CHECK(!t->swapped && n_new >= 0);
        if (n_new == 0) continue;
        for (int32_t g = 0; t->n_tokens % bs != 0 && g < G; g++) {
            int32_t *e = &t->blocks[(t->n_blocks - 1) * G + g];
            if (p->blocks[*e].ref > 1) { // copy on write
                int32_t nb = kvpi_block_alloc(p);
                kvpi_moves_push(copies, *e, nb);
                kvpi_block_decref(p, *e);
                *e = nb;
            }
        }
        int32_t need = cdiv(t->n_tokens + n_new, bs);
        table_reserve(p, t, need);
        for (; t->n_blocks < need; t->n_blocks++)
            for (int32_t g = 0; g < G; g++) t->blocks[t->n_blocks * G + g] = kvpi_block_alloc(p);
        t->n_tokens += n_new;
    }
    return 0;
}

void kvp_table_commit(kvp_pool *p, kvp_table *t, const int32_t *tokens, int32_t n_computed) {
    if (!p->cfg.enable_prefix_caching) return;
    PG_CHECK(!t->swapped && n_computed <= t->n_tokens);
    int32_t n_full = n_computed / p->bs;
    if (n_full <= t->n_cached) return;
    ensure_hashes(p, t, tokens, n_full);
    for (int32_t i = t->n_cached; i < n_full; i++)
        for (int32_t g = 0; g < p->G; g++) {
            int32_t b = t->blocks[i * p->G + g];
            if (b != 0) kvpi_cache_offer(p, b, kvpi_group_key(t->hashes[i], g));
        }
    t->n_cached = n_full;
}

// Gives dst the hashes of src's full blocks inside their common first
// n_common_tokens (dst's own are kept where it has more), so that dst can
// re-offer the blocks it takes over without their tokens.
static void inherit_hashes(const kvp_pool *p, const kvp_table *src, kvp_table *dst,
                           int32_t n_common_tokens) {
    int32_t nh = n_common_tokens / p->bs;
    if (nh > src->n_hashes) nh = src->n_hashes;
    if (nh <= dst->n_hashes) return;
    if (nh > dst->hash_cap) {
        dst->hashes = pg_xrealloc(dst->hashes, sizeof(kvp_hash) * (size_t)nh);
        dst->hash_cap = nh;
    }
    memcpy(dst->hashes, src->hashes, sizeof(kvp_hash) * (size_t)nh);
    dst->n_hashes = nh;
}

void kvp_table_fork(kvp_pool *p, const kvp_table *src, kvp_table *dst, int32_t n_common_tokens) {
    PG_CHECK(dst != src && dst->n_blocks == 0);
    table_reserve(p, dst, src->n_blocks);
    for (int32_t e = 0; e < src->n_blocks * p->G; e++) {
        int32_t b = src->blocks[e];
        if (kvpi_entry_null(src, b)) {
            // stays null: dst slides like src did
        } else if (src->swapped) {
            p->hblocks[b].ref++;
        } else {
            block_incref(p, b);
        }
        dst->blocks[e] = b;
    }
    dst->n_blocks = src->n_blocks;
    dst->n_tokens = src->n_tokens;
    dst->n_cached = src->n_cached;
    dst->swapped = src->swapped;
    inherit_hashes(p, src, dst, n_common_tokens);
}

void kvp_table_move_blocks(kvp_pool *p, kvp_table *dst, kvp_table *src, int32_t n_common_tokens) {
    PG_CHECK(dst != src && dst->n_blocks == 0);
    inherit_hashes(p, src, dst, n_common_tokens);
    int32_t *blocks = dst->blocks, cap = dst->cap;
    dst->blocks = src->blocks;
    dst->cap = src->cap;
    dst->n_blocks = src->n_blocks;
    dst->n_tokens = src->n_tokens;
    dst->n_cached = src->n_cached;
    dst->swapped = src->swapped;
    src->blocks = blocks;
    src->cap = cap;
    src->n_blocks = src->n_tokens = src->n_cached = 0;
    src->swapped = false;
}

// Drops the entries of rows [keep, n_blocks), tail first (the head blocks,
// a shared prompt's, join the free list last and are evicted last).
static void table_drop_rows(kvp_pool *p, kvp_table *t, int32_t keep) {
    for (int32_t e = t->n_blocks * p->G - 1; e >= keep * p->G; e--) {
        int32_t b = t->blocks[e];
        if (kvpi_entry_null(t, b)) continue;
        if (t->swapped) {
            kvpi_host_decref(p, b);
        } else {
            kvpi_block_decref(p, b);
        }
    }
    t->n_blocks = keep;
}

void kvp_table_release(kvp_pool *p, kvp_table *t) {
    table_drop_rows(p, t, 0);
    t->n_tokens = t->n_cached = 0;
    t->swapped = false;
}

void kvp_table_truncate(kvp_pool *p, kvp_table *t, int32_t n_tokens) {
    PG_CHECK(!t->swapped && n_tokens >= 0 && n_tokens <= t->n_tokens);
    const int32_t keep = (n_tokens + p->bs - 1) / p->bs;
    PG_CHECK(keep >= t->n_cached);
    table_drop_rows(p, t, keep);
    t->n_tokens = n_tokens;
}

int32_t kvp_table_slide(kvp_pool *p, kvp_table *t, int32_t first_pos) {
    if (!p->windowed || t->swapped) return 0;
    int32_t dropped = 0;
    for (int32_t g = 0; g < p->G; g++) {
        if (p->win[g] == 0) continue;
        // Rows wholly before first_pos - window + 1, the earliest key a
        // query to come still sees; never the tail row (the next write may
        // go there). Nulls are a prefix of the column, so the scan downward
        // stops at the first: O(1) when nothing falls out.
        int64_t limit = (int64_t)first_pos - p->win[g] + 1;
        if (limit < p->bs) continue;
        int64_t hi = limit / p->bs - 1;
        if (hi > t->n_blocks - 2) hi = t->n_blocks - 2;
        for (int64_t i = hi; i >= 0; i--) {
            int32_t *e = &t->blocks[i * p->G + g];
            if (*e == 0) break;
            kvpi_block_decref(p, *e); // a cached one stays findable until evicted
            *e = 0;
            dropped++;
        }
    }
    return dropped;
}

void kvp_table_count_owners(const kvp_pool *p, const kvp_table *t, int32_t *dev, int32_t *host) {
    for (int32_t e = 0; e < t->n_blocks * p->G; e++) {
        int32_t b = t->blocks[e];
        if (kvpi_entry_null(t, b)) continue;
        if (t->swapped) {
            host[b]++;
        } else {
            dev[b]++;
        }
    }
}
