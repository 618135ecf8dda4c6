"""The build backend of the guard that sits beside each pinned wheel: not torch, a refusal.

`scripts/dev wheel` pins each wheel to one torch minor (``torch>=2.13,<2.14`` in
``dist/torch-2.13/``) and writes beside it ``torch-2.13.999.tar.gz``, an sdist holding this file.
In an environment whose torch is not 2.13, ``pip install gpu-mem-track --find-links
dist/torch-2.13`` looks for a torch 2.13. Without the guard it would take one from the package
index and replace the user's torch (and pull its CUDA libraries). The guard's version is above
every real 2.13 release, so pip picks it first. Asked for its build requirements, it stops the
install, and nothing is installed. An environment that already has torch 2.13 never looks for
another torch (pip keeps an installed requirement that satisfies), so the guard is never built
there. It needs nothing to build (no ``requires``), so it refuses the same way with
``--no-index`` or offline.
"""

from __future__ import annotations

import os
import subprocess
import sys

# Checked against scripts/ci/torch-pairs.tsv, first to last row, by gpu-mem-track-testkit/tests/torch_range.rs
# (the TSV does not ship with this file).
SUPPORTED = "torch 2.6 to 2.15"


def _guarded_minor() -> str:
    """The minor version this guard stands for: ``2.13`` of its own ``2.13.999``."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "PKG-INFO"), encoding="utf-8") as f:
        for line in f:
            if line.startswith("Version:"):
                return ".".join(line.split(":", 1)[1].strip().split(".")[:2])
    return "?"


def _installed_torch() -> str | None:
    """The torch of the environment pip installs into. The build runs isolated from it, so ask
    that environment's own Python (``-I``: without the isolation's ``PYTHONPATH``)."""
    probe = "import importlib.metadata as m\ntry: print(m.version('torch'))\nexcept Exception: pass"
    try:
        r = subprocess.run([sys.executable, "-I", "-c", probe], check=False, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() or None


def _refuse(*_args: object, **_kwargs: object) -> None:
    minor = _guarded_minor()
    installed = _installed_torch()
    have = f"this environment has torch {installed}" if installed else "this environment has no torch"
    version = installed.split("+")[0] if installed else "2.X.Y"
    tag = ".".join(version.split(".")[:2])
    sys.exit(
        f"gpu-mem-track's wheel in this folder is built for torch {minor} (it links that torch's "
        f"libtorch), and {have}.\n"
        f"This torch-{minor}.999 is not torch: it stops pip from fetching a torch {minor} to replace "
        "yours. Nothing was installed, and your torch is as it was.\n"
        f"Install the wheel built for your torch ({SUPPORTED}) instead:\n"
        f"    pip install gpu-mem-track --no-index --find-links dist/torch-{tag}   "
        f"(scripts/dev wheel {version} builds it)\n"
        "or build the sdist against the torch you have:\n"
        "    pip install maturin\n"
        "    pip install --no-build-isolation dist/gpu_mem_track-<version>.tar.gz"
        + ("" if installed else f"\nWith no torch yet, install the torch {minor} you want first.")
    )


# Every hook pip may call refuses; the first it calls is get_requires_for_build_wheel.
get_requires_for_build_wheel = prepare_metadata_for_build_wheel = build_wheel = _refuse
get_requires_for_build_editable = prepare_metadata_for_build_editable = build_editable = _refuse
get_requires_for_build_sdist = build_sdist = _refuse
