"""pip from the wheel folder: wheels are downloaded into it once and installed from it, with the
versions of scripts/ci/python-constraints.txt (the `pip` subcommand)."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

from .checkout import ROOT
from .shell import ERR, log, run

# What torch and the tests pull in unpinned, pinned (a warm wheel folder then needs no network).
CONSTRAINTS = ROOT / "scripts/ci/python-constraints.txt"


def wheels_dir() -> Path:
    """Wheels are downloaded once into this folder and installed from it, so several virtualenvs
    (and scripts/gpu-bundle's) never download the same wheel twice."""
    env = os.environ
    cache = env.get("XDG_CACHE_HOME") or f"{env.get('HOME', '')}/.cache"
    return Path(env.get("GMT_WHEEL_DIR") or f"{cache}/gpu-mem-track/wheels")


def pip(python: str, action: str, args: list[str], stdout: int | None = None, env: dict | None = None) -> int:
    """pip's `action` (install or download) on the packages (pinned specs, and pip options such as
    --no-deps) with `python`, from the wheel folder only and with the versions of the constraints
    file. Only what the folder lacks is downloaded, into it: with a warm wheel folder nothing
    touches the network."""
    # No pip cache: the wheel folder is the cache, and pip's own would hold a second copy.
    base = [python, "-m", "pip", "--quiet", "--disable-pip-version-check", "--no-cache-dir"]
    wheels = wheels_dir()
    wheels.mkdir(parents=True, exist_ok=True)
    constraints = CONSTRAINTS
    # torch 2.6 pins sympy itself (==1.13.1): its pin, not the file's.
    if " torch==2.6." in f" {' '.join(args)} ":
        constraints = ROOT / "target/python-constraints-torch-2.6.txt"
        constraints.parent.mkdir(parents=True, exist_ok=True)
        kept = [line for line in CONSTRAINTS.read_text().splitlines(keepends=True) if not line.startswith("sympy==")]
        constraints.write_text("".join(kept))
    local = [action, "--no-index", "--find-links", str(wheels), "-c", str(constraints), *args]
    if run(base + local, stdout=stdout, stderr=subprocess.DEVNULL, env=env).returncode == 0:
        return 0
    log(f"downloading into {wheels}: {' '.join(args)}")
    rc = run([*base, "download", "-d", str(wheels), "-c", str(constraints), *args], stdout=stdout, env=env).returncode
    return rc or run(base + local, stdout=stdout, env=env).returncode


def cmd_pip(args: argparse.Namespace) -> int:
    return pip(args.python, args.action, args.args)


def ensure_wheels(args: list[str]) -> int:
    """These wheels into the wheel folder unless they are there already (scripts/gpu-bundle carries
    pytest's to a machine without network; the header checks unpack torch's)."""
    return pip("python3", "download", ["-d", str(wheels_dir()), *args])


def has_module(python: str, package: str) -> bool:
    check = f"import importlib.metadata as m; m.version('{package}')"
    return run([python, "-c", check], stdout=ERR, stderr=subprocess.DEVNULL).returncode == 0
