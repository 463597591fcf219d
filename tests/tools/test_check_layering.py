#!/usr/bin/env python3
"""The layering check of tools/gen_build.py: it passes on the real tree and
fails, naming the file, line and rule, on a planted upward include (also
from text/ into the engine), on a circle between the folders of one module,
and on a file of engine/ or text/ over 800 lines."""
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

    def test_planted_text_into_engine_fails(self):
        # text/ sits below the engine: a tokenizer reaching up into it is refused.
        tmp = tempfile.mkdtemp()
        try:
            os.makedirs(os.path.join(tmp, "text/tokenizer"))
            with open(os.path.join(tmp, "text/tokenizer/tokenizer.c"), "w") as f:
                f.write('#include "formats/gguf.h"\n#include "engine/engine.h"\n')
            bad = gen_build.layering_violations(tmp)
            self.assertEqual(len(bad), 1, bad)
            self.assertTrue(bad[0].startswith('text/tokenizer/tokenizer.c:2: includes "engine/engine.h"'), bad[0])
            self.assertIn("module text may include", bad[0])
        finally:
            shutil.rmtree(tmp)

    def test_planted_folder_circle_fails(self):
        # The engine's rooms point one way (dist -> runner -> model): a model
        # file including the runner closes a circle, named with both includes.
        tmp = tempfile.mkdtemp()
        try:
            for d in ("engine/model", "engine/runner", "engine/dist"):
                os.makedirs(os.path.join(tmp, d))
            with open(os.path.join(tmp, "engine/runner/runner.h"), "w") as f:
                f.write('#include "engine/model/model.h"\n')
            with open(os.path.join(tmp, "engine/dist/executor.h"), "w") as f:
                f.write('#include "engine/runner/runner.h"\n#include "engine/model/model.h"\n')
            self.assertEqual(gen_build.folder_cycles(tmp), [])
            with open(os.path.join(tmp, "engine/model/model.h"), "w") as f:
                f.write('#pragma once\n#include "engine/runner/runner.h"\n')
            bad = gen_build.folder_cycles(tmp)
            self.assertEqual(len(bad), 1, bad)
            self.assertTrue(bad[0].startswith("engine/model -> engine/runner -> engine/model"), bad[0])
            self.assertIn('engine/model/model.h:2 includes "engine/runner/runner.h"', bad[0])
        finally:
            shutil.rmtree(tmp)

    def test_planted_long_file_fails(self):
        tmp = tempfile.mkdtemp()
        try:
            os.makedirs(os.path.join(tmp, "engine/runner"))
            with open(os.path.join(tmp, "engine/runner/runner.c"), "w") as f:
                f.write("int x;\n" * (gen_build.MAX_LINES + 1))
            with open(os.path.join(tmp, "engine/runner/ok.c"), "w") as f:
                f.write("int y;\n" * gen_build.MAX_LINES)
            bad = gen_build.oversized_files(tmp)
            self.assertEqual(bad, [f"engine/runner/runner.c: {gen_build.MAX_LINES + 1} lines "
                                   f"(at most {gen_build.MAX_LINES} in engine/)"])
        finally:
            shutil.rmtree(tmp)

    def test_real_tree_has_no_folder_circle_or_long_file(self):
        self.assertEqual(gen_build.folder_cycles(), [])
        self.assertEqual(gen_build.oversized_files(), [])

    def test_command_exit_status(self):
        # The CI entry point: exit 0 and one line on the real tree.
        p = subprocess.run([sys.executable, os.path.join(ROOT, "tools/gen_build.py"), "--check-layering"],
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("no include outside", p.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
