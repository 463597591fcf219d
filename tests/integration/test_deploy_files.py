#!/usr/bin/env python3
"""The deployment files, each checked by its own tool:

  - every Kubernetes manifest under deploy/k8s/ with kubernetes-validate
    (PyPI) --strict against Kubernetes 1.37: built-in kinds must pass; the
    custom resources (PodMonitor, ServiceMonitor, LeaderWorkerSet,
    InferencePool, HTTPRoute) have no schema there, so the pod templates
    inside the LeaderWorkerSet are validated as PodTemplates and their
    references (ports, selectors, services) are checked against the
    Deployment and Services;
  - the kustomization rendered by `kubectl kustomize` (where kubectl is
    installed) and the result validated again;
  - the drain timing agreeing everywhere: preStop + --shutdown-timeout <
    terminationGracePeriodSeconds; systemd's TimeoutStopSec above
    PAGED_SHUTDOWN_TIMEOUT;
  - deploy/systemd/paged.service with `systemd-analyze verify` (in a
    scratch root holding the unit, its environment file and the binary) and
    its exposure score from `systemd-analyze security --offline`.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_openai()  # re-executes under .venv, which has kubernetes-validate
try:
    import kubernetes_validate
    import yaml
except ImportError:
    su.skip("kubernetes-validate is not installed in .venv (deploy/quickstart.sh setup)")

ROOT = su.ROOT
K8S = os.path.join(ROOT, "deploy", "k8s")
K8S_VERSION = "1.37.0"
CRDS = {("monitoring.coreos.com/v1", "PodMonitor"), ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"), ("inference.networking.k8s.io/v1", "InferencePool"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute"), ("kustomize.config.k8s.io/v1beta1", "Kustomization")}


def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def validate(obj, where):
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        raise AssertionError(f"{where}: {obj['kind']}/{obj['metadata']['name']}: "
                             f"{'.'.join(map(str, e.path))}: {e.message}")


def check_manifests():
    files = sorted(glob.glob(os.path.join(K8S, "*.yaml")) + glob.glob(os.path.join(K8S, "examples", "*.yaml")))
    builtin, custom = 0, 0
    by_kind = {}
    for f in files:
        # The command-line tool, as a user would run it.
        p = subprocess.run([os.path.join(os.path.dirname(sys.executable), "kubernetes-validate"), "--strict",
                            "-k", K8S_VERSION, f], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        for line in p.stdout.splitlines():
            assert line.startswith("INFO") or "Couldn't find schema" in line, line
        for d in docs(f):
            by_kind.setdefault(d["kind"], []).append((f, d))
            if (d["apiVersion"], d["kind"]) in CRDS:
                custom += 1
                assert f"kind {d['kind']} with api version {d['apiVersion']}" in p.stdout, (f, p.stdout)
            else:
                builtin += 1
                assert f"passed for resource {d['kind'].lower()}/{d['metadata']['name']}" in p.stdout, (f, p.stdout)
    print(f"ok   kubernetes-validate --strict -k {K8S_VERSION}: {builtin} built-in resources pass in "
          f"{len(files)} files; {custom} custom resources have no schema there (checked below)")
    return by_kind


def pod_spec_checks(spec, where, shutdown_default=30):
    c = spec["containers"][0]
    args = next((e["value"] for e in c.get("env", []) if e["name"] == "PAGED_ARGS"), "")
    m = re.search(r"--shutdown-timeout (\d+)", args)
    shutdown = int(m.group(1)) if m else shutdown_default
    pre = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    grace = spec["terminationGracePeriodSeconds"]
    assert pre + shutdown + 5 <= grace, f"{where}: preStop {pre} + shutdown {shutdown} + 5 > grace {grace}"
    probes = [c.get(k) for k in ("startupProbe", "readinessProbe", "livenessProbe") if c.get(k)]
    for pr in probes:
        assert pr["httpGet"]["path"] == "/health", (where, pr)
    return c, probes


def check_references(by_kind):
    (_, dep), = [x for x in by_kind["Deployment"] if x[1]["metadata"]["name"] == "paged"]
    spec = dep["spec"]["template"]["spec"]
    c, probes = pod_spec_checks(spec, "deployment.yaml")
    assert len(probes) == 3
    start = c["startupProbe"]
    assert start["periodSeconds"] * start["failureThreshold"] >= 300, "startup must allow minutes of loading"
    assert c["readinessProbe"]["failureThreshold"] == 1  # out of the Service at the first 503 of a drain
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert c["securityContext"]["readOnlyRootFilesystem"] and spec["securityContext"]["runAsNonRoot"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]

    def selects(sel):
        return all(pod_labels.get(k) == v for k, v in sel.items())

    (_, svc), = [x for x in by_kind["Service"] if x[1]["metadata"]["name"] == "paged"]
    assert selects(svc["spec"]["selector"]) and svc["spec"]["ports"][0]["targetPort"] in ports
    for kind, key in (("PodMonitor", "podMetricsEndpoints"), ("ServiceMonitor", "endpoints")):
        (_, mon), = by_kind[kind]
        assert selects(mon["spec"]["selector"]["matchLabels"]), kind
        ep = mon["spec"][key][0]
        assert ep["port"] in ports and ep["path"] == "/metrics", (kind, ep)
    (_, pool), = by_kind["InferencePool"]
    assert selects(pool["spec"]["selector"]["matchLabels"])
    assert pool["spec"]["targetPorts"][0]["number"] == ports["http"]
    epp_ref = pool["spec"]["endpointPickerRef"]
    (_, epp_svc), = [x for x in by_kind["Service"] if x[1]["metadata"]["name"] == epp_ref["name"]]
    assert epp_svc["spec"]["ports"][0]["port"] == epp_ref["port"]["number"]
    (_, epp), = [x for x in by_kind["Deployment"] if x[1]["metadata"]["name"] == epp_ref["name"]]
    eargs = " ".join(epp["spec"]["template"]["spec"]["containers"][0]["args"])
    # The endpoint picker reads metrics paged really exposes.
    for metric in re.findall(r"metric=(\S+)", eargs):
        assert metric == "" or metric in ("paged:num_requests_waiting", "paged:kv_cache_usage_perc"), metric
    (_, route), = by_kind["HTTPRoute"]
    assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == pool["metadata"]["name"]
    (_, hpa), = by_kind["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == "paged"
    (_, adapter), = [x for x in by_kind["ConfigMap"] if x[1]["metadata"]["name"] == "prometheus-adapter"]
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rules[0]["name"]["as"] == hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert "paged:num_requests_waiting" in rules[0]["seriesQuery"]
    # LeaderWorkerSet: its pod templates are core PodTemplates.
    (f, lws), = by_kind["LeaderWorkerSet"]
    for role in ("leaderTemplate", "workerTemplate"):
        t = lws["spec"]["leaderWorkerTemplate"][role]
        validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"lws-{role}"}, "template": t}, f)
    pod_spec_checks(lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"], "leaderworkerset leader")
    print("ok   probes on /health, preStop + drain < grace period, GPU limit, non-root read-only; monitors, "
          "InferencePool, EPP, HTTPRoute, HPA + adapter rule all point at what exists; LWS pod templates valid")


def check_kustomize():
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print("note: kubectl not installed: `kubectl kustomize` not run (apt-get install kubernetes-client)")
        return
    p = subprocess.run([kubectl, "kustomize", K8S], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    objs = [d for d in yaml.safe_load_all(p.stdout) if d]
    listed = yaml.safe_load(open(os.path.join(K8S, "kustomization.yaml")))["resources"]
    top = sorted(os.path.basename(f) for f in glob.glob(os.path.join(K8S, "*.yaml")) if not f.endswith("kustomization.yaml"))
    assert sorted(listed) == top, (listed, top)
    n = 0
    for o in objs:
        assert o["metadata"].get("namespace") == "paged", o["metadata"]
        if (o["apiVersion"], o["kind"]) not in CRDS:
            validate(o, "kubectl kustomize")
            n += 1
    print(f"ok   kubectl kustomize deploy/k8s: {len(objs)} resources in namespace paged ({n} validated again)")


def check_systemd():
    unit = open(os.path.join(ROOT, "deploy/systemd/paged.service")).read()
    env = open(os.path.join(ROOT, "deploy/systemd/paged.env")).read()
    keys = dict(re.findall(r"^(\w+)=(.*)$", unit, re.M))
    for k, v in (("User", "paged"), ("ProtectSystem", "strict"), ("NoNewPrivileges", "yes"), ("Restart", "on-failure")):
        assert keys.get(k) == v, (k, keys.get(k))
    shutdown = int(re.search(r"^PAGED_SHUTDOWN_TIMEOUT=(\d+)", env, re.M).group(1))
    assert int(keys["TimeoutStopSec"]) >= shutdown + 5, (keys["TimeoutStopSec"], shutdown)
    assert "--shutdown-timeout ${PAGED_SHUTDOWN_TIMEOUT}" in keys["ExecStart"]
    sa = shutil.which("systemd-analyze")
    if not sa:
        su.skip("systemd-analyze is not installed (apt-get install systemd): the unit was not verified")
    binary = su.binary()
    if not os.path.exists(binary):
        su.skip(f"{binary} is not built: systemd-analyze verify needs the ExecStart binary")
    root = tempfile.mkdtemp(prefix="paged-systemd-")
    try:
        # A scratch root: the unit where systemd looks for it, the binary
        # where ExecStart names it, the environment file, and the system's
        # own units (targets the unit refers to).
        for d in ("usr/local/bin", "etc/systemd/system", "etc/paged", "usr/lib/systemd"):
            os.makedirs(os.path.join(root, d))
        shutil.copy(binary, os.path.join(root, "usr/local/bin/paged"))
        shutil.copy(os.path.join(ROOT, "deploy/systemd/paged.service"), os.path.join(root, "etc/systemd/system"))
        shutil.copy(os.path.join(ROOT, "deploy/systemd/paged.env"), os.path.join(root, "etc/paged/paged.env"))
        sysunits = "/usr/lib/systemd/system" if os.path.isdir("/usr/lib/systemd/system") else "/lib/systemd/system"
        shutil.copytree(sysunits, os.path.join(root, "usr/lib/systemd/system"), symlinks=True)
        os.symlink("usr/lib", os.path.join(root, "lib"))
        p = subprocess.run([sa, "verify", f"--root={root}", "/etc/systemd/system/paged.service"],
                           capture_output=True, text=True, timeout=120)
        out = (p.stdout + p.stderr).strip()
        assert p.returncode == 0 and not out, f"systemd-analyze verify: exit {p.returncode}\n{out}"
        print("ok   systemd-analyze verify deploy/systemd/paged.service: clean")
        # A broken unit is caught (the check is not vacuous).
        with open(os.path.join(root, "etc/systemd/system/paged.service"), "a") as f:
            f.write("\n[Service]\nRestart=sometimes\n")
        p = subprocess.run([sa, "verify", f"--root={root}", "/etc/systemd/system/paged.service"],
                           capture_output=True, text=True, timeout=120)
        assert "sometimes" in p.stdout + p.stderr, p.stdout + p.stderr
        shutil.copy(os.path.join(ROOT, "deploy/systemd/paged.service"), os.path.join(root, "etc/systemd/system"))
        p = subprocess.run([sa, "security", "--offline=yes", f"--root={root}", "paged.service"],
                           capture_output=True, text=True, timeout=120)
        m = re.search(r"Overall exposure level for paged.service: ([\d.]+) (\w+)", p.stdout + p.stderr)
        assert m and float(m.group(1)) <= 2.0, (p.stdout + p.stderr)[-2000:]
        print(f"ok   systemd-analyze security --offline: exposure {m.group(1)} {m.group(2)} (of 10; <= 2 required)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    su.run_checks([("manifests", lambda: check_references(check_manifests())), ("kustomize", check_kustomize),
                   ("systemd", check_systemd)])
    print("test_deploy_files: all passed")
