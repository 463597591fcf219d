// engine/dist/remote.c - the control link of a multi-node tensor-parallel group
// (engine/dist/remote.h).
//
// Wire format (host byte order: every node runs the same build, which the
// hello checks through the sizes of the structs that cross):
//   hello  u32 'PGNI' | u32 version | i32 node_rank | i32 nnodes | i32 tp |
//          u32 sizes[5] | pg_node_config (engine/dist/node_config.h)
//          (version 2; version 1, 'PGNH', had no version, sizes[4] and no
//          configuration: node 0 refuses it as another build)
//   answer u32 'PGNA' | i32 status | u64 len | len bytes (the blob, or why)
//   call   u32 'PGNC' | u32 op | u64 len | payload
//   reply  u32 'PGNR' | i32 rc | u64 len | payload (rc < 0: the message)
#include "engine/dist/remote.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "common/net.h"
#include "engine/runner/runner.h"
#include "kernels/comm/comm.h"

#define HELLO_WAIT_MS 10000

#define HELLO_V1 0x484e4750u // "PGNH": version 1's hello (no configuration)
#define HELLO 0x494e4750u    // "PGNI"
#define HELLO_VERSION 2u
#define ANSWER 0x414e4750u // "PGNA"
#define CALL 0x434e4750u   // "PGNC"
#define REPLY 0x524e4750u  // "PGNR"
#define MAX_PAYLOAD ((uint64_t)1 << 32)

typedef struct {
    uint32_t magic;
    int32_t a;
    uint64_t len;
} frame;

typedef struct {
    uint32_t magic, version;
    int32_t node_rank, nnodes, tp;
    uint32_t sizes[5];
    pg_node_config config;
} hello;

// Version 1's whole hello, past its magic: i32 node_rank, nnodes, tp, u32 sizes[4].
#define HELLO_V1_REST 28

static void hello_sizes(uint32_t s[5]) {
    s[0] = sizeof(pg_plan_seq);
    s[1] = sizeof(pg_sampling_params);
    s[2] = sizeof(pg_runner_config);
    s[3] = sizeof(pg_runner_mem);
    s[4] = sizeof(pg_node_config);
}

// A hello after its magic: version 2's rest, or version 1's (read whole so
// that it gets its answer; 1 in h->version).
static int read_hello(int fd, hello *h) {
    PG_TRY(pg_net_read_all(fd, &h->magic, sizeof h->magic));
    if (h->magic == HELLO_V1) {
        uint8_t rest[HELLO_V1_REST];
        PG_TRY(pg_net_read_all(fd, rest, sizeof rest));
        memcpy(&h->node_rank, rest, sizeof h->node_rank);
        h->version = 1;
        return 0;
    }
    if (h->magic != HELLO) return 0;
    return pg_net_read_all(fd, (char *)h + sizeof h->magic, sizeof *h - sizeof h->magic);
}

static const char *addr(const pg_remote_opts *o) { return o->master_addr ? o->master_addr : "127.0.0.1"; }

static int send_frame(int fd, uint32_t magic, int32_t a, const void *p, size_t len) {
    frame f = {magic, a, len};
    PG_TRY(pg_net_write_all(fd, &f, sizeof f));
    return len ? pg_net_write_all(fd, p, len) : 0;
}

static int recv_frame(int fd, uint32_t magic, int32_t *a, pg_wbuf *payload) {
    frame f;
    PG_TRY(pg_net_read_all(fd, &f, sizeof f));
    if (f.magic != magic || f.len > MAX_PAYLOAD)
        return pg_err_set(PG_EIO, "control link: unexpected frame %08x of %llu bytes", f.magic,
                          (unsigned long long)f.len);
    *a = f.a;
    payload->len = 0;
    if (f.len) {
        if (payload->cap < f.len) {
            payload->data = pg_xrealloc(payload->data, f.len);
            payload->cap = f.len;
        }
        PG_TRY(pg_net_read_all(fd, payload->data, f.len));
        payload->len = f.len;
    }
    return 0;
}

