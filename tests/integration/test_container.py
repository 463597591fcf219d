#!/usr/bin/env python3
"""deploy/Containerfile for real: a Debian 12 base made from Debian's
packages (mmdebstrap -> podman import, deploy/container/make_base.sh), the
image built with podman (--isolation chroot, a private store under
build/container/ so nothing outside the tree is touched and layers are
cached between runs), then run with the model mounted: from outside the
container /health answers, the OpenAI SDK gets a completion with the API key
given by the environment, the image's HEALTHCHECK passes, the server runs as
uid 10001 with no compiler in the image, and `podman stop` drains it to exit
code 0.

Storage is overlay where it can be mounted, else vfs; the runtime crun,
else runc. Skips (exit 77, with the reason on the last line) where this
machine cannot build or run containers: podman or mmdebstrap missing, not
root, or no probe container starting with any of those (each probe's error
is printed)."""
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
su.require_openai()

ROOT = su.ROOT
CACHE = os.path.join(ROOT, "build", "container")
BASE = "localhost/paged-base:bookworm"
IMAGE = "localhost/paged:test"
NAME = f"paged-test-{os.getpid()}"
KEY = "container-key"


def podman_cmd(driver):
    """podman on a private store under build/container/ (nothing outside
    the tree is touched; layers stay cached between runs)."""
    return ["podman", "--root", os.path.join(CACHE, "storage", driver),
            "--runroot", os.path.join(CACHE, "run", driver), "--storage-driver", driver]


def sh(cmd, timeout=900, check=True, **kw):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        # stderr last, and the verdict on the last line: a runner that keeps
        # only the tail of a failure's output still shows why.
        raise AssertionError(f"{(p.stdout or '')[-3000:]}\n--- stderr:\n{(p.stderr or '')[-3000:]}\n"
                             f"{' '.join(cmd)[:200]} exited {p.returncode} after {time.time() - t0:.0f}s")
    return p


def last_line(p):
    lines = [l for l in (p.stdout + p.stderr).strip().splitlines() if l.strip()]
    return lines[-1] if lines else f"exit {p.returncode}"


