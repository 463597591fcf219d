// tests/unit/test_kvpool.c - block pool: exact block ids for allocation
// order, sharing, copy-on-write, prefix hits, eviction order and swap plans
// (in the spirit of vLLM's tests/v1/core/test_prefix_caching.py).
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "kvpool/kvpool.h"

// ---------------------------------------------------------------------------
// Helpers

static kvp_pool *make_pool(int32_t n_blocks, int32_t n_host, int32_t bs, bool caching) {
    kvp_config c;
    kvp_config_default(&c);
    c.num_blocks = n_blocks;
    c.num_host_blocks = n_host;
    c.block_size = bs;
    c.enable_prefix_caching = caching;
    kvp_pool *p = NULL;
    assert_int_equal(kvp_create(&c, &p), 0);
    return p;
}

// Grows one table by n tokens (must succeed).
static void grow(kvp_pool *p, kvp_table *t, int32_t n, kvp_moves *copies) {
    kvp_grow_item it = {t, 0, n};
    assert_int_equal(kvp_grow(p, &it, 1, copies), 0);
}

static void assert_blocks(const kvp_table *t, const int32_t *want, int32_t n) {
    assert_int_equal(t->n_blocks, n);
    for (int32_t i = 0; i < n; i++) {
        if (t->blocks[i] != want[i]) fail_msg("block %d is %d, want %d", i, t->blocks[i], want[i]);
    }
}
#define ASSERT_BLOCKS(t, ...)                                                                      \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        assert_blocks((t), want_, (int32_t)(sizeof want_ / sizeof want_[0]));                      \
    } while (0)

static void assert_moves(const kvp_moves *m, const int32_t *pairs, int32_t n) {
    assert_int_equal(m->n, n);
    for (int32_t i = 0; i < n; i++) {
        if (m->v[i].from != pairs[2 * i] || m->v[i].to != pairs[2 * i + 1])
            fail_msg("move %d is %d->%d, want %d->%d", i, m->v[i].from, m->v[i].to, pairs[2 * i],
                     pairs[2 * i + 1]);
    }
}
#define ASSERT_MOVES(m, ...)                                                                       \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        assert_moves((m), want_, (int32_t)(sizeof want_ / sizeof want_[0] / 2));                   \
    } while (0)

// Checks the pool against the owners counted from `tables`.
static void check_pool(const kvp_pool *p, kvp_table **tables, int32_t n) {
    int32_t nb = kvp_num_usable(p) + 1, nh = kvp_num_host_blocks(p);
    int32_t *dev = calloc((size_t)nb, sizeof(int32_t));
    int32_t *host = calloc((size_t)(nh ? nh : 1), sizeof(int32_t));
    for (int32_t i = 0; i < n; i++)
        for (int32_t j = 0; j < tables[i]->n_blocks; j++) {
            if (tables[i]->swapped) {
                host[tables[i]->blocks[j]]++;
            } else {
                dev[tables[i]->blocks[j]]++;
            }
        }
    int rc = kvp_check(p, dev, host);
    if (rc) fail_msg("%s", pg_err_msg());
    free(dev);
    free(host);
}

static void seq_tokens(int32_t *tok, int32_t n, int32_t base) {
    for (int32_t i = 0; i < n; i++) tok[i] = base + i;
}

// ---------------------------------------------------------------------------
// Allocation

static void test_config_rejected(void **state) {
    (void)state;
    kvp_config c;
    kvp_config_default(&c);
    kvp_pool *p = NULL;
    c.num_blocks = 1;
    assert_int_equal(kvp_create(&c, &p), PG_EINVAL);
    assert_null(p);
    c.num_blocks = 8;
    c.block_size = 0;
    assert_int_equal(kvp_create(&c, &p), PG_EINVAL);
    c.block_size = 16;
    c.num_host_blocks = -1;
    assert_int_equal(kvp_create(&c, &p), PG_EINVAL);
}

