// kvpool/kvpool_swap.c - whole-table swap between device and host blocks,
// the host tier's plan moves and holds, and the consistency check.
#include "kvpool/kvpool.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kvpool/kvpool_int.h"

// ---------------------------------------------------------------------------
// Swap

// Distinct blocks of `tables` in one space, null entries aside (scratch
// marks are cleared).
static int32_t distinct_blocks(const kvp_pool *p, kvp_table *const *tables, int32_t n, bool host) {
    int32_t *scratch = host ? p->host_scratch : p->dev_scratch, count = 0;
    for (int32_t i = 0; i < n; i++) {
        const kvp_table *t = tables[i];
        PG_CHECK(t->n_blocks == 0 || t->swapped == host);
        for (int32_t e = 0; e < t->n_blocks * p->G; e++)
            if (!kvpi_entry_null(t, t->blocks[e]) && scratch[t->blocks[e]]++ == 0) count++;
    }
    for (int32_t i = 0; i < n; i++) {
        const kvp_table *t = tables[i];
        for (int32_t e = 0; e < t->n_blocks * p->G; e++)
            if (!kvpi_entry_null(t, t->blocks[e])) scratch[t->blocks[e]] = 0;
    }
    return count;
}

int32_t kvp_swap_out_cost(const kvp_pool *p, kvp_table *const *tables, int32_t n) {
    return distinct_blocks(p, tables, n, false);
}

int32_t kvp_swap_in_cost(const kvp_pool *p, kvp_table *const *tables, int32_t n) {
    return distinct_blocks(p, tables, n, true);
}

// Moves `tables` from one space to the other. `to_host` selects direction.
// Null entries move nowhere: they become the other space's null.
static void swap_tables(kvp_pool *p, kvp_table *const *tables, int32_t n, kvp_moves *moves,
                        bool to_host) {
    int32_t *map = to_host ? p->dev_scratch : p->host_scratch; // old id -> new id + 1
    int32_t first = moves->n;
    const int32_t G = p->G;
    // Pass 1: a new block per distinct old block, extra refs for sharing.
    for (int32_t i = 0; i < n; i++) {
        kvp_table *t = tables[i];
        for (int32_t e = 0; e < t->n_blocks * G; e++) {
            int32_t b = t->blocks[e];
            if (kvpi_entry_null(t, b)) continue;
            if (map[b] == 0) {
                int32_t nb = to_host ? kvpi_host_alloc(p) : kvpi_block_alloc(p);
                map[b] = nb + 1;
                kvpi_moves_push(moves, b, nb);
            } else if (to_host) {
                p->hblocks[map[b] - 1].ref++;
            } else {
                p->blocks[map[b] - 1].ref++;
            }
        }
    }
    // Pass 2: drop the old refs tail first and rewrite the tables.
    for (int32_t i = 0; i < n; i++) {
        kvp_table *t = tables[i];
        for (int32_t e = t->n_blocks * G - 1; e >= 0; e--) {
            int32_t b = t->blocks[e];
            if (kvpi_entry_null(t, b)) {
                t->blocks[e] = to_host ? -1 : 0;
                continue;
            }
            if (to_host) {
                kvpi_block_decref(p, b);
            } else {
                kvpi_host_decref(p, b);
            }
            t->blocks[e] = map[b] - 1;
        }
        t->swapped = to_host;
    }
    for (int32_t k = first; k < moves->n; k++) map[moves->v[k].from] = 0;
    if (to_host) return;
    // Back on the device: what was cached before is cacheable again.
    for (int32_t i = 0; i < n; i++) {
        kvp_table *t = tables[i];
        PG_CHECK(t->n_cached <= t->n_hashes || t->n_cached == 0);
        for (int32_t j = 0; j < t->n_cached; j++)
            for (int32_t g = 0; g < G; g++) {
                int32_t b = t->blocks[j * G + g];
                if (b != 0) kvpi_cache_offer(p, b, kvpi_group_key(t->hashes[j], g));
            }
    }
}

