#!/usr/bin/env python3
"""test_server_http.py against the AddressSanitizer + UBSan build
(build/asan/paged, `ninja build/asan/paged`): every HTTP edge case, and a
clean exit with no leak or error report."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(ROOT, "build", "asan", "paged")

if not os.path.exists(BIN):
    print(f"SKIP: {BIN} is not built (ninja build/asan/paged)")
    sys.exit(77)
env = dict(os.environ, PAGED_BIN=BIN)
env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
test = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_server_http.py")
sys.exit(subprocess.run([sys.executable, test], env=env).returncode)
