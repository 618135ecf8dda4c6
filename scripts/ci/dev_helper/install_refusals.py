"""What a user who installs the Python package wrongly gets: refusals, torch left as it was."""

from __future__ import annotations

import glob
import shutil
import subprocess
import sys
import tempfile

from .checkout import ROOT
from .pairs import minor
from .shell import run, tail
from .wheel import wheel_dir
from .wheel_folder import wheels_dir


def install_refusals(venv: str, version: str) -> int:
    """What a user who installs wrongly gets, in the virtualenv `venv` of torch `version` (without
    the package yet): without --no-build-isolation the sdist stops at once with what to run, and a
    wheel of another torch minor installs nothing, with or without --no-index; torch stays as it
    was either way. Prints one line (on stderr, which python_tests' log holds)."""
    rc = 0
    python, indexed = f"{venv}/bin/python", [f"{venv}/bin/pip", "install", "--disable-pip-version-check"]
    pip_ = [*indexed, "--no-index"]

    def torch_version() -> str:
        r = run([python, "-c", "import torch; print(torch.__version__)"], stdout=subprocess.PIPE, text=True)
        return r.stdout.rstrip("\n")

    def refused(cmd: list[str], expected: str) -> bool:
        r = run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if expected in r.stdout and r.returncode != 0:
            return True
        if expected not in r.stdout:
            print(tail(r.stdout.rstrip("\n") + "\n", 20), end="", file=sys.stderr)
        return False

    before = torch_version()
    sdist = sorted(glob.glob(f"{ROOT}/dist/gpu_mem_track-*.tar.gz")) or [f"{ROOT}/dist/gpu_mem_track-*.tar.gz"]
    if not refused(
        [*pip_, "--find-links", str(wheels_dir()), *sdist], "build isolation hides the torch you have installed"
    ):
        rc = 1
    other = tempfile.mkdtemp()
    wheel = " ".join(sorted(glob.glob(f"{wheel_dir(version)}/gpu_mem_track-*.whl")))
    run([python, f"{ROOT}/scripts/ci/pin_wheel.py", wheel, "2.11.0", other], stdout=subprocess.DEVNULL)
    # With --no-index, and as a user types it, without: the guard pinned beside the wheel
    # (torch-2.11.999.tar.gz) refuses before pip could fetch a torch 2.11 from the package index.
    guard = "gpu-mem-track's wheel in this folder is built for torch 2.11"
    if minor(version) != "2.11":
        if not refused([*pip_, "--find-links", other, "gpu-mem-track"], guard):
            rc = 1
        if not refused([*indexed, "--retries", "0", "--timeout", "15", "--find-links", other, "gpu-mem-track"], guard):
            rc = 1
    shutil.rmtree(other)
    after = torch_version()
    rc = 1 if before != after else rc
    print(
        f"python: torch {version}: the sdist without --no-build-isolation, and a torch 2.11 wheel (with and"
        " without --no-index), refused;"
        f" torch still {after}: {'ok' if rc == 0 else 'FAILED'}",
        file=sys.stderr,
        flush=True,
    )
    return rc
