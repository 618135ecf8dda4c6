"""Values an estimate knows although its tensors are meta: constant inputs, such as an all-ones
attention mask, followed through the few ops that code applies to them before asking for a Python
value.

A meta tensor holds no data, so ``bool(t)`` or ``t.item()`` reads 0 and the estimate counts the
read. Models branch on such reads to pick a kernel: Hugging Face drops an attention mask that
masks nothing (``mask.all()``, ``mask.sum() == mask.numel()``) and then runs scaled-dot-product
attention without one, which on a GPU is the flash kernel. Reading 0 there keeps the mask and
takes another path than the GPU would. An integer or bool tensor whose elements are all equal
when the program hands it to the device keeps its value here, as does a tensor made filled
(``torch.ones``, ``zeros``, ``full`` and their ``_like`` and ``new_`` forms), and so does what
views, casts, sums, comparisons and negations make of them; a Python read of such a
one-element tensor returns its value. A write into a known tensor (an in-place op, ``x[i] = v``,
``out=``) forgets it and every tensor on its storage. Nothing else is known: other reads still
read 0.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

#: Largest input checked for being constant (elements): attention masks and ids, not activations.
_MAX_CHECKED = 1 << 22

#: Ops whose result holds the same value as their first argument (views, copies, casts).
_SAME_VALUE = frozenset(
    {
        "__getitem__", "clone", "contiguous", "detach", "view", "reshape", "expand", "expand_as",
        "unsqueeze", "squeeze", "flatten", "transpose", "permute", "narrow", "to", "cuda", "bool",
        "long", "int", "float", "half", "bfloat16", "type", "type_as",
    }
)  # fmt: skip
_COMPARISONS = {
    "eq": operator.eq, "__eq__": operator.eq, "ne": operator.ne, "__ne__": operator.ne,
    "lt": operator.lt, "__lt__": operator.lt, "le": operator.le, "__le__": operator.le,
    "gt": operator.gt, "__gt__": operator.gt, "ge": operator.ge, "__ge__": operator.ge,
}  # fmt: skip
_ARITHMETIC = {
    "add": operator.add, "__add__": operator.add, "__radd__": operator.add, "sub": operator.sub,
    "__sub__": operator.sub, "mul": operator.mul, "__mul__": operator.mul, "__rmul__": operator.mul,
}  # fmt: skip
#: Factories of tensors filled with one value: that value, from their arguments.
_FILLED = {
    "ones": lambda a, k: 1, "ones_like": lambda a, k: 1, "new_ones": lambda a, k: 1,
    "zeros": lambda a, k: 0, "zeros_like": lambda a, k: 0, "new_zeros": lambda a, k: 0,
    "full": lambda a, k: _scalar(k["fill_value"] if "fill_value" in k else a[1] if len(a) > 1 else None),
    "full_like": lambda a, k: _scalar(k["fill_value"] if "fill_value" in k else a[1] if len(a) > 1 else None),
    "new_full": lambda a, k: _scalar(k["fill_value"] if "fill_value" in k else a[2] if len(a) > 2 else None),
}  # fmt: skip
#: Python reads of a tensor's value (``tolist`` aside: ``KnownValues.tolist``).
READS = frozenset({"__bool__", "item", "__int__", "__float__", "__index__"})


class KnownValues:
    """The constant value of each meta tensor that has one (a Python scalar)."""

    def __init__(self) -> None:
        self._values: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def set(self, meta: Any, value: Any) -> None:
        """``meta`` holds ``value`` in every element (nothing is noted for ``None``)."""
        if value is not None and isinstance(meta, torch.Tensor) and meta.device.type == "meta":
            self._values[meta] = value

    def value(self, t: Any) -> Any:
        """The known value of ``t`` (a Python scalar), or ``None``."""
        if isinstance(t, torch.Tensor):
            return self._values.get(t)
        if isinstance(t, (bool, int, float)):
            return t
        return None

    def read(self, name: str, t: torch.Tensor) -> tuple[bool, Any]:
        """``(True, the Python value)`` when ``name`` (``__bool__``, ``item``, ...) reads a known
        0-dimensional (or one-element) tensor; ``(False, None)`` otherwise."""
        v = self._values.get(t)
        if v is None or t.numel() != 1:
            return False, None
        if name == "__bool__":
            return True, bool(v)
        if name in ("__int__", "__index__"):
            return True, int(v)
        if name == "__float__":
            return True, float(v)
        return True, _as_dtype(v, t.dtype)

    def tolist(self, t: torch.Tensor) -> Any:
        """``t.tolist()`` of a meta tensor: its known value in every element, else zeros (one
        read, counted as ``.item()`` counts it)."""
        v = self._values.get(t)
        if v is None:
            v = t.reshape(-1)[0].item() if t.numel() else 0  # reads 0, and counts the read
        v = _as_dtype(v, t.dtype)

        def filled(shape: tuple) -> Any:
            return [filled(shape[1:]) for _ in range(shape[0])] if shape else v

        return filled(tuple(t.shape))

    def follow(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        """Records the value of ``out``, the result of ``name(*args, **kwargs)``, where it follows
        from known ones."""
        if _writes(name, kwargs):
            # An in-place op or out=: its target (and every view of the same storage) no longer
            # holds what was known.
            target = kwargs.get("out", args[0] if args else None)
            self._forget(target)
            return
        if not isinstance(out, torch.Tensor) or out.device.type != "meta":
            return
        if name in _FILLED:  # a factory (on the CPU too: in the block the CPU means meta)
            self.set(out, _FILLED[name](args, kwargs))
            return
        first = self.value(args[0]) if args and isinstance(args[0], torch.Tensor) else None
        if first is None:
            return
        result = None
        if name in _SAME_VALUE:
            result = first
        elif name in ("__invert__", "bitwise_not", "logical_not"):
            result = (not first) if isinstance(first, bool) or name == "logical_not" else ~first
        elif name in ("all", "any") and not _has_dim(args, kwargs):
            result = bool(first) if args[0].numel() else name == "all"
        elif name == "sum" and not _has_dim(args, kwargs):
            result = first * args[0].numel()
        elif name in ("max", "min", "amax", "amin") and not _has_dim(args, kwargs) and args[0].numel():
            result = first
        elif name in _COMPARISONS and len(args) > 1:
            other = self.value(args[1])
            if other is not None:
                result = _COMPARISONS[name](first, other)
        elif name in _ARITHMETIC and len(args) > 1:
            other = self.value(args[1])
            if other is not None:
                result = _ARITHMETIC[name](first, other)
        if result is None:
            return
        self._values[out] = _as_dtype(result, out.dtype)

    def _forget(self, target: Any) -> None:
        if not self._values:  # nothing known (an optimizer's foreach step writes hundreds)
            return
        targets = target if isinstance(target, (list, tuple)) else (target,)
        storages = {t.untyped_storage()._cdata for t in targets if isinstance(t, torch.Tensor) and t.device.type == "meta"}
        for known in [k for k in self._values if k.untyped_storage()._cdata in storages]:
            del self._values[known]


def constant_of(real: Any) -> Any:
    """The value every element of ``real`` holds, for an integer or bool tensor with data whose
    elements are all equal (a Python scalar); else ``None``."""
    if not isinstance(real, torch.Tensor) or real.device.type == "meta":
        return None
    if real.dtype.is_floating_point or real.is_complex() or real.numel() == 0 or real.numel() > _MAX_CHECKED:
        return None
    first = real.reshape(-1)[0]
    return first.item() if bool((real == first).all()) else None


def _as_dtype(v: Any, dtype: torch.dtype) -> Any:
    """``v`` as a Python value of a tensor of ``dtype`` (as ``.item()`` gives it)."""
    if dtype == torch.bool:
        return bool(v)
    if dtype.is_floating_point:
        return float(v)
    return v if dtype.is_complex else int(v)


def _writes(name: str, kwargs: dict) -> bool:
    """Whether ``name`` writes into its first argument (``add_``, ``x[i] = v``, ``x += 1``) or
    into ``out=``."""
    if "out" in kwargs:
        return True
    if name.startswith("__"):
        return name == "__setitem__" or (name.startswith("__i") and name not in ("__index__", "__int__", "__invert__"))
    return name.endswith("_") and name not in _KEEP_VALUES


#: In-place methods that change a tensor's flags, not its values.
_KEEP_VALUES = frozenset({"requires_grad_", "detach_", "share_memory_", "rename_", "retain_grad_"})


def _scalar(v: Any) -> Any:
    return v if isinstance(v, (bool, int, float)) else None


def _has_dim(args: tuple, kwargs: dict) -> bool:
    return len(args) > 1 or "dim" in kwargs or "axis" in kwargs
