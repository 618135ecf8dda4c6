"""Import order, tensors made before the import, and a torch of another minor version."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import gpu_mem_track
import torch
from conftest import read
from gpu_mem_track import _load


def run(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_import_before_torch_and_tensors_made_before_the_import_are_in_the_first_block(
    tmp_path,
):
    out = run(
        """
        import gpu_mem_track  # before torch: the package imports torch itself
        import torch
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    out = run(
        """
        import torch
        early = torch.zeros(333, 3)
        weight = torch.nn.Parameter(torch.ones(77))
        from gpu_mem_track import MemTracker
        t = MemTracker(device="cpu")
        t.track()
        print(t.log_path)
        """,
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    text = read(os.path.join(tmp_path, out.stdout.strip()))
    first = text.split("\nAt ")[0]
    assert "+ | 1 * Size:(333, 3)" in first, text
    assert "+ | 1 * Size:(77,)" in first and "Parameter" in first, text


def test_another_torch_minor_version_is_one_clear_error(tmp_path):
    # The installed torch is the build's; pretend it is another release.
    major, minor = torch.__version__.split(".")[:2]
    fake = f"{major}.{int(minor) + 1}.0"
    out = run(
        f"""
        import torch
        torch.__version__ = "{fake}"
        import gpu_mem_track
        """,
        tmp_path,
    )
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "TorchVersionMismatch" in last, out.stderr
    assert f"built against torch {gpu_mem_track.TORCH_VERSION}" in last and f"torch {fake} is installed" in last
    assert "undefined symbol" not in out.stderr


def test_the_build_marker_names_the_torch_of_the_build():
    path = _load._extension_path()
    assert path is not None
    built = _load._built_against(path)
    assert ".".join(map(str, built)) == gpu_mem_track.TORCH_VERSION
    assert _load._minor(gpu_mem_track.TORCH_VERSION) == _load._minor(torch.__version__)


def test_capabilities_name_the_libtorch():
    text = gpu_mem_track.capabilities()
    assert gpu_mem_track.TORCH_VERSION in text, text