static void test_alloc_ascending_skips_null_block(void **state) {
    (void)state;
    kvp_pool *p = make_pool(10, 0, 4, true);
    assert_int_equal(kvp_num_usable(p), 9);
    assert_int_equal(kvp_num_free(p), 9);
    kvp_moves cp = {0};
    kvp_table a;
    kvp_table_init(&a);
    grow(p, &a, 10, &cp); // 10 tokens -> 3 blocks
    ASSERT_BLOCKS(&a, 1, 2, 3);
    assert_int_equal(a.n_tokens, 10);
    grow(p, &a, 2, &cp); // fills block 3, no new block
    ASSERT_BLOCKS(&a, 1, 2, 3);
    grow(p, &a, 1, &cp);
    ASSERT_BLOCKS(&a, 1, 2, 3, 4);
    assert_int_equal(kvp_num_free(p), 5);
    assert_int_equal(cp.n, 0);
    assert_int_equal(kvp_block_ref(p, 0), 0);
    kvp_table *ts[] = {&a};
    check_pool(p, ts, 1);
    kvp_table_release(p, &a);
    assert_int_equal(kvp_num_free(p), 9);
    check_pool(p, ts, 1);
    kvp_table_fini(&a);
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

static void test_alloc_all_or_nothing(void **state) {
    (void)state;
    kvp_pool *p = make_pool(5, 0, 4, false); // 4 usable
    kvp_moves cp = {0};
    kvp_table a, b, c;
    kvp_table_init(&a);
    kvp_table_init(&b);
    kvp_table_init(&c);
    grow(p, &a, 12, &cp);
    ASSERT_BLOCKS(&a, 1, 2, 3);
    kvp_grow_item two[] = {{&b, 0, 4}, {&c, 0, 4}};
    assert_int_equal(kvp_grow_cost(p, two, 2), 2);
    assert_int_equal(kvp_grow(p, two, 2, &cp), PG_ENOSPC);
    assert_int_equal(b.n_blocks + c.n_blocks, 0); // nothing happened
    assert_int_equal(b.n_tokens, 0);
    assert_int_equal(kvp_num_free(p), 1);
    assert_int_equal(kvp_grow(p, two, 1, &cp), 0); // one fits
    ASSERT_BLOCKS(&b, 4);
    assert_int_equal(kvp_num_free(p), 0);
    kvp_table *ts[] = {&a, &b, &c};
    check_pool(p, ts, 3);
    for (int i = 0; i < 3; i++) {
        kvp_table_release(p, ts[i]);
        kvp_table_fini(ts[i]);
    }
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

// Without caching, freed blocks are pushed at the head: the next
// allocation reuses the most recently freed, the table's head first.
static void test_release_uncached_reused_first(void **state) {
    (void)state;
    kvp_pool *p = make_pool(10, 0, 4, false);
    kvp_moves cp = {0};
    kvp_table a, b;
    kvp_table_init(&a);
    kvp_table_init(&b);
    grow(p, &a, 12, &cp);
    ASSERT_BLOCKS(&a, 1, 2, 3);
    kvp_table_release(p, &a); // tail first: 3, 2, 1 each pushed at the head
    grow(p, &b, 16, &cp);
    ASSERT_BLOCKS(&b, 1, 2, 3, 4);
    kvp_table_release(p, &b);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

// ---------------------------------------------------------------------------
// Prefix caching

static void test_prefix_hit_shares_full_blocks(void **state) {
    (void)state;
    kvp_pool *p = make_pool(11, 0, 4, true);
    kvp_moves cp = {0};
    int32_t ta[14], tb[14];
    seq_tokens(ta, 14, 100);
    memcpy(tb, ta, sizeof ta);
    tb[12] = 7; // differs in the 4th block only
    kvp_table a, b;
    kvp_table_init(&a);
    kvp_table_init(&b);
    assert_int_equal(kvp_table_lookup(p, &a, ta, 14), 0);
    grow(p, &a, 14, &cp);
    ASSERT_BLOCKS(&a, 1, 2, 3, 4);
    // Not committed yet: nothing findable (the forward has not run).
    assert_int_equal(kvp_table_lookup(p, &b, tb, 14), 0);
    kvp_table_commit(p, &a, ta, 14);
    assert_int_equal(a.n_cached, 3);
    assert_true(kvp_block_cached(p, 1) && kvp_block_cached(p, 3));
    assert_false(kvp_block_cached(p, 4)); // partial
    int32_t hits = kvp_table_lookup(p, &b, tb, 14);
    assert_int_equal(hits, 3);
    kvp_note_lookup(p, 14, hits * 4);
    kvp_grow_item it = {&b, hits, 14 - 12};
    assert_int_equal(kvp_grow_cost(p, &it, 1), 1); // hits are in use: only the new block
    assert_int_equal(kvp_grow(p, &it, 1, &cp), 0);
    ASSERT_BLOCKS(&b, 1, 2, 3, 5);
    assert_int_equal(b.n_tokens, 14);
    assert_int_equal(b.n_cached, 3);
    assert_int_equal(kvp_block_ref(p, 1), 2);
    assert_int_equal(kvp_block_ref(p, 3), 2);
    assert_int_equal(kvp_block_ref(p, 4), 1);
    kvp_stats st;
    kvp_stats_get(p, &st);
    assert_int_equal(st.prefix_queries, 14);
    assert_int_equal(st.prefix_hits, 12);
    assert_int_equal(st.num_cached, 3);
    assert_int_equal(st.num_used, 5);
    kvp_table *ts[] = {&a, &b};
    check_pool(p, ts, 2);
    kvp_table_release(p, &a);
    kvp_table_release(p, &b);
    check_pool(p, ts, 2);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

// A prompt of exactly k full cached blocks hits only k - 1: the last token
// must be computed to get logits.
static void test_prefix_hit_never_whole_prompt(void **state) {
    (void)state;
    kvp_pool *p = make_pool(11, 0, 4, true);
    kvp_moves cp = {0};
    int32_t t[12];
    seq_tokens(t, 12, 5);
    kvp_table a, b;
    kvp_table_init(&a);
    kvp_table_init(&b);
    grow(p, &a, 12, &cp);
    kvp_table_commit(p, &a, t, 12);
    assert_int_equal(a.n_cached, 3);
    assert_int_equal(kvp_table_lookup(p, &b, t, 12), 2);
    assert_int_equal(kvp_table_lookup(p, &b, t, 13), 3); // 13 tokens: 3 full blocks may hit
    assert_int_equal(kvp_table_lookup(p, &b, t, 1), 0);
    kvp_table_release(p, &a);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

// Freed cached blocks stay findable; eviction takes the free list's head:
// uncached blocks first, then cached ones tail block first (LRU), so a
// prefix's head survives longest.
static void test_freed_cached_blocks_lru_eviction(void **state) {
    (void)state;
    kvp_pool *p = make_pool(8, 0, 4, true); // usable 1..7
    kvp_moves cp = {0};
    int32_t t[14];
    seq_tokens(t, 14, 40);
    kvp_table a, b, c;
    kvp_table_init(&a);
    kvp_table_init(&b);
    kvp_table_init(&c);
    grow(p, &a, 14, &cp);
    ASSERT_BLOCKS(&a, 1, 2, 3, 4);
    kvp_table_commit(p, &a, t, 14);
    kvp_table_release(p, &a);
    // Free list now: 4 (uncached, head), 5, 6, 7, then 3, 2, 1 (cached, LRU).
    kvp_stats st;
    kvp_stats_get(p, &st);
    assert_int_equal(st.num_free, 7);
    assert_int_equal(st.num_cached_free, 3);
    // A hit on freed blocks takes them out of the free list: cost counts them.
    int32_t hits = kvp_table_lookup(p, &b, t, 14);
    assert_int_equal(hits, 3);
    kvp_grow_item it = {&b, hits, 2};
    assert_int_equal(kvp_grow_cost(p, &it, 1), 4);
    assert_int_equal(kvp_grow(p, &it, 1, &cp), 0);
    ASSERT_BLOCKS(&b, 1, 2, 3, 4);
    kvp_table_release(p, &b);
    // Eviction: 6 blocks -> 4, 5, 6, 7, then 3 and 2 (evicted), 1 stays cached.
    grow(p, &c, 24, &cp);
    ASSERT_BLOCKS(&c, 4, 5, 6, 7, 3, 2);
    assert_true(kvp_block_cached(p, 1));
    assert_false(kvp_block_cached(p, 2));
    assert_false(kvp_block_cached(p, 3));
    kvp_stats_get(p, &st);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(st.num_cached, 1);
    assert_int_equal(kvp_table_lookup(p, &b, t, 14), 1); // only the head block survives
    kvp_table *ts[] = {&a, &b, &c};
    check_pool(p, ts, 3);
    kvp_table_release(p, &c);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_table_fini(&c);
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

// Two sequences compute the same block concurrently: the first commit
// caches it, the second block stays private and is reused first when freed.
static void test_duplicate_content_stays_private(void **state) {
    (void)state;
    kvp_pool *p = make_pool(8, 0, 4, true);
    kvp_moves cp = {0};
    int32_t t[8];
    seq_tokens(t, 8, 9);
    kvp_table a, b, c;
    kvp_table_init(&a);
    kvp_table_init(&b);
    kvp_table_init(&c);
    grow(p, &a, 8, &cp);
    grow(p, &b, 8, &cp);
    ASSERT_BLOCKS(&a, 1, 2);
    ASSERT_BLOCKS(&b, 3, 4);
    kvp_table_commit(p, &a, t, 8);
    kvp_table_commit(p, &b, t, 8);
    assert_true(kvp_block_cached(p, 1) && kvp_block_cached(p, 2));
    assert_false(kvp_block_cached(p, 3) || kvp_block_cached(p, 4));
    kvp_table_release(p, &b); // uncached: to the head
    grow(p, &c, 4, &cp);
    ASSERT_BLOCKS(&c, 3);
    kvp_table *ts[] = {&a, &b, &c};
    check_pool(p, ts, 3);
    kvp_table_release(p, &a);
    kvp_table_release(p, &c);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_table_fini(&c);
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

static void test_prefix_caching_off(void **state) {
    (void)state;
    kvp_pool *p = make_pool(8, 0, 4, false);
    kvp_moves cp = {0};
    int32_t t[9];
    seq_tokens(t, 9, 1);
    kvp_table a, b;
    kvp_table_init(&a);
    kvp_table_init(&b);
    grow(p, &a, 9, &cp);
    kvp_table_commit(p, &a, t, 9);
    assert_false(kvp_block_cached(p, 1));
    assert_int_equal(kvp_table_lookup(p, &b, t, 9), 0);
    kvp_note_lookup(p, 9, 0);
    kvp_stats st;
    kvp_stats_get(p, &st);
    assert_int_equal(st.num_cached, 0);
    assert_int_equal(st.prefix_queries, 0);
    kvp_table_release(p, &a);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

// Same tokens at a different position (another parent) hash differently.
static void test_hash_is_chained(void **state) {
    (void)state;
    kvp_pool *p = make_pool(8, 0, 4, true);
    kvp_moves cp = {0};
    int32_t ta[9] = {1, 2, 3, 4, 5, 6, 7, 8, 0};
    int32_t tb[9] = {9, 9, 9, 9, 5, 6, 7, 8, 0};
    kvp_table a, b;
    kvp_table_init(&a);
    kvp_table_init(&b);
    grow(p, &a, 8, &cp);
    kvp_table_commit(p, &a, ta, 8);
    assert_int_equal(kvp_table_lookup(p, &b, tb, 9), 0); // block 2 equal, parent not
    assert_int_equal(b.n_hashes, 2);
    assert_true(a.hashes[1].lo != b.hashes[1].lo || a.hashes[1].hi != b.hashes[1].hi);
    kvp_table_release(p, &a);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

// ---------------------------------------------------------------------------
// Sharing and copy on write

static void test_fork_cow_on_shared_partial_block(void **state) {
    (void)state;
    kvp_pool *p = make_pool(10, 0, 4, true);
    kvp_moves cp = {0};
    int32_t t[6];
    seq_tokens(t, 6, 0);
    kvp_table a, b, c;
    kvp_table_init(&a);
    kvp_table_init(&b);
    kvp_table_init(&c);
    grow(p, &a, 6, &cp);
    ASSERT_BLOCKS(&a, 1, 2);
    kvp_table_commit(p, &a, t, 6);
    kvp_table_fork(p, &a, &b, 6);
    kvp_table_fork(p, &a, &c, 6);
    ASSERT_BLOCKS(&b, 1, 2);
    assert_int_equal(b.n_tokens, 6);
    assert_int_equal(b.n_cached, 1);
    assert_int_equal(b.n_hashes, 1);
    assert_int_equal(kvp_block_ref(p, 2), 3);
    // All three write position 6: two copies, the last writer keeps block 2.
    kvp_grow_item it[] = {{&a, 0, 1}, {&b, 0, 1}, {&c, 0, 1}};
    assert_int_equal(kvp_grow_cost(p, it, 3), 2);
    assert_int_equal(kvp_grow(p, it, 3, &cp), 0);
    ASSERT_MOVES(&cp, 2, 3, 2, 4);
    ASSERT_BLOCKS(&a, 1, 3);
    ASSERT_BLOCKS(&b, 1, 4);
    ASSERT_BLOCKS(&c, 1, 2);
    assert_int_equal(kvp_block_ref(p, 1), 3);
    assert_int_equal(kvp_block_ref(p, 2), 1);
    kvp_table *ts[] = {&a, &b, &c};
    check_pool(p, ts, 3);
    // Now private: further writes copy nothing.
    cp.n = 0;
    kvp_grow_item it2[] = {{&a, 0, 3}, {&c, 0, 3}};
    assert_int_equal(kvp_grow_cost(p, it2, 2), 2); // each crosses into a new block
    assert_int_equal(kvp_grow(p, it2, 2, &cp), 0);
    assert_int_equal(cp.n, 0);
    ASSERT_BLOCKS(&a, 1, 3, 5);
    ASSERT_BLOCKS(&c, 1, 2, 6);
    check_pool(p, ts, 3);
    for (int i = 0; i < 3; i++) {
        kvp_table_release(p, ts[i]);
        kvp_table_fini(ts[i]);
    }
    check_pool(p, ts, 3);
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

// Only some holders write this step: each of them copies.
static void test_cow_partial_writers(void **state) {
    (void)state;
    kvp_pool *p = make_pool(10, 0, 4, false);
    kvp_moves cp = {0};
    kvp_table a, b, c;
    kvp_table_init(&a);
    kvp_table_init(&b);
    kvp_table_init(&c);
    grow(p, &a, 3, &cp);
    kvp_table_fork(p, &a, &b, 3);
    kvp_table_fork(p, &a, &c, 3);
    kvp_grow_item it[] = {{&b, 0, 1}, {&c, 0, 1}};
    assert_int_equal(kvp_grow_cost(p, it, 2), 2);
    assert_int_equal(kvp_grow(p, it, 2, &cp), 0);
    ASSERT_MOVES(&cp, 1, 2, 1, 3);
    ASSERT_BLOCKS(&a, 1);
    ASSERT_BLOCKS(&b, 2);
    ASSERT_BLOCKS(&c, 3);
    kvp_table *ts[] = {&a, &b, &c};
    check_pool(p, ts, 3);
    for (int i = 0; i < 3; i++) {
        kvp_table_release(p, ts[i]);
        kvp_table_fini(ts[i]);
    }
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

// A fork on a block boundary shares full blocks only: no copy at all.
static void test_fork_on_block_boundary_no_copy(void **state) {
    (void)state;
    kvp_pool *p = make_pool(10, 0, 4, false);
    kvp_moves cp = {0};
    kvp_table a, b;
    kvp_table_init(&a);
    kvp_table_init(&b);
    grow(p, &a, 8, &cp);
    kvp_table_fork(p, &a, &b, 8);
    kvp_grow_item it[] = {{&a, 0, 1}, {&b, 0, 1}};
    assert_int_equal(kvp_grow_cost(p, it, 2), 2);
    assert_int_equal(kvp_grow(p, it, 2, &cp), 0);
    assert_int_equal(cp.n, 0);
    ASSERT_BLOCKS(&a, 1, 2, 3);
    ASSERT_BLOCKS(&b, 1, 2, 4);
    kvp_table_release(p, &a);
    kvp_table_release(p, &b);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

// A copy needs a free block too: with none left, nothing happens.
static void test_cow_needs_room(void **state) {
    (void)state;
    kvp_pool *p = make_pool(3, 0, 4, false); // blocks 1, 2
    kvp_moves cp = {0};
    kvp_table a, b;
    kvp_table_init(&a);
    kvp_table_init(&b);
    grow(p, &a, 6, &cp);
    kvp_table_fork(p, &a, &b, 6);
    assert_int_equal(kvp_num_free(p), 0);
    kvp_grow_item it = {&b, 0, 1};
    assert_int_equal(kvp_grow(p, &it, 1, &cp), PG_ENOSPC);
    assert_int_equal(cp.n, 0);
    ASSERT_BLOCKS(&b, 1, 2);
    assert_int_equal(b.n_tokens, 6);
    kvp_table_release(p, &b);
    it.t = &a; // sole owner now: in place
    assert_int_equal(kvp_grow(p, &it, 1, &cp), 0);
    assert_int_equal(cp.n, 0);
    kvp_table_release(p, &a);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

static void test_move_blocks(void **state) {
    (void)state;
    kvp_pool *p = make_pool(6, 0, 4, false);
    kvp_moves cp = {0};
    kvp_table a, b;
    kvp_table_init(&a);
    kvp_table_init(&b);
    grow(p, &a, 5, &cp);
    kvp_table_move_blocks(p, &b, &a, 5);
    assert_int_equal(a.n_blocks, 0);
    assert_int_equal(a.n_tokens, 0);
    ASSERT_BLOCKS(&b, 1, 2);
    assert_int_equal(b.n_tokens, 5);
    kvp_table *ts[] = {&a, &b};
    check_pool(p, ts, 2);
    kvp_table_release(p, &b);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

// ---------------------------------------------------------------------------
// Swap

static void test_swap_out_and_in_plans(void **state) {
    (void)state;
    kvp_pool *p = make_pool(10, 6, 4, false);
    kvp_moves cp = {0}, mv = {0};
    kvp_table a, b;
    kvp_table_init(&a);
    kvp_table_init(&b);
    grow(p, &a, 6, &cp);          // a: 1 2
    kvp_table_fork(p, &a, &b, 6); // b shares 1 2
    grow(p, &b, 3, &cp);          // b copies 2 -> 3, then 4
    ASSERT_MOVES(&cp, 2, 3);
    ASSERT_BLOCKS(&b, 1, 3, 4);
    kvp_table *ts[] = {&a, &b};
    assert_int_equal(kvp_swap_out_cost(p, ts, 2), 4); // 1 is shared: copied once
    assert_int_equal(kvp_swap_out(p, ts, 2, &mv), 0);
    ASSERT_MOVES(&mv, 1, 0, 2, 1, 3, 2, 4, 3);
    assert_true(a.swapped && b.swapped);
    ASSERT_BLOCKS(&a, 0, 1);
    ASSERT_BLOCKS(&b, 0, 2, 3);
    assert_int_equal(kvp_host_ref(p, 0), 2);
    assert_int_equal(kvp_num_free(p), 9);
    assert_int_equal(kvp_num_host_free(p), 2);
    check_pool(p, ts, 2);
    // Freed device blocks were pushed at the head (a: 2; b: 4, 3, 1), so the
    // swap-in gets 1, 3, 4, 2 for host blocks 0, 1, 2, 3.
    mv.n = 0;
    assert_int_equal(kvp_swap_in_cost(p, ts, 2), 4);
    assert_int_equal(kvp_swap_in(p, ts, 2, &mv), 0);
    ASSERT_MOVES(&mv, 0, 1, 1, 3, 2, 4, 3, 2);
    assert_false(a.swapped || b.swapped);
    ASSERT_BLOCKS(&a, 1, 3);
    ASSERT_BLOCKS(&b, 1, 4, 2);
    assert_int_equal(kvp_block_ref(p, 1), 2);
    assert_int_equal(kvp_num_host_free(p), 6);
    check_pool(p, ts, 2);
    kvp_table_release(p, &a);
    kvp_table_release(p, &b);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_moves_fini(&cp);
    kvp_moves_fini(&mv);
    kvp_destroy(p);
}

static void test_swap_all_or_nothing(void **state) {
    (void)state;
    kvp_pool *p = make_pool(6, 2, 4, false);
    kvp_moves cp = {0}, mv = {0};
    kvp_table a, b;
    kvp_table_init(&a);
    kvp_table_init(&b);
    grow(p, &a, 12, &cp); // 3 blocks > 2 host blocks
    kvp_table *ta[] = {&a};
    assert_int_equal(kvp_swap_out(p, ta, 1, &mv), PG_ENOSPC);
    assert_int_equal(mv.n, 0);
    assert_false(a.swapped);
    ASSERT_BLOCKS(&a, 1, 2, 3);
    kvp_table_release(p, &a);
    grow(p, &a, 8, &cp);
    assert_int_equal(kvp_swap_out(p, ta, 1, &mv), 0);
    grow(p, &b, 20, &cp); // the device fills up: 5 blocks
    assert_int_equal(kvp_num_free(p), 0);
    assert_int_equal(kvp_swap_in(p, ta, 1, &mv), PG_ENOSPC);
    assert_true(a.swapped);
    kvp_table *ts[] = {&a, &b};
    check_pool(p, ts, 2);
    kvp_table_release(p, &b);
    kvp_table_release(p, &a); // releasing a swapped table frees host blocks
    assert_int_equal(kvp_num_host_free(p), 2);
    check_pool(p, ts, 2);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_moves_fini(&cp);
    kvp_moves_fini(&mv);
    kvp_destroy(p);
}

// Blocks cached before a swap-out are findable again after the swap-in,
// under their new ids (unless the cache still holds the old copy).
static void test_swap_in_reoffers_cached_blocks(void **state) {
    (void)state;
    kvp_pool *p = make_pool(6, 4, 4, true);
    kvp_moves cp = {0}, mv = {0};
    int32_t t[10];
    seq_tokens(t, 10, 3);
    kvp_table a, b, c;
    kvp_table_init(&a);
    kvp_table_init(&b);
    kvp_table_init(&c);
    grow(p, &a, 10, &cp);
    kvp_table_commit(p, &a, t, 10); // 1, 2 cached
    kvp_table *ta[] = {&a};
    assert_int_equal(kvp_swap_out(p, ta, 1, &mv), 0);
    grow(p, &b, 20, &cp); // uses every device block: evicts 1 and 2
    ASSERT_BLOCKS(&b, 3, 4, 5, 2, 1);
    assert_int_equal(kvp_block_cached(p, 1) || kvp_block_cached(p, 2), false);
    kvp_table_release(p, &b);
    mv.n = 0;
    assert_int_equal(kvp_swap_in(p, ta, 1, &mv), 0);
    // b was freed tail first, each block pushed at the head: 3 4 5 2 1.
    ASSERT_MOVES(&mv, 0, 3, 1, 4, 2, 5);
    ASSERT_BLOCKS(&a, 3, 4, 5);
    assert_true(kvp_block_cached(p, 3) && kvp_block_cached(p, 4));
    assert_false(kvp_block_cached(p, 5));
    assert_int_equal(kvp_table_lookup(p, &c, t, 10), 2);
    kvp_table *ts[] = {&a, &b, &c};
    check_pool(p, ts, 3);
    kvp_table_release(p, &a);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_table_fini(&c);
    kvp_moves_fini(&cp);
    kvp_moves_fini(&mv);
    kvp_destroy(p);
}

// Growth cost of swapped tables = what it will be after the swap-in.
static void test_grow_cost_on_swapped_tables(void **state) {
    (void)state;
    kvp_pool *p = make_pool(10, 6, 4, false);
    kvp_moves cp = {0}, mv = {0};
    kvp_table a, b;
    kvp_table_init(&a);
    kvp_table_init(&b);
    grow(p, &a, 6, &cp);
    kvp_table_fork(p, &a, &b, 6);
    kvp_table *ts[] = {&a, &b};
    assert_int_equal(kvp_swap_out(p, ts, 2, &mv), 0);
    kvp_grow_item it[] = {{&a, 0, 1}, {&b, 0, 1}};
    int32_t cost = kvp_grow_cost(p, it, 2);
    assert_int_equal(cost, 1);
    assert_int_equal(kvp_swap_in_cost(p, ts, 2), 2);
    assert_int_equal(kvp_swap_in(p, ts, 2, &mv), 0);
    assert_int_equal(kvp_grow_cost(p, it, 2), cost);
    check_pool(p, ts, 2);
    kvp_table_release(p, &a);
    kvp_table_release(p, &b);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_moves_fini(&cp);
    kvp_moves_fini(&mv);
    kvp_destroy(p);
}

// ---------------------------------------------------------------------------
// Statistics and random operations

static void test_stats_usage(void **state) {
    (void)state;
    kvp_pool *p = make_pool(11, 4, 4, true);
    kvp_moves cp = {0};
    kvp_table a;
    kvp_table_init(&a);
    grow(p, &a, 20, &cp);
    kvp_stats st;
    kvp_stats_get(p, &st);
    assert_int_equal(st.num_blocks, 10);
    assert_int_equal(st.num_used, 5);
    assert_int_equal(st.num_free, 5);
    assert_true(st.usage > 0.499 && st.usage < 0.501);
    assert_int_equal(st.num_host_blocks, 4);
    assert_int_equal(st.num_host_free, 4);
    assert_true(st.host_usage == 0.0);
    kvp_table_release(p, &a);
    kvp_table_fini(&a);
    kvp_moves_fini(&cp);
    kvp_destroy(p);
}

static uint64_t rng_next(uint64_t *s) {
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t z = *s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Random grow / commit / fork / release / swap on a tiny pool, checking
// ref counts against owners and the free list / cache map after each op.
// One random walk of single-operation plans (grow with lookups, commit,
// fork, release, swap out, swap in) from `seed`, every invariant checked
// after each operation.
static void random_ops_walk(uint64_t seed) {
    enum { NT = 12, MAXTOK = 64 };
    kvp_pool *p = make_pool(24, 12, 4, true);
    kvp_moves cp = {0}, mv = {0};
    kvp_table t[NT];
    int32_t tok[NT][MAXTOK];
    int32_t computed[NT] = {0};
    kvp_table *ts[NT];
    for (int i = 0; i < NT; i++) {
        kvp_table_init(&t[i]);
        ts[i] = &t[i];
        for (int j = 0; j < MAXTOK; j++) tok[i][j] = (i % 3) * 1000 + j; // 3 shared contents
    }
    uint64_t rng = seed;
    int64_t n_hits = 0, n_cow = 0, n_swaps = 0;
    for (int step = 0; step < 20000; step++) {
        int i = (int)(rng_next(&rng) % NT);
        kvp_table *x = &t[i];
        switch (rng_next(&rng) % 6) {
        case 0: { // grow (with a lookup when empty)
            if (x->swapped) break;
            int32_t n = 1 + (int32_t)(rng_next(&rng) % 9);
            if (x->n_tokens + n > MAXTOK) break;
            int32_t hits = x->n_blocks ? 0 : kvp_table_lookup(p, x, tok[i], x->n_tokens + n);
            if (hits * 4 > x->n_tokens + n - 1) fail_msg("hit covers the whole sequence");
            kvp_grow_item it = {x, hits, x->n_tokens + n - hits * 4 - x->n_tokens};
            if (kvp_grow(p, &it, 1, &cp) == 0) {
                computed[i] = hits * 4;
                n_hits += hits;
                n_cow += cp.n;
            }
            break;
        }
        case 1: // commit what was grown
            if (!x->swapped) {
                kvp_table_commit(p, x, tok[i], x->n_tokens);
                computed[i] = x->n_tokens;
            }
            break;
        case 2: { // fork into an empty table with the same content class
            int j = (int)(rng_next(&rng) % NT);
            if (j != i && t[j].n_blocks == 0 && j % 3 == i % 3 && x->n_tokens <= MAXTOK) {
                kvp_table_fork(p, x, &t[j], x->n_tokens);
                computed[j] = computed[i];
            }
            break;
        }
        case 3:
            kvp_table_release(p, x);
            computed[i] = 0;
            break;
        case 4:
            if (x->n_blocks && !x->swapped) n_swaps += kvp_swap_out(p, &x, 1, &mv) == 0;
            break;
        case 5:
            if (x->n_blocks && x->swapped) kvp_swap_in(p, &x, 1, &mv);
            break;
        }
        // Hash entries must always come from the table's own tokens.
        if (x->n_hashes > 0) {
            int32_t b = x->n_hashes - 1;
            kvp_table probe;
            kvp_table_init(&probe);
            (void)kvp_table_lookup(p, &probe, tok[i], (b + 1) * 4 + 1);
            if (probe.hashes[b].lo != x->hashes[b].lo) fail_msg("hash %d of table %d stale", b, i);
            kvp_table_fini(&probe);
        }
        check_pool(p, ts, NT);
        cp.n = mv.n = 0;
    }
    for (int i = 0; i < NT; i++) {
        kvp_table_release(p, &t[i]);
        kvp_table_fini(&t[i]);
    }
    kvp_stats st;
    kvp_stats_get(p, &st);
    // The walk did reach the interesting paths (copies on write are the
    // rarest: seed 1078 of a 1,000-seed sweep made 20).
    if (!(n_hits > 100 && n_cow > 5 && n_swaps > 100 && st.evictions > 100))
        fail_msg("seed %llu: %lld hits, %lld copies on write, %lld swaps, %lld evictions", (unsigned long long)seed,
                 (long long)n_hits, (long long)n_cow, (long long)n_swaps, (long long)st.evictions);
    assert_int_equal(st.num_free, 23);
    assert_int_equal(st.num_host_free, 12);
    kvp_moves_fini(&cp);
    kvp_moves_fini(&mv);
    kvp_destroy(p);
}

// Three seeds, not one: a walk's order of operations is what finds a
// defect (the tier's random-plans test passed with its one seed for a
// session while others broke it); PG_TEST_SEEDS=N sweeps N more by hand
// (1,000 passed in session 21, 18 s).
static void test_random_ops_keep_invariants(void **state) {
    (void)state;
    const uint64_t seeds[] = {42, 7, 20261206};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) random_ops_walk(seeds[i]);
    const char *more = getenv("PG_TEST_SEEDS");
    for (int i = 0; more && i < atoi(more); i++) random_ops_walk(1000 + (uint64_t)i);
}

// ---------------------------------------------------------------------------
// Host tier

static kvp_pool *make_tier_pool_ahead(int32_t n_blocks, int32_t n_host, int32_t bs, bool reused_only,
                                      bool ahead) {
    kvp_config c;
    kvp_config_default(&c);
    c.num_blocks = n_blocks;
    c.num_host_blocks = n_host;
    c.block_size = bs;
    c.enable_host_tier = true;
    c.host_tier_reused_only = reused_only;
    c.host_tier_ahead = ahead;
    kvp_pool *p = NULL;
    assert_int_equal(kvp_create(&c, &p), 0);
    assert_true(kvp_host_tier(p));
    return p;
}

static kvp_pool *make_tier_pool_policy(int32_t n_blocks, int32_t n_host, int32_t bs, bool reused_only) {
    return make_tier_pool_ahead(n_blocks, n_host, bs, reused_only, false);
}

static kvp_pool *make_tier_pool(int32_t n_blocks, int32_t n_host, int32_t bs) {
    return make_tier_pool_policy(n_blocks, n_host, bs, false);
}

// A cached device block that allocation evicts is copied to a host block
// (a swap-out move) and its hash stays findable there; the host block is
// held by the plan until kvp_release_holds.
static void test_tier_eviction_offloads_to_host(void **state) {
    (void)state;
    kvp_pool *p = make_tier_pool(5, 4, 4);
    kvp_moves cp = {0}, out = {0}, in = {0};
    kvp_table a, b;
    kvp_table_init(&a);
    kvp_table_init(&b);
    int32_t ta[9], tb[16];
    seq_tokens(ta, 9, 100);
    seq_tokens(tb, 16, 500);
    grow(p, &a, 9, &cp); // 1 2 3
    kvp_table_commit(p, &a, ta, 9); // 1, 2 cached
    kvp_table_release(p, &a);       // free: 3 4 2 1
    kvp_take_tier_moves(p, &out, &in);
    assert_int_equal(out.n + in.n, 0); // nothing evicted yet
    grow(p, &b, 16, &cp);              // 3 4 2 1: evicts 2 then 1
    ASSERT_BLOCKS(&b, 3, 4, 2, 1);
    kvp_take_tier_moves(p, &out, &in);
    ASSERT_MOVES(&out, 2, 0, 1, 1);
    assert_int_equal(in.n, 0);
    assert_true(kvp_host_cached(p, 0) && kvp_host_cached(p, 1));
    assert_int_equal(kvp_host_ref(p, 0), 1); // held by the plan
    kvp_table *ts[] = {&b};
    check_pool(p, ts, 1);
    kvp_release_holds(p);
    assert_int_equal(kvp_host_ref(p, 0), 0);
    check_pool(p, ts, 1);
    kvp_table probe;
    kvp_table_init(&probe);
    assert_int_equal(kvp_table_lookup(p, &probe, ta, 9), 2); // both on the host
    kvp_stats st;
    kvp_stats_get(p, &st);
    assert_int_equal(st.offloads, 2);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(st.num_cached, 0);
    assert_int_equal(st.num_host_cached, 2);
    assert_int_equal(st.num_host_used, 0);
    assert_int_equal(st.num_host_free, 4);
    assert_true(st.host_usage == 0.5); // cached host blocks count as used
    kvp_table_fini(&probe);
    kvp_table_release(p, &b);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_moves_fini(&cp);
    kvp_moves_fini(&out);
    kvp_moves_fini(&in);
    kvp_destroy(p);
}

// host_tier_reused_only (--host-kv-offload reused): an evicted cached block
// that no lookup adopted since it was cached is forgotten, not copied; once
// a request has reused it, its eviction offloads it as before.
static void test_tier_reused_only(void **state) {
    (void)state;
    kvp_pool *p = make_tier_pool_policy(5, 4, 4, true);
    kvp_moves cp = {0}, out = {0}, in = {0};
    kvp_table a, b, a2, c, d;
    kvp_table_init(&a);
    kvp_table_init(&b);
    kvp_table_init(&a2);
    kvp_table_init(&c);
    kvp_table_init(&d);
    int32_t ta[9];
    seq_tokens(ta, 9, 100);
    kvp_stats st;
    // Cached, never reused: evicted without a copy.
    grow(p, &a, 9, &cp);
    kvp_table_commit(p, &a, ta, 9); // 2 full blocks cached
    kvp_table_release(p, &a);
    grow(p, &b, 16, &cp); // every device block: evicts both
    kvp_take_tier_moves(p, &out, &in);
    assert_int_equal(out.n + in.n, 0);
    kvp_stats_get(p, &st);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(st.offloads, 0);
    assert_int_equal(st.num_host_cached, 0);
    kvp_release_holds(p);
    kvp_table_release(p, &b);
    // Cached again, then reused by a lookup: its eviction copies it.
    grow(p, &a2, 9, &cp);
    kvp_table_commit(p, &a2, ta, 9);
    int32_t hits = kvp_table_lookup(p, &c, ta, 9);
    assert_int_equal(hits, 2);
    kvp_grow_item it = {&c, hits, 1};
    assert_int_equal(kvp_grow(p, &it, 1, &cp), 0);
    kvp_table *ts[] = {&a2, &c};
    check_pool(p, ts, 2);
    kvp_table_release(p, &a2);
    kvp_table_release(p, &c);
    grow(p, &d, 16, &cp); // evicts the two reused blocks
    kvp_take_tier_moves(p, &out, &in);
    assert_int_equal(out.n, 2);
    assert_int_equal(in.n, 0);
    kvp_stats_get(p, &st);
    assert_int_equal(st.evictions, 4);
    assert_int_equal(st.offloads, 2);
    assert_int_equal(st.num_host_cached, 2);
    kvp_release_holds(p);
    kvp_table *td[] = {&d};
    check_pool(p, td, 1);
    kvp_table probe;
    kvp_table_init(&probe);
    assert_int_equal(kvp_table_lookup(p, &probe, ta, 9), 2); // on the host now
    kvp_table_fini(&probe);
    kvp_table_release(p, &d);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_table_fini(&a2);
    kvp_table_fini(&c);
    kvp_table_fini(&d);
    kvp_moves_fini(&cp);
    kvp_moves_fini(&out);
    kvp_moves_fini(&in);
    kvp_destroy(p);
}

// A lookup that misses on the device hits the host: kvp_grow gives each
// host hit a fresh device block and a (host, device) swap-in move, enters
// it in the device cache again and keeps the host copy.
static void test_tier_lookup_hits_host_and_loads(void **state) {
    (void)state;
    kvp_pool *p = make_tier_pool(5, 4, 4);
    kvp_moves cp = {0}, out = {0}, in = {0};
    kvp_table a, b, c;
    kvp_table_init(&a);
    kvp_table_init(&b);
    kvp_table_init(&c);
    int32_t ta[9], tb[16];
    seq_tokens(ta, 9, 100);
    seq_tokens(tb, 16, 500);
    grow(p, &a, 9, &cp);
    kvp_table_commit(p, &a, ta, 9);
    kvp_table_release(p, &a);
    grow(p, &b, 16, &cp); // offloads 2 -> host 0 (a's block 1), 1 -> host 1 (a's block 0)
    kvp_take_tier_moves(p, &out, &in);
    kvp_release_holds(p);
    kvp_table_release(p, &b); // uncached: free 3 4 2 1
    out.n = 0;
    kvp_table *ts[] = {&c};
    int32_t want_cost;
    {
        int32_t hits = kvp_table_lookup(p, &c, ta, 9);
        assert_int_equal(hits, 2);
        kvp_grow_item it = {&c, hits, 1};
        want_cost = kvp_grow_cost(p, &it, 1);
        assert_int_equal(want_cost, 3); // two loads and one new block
        assert_int_equal(kvp_grow(p, &it, 1, &cp), 0);
    }
    ASSERT_BLOCKS(&c, 3, 4, 2);
    kvp_take_tier_moves(p, &out, &in);
    assert_int_equal(out.n, 0);
    ASSERT_MOVES(&in, 1, 3, 0, 4);
    assert_true(kvp_block_cached(p, 3) && kvp_block_cached(p, 4));
    assert_true(kvp_host_cached(p, 0) && kvp_host_cached(p, 1));
    check_pool(p, ts, 1); // host 0 and 1 held: read by this plan
    assert_int_equal(kvp_host_ref(p, 1), 1);
    kvp_release_holds(p);
    check_pool(p, ts, 1);
    kvp_stats st;
    kvp_stats_get(p, &st);
    assert_int_equal(st.host_hits, 8);
    // Evicting a block the host still has costs no copy.
    kvp_table_release(p, &c); // free: 2, 4, 3 cached at the tail
    kvp_table d;
    kvp_table_init(&d);
    grow(p, &d, 16, &cp);
    in.n = out.n = 0;
    kvp_take_tier_moves(p, &out, &in);
    assert_int_equal(out.n + in.n, 0);
    kvp_stats_get(p, &st);
    assert_int_equal(st.offloads, 2);
    kvp_table_release(p, &d);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_table_fini(&c);
    kvp_table_fini(&d);
    kvp_moves_fini(&cp);
    kvp_moves_fini(&out);
    kvp_moves_fini(&in);
    kvp_destroy(p);
}

// A full host tier evicts its least recently used block for a new offload;
// within one plan (every host block held) an evicted device block is
// simply forgotten.
static void test_tier_host_lru_eviction_when_full(void **state) {
    (void)state;
    kvp_pool *p = make_tier_pool(5, 2, 4);
    kvp_moves cp = {0}, out = {0}, in = {0};
    kvp_table a, b, c;
    kvp_table_init(&a);
    kvp_table_init(&b);
    kvp_table_init(&c);
    int32_t ta[13], tb[16], tc[9];
    seq_tokens(ta, 13, 100);
    seq_tokens(tb, 16, 500);
    seq_tokens(tc, 9, 900);
    grow(p, &a, 13, &cp);
    kvp_table_commit(p, &a, ta, 13); // 1 2 3 cached
    kvp_table_release(p, &a);        // free: 4 3 2 1
    grow(p, &b, 16, &cp);            // evicts 3 -> h0, 2 -> h1, 1: no room left
    kvp_take_tier_moves(p, &out, &in);
    ASSERT_MOVES(&out, 3, 0, 2, 1);
    kvp_stats st;
    kvp_stats_get(p, &st);
    assert_int_equal(st.offloads, 2);
    assert_int_equal(st.evictions, 3);
    kvp_release_holds(p); // host LRU: h0 (a's block 2), h1 (a's block 1)
    kvp_table_release(p, &b);
    // The next plan: c's two cached blocks are evicted; the host, full,
    // gives up its oldest blocks (h0 first).
    grow(p, &c, 9, &cp);
    kvp_table_commit(p, &c, tc, 9);
    kvp_table_release(p, &c);
    kvp_table d;
    kvp_table_init(&d);
    out.n = 0;
    grow(p, &d, 16, &cp);
    kvp_take_tier_moves(p, &out, &in);
    assert_int_equal(out.n, 2);
    assert_int_equal(out.v[0].to, 0);
    assert_int_equal(out.v[1].to, 1);
    kvp_stats_get(p, &st);
    assert_int_equal(st.host_evictions, 2);
    assert_int_equal(st.num_host_cached, 2);
    kvp_release_holds(p);
    kvp_table probe;
    kvp_table_init(&probe);
    assert_int_equal(kvp_table_lookup(p, &probe, tc, 9), 2); // c now on the host
    kvp_table_fini(&probe);
    kvp_table_init(&probe);
    assert_int_equal(kvp_table_lookup(p, &probe, ta, 13), 0); // a gone
    kvp_table_fini(&probe);
    kvp_table *ts[] = {&d};
    check_pool(p, ts, 1);
    kvp_table_release(p, &d);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_table_fini(&c);
    kvp_table_fini(&d);
    kvp_moves_fini(&cp);
    kvp_moves_fini(&out);
    kvp_moves_fini(&in);
    kvp_destroy(p);
}

// Swap preemption has priority: it takes host-cached blocks (evicting
// them), and while swapped tables hold the host an eviction is not
// offloaded.
static void test_tier_swap_takes_host_cache(void **state) {
    (void)state;
    kvp_pool *p = make_tier_pool(5, 2, 4);
    kvp_moves cp = {0}, out = {0}, in = {0}, mv = {0};
    kvp_table a, b, e;
    kvp_table_init(&a);
    kvp_table_init(&b);
    kvp_table_init(&e);
    int32_t ta[9], te[8];
    seq_tokens(ta, 9, 100);
    seq_tokens(te, 8, 700);
    grow(p, &a, 9, &cp);
    kvp_table_commit(p, &a, ta, 9);
    kvp_table_release(p, &a); // free 3 4 2 1
    grow(p, &b, 16, &cp);     // 2 -> h0, 1 -> h1
    kvp_take_tier_moves(p, &out, &in);
    kvp_release_holds(p);
    kvp_table_release(p, &b);
    assert_int_equal(kvp_num_host_free(p), 2); // cached but evictable
    grow(p, &e, 8, &cp);                        // 3 4
    kvp_table_commit(p, &e, te, 8);
    kvp_table *te_[] = {&e};
    assert_int_equal(kvp_swap_out(p, te_, 1, &mv), 0);
    ASSERT_MOVES(&mv, 3, 0, 4, 1);
    kvp_stats st;
    kvp_stats_get(p, &st);
    assert_int_equal(st.host_evictions, 2);
    assert_int_equal(st.num_host_cached, 0);
    kvp_table probe;
    kvp_table_init(&probe);
    assert_int_equal(kvp_table_lookup(p, &probe, ta, 9), 0);
    kvp_table_fini(&probe);
    // e's blocks 3, 4 stay cached on the device; evicting them now finds
    // no host room (e holds it all): no offload.
    out.n = 0;
    kvp_table f;
    kvp_table_init(&f);
    grow(p, &f, 16, &cp);
    kvp_take_tier_moves(p, &out, &in);
    assert_int_equal(out.n, 0);
    kvp_table *ts[] = {&e, &f};
    check_pool(p, ts, 2);
    kvp_table_release(p, &f);
    // The swap-in frees e's host blocks to the plan (held), not the pool.
    mv.n = 0;
    assert_int_equal(kvp_swap_in(p, te_, 1, &mv), 0);
    assert_int_equal(kvp_num_host_free(p), 0);
    check_pool(p, ts, 2);
    kvp_release_holds(p);
    assert_int_equal(kvp_num_host_free(p), 2);
    kvp_table_release(p, &e);
    check_pool(p, ts, 2);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_table_fini(&e);
    kvp_table_fini(&f);
    kvp_moves_fini(&cp);
    kvp_moves_fini(&out);
    kvp_moves_fini(&in);
    kvp_moves_fini(&mv);
    kvp_destroy(p);
}

// Random plans on a tiny pool with the host tier, against a model of the
// memory: every block holds the id of the content written into it, the
// plan's moves are applied in the runner's order (swap-out, swap-in,
// copies) and then the "forward" checks that every computed block of every
// table holds the content its tokens call for, and writes the new ones.
// Ref counts, free counts and the maps are checked after every plan.
// ahead: host_tier_ahead, whose copies (the last `n_ahead` of the plan's
// swap-outs) may run at any time between the plan's first move and the
// next plan's: here first in some plans, after the forward's writes in
// others.
static void tier_random_plans(bool reused_only, bool ahead, uint64_t seed0) {
    enum { NT = 10, MAXTOK = 48, BS = 4, NB = 20, NH = 10 };
    kvp_pool *p = make_tier_pool_ahead(NB, NH, BS, reused_only, ahead);
    kvp_moves cp = {0}, out = {0}, in = {0};
    kvp_table t[NT];
    kvp_table *ts[NT];
    int32_t tok[NT][MAXTOK], computed[NT] = {0}, dev[NB] = {0}, host[NH] = {0};
    for (int i = 0; i < NT; i++) {
        kvp_table_init(&t[i]);
        ts[i] = &t[i];
        for (int j = 0; j < MAXTOK; j++) tok[i][j] = (i % 3) * 1000 + j;
    }
    uint64_t rng = seed0;
    int64_t hits_total = 0;
    for (int plan = 0; plan < 4000; plan++) {
        kvp_release_holds(p);
        cp.n = out.n = in.n = 0;
        // The scheduler's order within a plan (scheduler/sched.c): the
        // tail of the running list is preempted (released or swapped out)
        // before it has grown this plan, the running tables grow (with
        // copy-on-write copies of tails their own forks share), then
        // admissions (swap-ins, lookups that may load from the host tier)
        // follow, which never preempt. So no block a plan loads or copies
        // into or out of is swapped out, released or reallocated by the same
        // plan, whose moves run swap-outs, swap-ins, then copies
        // (kvpool.h, kvp_swap_out). Here: releases and swap-outs first, then
        // growth and forks, then admissions; a table grown, forked or
        // loaded in this plan is not released or swapped out in it.
        bool touched[NT] = {false};
        int n_ops = 1 + (int)(rng_next(&rng) % 4), ops[4][2];
        for (int k = 0; k < n_ops; k++) {
            ops[k][0] = (int)(rng_next(&rng) % NT);
            ops[k][1] = (int)(rng_next(&rng) % 6);
        }
        for (int k = 0; k < 3 * n_ops; k++) {
            int i = ops[k % n_ops][0], op = ops[k % n_ops][1];
            kvp_table *x = &t[i];
            const int phase = op == 2 || op == 4 ? 0 : op == 5 || (op <= 1 && x->n_blocks == 0) ? 2 : 1;
            if (phase != k / n_ops) continue;
            switch (op) {
            case 0:
            case 1: { // grow, with a lookup when empty
                if (x->swapped) break;
                int32_t n = 1 + (int32_t)(rng_next(&rng) % 12);
                if (x->n_tokens + n > MAXTOK) break;
                int32_t hits = x->n_blocks ? 0 : kvp_table_lookup(p, x, tok[i], x->n_tokens + n);
                kvp_grow_item it = {x, hits, x->n_tokens + n - hits * BS - x->n_tokens};
                if (kvp_grow(p, &it, 1, &cp) == 0) {
                    touched[i] = true;
                    if (hits) {
                        computed[i] = hits * BS;
                        hits_total += hits;
                    }
                }
                break;
            }
            case 2:
                if (touched[i]) break;
                kvp_table_release(p, x);
                computed[i] = 0;
                break;
            case 3: { // fork
                int j = (int)(rng_next(&rng) % NT);
                if (j != i && t[j].n_blocks == 0 && j % 3 == i % 3) {
                    kvp_table_fork(p, x, &t[j], x->n_tokens);
                    computed[j] = computed[i];
                    touched[j] = true;
                }
                break;
            }
            case 4:
                if (x->n_blocks && !x->swapped && !touched[i]) (void)kvp_swap_out(p, &x, 1, &out);
                break;
            case 5:
                if (x->n_blocks && x->swapped && kvp_swap_in(p, &x, 1, &in) == 0) touched[i] = true;
                break;
            }
        }
        int32_t n_ahead = kvp_take_tier_moves(p, &out, &in), n_out = out.n - n_ahead;
        if (!ahead) assert_int_equal(n_ahead, 0);
        // Drawn only when copying ahead: the other walks stay the ones their seeds name.
        bool ahead_last = ahead && rng_next(&rng) % 2;
        for (int32_t m = n_out; !ahead_last && m < out.n; m++) host[out.v[m].to] = dev[out.v[m].from];
        for (int32_t m = 0; m < n_out; m++) host[out.v[m].to] = dev[out.v[m].from];
        for (int32_t m = 0; m < in.n; m++) dev[in.v[m].to] = host[in.v[m].from];
        for (int32_t m = 0; m < cp.n; m++) dev[cp.v[m].to] = dev[cp.v[m].from];
        for (int i = 0; i < NT; i++) {
            kvp_table *x = &t[i];
            int32_t n_done = (computed[i] + BS - 1) / BS; // blocks holding computed tokens
            for (int32_t j = 0; j < n_done; j++) {
                int32_t have = x->swapped ? host[x->blocks[j]] : dev[x->blocks[j]];
                int32_t want = (i % 3) * 1000 + j + 1;
                if (have != want)
                    fail_msg("plan %d: table %d block %d (%s %d) holds %d, want %d", plan, i, j,
                             x->swapped ? "host" : "device", x->blocks[j], have, want);
            }
            if (x->swapped || x->n_tokens == computed[i] || rng_next(&rng) % 4 == 0) continue;
            for (int32_t j = computed[i] / BS; j < x->n_blocks; j++) dev[x->blocks[j]] = (i % 3) * 1000 + j + 1;
            kvp_table_commit(p, x, tok[i], x->n_tokens);
            computed[i] = x->n_tokens;
        }
        for (int32_t m = n_out; ahead_last && m < out.n; m++) host[out.v[m].to] = dev[out.v[m].from];
        check_pool(p, ts, NT);
    }
    for (int i = 0; i < NT; i++) {
        kvp_table_release(p, &t[i]);
        kvp_table_fini(&t[i]);
    }
    kvp_release_holds(p);
    check_pool(p, ts, 0);
    kvp_stats st;
    kvp_stats_get(p, &st);
    print_message("tier random plans%s%s: %lld hits, %lld host-hit tokens, %lld offloads (%lld ahead), %lld "
                  "evictions, %lld host evictions\n", reused_only ? " (reused only)" : "", ahead ? " (ahead)" : "",
                  (long long)hits_total, (long long)st.host_hits, (long long)st.offloads,
                  (long long)st.offloads_ahead, (long long)st.evictions, (long long)st.host_evictions);
    assert_true(hits_total > 200 && st.host_hits > 100 && st.offloads > 100 && st.host_evictions > 20);
    if (ahead)
        assert_true(st.offloads_ahead > st.offloads / 4);
    else
        assert_int_equal(st.offloads_ahead, 0);
    assert_int_equal(st.num_free, NB - 1);
    assert_int_equal(st.num_host_used, 0);
    assert_int_equal(st.num_host_free, NH);
    kvp_moves_fini(&cp);
    kvp_moves_fini(&out);
    kvp_moves_fini(&in);
    kvp_destroy(p);
}

static void test_tier_random_plans_against_model(void **state) {
    (void)state;
    // 214 and 106 are walks that broke the plan-order contract before the
    // ops followed the scheduler's phases.
    for (uint64_t seed = 0; seed < 3; seed++) tier_random_plans(false, false, (uint64_t[]){7, 214, 106}[seed]);
}

// The same walk with --host-kv-offload reused: fewer offloads, the same
// contents wherever a host hit loads a block.
static void test_tier_reused_only_random_plans_against_model(void **state) {
    (void)state;
    for (uint64_t seed = 0; seed < 3; seed++) tier_random_plans(true, false, (uint64_t[]){7, 214, 106}[seed]);
}

// The same walks with host_tier_ahead (both policies): the copies ahead,
// run first or after the forward, never copy a block that changes later.
static void test_tier_ahead_random_plans_against_model(void **state) {
    (void)state;
    for (uint64_t seed = 0; seed < 3; seed++) {
        tier_random_plans(false, true, (uint64_t[]){7, 214, 106}[seed]);
        tier_random_plans(true, true, (uint64_t[]){7, 214, 106}[seed]);
    }
}

// ---------------------------------------------------------------------------
// Layer groups

static kvp_pool *make_group_pool_ahead(int32_t n_blocks, int32_t n_host, int32_t bs, int32_t n_groups,
                                       const int32_t *win, bool tier, bool ahead) {
    kvp_config c;
    kvp_config_default(&c);
    c.num_blocks = n_blocks;
    c.num_host_blocks = n_host;
    c.block_size = bs;
    c.enable_host_tier = tier;
    c.host_tier_ahead = ahead;
    c.n_groups = n_groups;
    for (int32_t g = 0; g < n_groups; g++) c.group_window[g] = win[g];
    kvp_pool *p = NULL;
    if (kvp_create(&c, &p) != 0) fail_msg("%s", pg_err_msg());
    return p;
}

static kvp_pool *make_group_pool(int32_t n_blocks, int32_t n_host, int32_t bs, int32_t n_groups,
                                 const int32_t *win, bool tier) {
    return make_group_pool_ahead(n_blocks, n_host, bs, n_groups, win, tier, false);
}

// Checks the pool against the owners kvp_table_count_owners counts, and the
// shape of every table: no null in a full group's column, a windowed
// group's nulls a prefix of its column, a null tail only on a block
// boundary (the next write starts a new row).
static void check_groups(const kvp_pool *p, kvp_table **tables, int32_t n) {
    int32_t nb = kvp_num_usable(p) + 1, nh = kvp_num_host_blocks(p), G = kvp_num_groups(p);
    int32_t *dev = calloc((size_t)nb, sizeof(int32_t));
    int32_t *host = calloc((size_t)(nh ? nh : 1), sizeof(int32_t));
    for (int32_t i = 0; i < n; i++) {
        const kvp_table *t = tables[i];
        kvp_table_count_owners(p, t, dev, host);
        int32_t null = t->swapped ? -1 : 0;
        for (int32_t g = 0; g < G; g++) {
            bool seen_block = false;
            for (int32_t j = 0; j < t->n_blocks; j++) {
                int32_t b = t->blocks[j * G + g];
                if (b == null) {
                    if (kvp_group_window(p, g) == 0 || seen_block)
                        fail_msg("table %d group %d row %d: null out of place", i, g, j);
                    if (j == t->n_blocks - 1 && t->n_tokens % kvp_block_size(p) != 0)
                        fail_msg("table %d group %d: null partial tail", i, g);
                } else {
                    if (t->swapped ? (b < 0 || b >= nh) : (b <= 0 || b >= nb))
                        fail_msg("table %d group %d row %d: bad id %d", i, g, j, b);
                    seen_block = true;
                }
            }
        }
    }
    int rc = kvp_check(p, dev, host);
    if (rc) fail_msg("%s", pg_err_msg());
    free(dev);
    free(host);
}

static void assert_entries(const kvp_table *t, int32_t G, const int32_t *want, int32_t n) {
    assert_int_equal(t->n_blocks * G, n);
    for (int32_t i = 0; i < n; i++) {
        if (t->blocks[i] != want[i])
            fail_msg("row %d group %d is %d, want %d", i / G, i % G, t->blocks[i], want[i]);
    }
}
// Entries row by row (G a row) of a table of two groups.
#define ASSERT_ROWS2(t, ...)                                                                       \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        assert_entries((t), 2, want_, (int32_t)(sizeof want_ / sizeof want_[0]));                  \
    } while (0)

// kvp_grow of one item whose free-count drop must be kvp_grow_cost exactly.
static int32_t grow_exact(kvp_pool *p, kvp_table *t, int32_t n_hits, int32_t n_new, kvp_moves *cp) {
    kvp_grow_item it = {t, n_hits, n_new};
    int32_t cost = kvp_grow_cost(p, &it, 1), before = kvp_num_free(p);
    assert_int_equal(kvp_grow(p, &it, 1, cp), 0);
    assert_int_equal(before - kvp_num_free(p), cost);
    return cost;
}

// Two groups (full, window 6) on 4-token blocks: rows of two blocks,
// sliding drops the windowed group's blocks that no query to come sees
// (never the tail), fork shares and copies per group, swap keeps the nulls
// in place, truncate and release drop every non-null entry.
static void test_groups_rows_slide_fork_swap(void **state) {
    (void)state;
    const int32_t win[2] = {0, 6};
    kvp_pool *p = make_group_pool(16, 16, 4, 2, win, false);
    assert_int_equal(kvp_num_groups(p), 2);
    assert_int_equal(kvp_group_window(p, 0), 0);
    assert_int_equal(kvp_group_window(p, 1), 6);
    kvp_moves cp = {0}, mv = {0};
    kvp_table a, b, c;
    kvp_table_init(&a);
    kvp_table_init(&b);
    kvp_table_init(&c);
    kvp_table *ts[3] = {&a, &b, &c};
    assert_int_equal(grow_exact(p, &a, 0, 10, &cp), 6); // 3 rows, allocated row by row
    ASSERT_ROWS2(&a, 1, 2, 3, 4, 5, 6);
    // From position 9 on queries see keys 4.. : row 0 of the window group goes.
    assert_int_equal(kvp_table_slide(p, &a, 8), 0);
    assert_int_equal(kvp_table_slide(p, &a, 9), 1);
    assert_int_equal(kvp_table_slide(p, &a, 9), 0);
    ASSERT_ROWS2(&a, 1, 0, 3, 4, 5, 6);
    assert_int_equal(kvp_block_ref(p, 2), 0);
    assert_int_equal(kvp_num_free(p), 10);
    check_groups(p, ts, 3);
    assert_int_equal(grow_exact(p, &a, 0, 6, &cp), 2); // 16 tokens: row 3 reuses 2 first
    ASSERT_ROWS2(&a, 1, 0, 3, 4, 5, 6, 2, 7);
    assert_int_equal(kvp_table_slide(p, &a, 16), 1); // row 1; row 0 is null already
    ASSERT_ROWS2(&a, 1, 0, 3, 0, 5, 6, 2, 7);
    assert_int_equal(kvp_table_slide(p, &a, 100), 1); // never the tail row
    ASSERT_ROWS2(&a, 1, 0, 3, 0, 5, 0, 2, 7);
    assert_int_equal(kvp_num_free(p), 10);
    check_groups(p, ts, 3);

    // Fork shares the non-null entries and keeps the nulls.
    kvp_table_fork(p, &a, &b, 16);
    ASSERT_ROWS2(&b, 1, 0, 3, 0, 5, 0, 2, 7);
    assert_int_equal(kvp_block_ref(p, 7), 2);
    assert_int_equal(grow_exact(p, &b, 0, 1, &cp), 2); // a new row (6, 4) for b
    ASSERT_ROWS2(&b, 1, 0, 3, 0, 5, 0, 2, 7, 6, 4);
    assert_int_equal(grow_exact(p, &a, 0, 1, &cp), 2);
    ASSERT_ROWS2(&a, 1, 0, 3, 0, 5, 0, 2, 7, 8, 9);
    // c writes into the shared partial tail row: one copy per group.
    kvp_table_fork(p, &b, &c, 17);
    assert_int_equal(grow_exact(p, &c, 0, 1, &cp), 2);
    ASSERT_MOVES(&cp, 6, 10, 4, 11);
    ASSERT_ROWS2(&c, 1, 0, 3, 0, 5, 0, 2, 7, 10, 11);
    check_groups(p, ts, 3);

    // Swap out a and b: one host block per distinct non-null block, the
    // nulls become -1.
    kvp_table *ab[2] = {&a, &b};
    assert_int_equal(kvp_swap_out_cost(p, ab, 2), 9);
    assert_int_equal(kvp_swap_out(p, ab, 2, &mv), 0);
    ASSERT_MOVES(&mv, 1, 0, 3, 1, 5, 2, 2, 3, 7, 4, 8, 5, 9, 6, 6, 7, 4, 8);
    ASSERT_ROWS2(&a, 0, -1, 1, -1, 2, -1, 3, 4, 5, 6);
    ASSERT_ROWS2(&b, 0, -1, 1, -1, 2, -1, 3, 4, 7, 8);
    assert_int_equal(kvp_num_host_free(p), 7);
    assert_int_equal(kvp_num_free(p), 8);
    assert_int_equal(kvp_table_slide(p, &a, 100), 0); // swapped: no-op
    check_groups(p, ts, 3);
    kvp_table_release(p, &c);
    assert_int_equal(kvp_num_free(p), 15);
    assert_int_equal(kvp_swap_in_cost(p, ab, 2), 9);
    mv.n = 0;
    assert_int_equal(kvp_swap_in(p, ab, 2, &mv), 0);
    ASSERT_MOVES(&mv, 0, 1, 1, 3, 2, 5, 3, 2, 4, 7, 5, 10, 6, 11, 7, 6, 8, 4);
    ASSERT_ROWS2(&a, 1, 0, 3, 0, 5, 0, 2, 7, 10, 11);
    ASSERT_ROWS2(&b, 1, 0, 3, 0, 5, 0, 2, 7, 6, 4);
    assert_int_equal(kvp_num_host_free(p), 16);
    assert_int_equal(kvp_num_free(p), 6);
    check_groups(p, ts, 3);

    // Truncate drops whole rows, every group, nulls skipped; a null tail on
    // a block boundary is fine (the next write starts a row).
    kvp_table_truncate(p, &a, 9);
    ASSERT_ROWS2(&a, 1, 0, 3, 0, 5, 0);
    assert_int_equal(kvp_num_free(p), 8);
    kvp_table_truncate(p, &a, 4);
    ASSERT_ROWS2(&a, 1, 0);
    assert_int_equal(grow_exact(p, &a, 0, 1, &cp), 2);
    ASSERT_ROWS2(&a, 1, 0, 10, 11);
    check_groups(p, ts, 3);
    kvp_table_release(p, &a);
    kvp_table_release(p, &b);
    check_groups(p, ts, 3);
    assert_int_equal(kvp_num_free(p), 15);
    for (int i = 0; i < 3; i++) kvp_table_fini(ts[i]);
    kvp_moves_fini(&cp);
    kvp_moves_fini(&mv);
    kvp_destroy(p);
}

// Computes a sequence of n tokens like the engine would: a prefill of 8,
// then steps of 4 (the last may be shorter), each committed after its
// forward and, with `slide`, followed by a slide to the computed positions.
// ids[row][g] records the block each entry got.
static void compute_seq(kvp_pool *p, kvp_table *t, const int32_t *tok, int32_t n, bool slide,
                        int32_t ids[][KVP_MAX_GROUPS]) {
    kvp_moves cp = {0};
    const int32_t G = kvp_num_groups(p);
    while (t->n_tokens < n) {
        int32_t step = t->n_tokens == 0 ? 8 : 4, rows = t->n_blocks;
        if (step > n - t->n_tokens) step = n - t->n_tokens;
        grow_exact(p, t, 0, step, &cp);
        for (int32_t j = rows; j < t->n_blocks; j++)
            for (int32_t g = 0; g < G; g++) ids[j][g] = t->blocks[j * G + g];
        kvp_table_commit(p, t, tok, t->n_tokens);
        if (slide) kvp_table_slide(p, t, t->n_tokens);
    }
    assert_int_equal(cp.n, 0);
    kvp_moves_fini(&cp);
}

// Allocates (into `filler`) every free block without a hash and then the
// first `n_cached` cached ones of the LRU order.
static void evict_cached(kvp_pool *p, kvp_table *filler, int32_t n_cached) {
    kvp_stats st;
    kvp_stats_get(p, &st);
    int32_t n = st.num_free - st.num_cached_free + n_cached, G = kvp_num_groups(p);
    assert_int_equal(n % G, 0);
    kvp_moves cp = {0};
    grow_exact(p, filler, 0, n / G * kvp_block_size(p), &cp);
    kvp_moves_fini(&cp);
}

// Prefix hits with groups (full, window 6; 4-token blocks; 33 tokens, so
// at most 8 blocks hit and the windowed group needs blocks 6 and 7 for
// that: a query at 32 sees keys 27..32).
static void test_groups_prefix_hits(void **state) {
    (void)state;
    const int32_t win[2] = {0, 6};
    int32_t tok[33], ids[9][KVP_MAX_GROUPS];
    seq_tokens(tok, 33, 500);
    kvp_moves cp = {0};
    for (int variant = 0; variant < 3; variant++) {
        // 0: slid blocks stay cached; 1: the early windowed blocks are
        // evicted; 2: no slide, the tail's windowed block 6 evicted.
        kvp_pool *p = make_group_pool(variant == 2 ? 64 : 65, 0, 4, 2, win, false);
        kvp_table a, b, filler;
        kvp_table_init(&a);
        kvp_table_init(&b);
        kvp_table_init(&filler);
        kvp_table *ts[3] = {&a, &b, &filler};
        compute_seq(p, &a, tok, 33, variant != 2, ids);
        for (int32_t j = 0; j < 9; j++) {
            int32_t want = variant != 2 && j < 7 ? 0 : ids[j][1];
            if (a.blocks[j * 2 + 1] != want) fail_msg("variant %d row %d: %d", variant, j, a.blocks[j * 2 + 1]);
            assert_int_equal(a.blocks[j * 2], ids[j][0]);
        }
        assert_int_equal(a.n_cached, 8);
        check_groups(p, ts, 3);
        kvp_table_release(p, &a);
        if (variant == 1) evict_cached(p, &filler, 4); // windowed rows 0..3
        if (variant == 2) evict_cached(p, &filler, 3); // rows 7 (both groups), then 6 of the window
        check_groups(p, ts, 3);
        int32_t k = kvp_table_lookup(p, &b, tok, 33);
        if (variant < 2) {
            assert_int_equal(k, 8);
            // 8 full blocks, windowed blocks 6 and 7, a fresh row.
            assert_int_equal(grow_exact(p, &b, k, 1, &cp), 12);
            for (int32_t j = 0; j < 8; j++) {
                assert_int_equal(b.blocks[j * 2], ids[j][0]);
                assert_int_equal(b.blocks[j * 2 + 1], j < 6 ? 0 : ids[j][1]);
            }
            if (variant == 0) { // the released partial row comes back first
                assert_int_equal(b.blocks[16], ids[8][0]);
                assert_int_equal(b.blocks[17], ids[8][1]);
            } else { // the pool is full: the oldest cached windowed blocks go
                assert_int_equal(kvp_num_free(p), 0);
                assert_int_equal(b.blocks[16], ids[4][1]);
                assert_int_equal(b.blocks[17], ids[5][1]);
            }
        } else {
            // Full blocks 0..6 are cached but k = 7 needs windowed 5 and 6:
            // k = 6 needs windowed 4 and 5 only.
            assert_int_equal(k, 6);
            assert_int_equal(grow_exact(p, &b, k, 1, &cp), 10);
            ASSERT_ROWS2(&b, ids[0][0], 0, ids[1][0], 0, ids[2][0], 0, ids[3][0], 0, ids[4][0],
                         ids[4][1], ids[5][0], ids[5][1], ids[6][0], ids[3][1]);
        }
        assert_int_equal(b.n_cached, k);
        assert_int_equal(b.n_tokens, k * 4 + 1);
        assert_int_equal(cp.n, 0);
        check_groups(p, ts, 3);
        kvp_table_release(p, &b);
        kvp_table_release(p, &filler);
        check_groups(p, ts, 3);
        for (int i = 0; i < 3; i++) kvp_table_fini(ts[i]);
        kvp_destroy(p);
    }
    // Every layer windowed (Mistral-like): no full group bounds the hit.
    const int32_t win1[1] = {6};
    kvp_pool *p = make_group_pool(32, 0, 4, 1, win1, false);
    kvp_table a, b;
    kvp_table_init(&a);
    kvp_table_init(&b);
    compute_seq(p, &a, tok, 33, true, ids);
    assert_int_equal(a.blocks[6], 0);
    kvp_table_release(p, &a);
    assert_int_equal(kvp_table_lookup(p, &b, tok, 33), 8);
    assert_int_equal(grow_exact(p, &b, 8, 1, &cp), 3);
    ASSERT_BLOCKS(&b, 0, 0, 0, 0, 0, 0, ids[6][0], ids[7][0], ids[8][0]);
    kvp_table *ts1[2] = {&a, &b};
    check_groups(p, ts1, 2);
    kvp_table_release(p, &b);
    kvp_table_fini(&a);
    kvp_table_fini(&b);
    kvp_destroy(p);
    kvp_moves_fini(&cp);
}

// kvp_blocks_for: a full group holds the whole sequence, a windowed one at
// most its window plus a piece (and never more than the sequence).
static void test_groups_blocks_for(void **state) {
    (void)state;
    kvp_pool *p = make_pool(8, 0, 4, true);
    assert_int_equal(kvp_blocks_for(p, 10, 4), 3);
    assert_int_equal(kvp_blocks_for(p, 16, 8), 4);
    assert_int_equal(kvp_blocks_for(p, 0, 8), 0);
    kvp_destroy(p);
    const int32_t w2[2] = {0, 6};
    p = make_group_pool(8, 0, 4, 2, w2, false);
    assert_int_equal(kvp_blocks_for(p, 33, 4), 9 + 4); // ceil((5 + 4) / 4) + 1
    assert_int_equal(kvp_blocks_for(p, 33, 0), 9 + 9); // one piece: all of it
    assert_int_equal(kvp_blocks_for(p, 5, 4), 2 + 2);
    kvp_destroy(p);
    const int32_t w6[6] = {0, 8, 8, 8, 8, 8};
    p = make_group_pool(8, 0, 16, 6, w6, false);
    assert_int_equal(kvp_blocks_for(p, 1000, 64), 63 + 5 * 6);
    kvp_destroy(p);
    const int32_t w1[1] = {4096};
    p = make_group_pool(8, 0, 16, 1, w1, false);
    assert_int_equal(kvp_blocks_for(p, 100000, 512), 289);
    assert_int_equal(kvp_blocks_for(p, 1000, 512), 63);
    kvp_destroy(p);
}

static void test_groups_config(void **state) {
    (void)state;
    kvp_config c;
    kvp_config_default(&c);
    c.num_blocks = 8;
    kvp_pool *p = NULL;
    assert_int_equal(kvp_create(&c, &p), 0); // 0 groups count as 1
    assert_int_equal(kvp_num_groups(p), 1);
    assert_int_equal(kvp_group_window(p, 0), 0);
    kvp_destroy(p);
    c.n_groups = KVP_MAX_GROUPS + 1;
    assert_int_equal(kvp_create(&c, &p), PG_EINVAL);
    assert_null(p);
    c.n_groups = -1;
    assert_int_equal(kvp_create(&c, &p), PG_EINVAL);
    c.n_groups = 2;
    c.group_window[1] = -1;
    assert_int_equal(kvp_create(&c, &p), PG_EINVAL);
    assert_non_null(strstr(pg_err_msg(), "window"));
    c.group_window[1] = 0;
    c.group_window[2] = -5; // beyond n_groups: not read
    assert_int_equal(kvp_create(&c, &p), 0);
    kvp_destroy(p);
    c.n_groups = KVP_MAX_GROUPS;
    c.group_window[2] = 0;
    assert_int_equal(kvp_create(&c, &p), 0);
    assert_int_equal(kvp_num_groups(p), KVP_MAX_GROUPS);
    kvp_destroy(p);
}

typedef struct group_stress {
    int32_t n_groups, win[KVP_MAX_GROUPS];
    int32_t num_blocks, num_host;
    bool tier;
    uint64_t seed;
    bool ahead; // host_tier_ahead (with tier)
} group_stress;

static int32_t content_of(int cls, int32_t row, int32_t g) { return cls * 100000 + row * 100 + g + 1; }

// Random plans of grow (with lookups and hits), commit, slide, fork,
// truncate, swap and release against a model of the memory, as in
// test_tier_random_plans_against_model, per group: every computed non-null
// entry must hold its (tokens, row, group) content. After every operation
// the pool matches the owners kvp_table_count_owners counts and every
// growth or swap consumes exactly its cost. Plans of several operations
// with the host tier only: without it a host block freed by a swap-in is
// free at once, and a swap-out of the same plan (run first) may write it.
static void run_group_stress(const group_stress *s, int64_t *n_hits, int64_t *n_slid) {
    enum { NT = 10, MAXTOK = 48, BS = 4, PLANS = 20000 };
    kvp_pool *p = make_group_pool_ahead(s->num_blocks, s->num_host, BS, s->n_groups, s->win, s->tier, s->ahead);
    const int32_t G = s->n_groups, NB = s->num_blocks, NH = s->num_host;
    kvp_moves cp = {0}, out = {0}, in = {0};
    kvp_table t[NT];
    kvp_table *ts[NT];
    int32_t tok[NT][MAXTOK], computed[NT] = {0};
    int32_t *dev = calloc((size_t)NB, sizeof(int32_t)), *host = calloc((size_t)NH + 1, sizeof(int32_t));
    for (int i = 0; i < NT; i++) {
        kvp_table_init(&t[i]);
        ts[i] = &t[i];
        for (int j = 0; j < MAXTOK; j++) tok[i][j] = (i % 3) * 1000 + j;
    }
    uint64_t rng = s->seed;
    for (int plan = 0; plan < PLANS; plan++) {
        kvp_release_holds(p);
        cp.n = out.n = in.n = 0;
        // Without the host tier nothing holds a host block a swap-in reads
        // until the plan ran, so a plan there is one operation.
        int n_ops = s->tier ? 1 + (int)(rng_next(&rng) % 4) : 1;
        // Tables whose blocks this plan's swap-ins or copies write: the
        // runner performs swap-outs first, so a scheduler never swaps such a
        // table out in the same step.
        bool touched[NT] = {0};
        for (int op = 0; op < n_ops; op++) {
            int i = (int)(rng_next(&rng) % NT);
            kvp_table *x = &t[i];
            switch (rng_next(&rng) % 9) {
            case 0:
            case 1: { // grow one or two tables, lookups for empty ones
                kvp_grow_item it[2];
                int ni = 0, who[2];
                int j = rng_next(&rng) % 3 == 0 ? (int)(rng_next(&rng) % NT) : i;
                for (int r = 0; r < (j == i ? 1 : 2); r++) {
                    int k = r ? j : i;
                    int32_t n = 1 + (int32_t)(rng_next(&rng) % 12);
                    if (t[k].swapped || t[k].n_tokens + n > MAXTOK) continue;
                    int32_t len = t[k].n_tokens + n;
                    int32_t hits = t[k].n_blocks ? 0 : kvp_table_lookup(p, &t[k], tok[k], len);
                    if (hits * BS >= len) fail_msg("hit covers the whole sequence");
                    it[ni] = (kvp_grow_item){&t[k], hits, len - hits * BS - t[k].n_tokens};
                    who[ni++] = k;
                }
                if (ni == 0) break;
                int32_t cost = kvp_grow_cost(p, it, ni), before = kvp_num_free(p);
                int rc = kvp_grow(p, it, ni, &cp);
                if (rc == 0) {
                    assert_int_equal(before - kvp_num_free(p), cost);
                    for (int r = 0; r < ni; r++) touched[who[r]] = true;
                    for (int r = 0; r < ni; r++)
                        if (it[r].n_hits) {
                            computed[who[r]] = it[r].n_hits * BS;
                            *n_hits += it[r].n_hits;
                        }
                } else {
                    assert_int_equal(rc, PG_ENOSPC);
                    assert_true(cost > before);
                    assert_int_equal(kvp_num_free(p), before);
                }
                break;
            }
            case 2: // slide to the computed positions
                *n_slid += kvp_table_slide(p, x, computed[i]);
                assert_int_equal(kvp_table_slide(p, x, computed[i]), 0);
                break;
            case 3: { // fork into an empty table with the same tokens
                int j = (int)(rng_next(&rng) % NT);
                if (j != i && t[j].n_blocks == 0 && j % 3 == i % 3) {
                    kvp_table_fork(p, x, &t[j], x->n_tokens);
                    computed[j] = computed[i];
                    touched[j] = touched[i];
                }
                break;
            }
            case 4: { // truncate the slots not computed yet (rejected drafts)
                if (x->swapped || x->n_blocks == 0) break;
                int32_t lo = x->n_cached * BS > computed[i] ? x->n_cached * BS : computed[i];
                kvp_table_truncate(p, x, lo + (int32_t)(rng_next(&rng) % (uint64_t)(x->n_tokens - lo + 1)));
                break;
            }
            case 5:
                kvp_table_release(p, x);
                computed[i] = 0;
                break;
            case 6:
                if (x->n_blocks && !x->swapped && !touched[i]) {
                    int32_t cost = kvp_swap_out_cost(p, &x, 1), before = kvp_num_host_free(p);
                    if (kvp_swap_out(p, &x, 1, &out) == 0) {
                        assert_int_equal(before - kvp_num_host_free(p), cost);
                    } else {
                        assert_true(cost > before);
                    }
                }
                break;
            case 7:
            case 8:
                if (x->n_blocks && x->swapped) {
                    int32_t cost = kvp_swap_in_cost(p, &x, 1), before = kvp_num_free(p);
                    if (kvp_swap_in(p, &x, 1, &in) == 0) {
                        assert_int_equal(before - kvp_num_free(p), cost);
                        touched[i] = true;
                    } else {
                        assert_true(cost > before);
                    }
                }
                break;
            }
            check_groups(p, ts, NT);
        }
        // The runner: swap-outs, swap-ins, copies; then the forward.
        int32_t n_ahead = kvp_take_tier_moves(p, &out, &in), n_out = out.n - n_ahead;
        if (!s->ahead) assert_int_equal(n_ahead, 0);
        // Drawn only when copying ahead: the other walks stay the ones their seeds name.
        bool ahead_last = s->ahead && rng_next(&rng) % 2;
        for (int32_t m = n_out; !ahead_last && m < out.n; m++) host[out.v[m].to] = dev[out.v[m].from];
        for (int32_t m = 0; m < n_out; m++) host[out.v[m].to] = dev[out.v[m].from];
        for (int32_t m = 0; m < in.n; m++) dev[in.v[m].to] = host[in.v[m].from];
        for (int32_t m = 0; m < cp.n; m++) dev[cp.v[m].to] = dev[cp.v[m].from];
        for (int i = 0; i < NT; i++) {
            kvp_table *x = &t[i];
            for (int32_t j = 0; j < (computed[i] + BS - 1) / BS; j++)
                for (int32_t g = 0; g < G; g++) {
                    int32_t b = x->blocks[j * G + g];
                    if (b == (x->swapped ? -1 : 0)) continue;
                    int32_t have = x->swapped ? host[b] : dev[b];
                    if (have != content_of(i % 3, j, g))
                        fail_msg("seed %d plan %d: table %d row %d group %d (%s %d) holds %d, want %d",
                                 (int)s->seed, plan, i, j, g, x->swapped ? "host" : "device", b, have, content_of(i % 3, j, g));
                }
            if (x->swapped || x->n_tokens == computed[i] || rng_next(&rng) % 4 == 0) continue;
            for (int32_t j = computed[i] / BS; j < x->n_blocks; j++)
                for (int32_t g = 0; g < G; g++) {
                    assert_int_not_equal(x->blocks[j * G + g], 0); // rows to write are never slid
                    dev[x->blocks[j * G + g]] = content_of(i % 3, j, g);
                }
            kvp_table_commit(p, x, tok[i], x->n_tokens);
            computed[i] = x->n_tokens;
        }
        for (int32_t m = n_out; ahead_last && m < out.n; m++) host[out.v[m].to] = dev[out.v[m].from];
        check_groups(p, ts, NT);
    }
    for (int i = 0; i < NT; i++) kvp_table_release(p, &t[i]);
    kvp_release_holds(p);
    check_groups(p, ts, NT);
    assert_int_equal(kvp_num_free(p), NB - 1);
    assert_int_equal(kvp_num_host_free(p), NH);
    kvp_stats st;
    kvp_stats_get(p, &st);
    if (s->ahead && st.offloads_ahead < 50)
        fail_msg("seed %d: %lld copies ahead", (int)s->seed, (long long)st.offloads_ahead);
    for (int i = 0; i < NT; i++) kvp_table_fini(&t[i]);
    free(dev);
    free(host);
    kvp_moves_fini(&cp);
    kvp_moves_fini(&out);
    kvp_moves_fini(&in);
    kvp_destroy(p);
}

static void test_groups_random_plans(void **state) {
    (void)state;
    const group_stress cfgs[] = {
        {1, {0}, 24, 0, false, 1, false},                  // the plain pool
        {1, {0}, 24, 12, true, 2, false},                  // the plain pool, host tier
        {2, {0, 6}, 40, 0, false, 3, false},               // full + sliding window
        {2, {0, 6}, 40, 16, false, 4, false},              // ... with swap space
        {2, {0, 9}, 40, 16, true, 5, false},               // ... with the host tier
        {6, {0, 6, 6, 6, 6, 6}, 110, 40, false, 6, false}, // Gemma-like: 1 full, 5 windowed
        {6, {0, 6, 6, 6, 6, 6}, 110, 40, true, 7, false},
        {1, {6}, 16, 0, false, 8, false}, // every layer windowed (Mistral-like)
        {1, {6}, 16, 8, true, 9, false},
        // The host tier copying ahead (kvp_config.host_tier_ahead).
        {1, {0}, 24, 12, true, 10, true},
        {2, {0, 9}, 40, 16, true, 11, true},
        {6, {0, 6, 6, 6, 6, 6}, 110, 40, true, 12, true},
        {1, {6}, 16, 8, true, 13, true},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        int64_t n_hits = 0, n_slid = 0;
        run_group_stress(&cfgs[c], &n_hits, &n_slid);
        // The walk did reach the interesting paths.
        if (n_hits < 50) fail_msg("config %zu: %lld hits", c, (long long)n_hits);
        bool windowed = cfgs[c].win[cfgs[c].n_groups - 1] > 0;
        if (windowed && n_slid < 50) fail_msg("config %zu: %lld slid", c, (long long)n_slid);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_rejected),
        cmocka_unit_test(test_alloc_ascending_skips_null_block),
        cmocka_unit_test(test_alloc_all_or_nothing),
        cmocka_unit_test(test_release_uncached_reused_first),
        cmocka_unit_test(test_prefix_hit_shares_full_blocks),
        cmocka_unit_test(test_prefix_hit_never_whole_prompt),
        cmocka_unit_test(test_freed_cached_blocks_lru_eviction),
        cmocka_unit_test(test_duplicate_content_stays_private),
        cmocka_unit_test(test_prefix_caching_off),
        cmocka_unit_test(test_hash_is_chained),
        cmocka_unit_test(test_fork_cow_on_shared_partial_block),
        cmocka_unit_test(test_cow_partial_writers),
        cmocka_unit_test(test_fork_on_block_boundary_no_copy),
        cmocka_unit_test(test_cow_needs_room),
        cmocka_unit_test(test_move_blocks),
        cmocka_unit_test(test_swap_out_and_in_plans),
        cmocka_unit_test(test_swap_all_or_nothing),
        cmocka_unit_test(test_swap_in_reoffers_cached_blocks),
        cmocka_unit_test(test_grow_cost_on_swapped_tables),
        cmocka_unit_test(test_stats_usage),
        cmocka_unit_test(test_random_ops_keep_invariants),
        cmocka_unit_test(test_tier_eviction_offloads_to_host),
        cmocka_unit_test(test_tier_reused_only),
        cmocka_unit_test(test_tier_lookup_hits_host_and_loads),
        cmocka_unit_test(test_tier_host_lru_eviction_when_full),
        cmocka_unit_test(test_tier_swap_takes_host_cache),
        cmocka_unit_test(test_tier_random_plans_against_model),
        cmocka_unit_test(test_tier_reused_only_random_plans_against_model),
        cmocka_unit_test(test_tier_ahead_random_plans_against_model),
        cmocka_unit_test(test_groups_rows_slide_fork_swap),
        cmocka_unit_test(test_groups_prefix_hits),
        cmocka_unit_test(test_groups_blocks_for),
        cmocka_unit_test(test_groups_config),
        cmocka_unit_test(test_groups_random_plans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
