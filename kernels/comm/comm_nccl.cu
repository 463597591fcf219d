// kernels/comm/comm_nccl.cu - the NCCL communicator (kernels/comm/comm.h).
//
// Collectives are enqueued on the rank's CUDA backend compute stream, so
// they order with the layer kernels and a CUDA graph of a decode step
// captures them (NCCL supports stream capture). libnccl is opened with
// dlopen at the first use: a CUDA build then starts, and serves on one GPU,
// on a machine without NCCL; only tensor parallelism needs it. NVLink
// multicast (NVLS) stays as the environment says; the GPU machines we test
// on require NCCL_NVLS_ENABLE=0, which paged sets when it is unset.
//
// abort (kernels/comm/comm.h) is ncclCommAbort, from any thread: it ends the
// communicator's uncompleted operations, so a rank blocked in a stream
// synchronize behind a collective whose peer never came returns; later
// collectives fail before they reach NCCL. The aborted communicator is
// freed (destroy does not free it again). NCCL itself must tolerate the
// abort racing with another thread's enqueue on the same communicator:
// paged does not hold a lock across an enqueue, which can block (a lazy
// connection to a peer), so an abort never waits behind a hung one.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_ops.h"

extern "C" {
#include "common/err.h"
#include "kernels/backend.h"
#include "kernels/comm/comm.h"
}

namespace {

// The NCCL entry points paged calls, resolved from libnccl.so.2.
struct NcclApi {
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitAll)(ncclComm_t *, int, const int *);
    ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*CommAbort)(ncclComm_t);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*GroupStart)();
    ncclResult_t (*GroupEnd)();
    const char *(*GetErrorString)(ncclResult_t);
};

NcclApi g_nccl;
int g_nccl_rc = 1; // 1: not tried, 0: loaded, < 0: failed (g_nccl_why)
char g_nccl_why[256];
pthread_once_t g_nccl_once = PTHREAD_ONCE_INIT;

void load_nccl() {
    // The GPU machines need NVLink multicast off (see the file comment).
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    const char *names[] = {"libnccl.so.2", "libnccl.so"};
    void *h = nullptr;
    for (const char *n : names)
        if ((h = dlopen(n, RTLD_NOW | RTLD_LOCAL))) break;
    if (!h) {
        snprintf(g_nccl_why, sizeof g_nccl_why, "cannot load libnccl.so.2: %s", dlerror());
        g_nccl_rc = PG_EUNSUPP;
        return;
    }
    struct {
        void **slot;
        const char *name;
    } syms[] = {
        {(void **)&g_nccl.GetUniqueId, "ncclGetUniqueId"},   {(void **)&g_nccl.CommInitAll, "ncclCommInitAll"},
        {(void **)&g_nccl.CommInitRank, "ncclCommInitRank"}, {(void **)&g_nccl.CommDestroy, "ncclCommDestroy"},
        {(void **)&g_nccl.CommAbort, "ncclCommAbort"},
        {(void **)&g_nccl.AllReduce, "ncclAllReduce"},       {(void **)&g_nccl.AllGather, "ncclAllGather"},
        {(void **)&g_nccl.Broadcast, "ncclBroadcast"},       {(void **)&g_nccl.GroupStart, "ncclGroupStart"},
        {(void **)&g_nccl.GroupEnd, "ncclGroupEnd"},         {(void **)&g_nccl.GetErrorString, "ncclGetErrorString"},
        {(void **)&g_nccl.Send, "ncclSend"},                 {(void **)&g_nccl.Recv, "ncclRecv"},
    };
    for (auto &s : syms)
        if (!(*s.slot = dlsym(h, s.name))) {
            snprintf(g_nccl_why, sizeof g_nccl_why, "libnccl.so.2 has no %s", s.name);
            g_nccl_rc = PG_EUNSUPP;
            return;
        }
    g_nccl_rc = 0;
}

int nccl_ready() {
    pthread_once(&g_nccl_once, load_nccl);
    if (g_nccl_rc < 0) return pg_err_set(g_nccl_rc, "nccl: %s", g_nccl_why);
    return 0;
}

#define NCCL_TRY(call)                                                                             \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            return pg_err_set(PG_EIO, "nccl: %s: %s", #call, g_nccl.GetErrorString(r_));           \
    } while (0)

struct NcclComm {
    pg_comm base;
    ncclComm_t comm; // set once by wrap: the collectives read it while abort runs
    cudaStream_t stream;
    int device;
    float *one; // a device float for the barrier
    // abort (any thread) against the collectives' check: `mu` guards these.
    pthread_mutex_t mu;
    bool aborted;
    char why[256];
};

