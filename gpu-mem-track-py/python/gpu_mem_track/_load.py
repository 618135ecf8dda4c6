"""Loads the compiled part after torch, refusing a torch it was not built against.

The extension links the libtorch of the torch it was compiled with, and libtorch has no stable ABI
across minor versions: loaded into another one it fails with ``undefined symbol`` (or worse, loads
and misreads). So the torch minor version is checked first, against the marker the build left in
the extension's bytes, and a mismatch is one clear error naming both versions.
"""

from __future__ import annotations

import importlib.machinery
import os
import re

import torch  # First: the extension binds to the libtorch this loads (one per process).

_MARKER = re.compile(rb"gpu-mem-track built against torch (\d+)\.(\d+)\.(\d+)")


class TorchVersionMismatch(ImportError):
    """The installed torch is not the minor version this build of gpu-mem-track was compiled for."""


def _extension_path() -> str | None:
    here = os.path.dirname(__file__)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(here, "_native" + suffix)
        if os.path.exists(path):
            return path
    return None


def _built_against(path: str) -> tuple[int, int, int] | None:
    with open(path, "rb") as f:
        found = _MARKER.search(f.read())
    return tuple(int(g) for g in found.groups()) if found else None  # type: ignore[return-value]


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _mismatch(built: str) -> TorchVersionMismatch:
    return TorchVersionMismatch(
        f"gpu_mem_track was built against torch {built}, but torch {torch.__version__} is installed; "
        "its compiled part only works with the torch minor version it was built against. "
        f"Install the gpu-mem-track wheel built for torch {'.'.join(map(str, _minor(torch.__version__)))}, "
        "or build it against this torch: pip install --no-build-isolation --no-binary gpu-mem-track "
        "gpu-mem-track (or scripts/dev wheel in a checkout)"
    )


def load():
    """The ``gpu_mem_track._native`` module, loaded after torch."""
    try:
        from . import _native
    except ImportError as e:
        path = _extension_path()
        built = _built_against(path) if path else None
        if built is not None and built[:2] != _minor(torch.__version__):
            raise _mismatch(".".join(map(str, built))) from e
        raise
    if _minor(_native.TORCH_VERSION) != _minor(torch.__version__):
        raise _mismatch(_native.TORCH_VERSION)
    return _native


#: The compiled part, loaded once for the package's modules.
native = load()
