"""``torch.compile``'d code in an ``Estimator`` block, estimated as compiled.

Dynamo traces the program's meta tensors as it traces CUDA ones (the block's torch-function mode
steps aside while it traces, ``_meta_mode``). A graph for inductor is then planned as inductor's
CPU backend plans it: AOTAutograd with inductor's decompositions and its min-cut partitioner
(``activation_memory_budget`` honoured), fusion, the order of its kernels and its buffer reuse. Its
kernels are never built nor run: the graph's own wrapper code runs on meta, allocating, reusing and
freeing the buffers inductor planned, where the block records them. So what a compiled forward
saves for its backward, and when each buffer is freed, is the compiled program's own. Other
backends (``eager``, ``aot_eager``, a program's own) run as they are, on meta.

Each graph that ran in the block is reported: its backend, what its forward saves for the
backward, and where dynamo broke the program's code before it (``Estimate["compiled"]``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import shutil
import sys
import types
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from . import _autocast
from ._load import native as _native

if TYPE_CHECKING:
    from ._meta_mode import MetaMode

#: Every graph planned on meta in this process, by number (a later block may run one again from
#: dynamo's cache, without compiling it).
_GRAPHS: dict[int, dict[str, Any]] = {}
_NUMBERS = itertools.count(1)

#: What planning on meta changes in inductor's options: no cache written or read (a cached graph
#: would be a real one, or ours reused by a real compile), no C++ wrapper nor autotuning (both
#: build and run kernels), one compile thread (no worker processes for kernels never built).
_PLANNING_OPTIONS = {
    "fx_graph_cache": False,
    "fx_graph_remote_cache": False,
    "cpp_wrapper": False,
    "max_autotune": False,
    "max_autotune_gemm": False,
    "max_autotune_pointwise": False,
    "compile_threads": 1,
}


def _cpp_compiler() -> dict[str, Any]:
    """Inductor's C++ compiler for planning, where the one it is configured with does not run
    (``CXX="ccache c++"``, a command line, is not a program): the first on ``PATH``. Planning builds
    no kernel, but inductor's CPU backend asks the compiler which vector instructions it has."""
    configured = [c for c in torch._inductor.config.cpp.cxx if c is not None]
    if any(shutil.which(c) for c in configured):
        return {}
    found = next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)
    return {"cpp.cxx": (found,)} if found else {}


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _meta_allocation(size, stride, dtype) -> torch.Tensor:
    """Inductor's buffer allocation (``empty_strided_cpu``) on meta, where the block records it (past
    the block's torch-function mode, which takes the program's own meta tensors for no memory)."""
    with torch._C.DisableTorchFunction():
        return torch.empty_strided(size, stride, dtype=dtype, device="meta")


def _nothing_on_meta(*args: Any, **kwargs: Any) -> None:
    """A fused kernel of the graph, or a layout check of its wrapper code: on meta there is nothing
    to compute or check (the wrapper code around a kernel allocates its buffers)."""


@contextlib.contextmanager
def _private_wrapper_modules() -> Iterator[None]:
    """Inductor's wrapper code loaded into a module of its own, with its kernels never built and its
    buffers on meta: nothing of it goes to inductor's module cache, where a real compile of the same
    graph would find it."""
    from torch._inductor import async_compile, codecache

    cache = codecache.PyCodeCache
    original = cache.__dict__["load_by_key_path"]

    def load(cls, key, path, linemap=None, attrs=None, *, set_sys_modules=None):
        module = types.ModuleType(f"gpu_mem_track_meta_{key}")
        module.__file__ = path
        with open(path) as f:
            code = compile(f.read(), path, "exec")
        kernels = async_compile.AsyncCompile
        builders = {name: kernels.__dict__[name] for name in ("cpp", "cpp_pybinding") if name in kernels.__dict__}
        for name in builders:
            setattr(kernels, name, lambda self, *a, **k: _nothing_on_meta)
        try:
            exec(code, module.__dict__)  # noqa: S102 - inductor's own generated wrapper, as its loader runs it
        finally:
            for name, builder in builders.items():
                setattr(kernels, name, builder)
        for name in ("empty_strided_cpu", "empty_strided_cpu_pinned", "empty_strided_cuda"):
            if name in module.__dict__:
                module.__dict__[name] = _meta_allocation
        # Views of the buffers as inductor makes them, not the live registry's (_registry).
        view = module.__dict__.get("reinterpret_tensor")
        if view is not None:
            module.__dict__["reinterpret_tensor"] = getattr(view, "__wrapped__", view)
        # Its layout checks are the CPU kernels' (the strides inductor planned): the block's meta
        # kernels may order an output's strides otherwise (attention's), never its size.
        for name in ("assert_size_stride", "assert_alignment"):
            if name in module.__dict__:
                module.__dict__[name] = _nothing_on_meta
        for name, value in (attrs or {}).items():
            setattr(module, name, value)
        return module

    cache.load_by_key_path = classmethod(load)
    try:
        yield
    finally:
        cache.load_by_key_path = original


