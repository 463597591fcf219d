// engine/dist/executor.c - one runner per tensor-parallel rank, driven together.
//
// Every call fans out to the ranks: rank 0 runs on the caller's thread,
// ranks 1..N-1 on their worker threads, woken by a generation counter and
// joined on a count (one mutex and two condition variables; a step's work
// is milliseconds, the hand-off microseconds). A rank that fails aborts the
// communicators of every rank of this node (kernels/comm/comm.h abort), so that
// no rank here stays blocked in a collective waiting for it; ranks on
// other nodes see the aborted ranks' connections close. The call's error is
// the lowest rank's own failure, with its rank, not the echoes of it in
// the ranks it left waiting (pg_comm_err_is_collective). Without tensor
// parallelism nothing is threaded.
//
// Several nodes: node 0 sends each call to the other nodes first
// (engine/dist/remote.h), runs it on its own ranks, then collects their replies;
// the other nodes loop in pg_executor_follow. Ranks are numbered node by
// node: node k holds ranks [k L, (k + 1) L) with L = tp / nnodes.
//
// Fault injection for tests: PAGED_TP_FAULT_RANK=R:STEP makes rank R (of
// all nodes) fail its STEP-th begin before it starts the forward, so the
// other ranks wait for it in their first collective.
#include "engine/dist/executor.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "engine/dist/remote.h"
#include "kernels/backend_prof.h"

#define MAX_RANKS 64

typedef int (*rank_fn)(pg_executor *ex, int32_t rank, void *arg);

typedef struct {
    pg_executor *ex;
    int32_t rank;
    pthread_t th;
} worker;

struct pg_executor {
    int32_t n;       // ranks on this node
    int32_t tp, g0;  // ranks in all; this node's first
    int32_t nnodes, node_rank;
    // --device auto without a GPU: why not (the start-up log's device line
    // says it, rather than a line of its own before a model file's error).
    char device_note[200];
    pg_remote remote; // node 0: the links to the other nodes
    int ctl_fd;       // the other nodes: the link to node 0
    uint8_t nccl_id[PG_NCCL_ID_BYTES];
    bool on_cuda;
    pg_backend *be[MAX_RANKS];
    pg_comm *comm[MAX_RANKS]; // NULL with one rank
    bool comms_made;          // every rank's communicator is made (abort_comms may read them)
    int32_t reply_timeout_ms; // node 0, after a failure: the wait for the others' replies
    bool failed;              // node 0: a call failed (the communicators are aborted)
    int32_t fault_rank;       // PAGED_TP_FAULT_RANK: this rank (of all; -1: none)
    int64_t fault_step;       //   fails its fault_step-th begin
    int64_t begins[MAX_RANKS]; // begins so far, each counted by its rank's thread
    pg_model *model[MAX_RANKS];
    pg_runner *runner[MAX_RANKS];

    // The fan-out: the current call, its generation, and the ranks' results.
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;
    int32_t n_done;
    bool quit;
    rank_fn fn;
    void *arg;
    int rc[MAX_RANKS];
    char err[MAX_RANKS][320];
    worker workers[MAX_RANKS];
    int32_t n_workers;

    // For end: the outputs of ranks 1..N-1, compared with rank 0's.
    pg_step_output outs[MAX_RANKS];
    pg_runner_mem mem[MAX_RANKS]; // every node's ranks, as of the last pg_executor_mem_refresh
};

// Every communicator of this node, from the thread of a rank that failed:
// the ranks blocked in a collective (here, and through the closed
// connections on other nodes) return instead of waiting for it. Only the
// first abort of a communicator counts; the communicators stay alive until
// pg_executor_free, after every worker is idle.
static void abort_comms(pg_executor *ex, int32_t rank) {
    // (While the ranks make their communicators, each writes its own slot,
    // and one that fails leaves the others to their set-up timeouts.)
    if (!ex->comms_made) return;
    char why[64];
    snprintf(why, sizeof why, "rank %d failed", ex->g0 + rank);
    for (int32_t r = 0; r < ex->n; r++)
        if (ex->comm[r] && ex->comm[r]->abort) ex->comm[r]->abort(ex->comm[r], why);
}

