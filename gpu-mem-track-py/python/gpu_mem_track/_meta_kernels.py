"""The meta kernels of an ``Estimator`` block: meta stands for the GPU there.

- libtorch's own Meta kernels active again over Python torch's meta functions
  (:func:`libtorch_meta_kernels`), which decompose into meta intermediates no GPU allocates;
- ``aten::_grouped_mm`` as the CUDA kernel allocates its result;
- :class:`LargestResults`: ops whose result's size depends on values a meta tensor does not have
  (``aten::nonzero``, ``torchvision::nms``) take their largest result, with a warning.

Each is registered for the block alone: what registers it appends what takes it down to ``undo``.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ._estimator import Estimator

# Python torch's meta functions (the keys of its library, op -> function) and the ops among them
# libtorch has no Meta kernel of: read by the first block (21.6 of the 37 ms its entry took), kept
# while the library holds the same ops.
_PYTHON_META: tuple[frozenset, dict, list | None] | None = None


def grouped_mm_as_on_a_gpu(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
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


def has_op(namespace: Any, name: str) -> bool:
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


class LargestResults:
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


def block_meta_kernel(undo: list, namespace: str, name: str, kernel: Any) -> None:
    """``kernel`` as the Meta kernel of ``namespace::name`` while the block runs, where the op
    exists; one whose Meta kernel refuses the override keeps its own."""
    if not has_op(getattr(torch.ops, namespace), name):
        return
    lib = torch.library.Library(namespace, "IMPL")
    try:
        lib.impl(name, kernel, "Meta")
    except RuntimeError:
        pass
    undo.append(lib._destroy)


def libtorch_meta_kernels(undo: list, largest: LargestResults) -> None:
    """Python torch registers meta functions over libtorch's own Meta kernels of some 600 ops
    (torch/_meta_registrations.py): decompositions whose intermediates are meta tensors, which
    the block counts as GPU memory no GPU allocates (GELU's backward ten of them, cumsum one
    of rows x columns x columns, log_softmax, ReLU's backward, the losses, and nn.init's
    normal_ and uniform_ three and one, so every model built in the block...). In the block,
    libtorch's own kernels (what the command line runs, and what a GPU allocates) are active
    again: Python's library of them is taken down, then its functions registered again for the
    ops libtorch has no Meta kernel of, ``aten::nonzero`` the block's own (``LargestResults``);
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
    own = {torch.ops.aten.nonzero.default: largest.nonzero}

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
    undo.append(restore)  # before anything else can fail
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    if _PYTHON_META[2] is None:  # the ops libtorch has no Meta kernel of, once Python's are down
        _PYTHON_META = (keys, functions, [op for op in functions if not has_kernel(op.name(), "Meta")])
    partial.append(register({op: own.get(op, functions[op]) for op in _PYTHON_META[2]}))
    # torch 2.6-2.8 have no Python meta function of them: the meta-via-CPU fallback's is there.
    partial.append(register({op: f for op, f in own.items() if op not in functions}))

