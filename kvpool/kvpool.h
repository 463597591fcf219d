// kvpool/kvpool.h - KV block pool bookkeeping: block numbers, never memory.
//
// The pool hands out device block ids 1..num_blocks-1 (block 0 is the null
// block, never handed out) and host (swap) block ids 0..num_host_blocks-1.
// The runner owns the memory those ids index; the pool only counts owners.
//
// Device blocks
//   - ref counts: a block's ref is the number of block tables holding it.
//     A block with ref 0 sits in the free list (allocatable).
//   - free list: doubly linked, LRU order. Allocation pops the head. A freed
//     block that carries a prefix-cache hash is appended at the tail (kept
//     for reuse as long as possible); one without a hash is pushed at the
//     head (nothing to keep). Tables are freed tail first, so of a freed
//     sequence the head blocks (shared prompts) are evicted last.
//   - prefix cache (automatic prefix caching, vLLM style): a FULL block of a
//     sequence is keyed by h_i = XXH3_128(h_{i-1} || its block_size token
//     ids), h_{-1} a fixed constant. A block is offered to the cache only
//     once its tokens were computed (kvp_table_commit, after the forward),
//     so a same-step lookup can never read a block still being written.
//     Cached blocks whose ref drops to 0 stay findable until the free list
//     hands them out again (eviction = popping a hashed block).
//   - allocation is all or nothing: kvp_grow() either performs every
//     growth in its batch or returns PG_ENOSPC and changes nothing.
//
// Block tables (kvp_table): one per sequence, covering positions
// [0, n_tokens). Sharing (parallel sampling, prefix hits) is by ref count;
// writing into a shared partial tail block first copies it (copy on write)
// into a fresh block and reports the copy as a move for the runner.
//
// Swap: kvp_swap_out() / kvp_swap_in() move whole tables between device
// and host ids, keeping sibling sharing, and report (from, to) moves.
//
// Host tier (enable_host_tier, with prefix caching and host blocks): a
// cached device block that allocation evicts is first copied to a free (or
// the least recently used host-cached) host block, an offload, and stays
// findable there by its hash; kvp_table_lookup counts host blocks as hits
// and kvp_grow loads them into fresh device blocks. Both kinds of move
// collect in the pool until kvp_take_tier_moves hands them to the plan as
// swap-out and swap-in moves. Swapped tables take host blocks before the
// host cache (they evict it; it never evicts them). Every host block a
// plan's moves read or write is held until kvp_release_holds, so one plan
// never writes a host block twice nor one that it reads.
//
// Layer groups (docs/kv_layer_groups.md; vLLM's hybrid KV cache manager):
// with n_groups > 1, or one group with a window, a sequence's table holds a
// block per group for each block_size positions, all from the one pool (a
// block's memory holds one group's share of layers). Group g's layers look
// back group_window[g] positions (the query at p sees keys (p - window, p];
// 0: every earlier key). A windowed group's blocks that lie wholly before
// every future query's window are dropped (kvp_table_slide) and read as the
// null entry. Prefix-cache keys are per group; a lookup hits k blocks only
// where every full group holds blocks [0, k) and every windowed group the
// blocks of the window before position k * block_size. With one group and
// no window every function behaves as the plain pool.
//
// Not thread-safe: one thread (the engine loop) owns a pool.
#pragma once
#include <stdbool.h>
#include <stdint.h>

typedef struct kvp_pool kvp_pool;

#define KVP_MAX_GROUPS 16

