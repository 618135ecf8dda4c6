"""``Estimator``: will it fit? The program's own PyTorch code, run on the meta device in-process.

Inside ``with Estimator(device_profile="h100-80g") as est:`` every tensor is a meta tensor (exact sizes,
no data, no compute): the model is built there with no memory behind its weights, ``"cuda"`` and
``"cpu"`` mean meta, and each storage is counted as it is allocated and freed, when Python frees
it. The block's phases are read from the program itself: a forward of a module called outside
any other starts an iteration, ``Tensor.backward`` the backward, an optimizer's ``step`` the
optimizer step. Each allocation is charged to the module running (module hooks, forward and
backward) and to a category (parameters, buffers, input, activations, gradients, optimizer state,
temporaries). On leaving the block, the recording goes through the model of the GPU's CUDA
caching allocator and its cuBLAS / cuDNN workspaces (``device_profile``): ``est.result`` is the
``Estimate``, the same figures as ``gpu-mem-track estimate --json``.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

from ._compiled import CompiledSteps, summary_text
from ._distributed import SimulatedRanks
from ._estimate_result import estimate_of
from ._load import native as _native
from ._meta_kernels import LargestResults
from ._meta_mode import MetaMode
from ._phases import PhaseHooks, module_tracker
from ._recorded_options import recorded_options
from ._sites import Sites
from ._torch_patches import patch_torch
from ._vocabulary import DEFAULT_DEVICE_PROFILE, canonical


def device_profile_argument(caller: str, device_profile: str | None, device: str | None) -> str:
    """The GPU profile asked for: ``device_profile``, or ``device``, its old name (deprecated: a
    device is a torch device everywhere else in this package), else the command line's default
    (``auto``)."""
    if device is None:
        return DEFAULT_DEVICE_PROFILE if device_profile is None else device_profile
    if device_profile is not None:
        raise TypeError(f"{caller}(): device_profile={device_profile!r} and device={device!r}; pass device_profile only")
    warnings.warn(
        f"{caller}(device=...) is deprecated: pass device_profile={device!r}",
        DeprecationWarning,
        stacklevel=3,
    )
    return device


class Estimator(PhaseHooks):
    """Estimates the GPU memory of the code run inside ``with``, without a GPU.

    ``device_profile`` (``gpu-mem-track estimate --device-profile``; ``device=`` is its deprecated
    old name): a GPU profile (``h100-80g``, ``h200``, ``a100-80g``, ``a100-40g``, ``rtx4090``, ``l4``,
    ``t4``, ... or a profile ``.json``), ``"auto"`` (the default, as on the command line: the first
    GPU CUDA shows this process, else ``rtx4090``), ``"all"`` for every preset, ``"cuda"`` for the
    caching allocator model alone. ``gpu_memory``: the GPU's memory in bytes, replacing the profile's.
    ``world_size``, ``shard`` (``none``, ``zero1``, ``zero2``, ``zero3``/``fsdp``) and
    ``precision`` (``fp32``, ``bf16``, ``amp-bf16``, ...): the GPU figures are those of one rank of
    a data-parallel job, by a formula over the single-process step.

    A distributed program (``dist.init_process_group``, ``init_device_mesh``, FSDP, DTensor) runs in
    the block as rank ``rank`` of ``world_size``: its process group is simulated (collectives move
    no data), and the figures are that rank's as it ran (``shard`` is then not applied): the result's
    ``["distributed"]`` says so, where the formula's figures are in ``["rank"]``, named a formula.

    After the block, ``result`` is the :class:`Estimate`; ``print(est)`` shows it and
    :meth:`breakdown` says what each module and category held at the peak. The block runs on the
    thread that entered it; one estimate runs at a time in a process.

    Raises (on entering): ``GpuMemTrackError`` when another estimate or memory history records.
    Raises (on leaving): ``ValueError`` for an unknown profile or option.
    """

    def __init__(
        self,
        device_profile: str | None = None,
        *,
        gpu_memory: int | None = None,
        world_size: int = 1,
        rank: int = 0,
        shard: str = "none",
        precision: str = "fp32",
        device: str | None = None,
    ) -> None:
        self.device_profile = device_profile_argument("Estimator", device_profile, device)
        self.gpu_memory = gpu_memory
        # Checked here, in Rust's words: a misspelt option fails before the block runs.
        self.parallel = {
            "world_size": int(world_size),
            "shard": canonical("Estimator", "shard", shard),
            "precision": canonical("Estimator", "precision", precision),
        }
        self.ranks = SimulatedRanks(int(world_size), int(rank))
        self.result: Any = None
        self._recording: Any = None

    @property
    def device(self) -> str:
        """Deprecated: :attr:`device_profile`."""
        warnings.warn("Estimator.device is deprecated: use device_profile", DeprecationWarning, stacklevel=2)
        return self.device_profile

    def __enter__(self) -> Estimator:  # noqa: PYI034 - typing.Self is Python 3.11+, the package 3.9+
        if self._recording is not None:
            raise RuntimeError("Estimator: this estimator's block is running already")
        self.result = None
        self._thread = threading.get_ident()
        self._phase = "load"
        self._iteration = 0
        self._backward_ran = False
        self._roots = {}
        self._largest = LargestResults(self)
        self._owners = {}
        self._optimizers = {}
        self._first_input = None
        self._sites = Sites()
        # Attention takes the kernel the profile's GPU picks (flash, memory-efficient or math).
        _native.meta_target_device(self.device_profile)
        self._recording = _native.Recording()
        self._undo = []
        try:
            patch_torch(self._undo, self._largest)
            self._install_hooks(module_tracker())
            mode = self._mode = MetaMode(self)
            self._compiled = CompiledSteps(mode)
            self._compiled.patch(self._undo)
            self._undo.append(self.ranks.close)
            self.ranks.patch(self._undo, mode)
            mode.__enter__()
            self._undo.append(lambda: mode.__exit__(None, None, None))
        except BaseException:
            self._take_down()
            self._recording.cancel()
            self._recording = None
            raise
        return self

    def _take_down(self) -> None:
        while self._undo:
            try:
                self._undo.pop()()
            except Exception:  # noqa: BLE001 - every hook is taken down, whatever one raises
                warnings.warn("Estimator: a hook could not be removed", RuntimeWarning, stacklevel=3)

    def __exit__(self, exc_type, exc, tb) -> bool:
        recording, self._recording = self._recording, None
        self._take_down()
        if exc_type is not None:
            recording.cancel()
            return False
        try:
            run, sizes = recorded_options(self._roots, self._optimizers, self._first_input, self._backward_ran)
        except BaseException:
            recording.cancel()  # the next block can record
            raise
        # A program that made its process group ran as one rank: its figures are that rank's.
        parallel = {**self.parallel, "world_size": 1, "shard": "none"} if self.ranks.used else self.parallel
        request = {
            **run,
            "device_profile": self.device_profile,
            "gpu_memory": self.gpu_memory,
            **parallel,
            "communicators": self.ranks.communicators,
        }
        finished = recording.finish(request, sizes, self._sites.names)
        self._finished = finished
        self.result = estimate_of(finished, self._largest.calls)
        compiled = self._compiled.summary()
        if compiled is not None:
            self.result["compiled"] = compiled
            self.result.text += summary_text(compiled)
        if self.ranks.used:
            self.result["distributed"] = {"world_size": self.ranks.world_size, "rank": self.ranks.rank, "method": "traced"}
            self.result.text += (
                f"  rank {self.ranks.rank} of {self.ranks.world_size}: traced as the program ran it, on a simulated"
                " process group (collectives moved no data)\n"
            )
        return False

    def __str__(self) -> str:
        if self.result is None:
            return "Estimator(no result yet: run a block under `with`)"
        return str(self.result)

    def breakdown(self, depth: int | None = None) -> Any:
        """What each module and category held at the peak (see :meth:`Estimate.breakdown`)."""
        if self.result is None:
            raise RuntimeError("Estimator.breakdown(): no result yet (run a block under `with` first)")
        return self.result.breakdown(depth)
