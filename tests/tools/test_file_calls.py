#!/usr/bin/env python3
"""tools/file_calls.py, the check that no two files of the engine or of
text/ call each other in a circle: it passes on a chain of objects and
fails, naming the files, on a planted circle."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools/file_calls.py")


def compile_all(d, sources):
    for name, text in sources.items():
        with open(os.path.join(d, name + ".c"), "w") as f:
            f.write(text)
        subprocess.run(["gcc", "-c", "-o", os.path.join(d, name + ".o"), os.path.join(d, name + ".c")], check=True)


class FileCallsTest(unittest.TestCase):
    def run_tool(self, d):
        return subprocess.run([sys.executable, TOOL, d], capture_output=True, text=True)

    def test_chain_passes_circle_fails(self):
        tmp = tempfile.mkdtemp()
        try:
            # low <- mid <- top: a chain, printed bottom first.
            compile_all(tmp, {"low": "int low(void) { return 1; }\n",
                              "mid": "int low(void);\nint mid(void) { return low(); }\n",
                              "top": "int mid(void);\nint top(void) { return mid(); }\n"})
            p = self.run_tool(tmp)
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            lines = p.stdout.splitlines()
            order = [l.split()[0] for l in lines if l and l.split()[0] in ("low", "mid", "top")]
            self.assertEqual(order, ["low", "mid", "top"], p.stdout)
            # low calling back up into top closes a circle of three.
            compile_all(tmp, {"low": "int top(void);\nint low(void) { return top(); }\n"})
            p = self.run_tool(tmp)
            self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
            out = p.stdout + p.stderr
            self.assertIn("CIRCLE", out)
            for f in ("low", "mid", "top"):
                self.assertIn(f, out)
        finally:
            shutil.rmtree(tmp)


if __name__ == "__main__":
    unittest.main(verbosity=2)