typedef struct kvp_config {
    int32_t num_blocks;         // device blocks including the null block 0 (>= 2)
    int32_t num_host_blocks;    // host swap blocks (0 = no swap space)
    int32_t block_size;         // tokens per block (default 16)
    bool enable_prefix_caching; // default true
    bool enable_host_tier;      // evicted cached blocks go to free host blocks (default false)
    // With the host tier: offload only blocks a lookup has hit since they
    // were cached (SGLang's write_through_selective), so traffic whose
    // prefixes never repeat costs no copy (docs/engine.md); default false:
    // every evicted cached block.
    bool host_tier_reused_only;
    // With the host tier: copy ahead. When a plan is taken
    // (kvp_take_tier_moves), the cached blocks among the next 2 x (blocks
    // that plan allocated) the free list would hand out get their host copy
    // then, as offloads of that plan, so evicting them in a later plan costs
    // no copy. Nothing of the plan that copies them writes them, so a runner
    // may overlap those copies with the plan's forward as long as the next
    // plan's work waits for them (docs/engine.md "Copy ahead"). Default false.
    bool host_tier_ahead;
    // Layer groups (see the top): block tables per sequence (0 counts as 1;
    // negative or above KVP_MAX_GROUPS is PG_EINVAL) and each one's window
    // in positions (0: the group sees every earlier key, its blocks are
    // never dropped; negative is PG_EINVAL; entries past n_groups unread).
    int32_t n_groups;
    int32_t group_window[KVP_MAX_GROUPS];
} kvp_config;

// A 128-bit chained block hash.
typedef struct kvp_hash {
    uint64_t lo, hi;
} kvp_hash;

// A block move planned for the runner: copy block `from` into block `to`.
typedef struct kvp_move {
    int32_t from, to;
} kvp_move;

// A growable list of moves, owned by the caller (kvp_moves_fini frees it).
typedef struct kvp_moves {
    kvp_move *v; // [n]
    int32_t n, cap;
} kvp_moves;

// The block table of one sequence. Initialise with kvp_table_init, release
// its blocks with kvp_table_release and its memory with kvp_table_fini.
// Fields are read-only outside kvpool.
typedef struct kvp_table {
    int32_t *blocks;  // [n_blocks][n_groups] device block ids (host ids while
                      //   swapped): group g's block for positions
                      //   [i * block_size, (i + 1) * block_size) at
                      //   blocks[i * n_groups + g]; a dropped (out of the
                      //   window) entry is 0 on the device, -1 while swapped
    int32_t n_blocks; // = ceil(n_tokens / block_size), per group
    int32_t cap;      // allocated rows of blocks (n_groups entries each)
    int32_t n_tokens; // positions [0, n_tokens) have a slot
    int32_t n_cached; // blocks [0, n_cached) were offered to the prefix cache
    bool swapped;     // blocks[] are host ids
    kvp_hash *hashes; // [n_hashes] chained hashes of the sequence's full
    int32_t n_hashes; //   blocks, from its token ids; kept across release
    int32_t hash_cap; //   (tokens never change) so re-admission is cheap
    uint64_t salt;    // mixed into the first block's hash (kvp_table_set_salt)
} kvp_table;

// One growth in a kvp_grow batch: adopt `n_hits` cached blocks found by
// kvp_table_lookup (only on an empty table), then add `n_new` token slots.
typedef struct kvp_grow_item {
    kvp_table *t;
    int32_t n_hits;
    int32_t n_new;
} kvp_grow_item;

typedef struct kvp_stats {
    int32_t num_blocks;      // usable device blocks (excludes the null block)
    int32_t num_free;        // allocatable now (includes evictable cached)
    int32_t num_used;        // ref > 0
    int32_t num_cached;      // blocks holding a prefix-cache hash
    int32_t num_cached_free; // cached with ref 0 (evictable)
    double usage;            // num_used / num_blocks, 0..1
    int32_t num_host_blocks;
    int32_t num_host_free;        // allocatable now (includes evictable host-cached)
    int32_t num_host_used;        // held by swapped tables or the plan's holds
    int32_t num_host_cached;      // host blocks holding a hash (host tier)
    int32_t num_host_cached_free; // of those, not held (evictable)
    double host_usage;      // (used + cached) / num_host_blocks, 0..1 (0 without swap space)
    int64_t prefix_queries; // tokens looked up in the prefix cache
    int64_t prefix_hits;    // of those, tokens found cached (device or host)
    int64_t evictions;      // cached device blocks handed out again
    int64_t host_hits;      // of prefix_hits, tokens loaded from the host tier (a
                            //   block's tokens count once however many groups load)
    int64_t offloads;       // device blocks copied to the host tier (on eviction or ahead of it)
    int64_t offloads_ahead; // of offloads, copied ahead of eviction (host_tier_ahead)
    int64_t host_evictions; // host-cached blocks handed out again
} kvp_stats;