// Runs fn on this rank and records the result (the message is per thread).
static void run_rank(pg_executor *ex, int32_t rank) {
    pg_backend *be = ex->be[rank];
    int rc = be->dev->bind_thread(be);
    if (rc >= 0) rc = ex->fn(ex, rank, ex->arg);
    ex->rc[rank] = rc;
    if (rc < 0) {
        snprintf(ex->err[rank], sizeof ex->err[rank], "%s", pg_err_msg());
        abort_comms(ex, rank);
    }
}

static void *worker_main(void *p) {
    worker *w = p;
    pg_executor *ex = w->ex;
    uint64_t seen = 0;
    pthread_mutex_lock(&ex->mu);
    for (;;) {
        while (!ex->quit && ex->gen == seen) pthread_cond_wait(&ex->go, &ex->mu);
        if (ex->quit) break;
        seen = ex->gen;
        pthread_mutex_unlock(&ex->mu);
        run_rank(ex, w->rank);
        pthread_mutex_lock(&ex->mu);
        if (++ex->n_done == ex->n - 1) pthread_cond_signal(&ex->done);
    }
    pthread_mutex_unlock(&ex->mu);
    return NULL;
}

// fn on every rank at once; 0, or the error of the lowest failing rank
// that failed for a reason of its own (not in a collective another rank's
// failure broke), else of the lowest failing rank.
static int run_all(pg_executor *ex, rank_fn fn, void *arg) {
    if (ex->n == 1) {
        // One rank here, maybe more on other nodes, which must not wait.
        int rc = fn(ex, 0, arg);
        if (rc < 0) abort_comms(ex, 0);
        return rc;
    }
    // (The caller's thread runs rank 0: it must find rank 0's device
    // current, which run_rank makes sure of.)
    ex->fn = fn;
    ex->arg = arg;
    for (int32_t r = 0; r < ex->n; r++) ex->rc[r] = 0;
    if (ex->n_workers) {
        pthread_mutex_lock(&ex->mu);
        ex->n_done = 0;
        ex->gen++;
        pthread_cond_broadcast(&ex->go);
        pthread_mutex_unlock(&ex->mu);
    }
    run_rank(ex, 0);
    if (ex->n_workers) {
        pthread_mutex_lock(&ex->mu);
        while (ex->n_done < ex->n - 1) pthread_cond_wait(&ex->done, &ex->mu);
        pthread_mutex_unlock(&ex->mu);
    }
    int first = -1;
    for (int32_t r = 0; r < ex->n; r++) {
        if (ex->rc[r] >= 0) continue;
        if (first < 0) first = r;
        if (!pg_comm_err_is_collective(ex->err[r])) {
            first = r;
            break;
        }
    }
    if (first < 0) return 0;
    return pg_err_set(ex->rc[first], "rank %d: %s", ex->g0 + first, ex->err[first]);
}

static int start_workers(pg_executor *ex) {
    pthread_mutex_init(&ex->mu, NULL);
    pthread_cond_init(&ex->go, NULL);
    pthread_cond_init(&ex->done, NULL);
    for (int32_t r = 1; r < ex->n; r++) {
        worker *w = &ex->workers[r - 1];
        *w = (worker){.ex = ex, .rank = r};
        if (pthread_create(&w->th, NULL, worker_main, w) != 0)
            return pg_err_set(PG_EIO, "cannot start the worker thread of rank %d", r);
        ex->n_workers++;
    }
    return 0;
}

// --- set-up ------------------------------------------------------------------------------

