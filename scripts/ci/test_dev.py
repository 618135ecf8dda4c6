"""Unit tests of scripts/ci/dev.py's tables (not run by CI): python3 -m unittest scripts/ci/test_dev.py"""

import contextlib
import io
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import dev


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
            self.assertEqual(dev.tch_for(torch), tch, torch)

    def test_roles(self):
        self.assertEqual(dev.role("main"), ["2.13.0"])
        self.assertEqual(dev.role("compat"), ["2.9.0", "2.11.0"])
        self.assertEqual(dev.role("wheel")[0], "2.6.0")

    def test_doc_table_is_the_file(self):
        self.assertEqual(dev.main(["pairs-doc"]), 0)


class Steps(unittest.TestCase):
    def test_table(self):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = dev.main(["steps", "the suite", str(dev.now()), "", "fmt|5|0", "tests|125|101"])
        self.assertEqual(rc, 1)
        lines = out.getvalue().splitlines()
        self.assertEqual(lines[:3], ["", "| step | time | result |", "|---|---|---|"])
        self.assertEqual(lines[3], "| fmt | 0 min 05 s | ok |")
        self.assertEqual(lines[4], "| tests | 2 min 05 s | FAILED (exit 101) |")
        self.assertRegex(lines[5], r"^\| total \| 0 min 0\d s \| 1 of 2 steps FAILED \|$")
        self.assertRegex(err.getvalue(), r"^\[dev\] the suite took \d+ s\n$")


if __name__ == "__main__":
    unittest.main()
