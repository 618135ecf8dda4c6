"""The package's PEP 517 build backend: maturin's, after one check that it cannot do itself.

gpu-mem-track's compiled part is built against the torch already installed (it links that torch's
libtorch, which has no stable ABI across minor versions). pip's build isolation builds in a fresh
environment without that torch; without this check the build would compile for a minute and then
fail deep in a build script. Here it stops at once, says why, and says what to run; no torch is
ever downloaded for a build. A source distribution needs no torch.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import maturin

# Checked against scripts/ci/torch-pairs.tsv, first to last row, by gpu-mem-track-testkit/tests/torch_range.rs
# (the TSV does not ship with this file).
SUPPORTED = "torch 2.6 to 2.15"


def _torch_or_exit() -> None:
    """Exits with what to run when this Python cannot import torch."""
    isolated = any("pip-build-env-" in p for p in sys.path)
    if importlib.util.find_spec("torch") is None:
        if isolated:
            why = "pip's build isolation hides the torch you have installed"
        else:
            why = f"this Python ({sys.executable}) has no torch"
        sys.exit(
            f"gpu-mem-track builds against the torch already installed ({SUPPORTED}), and {why}.\n"
            "Install torch first if it is missing, then build without isolation, with maturin beside it:\n"
            "    pip install maturin\n"
            "    pip install --no-build-isolation gpu-mem-track-<version>.tar.gz   (or a checkout's gpu-mem-track-py/)\n"
            "Or install the prebuilt wheel for your torch: pip install gpu-mem-track --no-index "
            "--find-links dist/torch-2.X"
        )
    # The build script finds libtorch through this same Python.
    os.environ.setdefault("PYO3_PYTHON", sys.executable)


def _checked(hook):
    """maturin's ``hook``, after the check for torch."""

    def run(*args, **kwargs):
        _torch_or_exit()
        return hook(*args, **kwargs)

    run.__name__ = run.__qualname__ = hook.__name__
    return run


# What builds the compiled part checks for torch first; the sdist needs none.
get_requires_for_build_wheel = _checked(maturin.get_requires_for_build_wheel)
prepare_metadata_for_build_wheel = _checked(maturin.prepare_metadata_for_build_wheel)
build_wheel = _checked(maturin.build_wheel)
get_requires_for_build_editable = _checked(maturin.get_requires_for_build_editable)
prepare_metadata_for_build_editable = _checked(maturin.prepare_metadata_for_build_editable)
build_editable = _checked(maturin.build_editable)
get_requires_for_build_sdist = maturin.get_requires_for_build_sdist
build_sdist = maturin.build_sdist
