"""The torch-function mode of an ``Estimator`` block: CUDA devices become meta (what the program
makes on meta itself is no GPU memory, and unrecorded), the CPU is the CPU
where the caller's data is written or a real tensor's values are read, ``Tensor.backward`` starts
the backward phase, autocast("cuda") casts meta tensors (``_autocast``), and constant inputs keep
their values (``_known_values``).

Host memory: once the program keeps memory on the host while its GPU computes (FSDP's CPU
offload, which ``_distributed`` tags), moving a tensor between the CPU and the GPU copies it, and
what an op makes from host memory (the CPU optimizer step's state) is host memory: tagged, left
out of the GPU figures and counted in ``host_peak``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from . import _autocast
from ._known_values import KnownValues
from ._load import native as _native
from ._value_ops import READS, VALUE_SIZED, constant_of

if TYPE_CHECKING:
    from ._estimator import Estimator

META = torch.device("meta")

#: Constructors that write the caller's data into the CPU tensor they make: they run with the CPU
#: being the CPU (a meta tensor has no memory to write into); asked for a GPU, the result is then
#: copied to meta, as a real run copies it to the GPU.
_FROM_DATA = frozenset({"tensor", "as_tensor", "asarray", "new_tensor", "frombuffer", "from_numpy"})

#: Reads of a tensor's values into Python.
_READ_REAL = frozenset({"tolist", "numpy", "item", "__bool__", "__int__", "__float__", "__index__", "__array__"})


def meta_device(d: Any) -> Any:
    """A CUDA device (``"cuda"``, ``"cuda:1"``, ``torch.device("cuda")``) as meta; others as they are."""
    if isinstance(d, torch.device):
        return META if d.type == "cuda" else d
    if isinstance(d, str) and (d == "cuda" or d.startswith("cuda:")):
        return META
    return d


def _is_meta(d: Any) -> bool:
    """Whether ``d`` names the meta device itself (not a CUDA device the block makes meta)."""
    return (isinstance(d, torch.device) and d.type == "meta") or d == "meta"


#: Ops that make a tensor like their first argument, on its device (FSDP2 pads a shard so).
_LIKE = frozenset(
    {"new_zeros", "new_empty", "new_ones", "new_full", "new_empty_strided"}
    | {"empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "clone"}
)


def _on_program_meta(args: tuple) -> bool:
    """Whether the op's first tensor argument is one the program made on meta itself (its storage
    unrecorded)."""
    first = args[0] if args else None
    if isinstance(first, (list, tuple)) and first:
        first = first[0]
    if not isinstance(first, torch.Tensor) or first.device.type != "meta":
        return False
    try:
        storage = first.untyped_storage()
    except (RuntimeError, NotImplementedError):  # a wrapper subclass without storage (DTensor)
        return False
    return _native.meta_storage_recorded(storage._cdata) is False


def _local(t: Any) -> Any:
    """A DTensor's local shard (what a rank's memory holds); another tensor itself."""
    return getattr(t, "_local_tensor", t)


def _storage_id(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # a wrapper subclass without storage
        return None


def _meta_tensors(tree: Any) -> list[torch.Tensor]:
    """The meta tensors in ``tree`` (args, kwargs, an op's result), DTensors as their shards."""
    leaves = (_local(x) for x in tree_leaves(tree))
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.device.type == "meta"]


def _move_target(name: str, args: tuple, kwargs: dict) -> str | None:
    """Where ``Tensor.to``, ``.cuda`` or ``.cpu`` moves its tensor: ``"gpu"``, ``"host"``, or
    ``None`` when it names no device (a cast)."""
    if name in ("cuda", "cpu"):
        return "gpu" if name == "cuda" else "host"
    asked = [kwargs["device"]] if kwargs.get("device") is not None else []
    asked += [a for a in args[1:] if isinstance(a, (str, torch.device)) or (isinstance(a, int) and not isinstance(a, bool))]
    if not asked:
        return None
    device = torch.device("cuda", asked[0]) if isinstance(asked[0], int) else torch.device(asked[0])
    return "host" if device.type == "cpu" else "gpu"


