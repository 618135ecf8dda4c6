"""Types of ``gpu_mem_track._native``, the compiled part (gpu-mem-track-py/src/lib.rs, pyo3).

Kept by hand: a change to a ``#[pyfunction]``, a ``#[pyclass]``, a signature or a getter there
changes this file too.
"""

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypedDict, final

#: The torch release the extension was built against (``2.13.0``).
TORCH_VERSION: str
#: ``gpu-mem-track built against torch X.Y.Z``, as found in the extension's bytes.
BUILD_MARKER: str
__version__: str

class GpuMemTrackError(Exception):
    """A failure of gpu-mem-track itself (libtorch refused a hook, CUDA unavailable, a capability
    this build lacks); the message names what was wrong."""

class _TrackPoint(TypedDict):
    """What ``Tracker.track`` returns: one block's figures (bytes; a key per figure of the ``At``
    line's table in gpu-mem-track-log/src/log/at_line.rs, ``None`` where not measured), its tensor
    count and the lines it wrote."""

    tensor_bytes: int
    allocated: int
    peak_allocated: int
    workspace_bytes: int | None
    unattributed_bytes: int
    reserved: int | None
    device_free: int | None
    alloc_retries: int | None
    nvml_used: int | None
    peak_nvml_used: int | None
    tensor_count: int
    lines: list[str]
    at: str

class _ModelSizes(TypedDict):
    """What the model and its optimizer hold (``Recording.finish``'s ``sizes``)."""

    param_count: int
    param_bytes: int
    buffer_bytes: int
    input_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int

class EstimateRequest(TypedDict):
    """What ``Recording.finish`` is asked (``EstimateRequest`` of gpu-mem-track-estimate): the
    recorded run's options, the GPU, and one rank of a data-parallel job. Each word is parsed by
    its Rust type (``vocabulary()`` lists them)."""

    input_shape: list[int]
    input_is_index: bool
    #: The dtype the model runs in (``f32``, ``f16``, ``bf16``).
    dtype: str
    #: ``None`` for inference.
    optimizer: str | None
    #: A profile name or file, ``auto``, ``cuda``, ``all`` or ``none``.
    device_profile: str
    gpu_memory: int | None
    world_size: int
    shard: str
    #: The training precision of the job (``fp32``, ``amp-bf16``, ...).
    precision: str
    #: The NCCL communicators the program's process groups hold on this rank (0: one process).
    communicators: int

@final
class Tracker:
    """One tracker: the Rust ``MemTracker`` (one log file)."""

    def __new__(
        cls,
        device: str,
        log_dir: str | os.PathLike[str],
        prefix: str = "",
        detail: bool = True,
        nvml: bool = True,
        op_names: bool = False,
        sample_every: float | None = None,
        cpu_memory_limit: int | None = None,
        views: bool = False,
        rank: int | None = None,
    ) -> Tracker:
        """``device``: ``cpu`` or ``cuda:N``; ``log_dir`` must exist; ``prefix`` goes before the
        timestamp; ``rank``: the process's rank for the log's name."""

    def track(self, file: str, line: int, function: str) -> _TrackPoint:
        """Appends one block for ``file`` line ``line`` in ``function``; returns its figures."""

    def time_tracks(self, file: str, line: int, function: str, times: int) -> list[float]:
        """The seconds each of ``times`` tracks takes in Rust alone, at the site ``file:line``."""

    def begin_optimizer_step(self) -> None:
        """Marks what is made from now on as an optimizer step's: what it keeps is optimizer state."""

    def end_optimizer_step(self) -> None:
        """Ends what ``begin_optimizer_step`` began."""

    def clear_cache(self) -> int:
        """Releases the CUDA caching allocator's unused blocks; the bytes released (0 on the CPU)."""

    def tensors_text(self) -> str:
        """One line per live tensor on the device and a total, as text."""

    def tensor_bytes(self) -> int:
        """Bytes in the storages of the live tensors on the device, each storage counted once."""

    def record_history(self, max_entries: int) -> None:
        """Starts recording every allocation and free (the last ``max_entries``, 0: all)."""

    def stop_history(self) -> None:
        """Stops recording; what was recorded stays."""

    def dump_snapshot(self, path: str | os.PathLike[str]) -> None:
        """Writes the recorded history as a PyTorch memory snapshot pickle."""

    def tag_input(self, cdata: int) -> None:
        """Marks the tensor whose ``c10::TensorImpl*`` is ``cdata`` as the input batch in the history."""

    @property
    def log_path(self) -> Path:
        """The log file."""

    @property
    def device(self) -> str:
        """The tracked device (``cpu``, ``cuda:N``)."""

@final
class Recording:
    """An in-process estimate while it records (``gpu_mem_track.Estimator``), on the thread that
    began it (the CPU and CUDA mean meta there)."""

    def __new__(cls) -> Recording:
        """Starts recording on this thread."""

    def finish(self, request: EstimateRequest, sizes: _ModelSizes, sites: Sequence[str]) -> Finished:
        """Ends the recording: the estimate of what ran, as ``request`` asks; ``sites`` names the
        site indexes (module paths)."""

    def pause(self) -> None:
        """Lets the CPU be the CPU on this thread until ``resume``."""

    def resume(self) -> None:
        """Makes the CPU mean meta again."""

    def cancel(self) -> None:
        """Ends the recording without an estimate (the block raised)."""