// Fills `c` with defaults: block_size 16, prefix caching on, no host blocks,
// num_blocks 0 (the caller must set it).
void kvp_config_default(kvp_config *c);

// Creates a pool. Fails with PG_EINVAL on a bad config.
int kvp_create(const kvp_config *cfg, kvp_pool **out);

// Frees the pool. Tables still holding blocks must not be used afterwards.
void kvp_destroy(kvp_pool *p);

int32_t kvp_block_size(const kvp_pool *p);
// Block tables per sequence (>= 1) and group g's window (0: full).
int32_t kvp_num_groups(const kvp_pool *p);
int32_t kvp_group_window(const kvp_pool *p, int32_t g);
// Device blocks a sequence of n_tokens positions holds at most, when its
// positions are computed in pieces of at most `chunk` (a windowed group
// holds at most the blocks of its window plus a piece): what admission
// compares with kvp_num_usable. The plain pool: ceil(n_tokens / block_size).
// Per group: full ceil(n / bs), windowed min(ceil(n / bs),
// ceil((window - 1 + chunk) / bs) + 1). chunk <= 0: one piece of n_tokens.
int64_t kvp_blocks_for(const kvp_pool *p, int64_t n_tokens, int32_t chunk);
// The same for a pool of config `c`, before one exists (sizing, plans).
int64_t kvp_config_blocks_for(const kvp_config *c, int64_t n_tokens, int32_t chunk);
// Group g's share of kvp_blocks_for (the plain pool: g = 0, its only group).
int64_t kvp_group_blocks_for(const kvp_pool *p, int32_t g, int64_t n_tokens, int32_t chunk);
int64_t kvp_config_group_blocks_for(const kvp_config *c, int32_t g, int64_t n_tokens, int32_t chunk);
// Usable device blocks: num_blocks - 1.
int32_t kvp_num_usable(const kvp_pool *p);
// Device blocks allocatable now, including evictable cached blocks.
int32_t kvp_num_free(const kvp_pool *p);
int32_t kvp_num_host_free(const kvp_pool *p);
int32_t kvp_num_host_blocks(const kvp_pool *p);
bool kvp_prefix_caching(const kvp_pool *p);

// Snapshot of the counters.
void kvp_stats_get(const kvp_pool *p, kvp_stats *out);

// Device ref count of block `id` (for tests and invariant checks).
int32_t kvp_block_ref(const kvp_pool *p, int32_t id);
// Host ref count of host block `id`.
int32_t kvp_host_ref(const kvp_pool *p, int32_t id);
// Whether device block `id` is in the prefix cache.
bool kvp_block_cached(const kvp_pool *p, int32_t id);
// Whether host block `id` is in the host tier's cache.
bool kvp_host_cached(const kvp_pool *p, int32_t id);
// Whether the host tier is on.
bool kvp_host_tier(const kvp_pool *p);

// ---------------------------------------------------------------------------
// Tables

void kvp_table_init(kvp_table *t);
// What else the KV of these tokens depends on (a LoRA adapter; vLLM's
// cache salt): blocks of tables with different salts never share a prefix
// hash, so one adapter's KV is never reused for another's. 0: none (the
// plain hashes). Set before the first lookup.
void kvp_table_set_salt(kvp_table *t, uint64_t salt);

// Frees the table's memory. The table must hold no blocks (release first).
void kvp_table_fini(kvp_table *t);