def _fake_on_cpu(t: Any, fake_mode: Any) -> Any:
    """Dynamo's fake of a meta tensor as a fake CPU tensor of the same shape, strides and dtype, for
    inductor's CPU backend to plan (inductor has no meta backend)."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    if not isinstance(t, torch.Tensor) or t.device.type != "meta":
        return t
    with unset_fake_temporarily():
        elem = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="meta")
    fake = FakeTensor(fake_mode, elem, torch.device("cpu"))
    fake.requires_grad_(t.requires_grad)
    return fake


def _devices_on_cpu(gm: torch.fx.GraphModule) -> None:
    """The graph's meta devices (``torch.arange(n, device=x.device)``) as the CPU inductor plans for."""
    cpu = torch.device("cpu")

    def on_cpu(a: Any) -> Any:
        return cpu if isinstance(a, torch.device) and a.type == "meta" else a

    for node in gm.graph.nodes:
        node.args = torch.fx.node.map_aggregate(node.args, on_cpu)
        node.kwargs = torch.fx.node.map_aggregate(node.kwargs, on_cpu)
    gm.recompile()


def _as_under_cuda_autocast(func: Any) -> Any:
    """``func`` casting its arguments as ``autocast("cuda")`` would, where it is on while AOTAutograd
    traces the graph: autocast casts tensors of its own device only, and inductor plans with fake
    CPU ones. A fresh cast per call: the trace is a graph, whose casts are its own ops."""

    @functools.wraps(func)
    def cast(*args: Any, **kwargs: Any) -> Any:
        return _autocast.Casts().run(func, args, kwargs) if _autocast.enabled() else func(*args, **kwargs)

    return cast


def _autocast_on_cpu(gm: torch.fx.GraphModule) -> None:
    """The graph's ops that ``autocast("cuda")`` casts for, casting as it would on the GPU, where the
    graph can run under it (the program's autocast around the compiled code, or one inside it)."""
    inside = gm.graph.find_nodes(op="call_function", target=torch.amp.autocast_mode._enter_autocast)
    if not (_autocast.enabled() or inside):
        return
    for node in gm.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "__name__", "") in _autocast.CAST_OPS:
            node.target = _as_under_cuda_autocast(node.target)
        elif node.op == "call_method" and node.target in _autocast.CAST_OPS and hasattr(torch.Tensor, node.target):
            node.op, node.target = "call_function", _as_under_cuda_autocast(getattr(torch.Tensor, node.target))
    gm.recompile()


def _static(t: Any) -> bool:
    return not isinstance(t, torch.Tensor) or all(isinstance(d, int) for d in (*t.shape, *t.stride()))


def _where(frame: Any) -> str:
    return f"{frame.filename}:{frame.lineno}"


def _graph_info(gm: torch.fx.GraphModule, backend: str) -> dict[str, Any]:
    """A new graph's number and where dynamo broke the program's code before it, if it did."""
    number = next(_NUMBERS)
    reason = getattr(gm, "compile_subgraph_reason", None)
    info: dict[str, Any] = {"graph": number, "backend": backend, "saved_for_backward": 0, "graph_break": None}
    if reason is not None and getattr(reason, "graph_break", False) and reason.user_stack:
        why = str(reason.reason).strip().splitlines()
        info["graph_break"] = {"at": _where(reason.user_stack[-1]), "reason": why[0] if why else ""}
    _GRAPHS[number] = info
    return info


