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

import contextlib
import json
import sys
import threading
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.optim.optimizer as _optim  # the module (torch.optim's namespace hides it)
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from . import _autocast
from ._known_values import READS, VALUE_SIZED, KnownValues, constant_of
from ._load import native as _native

_META = torch.device("meta")
# Python torch's meta functions (the keys of its library, op -> function) and the ops among them
# libtorch has no Meta kernel of: read by the first block (21.6 of the 37 ms its entry took), kept
# while the library holds the same ops.
_PYTHON_META: tuple[frozenset, dict, list | None] | None = None
#: Constructors that write the caller's data into the CPU tensor they make: they run with the CPU
#: being the CPU (a meta tensor has no memory to write into); asked for a GPU, the result is then
#: copied to meta, as a real run copies it to the GPU.
_FROM_DATA = frozenset({"tensor", "as_tensor", "asarray", "new_tensor", "frombuffer", "from_numpy"})

#: Reads of a tensor's values into Python.
_READ_REAL = frozenset({"tolist", "numpy", "item", "__bool__", "__int__", "__float__", "__index__", "__array__"})

#: Optimizer classes the estimator's figures name (others are named by the state they keep).
_OPTIMIZERS = {"SGD": "sgd", "Adam": "adam", "AdamW": "adamw"}


def _meta_device(d: Any) -> Any:
    """A CUDA device (``"cuda"``, ``"cuda:1"``, ``torch.device("cuda")``) as meta; others as they are."""
    if isinstance(d, torch.device):
        return _META if d.type == "cuda" else d
    if isinstance(d, str) and (d == "cuda" or d.startswith("cuda:")):
        return _META
    return d


