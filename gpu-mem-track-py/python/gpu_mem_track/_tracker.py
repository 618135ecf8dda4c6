"""``MemTracker``: Pytorch-Memory-Utils' class, on the gpu-mem-track tracker (Rust)."""

from __future__ import annotations

import contextlib
import dis
import functools
import gc
import html
import os
import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import IO, Any

import torch
import torch.optim.optimizer as _optim  # the module (torch.optim's namespace hides it)

from ._display import Report, block_html, report
from ._load import native as _native
from ._registry import resume_registry


def _device_name(device: Any) -> str:
    """``cpu`` or ``cuda:N`` for what a user passes; ``None`` (the default) is the current CUDA
    device, as Pytorch-Memory-Utils reads it (each torchrun rank's, after
    ``torch.cuda.set_device(local_rank)``); an int is a CUDA index. Either means the CPU, with one
    warning, where there is no GPU."""
    if device is None:
        device = torch.cuda.current_device() if torch.cuda.is_available() else 0
    if isinstance(device, bool):
        raise TypeError(f"device={device!r}: expected an int, a str or a torch.device")
    if isinstance(device, int):
        if torch.cuda.is_available():
            if device < 0 or device >= torch.cuda.device_count():
                raise ValueError(f"device={device}: {torch.cuda.device_count()} CUDA device(s) visible")
            return f"cuda:{device}"
        warnings.warn(
            "gpu_mem_track: no CUDA device is available; MemTracker tracks the CPU instead",
            RuntimeWarning,
            stacklevel=3,
        )
        return "cpu"
    if isinstance(device, (str, torch.device)):
        d = torch.device(device)
        if d.type == "cpu":
            return "cpu"
        if d.type == "cuda":
            return f"cuda:{0 if d.index is None else d.index}"
        raise ValueError(f"device={device!r}: only cpu and cuda devices can be tracked")
    raise TypeError(f"device={device!r}: expected an int, a str or a torch.device")


_named_classes = 0


def name_tensor_classes() -> None:
    """Names torch.Tensor and its subclasses (recursively) for the log's class column, so that a
    tensor's line names its Python class as ``repr(type(t))`` does. A class defined after this ran
    is named at the next ``MemTracker()`` or ``track()`` that finds a new direct subclass of
    ``torch.Tensor``; before that, its lines give the bare class name."""
    global _named_classes
    found, todo = [], [torch.Tensor]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    _native.name_classes(found)
    _named_classes = len(torch.Tensor.__subclasses__())