class CompiledSteps:
    """The block's compiled graphs: how torch.compile's backends plan on meta while the block runs,
    and which graphs ran."""

    #: The block recording now (one at a time in a process), on the thread that entered it.
    active: CompiledSteps | None = None

    def __init__(self, mode: MetaMode) -> None:
        self.ran: list[int] = []
        self._mode = mode

    def _arm(self, undo: list) -> None:
        """Once dynamo is loaded: its compiling is no memory of the program's (the fake tensors it
        and inductor trace with are meta tensors, unrecorded), and the block's reads of values from
        compiled code run as in eager code, untraced."""
        if self._mode.read_eagerly is not None or "torch._dynamo" not in sys.modules:
            return
        from torch._dynamo import convert_frame

        self._mode.read_eagerly = torch._dynamo.disable(self._mode._eager)
        compile_frame = convert_frame._compile

        @functools.wraps(compile_frame)
        def unrecorded(*args: Any, **kwargs: Any) -> Any:
            with _native.Unrecorded():
                return compile_frame(*args, **kwargs)

        convert_frame._compile = unrecorded
        undo.append(lambda: setattr(convert_frame, "_compile", compile_frame))

    @contextlib.contextmanager
    def compiling(self) -> Iterator[None]:
        """While dynamo and inductor compile: the CPU is the CPU (their pattern tables and constants
        are real tensors), and their fake tensors' meta storage is not the program's memory."""
        with self._mode.cpu_is_cpu(), _native.Unrecorded():
            yield

    def patch(self, undo: list) -> None:
        """Inductor's backend plans on meta for the block; given back through ``undo``."""
        self._arm(undo)
        compile_ = torch.compile

        def compile_in_block(*args: Any, **kwargs: Any) -> Any:
            compiled = compile_(*args, **kwargs)  # loads dynamo
            self._arm(undo)
            return compiled

        torch.compile = compile_in_block
        undo.append(lambda: setattr(torch, "compile", compile_))
        # The global module hooks torch.compile(module) warns of are the block's (its module
        # tracking), not the program's.
        warnings.filterwarnings("ignore", message=r"Using `torch.compile\(module\)` when there are global hooks")
        ours = warnings.filters[0]
        undo.append(lambda: _remove_filter(ours))
        wrapper = torch._TorchCompileInductorWrapper
        inductor_ = wrapper.__dict__["__call__"]

        def inductor(this, model_, inputs_, **kwargs):
            on_meta = any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in inputs_)
            if CompiledSteps.active is None or not on_meta:
                return inductor_(this, model_, inputs_, **kwargs)  # a graph of real tensors
            return CompiledSteps.active.plan(model_, inputs_, {**this.config, **(kwargs.get("config_patches") or {})})

        wrapper.__call__ = inductor
        undo.append(lambda: setattr(wrapper, "__call__", inductor_))
        CompiledSteps.active = self
        undo.append(self._close)

    def _close(self) -> None:
        CompiledSteps.active = None

    def plan(self, gm: torch.fx.GraphModule, inputs: list, options: dict) -> Any:
        """Inductor's plan of ``gm`` for its CPU backend, run on meta; the graph as its eager ops
        (with a warning) where inductor cannot plan it so."""
        from torch._guards import detect_fake_mode
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        info = _graph_info(gm, "inductor")
        if not all(_static(t) for t in inputs):
            return self._eager(gm, info, "its shapes are dynamic (symbolic), which planning on meta does not follow")
        fake_mode = detect_fake_mode(inputs)
        originals = [(n, n.op, n.target, n.args, n.kwargs) for n in gm.graph.nodes]
        _devices_on_cpu(gm)
        _autocast_on_cpu(gm)
        # The options this torch has (older ones lack some).
        ours = {k: v for k, v in _PLANNING_OPTIONS.items() if hasattr(torch._inductor.config, k)} | _cpp_compiler()
        planning = {**options, **ours}

        def inner(graph: torch.fx.GraphModule, example_inputs: list, **kwargs: Any) -> Any:
            if kwargs.get("is_backward"):
                # The backward's inputs other than the forward's own (primals) and the gradients
                # coming in (tangents): what the forward saved for it.
                saved = (n for n in graph.graph.find_nodes(op="placeholder") if not n.name.startswith(("primals", "tangents")))
                info["saved_for_backward"] = sum(_nbytes(n.meta.get("val")) for n in saved)
            # A backward is planned at its first call (AOTAutograd's lazy backward), not in dynamo.
            with self.compiling(), _private_wrapper_modules(), torch._inductor.config.patch(ours):
                return compile_fx_inner(graph, example_inputs, **kwargs)

        try:
            no_cache = {"enable_autograd_cache": False} if hasattr(torch._functorch.config, "enable_autograd_cache") else {}
            with self.compiling(), torch._functorch.config.patch(no_cache):
                compiled = compile_fx(gm, [_fake_on_cpu(t, fake_mode) for t in inputs], inner, planning)
        except Exception as e:  # noqa: BLE001 - the graph still runs, as its eager ops
            for node, op, target, args, kwargs in originals:
                node.op, node.target, node.args, node.kwargs = op, target, args, kwargs
            gm.recompile()
            return self._eager(gm, info, f"inductor could not plan it on meta ({type(e).__name__}: {e})")
        return _counted(compiled, info["graph"])

    def _eager(self, gm: torch.fx.GraphModule, info: dict, why: str) -> Any:
        info["backend"] = "eager"
        at = info["graph_break"]["at"] if info["graph_break"] else "the program"
        warnings.warn(
            f"Estimator: compiled graph {info['graph']} (after {at}) runs as its eager ops: {why}",
            RuntimeWarning,
            stacklevel=2,
        )
        return _counted(gm.forward, info["graph"])

    def summary(self) -> dict[str, Any] | None:
        """What compiled graphs ran in the block, or ``None`` when none did."""
        if not self.ran:
            return None
        graphs = [dict(_GRAPHS[n]) for n in self.ran]
        breaks = [g["graph_break"] for g in graphs if g["graph_break"]]
        return {"graphs": graphs, "graph_breaks": breaks}


