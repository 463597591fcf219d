// kernels/comm/comm_err.c - telling a communicator's failures from a rank's own
// (kernels/comm/comm.h pg_comm_err_is_collective).
//
// When one rank fails, the ranks waiting for it in a collective fail too
// (aborted, a closed connection, a timeout); the caller that collects
// every rank's error wants the first rank's real one, not those echoes.
// The cpu and tcp communicators (and nccl's, once aborted) start every
// message of a collective that failed with "<name> communicator (rank R
// of N): ", which is what this recognizes; a call that was wrong on its
// own rank ("cpu communicator: rank 1 called all_reduce_sum with ...") is
// that rank's own failure.
#include <string.h>

#include "kernels/comm/comm.h"

bool pg_comm_err_is_collective(const char *msg) { return msg && strstr(msg, " communicator (rank ") != NULL; }