def _rank() -> int | None:
    """This process's rank once ``torch.distributed`` is initialised (launchers' variables, read by
    the tracker, name it before that)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return None


def _split_path(path: str | os.PathLike) -> tuple[str, str]:
    """Pytorch-Memory-Utils' ``path`` is put before the file name: ``'logs/run1-'`` writes
    ``logs/run1-<timestamp>-gpu_mem_track.txt``, ``''`` into the working folder."""
    path = os.fspath(path)
    folder, prefix = os.path.split(path)
    return folder or ".", prefix


class MemTracker:
    """Tracks the memory of one device into a Pytorch-Memory-Utils log, line by line.

    Drop-in for Pytorch-Memory-Utils' ``MemTracker(detail=True, path='', verbose=False, device=0)``.
    The log is created when the tracker is. Each :meth:`track` appends one block: the ``+``/``-``
    lines of the tensor groups that changed, and an ``At <file> line <N>: <function>`` line naming
    the caller. Keyword extras match the Rust builder. Making one resumes the live-tensor
    registry if :func:`registry_paused` or :func:`pause_registry` paused it.

    Args:
        detail: write the ``+``/``-`` tensor-group lines (off: only ``At`` lines).
        path: put before the log's file name (a folder, a prefix, or both).
        verbose: print each block to stdout as well.
        device: a CUDA index, ``'cuda:N'``, ``'cpu'`` or a ``torch.device``; by default the
            current CUDA device (``torch.cuda.current_device()``). An index, or the default, where
            there is no GPU tracks the CPU, with one warning.
        op_names: group tensors by the op that made them too, and name it on each line.
        views: print views (tensors sharing another tensor's storage: ``.t()``, ``.view()``) as
            lines of their own, ``Memory: 0.0 M``, as Pytorch-Memory-Utils does. Off by default: a
            view adds no memory, so its storage owner's line counts it (``| (+2 views)``).
        sample_every: seconds between background samples of the allocator (and NVML), whose peak
            between two track lines is added to the ``At`` line.
        nvml: read NVML for a CUDA device.
        cpu_memory_limit: bytes; the CPU allocator refuses to go past them, after writing the
            out-of-memory block (a GPU's out-of-memory, reproduced on a laptop). CPU only.
    """

    def __init__(
        self,
        detail: bool = True,
        path: str | os.PathLike = "",
        verbose: bool = False,
        device: Any = None,
        *,
        op_names: bool = False,
        sample_every: float | None = None,
        nvml: bool = True,
        cpu_memory_limit: int | None = None,
        views: bool = False,
    ) -> None:
        # A tracker watches: a paused registry (registry_paused, pause_registry) runs again.
        resume_registry()
        folder, prefix = _split_path(path)
        self.print_detail = detail
        self.verbose = verbose
        self._warned: set[str] = set()
        self._last: dict | None = None
        name_tensor_classes()
        self._tracker = _native.Tracker(
            _device_name(device),
            folder,
            prefix,
            detail=detail,
            nvml=nvml,
            op_names=op_names,
            sample_every=sample_every,
            cpu_memory_limit=cpu_memory_limit,
            views=views,
            rank=_rank(),
        )
        # Every optimizer's step, through PyTorch's global step hooks: what a step makes and keeps
        # prints as `| optimizer state`, as Rust's `MemTracker::optimizer_step` marks it.
        self._stepping = False
        me = weakref.ref(self)

        def step_begins(optimizer, args, kwargs):
            tracker = me()
            if tracker is None:
                return None
            tracker._step(True)
            # A closure (Lightning's, LBFGS's) runs the forward and backward inside the step:
            # what it makes is not optimizer state. It runs wrapped, outside the step's marking.
            # The hooks get the step's arguments with the optimizer first (as `self`).
            at = 1 if args and args[0] is optimizer else 0
            closure = kwargs.get("closure") if "closure" in kwargs else (args[at] if len(args) > at else None)
            if not callable(closure):
                return None
            wrapped = tracker._outside_step(closure)
            if "closure" in kwargs:
                return args, {**kwargs, "closure": wrapped}
            return (*args[:at], wrapped, *args[at + 1 :]), kwargs

        def step_ends(optimizer, args, kwargs) -> None:
            tracker = me()
            if tracker is not None:
                tracker._step(False)

        self._step_hooks = [
            _optim.register_optimizer_step_pre_hook(step_begins),
            _optim.register_optimizer_step_post_hook(step_ends),
        ]

    def _step(self, begins: bool) -> None:
        # A step that raised never reached its post hook: it ends before the next one begins.
        if self._stepping:
            self._tracker.end_optimizer_step()
            self._stepping = False
        if begins:
            self._tracker.begin_optimizer_step()
            self._stepping = True

    def _outside_step(self, closure: Callable) -> Callable:
        """``closure``, run with the step's marking suspended (its result and errors unchanged)."""

        @functools.wraps(closure)
        def run(*args: Any, **kwargs: Any) -> Any:
            self._step(False)
            try:
                return closure(*args, **kwargs)
            finally:
                self._step(True)

        return run

    def __del__(self) -> None:
        for hook in getattr(self, "_step_hooks", ()):
            hook.remove()
        if getattr(self, "_stepping", False):
            self._tracker.end_optimizer_step()

    @property
    def device(self) -> torch.device:
        """The tracked device."""
        return torch.device(self._tracker.device)

    @property
    def log_path(self) -> str:
        """The log file this tracker appends to."""
        return os.fspath(self._tracker.log_path)

    @property
    def gpu_profile_fn(self) -> str:
        """Pytorch-Memory-Utils' name for :attr:`log_path`."""
        return self.log_path

    def track(self) -> dict | None:
        """Appends a block for the caller's line; returns its figures (bytes) and lines.

        The figures: ``tensor_bytes`` (live tensors' storages, each once), ``tensor_count``,
        ``allocated`` (the allocator's count), ``peak_allocated`` (since the previous line),
        ``workspace_bytes`` (CUDA: cuBLAS and cuBLASLt workspaces; ``None`` on the CPU),
        ``unattributed_bytes`` (the rest of ``allocated``: tensors + workspaces + unattributed =
        allocated), ``reserved``, ``device_free`` and ``alloc_retries`` (CUDA; retries only when
        some happened since the previous line), ``nvml_used`` and ``peak_nvml_used`` (CUDA with
        NVML; the peak with ``sample_every``), ``None`` where not measured: a key for each figure
        of the ``At`` line. ``lines`` and ``at`` are the block's text.

        Like the Rust ``track!()``, a failure never reaches the program it watches: it is a
        warning naming it (once per distinct failure) and ``None``.
        """
        frame = sys._getframe(1)
        try:
            return self._track_at(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
        finally:
            del frame

    def _track_at(self, file: str, line: int, function: str) -> dict | None:
        if len(torch.Tensor.__subclasses__()) != _named_classes:
            name_tensor_classes()
        try:
            point = self._tracker.track(file, line, function)
        except (OSError, _native.GpuMemTrackError) as e:
            message = f"gpu_mem_track: track failed: {e}"
            if message not in self._warned:
                self._warned.add(message)
                warnings.warn(message, RuntimeWarning, stacklevel=4)
            return None
        self._last = point
        if self.verbose:
            print("\n".join([*point["lines"], "", point["at"]]))
        return point

    @contextlib.contextmanager
    def region(self, name: str) -> Iterator[None]:
        """``with tracker.region("forward"):`` tracks as the block begins and as it ends, the
        ``At`` lines naming it ``forward (enter)`` and ``forward (exit)`` with the lines of the
        ``with`` and of the block's end, as Rust's ``#[track_memory]`` names a function's."""
        frame = sys._getframe(2)  # the caller's (contextmanager's __enter__ is between)
        file = frame.f_code.co_filename
        self._track_at(file, frame.f_lineno, f"{name} (enter)")
        try:
            yield
        finally:
            self._track_at(file, frame.f_lineno, f"{name} (exit)")
            del frame

    def track_function(self, fn: Callable) -> Callable:
        """Decorator: tracks on entering ``fn`` and on leaving it (returning or raising), the
        ``At`` lines naming ``<qualname> (enter)`` at its ``def`` line and ``(exit)`` at its last
        line, as Rust's ``#[track_memory]`` does."""
        code = fn.__code__
        last = max((line for _, line in dis.findlinestarts(code) if line is not None), default=code.co_firstlineno)

        @functools.wraps(fn)
        def tracked(*args: Any, **kwargs: Any) -> Any:
            self._track_at(code.co_filename, code.co_firstlineno, f"{fn.__qualname__} (enter)")
            try:
                return fn(*args, **kwargs)
            finally:
                self._track_at(code.co_filename, last, f"{fn.__qualname__} (exit)")

        return tracked

    def watch(self, model: torch.nn.Module, name: str | None = None) -> torch.nn.Module:
        """Names ``model``'s parameters and buffers by their module path (``name`` or the class,
        then ``.layer1.0.conv1.weight``), as Rust's ``register_varstore`` names a VarStore's:
        :meth:`print_all_gpu_tensor` shows the names, and a named parameter's gradient is marked
        ``gradient``. Returns ``model``."""
        root = name or type(model).__name__
        for path, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
            self.register(t, f"{root}.{path}")
        return model

    def register(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        """Names ``tensor`` in :meth:`print_all_gpu_tensor`'s lines (and counts it, if no op made
        it since the tracker started: ``torch.from_numpy``). Returns ``tensor``."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"register(): expected a tensor, got {type(tensor).__name__}")
        _native.register_tensor(tensor._cdata, name)
        return tensor

    def get_tensors(self) -> list[torch.Tensor]:
        """The live tensors on the tracked device that Python holds (a garbage-collector walk, as
        Pytorch-Memory-Utils' ``get_tensors`` makes; tensors only libtorch holds are in the log)."""
        device = self.device
        found = []
        for obj in gc.get_objects():
            # type(), not isinstance(): isinstance reads __class__, which some objects compute.
            if issubclass(type(obj), torch.Tensor) and obj.device == device:
                found.append(obj)
        return found

    def clear_cache(self) -> int:
        """Collects garbage and releases the CUDA caching allocator's unused blocks; returns the
        reserved bytes released (0 on the CPU)."""
        gc.collect()
        return self._tracker.clear_cache()

    def print_all_gpu_tensor(self, file: IO[str] | None = None) -> None:
        """Prints one line per live tensor on the tracked device, and a total."""
        print(self._tracker.tensors_text(), end="", file=file)

    def get_tensor_usage(self) -> float:
        """MiB in the live tensors' storages on the device, each storage counted once."""
        return self._tracker.tensor_bytes() / 1024**2

    def get_allocate_usage(self) -> float:
        """MiB the device's allocator has handed out."""
        device = self.device
        if device.type == "cuda":
            return torch.cuda.memory_allocated(device) / 1024**2
        return _native.cpu_allocated() / 1024**2

    def record_history(self, max_entries: int = 0) -> None:
        """Records every allocation and free on the device (the last ``max_entries``; 0: all),
        each tagged with the latest track line, for :meth:`dump_snapshot`."""
        self._tracker.record_history(max_entries)

    def stop_history(self) -> None:
        """Stops recording; what was recorded stays."""
        self._tracker.stop_history()

    def dump_snapshot(self, path: str | os.PathLike) -> None:
        """Writes the recorded history as a PyTorch memory snapshot pickle
        (``torch.cuda._memory_viz`` and https://pytorch.org/memory_viz read it)."""
        self._tracker.dump_snapshot(os.fspath(path))

    def tag_input(self, tensor: torch.Tensor) -> None:
        """Marks ``tensor`` as the input batch in the recorded history."""
        self._tracker.tag_input(tensor._cdata)

    def __repr__(self) -> str:
        return f"MemTracker(device={self._tracker.device!r}, log={self.log_path!r})"

    def _repr_html_(self) -> str:
        """A notebook shows the last block: its group lines as a table, its ``At`` line below."""
        head = f"<div style=\"font-family:monospace\">{html.escape(repr(self))}</div>"
        if self._last is None:
            return head + "<div><i>no block yet: call track()</i></div>"
        return head + block_html(self._last["lines"], self._last["at"])

    def report(self, top: int = 5) -> Report:
        """``gpu-mem-track report`` on this tracker's log (see :func:`gpu_mem_track.report`)."""
        return report(self.log_path, top=top)
