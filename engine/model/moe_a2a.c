// engine/model/moe_a2a.c - expert parallelism's combine by all-to-all
// (--all2all-backend alltoall, docs/moe.md "The all-to-all combine").
//
// Under expert parallelism every rank holds whole experts and, attention
// being split by heads, every rank has every row of the step. The default
// combine (pg_layer_ffn_moe) sums each rank's share with the all-reduce
// that ends every layer: [rows][hidden] from every rank, although a row's
// share is non-zero only on the ranks holding one of its top-k experts (at
// most top_k of them). This combine sends only those shares:
//
//   1. each rank runs its experts over every row (moe_ffn, the same op and
//      routing as the default), into a scratch: P_r [rows][hidden];
//   2. rows are split into home slices, slice s = rows [R s / N, R (s + 1) / N);
//      rank r sends to rank s the rows of slice s whose share is non-zero
//      (a zero share adds nothing), as records (row id, hidden values), with
//      all_to_all_v after an all_gather of the per-pair record counts;
//   3. rank s adds the shares it received to its slice of the stream, in
//      rank order 0, 1, ..., N-1, one f32 add each (the all-reduce's order,
//      so the stream is bit for bit the default combine's);
//   4. the slices go back to every rank (all_to_all_v as an all-gather of
//      unequal slices), so every rank again has the whole stream.
//
// Bytes per rank, in rows x hidden: the shares that leave it, about
// min(top_k, N) / N x (N - 1) / N, plus the slices' all-gather, (N - 1) /
// N, against the ring all-reduce's 2 (N - 1) / N: less where top_k < N
// (Mixtral's top-2 over 8 ranks: 38% fewer), about the same at top_k >= N.
// It pays over TCP between hosts (--nnodes), where the wire is the limit.
//
// Host memory only: the communicator's buffers are the backend's, so this
// runs with the cpu and tcp communicators (CPU backend, f32 rows); the
// loader refuses it elsewhere. The records live in buffers of the model's,
// grown on demand.
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/model/layers.h"

struct pg_moe_a2a {
    char *send, *recv, *stage;
    size_t send_cap, recv_cap, stage_cap;
};

void pg_moe_a2a_free(pg_model *m) {
    if (!m->moe_a2a) return;
    free(m->moe_a2a->send);
    free(m->moe_a2a->recv);
    free(m->moe_a2a->stage);
    free(m->moe_a2a);
    m->moe_a2a = NULL;
}

static int grow(char **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return 0;
    char *q = realloc(*p, bytes);
    if (!q) return pg_err_set(PG_ENOMEM, "moe all-to-all: %zu bytes of host buffers", bytes);
    *p = q, *cap = bytes;
    return 0;
}

static int64_t slice0(int64_t rows, int32_t s, int32_t n) { return rows * s / n; }

// Whether row i of p ([rows][hidden] f32) holds anything but zeros.
static bool row_nonzero(const float *p, int64_t hidden) {
    for (int64_t d = 0; d < hidden; d++)
        if (p[d] != 0.0f) return true;
    return false;
}

