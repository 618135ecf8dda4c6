"""`resolve`: tch resolution beside a user's crate (lockfiles only, nothing built)."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .checkout import ROOT
from .shell import run


def cmd_resolve(_: argparse.Namespace) -> int:
    """Every new crate that depends on us beside a tch it already has must resolve (one torch-sys
    per build): generates one lockfile per case, builds nothing."""
    failed = 0
    for dep in ['tch = "0.22"', 'tch = "0.23"', 'tch = "0.24"', 'tch = "0.26"', 'burn-tch = "0.22"']:
        d = Path(tempfile.mkdtemp())
        (d / "src").mkdir()
        (d / "src/main.rs").write_text("fn main() {}\n")
        (d / "Cargo.toml").write_text(
            f'[package]\nname = "user"\nversion = "0.1.0"\nedition = "2021"\n\n[dependencies]\n{dep}\n'
            f'gpu-mem-track = {{ path = "{ROOT}" }}\n'
        )
        r = run(["cargo", "generate-lockfile"], cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode == 0:
            lock = (d / "Cargo.lock").read_text().splitlines()
            versions = [
                m.group(1)
                for i, line in enumerate(lock)
                if line == 'name = "torch-sys"' and i + 1 < len(lock)
                for m in [re.fullmatch(r'version = "(.*)"', lock[i + 1])]
                if m
            ]
            print(f"resolve: {dep} + gpu-mem-track: torch-sys {chr(10).join(versions)}")
        else:
            print(f"resolve: {dep} + gpu-mem-track: FAILED\n{r.stdout.rstrip(chr(10))}")
            failed = 1
        shutil.rmtree(d)
    return failed