static int make_backends(pg_executor *ex, const pg_executor_config *cfg) {
    const char *dev = cfg->device;
    const int32_t n = ex->n;
    if (!dev) return pg_err_set(PG_EINVAL, "executor: no device given (cpu, cuda, auto)");
    if (!strcmp(dev, "cuda") || !strcmp(dev, "auto")) {
        char why[160] = "";
        int n_gpus = pg_backend_cuda_probe(why, sizeof why);
        if (n_gpus > 0) {
            if (n > n_gpus)
                return pg_err_set(PG_EINVAL, "--tensor-parallel-size %d: %d ranks on this node, but only %d CUDA "
                                  "device%s visible", ex->tp, n, n_gpus, n_gpus == 1 ? " is" : "s are");
            ex->on_cuda = true;
            for (int32_t r = 0; r < n; r++) PG_TRY(pg_backend_cuda_create(r, &ex->be[r]));
            return 0;
        }
        if (!strcmp(dev, "cuda")) return pg_err_set(PG_EUNSUPP, "--device cuda: %s", why);
        snprintf(ex->device_note, sizeof ex->device_note, "--device auto: %s; running on the CPU", why);
    } else if (strcmp(dev, "cpu")) {
        return pg_err_set(PG_EUNSUPP, "device '%s' is not known (cpu, cuda, auto)", dev);
    }
    // The CPU's threads are shared out among the ranks.
    int32_t threads = cfg->n_threads > 0 ? cfg->n_threads : (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    int32_t per = threads / n > 0 ? threads / n : 1;
    for (int32_t r = 0; r < n; r++) PG_TRY(pg_backend_cpu_create(n == 1 ? cfg->n_threads : per, cfg->matmul_mode, &ex->be[r]));
    return 0;
}

// PAGED_PROFILE_OPS: every rank's backend wrapped by the op profiler
// (kernels/backend_prof.h); a backend without a timer runs unprofiled.
static void profile_backends(pg_executor *ex) {
    if (!pg_backend_prof_wanted()) return;
    for (int32_t r = 0; r < ex->n; r++)
        if (ex->be[r] && pg_backend_prof_wrap(ex->be[r]) < 0) PG_LOGW("PAGED_PROFILE_OPS: %s", pg_err_msg());
}

static int make_comms(pg_executor *ex, const pg_executor_config *cfg) {
    // One rank needs no communicator, unless one is named: then the whole
    // tensor-parallel path runs (collectives of one rank), which is how it
    // is checked on a single GPU.
    const bool named = cfg->comm && strcmp(cfg->comm, "auto");
    if (ex->n == 1 && !named) return 0;
    const char *kind = named ? cfg->comm : ex->on_cuda ? "nccl" : "cpu";
    if (!strcmp(kind, "nccl")) {
        if (!ex->on_cuda)
            return pg_err_set(PG_EINVAL, "--tensor-parallel-size %d on the CPU: the nccl communicator needs "
                                         "--device cuda (use --tp-comm cpu)", ex->n);
        return pg_comm_nccl_create_all(ex->be, ex->n, ex->comm);
    }
    if (!strcmp(kind, "cpu")) {
        if (ex->on_cuda)
            return pg_err_set(PG_EINVAL, "--tp-comm cpu moves host memory: the CUDA backend's tensor "
                                         "parallelism needs --tp-comm nccl");
        return pg_comm_cpu_create_group(ex->n, ex->comm);
    }
    return pg_err_set(PG_EINVAL, "tensor-parallel communicator '%s' is not known (auto, cpu, nccl)", kind);
}

static int tcp_rank(pg_executor *ex, int32_t rank, void *arg) {
    const pg_executor_config *cfg = arg;
    pg_comm_tcp_opts o = {.rank = ex->g0 + rank, .size = ex->tp,
                          .host = cfg->master_addr ? cfg->master_addr : "127.0.0.1",
                          .port = cfg->master_port + 1, .timeout_ms = 300000,
                          .op_timeout_ms = cfg->op_timeout_ms};
    return pg_comm_tcp_create(&o, &ex->comm[rank]);
}

static int nccl_rank(pg_executor *ex, int32_t rank, void *arg) {
    (void)arg;
    return pg_comm_nccl_create_rank(ex->be[rank], ex->g0 + rank, ex->tp, ex->nccl_id, &ex->comm[rank]);
}

// Across nodes: the link to node 0 (which hands out NCCL's id on GPUs),
// then every rank's communicator, each rank on its own thread (the ranks
// of a group meet while they are made).
static int make_node_comms(pg_executor *ex, const pg_executor_config *cfg) {
    pg_remote_opts ro = {.nnodes = ex->nnodes, .node_rank = ex->node_rank, .tp = ex->tp,
                         .master_addr = cfg->master_addr, .master_port = cfg->master_port,
                         .config = cfg->node_config};
    const size_t id_len = ex->on_cuda ? PG_NCCL_ID_BYTES : 0;
    if (ex->node_rank == 0) {
        if (ex->on_cuda) PG_TRY(pg_comm_nccl_unique_id(ex->nccl_id));
        PG_TRY(pg_remote_leader_open(&ro, ex->nccl_id, id_len, &ex->remote));
    } else {
        PG_TRY(pg_remote_follower_open(&ro, ex->nccl_id, id_len, &ex->ctl_fd));
    }
    return run_all(ex, ex->on_cuda ? nccl_rank : tcp_rank, (void *)cfg);
}

static int load_rank(pg_executor *ex, int32_t rank, void *arg) {
    pg_model_load_opts mo = *(const pg_model_load_opts *)arg;
    mo.comm = ex->comm[rank];
    return pg_model_load(&mo, ex->be[rank], &ex->model[rank]);
}

// PAGED_TP_FAULT_RANK=R:STEP (the file comment). 0, or PG_EINVAL naming
// the variable.
static int fault_parse(pg_executor *ex) {
    ex->fault_rank = -1;
    const char *v = getenv("PAGED_TP_FAULT_RANK");
    if (!v || !*v) return 0;
    int rank = -1;
    long long step = 0;
    char end;
    if (sscanf(v, "%d:%lld%c", &rank, &step, &end) != 2 || rank < 0 || rank >= ex->tp || step < 1)
        return pg_err_set(PG_EINVAL, "PAGED_TP_FAULT_RANK='%s': expected RANK:STEP, a rank below %d and a step >= 1",
                          v, ex->tp);
    ex->fault_rank = rank;
    ex->fault_step = step;
    if (rank >= ex->g0 && rank < ex->g0 + ex->n)
        PG_LOGW("fault injection: rank %d will fail its step %lld before its collectives", rank, step);
    return 0;
}

int pg_executor_create(const pg_executor_config *cfg, const pg_model_load_opts *mo, pg_executor **out) {
    *out = NULL;
    PG_ARG(cfg->tp >= 1 && cfg->tp <= MAX_RANKS, "--tensor-parallel-size %d: between 1 and %d", cfg->tp,
           MAX_RANKS);
    const int32_t nnodes = cfg->nnodes > 1 ? cfg->nnodes : 1;
    if (cfg->tp % nnodes)
        return pg_err_set(PG_EINVAL, "--tensor-parallel-size %d is not a multiple of --nnodes %d", cfg->tp, nnodes);
    if (cfg->node_rank < 0 || cfg->node_rank >= nnodes)
        return pg_err_set(PG_EINVAL, "--node-rank %d: between 0 and --nnodes - 1 = %d", cfg->node_rank, nnodes - 1);
    if (nnodes > 1 && (cfg->master_port <= 0 || cfg->master_port >= 65535))
        return pg_err_set(PG_EINVAL, "--nnodes %d needs --master-port (1..65534)", nnodes);
    pg_executor *ex = pg_xcalloc(1, sizeof *ex);
    ex->tp = cfg->tp;
    ex->nnodes = nnodes;
    ex->node_rank = cfg->node_rank;
    ex->n = cfg->tp / nnodes;
    ex->g0 = cfg->node_rank * ex->n;
    ex->ctl_fd = -1;
    ex->reply_timeout_ms = cfg->op_timeout_ms > 0 ? cfg->op_timeout_ms : 300000;
    for (int i = 0; i < 64; i++) ex->remote.fds[i] = -1;
    int rc;
    if ((rc = fault_parse(ex)) < 0 || (rc = make_backends(ex, cfg)) < 0 ||
        (profile_backends(ex), (rc = start_workers(ex)) < 0) ||
        (rc = nnodes > 1 ? make_node_comms(ex, cfg) : make_comms(ex, cfg)) < 0) {
        pg_executor_free(ex);
        return rc;
    }
    ex->comms_made = true;
    if ((rc = run_all(ex, load_rank, (void *)mo)) < 0) {
        pg_executor_free(ex);
        return rc;
    }
    *out = ex;
    return 0;
}

// A rank's runner and model, freed on its own thread with its device bound.
static int free_rank(pg_executor *ex, int32_t rank, void *arg) {
    (void)arg;
    pg_runner_free(ex->runner[rank]);
    pg_model_free(ex->model[rank]);
    ex->runner[rank] = NULL;
    ex->model[rank] = NULL;
    return 0;
}

void pg_executor_free(pg_executor *ex) {
    if (!ex) return;
    if (ex->n_workers == ex->n - 1) run_all(ex, free_rank, NULL);
    if (ex->remote.n) {
        // The other nodes stop when told (or when the link closes).
        if (pg_remote_send(&ex->remote, PG_REMOTE_QUIT, NULL, 0) == 0) pg_remote_collect(&ex->remote, NULL, -1);
        pg_remote_close(&ex->remote);
    }
    if (ex->ctl_fd >= 0) close(ex->ctl_fd);
    if (ex->n_workers) {
        pthread_mutex_lock(&ex->mu);
        ex->quit = true;
        pthread_cond_broadcast(&ex->go);
        pthread_mutex_unlock(&ex->mu);
        for (int32_t i = 0; i < ex->n_workers; i++) pthread_join(ex->workers[i].th, NULL);
    }
    if (ex->n > 1) {
        pthread_mutex_destroy(&ex->mu);
        pthread_cond_destroy(&ex->go);
        pthread_cond_destroy(&ex->done);
    }
    for (int32_t r = 0; r < ex->n; r++) {
        pg_runner_free(ex->runner[r]);
        pg_model_free(ex->model[r]);
    }
    for (int32_t r = 0; r < ex->n; r++)
        if (ex->comm[r]) ex->comm[r]->destroy(ex->comm[r]);
    for (int32_t r = 0; r < ex->n; r++)
        if (ex->be[r]) ex->be[r]->dev->destroy(ex->be[r]);
    free(ex);
}

int32_t pg_executor_size(const pg_executor *ex) { return ex->tp; }
pg_backend *pg_executor_backend(const pg_executor *ex, int32_t rank) { return ex->be[rank]; }
const pg_model *pg_executor_model(const pg_executor *ex, int32_t rank) { return ex->model[rank]; }

static int create_rank(pg_executor *ex, int32_t rank, void *arg) {
    return pg_runner_create(ex->model[rank], arg, &ex->runner[rank]);
}

// Node 0: a call to the other nodes, sent before this node's ranks start
// on it (so all run at once); nothing on one node.
static int remote_send(pg_executor *ex, uint32_t op, const void *payload, size_t len) {
    return ex->remote.n ? pg_remote_send(&ex->remote, op, payload, len) : 0;
}

// Node 0: this node's result `rc`, then the other nodes' replies. The
// local error wins (the other nodes often failed because of it), unless it
// is a collective's failure and another node's is its own: a rank there
// failed and this node's ranks only saw its connection close. After a
// failure (this call's here, or any earlier one) the replies are awaited
// for the collective timeout at most: the other nodes' ranks fail at once
// through the broken connections, so a node that does not answer hangs
// (or is gone without closing its link, as a stopped or cut-off host), and
// the engine should fail now rather than at the step watchdog.
static int remote_finish(pg_executor *ex, int rc, pg_wbuf *replies) {
    if (!ex->remote.n) return rc;
    char local[400] = "";
    if (rc < 0) snprintf(local, sizeof local, "%s", pg_err_msg());
    int rrc = pg_remote_collect(&ex->remote, replies, rc < 0 || ex->failed ? ex->reply_timeout_ms : -1);
    if (rc < 0 || rrc < 0) ex->failed = true;
    if (rc < 0 && rrc < 0 && pg_comm_err_is_collective(local) && !pg_comm_err_is_collective(pg_err_msg()))
        return rrc;
    if (rc < 0) return pg_err_set(rc, "%s", local);
    return rrc;
}

int pg_executor_runners_create(pg_executor *ex, const pg_runner_config *cfg) {
    PG_TRY(remote_send(ex, PG_REMOTE_RUNNERS, cfg, sizeof *cfg));
    return remote_finish(ex, run_all(ex, create_rank, (void *)cfg), NULL);
}

static int mem_rank(pg_executor *ex, int32_t rank, void *arg) {
    (void)arg;
    pg_runner_mem_get(ex->runner[rank], &ex->mem[ex->g0 + rank]);
    return 0;
}

int pg_executor_mem_refresh(pg_executor *ex) {
    PG_TRY(remote_send(ex, PG_REMOTE_MEM, NULL, 0));
    pg_wbuf rep[64] = {{0}};
    int rc = remote_finish(ex, run_all(ex, mem_rank, NULL), rep);
    for (int32_t i = 0; i < ex->remote.n; i++) {
        if (rc == 0 && rep[i].len == sizeof(pg_runner_mem) * (size_t)ex->n)
            memcpy(&ex->mem[(i + 1) * ex->n], rep[i].data, rep[i].len);
        else if (rc == 0)
            rc = pg_err_set(PG_EIO, "node %d: %zu bytes of memory figures", i + 1, rep[i].len);
        pg_wbuf_free(&rep[i]);
    }
    return rc;
}

void pg_executor_mem_get(const pg_executor *ex, int32_t rank, pg_runner_mem *out) {
    *out = ex->mem[rank];
}

size_t pg_executor_kv_bytes_per_block(const pg_executor *ex) {
    return pg_runner_kv_bytes_per_block(ex->runner[0]);
}

const pg_bkv *pg_executor_kv(const pg_executor *ex, int32_t rank) { return pg_runner_kv(ex->runner[rank]); }

typedef struct {
    int32_t n_blocks, n_host_blocks;
} kv_args;

static int alloc_kv_rank(pg_executor *ex, int32_t rank, void *arg) {
    const kv_args *a = arg;
    return pg_runner_alloc_kv(ex->runner[rank], a->n_blocks, a->n_host_blocks);
}

int pg_executor_alloc_kv(pg_executor *ex, int32_t n_blocks, int32_t n_host_blocks) {
    kv_args a = {n_blocks, n_host_blocks};
    PG_TRY(remote_send(ex, PG_REMOTE_ALLOC_KV, &a, sizeof a));
    return remote_finish(ex, run_all(ex, alloc_kv_rank, &a), NULL);
}

// --- steps ---------------------------------------------------------------------------------

static int begin_rank(pg_executor *ex, int32_t rank, void *arg) {
    if (ex->g0 + rank == ex->fault_rank && ++ex->begins[rank] == ex->fault_step)
        return pg_err_set(PG_EIO, "fault injection (PAGED_TP_FAULT_RANK): rank %d failed step %lld before its "
                                  "collectives", ex->fault_rank, (long long)ex->fault_step);
    return pg_runner_begin(ex->runner[rank], arg);
}

static int end_rank(pg_executor *ex, int32_t rank, void *arg) {
    (void)arg;
    return pg_runner_end(ex->runner[rank], &ex->outs[rank]);
}

int pg_executor_begin(pg_executor *ex, const pg_batch_plan *plan) {
    if (ex->tp == 1) return pg_runner_begin(ex->runner[0], plan);
    if (ex->remote.n) {
        pg_wbuf b = {0};
        pg_plan_encode(&b, plan);
        int rc = remote_send(ex, PG_REMOTE_BEGIN, b.data, b.len);
        pg_wbuf_free(&b);
        PG_TRY(rc);
    }
    return remote_finish(ex, run_all(ex, begin_rank, (void *)plan), NULL);
}

// A disagreement between ranks' samples (see pg_executor_end).
static int disagree(const pg_step_output *o0, int32_t rank, int32_t n, const int32_t *tokens) {
    if (n != o0->n)
        return pg_err_set(PG_EIO, "tensor parallel ranks disagree: rank %d sampled %d sequences, rank 0 %d", rank, n,
                          o0->n);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] != o0->outs[i].token)
            return pg_err_set(PG_EIO, "tensor parallel ranks disagree: sequence %lld sampled %d on rank %d, %d on rank 0",
                              (long long)o0->outs[i].seq_id, tokens[i], rank, o0->outs[i].token);
    return 0;
}