// Longest cached prefix of the sequence `tokens[0..n_tokens)`, in blocks
// (on the device or, with the host tier, on the host),
// capped so that at least the last token is left to compute (a hit never
// covers all n_tokens: the last position's logits are needed). Computes and
// keeps the chained hashes it needs in `t`. Returns 0 when caching is off or
// the table already holds blocks. Changes no ref count and no statistic:
// pass the result to kvp_grow (nothing may allocate in between) and, once
// the lookup is acted on, report it with kvp_note_lookup.
int32_t kvp_table_lookup(kvp_pool *p, kvp_table *t, const int32_t *tokens, int32_t n_tokens);

// Adds a lookup to the prefix-cache statistics (vLLM counts tokens: the
// query is the sequence's length, the hit the cached prefix).
void kvp_note_lookup(kvp_pool *p, int32_t n_query_tokens, int32_t n_hit_tokens);

// Free device blocks the batch would consume: new blocks, copy-on-write
// copies and cached hits taken out of the free list. Exact, also when
// several items write into the same shared tail block (the last writer
// keeps the original). Items on swapped tables are costed as if swapped in
// first (the swap-in itself is counted by kvp_swap_in_cost). Pure.
int32_t kvp_grow_cost(const kvp_pool *p, const kvp_grow_item *items, int32_t n);

// Performs the batch: for each item adopts its hits (a windowed group only
// the blocks its window sees from position n_hits * block_size on, null
// entries before; host-tier hits: a fresh
// device block each, loaded by a move kvp_take_tier_moves hands out; the
// cost counts them), copies a shared partial
// tail block before the first write into it (appending (old, new) to
// `copies`), and allocates blocks for the new slots. All or nothing: when
// kvp_grow_cost > kvp_num_free returns PG_ENOSPC and changes nothing.
// Tables must be on the device. Each table appears at most once.
int kvp_grow(kvp_pool *p, const kvp_grow_item *items, int32_t n, kvp_moves *copies);

// Records that positions [0, n_computed) of the sequence now hold computed
// KV for `tokens`: full blocks not yet offered are keyed and entered in the
// prefix cache (a block whose hash is already cached elsewhere stays
// private). No-op when caching is off. Call after the forward that wrote
// them, never before.
void kvp_table_commit(kvp_pool *p, kvp_table *t, const int32_t *tokens, int32_t n_computed);

// Makes `dst` (holding no blocks) share every block of `src` (refs + 1),
// device or host alike. The sequences must agree on their first
// `n_common_tokens` tokens; dst inherits the hashes of the full blocks
// inside that prefix.
void kvp_table_fork(kvp_pool *p, const kvp_table *src, kvp_table *dst, int32_t n_common_tokens);

// Moves the blocks of `src` into `dst`, which holds none; `src` ends up
// empty. For handing a prompt's table to another sequence of the same
// prompt: they agree on their first `n_common_tokens` tokens (which must
// cover the blocks src offered to the cache), whose hashes dst inherits.
void kvp_table_move_blocks(kvp_pool *p, kvp_table *dst, kvp_table *src, int32_t n_common_tokens);

// Drops the table's blocks, tail first (device or host). Keeps the hashes.
void kvp_table_release(kvp_pool *p, kvp_table *t);

// Drops the blocks of the table's windowed groups that lie wholly before
// position first_pos - window + 1, tail first; they become null entries.
// first_pos: no query yet to run, in flight included, is before it (the
// scheduler passes the sequence's computed positions). Returns the entries
// dropped. No-op on a swapped table and without windowed groups. O(1) when
// nothing falls out: call it for every running table before planning.
// Never drops the tail row (the next write may go there); a dropped block
// that was offered to the cache stays findable until evicted.
int32_t kvp_table_slide(kvp_pool *p, kvp_table *t, int32_t first_pos);

// Adds 1 to dev[id] (host[id] when swapped) for every entry of the table
// that is not null: the owners kvp_check compares with the ref counts.
void kvp_table_count_owners(const kvp_pool *p, const kvp_table *t, int32_t *dev, int32_t *host);

