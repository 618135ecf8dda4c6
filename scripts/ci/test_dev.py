"""Unit tests of scripts/ci/dev.py (its package dev_helper/) and pin_wheel.py. CI runs them (the
dev-tests step of `scripts/dev test`, with pytest); by hand: python3 -m unittest scripts/ci/test_dev.py"""

import contextlib
import importlib.util
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest
import zipfile

# No bytecode beside the sources (as dev.py): the work tree stays as git sees it.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(__file__))
import pin_wheel
from dev_helper import cli, pairs, python_tests, shell
from dev_helper.checkout import DEV_PY


class Pairs(unittest.TestCase):
    def test_tch_for_torch(self):
        cases = {
            "2.9.0": "0.22.0",
            "2.10.1": "0.23.0",
            "2.11.0": "0.24.0",
            "2.12.0": "0.26.0 bypass",
            "2.13.0": "0.26.0",
            "2.14.0": "none",
            "2.15.0": "none",
            "2.20.0": "none",
            "2.6.0": "none",
            "2.8.0": "none",
            "2.5.0": None,
            "2.12": None,
            "3.0.0": None,
        }
        for torch, tch in cases.items():
            self.assertEqual(pairs.tch_for(torch), tch, torch)

    def test_roles(self):
        self.assertEqual(pairs.role("main"), ["2.13.0"])
        self.assertEqual(pairs.role("compat"), ["2.9.0", "2.11.0"])
        self.assertEqual(pairs.role("wheel")[0], "2.6.0")

    def test_doc_table_is_the_file(self):
        self.assertEqual(cli.main(["pairs-doc"]), 0)


class Entry(unittest.TestCase):
    def test_dev_py_runs_the_package_as_scripts_dev_calls_it(self):
        r = subprocess.run([sys.executable, DEV_PY, "tch", "2.13.0"], capture_output=True, text=True, check=False)
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "0.26.0\n", ""))
        r = subprocess.run([sys.executable, DEV_PY, "tch", "2.5.0"], capture_output=True, text=True, check=False)
        self.assertEqual((r.returncode, r.stdout), (1, ""))
        self.assertEqual(r.stderr, "[dev] torch 2.5.0 is not supported (2.6.0 and later are)\n")


class Steps(unittest.TestCase):
    def test_table(self):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(["steps", "the suite", str(shell.now()), "", "fmt|5|0", "tests|125|101"])
        self.assertEqual(rc, 1)
        lines = out.getvalue().splitlines()
        self.assertEqual(lines[:3], ["", "| step | time | result |", "|---|---|---|"])
        self.assertEqual(lines[3], "| fmt | 0 min 05 s | ok |")
        self.assertEqual(lines[4], "| tests | 2 min 05 s | FAILED (exit 101) |")
        self.assertRegex(lines[5], r"^\| total \| 0 min 0\d s \| 1 of 2 steps FAILED \|$")
        self.assertRegex(err.getvalue(), r"^\[dev\] the suite took \d+ s\n$")


class CrashReport(unittest.TestCase):
    def test_a_crashed_process_is_reported_from_its_innermost_frame(self):
        # A real crash: faulthandler's dump of a Python that segfaults in a named function.
        code = "import ctypes, faulthandler\nfaulthandler.enable()\ndef crashes_here():\n    ctypes.string_at(0)\ncrashes_here()\n"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
        self.assertLess(out.returncode, 0)  # killed by a signal
        report = python_tests.crash_report("..passed\n" + out.stderr)
        self.assertTrue(report.startswith("Fatal Python error"), report)
        self.assertIn("Current thread", report)
        self.assertIn("crashes_here", report)
        self.assertEqual(python_tests.crash_report("3 passed in 1.0s\n"), "")


class PinnedWheel(unittest.TestCase):
    def test_pins_the_minor_and_writes_the_guard_that_refuses(self):
        with tempfile.TemporaryDirectory() as d:
            wheel = f"{d}/gpu_mem_track-0.1.0-cp39-abi3-linux_x86_64.whl"
            info = "gpu_mem_track-0.1.0.dist-info"
            with zipfile.ZipFile(wheel, "w") as z:
                z.writestr(f"{info}/METADATA", "Name: gpu-mem-track\nRequires-Dist: torch>=2.6,<2.16\n")
                z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nTag: cp39-abi3-linux_x86_64\n")
                z.writestr(f"{info}/RECORD", "")
            out = pin_wheel.pin(wheel, "2.13.0+cu130", f"{d}/torch-2.13")
            self.assertEqual(os.path.basename(out), "gpu_mem_track-0.1.0-213-cp39-abi3-linux_x86_64.whl")
            with zipfile.ZipFile(out) as z:
                self.assertIn("Requires-Dist: torch>=2.13,<2.14\n", z.read(f"{info}/METADATA").decode())
            with tarfile.open(f"{d}/torch-2.13/torch-2.13.999.tar.gz") as t:
                t.extractall(d, filter="data")
            with open(f"{d}/torch-2.13.999/pyproject.toml") as f:
                self.assertIn('version = "2.13.999"', f.read())
            spec = importlib.util.spec_from_file_location("guard", f"{d}/torch-2.13.999/torch_guard.py")
            guard = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(guard)
            with self.assertRaises(SystemExit) as refused:
                guard.get_requires_for_build_wheel()
            self.assertIn("built for torch 2.13", str(refused.exception.code))


if __name__ == "__main__":
    unittest.main()
