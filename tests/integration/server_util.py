"""Helpers for the `paged serve` integration tests.

Each test starts build/paged serve (or $PAGED_BIN, e.g. build/asan/paged) on
a free port with the default model (or $PAGED_MODEL), waits for /health, runs
its checks and always stops the server (Server is a context manager).
$PAGED_EXTRA_ARGS (split as a shell would) is appended to every serve
command line, e.g. "--device cuda" on a GPU host. Exit code 77 means
"skipped" to tests/run_all.py.
"""
import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.environ.get("PAGED_MODEL") or os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
# Small enough for several servers in a row, big enough for every test:
# 2048-token context, 256 MiB of KV cache (f16 on the CPU by default: ~11,600
# tokens; f32 in --matmul-mode exact: ~5,800).
DEFAULT_ARGS = ["--max-model-len", "2048", "--kv-cache-memory", "256M"]
EXTRA_ARGS = shlex.split(os.environ.get("PAGED_EXTRA_ARGS", ""))

# Twenty varied prompts, the held-out set of the greedy-equality tests
# (test_tensor_parallel, test_kv_cache_dtype).
PROMPTS_20 = [
    "The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):",
    "The three primary colors are", "Water boils at a temperature of", "My favourite book is",
    "In 1969, the first human", "The quick brown fox", "To make a cup of tea, first",
    "A haiku about autumn:", "The largest planet in the solar system", "Photosynthesis is the process",
    "Translate to French: Good morning", "The best way to learn a language is", "import numpy as np\n",
    "Dear Sir or Madam,", "The recipe calls for two cups of", "Mount Everest is located in",
    "Three reasons to exercise daily:", "The meaning of life is",
]


def skip(msg):
    print(f"SKIP: {msg}", flush=True)
    sys.exit(77)


def binary():
    b = os.environ.get("PAGED_BIN") or os.path.join(ROOT, "build", "paged")
    if not os.path.isabs(b):
        b = os.path.join(ROOT, b)
    return b


def require_model_and_binary():
    if not os.path.exists(binary()):
        skip(f"{binary()} is not built")
    if not os.path.exists(MODEL):
        skip(f"the default model {MODEL} is missing (deploy/quickstart.sh setup)")


# The real Gemma 3 270M (Q4_K_M), fetched into models/ by deploy/quickstart.sh setup.
GEMMA3_270M = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")


def require_gemma3_270m():
    """The real Gemma 3 270M's path; skips when the file is missing."""
    if not os.path.exists(GEMMA3_270M):
        skip(f"{GEMMA3_270M} is missing (deploy/quickstart.sh setup fetches it)")
    return GEMMA3_270M


def require_openai():
    """Imports openai, re-running this script with the repository's .venv
    python when the current one lacks it."""
    try:
        import openai  # noqa: F401
        return
    except ImportError:
        pass
    venv = os.path.join(ROOT, ".venv", "bin", "python3")
    if os.path.exists(venv) and os.path.realpath(sys.executable) != os.path.realpath(venv):
        os.execv(venv, [venv] + sys.argv)
    skip("the openai package is not installed (deploy/quickstart.sh setup creates .venv)")


def free_port(n=1):
    """A port P with P .. P + n - 1 all free now (n = 2 for a --master-port:
    its tcp data plane is P + 1). Drawn at random below the kernel's
    ephemeral range (32768 up), so that no outgoing connection of this
    machine (a client's, a follower's dial) takes it between this check and
    the server's bind, which bind(0)'s ephemeral ports and an unchecked
    P + 1 allowed."""
    import random
    for _ in range(200):
        p = random.randrange(20000, 32768 - n)
        socks = []
        try:
            for q in range(p, p + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} free consecutive ports found in 20000-32767")