int kvp_swap_out(kvp_pool *p, kvp_table *const *tables, int32_t n, kvp_moves *moves) {
    if (kvp_swap_out_cost(p, tables, n) > p->n_host_free) return PG_ENOSPC;
    swap_tables(p, tables, n, moves, true);
    return 0;
}

int kvp_swap_in(kvp_pool *p, kvp_table *const *tables, int32_t n, kvp_moves *moves) {
    if (kvp_swap_in_cost(p, tables, n) > p->n_free) return PG_ENOSPC;
    swap_tables(p, tables, n, moves, false);
    return 0;
}

// ---------------------------------------------------------------------------
// Host tier: the plan's moves and holds

static void moves_append(kvp_moves *dst, kvp_moves *src) {
    for (int32_t i = 0; i < src->n; i++) kvpi_moves_push(dst, src->v[i].from, src->v[i].to);
    src->n = 0;
}

// Copy ahead (host_tier_ahead): gives the cached blocks among the first `n`
// of the device free list, the next the plans will hand out, their host copy
// now. Allocation pops the head, so a plan that allocates about as many as
// this one finds them copied; a block hit again before its eviction keeps
// its place on the device and the copy stays cached on the host. Returns
// how many it copied.
static int32_t offload_ahead(kvp_pool *p, int32_t n) {
    int32_t seen = 0, copied = 0;
    for (int32_t b = p->blocks[p->n].next; b != p->n && seen < n && p->n_host_free > 0;
         b = p->blocks[b].next, seen++) {
        const blk *x = &p->blocks[b];
        if (!x->hashed || kvpi_map_find(&p->hmap, x->hash) >= 0) continue;
        copied += kvpi_offload_copy(p, b);
    }
    p->offloads_ahead += copied;
    return copied;
}

int32_t kvp_take_tier_moves(kvp_pool *p, kvp_moves *swap_out, kvp_moves *swap_in) {
    const int32_t n_ahead = p->tier && p->cfg.host_tier_ahead ? offload_ahead(p, 2 * p->plan_allocs) : 0;
    p->plan_allocs = 0;
    moves_append(swap_out, &p->tier_out);
    moves_append(swap_in, &p->tier_in);
    return n_ahead;
}

void kvp_release_holds(kvp_pool *p) {
    for (int32_t i = 0; i < p->n_held; i++) {
        int32_t h = p->held[i];
        PG_CHECK(p->hblocks[h].ref > 0);
        if (--p->hblocks[h].ref == 0) kvpi_host_to_free(p, h);
    }
    p->n_held = 0;
}

// ---------------------------------------------------------------------------
// Moves lists and checks

void kvp_moves_fini(kvp_moves *m) {
    free(m->v);
    memset(m, 0, sizeof *m);
}