def _remove_filter(entry: Any) -> None:
    if entry in warnings.filters:
        warnings.filters.remove(entry)
        getattr(warnings, "_filters_mutated", lambda: None)()  # the module's cache of them (3.9-3.12)


def _counted(run: Any, number: int) -> Any:
    """``run`` (a compiled graph) noting, at each call, that graph ``number`` ran in the block."""

    # Not its attributes: torch 2.6's dynamo follows ``_torchdynamo_orig_callable`` (set on a
    # disabled function) past wrappers, so a copied one made it call ``run`` and skip this.
    @functools.wraps(run, updated=())
    def graph(*args: Any, **kwargs: Any) -> Any:
        steps = CompiledSteps.active
        if steps is not None and number not in steps.ran:
            steps.ran.append(number)
        return run(*args, **kwargs)

    return graph


def summary_text(compiled: dict[str, Any]) -> str:
    """The estimate's lines about its compiled graphs."""
    graphs, breaks = compiled["graphs"], compiled["graph_breaks"]
    head = (
        f"  compiled     {len(graphs)} graph{'s' if len(graphs) != 1 else ''} of torch.compile,"
        f" {len(breaks)} graph break{'s' if len(breaks) != 1 else ''}"
        " (inductor's plan for its CPU backend, run on meta)\n"
    )
    lines = [head]
    for g in graphs:
        line = f"    graph {g['graph']} ({g['backend']}): its forward saves {g['saved_for_backward'] / 2**20:.1f} MiB for the backward"
        if g["graph_break"]:
            line += f"; after a graph break at {g['graph_break']['at']}: {g['graph_break']['reason']}"
        lines.append(line + "\n")
    return "".join(lines)
