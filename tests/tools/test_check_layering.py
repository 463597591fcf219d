#!/usr/bin/env python3
"""The layering check of tools/gen_build.py: it passes on the real tree and
fails, naming the file, line and rule, on a planted upward include."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_build  # noqa: E402


class LayeringTest(unittest.TestCase):
    def test_real_tree_is_clean(self):
        self.assertEqual(gen_build.layering_violations(), [])

    def test_planted_upward_include_fails(self):
        tmp = tempfile.mkdtemp()
        try:
            for d in ("common", "kernels/cpu", "engine", "server"):
                os.makedirs(os.path.join(tmp, d))
            with open(os.path.join(tmp, "common/err.h"), "w") as f:
                f.write("#pragma once\n")
            with open(os.path.join(tmp, "engine/engine.h"), "w") as f:
                f.write('#pragma once\n#include "common/err.h"\n#include "kernels/backend.h"\n')
            # kernels/ may include only common/: engine/ is above it.
            with open(os.path.join(tmp, "kernels/cpu/matmul.c"), "w") as f:
                f.write('#include <stdio.h>\n#include "common/err.h"\n#include "engine/engine.h"\n')
            # server/ reaching past the engine into kernels/ is refused too.
            with open(os.path.join(tmp, "server/app.c"), "w") as f:
                f.write('#include "engine/engine.h"\n#include "kernels/cpu/cpu_backend.h"\n')
            bad = gen_build.layering_violations(tmp)
            self.assertEqual(len(bad), 2, bad)
            self.assertTrue(bad[0].startswith('kernels/cpu/matmul.c:3: includes "engine/engine.h"'), bad[0])
            self.assertIn("module kernels may include common, kernels", bad[0])
            self.assertTrue(bad[1].startswith('server/app.c:2: includes "kernels/cpu/cpu_backend.h"'), bad[1])
        finally:
            shutil.rmtree(tmp)

    def test_command_exit_status(self):
        # The CI entry point: exit 0 and one line on the real tree.
        p = subprocess.run([sys.executable, os.path.join(ROOT, "tools/gen_build.py"), "--check-layering"],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("no include outside", p.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
