"""Line-by-line GPU memory tracking for PyTorch, on the gpu-mem-track tracker (Rust).

A drop-in for Pytorch-Memory-Utils' ``MemTracker``::

    import torch
    from gpu_mem_track import MemTracker

    gpu_tracker = MemTracker()          # MemTracker(detail=True, path='', verbose=False, device=0)
    gpu_tracker.track()                 # one block of the log per call, naming this line
    ...
    gpu_tracker.clear_cache()
    gpu_tracker.print_all_gpu_tensor()

Importing the package imports torch first (the compiled part binds to the libtorch torch loads),
installs the live-tensor registry (a libtorch callback on every op's outputs, on every thread), and
registers the tensors that already exist (one garbage-collector walk), so the first block of a log
counts them too. ``with gpu_mem_track.registry_paused():`` switches the callback off for code
that should not be watched; a new ``MemTracker`` switches it on again.
"""

from __future__ import annotations

import torch  # noqa: F401  (first: the compiled part binds to the libtorch torch loads)

from ._display import Report, report
from ._estimate import RankEstimates, estimate, estimate_ranks, fit
from ._estimate_result import Breakdown, Estimate
from ._estimator import Estimator
from ._load import TorchVersionMismatch
from ._load import native as _native
from ._registry import (
    install_inductor_buffers,
    install_swap_tensors,
    pause_registry,
    register_existing_tensors,
    registry_paused,
    registry_running,
    resume_registry,
)
from ._tracker import MemTracker, name_tensor_classes

GpuMemTrackError = _native.GpuMemTrackError
__version__ = _native.__version__
#: The torch release the compiled part was built against (the same minor version is required).
TORCH_VERSION = _native.TORCH_VERSION

__all__ = [
    "TORCH_VERSION",
    "Breakdown",
    "Estimate",
    "Estimator",
    "GpuMemTrackError",
    "MemTracker",
    "RankEstimates",
    "Report",
    "TorchVersionMismatch",
    "capabilities",
    "estimate",
    "estimate_ranks",
    "fit",
    "pause_registry",
    "registry_paused",
    "registry_running",
    "report",
    "resume_registry",
]


def capabilities() -> str:
    """What this build and this machine can do (libtorch, CUDA, memory history, NVML), as text."""
    return _native.capabilities()


_native.install()
install_swap_tensors()
install_inductor_buffers()
name_tensor_classes()
register_existing_tensors()