int pg_remote_leader_open(const pg_remote_opts *o, const void *blob, size_t blob_len, pg_remote *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < 64; i++) out->fds[i] = -1;
    PG_ARG(o->nnodes >= 2 && o->nnodes <= 65, "--nnodes %d", o->nnodes);
    const int timeout = o->timeout_ms > 0 ? o->timeout_ms : 300000;
    int lfd;
    PG_TRY(pg_net_listen(o->master_addr, o->master_port, 64, &lfd));
    PG_LOGI("node 0 of %d: waiting on port %d for the other nodes", o->nnodes, o->master_port);
    int rc = 0;
    uint32_t sizes[5];
    hello_sizes(sizes);
    const pg_node_config none = {0}, *ours = o->config ? o->config : &none;
    for (int got = 0; got < o->nnodes - 1 && rc == 0;) {
        int fd;
        if ((rc = pg_net_accept(lfd, timeout, &fd)) < 0) {
            rc = pg_err_wrap(rc, "waiting for %d more node%s on port %d: ", o->nnodes - 1 - got,
                             o->nnodes - 1 - got == 1 ? "" : "s", o->master_port);
            break;
        }
        // A node says hello as soon as it connects: a connection silent for
        // HELLO_WAIT_MS (a port scanner, a stray client) is dropped rather
        // than left to block the accept loop.
        hello h = {0};
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr;
        while ((pr = poll(&pfd, 1, HELLO_WAIT_MS)) < 0 && errno == EINTR) {
        }
        if (pr <= 0 || (rc = read_hello(fd, &h)) < 0 || (h.magic != HELLO && h.magic != HELLO_V1)) {
            PG_LOGW("control link: a connection that is not a paged node (%s), ignored",
                    pr <= 0 ? "no hello within 10 s" : "no paged hello");
            close(fd);
            rc = 0;
            continue;
        }
        char msg[256] = "";
        if (h.version != HELLO_VERSION)
            snprintf(msg, sizeof msg, "node %d runs a different build of paged", h.node_rank);
        else if (h.nnodes != o->nnodes || h.tp != o->tp)
            snprintf(msg, sizeof msg, "node %d runs --nnodes %d -tp %d, node 0 --nnodes %d -tp %d", h.node_rank,
                     h.nnodes, h.tp, o->nnodes, o->tp);
        else if (memcmp(h.sizes, sizes, sizeof sizes))
            snprintf(msg, sizeof msg, "node %d runs a different build of paged", h.node_rank);
        else if (h.node_rank < 1 || h.node_rank >= o->nnodes || out->fds[h.node_rank - 1] >= 0)
            snprintf(msg, sizeof msg, "node rank %d is out of range or already taken", h.node_rank);
        else
            pg_node_config_diff(&h.config, ours, h.node_rank, msg, sizeof msg);
        if (msg[0]) {
            send_frame(fd, ANSWER, PG_EINVAL, msg, strlen(msg));
            close(fd);
            rc = pg_err_set(PG_EINVAL, "%s", msg);
            break;
        }
        out->fds[h.node_rank - 1] = fd;
        got++;
    }
    close(lfd);
    for (int i = 0; i < o->nnodes - 1 && rc == 0; i++) rc = send_frame(out->fds[i], ANSWER, 0, blob, blob_len);
    out->n = o->nnodes - 1;
    if (rc < 0) pg_remote_close(out);
    return rc;
}

void pg_remote_close(pg_remote *r) {
    for (int i = 0; i < 64; i++)
        if (r->fds[i] >= 0) {
            close(r->fds[i]);
            r->fds[i] = -1;
        }
    r->n = 0;
}

int pg_remote_send(pg_remote *r, uint32_t op, const void *payload, size_t len) {
    for (int i = 0; i < r->n; i++) {
        int rc = send_frame(r->fds[i], CALL, (int32_t)op, payload, len);
        if (rc < 0) return pg_err_wrap(rc, "node %d: ", i + 1);
    }
    return 0;
}