int kvp_check(const kvp_pool *p, const int32_t *dev_owners, const int32_t *host_owners) {
    int rc = 0;
    unsigned char *seen = pg_xcalloc((size_t)(p->n > p->n_host ? p->n : p->n_host) + 1, 1);
    if (p->blocks[0].ref != 0 || dev_owners[0] != 0) {
        rc = pg_err_set(PG_EINVAL, "kvpool: null block 0 is owned");
        goto done;
    }
    int32_t n_zero = 0, n_hashed = 0, n_hashed_free = 0;
    for (int32_t b = 1; b < p->n; b++) {
        const blk *x = &p->blocks[b];
        if (x->ref != dev_owners[b]) {
            rc = pg_err_set(PG_EINVAL, "kvpool: block %d ref %d but %d owners", b, x->ref,
                            dev_owners[b]);
            goto done;
        }
        n_zero += x->ref == 0;
        if (x->hashed) {
            n_hashed++;
            n_hashed_free += x->ref == 0;
            if (kvpi_map_find(&p->map, x->hash) != b) {
                rc = pg_err_set(PG_EINVAL, "kvpool: block %d hash not mapped to it", b);
                goto done;
            }
        }
    }
    int32_t walked = 0;
    for (int32_t b = p->blocks[p->n].next; b != p->n; b = p->blocks[b].next) {
        if (b <= 0 || b > p->n || seen[b] || p->blocks[b].ref != 0 || walked > p->n) {
            rc = pg_err_set(PG_EINVAL, "kvpool: free list corrupt at block %d", b);
            goto done;
        }
        if (p->blocks[p->blocks[b].next].prev != b) {
            rc = pg_err_set(PG_EINVAL, "kvpool: free list back link broken at %d", b);
            goto done;
        }
        seen[b] = 1;
        walked++;
    }
    if (walked != p->n_free || n_zero != p->n_free) {
        rc = pg_err_set(PG_EINVAL, "kvpool: %d blocks in free list, %d with ref 0, n_free %d",
                        walked, n_zero, p->n_free);
        goto done;
    }
    if (n_hashed != p->map.n || n_hashed_free != p->n_cached_free) {
        rc = pg_err_set(PG_EINVAL, "kvpool: %d hashed (%d free) but map %d (%d free)", n_hashed,
                        n_hashed_free, p->map.n, p->n_cached_free);
        goto done;
    }
    memset(seen, 0, (size_t)(p->n > p->n_host ? p->n : p->n_host) + 1);
    // Host refs = the tables' owners + the plan's holds.
    int32_t *held = pg_xcalloc((size_t)p->n_host + 1, sizeof(int32_t));
    for (int32_t i = 0; i < p->n_held; i++) held[p->held[i]]++;
    int32_t host_zero = 0, h_hashed = 0, h_hashed_free = 0;
    for (int32_t h = 0; h < p->n_host && rc == 0; h++) {
        const blk *x = &p->hblocks[h];
        int32_t owners = (host_owners ? host_owners[h] : 0) + held[h];
        if (x->ref != owners) {
            rc = pg_err_set(PG_EINVAL, "kvpool: host block %d ref %d but %d owners (%d holds)", h, x->ref,
                            owners, held[h]);
        } else if (x->hashed && (host_owners ? host_owners[h] : 0) != 0) {
            rc = pg_err_set(PG_EINVAL, "kvpool: host block %d is cached and held by a table", h);
        } else if (x->hashed && kvpi_map_find(&p->hmap, x->hash) != h) {
            rc = pg_err_set(PG_EINVAL, "kvpool: host block %d hash not mapped to it", h);
        }
        host_zero += owners == 0;
        h_hashed += x->hashed;
        h_hashed_free += x->hashed && owners == 0;
    }
    free(held);
    if (rc) goto done;
    walked = 0;
    for (int32_t h = p->hblocks[p->n_host].next; h != p->n_host; h = p->hblocks[h].next) {
        if (h < 0 || h > p->n_host || seen[h] || p->hblocks[h].ref != 0 || walked > p->n_host) {
            rc = pg_err_set(PG_EINVAL, "kvpool: host free list corrupt at %d", h);
            goto done;
        }
        if (p->hblocks[p->hblocks[h].next].prev != h) {
            rc = pg_err_set(PG_EINVAL, "kvpool: host free list back link broken at %d", h);
            goto done;
        }
        seen[h] = 1;
        walked++;
    }
    if (walked != p->n_host_free || host_zero != p->n_host_free) {
        rc = pg_err_set(PG_EINVAL, "kvpool: %d host blocks in free list, %d unowned, n_host_free %d", walked,
                        host_zero, p->n_host_free);
        goto done;
    }
    if (h_hashed != p->hmap.n || h_hashed_free != p->n_host_cached_free)
        rc = pg_err_set(PG_EINVAL, "kvpool: %d host blocks hashed (%d free) but host map %d (%d free)", h_hashed,
                        h_hashed_free, p->hmap.n, p->n_host_cached_free);
done:
    free(seen);
    return rc;
}
