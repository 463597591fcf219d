// kvpool/kvpool_int.h - what kvpool's files share and nothing outside
// kvpool/ may include: the pool's layout and the block primitives of
// kvpool.c that the swap, host-tier and check code of kvpool_swap.c builds
// on. Internal names are kvpi_*.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "kvpool/kvpool.h"

typedef struct blk {
    int32_t ref;  // tables holding the block
    int32_t prev; // free-list links, valid while ref == 0 (not block 0)
    int32_t next;
    bool hashed; // `hash` is in the prefix-cache map, pointing here
    bool reused; // device only: a lookup adopted it since it was cached (host_tier_reused_only)
    kvp_hash hash;
} blk;

typedef struct map_slot {
    uint64_t lo, hi;
    int32_t id; // block id, -1 when the slot is empty
} map_slot;

// Hash -> block id of one space (device or host).
typedef struct kvmap {
    map_slot *s; // [mask + 1]
    uint64_t mask;
    int32_t n; // occupied slots (= hashed blocks)
} kvmap;

struct kvp_pool {
    kvp_config cfg;
    int32_t bs;            // cfg.block_size
    int32_t G;             // layer groups: entries per table row (max(1, cfg.n_groups))
    int32_t win[KVP_MAX_GROUPS]; // each group's window in positions (0: full)
    bool windowed;         // some group has a window (kvp_table_slide has work)
    int32_t n;             // cfg.num_blocks
    blk *blocks;           // [n + 1], blocks[n] = free-list sentinel
    int32_t n_free;        // blocks in the free list
    int32_t n_cached_free; // hashed blocks in the free list
    int32_t n_host;        // cfg.num_host_blocks
    blk *hblocks;          // [n_host + 1], hblocks[n_host] = host free-list sentinel
    int32_t n_host_free;   // host blocks in the host free list
    int32_t n_host_cached_free; // hashed host blocks in it (host tier)
    bool tier;             // host tier on (cfg.enable_host_tier, caching, host blocks)
    kvmap map;             // device prefix cache
    kvmap hmap;            // host prefix cache (host tier)
    int32_t *held;         // [n_held] host ids holding one ref each until kvp_release_holds
    int32_t n_held, held_cap;
    kvp_moves tier_out;    // offloads (device -> host) not yet taken
    kvp_moves tier_in;     // host-hit loads (host -> device) not yet taken
    int32_t *dev_scratch;  // [n]      zero between calls
    int32_t *host_scratch; // [n_host] zero between calls
    unsigned char *hbuf;   // [16 + 4 * bs] hash input: parent hash, token ids
    int64_t prefix_queries, prefix_hits, evictions;
    int64_t host_hits, offloads, host_evictions;
    int64_t offloads_ahead; // of offloads, copied ahead (kvp_config.host_tier_ahead)
    int32_t plan_allocs;    // device blocks handed out since the last kvp_take_tier_moves
};

// Group g's prefix-cache key for a block of token hash h: group 0 keeps h
// (so one group behaves as the plain pool), the others mix g in, so that
// each group's block of the same tokens is cached and found on its own.
static inline kvp_hash kvpi_group_key(kvp_hash h, int32_t g) {
    if (g > 0) {
        h.lo ^= (uint64_t)g * 0x9e3779b97f4a7c15ull;
        h.hi ^= (uint64_t)g;
    }
    return h;
}

// Whether table entry b is the null entry of the table's space: 0 on the
// device (block 0 is never handed out), -1 while swapped (host ids start
// at 0).
static inline bool kvpi_entry_null(const kvp_table *t, int32_t b) { return t->swapped ? b < 0 : b == 0; }

// ---------------------------------------------------------------------------
// Primitives (kvpool.c)

// Block id holding `h` in one space's map, or -1.
int32_t kvpi_map_find(const kvmap *m, kvp_hash h);
// Enters held device block b under h unless h is cached already or b has a hash.
void kvpi_cache_offer(kvp_pool *p, int32_t b, kvp_hash h);
void kvpi_moves_push(kvp_moves *m, int32_t from, int32_t to);
// Pops the device free-list head (evicting, with the host tier offloading,
// its cached hash) with ref 1.
int32_t kvpi_block_alloc(kvp_pool *p);
// Drops an owner of device block b; at ref 0 it joins the free list.
void kvpi_block_decref(kvp_pool *p, int32_t b);
// Copies hashed device block b to a fresh host block under its hash (an
// offload: a move in tier_out, the host block held by the plan). False when
// no host block is free or the reused-only rule skips b.
bool kvpi_offload_copy(kvp_pool *p, int32_t b);
// Pops the host free-list head (evicting its host-cached hash) with ref 1.
int32_t kvpi_host_alloc(kvp_pool *p);
// Drops an owner of host block h (with the host tier the last ref goes to
// the plan's holds).
void kvpi_host_decref(kvp_pool *p, int32_t h);
// Host block h has no owner left: back in the host free list.
void kvpi_host_to_free(kvp_pool *p, int32_t h);