NcclComm *nc(pg_comm *c) {
    return (NcclComm *)c;
}

// 0, or PG_EIO naming the abort's reason once the communicator is aborted.
int check_live(NcclComm *n, const char *op) {
    pthread_mutex_lock(&n->mu);
    bool aborted = n->aborted;
    char why[sizeof n->why];
    memcpy(why, n->why, sizeof why);
    pthread_mutex_unlock(&n->mu);
    if (!aborted) return 0;
    return pg_err_set(PG_EIO, "nccl communicator (rank %d of %d): %s: aborted: %s", n->base.rank, n->base.size, op,
                      why);
}

ncclDataType_t nccl_type(int32_t dtype) {
    return dtype == PG_DTYPE_F32 ? ncclFloat32 : ncclBfloat16;
}

int nccl_all_reduce(pg_comm *c, void *buf, int64_t count, int32_t dtype) {
    PG_ARG(dtype == PG_DTYPE_F32 || dtype == PG_DTYPE_BF16, "nccl all-reduce: dtype %d", dtype);
    if (count == 0) return 0;
    NcclComm *n = nc(c);
    PG_TRY(check_live(n, "all_reduce_sum"));
    NCCL_TRY(g_nccl.AllReduce(buf, buf, (size_t)count, nccl_type(dtype), ncclSum, n->comm, n->stream));
    return 0;
}

int nccl_all_gather(pg_comm *c, const void *send, void *recv, size_t bytes) {
    if (bytes == 0) return 0;
    NcclComm *n = nc(c);
    PG_TRY(check_live(n, "all_gather"));
    NCCL_TRY(g_nccl.AllGather(send, recv, bytes, ncclUint8, n->comm, n->stream));
    return 0;
}

// Every peer's send and receive inside one group, so NCCL schedules them
// together (a rank's sends and receives in separate calls would each wait
// for the other side's matching call: a deadlock for a pair). The group
// is always ended, also after a failed enqueue, so NCCL's group depth
// stays balanced for the next collective.
int nccl_all_to_all_v(pg_comm *c, const void *send, const size_t *sbytes, const size_t *soff, void *recv,
                      const size_t *rbytes, const size_t *roff) {
    PG_ARG(sbytes && soff && rbytes && roff, "nccl all_to_all_v: no size or offset array");
    NcclComm *n = nc(c);
    PG_TRY(check_live(n, "all_to_all_v"));
    const int me = c->rank;
    PG_ARG(sbytes[me] == rbytes[me], "nccl all_to_all_v: rank %d sends itself %zu bytes but expects %zu", me,
           sbytes[me], rbytes[me]);
    if (sbytes[me])
        PG_CUDA_TRY(cudaMemcpyAsync((char *)recv + roff[me], (const char *)send + soff[me], sbytes[me],
                                    cudaMemcpyDeviceToDevice, n->stream));
    NCCL_TRY(g_nccl.GroupStart());
    ncclResult_t r = ncclSuccess;
    const char *what = "";
    for (int p = 0; p < c->size && r == ncclSuccess; p++) {
        if (p == me) continue;
        if (sbytes[p]) {
            r = g_nccl.Send((const char *)send + soff[p], sbytes[p], ncclChar, p, n->comm, n->stream);
            what = "ncclSend";
        }
        if (r == ncclSuccess && rbytes[p]) {
            r = g_nccl.Recv((char *)recv + roff[p], rbytes[p], ncclChar, p, n->comm, n->stream);
            what = "ncclRecv";
        }
    }
    ncclResult_t e = g_nccl.GroupEnd();
    if (r != ncclSuccess)
        return pg_err_set(PG_EIO, "nccl: all_to_all_v: %s: %s", what, g_nccl.GetErrorString(r));
    if (e != ncclSuccess) return pg_err_set(PG_EIO, "nccl: all_to_all_v: ncclGroupEnd: %s", g_nccl.GetErrorString(e));
    return 0;
}

int nccl_broadcast(pg_comm *c, void *buf, size_t bytes, int32_t root) {
    PG_ARG(root >= 0 && root < c->size, "nccl broadcast: root %d of %d", root, c->size);
    if (bytes == 0) return 0;
    NcclComm *n = nc(c);
    PG_TRY(check_live(n, "broadcast"));
    NCCL_TRY(g_nccl.Broadcast(buf, buf, bytes, ncclUint8, root, n->comm, n->stream));
    return 0;
}

int nccl_barrier(pg_comm *c) {
    NcclComm *n = nc(c);
    PG_TRY(check_live(n, "barrier"));
    NCCL_TRY(g_nccl.AllReduce(n->one, n->one, 1, ncclFloat32, ncclSum, n->comm, n->stream));
    PG_CUDA_TRY(cudaStreamSynchronize(n->stream));
    return 0;
}