int pg_layer_ffn_moe_alltoall(const pg_model *m, int32_t l, const pg_step_views *v) {
    const pg_model_layer *L = &m->layers[l];
    const pg_model_config *c = &m->cfg;
    pg_comm *comm = m->comm;
    const int32_t N = comm->size, r = comm->rank;
    const int64_t R = v->x.rows, H = v->x.cols;
    PG_ARG(v->x.dtype == PG_DTYPE_F32 && v->xn.dtype == PG_DTYPE_F32 && (R <= 1 || (v->x.stride == H &&
                                                                                     v->xn.stride == H)),
           "moe all-to-all: needs contiguous f32 rows in host memory (the CPU backend)");
    PG_ARG(N <= 64, "moe all-to-all: %d ranks (at most 64)", N);
    struct pg_moe_a2a *b = m->moe_a2a;

    // 1. This rank's experts over every row: its shares, not yet added.
    pg_tensor part = v->xn;
    PG_TRY(m->be->ops->moe_ffn(m->be, part, v->x, L->ffn_norm, c->rms_eps, L->router,
                               (const pg_bweight *const *)L->exp_gate_up, (const pg_bweight *const *)L->exp_down,
                               c->n_experts, c->n_experts_used, c->moe_renorm, false, v->moe_ws, v->moe_ws_bytes));
    const float *P = (const float *)part.data;
    float *X = (float *)v->x.data;

    // 2. Records (row id, then the share) for each home slice, in slice order.
    const size_t rec = sizeof(float) * (size_t)(H + 1);
    int64_t cnt[64], all[64 * 64];
    size_t sbytes[64], soff[64], rbytes[64], roff[64];
    PG_TRY(grow(&b->send, &b->send_cap, rec * (size_t)(R > 0 ? R : 1)));
    size_t at = 0;
    for (int32_t s = 0; s < N; s++) {
        cnt[s] = 0;
        soff[s] = at;
        for (int64_t i = slice0(R, s, N); i < slice0(R, s + 1, N); i++) {
            if (!row_nonzero(P + i * H, H)) continue;
            const int32_t id = (int32_t)i;
            memcpy(b->send + at, &id, sizeof id);
            memcpy(b->send + at + sizeof(float), P + i * H, sizeof(float) * (size_t)H);
            at += rec, cnt[s]++;
        }
        sbytes[s] = at - soff[s];
    }
    // Every rank's counts: all[d * N + s] records from d to s.
    PG_TRY(comm->all_gather(comm, cnt, all, sizeof(int64_t) * (size_t)N));
    size_t in = 0;
    for (int32_t d = 0; d < N; d++) {
        roff[d] = in;
        rbytes[d] = (size_t)all[d * N + r] * rec;
        in += rbytes[d];
    }
    PG_TRY(grow(&b->recv, &b->recv_cap, in > 0 ? in : 1));
    PG_TRY(comm->all_to_all_v(comm, b->send, sbytes, soff, b->recv, rbytes, roff));

    // 3. The shares into this rank's slice, rank by rank (the all-reduce's order).
    const int64_t s0 = slice0(R, r, N), s1 = slice0(R, r + 1, N);
    for (int32_t d = 0; d < N; d++)
        for (size_t q = roff[d]; q < roff[d] + rbytes[d]; q += rec) {
            int32_t id;
            memcpy(&id, b->recv + q, sizeof id);
            PG_ARG(id >= s0 && id < s1, "moe all-to-all: rank %d sent row %d, outside rank %d's rows [%lld, %lld)",
                   d, id, r, (long long)s0, (long long)s1);
            float *x = X + (int64_t)id * H;
            const float *y = (const float *)(b->recv + q + sizeof(float));
            for (int64_t e = 0; e < H; e++) x[e] += y[e];
        }

    // 4. Every slice to every rank: this one's staged (the pieces of recv,
    // the stream itself, must not overlap what is sent).
    const size_t row = sizeof(float) * (size_t)H, mine = (size_t)(s1 - s0) * row;
    PG_TRY(grow(&b->stage, &b->stage_cap, mine > 0 ? mine : 1));
    if (mine) memcpy(b->stage, X + s0 * H, mine);
    for (int32_t s = 0; s < N; s++) {
        sbytes[s] = mine, soff[s] = 0;
        rbytes[s] = (size_t)(slice0(R, s + 1, N) - slice0(R, s, N)) * row;
        roff[s] = (size_t)slice0(R, s, N) * row;
    }
    return comm->all_to_all_v(comm, b->stage, sbytes, soff, X, rbytes, roff);
}

int pg_moe_a2a_init(pg_model *m) {
    if (m->moe_a2a) return 0;
    m->moe_a2a = calloc(1, sizeof *m->moe_a2a);
    return m->moe_a2a ? 0 : pg_err_set(PG_ENOMEM, "moe all-to-all: out of memory");
}