// Shrinks a device table to its first n_tokens slots (<= t->n_tokens),
// dropping the blocks wholly beyond them, tail first: the slots of draft
// tokens that speculative decoding rejected. The blocks offered to the
// prefix cache must stay (n_tokens covers them: they hold accepted tokens
// only, kvp_table_commit being called with computed positions alone).
// n_tokens must not be below a position the table was slid to: a partial
// tail row never holds a null entry (kvp_grow checks it).
void kvp_table_truncate(kvp_pool *p, kvp_table *t, int32_t n_tokens);

// ---------------------------------------------------------------------------
// Swap

// Host blocks needed to swap out `tables` (distinct device blocks; blocks
// shared between these tables are copied once).
int32_t kvp_swap_out_cost(const kvp_pool *p, kvp_table *const *tables, int32_t n);

// Moves `tables` (all on the device) to host blocks: appends a
// (device, host) move per distinct block to `moves`, drops the device refs
// (tail first) and leaves the tables swapped with the same sharing.
// PG_ENOSPC (nothing changed) when the host has too few free blocks.
// The plan's order contract: a plan's moves run swap-outs (with the host
// tier's offloads), then swap-ins (with its loads), then copies, then the
// forward; so within one plan a table must not be swapped out or released
// after it was grown with copy-on-write copies, swapped in or filled from
// the host tier, and no block such a move reads may be freed for reuse.
// The scheduler keeps it by preempting only the tail of the running list
// before that tail grows, and admitting (which never preempts) last
// (tests/unit/test_kvpool.c, test_tier_random_plans_against_model).
int kvp_swap_out(kvp_pool *p, kvp_table *const *tables, int32_t n, kvp_moves *moves);

// Device blocks needed to swap `tables` back in.
int32_t kvp_swap_in_cost(const kvp_pool *p, kvp_table *const *tables, int32_t n);

// Moves swapped `tables` back to fresh device blocks: appends a
// (host, device) move per distinct block, frees the host blocks and offers
// the blocks that were cached before the swap to the prefix cache again.
// PG_ENOSPC (nothing changed) when the device has too few free blocks.
int kvp_swap_in(kvp_pool *p, kvp_table *const *tables, int32_t n, kvp_moves *moves);

// ---------------------------------------------------------------------------
// Host tier

// Appends the host tier's moves since the last call to the plan's lists:
// offloads (device, host) to `swap_out`, host-hit loads (host, device) to
// `swap_in`. The runner performs swap-outs, then swap-ins, then copies,
// then the forward: an evicted device block is read before anything writes
// it, a loaded one is written before the forward reads it. With
// host_tier_ahead it first adds the copies ahead, last in `swap_out`, and
// returns how many (else 0): their device blocks sit in the free list and
// nothing of this plan writes them, so those copies may run at any time
// before the next plan's moves (kvp_config.host_tier_ahead).
int32_t kvp_take_tier_moves(kvp_pool *p, kvp_moves *swap_out, kvp_moves *swap_in);

// Drops the holds of the plan made since the last call: its host blocks
// become free (cached ones at the host LRU's tail). Call before planning
// the next step (that plan's moves run after this one's) and, when no plan
// is in flight, to settle the counts. No-op without the host tier.
void kvp_release_holds(kvp_pool *p);

// ---------------------------------------------------------------------------
// Moves lists and checks

void kvp_moves_fini(kvp_moves *m);

// Verifies the pool against the owners the caller counted:
// dev_owners[id] (num_blocks entries) and host_owners[id] (num_host_blocks
// entries, may be NULL when there is none) must equal the ref counts (host
// refs: plus the plan's holds, which the pool counts itself), and the
// free list, free counts and prefix-cache map must be consistent. Returns 0,
// or PG_EINVAL with the first mismatch in pg_err_msg(). O(blocks).
int kvp_check(const kvp_pool *p, const int32_t *dev_owners, const int32_t *host_owners);