@final
class Finished:
    """An in-process estimate once recorded (made by ``Recording.finish`` only)."""

    @property
    def json(self) -> str:
        """``estimate --json``'s object, with ``breakdown`` (module, category, bytes at the peak)."""

    @property
    def text(self) -> str:
        """The text ``estimate`` prints."""

    @property
    def fits(self) -> bool | None:
        """Whether the high end fits the GPU asked for (``None`` without one)."""

    @property
    def needed(self) -> int:
        """What nvidia-smi would show at the high end (0 without a GPU asked for)."""

def fit_search(probe: Callable[[int], Finished], max: int, dimension: str = "batch") -> str:
    """The largest value in ``1..=max`` whose ``probe(value)`` fits, as ``gpu-mem-track fit``
    searches; the JSON of its result. ``dimension``: ``batch`` or ``seq``."""

def meta_target_device(device_profile: str) -> None:
    """Meta runs stand for the GPU of ``device_profile`` from now on (attention's kernel)."""

def recording_phase(phase: str, iteration: int) -> None:
    """Tags the events recorded from now on with a phase and iteration."""

def recording_site(site: int | None = None) -> None:
    """Tags the events recorded from now on with a site index (the module running), or none."""

def recording_owner(cdata: int, site: int) -> None:
    """Sets the site of the recorded allocation of the tensor whose ``c10::TensorImpl*`` is ``cdata``."""

def meta_storage_resize(cdata: int, nbytes: int) -> None:
    """Resizes the meta storage whose ``c10::StorageImpl*`` is ``cdata`` as a GPU storage resizes
    (the old allocation freed, a new one made; both recorded)."""

def meta_storage_recorded(cdata: int) -> bool | None:
    """Whether the meta storage ``cdata`` holds recorded memory (``False``: made unrecorded, as
    the program's own meta tensors; ``None``: no block of the estimate's allocator)."""

@final
class Unrecorded:
    """``with Unrecorded():`` meta allocations this thread makes are not recorded, nor their frees."""

    def __new__(cls) -> Unrecorded: ...
    def __enter__(self) -> Unrecorded: ...
    def __exit__(self, *exc: object) -> bool: ...

def recording_tag(cdata: int, category: str) -> None:
    """Tags the recorded allocation of the tensor whose ``c10::TensorImpl*`` is ``cdata``."""

def recording_host(cdata: int) -> None:
    """Tags the recorded allocation of the tensor whose ``c10::TensorImpl*`` is ``cdata`` as host
    memory (FSDP's CPU offload): left out of the GPU figures, counted in ``host_peak``."""

def recording_is_host(cdata: int) -> bool:
    """Whether the recorded allocation of the tensor whose ``c10::TensorImpl*`` is ``cdata`` is host memory."""

#: The GPU an estimate is for when none is named (``auto``), as on the command line.
DEFAULT_GPU_TARGET: str
#: The ``device_profile`` words that name no single GPU (``cuda``, ``all``, ``none``).
NOT_ONE_GPU: list[str]

def vocabulary() -> dict[str, list[str]]:
    """The canonical words of each option an estimate takes, from the Rust types."""

def canonical(option: str, value: str) -> str:
    """The canonical word of ``value`` for ``option``; ``ValueError`` otherwise."""

def torch_optimizer(name: str) -> tuple[str, dict[str, float]]:
    """The ``torch.optim`` class name and keyword arguments of the optimizer ``name``."""

def precision_dtype(name: str) -> str:
    """The torch dtype (``torch.float16``) of the precision ``name``."""

def install() -> None:
    """Installs the live-tensor registry (once per process; later calls do nothing)."""

def register_tensor(cdata: int, name: str = "") -> None:
    """Registers a live tensor by its ``c10::TensorImpl*`` (``Tensor._cdata``) under ``name``."""

def register_inductor_buffer(cdata: int) -> None:
    """Registers a buffer inductor's generated code allocated (``Tensor._cdata``): its log line
    says ``inductor buffer``."""

def forget_tensor(cdata: int) -> None:
    """Takes a live tensor (``Tensor._cdata``) out of the registry, for ``torch.utils.swap_tensors``."""

def name_classes(classes: Sequence[type]) -> None:
    """Names Python tensor classes for the log's class column, as ``repr(cls)`` does."""

def reads_python_classes() -> bool:
    """Whether this build reads the Python class of each tensor (built against torch 2.10 or later)."""

def set_registry_enabled(enabled: bool) -> None:
    """Pauses (``False``) or resumes the registry's per-op callback."""

def registry_callbacks() -> int:
    """Op callbacks the registry has received since it was installed."""

def cpu_allocated() -> int:
    """Bytes the wrapped CPU allocator holds now (0 before the registry is installed)."""

def report(logs: Sequence[str | os.PathLike[str]], top: int = 5) -> tuple[str, str]:
    """``gpu-mem-track report`` on ``logs``: the text it prints and its ``--json`` dict, as JSON text."""

def cli(args: Sequence[str]) -> int:
    """Runs the ``gpu-mem-track`` command line on ``args``, the program name first; its exit code."""

def capabilities() -> str:
    """What this build and this machine can do, as text."""