class Server:
    """build/paged serve on a free port; stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, *args, env=None, ready_timeout=120, default_args=True, https=None, client_cert=None):
        self.port = free_port()
        self.args = list(args)
        self.env = dict(os.environ)
        self.env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        self.env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        if env:
            self.env.update(env)
        self.ready_timeout = ready_timeout
        self.default_args = default_args
        # https: the CA file to verify a TLS server with (start() then waits
        # for /health over TLS); client_cert: (cert, key) to present.
        self.https = https
        self.client_cert = client_cert
        self.proc = None
        self.returncode = None
        self.logf = tempfile.NamedTemporaryFile(prefix="paged-serve-", suffix=".log", delete=False)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        cmd = [binary(), "serve", "--model", MODEL, "--host", "127.0.0.1", "--port", str(self.port)]
        if self.default_args:
            cmd += DEFAULT_ARGS
        cmd += self.args + EXTRA_ARGS
        self.proc = subprocess.Popen(cmd, stdout=self.logf, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=ROOT)
        deadline = time.time() + self.ready_timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"paged serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                st = self._health() if self.https else request(self.port, "GET", "/health", timeout=2)[0]
                if st == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"paged serve not healthy after {self.ready_timeout}s:\n{self.log()}")

    def _health(self):
        import ssl
        ctx = ssl.create_default_context(cafile=self.https)
        if self.client_cert:
            ctx.load_cert_chain(*self.client_cert)
        c = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=2, context=ctx)
        try:
            c.request("GET", "/health")
            return c.getresponse().status
        finally:
            c.close()

    def log(self):
        with open(self.logf.name, errors="replace") as f:
            return f.read()

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def wait(self, timeout):
        self.returncode = self.proc.wait(timeout=timeout)
        return self.returncode

    def stop(self, timeout=60):
        """SIGTERM and wait; returns the exit code (SIGKILL after `timeout`)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.returncode = self.proc.returncode
        return self.returncode

    def check_clean_exit(self):
        """The server exited 0 and (under ASan) reported nothing."""
        log = self.log()
        assert self.returncode == 0, f"exit code {self.returncode}\n{log[-6000:]}"
        for bad in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
            assert bad not in log, f"{bad} in the server log:\n{log[-12000:]}"

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        if exc[0] is None:
            self.check_clean_exit()
        else:
            sys.stderr.write(f"--- server log ({self.logf.name}) ---\n{self.log()[-6000:]}\n")
        os.unlink(self.logf.name)
        return False


# --- HTTP -------------------------------------------------------------------------