void nccl_abort(pg_comm *c, const char *why) {
    NcclComm *n = nc(c);
    pthread_mutex_lock(&n->mu);
    const bool first = !n->aborted;
    if (first) {
        n->aborted = true;
        snprintf(n->why, sizeof n->why, "%s", why && *why ? why : "(no reason given)");
    }
    pthread_mutex_unlock(&n->mu);
    // Outside the lock, so the collectives' check does not wait behind it
    // (the abort waits for NCCL's kernels and proxy threads to stop); on the
    // communicator's device and back, as the caller is another rank's
    // thread, bound to its own device.
    if (first) {
        int prev = -1;
        cudaGetDevice(&prev);
        cudaSetDevice(n->device);
        g_nccl.CommAbort(n->comm);
        if (prev >= 0) cudaSetDevice(prev);
    }
}

void nccl_destroy(pg_comm *c) {
    if (!c) return;
    NcclComm *n = nc(c);
    cudaSetDevice(n->device);
    // (An aborted communicator is freed already.)
    if (n->comm && !n->aborted) g_nccl.CommDestroy(n->comm);
    cudaFree(n->one);
    pthread_mutex_destroy(&n->mu);
    free(n);
}

int wrap(pg_backend *be, int32_t rank, int32_t size, ncclComm_t comm, pg_comm **out) {
    NcclComm *n = (NcclComm *)calloc(1, sizeof *n);
    if (!n) return pg_err_set(PG_ENOMEM, "nccl: out of host memory");
    // (In the order of struct pg_comm's members.)
    n->base = pg_comm{"nccl", rank, size, n, nccl_all_reduce, nccl_all_gather, nccl_all_to_all_v,
                      nccl_broadcast, nccl_barrier, nccl_abort, nccl_destroy};
    n->comm = comm;
    pthread_mutex_init(&n->mu, nullptr);
    n->stream = (cudaStream_t)pg_cuda_backend_stream(be);
    n->device = pg_cuda_backend_device(be);
    cudaError_t e = cudaSetDevice(n->device);
    if (e == cudaSuccess) e = cudaMalloc(&n->one, sizeof(float));
    if (e != cudaSuccess) {
        const int dev = n->device;
        pthread_mutex_destroy(&n->mu);
        free(n);
        return pg_err_set(PG_EIO, "nccl: device %d: %s", dev, cudaGetErrorString(e));
    }
    *out = &n->base;
    return 0;
}

} // namespace

extern "C" int pg_comm_nccl_create_all(pg_backend *const *backends, int32_t n, pg_comm **out) {
    PG_ARG(n >= 1 && n <= 64, "nccl: %d ranks", n);
    PG_TRY(nccl_ready());
    int devs[64];
    ncclComm_t comms[64];
    for (int32_t r = 0; r < n; r++) devs[r] = pg_cuda_backend_device(backends[r]);
    NCCL_TRY(g_nccl.CommInitAll(comms, n, devs));
    for (int32_t r = 0; r < n; r++) {
        int rc = wrap(backends[r], r, n, comms[r], &out[r]);
        if (rc < 0) {
            for (int32_t i = 0; i < r; i++) nccl_destroy(out[i]);
            for (int32_t i = r; i < n; i++) g_nccl.CommDestroy(comms[i]);
            return rc;
        }
    }
    return 0;
}

extern "C" int pg_comm_nccl_unique_id(uint8_t out[PG_NCCL_ID_BYTES]) {
    static_assert(sizeof(ncclUniqueId) == PG_NCCL_ID_BYTES, "ncclUniqueId is 128 bytes");
    PG_TRY(nccl_ready());
    ncclUniqueId id;
    NCCL_TRY(g_nccl.GetUniqueId(&id));
    memcpy(out, &id, sizeof id);
    return 0;
}

extern "C" int pg_comm_nccl_create_rank(pg_backend *be, int32_t rank, int32_t size,
                                        const uint8_t id[PG_NCCL_ID_BYTES], pg_comm **out) {
    PG_ARG(size >= 1 && rank >= 0 && rank < size, "nccl: rank %d of %d", rank, size);
    PG_TRY(nccl_ready());
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    PG_CUDA_TRY(cudaSetDevice(pg_cuda_backend_device(be)));
    ncclComm_t comm;
    NCCL_TRY(g_nccl.CommInitRank(&comm, size, uid, rank));
    int rc = wrap(be, rank, size, comm, out);
    if (rc < 0) g_nccl.CommDestroy(comm);
    return rc;
}
