// kernels/comm/comm_op.h - what the communicator implementations share
// (kernels/comm/comm_cpu.c, kernels/comm/comm_tcp_*.c): the collectives' ids, as
// they check that every rank makes the same call, and their names for
// the messages that say which calls disagreed. Internal to kernels/.
#pragma once

enum { OP_ALL_REDUCE = 1, OP_ALL_GATHER, OP_BROADCAST, OP_BARRIER, OP_ALL_TO_ALL };

static inline const char *pg_comm_op_name(int op) {
    switch (op) {
    case OP_ALL_REDUCE: return "all_reduce_sum";
    case OP_ALL_GATHER: return "all_gather";
    case OP_BROADCAST: return "broadcast";
    case OP_BARRIER: return "barrier";
    case OP_ALL_TO_ALL: return "all_to_all_v";
    default: return "an unknown collective";
    }
}