def main():
    for tool in ("podman", "mmdebstrap"):
        if not shutil.which(tool):
            su.skip(f"{tool} is not installed (apt-get install podman mmdebstrap runc); "
                    "deploy/container/README.md says how to build the image elsewhere")
    if os.getuid() != 0:
        su.skip("not root: mmdebstrap and podman's chroot isolation need root here")
    # Storage: overlay where the kernel lets us mount it, else vfs (a full
    # copy per layer: slow and large, but works in restricted sandboxes).
    # Runtime: crun (podman's default), else runc where crun refuses
    # (cgroups in hybrid mode); rlimits no higher than a sandbox allows.
    ulimits = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
    PODMAN, global_flags, tried = None, None, []
    for driver in ("overlay", "vfs"):
        cmd = podman_cmd(driver)
        # The store remembers its absolute path: after the tree moved, start
        # the cache afresh (it only holds this test's images).
        if "database configuration mismatch" in sh(cmd + ["images"], check=False).stderr:
            print(f"note: build/container/storage/{driver} belongs to another path; recreating it", flush=True)
            shutil.rmtree(os.path.join(CACHE, "storage", driver), ignore_errors=True)
            shutil.rmtree(os.path.join(CACHE, "run", driver), ignore_errors=True)
        t0 = time.time()
        p = sh(["bash", "deploy/container/make_base.sh", BASE], check=False, cwd=ROOT,
               env=dict(os.environ, PODMAN_FLAGS=" ".join(cmd[1:])), timeout=900)
        if p.returncode != 0:
            tried.append(f"{driver}: base image: {last_line(p)}")
            continue
        print(f"ok   base image {BASE} from mmdebstrap, {driver} storage ({time.time() - t0:.0f}s)", flush=True)
        for runtime in ([], ["--runtime", "runc"]):
            if runtime and not shutil.which("runc"):
                continue
            p = sh(cmd + runtime + ["run", "--rm", "--network", "none"] + ulimits + [BASE, "true"],
                   check=False, timeout=300)
            tried.append(f"{driver}, {' '.join(runtime) or 'default runtime'}: {last_line(p)}")
            if p.returncode == 0:
                PODMAN, global_flags = cmd, runtime
                break
        if PODMAN:
            break
    if PODMAN is None:
        su.skip("this machine cannot run containers (" + "; ".join(tried) + ")")
    print(f"ok   containers run here ({'; '.join(tried)})", flush=True)

    t0 = time.time()
    build = PODMAN + ["build", "--isolation", "chroot", "--format", "docker", "--build-arg", f"BASE={BASE}",
                      "-f", "deploy/Containerfile", "-t", IMAGE, "."]
    p = sh(build, cwd=ROOT, timeout=1800, check=False)
    if p.returncode != 0:
        # The build's apt-get reaches a Debian mirror, which fails now and
        # then (a point release half synced, a dropped connection): once
        # more, and a second failure is the test's.
        print(f"note: podman build exited {p.returncode}: {last_line(p)}; once more", flush=True)
        sh(build, cwd=ROOT, timeout=1800)
    print(f"ok   image built ({time.time() - t0:.0f}s)", flush=True)
    import json
    cfg = json.loads(sh(PODMAN + ["image", "inspect", IMAGE]).stdout)[0]
    user, health, size = cfg["Config"]["User"], " ".join(cfg["Healthcheck"]["Test"]), cfg["Size"]
    assert user == "10001:10001" and "/health" in health, (user, health)
    print(f"ok   image runs as {user}, HEALTHCHECK {health}, {int(size) / 1e6:.0f} MB", flush=True)

    port = su.free_port()
    try:
        t0 = time.time()
        sh(PODMAN + global_flags + ["run", "-d", "--name", NAME, "-p", f"127.0.0.1:{port}:8000"] + ulimits +
           ["-v", f"{os.path.dirname(su.MODEL)}:/models:ro", "-e", f"PAGED_API_KEY={KEY}",
            "-e", "PAGED_ARGS=--max-model-len 512 --kv-cache-memory 64M",
            "-e", f"PAGED_MODEL=/models/{os.path.basename(su.MODEL)}", IMAGE], timeout=300)
        deadline = time.time() + 120
        while True:
            try:
                if su.request(port, "GET", "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise AssertionError("no /health from the container:\n" +
                                     sh(PODMAN + ["logs", NAME], check=False).stderr[-4000:])
            time.sleep(0.5)
        print(f"ok   /health from outside the container ({time.time() - t0:.0f}s after run)", flush=True)
        import openai
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY)
        r = client.completions.create(model=client.models.list().data[0].id, prompt="The capital of France is",
                                      max_tokens=6, temperature=0)
        assert r.usage.completion_tokens == 6 and r.choices[0].text.strip(), r
        print(f"ok   OpenAI SDK completion from outside: {r.choices[0].text!r}", flush=True)
        assert su.request(port, "GET", "/v1/models")[0] == 401  # PAGED_API_KEY reached the server
        p = sh(PODMAN + global_flags + ["healthcheck", "run", NAME], check=False)
        assert p.returncode == 0, p.stdout + p.stderr
        who = sh(PODMAN + global_flags + ["exec", NAME, "sh", "-c", "id -u; command -v gcc cc || true"]).stdout.split()
        assert who == ["10001"], who
        print("ok   HEALTHCHECK passes; uid 10001; no compiler in the image", flush=True)
        sh(PODMAN + global_flags + ["stop", "-t", "40", NAME])
        code = sh(PODMAN + ["inspect", NAME, "--format", "{{.State.ExitCode}}"]).stdout.strip()
        logs = sh(PODMAN + ["logs", NAME]).stderr
        assert code == "0" and "draining" in logs and "paged serve: stopped" in logs, (code, logs[-2000:])
        print("ok   podman stop: SIGTERM drained, exit code 0", flush=True)
    finally:
        sh(PODMAN + global_flags + ["rm", "-f", NAME], check=False)
    # Layers stay cached in build/container/storage (`rm -rf
    # build/container/storage build/container/run` gives the space back).
    du = sh(["du", "-sh", PODMAN[2]], check=False).stdout.split()
    print(f"test_container: all passed (image cache {du[0] if du else '?'} in {PODMAN[2]})")


if __name__ == "__main__":
    main()
