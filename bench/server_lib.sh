# bench/server_lib.sh - sourced by the side-by-side scripts
# (run_cpu_compare.sh, run_gpu_compare.sh), which run one server at a time:
# stop_server ends it (TERM, 10 s grace, then KILL) and runs on exit and on
# Ctrl-C; free_port prints a free local TCP port. Needs $PY (a python3).
SERVER_PID=
stop_server() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=
}
trap 'stop_server' EXIT
trap 'stop_server; exit 130' INT TERM
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