// The first node's error, unless it is a collective's failure and a later
// node's is its own (kernels/comm/comm.h pg_comm_err_is_collective): that node's
// rank failed, the others saw its connection close. A broken link (a node
// that died) counts as the node's own.
int pg_remote_collect(pg_remote *r, pg_wbuf *replies, int timeout_ms) {
    int first = 0;
    bool echo = false; // first is a collective's failure
    pg_wbuf tmp = {0};
    char msg[400] = "";
    for (int i = 0; i < r->n; i++) {
        pg_wbuf *b = replies ? &replies[i] : &tmp;
        int32_t status = 0;
        int rc = 0;
        if (timeout_ms >= 0) {
            struct pollfd pfd = {.fd = r->fds[i], .events = POLLIN};
            int pr;
            while ((pr = poll(&pfd, 1, timeout_ms)) < 0 && errno == EINTR) {
            }
            if (pr == 0) rc = pg_err_set(PG_EIO, "sent no reply for %.1f s", timeout_ms * 1e-3);
        }
        if (rc == 0) rc = recv_frame(r->fds[i], REPLY, &status, b);
        char m[400] = "";
        if (rc < 0)
            snprintf(m, sizeof m, "node %d: %s", i + 1, pg_err_msg());
        else if (status < 0)
            snprintf(m, sizeof m, "node %d: %.*s", i + 1, (int)b->len, (const char *)b->data);
        int e = rc < 0 ? rc : status < 0 ? status : 0;
        bool e_echo = e < 0 && pg_comm_err_is_collective(m);
        if (e < 0 && (!first || (echo && !e_echo))) {
            first = e;
            echo = e_echo;
            snprintf(msg, sizeof msg, "%s", m);
        }
    }
    pg_wbuf_free(&tmp);
    return first ? pg_err_set(first, "%s", msg) : 0;
}

int pg_remote_follower_open(const pg_remote_opts *o, void *blob, size_t blob_len, int *fd_out) {
    const int timeout = o->timeout_ms > 0 ? o->timeout_ms : 300000;
    int fd;
    int rc = pg_net_connect(addr(o), o->master_port, timeout, &fd);
    if (rc < 0) return pg_err_wrap(rc, "node %d of %d: ", o->node_rank, o->nnodes);
    hello h = {.magic = HELLO, .version = HELLO_VERSION, .node_rank = o->node_rank, .nnodes = o->nnodes,
               .tp = o->tp};
    hello_sizes(h.sizes);
    if (o->config) h.config = *o->config;
    pg_wbuf ans = {0};
    int32_t status = 0;
    if ((rc = pg_net_write_all(fd, &h, sizeof h)) < 0 || (rc = recv_frame(fd, ANSWER, &status, &ans)) < 0) {
        rc = pg_err_wrap(rc, "node %d: the hello to %s:%d: ", o->node_rank, addr(o), o->master_port);
    } else if (status < 0) {
        rc = pg_err_set(status, "node 0 refused node %d: %.*s", o->node_rank, (int)ans.len, (const char *)ans.data);
    } else if (ans.len != blob_len) {
        rc = pg_err_set(PG_EIO, "node 0 sent %zu set-up bytes, expected %zu", ans.len, blob_len);
    } else if (blob_len) {
        memcpy(blob, ans.data, blob_len);
    }
    pg_wbuf_free(&ans);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    *fd_out = fd;
    return 0;
}

int pg_remote_recv_call(int fd, uint32_t *op, pg_wbuf *payload) {
    int32_t a = 0;
    PG_TRY(recv_frame(fd, CALL, &a, payload));
    *op = (uint32_t)a;
    return 0;
}

int pg_remote_reply(int fd, int rc, const void *payload, size_t len) {
    if (rc < 0) {
        const char *m = pg_err_msg();
        return send_frame(fd, REPLY, rc, m, strlen(m));
    }
    return send_frame(fd, REPLY, 0, payload, len);
}