int pg_executor_end(pg_executor *ex, pg_step_output *out) {
    if (ex->tp == 1) return pg_runner_end(ex->runner[0], out);
    PG_TRY(remote_send(ex, PG_REMOTE_END, NULL, 0));
    pg_wbuf rep[64] = {{0}};
    int rc = remote_finish(ex, run_all(ex, end_rank, NULL), rep);
    // Every rank must have sampled what rank 0 did: each feeds its own
    // samples to its next step, so a disagreement would split the ranks'
    // sequences apart (the all-reduce and all-gather are exact copies, so
    // this never happens unless a collective or a sampler is broken).
    const pg_step_output *o0 = &ex->outs[0];
    int32_t *tok = pg_xmalloc(sizeof(int32_t) * (size_t)(o0->n + 1));
    for (int32_t r = 1; r < ex->n && rc == 0; r++) {
        for (int32_t i = 0; i < ex->outs[r].n && i < o0->n; i++) tok[i] = ex->outs[r].outs[i].token;
        rc = disagree(o0, r, ex->outs[r].n, tok);
    }
    for (int32_t i = 0; i < ex->remote.n; i++) {
        if (rc == 0) {
            int32_t n = -1;
            if (rep[i].len >= sizeof n) memcpy(&n, rep[i].data, sizeof n);
            if (n < 0 || rep[i].len != sizeof(int32_t) * (size_t)(n + 1))
                rc = pg_err_set(PG_EIO, "node %d: a malformed end reply", i + 1);
            else
                rc = disagree(o0, (i + 1) * ex->n, n, (const int32_t *)rep[i].data + 1);
        }
        pg_wbuf_free(&rep[i]);
    }
    free(tok);
    if (rc == 0) *out = *o0;
    return rc;
}

