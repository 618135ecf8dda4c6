"""`bundle-check`: the GPU bundle built and run as on a machine without Rust."""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .checkout import ROOT, rel
from .libtorch import venv_for
from .pairs import role
from .shell import now, run, tail


def cmd_bundle_check(_: argparse.Namespace) -> int:
    """The GPU bundle for the GPU machines' torch (built from the compat pair's tree, so a few
    links), run as on a machine without Rust: only that virtualenv's python3 and the system on PATH.
    Its GPU tests report themselves skipped here, and the demo runs on the CPU."""
    (version,) = role("bundle")
    bundle, results = ROOT / f"target/gpu-bundle-{version}", ROOT / "target/gpu-bundle-results"
    venv = venv_for(version)
    log_path = Path(f"{bundle}.log")
    started, rc = now(), 0
    with open(log_path, "w") as f:
        built = run([ROOT / "scripts/gpu-bundle", version, bundle], cwd=ROOT, stdout=f, stderr=f)
    if built.returncode != 0:
        print(tail(log_path.read_text(errors="replace"), 30), end="", file=sys.stderr)
        return 1
    shutil.rmtree(results, ignore_errors=True)
    env = {"HOME": os.environ.get("HOME", ""), "PATH": f"{venv}/bin:/usr/bin:/bin"}
    with open(log_path, "a") as f:
        rc = run([bundle / "run", results], env=env, stdout=f, stderr=f).returncode
    size = run(["du", "-sm", bundle], stdout=subprocess.PIPE, text=True).stdout.split("\t")[0]
    tests = results / "tests.txt"
    counts = tail(tests.read_text(errors="replace"), 1).rstrip("\n") if tests.exists() else ""
    demo_logs = sorted(glob.glob(f"{results}/logs/*gpu_mem_track.txt"))
    print(
        f"gpu-bundle: torch {version}, {size} MiB, run without cargo: {counts}; demo log"
        f" {rel(demo_logs[0]) if demo_logs else ''} ({now() - started} s, log: {rel(log_path)})"
    )
    if rc != 0:
        print(tail(log_path.read_text(errors="replace"), 30), end="", file=sys.stderr)
    return rc