def request(port, method, path, body=None, headers=None, timeout=60):
    """One request on a fresh connection: (status, headers dict, body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            headers = dict(headers or {}, **{"Content-Type": "application/json"})
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


def post(port, path, obj, headers=None, timeout=120):
    """POST JSON; returns (status, parsed JSON or None)."""
    st, _, data = request(port, "POST", path, obj, headers, timeout)
    try:
        return st, json.loads(data) if data else None
    except ValueError:
        return st, data


def post_ok(port, path, obj, timeout=120):
    """POST JSON that must answer 200; returns the parsed JSON."""
    st, j = post(port, path, obj, timeout=timeout)
    assert st == 200, (path, st, j)
    return j


def verdict(failed, ok):
    """A test's end: prints the failures and returns 1, or prints `ok` and
    returns 0 (main's exit code)."""
    if failed:
        print(f"FAIL: {failed}")
        return 1
    print(ok)
    return 0


def sse_stream(port, path, obj, timeout=120, on_event=None):
    """POST a streaming request; returns (status, list of parsed events, saw_done).
    on_event, if given, is called with each parsed event as it arrives."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, body=json.dumps(obj), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return r.status, [json.loads(r.read())], False
        assert r.getheader("Content-Type", "").startswith("text/event-stream"), r.getheaders()
        events, done = [], False
        for line in r:
            line = line.decode().rstrip("\n")
            if not line:
                continue
            assert line.startswith("data: "), line
            payload = line[6:]
            if payload == "[DONE]":
                done = True
                continue
            assert not done, "data after [DONE]"
            events.append(json.loads(payload))
            if on_event:
                on_event(events[-1])
        return r.status, events, done
    finally:
        c.close()


def metrics(port, headers=None):
    """Parses /metrics into {"name{labels}": value}."""
    st, _, data = request(port, "GET", "/metrics", headers=headers)
    assert st == 200, st
    out = {}
    for line in data.decode().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, val = line.rpartition(" ")
        out[key] = float(val)
    return out


def metric(m, name, **labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    total, found = 0.0, False
    for key, v in m.items():
        n, _, rest = key.partition("{")
        if n != name:
            continue
        if all(f'{k}="{val}"' in rest for k, val in labels.items()):
            total += v
            found = True
    assert found, f"metric {name} {labels} not found"
    return total


def wait_idle(port, timeout=60):
    """Waits until no request runs or waits and no KV block is held by a
    request (blocks kept by the prefix cache are free); returns the metrics."""
    deadline = time.time() + timeout
    while True:
        m = metrics(port)
        busy = (metric(m, "paged:num_requests_running") + metric(m, "paged:num_requests_waiting") +
                metric(m, "paged:kv_cache_blocks", state="used") + metric(m, "paged:http_requests_in_progress"))
        if busy == 0:
            return m
        if time.time() > deadline:
            raise AssertionError(f"server not idle after {timeout}s: " +
                                 str({k: v for k, v in m.items() if "requests" in k or "blocks" in k}))
        time.sleep(0.2)


# --- Prometheus ----------------------------------------------------------------------


def prom_get(port, path, **params):
    """GET a Prometheus HTTP API path; returns the parsed JSON."""
    import urllib.parse
    import urllib.request
    url = f"http://127.0.0.1:{port}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def wait_for(what, fn, timeout=60):
    """Polls fn() -> (ok, detail) until ok; returns the detail."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            ok, last = fn()
            if ok:
                return last
        except OSError as e:
            last = repr(e)
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {last}")


class Prometheus:
    """A real Prometheus (Debian's `prometheus`) scraping `target`
    (host:port) every second, in a scratch directory; stopped on exit."""

    def __init__(self, target, bearer=None):
        import shutil
        self.exe = shutil.which("prometheus")
        self.target, self.bearer = target, bearer
        self.tmp = tempfile.mkdtemp(prefix="paged-prom-")
        self.port = free_port()
        self.proc = None

    def __enter__(self):
        cfg = os.path.join(self.tmp, "prometheus.yml")
        auth = f"    authorization:\n      credentials: {self.bearer}\n" if self.bearer else ""
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                    "scrape_configs:\n  - job_name: paged\n    metrics_path: /metrics\n" + auth +
                    f"    static_configs:\n      - targets: [\"{self.target}\"]\n")
        self.log = open(os.path.join(self.tmp, "prometheus.log"), "w")
        self.proc = subprocess.Popen([self.exe, f"--config.file={cfg}", f"--storage.tsdb.path={self.tmp}/data",
                                      f"--web.listen-address=127.0.0.1:{self.port}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)

        def up():
            t = prom_get(self.port, "/api/v1/targets")["data"]["activeTargets"]
            return bool(t) and t[0]["health"] == "up", t
        wait_for("the paged target to be up", up)
        return self

    def query(self, expr):
        return prom_get(self.port, "/api/v1/query", query=expr)

    def __exit__(self, *exc):
        import shutil
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return False


# --- raw sockets ---------------------------------------------------------------------


def connect(port, timeout=30):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_response(sock, buf=b""):
    """Reads one HTTP/1.1 response from `sock` (Content-Length, chunked or
    close-delimited). Returns (status, headers, body, leftover bytes)."""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response head: {buf!r}")
        buf += chunk
    head, _, buf = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1])
    headers = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        headers[k.strip().lower()] = v.strip()
    if status == 100:
        return read_response(sock, buf)
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(buf) < n:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed inside a body")
            buf += chunk
        return status, headers, buf[:n], buf[n:]
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            while b"\r\n" not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("closed inside chunked body")
                buf += chunk
            size_line, _, buf = buf.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            while len(buf) < size + 2:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("closed inside a chunk")
                buf += chunk
            if size == 0:
                return status, headers, body, buf[2:]
            body += buf[:size]
            buf = buf[size + 2:]
    body = buf
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return status, headers, body, b""
        body += chunk


def error_of(body):
    """The OpenAI error object of a JSON error body (asserting its shape)."""
    j = json.loads(body) if isinstance(body, (bytes, str)) else body
    assert set(j) == {"error"}, j
    e = j["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert isinstance(e["message"], str) and e["message"], e
    return e


def run_checks(checks):
    """Runs (name, fn) pairs, printing each; stops at the first failure."""
    for name, fn in checks:
        t0 = time.time()
        fn()
        print(f"ok   {name} ({time.time() - t0:.1f}s)", flush=True)
