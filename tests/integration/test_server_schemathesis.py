#!/usr/bin/env python3
"""Schemathesis (PyPI) against the real `paged serve`, driven by the server's
own /openapi.json: for every documented operation, generated requests
(boundary cases, then a bounded number of random examples, valid and
invalid) must never get a 5xx, and every response must have a documented
status, content type and a body that matches its schema.

Bounded for CI: a 128-token context (no reply is long), --max-n 2,
$PAGED_SCHEMATHESIS_EXAMPLES random examples per operation (default 10),
fixed seed. Prints the figures: operations, test cases, failures. The
report (JUnit XML) is kept under build/test-artifacts/schemathesis/."""
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import server_util as su  # noqa: E402

su.require_model_and_binary()
su.require_openai()  # re-executes under .venv, where schemathesis is installed
ST = os.path.join(os.path.dirname(sys.executable), "schemathesis")
if not os.path.exists(ST):
    su.skip("schemathesis is not installed in .venv (deploy/quickstart.sh setup)")

KEY = "st-key"
EXAMPLES = int(os.environ.get("PAGED_SCHEMATHESIS_EXAMPLES", "10"))
OUT = os.path.join(su.ROOT, "build", "test-artifacts", "schemathesis")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    with su.Server("--api-key", KEY, "--max-model-len", "128", "--max-n", "2", default_args=False,
                   env={"PAGED_LOG": "warn"}) as srv:
        doc = json.loads(su.request(srv.port, "GET", "/openapi.json")[2])
        n_ops = sum(len(ops) for ops in doc["paths"].values())
        cmd = [ST, "run", f"{srv.url}/openapi.json", "-H", f"Authorization: Bearer {KEY}",
               "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                           "response_schema_conformance",
               "--phases", "examples,coverage,fuzzing", "-n", str(EXAMPLES), "--seed", "1",
               "--request-timeout", "60", "--generation-database", "none", "--no-color",
               "--report", "junit", "--report-dir", OUT]
        print("$ " + " ".join(cmd), flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=OUT)  # its state stays there
        out = p.stdout + p.stderr
        with open(os.path.join(OUT, "schemathesis.log"), "w") as f:
            f.write(out)
        m_ops = re.search(r"Tested:\s+(\d+)", out)
        m_cases = re.search(r"Test cases:\s*\n\s*(\d+) generated, (\d+) passed(?:, (\d+) failed)?", out)
        if p.returncode != 0 or not m_ops or not m_cases:
            print(out[-8000:])
            raise AssertionError(f"schemathesis exited {p.returncode}")
        tested, cases = int(m_ops.group(1)), int(m_cases.group(1))
        failed = int(m_cases.group(3) or 0)
        print(f"schemathesis: {tested} of {n_ops} operations, {cases} test cases "
              f"({EXAMPLES} random examples per operation + boundary cases), {failed} failures")
        assert failed == 0, out[-8000:]
        # Every documented operation was exercised, except GET /openapi.json:
        # schemathesis leaves out the operation its schema was loaded from
        # (test_server_web.py validates that document).
        import glob
        import xml.etree.ElementTree as ET
        report = ET.parse(glob.glob(os.path.join(OUT, "junit-*.xml"))[0])
        names = {tc.get("name") for tc in report.iter("testcase")}
        documented = {f"{m.upper()} {path}" for path, ops in doc["paths"].items() for m in ops}
        missing = documented - names - {"GET /openapi.json"}
        assert not missing and tested == len(names), (missing, tested, names)
        print(f"operations tested: {', '.join(sorted(names))}")
        # The server is still whole after all that.
        st, _, _ = su.request(srv.port, "GET", "/health")
        assert st == 200
    print("test_server_schemathesis: all passed")


if __name__ == "__main__":
    main()
