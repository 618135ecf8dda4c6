"""The live-tensor registry from Python: registering tensors, and pausing its per-op callback.

Importing the package installs the registry, a libtorch callback on every op's outputs, on every
thread of the process. :func:`registry_paused` switches that callback off for a block of code the
user does not want watched (an evaluation loop, a data pipeline); ops then run as they would
without gpu-mem-track. A new :class:`MemTracker` resumes it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator
from typing import Any

import torch

from ._load import native as _native

_lock = threading.Lock()
_running = True


def register_existing_tensors() -> int:
    """Registers every tensor a garbage-collector walk finds (those made before the registry was
    installed, or while it was paused); returns how many. Tensors the registry already holds are
    not added twice."""
    count = 0
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads __class__, which some objects compute (and
        # deprecated torch names warn on).
        if not issubclass(type(obj), torch.Tensor):
            continue
        cdata = getattr(obj, "_cdata", 0)
        if cdata:
            _native.register_tensor(cdata)
            count += 1
    return count


def install_swap_tensors() -> None:
    """``torch.utils.swap_tensors`` with the registry installed: it refuses a tensor anything holds
    weakly, and the registry holds every tensor so (``Module._apply`` swaps FSDP2's parameters in
    ``to_empty``, and every parameter under ``swap_module_params_on_conversion``). Both tensors
    leave the registry for the swap and come back after it, so that the program runs as without
    gpu-mem-track."""
    swap = getattr(torch.utils, "swap_tensors", None)
    if swap is None or getattr(swap, "_gpu_mem_track", False):  # a torch without it, or installed
        return

    def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
        tensors = [t for t in (t1, t2) if isinstance(t, torch.Tensor) and getattr(t, "_cdata", 0)]
        for t in tensors:
            _native.forget_tensor(t._cdata)
        try:
            swap(t1, t2)
        finally:
            for t in tensors:
                _native.register_tensor(t._cdata)

    swap_tensors.__doc__ = swap.__doc__
    swap_tensors._gpu_mem_track = True  # type: ignore[attr-defined]
    torch.utils.swap_tensors = swap_tensors


#: Inductor's buffer allocators, which the wrapper code of a ``torch.compile``'d graph binds
#: when inductor loads it (``empty_strided_cpu = torch._C._dynamo.guards._empty_strided_cpu``).
#: ``_reinterpret_tensor`` makes a view of a buffer the same way; a view that outlives its buffer
#: (an output inductor carved from a larger one) holds the storage.
_INDUCTOR_ALLOCATORS = (
    "_empty_strided_cpu",
    "_empty_strided_cpu_pinned",
    "_empty_strided_cuda",
    "_empty_strided_xpu",
    "_reinterpret_tensor",
)


def install_inductor_buffers() -> None:
    """Inductor's buffer allocators, registering what they allocate: a ``torch.compile``'d graph's
    code allocates its buffers past the dispatcher, where no op returns them, so the registry
    would leave its outputs and what its forward saves for the backward to ``Unattributed
    Memory``. Their log lines say ``inductor buffer``. Graphs compiled before the package was
    imported keep the allocators they bound (their outputs Python holds are found by the
    garbage-collector walk at import)."""
    guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
    for name in _INDUCTOR_ALLOCATORS:
        allocate = getattr(guards, name, None)
        if allocate is None or getattr(allocate, "_gpu_mem_track", False):
            continue

        def registered(*args: Any, _allocate: Any = allocate, **kwargs: Any) -> torch.Tensor:
            buffer = _allocate(*args, **kwargs)
            if _running:
                _native.register_inductor_buffer(buffer._cdata)
            return buffer

        registered.__doc__ = allocate.__doc__
        registered.__name__ = registered.__qualname__ = name
        registered._gpu_mem_track = True  # type: ignore[attr-defined]
        registered.__wrapped__ = allocate  # type: ignore[attr-defined]
        setattr(guards, name, registered)


def registry_running() -> bool:
    """Whether the registry's per-op callback runs (not paused)."""
    return _running


def pause_registry() -> None:
    """Pauses the registry's per-op callback, for every thread of the process, until
    :func:`resume_registry` or a new :class:`MemTracker`.

    While paused, ops cost what they cost without gpu-mem-track, and the tensors they make are
    not registered. Memory they hold still counts in a log's ``Total Allocated Memory`` (as
    ``Unattributed Memory`` while no tensor line names it).
    """
    global _running
    with _lock:
        if _running:
            _native.set_registry_enabled(False)
            _running = False


def resume_registry(*, find_tensors: bool = True) -> None:
    """Resumes the registry's per-op callback.

    Args:
        find_tensors: also register the tensors Python holds that were made while it was paused
            (a garbage-collector walk: milliseconds in a large program), so that the next
            ``track()`` names them. Tensors only C++ holds (autograd's saved tensors) that were
            made while paused stay unnamed until they die.
    """
    global _running
    with _lock:
        if not _running:
            _native.set_registry_enabled(True)
            _running = True
            if find_tensors:
                register_existing_tensors()


@contextlib.contextmanager
def registry_paused(*, find_tensors: bool = True) -> Iterator[None]:
    """Pauses the registry's per-op callback for the ``with`` block, process-wide::

        with gpu_mem_track.registry_paused():
            evaluate(model, loader)      # not watched: no per-op cost

    On leaving the block the registry runs again if it ran on entering it (blocks nest); a
    :class:`MemTracker` made inside the block resumes it at once. ``find_tensors``: as
    :func:`resume_registry`'s.
    """
    was_running = registry_running()
    pause_registry()
    try:
        yield
    finally:
        if was_running:
            resume_registry(find_tensors=find_tensors)