int pg_executor_execute(pg_executor *ex, const pg_batch_plan *plan, pg_step_output *out) {
    PG_TRY(pg_executor_begin(ex, plan));
    return pg_executor_end(ex, out);
}

const char *pg_executor_device_note(const pg_executor *ex) { return ex->device_note; }

int pg_executor_last_logits(pg_executor *ex, float *out, int32_t n) {
    return pg_runner_last_logits(ex->runner[0], out, n);
}

typedef struct {
    int32_t slot;
    const char *dir;
} lora_args;

static int lora_rank(pg_executor *ex, int32_t rank, void *arg) {
    const lora_args *a = arg;
    return pg_model_lora_set(ex->model[rank], a->slot, a->dir);
}

int pg_executor_lora_set(pg_executor *ex, int32_t slot, const char *dir) {
    pg_wbuf w = {0};
    pg_wbuf_put(&w, &slot, sizeof slot);
    if (dir) pg_wbuf_put(&w, dir, strlen(dir));
    int rc = remote_send(ex, PG_REMOTE_LORA, w.data, w.len);
    pg_wbuf_free(&w);
    PG_TRY(rc);
    lora_args a = {slot, dir};
    return remote_finish(ex, run_all(ex, lora_rank, &a), NULL);
}

// --- the other nodes ---------------------------------------------------------------------

