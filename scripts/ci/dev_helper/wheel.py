"""The Python package's wheel against a torch, built from its sdist as a user's pip builds it and
pinned to that torch's minor version (`wheel`, `wheels`)."""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .checkout import DEV_PY, ROOT, rel
from .libtorch import pair_env, venv_for
from .pairs import minor
from .pins import PINS
from .shell import ERR, run
from .wheel_folder import pip


def wheel_dir(version: str) -> Path:
    """The folder of the wheels for torch `version`'s minor version: dist/torch-2.13 for 2.13.0."""
    return ROOT / f"dist/torch-{minor(version)}"


def cmd_wheel(args: argparse.Namespace) -> int:
    """Builds the Python package's wheel against torch VERSION as a user's pip builds it: from the
    sdist (`maturin sdist`, into dist/), `pip wheel --no-build-isolation` in that torch's virtualenv
    (which also builds the tch pair), with its own target folder so two torch versions never
    rebuild each other's shim. Pins it to that minor version (scripts/ci/pin_wheel.py) in
    dist/torch-2.X/. Prints the wheel's path."""
    version = args.version
    env = pair_env(version)
    venv = venv_for(version)
    pip(f"{venv}/bin/python", "install", [PINS["MATURIN"]], env=env)
    target = ROOT / f"target/python/torch-{version}"
    shutil.rmtree(target / "wheels", ignore_errors=True)
    for old in glob.glob(f"{ROOT}/dist/gpu_mem_track-*.tar.gz"):
        os.unlink(old)
    sdist = [f"{venv}/bin/maturin", "sdist", "-m", "gpu-mem-track-py/Cargo.toml", "-o", f"{ROOT}/dist"]
    if run(sdist, cwd=ROOT, env=env, stdout=ERR).returncode != 0:
        return 1
    sdists = sorted(glob.glob(f"{ROOT}/dist/gpu_mem_track-*.tar.gz"))
    if not sdists:
        return 1
    # maturin dates every file of an sdist 2006: cargo would take this project's crates, older
    # than their last build in the target folder, as unchanged. Only third-party crates are kept.
    for old in glob.glob(f"{target}/release/.fingerprint/gpu-mem-track-*"):
        shutil.rmtree(old, ignore_errors=True)
    # The extension finds libtorch through this Python (the build backend's PYO3_PYTHON), never
    # through tch; cargo keeps its build in the target folder between runs. maturin tags a wheel
    # pip builds for this machine only (--compatibility off) unless told.
    build_env = {**env, "MATURIN_PEP517_ARGS": "--compatibility manylinux_2_28", "CARGO_TARGET_DIR": str(target)}
    build = [f"{venv}/bin/python", "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check"]
    build += ["--no-build-isolation", "--no-deps", "--no-index", "-w", f"{target}/wheels", *sdists]
    if run(build, cwd=ROOT, env=build_env, stdout=ERR).returncode != 0:
        return 1
    shutil.rmtree(wheel_dir(version), ignore_errors=True)
    built = sorted(glob.glob(f"{target}/wheels/gpu_mem_track-*.whl")) or [f"{target}/wheels/gpu_mem_track-*.whl"]
    pin = [f"{venv}/bin/python", "scripts/ci/pin_wheel.py", *built, version, str(wheel_dir(version))]
    return run(pin, cwd=ROOT, env=env).returncode


def build_wheel(version: str) -> str | None:
    """`wheel` in its own process (its environment is its own); the wheel's path, None if none."""
    r = run([sys.executable, DEV_PY, "wheel", version], stdout=subprocess.PIPE, text=True)
    lines = r.stdout.splitlines()
    return lines[-1] if r.returncode == 0 and lines and os.path.isfile(lines[-1]) else None


def cmd_wheels(args: argparse.Namespace) -> int:
    failed = 0
    for v in args.versions:
        wheel = build_wheel(v)
        print(f"wheel: torch {v}: {rel(wheel) if wheel else 'FAILED'}", flush=True)
        failed = failed or wheel is None
    return int(failed)