def _grouped_mm_as_on_a_gpu(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """``aten::_grouped_mm`` on meta, as the CUDA kernel allocates its result (GroupedBlas.cpp,
    create_grouped_gemm_output_tensor): the last dimension's stride padded to 16 bytes."""
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    if a2 and b2:
        size = [offs.size(0), mat_a.size(0), mat_b.size(1)]
    elif a2:
        size = [mat_a.size(0), mat_b.size(-1)]
    elif b2:
        size = [mat_a.size(1), mat_b.size(1)]
    else:
        size = [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]
    dtype = out_dtype or mat_a.dtype
    align = max(16 // dtype.itemsize, 1)
    last = (size[-1] + align - 1) // align * align
    stride = [size[1] * last, last, 1] if a2 == b2 else [last, 1]
    return torch.empty_strided(size, stride, dtype=dtype, device=mat_a.device)


def _has_op(namespace: Any, name: str) -> bool:
    """Whether the dispatcher has the op (``torch.ops.torchvision.nms`` exists only once
    torchvision's C++ ops are loaded)."""
    try:
        getattr(namespace, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def _user_stacklevel() -> int:
    """The ``stacklevel`` of a warning raised by the caller of this that points at the program's
    own line: the innermost frame outside torch and this package."""
    inside = (str(Path(torch.__file__).parent), str(Path(__file__).parent))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(inside):
        frame, level = frame.f_back, level + 1
    return level


class _LargestResults:
    """Meta kernels, for the block, of ops whose result's size depends on the values of their
    inputs, which a meta tensor does not have: each returns its largest result, as
    ``masked_select``'s and ``unique``'s meta kernels return theirs, so the estimate is an upper
    bound; one warning a block and op says so, at the program's own line.

    - ``aten::nonzero``: a row for each nonzero element. Boolean-mask indexing (``x[mask]``),
      ``torch.where(cond)`` and ``argwhere`` call it. A mask whose values the block knows
      (``_known_values``: all ones, all zeros, the real values of integers from data) gives its
      exact count; a mask with a known most nonzero elements (zeros, then ``mask[idx] = 1``, as
      samplers build them) that many; else every element. Laid out as CUDA lays it out:
      ``(dims, N)`` int64, transposed. Python torch's own meta function refuses (2.9 and later,
      unless a torch.fx setting is on); torch 2.6-2.8 have none.
    - ``torchvision::nms``: the boxes kept, every box, with what its CUDA kernel allocates on the
      way (the scores' sort, the sorted boxes, the overlap bit mask of 64 boxes a word).
      torchvision's own meta function refuses meta tensors.
    """

    def __init__(self, estimator: Estimator) -> None:
        self._estimator = estimator
        self.calls: dict[str, int] = {}  # op -> calls that took the largest result

    def _say(self, op: str, t: torch.Tensor, what: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1
        if self.calls[op] == 1:
            warnings.warn(
                f"Estimator: {op} of a {tuple(t.shape)} {t.dtype} tensor {what} depends on values a meta tensor "
                "does not have: the estimate takes its largest result, here and at each later call of the block",
                stacklevel=_user_stacklevel(),
            )

    def nonzero(self, t: torch.Tensor) -> torch.Tensor:
        mode = getattr(self._estimator, "_mode", None)
        known = mode.known if mode is not None else None
        count = known.nonzero_count(t) if known is not None else None
        rows = t.numel() if count is None else count
        if rows and (known is None or not known.knows(t)):
            self._say("torch.nonzero", t, "(boolean-mask indexing x[mask], torch.where(cond) and argwhere call it)")
        return torch.empty_strided((rows, t.dim()), (1, rows), dtype=torch.long, device=t.device)

    def nms(self, boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
        torch._check(boxes.dim() == 2 and boxes.size(1) == 4, lambda: f"boxes should be (N, 4), got {tuple(boxes.shape)}")
        torch._check(scores.dim() == 1 and scores.size(0) == boxes.size(0), lambda: "one score a box")
        n = boxes.size(0)
        if n == 0:
            return boxes.new_empty((0,), dtype=torch.long)
        self._say("torchvision.ops.nms", boxes, "(the boxes it keeps)")
        order = scores.sort(stable=True, dim=0, descending=True)[1]
        sorted_boxes = boxes.index_select(0, order).contiguous()
        overlaps = torch.empty(n * ((n + 63) // 64), dtype=torch.long, device=boxes.device)
        keep = torch.empty(n, dtype=torch.long, device=boxes.device)  # copied from the host
        kept = order.index_select(0, keep)
        del sorted_boxes, overlaps  # live until the kernel returns, as in CUDA's
        return kept


class _DevicesWithMeta(list):
    """A list of device types with meta in it while CUDA is."""

    def __init__(self, devices: list) -> None:
        super().__init__([*devices, "meta"] if "cuda" in devices else devices)

    def remove(self, device: str) -> None:
        super().remove(device)
        if device == "cuda" and "meta" in self:
            super().remove("meta")


class _MetaMode(TorchFunctionMode):
    """Sees every torch call of the block: CUDA devices become meta before torch would initialise
    CUDA for them, ``Tensor.backward`` starts the backward phase, autocast("cuda") casts meta
    tensors as it casts CUDA ones, and constant inputs keep their values (``_known_values``)."""

    def __init__(self, estimator: Estimator) -> None:
        super().__init__()
        self._estimator = estimator
        self._casts = _autocast.Casts()
        self._paused = 0
        self.known = KnownValues(self._cpu_is_cpu)
        # The storages of the real tensors the block made from data (``torch.tensor(2.6)``): a
        # parameter on one of them (CLIP's ``logit_scale``) was made in the block, not before.
        self._from_data: set[int] = set()

    def made_from_data(self, t: torch.Tensor) -> bool:
        """Whether ``t`` (a real tensor) is on the storage of one the block made from data."""
        return t.untyped_storage()._cdata in self._from_data

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in READS and args and isinstance(args[0], torch.Tensor):
            known, value = self.known.read(name, args[0])
            if known:
                return value
        if name == "tolist" and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
            return self.known.tolist(args[0])
        if name in VALUE_SIZED:
            sized = self.known.sized_by_values(func, args, kwargs)
            if sized is not None:
                return sized
        if name == "__iter__" and args and isinstance(args[0], torch.Tensor) and self.known.knows(args[0]):
            # `for row in t` unbinds t: its rows keep the values (Qwen2-VL's image_grid_thw)
            rows = torch.Tensor.unbind(args[0], 0)
            self.known.follow_values(torch.Tensor.unbind, "unbind", (args[0], 0), {}, rows)
            return iter(rows)
        if name in ("numpy", "__array__") and args and isinstance(args[0], torch.Tensor) and args[0].device.type == "meta":
            with self._cpu_is_cpu():
                array = self.known.numpy(args[0])
            return array if name == "numpy" or len(args) < 2 or args[1] is None else array.astype(args[1])
        out = self._call(func, name, args, kwargs)
        if name in ("cuda", "to") and args and isinstance(args[0], torch.Tensor) and args[0].device.type != "meta":
            with self._cpu_is_cpu():  # while the tensor's values are read
                self.known.set(out, constant_of(args[0]))
            self.known.set_real(out, args[0])
        else:
            self.known.follow(name, args, kwargs, out)
            self.known.follow_values(func, name, args, kwargs, out)
        return out

    @contextlib.contextmanager
    def _cpu_is_cpu(self) -> Iterator[None]:
        """The recording paused: CPU tensors made meanwhile are real CPU tensors, not meta. Nests
        (a real-values count inside a real op): only the outermost resumes."""
        recording = self._estimator._recording
        self._paused += 1
        if self._paused == 1:
            recording.pause()
        try:
            yield
        finally:
            self._paused -= 1
            if self._paused == 0:
                recording.resume()

    def _call(self, func, name: str, args: tuple, kwargs: dict) -> Any:
        if "device" in kwargs:
            kwargs = {**kwargs, "device": _meta_device(kwargs["device"])}
        if name == "cuda":  # Tensor.cuda(device=None, non_blocking=False, ...): stays on meta
            return torch.Tensor.to(args[0], _META)
        if name == "pin_memory":  # meta memory cannot be pinned (and needs no pinning)
            return args[0]
        if name == "to" and len(args) > 1:
            device = args[1]
            if isinstance(device, int) and not isinstance(device, bool):
                device = _META  # x.to(0): CUDA device 0
            args = (args[0], _meta_device(device), *args[2:])
        # A sampler's shuffle (torch.randperm with its own generator, DataLoader's RandomSampler)
        # is the data pipeline's: its indices are read with `.tolist()`, so they are real. So is
        # reading a real tensor's values (`.tolist()` copies it first, which would be meta).
        real_read = name in _READ_REAL and args and isinstance(args[0], torch.Tensor) and args[0].device.type != "meta"
        if name in _FROM_DATA or real_read or (name == "randperm" and kwargs.get("generator") is not None):
            with self._cpu_is_cpu():
                out = func(*args, **kwargs)
            if name in _FROM_DATA and isinstance(out, torch.Tensor):
                self._from_data.add(out.untyped_storage()._cdata)
            return out
        if name == "repeat_interleave" and kwargs.get("output_size") is None:
            kwargs = self._repeat_interleave_size(args, kwargs)
        if name in ("backward", "grad") and func in (torch.Tensor.backward, torch.autograd.grad):
            self._estimator._enter_backward()
            out = func(*args, **kwargs)
            self._estimator._own_gradients()
            return out
        if _autocast.enabled():
            args, kwargs = self._casts.apply(func, args, kwargs)
            return _autocast.cross_entropy(func, args, kwargs)
        self._casts.clear()
        return func(*args, **kwargs)

    def _repeat_interleave_size(self, args: tuple, kwargs: dict) -> dict:
        """``repeat_interleave`` by a tensor of repeats: its output size, which meta cannot have
        without it, from the repeats' real values (Qwen2-VL's patches an image, from
        ``image_grid_thw``), where the block has them."""
        single = len(args) == 1 and "repeats" not in kwargs  # repeat_interleave(repeats)
        repeats = args[0] if single else (args[1] if len(args) > 1 else kwargs.get("repeats"))
        real = self.known.real(repeats) if isinstance(repeats, torch.Tensor) and repeats.device.type == "meta" else None
        if real is None:
            return kwargs
        with self._cpu_is_cpu():
            total = int(real.sum())
            if not single and real.numel() == 1:
                dim = args[2] if len(args) > 2 else kwargs.get("dim")
                total = int(real.reshape(-1)[0]) * (args[0].numel() if dim is None else args[0].shape[dim])
        return {**kwargs, "output_size": total}


class _Sites:
    """The module running as each allocation is made: the innermost module whose forward, or
    backward, has begun and not ended, as ``ModTracker`` sees them (by their path from the root,
    ``GPT2LMHeadModel.transformer.h.0.attn``); its index is the recorder's site."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._index: dict[str, int] = {}
        self._active: list[tuple[str, bool]] = []  # (path, in backward), in the order they began

    def enter(self, fqn: str | None, backward: bool = False) -> None:
        if fqn is None:  # a module no longer alive in backward
            return
        self._active.append((fqn, backward))
        self._set()

    def leave(self, fqn: str | None) -> None:
        for i in range(len(self._active) - 1, -1, -1):
            if self._active[i][0] == fqn:
                del self._active[i]
                break
        self._set()

    def idle(self) -> bool:
        """No module's forward is running."""
        return not any(not backward for _, backward in self._active)

    def forget_backward(self) -> None:
        """Drops the modules whose backward began and never said it ended (before torch 2.7,
        ModTracker misses the end of a backward whose module returned no tensor, a dict)."""
        if self._active:
            self._active.clear()
            self._set()

    def _set(self) -> None:
        if not self._active:
            _native.recording_site(None)
            return
        depth = max(a.count(".") for a, _ in self._active)
        current = next(a for a, _ in reversed(self._active) if a.count(".") == depth)
        _native.recording_site(self.index(current))

    def index(self, fqn: str) -> int:
        """The site index of a module path."""
        index = self._index.get(fqn)
        if index is None:
            index = self._index[fqn] = len(self.names)
            self.names.append(fqn)
        return index


DEFAULT_DEVICE_PROFILE = "h100-80g"


def device_profile_argument(caller: str, device_profile: str | None, device: str | None) -> str:
    """The GPU profile asked for: ``device_profile``, or ``device``, its old name (deprecated: a
    device is a torch device everywhere else in this package), else ``h100-80g``."""
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


class Estimator:
    """Estimates the GPU memory of the code run inside ``with``, without a GPU.

    ``device_profile`` (``gpu-mem-track estimate --device-profile``; ``device=`` is its deprecated
    old name): a GPU profile (``h100-80g``, the default, ``h200``, ``a100-80g``, ``a100-40g``, ``rtx4090``, ``l4``,
    ``t4``, ... or a profile ``.json``), ``"all"`` for every preset, ``"cuda"`` for the caching
    allocator model alone. ``gpu_memory``: the GPU's memory in bytes, replacing the profile's.
    ``world_size``, ``shard`` (``none``, ``zero1``, ``zero2``, ``zero3``/``fsdp``) and
    ``precision`` (``fp32``, ``bf16``, ``amp-bf16``, ...): the GPU figures are those of one rank of
    a data-parallel job.

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
        shard: str = "none",
        precision: str = "fp32",
        device: str | None = None,
    ) -> None:
        self.device_profile = device_profile_argument("Estimator", device_profile, device)
        self.gpu_memory = gpu_memory
        self.parallel = (int(world_size), shard, precision)
        self.result: Any = None
        self._recording: Any = None

    @property
    def device(self) -> str:
        """Deprecated: :attr:`device_profile`."""
        warnings.warn("Estimator.device is deprecated: use device_profile", DeprecationWarning, stacklevel=2)
        return self.device_profile

    # -- what the program's hooks say --------------------------------------------------------

    def _enter_backward(self) -> None:
        if self._phase != "backward":
            self._phase = "backward"
            self._backward_ran = True
            _native.recording_phase("backward", max(self._iteration, 1))

    def _root_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if id(module) not in self._roots:  # before the phase: what it moves to meta is the model's
            self._note_model(module)
            self._roots[id(module)] = module
        if self._phase != "forward":
            self._iteration += 1
            self._phase = "forward"
            _native.recording_phase("forward", self._iteration)
        if self._input is None:
            tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            self._input = tensors
            for t in tensors:
                if t.device.type == "meta":
                    _native.recording_tag(t._cdata, "input")

    def _note_model(self, module: torch.nn.Module) -> None:
        off_meta = []
        for n, p in module.named_parameters():
            if p.device.type == "meta":
                continue
            if self._mode is not None and p.device.type == "cpu" and self._mode.made_from_data(p):
                self._parameter_to_meta(p)
            else:
                off_meta.append(n)
        if off_meta:
            raise ValueError(
                f"Estimator: {type(module).__name__} has parameters on {module.get_parameter(off_meta[0]).device} "
                f"({off_meta[0]}, ...): it was built before the block. Build it inside `with Estimator():`, "
                "or estimate a built model with gpu_mem_track.estimate(model, ...), which leaves its weights alone."
            )
        # Parameters, buffers, gradients and optimizer state belong to the module that holds the
        # parameter (named as ModTracker names it: the class, then the attribute path).
        root = module._get_name()
        for name, sub in module.named_modules():
            site = self._sites.index(f"{root}.{name}" if name else root)
            for p in sub.parameters(recurse=False):
                _native.recording_tag(p._cdata, "parameter")
                _native.recording_owner(p._cdata, site)
                self._owners[id(p)] = (p, site)
            for b in sub.buffers(recurse=False):
                if b.device.type == "meta":
                    _native.recording_tag(b._cdata, "buffer")
                    _native.recording_owner(b._cdata, site)

    def _parameter_to_meta(self, p: torch.nn.Parameter) -> None:
        """A parameter the block made from data (``nn.Parameter(torch.tensor(2.6))``), moved to
        meta in place (the same object: a module and an optimizer made before hold it), its value
        kept where it is constant."""
        with self._mode._cpu_is_cpu():  # while its values are read
            value = constant_of(p)
        p.data = p.data.to(_META)
        self._mode.known.set(p, value)

    def _own_gradients(self) -> None:
        """Charges each parameter's gradient to the parameter's module."""
        for p, site in self._owners.values():
            g = p.grad
            if g is not None and g.device.type == "meta":
                _native.recording_owner(g._cdata, site)

    def _own_state(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Charges an optimizer's state of each parameter to the parameter's module."""
        for p, state in optimizer.state.items():
            owner = self._owners.get(id(p))
            if owner is None or owner[0] is not p:
                continue
            for v in state.values():
                if isinstance(v, torch.Tensor) and v.device.type == "meta":
                    _native.recording_owner(v._cdata, owner[1])

    def _note_constant(self, meta: torch.Tensor, value: Any) -> None:
        """``meta`` stands in the block for a tensor of the program's whose elements all hold
        ``value`` (``_known_values.constant_of``; ``None``: not constant)."""
        self._mode.known.set(meta, value)

    def _optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._own_gradients()
        self._optimizers[id(optimizer)] = weakref.ref(optimizer)
        if self._phase != "optimizer":
            self._phase = "optimizer"
            _native.recording_phase("optimizer", max(self._iteration, 1))

    # -- the block ---------------------------------------------------------------------------

    def __enter__(self) -> Estimator:  # noqa: PYI034 - typing.Self is Python 3.11+, the package 3.9+
        if self._recording is not None:
            raise RuntimeError("Estimator: this estimator's block is running already")
        from torch.distributed._tools.mod_tracker import ModTracker

        self.result = None
        self._thread = threading.get_ident()
        self._phase = "load"
        self._iteration = 0
        self._backward_ran = False
        self._roots: dict[int, torch.nn.Module] = {}
        self._largest = _LargestResults(self)
        self._owners: dict[int, tuple[torch.Tensor, int]] = {}
        self._optimizers: dict[int, weakref.ref] = {}
        self._input: list[torch.Tensor] | None = None
        self._sites = _Sites()
        # Attention takes the kernel the profile's GPU picks (flash, memory-efficient or math).
        _native.meta_target_device(self.device_profile)
        self._recording = _native.Recording()
        self._undo: list = []
        self._stance: Any = None
        try:
            self._patch_torch()
            tracker = ModTracker()
            sites = self._sites

            def fqn(module):
                # ModTracker's backward hooks hold their module weakly: one the program made in
                # its forward and dropped (the CrossEntropyLoss T5 builds per call) arrives as None.
                return None if module is None else tracker.get_known_fqn(module)

            def pre_forward(module, args):
                if threading.get_ident() == self._thread:
                    sites.enter(fqn(module))

            def post_forward(module, args, output):
                if threading.get_ident() == self._thread:
                    sites.leave(fqn(module))

            def pre_backward(module, grad_output):
                self._enter_backward()
                sites.enter(fqn(module), backward=True)

            def post_backward(module, grad_input):
                sites.leave(fqn(module))

            tracker.register_user_hooks(pre_forward, post_forward, pre_backward, post_backward)
            # A module called outside any other's forward is the model: its call starts an
            # iteration's forward. Module.__call__, not a global forward pre-hook, which would
            # not see keyword arguments (`input_ids=...`), the input of most models. Not inside a
            # backward pass (checkpointing's recompute): autograd's own word for it, as
            # ModTracker's is_bw stays set after a backward until the next forward before torch 2.7.
            call = torch.nn.Module.__call__

            def module_call(module, *args, **kwargs):
                in_backward = torch._C._current_graph_task_id() != -1
                if sites.idle() and not in_backward and threading.get_ident() == self._thread:
                    sites.forget_backward()
                    self._root_forward(module, args, kwargs)
                return call(module, *args, **kwargs)

            torch.nn.Module.__call__ = module_call
            self._undo.append(lambda: setattr(torch.nn.Module, "__call__", call))
            tracker.__enter__()
            self._undo.append(lambda: tracker.__exit__(None, None, None))
            pre = _optim.register_optimizer_step_pre_hook(self._optimizer_step)
            self._undo.append(pre.remove)
            post = _optim.register_optimizer_step_post_hook(self._own_state)
            self._undo.append(post.remove)
            mode = self._mode = _MetaMode(self)
            mode.__enter__()
            self._undo.append(lambda: mode.__exit__(None, None, None))
        except BaseException:
            self._take_down()
            self._recording.cancel()
            self._recording = None
            raise
        return self

    def _patch_torch(self) -> None:
        """What the block changes in torch, given back on leaving it."""

        def patch(owner: Any, name: str, value: Any) -> None:
            old = getattr(owner, name)
            setattr(owner, name, value)
            self._undo.append(lambda: setattr(owner, name, old))

        optim = _optim
        # Optimizers pick their implementation by the parameters' device: on a GPU, foreach
        # (the multi-tensor kernels, with their own temporaries); meta counts as a GPU here.
        foreach_devices = optim._get_foreach_kernels_supported_devices
        patch(optim, "_get_foreach_kernels_supported_devices", lambda: [*foreach_devices(), "meta"])
        # `fused=True` (Hugging Face Trainer's default AdamW) checks its parameters' device the
        # same way; an optimizer whose fused kernel has no CUDA version removes "cuda" from the
        # list, and then meta goes too.
        fused_devices = optim._get_fused_kernels_supported_devices
        patch(optim, "_get_fused_kernels_supported_devices", lambda: _DevicesWithMeta(fused_devices()))
        # autocast("cuda") without a GPU disables itself; inside the block meta is the GPU.
        amp_common = torch.cuda.amp.common
        patch(amp_common, "amp_definitely_not_available", lambda: False)
        patch(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
        # Code that asks autocast about its tensors' device (`x.device.type`) asks about meta.
        autocast_init = torch.autocast.__init__

        def init(this, device_type, *args, **kwargs):
            autocast_init(this, "cuda" if device_type == "meta" else device_type, *args, **kwargs)

        patch(torch.autocast, "__init__", init)
        for name in ("is_autocast_enabled", "get_autocast_dtype"):
            original = getattr(torch, name)

            def asked(*args, _original=original):
                if args and args[0] == "meta":
                    args = ("cuda", *args[1:])
                return _original(*args)

            patch(torch, name, asked)
        # MoE experts (torch._grouped_mm): a GPU runs any float dtype, bf16 in its fused kernel and
        # the others one matmul per group, into the same padded output. torch's meta kernel takes
        # bf16 only; in the block meta stands for the GPU. Registered for the block alone (torch
        # < 2.8 has no such op; one that refuses the override keeps its own kernel).
        self._block_meta_kernel("aten", "_grouped_mm", _grouped_mm_as_on_a_gpu)
        # Detection models' nms, where torchvision's ops are loaded: its own meta function refuses
        # meta tensors.
        self._block_meta_kernel("torchvision", "nms", self._largest.nms)
        self._libtorch_meta_kernels()
        # torch.compile'd code runs eagerly in the block, as the estimate of an eager step; its
        # compiler (dynamo) is imported by torch.compile, before the block or inside it.
        self._eager_compile()
        compile_ = torch.compile

        def compile_eagerly(*args, **kwargs):
            compiled = compile_(*args, **kwargs)
            self._eager_compile()
            return compiled

        patch(torch, "compile", compile_eagerly)

    def _block_meta_kernel(self, namespace: str, name: str, kernel: Any) -> None:
        """``kernel`` as the Meta kernel of ``namespace::name`` while the block runs, where the op
        exists; one whose Meta kernel refuses the override keeps its own."""
        if not _has_op(getattr(torch.ops, namespace), name):
            return
        lib = torch.library.Library(namespace, "IMPL")
        try:
            lib.impl(name, kernel, "Meta")
        except RuntimeError:
            pass
        self._undo.append(lib._destroy)

    def _libtorch_meta_kernels(self) -> None:
        """Python torch registers meta functions over libtorch's own Meta kernels of some 600 ops
        (torch/_meta_registrations.py): decompositions whose intermediates are meta tensors, which
        the block counts as GPU memory no GPU allocates (GELU's backward ten of them, cumsum one
        of rows x columns x columns, log_softmax, ReLU's backward, the losses, and nn.init's
        normal_ and uniform_ three and one, so every model built in the block...). In the block,
        libtorch's own kernels (what the command line runs, and what a GPU allocates) are active
        again: Python's library of them is taken down, then its functions registered again for the
        ops libtorch has no Meta kernel of, ``aten::nonzero`` the block's own (``_LargestResults``);
        on leaving, all of them again."""
        global _PYTHON_META
        try:
            import torch._meta_registrations as registrations

            library = registrations._meta_lib_dont_use_me_use_register_meta
            keys = frozenset(library._op_impls)  # "aten/add.Tensor/Meta"
            if _PYTHON_META is None or _PYTHON_META[0] != keys:
                functions = {}
                for key in keys:
                    namespace, name, _ = key.split("/")
                    packet, _, overload = name.partition(".")
                    op = getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")
                    functions[op] = op.py_kernels[torch._C.DispatchKey.Meta]
                _PYTHON_META = (keys, functions, None)
            functions = _PYTHON_META[1]
        except (ImportError, AttributeError, KeyError, ValueError):
            return  # another torch's layout: its meta functions stay

        # The block's own meta functions, for ops whose result Python's cannot size.
        own = {torch.ops.aten.nonzero.default: self._largest.nonzero}

        def register(kernels: dict) -> Any:
            lib = torch.library.Library("aten", "IMPL", "Meta")
            for op, kernel in kernels.items():
                lib.impl(op, kernel)
            return lib

        partial: list = []

        def restore() -> None:
            for lib in partial:
                lib._destroy()
            registrations._meta_lib_dont_use_me_use_register_meta = register(functions)

        library._destroy()
        self._undo.append(restore)  # before anything else can fail
        has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
        if _PYTHON_META[2] is None:  # the ops libtorch has no Meta kernel of, once Python's are down
            _PYTHON_META = (keys, functions, [op for op in functions if not has_kernel(op.name(), "Meta")])
        partial.append(register({op: own.get(op, functions[op]) for op in _PYTHON_META[2]}))
        # torch 2.6-2.8 have no Python meta function of them: the meta-via-CPU fallback's is there.
        partial.append(register({op: f for op, f in own.items() if op not in functions}))

    def _eager_compile(self) -> None:
        if self._stance is None and "torch._dynamo" in sys.modules:
            self._stance = torch.compiler.set_stance("force_eager")
            self._undo.append(lambda: self._stance.__exit__(None, None, None))

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
        finished = recording.finish(*self._options(), self.device_profile, self.gpu_memory, self.parallel)
        from ._estimate import Estimate

        self._finished = finished
        figures, text = json.loads(finished.json), finished.text
        if self._largest.calls:
            figures["largest_results"] = dict(self._largest.calls)
            calls = ", ".join(f"{op} ({n} call{'s' if n > 1 else ''})" for op, n in self._largest.calls.items())
            text = (
                f"{text.rstrip(chr(10))}\n  upper bound: {calls} sized their results by values a meta tensor does "
                "not have, and took the largest; a real run can peak well below this\n"
            )
        self.result = Estimate(figures, text)
        return False

    def _options(self) -> tuple:
        params: dict[int, torch.Tensor] = {}
        buffers: dict[int, torch.Tensor] = {}
        for m in self._roots.values():
            params.update((id(p), p) for p in m.parameters())
            buffers.update((id(b), b) for b in m.buffers())

        def nbytes(ts) -> int:
            return sum(t.numel() * t.element_size() for t in ts)

        trainable = [p for p in params.values() if p.requires_grad]
        optimizers = [o for o in (r() for r in self._optimizers.values()) if o is not None]
        state = 0
        for o in optimizers:
            for s in o.state.values():
                state += nbytes(v for v in s.values() if isinstance(v, torch.Tensor) and v.device.type == "meta")
        first = self._input[0] if self._input else None
        shape = list(first.shape) if first is not None else []
        is_index = first is not None and not (first.is_floating_point() or first.is_complex())
        dtypes = [p.dtype for p in params.values()]
        dtype = max(set(dtypes), key=dtypes.count) if dtypes else torch.float32
        precision = {torch.float16: "f16", torch.bfloat16: "bf16"}.get(dtype, "f32")
        if optimizers:
            optimizer = _OPTIMIZERS.get(type(optimizers[0]).__name__)
            if optimizer == "sgd" and optimizers[0].defaults.get("momentum"):
                optimizer = "momentum"
            if optimizer is None:  # named by the state it keeps per parameter byte
                ratio = state / max(nbytes(trainable), 1)
                optimizer = "adamw" if ratio >= 1.5 else "momentum" if ratio >= 0.5 else "sgd"
        else:
            optimizer = "sgd" if self._backward_ran else None
        sizes = {
            "param_count": sum(p.numel() for p in params.values()),
            "param_bytes": nbytes(params.values()),
            "buffer_bytes": nbytes(buffers.values()),
            "input_bytes": nbytes(self._input or []),
            "grad_bytes": nbytes(trainable) if self._backward_ran else 0,
            "optimizer_state_bytes": state,
        }
        return shape, is_index, precision, optimizer, sizes, self._sites.names

    def __str__(self) -> str:
        if self.result is None:
            return "Estimator(no result yet: run a block under `with`)"
        return str(self.result)

    def breakdown(self, depth: int | None = None) -> Any:
        """What each module and category held at the peak (see :meth:`Estimate.breakdown`)."""
        if self.result is None:
            raise RuntimeError("Estimator.breakdown(): no result yet (run a block under `with` first)")
        return self.result.breakdown(depth)