static char *bytes_dup(const char *p, size_t n) {
    char *s = pg_xmalloc(n + 1);
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

// One call from node 0 on this node's ranks; the reply's payload in *rep.
static int follow_one(pg_executor *ex, uint32_t op, const pg_wbuf *in, pg_wbuf *rep) {
    rep->len = 0;
    switch (op) {
    case PG_REMOTE_RUNNERS:
        if (in->len != sizeof(pg_runner_config)) return pg_err_set(PG_EIO, "a malformed runner config");
        return run_all(ex, create_rank, in->data);
    case PG_REMOTE_MEM:
        PG_TRY(run_all(ex, mem_rank, NULL));
        pg_wbuf_put(rep, &ex->mem[ex->g0], sizeof(pg_runner_mem) * (size_t)ex->n);
        return 0;
    case PG_REMOTE_ALLOC_KV:
        if (in->len != sizeof(kv_args)) return pg_err_set(PG_EIO, "a malformed KV request");
        return run_all(ex, alloc_kv_rank, in->data);
    case PG_REMOTE_BEGIN: {
        pg_plan_decoded d;
        PG_TRY(pg_plan_decode(in->data, in->len, &d));
        // begin copies what it needs of the plan (engine/runner/runner.h).
        int rc = run_all(ex, begin_rank, &d.plan);
        pg_plan_decoded_free(&d);
        return rc;
    }
    case PG_REMOTE_END: {
        PG_TRY(run_all(ex, end_rank, NULL));
        const pg_step_output *o = &ex->outs[0];
        pg_wbuf_put(rep, &o->n, sizeof o->n);
        for (int32_t i = 0; i < o->n; i++) pg_wbuf_put(rep, &o->outs[i].token, sizeof(int32_t));
        return 0;
    }
    case PG_REMOTE_LORA: {
        if (in->len < sizeof(int32_t)) return pg_err_set(PG_EIO, "a malformed LoRA call");
        lora_args a;
        memcpy(&a.slot, in->data, sizeof a.slot);
        char *dir = in->len > sizeof(int32_t) ? bytes_dup((const char *)in->data + sizeof(int32_t),
                                                                  in->len - sizeof(int32_t))
                                              : NULL;
        a.dir = dir;
        int rc = run_all(ex, lora_rank, &a);
        free(dir);
        return rc;
    }
    default:
        return pg_err_set(PG_EIO, "an unknown call %u from node 0", op);
    }
}

int pg_executor_follow(pg_executor *ex) {
    PG_ARG(ex->ctl_fd >= 0, "pg_executor_follow: not a following node");
    PG_LOGI("node %d of %d: ranks %d..%d loaded; following node 0", ex->node_rank, ex->nnodes, ex->g0,
            ex->g0 + ex->n - 1);
    pg_wbuf in = {0}, rep = {0};
    int rc;
    for (;;) {
        uint32_t op;
        if ((rc = pg_remote_recv_call(ex->ctl_fd, &op, &in)) < 0) {
            rc = pg_err_wrap(rc, "node %d: the link to node 0: ", ex->node_rank);
            break;
        }
        if (op == PG_REMOTE_QUIT) {
            pg_remote_reply(ex->ctl_fd, 0, NULL, 0);
            rc = 0;
            break;
        }
        int r = follow_one(ex, op, &in, &rep);
        if (r < 0) PG_LOGE("node %d: %s", ex->node_rank, pg_err_msg());
        if ((rc = pg_remote_reply(ex->ctl_fd, r, rep.data, rep.len)) < 0) break;
    }
    pg_wbuf_free(&in);
    pg_wbuf_free(&rep);
    return rc;
}
