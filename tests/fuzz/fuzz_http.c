// tests/fuzz/fuzz_http.c - fuzz target for the HTTP/1.1 front end: the
// connection state machine with llhttp and its limits (server/http_conn.c)
// and the router (server/http_router.c: paths, methods, 404/405, the API
// key), on a real loopback socket and a real libuv loop.
//
// Input: the bytes a client sends on one connection (any number of
// pipelined requests, or garbage). The harness connects, writes them, runs
// the loop so the server parses and answers, reads what it sends until
// nothing more comes, then leaves with a reset (no TIME_WAIT). An API key is set, so the
// routes that would need an engine answer 401 and the rest (/health, 404,
// 405, protocol errors 400/413/414/431/505) run their real handlers.
// Checked on every input:
//   - every response the server sends starts with "HTTP/1.1 " and a 3-digit
//     status (a 100 Continue may come first);
//   - the server holds no connection once the client is gone (nothing stuck);
//   - ASan/UBSan/LSan watch the rest.
// PG_FUZZ_HTTP_ECHO=1 prints what the server sent (to read a reproducer).
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "common/log.h"
#include "server/app.h"

#define CHECK(c)                                                                 \
    do {                                                                         \
        if (!(c)) {                                                              \
            fprintf(stderr, "fuzz_http: %s:%d: %s\n", __FILE__, __LINE__, #c);   \
            abort();                                                             \
        }                                                                        \
    } while (0)

static uv_loop_t loop;
static srv_app app;
static int port;

static void on_error_body(int status, const char *msg, sbuf *out, void *ctx) {
    api_error e;
    api_err(&e, status, NULL, "%s", msg);
    api_error_json(&e, out);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    signal(SIGPIPE, SIG_IGN);
    pg_log_set_level(PG_LOG_ERROR);
    uv_loop_init(&loop);
    app.loop = &loop;
    // A key nobody guesses: no request reaches a route that needs an engine.
    app.api_key = "fuzz-4c1d9e0b7a2f58e3d6b1a09c7e4f2d81";
    app.api_key_len = strlen(app.api_key);
    app.served_name = "fuzz-model";
    app.model_path = "/nonexistent/fuzz-model.gguf";
    api_limits_default(&app.lim);
    app.lim.max_model_len = 2048;
    app.lim.vocab_size = 1000;
    srv_http_limits lim;
    srv_http_limits_default(&lim);
    lim.max_body = 64 << 10;
    lim.max_header_bytes = 16 << 10;
    lim.max_request_line = 4 << 10;
    srv_http_handlers h = {.on_request = srv_route, .error_body = on_error_body, .ctx = &app};
    CHECK(srv_http_start(&loop, "127.0.0.1", 0, &lim, &h, &app.http) == 0);
    port = srv_http_port(app.http);
    return 0;
}

// Runs the loop without blocking, then waits up to `ms` for the client
// socket to become readable.
static void pump(int fd, int ms) {
    uv_run(&loop, UV_RUN_NOWAIT);
    struct pollfd p = {fd, POLLIN, 0};
    if (fd >= 0) poll(&p, 1, ms);
}

// Checks each response head in what the server sent (only the first one of
// a connection can be checked without parsing bodies: the rest are found by
// their "HTTP/1.1 " prefix at a line start, which a body could imitate).
static void check_output(const char *out, size_t n) {
    if (n == 0) return;
    CHECK(n >= 12 && !memcmp(out, "HTTP/1.1 ", 9));
    for (int i = 9; i < 12; i++) CHECK(out[i] >= '0' && out[i] <= '9');
}

// Connects fd (non-blocking) to the server and waits until the connection
// is up: 0, or -1 with errno. A blocking connect() fails with EINTR when a
// signal arrives during it, and libFuzzer's -timeout=N sets a SIGALRM timer
// every N/2 + 1 s: tests/fuzz/run_long.sh's -timeout=30 failed one run in
// about a million inputs that way, and -timeout=1 reproduces it in
// seconds. Non-blocking, the connect goes on whatever signals come.
static int connect_server(int fd, const struct sockaddr_in *a) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int rc;
    // Short of ephemeral ports (another process's TIME_WAITs): wait a bit.
    for (int tries = 0; (rc = connect(fd, (const struct sockaddr *)a, sizeof *a)) != 0 && errno == EADDRNOTAVAIL &&
                        tries < 200; tries++)
        usleep(10000);
    if (rc == 0) return 0;
    if (errno != EINPROGRESS && errno != EINTR) return -1;
    // The kernel completes a loopback handshake itself (the listener's
    // backlog, not our loop, takes it): wait for writable, up to 5 s.
    struct pollfd p = {fd, POLLOUT, 0};
    for (int ms = 0; ms < 5000; ms++) {
        int n = poll(&p, 1, 1);
        if (n > 0) break;
        if (n < 0 && errno != EINTR) return -1;
    }
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) return -1;
    if (err == 0 && !(p.revents & POLLOUT)) err = ETIMEDOUT;
    if (err) errno = err;
    return err ? -1 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int rc = connect_server(fd, &a);
    if (rc != 0) fprintf(stderr, "fuzz_http: connect: %s (errno %d)\n", strerror(errno), errno);
    CHECK(rc == 0);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    static char out[1 << 20];
    size_t got = 0, sent = 0;
    bool eof = false;
    for (int spins = 0; sent < size && !eof && spins < 100000; spins++) {
        ssize_t w = write(fd, data + sent, size - sent);
        if (w > 0) sent += (size_t)w;
        else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) break;  // the server closed
        pump(fd, 0);
        ssize_t r = read(fd, out + got, sizeof out - got);
        if (r > 0) got += (size_t)r;
        else if (r == 0) eof = true;
        if (got == sizeof out) got = 0;  // keep only the start; a flood is fine
    }
    // Let the server parse and answer what it has: until nothing new comes
    // for a few loop turns (handlers here answer at once), or it closed.
    // (Loopback delivers at once, so "nothing new" needs no waiting.)
    for (int quiet = 0, spins = 0; !eof && quiet < 8 && spins < 100000; spins++) {
        pump(fd, 0);
        ssize_t r = read(fd, out + got, sizeof out - got);
        if (r > 0) got += (size_t)r, quiet = 0;
        else if (r == 0) eof = true;
        else if (errno != EAGAIN && errno != EWOULDBLOCK) eof = true;  // reset
        else quiet++;
        if (got == sizeof out) got = 0;
    }
    if (getenv("PG_FUZZ_HTTP_ECHO")) fprintf(stderr, "--- server sent %zu bytes:\n%.*s\n", got, (int)got, out);
    check_output(out, got < sizeof out ? got : 0);
    // Leave with a reset, not a FIN: no side keeps the 4-tuple in TIME_WAIT
    // (thousands of inputs a second would use up the ephemeral ports).
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
    for (int spins = 0; srv_http_num_connections(app.http) > 0; spins++) {
        CHECK(spins < 4000);
        uv_run(&loop, UV_RUN_NOWAIT);
        usleep(spins < 10 ? 0 : 1000);
    }
    return 0;
}