class MetaMode(TorchFunctionMode):
    """Sees every torch call of the block: CUDA devices become meta before torch would initialise
    CUDA for them, ``Tensor.backward`` starts the backward phase, autocast("cuda") casts meta
    tensors as it casts CUDA ones, and constant inputs keep their values (``_known_values``)."""

    def __init__(self, estimator: Estimator) -> None:
        super().__init__()
        self._estimator = estimator
        self._casts = _autocast.Casts()
        self._paused = 0
        self.known = KnownValues(self.cpu_is_cpu)
        # The storages of the real tensors the block made from data (``torch.tensor(2.6)``): a
        # parameter on one of them (CLIP's ``logit_scale``) was made in the block, not before.
        self._from_data: set[int] = set()
        # Whether the program made tensors on meta itself: only then are ops' inputs looked at.
        self._program_meta = False
        # Whether the program keeps memory on the host (FSDP's CPU offload): only then are moves
        # copies and ops' inputs looked at for host memory.
        self.offloads = False
        # `_eager` as dynamo calls it from compiled code without tracing it (``torch._dynamo.disable``),
        # once dynamo is loaded (``_compiled``).
        self.read_eagerly: Any = None

    def put_on_host(self, t: Any) -> None:
        """Tags ``t``'s allocation (a DTensor's shard) as host memory: never the GPU's."""
        t = _local(t)
        if isinstance(t, torch.Tensor) and t.device.type == "meta":
            _native.recording_host(t._cdata)

    def on_host(self, t: Any) -> bool:
        """Whether ``t``'s allocation (a DTensor's shard) is host memory."""
        t = _local(t)
        return isinstance(t, torch.Tensor) and t.device.type == "meta" and _native.recording_is_host(t._cdata)

    def _moved(self, name: str, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """A move between the host and the GPU, as the GPU run copies it: into a new allocation,
        on the host or not; ``None`` for the rest (a cast, a move that stays where it is)."""
        source = args[0]
        target = _move_target(name, args, kwargs)
        if target is None or _local(source) is not source:  # a cast, or a DTensor (moved shard by shard)
            return None
        if (target == "host") == self.on_host(source):
            return None
        dtype = kwargs.get("dtype") or next((a for a in args[1:] if isinstance(a, torch.dtype)), None)
        out = torch.Tensor.to(source, META, dtype=dtype, copy=True)
        if target == "host":
            self.put_on_host(out)
        return out

    def _follow_host(self, args: tuple, kwargs: dict, out: Any) -> None:
        """What an op makes from host memory is host memory (the optimizer step on offloaded
        shards), unless it asked for the GPU; what it wrote in place stays what it was."""
        if kwargs.get("device") is not None and torch.device(kwargs["device"]).type != "cpu":
            return
        inputs = _meta_tensors((args, kwargs))
        if not any(self.on_host(t) for t in inputs):
            return
        written = {_storage_id(t) for t in inputs}
        for t in _meta_tensors(out):
            if _storage_id(t) not in written:
                self.put_on_host(t)

    def made_from_data(self, t: torch.Tensor) -> bool:
        """Whether ``t`` (a real tensor) is on the storage of one the block made from data."""
        return t.untyped_storage()._cdata in self._from_data

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if torch.compiler.is_dynamo_compiling():
            return self._traced(func, types, args, kwargs or {})
        return self._eager(func, types, args, kwargs or {})

    def _traced(self, func, types, args, kwargs):
        """What dynamo traces of a torch call in ``torch.compile``'d code (``_compiled``): the call
        itself, CUDA devices as meta; a read of values into Python leaves the graph (a graph break)
        and runs as in the block's eager code."""
        name = getattr(func, "__name__", "")
        if name in _READ_REAL or name in READS or name in VALUE_SIZED:
            if self.read_eagerly is None:
                raise RuntimeError(f"Estimator: torch.compile'd code reads a tensor's values ({name}) before dynamo is loaded")
            return self.read_eagerly(func, types, args, kwargs)
        if "device" in kwargs:
            kwargs = {**kwargs, "device": meta_device(kwargs["device"])}
            if name in _FROM_DATA and _is_meta(kwargs["device"]):
                # Dynamo makes a real tensor, not a fake one, of data put on meta directly: made
                # on the CPU, then moved, it is the graph's.
                return func(*args, **{**kwargs, "device": "cpu"}).to(META)
        if name == "cuda":
            return torch.Tensor.to(args[0], META)
        if name == "to" and len(args) > 1:
            args = (args[0], META if isinstance(args[1], int) and not isinstance(args[1], bool) else meta_device(args[1]), *args[2:])
        return func(*args, **kwargs)

    def _eager(self, func, types, args, kwargs):
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
            with self.cpu_is_cpu():
                array = self.known.numpy(args[0])
            return array if name == "numpy" or len(args) < 2 or args[1] is None else array.astype(args[1])
        moved = None
        if self.offloads and name in ("to", "cuda", "cpu") and args and isinstance(args[0], torch.Tensor):
            moved = self._moved(name, args, kwargs)
        out = self._call(func, name, args, kwargs) if moved is None else moved
        if self.offloads and moved is None:
            self._follow_host(args, kwargs, out)
        if name in ("cuda", "to") and args and isinstance(args[0], torch.Tensor) and args[0].device.type != "meta":
            with self.cpu_is_cpu():  # while the tensor's values are read
                self.known.set(out, constant_of(args[0]))
            self.known.set_real(out, args[0])
        else:
            self.known.follow(name, args, kwargs, out)
            self.known.follow_values(func, name, args, kwargs, out)
        return out

    @contextlib.contextmanager
    def cpu_is_cpu(self) -> Iterator[None]:
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
            asked = kwargs["device"]
            kwargs = {**kwargs, "device": meta_device(asked)}
            if _is_meta(asked):
                # The program's own meta device (`with torch.device("meta"):` before
                # `fully_shard` and `to_empty`): no memory on the GPU, so none recorded.
                self._program_meta = True
                with _native.Unrecorded():
                    return func(*args, **kwargs)
        elif name == "_has_compatible_shallow_copy_type" or (
            self._program_meta and name in _LIKE and _on_program_meta(args)
        ):
            # What the program makes like its own meta tensors, on their device (FSDP2's padded
            # shards of a model built on meta), is no GPU memory either; nor are the global-shape
            # fakes DTensor answers `Module._apply`'s type check on (meta in a GPU run too).
            with _native.Unrecorded():
                return func(*args, **kwargs)
        if name == "cuda":  # Tensor.cuda(device=None, non_blocking=False, ...): stays on meta
            return torch.Tensor.to(args[0], META)
        if name == "pin_memory":  # meta memory cannot be pinned (and needs no pinning)
            return args[0]
        if name == "to" and len(args) > 1:
            device = args[1]
            if isinstance(device, int) and not isinstance(device, bool):
                device = META  # x.to(0): CUDA device 0
            args = (args[0], meta_device(device), *args[2:])
        # A sampler's shuffle (torch.randperm with its own generator, DataLoader's RandomSampler)
        # is the data pipeline's: its indices are read with `.tolist()`, so they are real. So is
        # reading a real tensor's values (`.tolist()` copies it first, which would be meta).
        real_read = name in _READ_REAL and args and isinstance(args[0], torch.Tensor) and args[0].device.type != "meta"
        if name in _FROM_DATA or real_read or (name == "randperm" and kwargs.get("generator") is not None):
            with self.cpu_is_cpu():
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
            return self._casts.run(func, args, kwargs)
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
        with self.cpu_is_cpu():
            total = int(real.sum())
            if not single and real.numel() == 1:
                dim = args[2] if len(args) > 2 else kwargs.get("dim")
                total = int(real.reshape(-1)[0]) * (args[0].numel() if dim is None else args[0].shape[dim])
        return {**kwargs, "output_size": total}

