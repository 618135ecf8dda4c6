"""The ops an estimate's known values (``_known_values``) go through, by what they do to values,
and the rules on tensors with data those values start from: which are checked for being constant
(:func:`constant_of`), which keep their real values, which ops write into their argument.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

#: Largest input checked for being constant (elements): attention masks and ids, not activations.
MAX_CHECKED = 1 << 22
#: Largest float tensor whose values are kept (elements): scalars and tables such as a rotary
#: embedding's, not images or activations.
MAX_FLOATS = 1 << 16
#: Factories whose values the block computes (small ones): model code computes architecture
#: from them (timm's RegNet widths from torch.arange, drop-path rates from torch.linspace).
VALUE_FACTORIES = frozenset({"arange", "linspace", "logspace", "eye"})

#: Ops whose result holds the same value as their first argument (views, copies, casts).
SAME_VALUE = frozenset(
    {
        "__getitem__", "clone", "contiguous", "detach", "view", "reshape", "expand", "expand_as",
        "unsqueeze", "squeeze", "flatten", "transpose", "permute", "narrow", "to", "cuda", "bool",
        "long", "int", "float", "half", "bfloat16", "type", "type_as",
    }
)  # fmt: skip
COMPARISONS = {
    "eq": operator.eq, "__eq__": operator.eq, "ne": operator.ne, "__ne__": operator.ne,
    "lt": operator.lt, "__lt__": operator.lt, "le": operator.le, "__le__": operator.le,
    "gt": operator.gt, "__gt__": operator.gt, "ge": operator.ge, "__ge__": operator.ge,
}  # fmt: skip
ARITHMETIC = {
    "add": operator.add, "__add__": operator.add, "__radd__": operator.add, "sub": operator.sub,
    "__sub__": operator.sub, "__rsub__": lambda a, b: b - a, "rsub": lambda a, b: b - a,
    "mul": operator.mul, "__mul__": operator.mul, "__rmul__": operator.mul,
}  # fmt: skip
#: Bitwise and logical ops of two known values (a generation loop's stop flags:
#: ``unfinished & ~is_done``, ``is_done | criterion``).
BITWISE = {
    "__and__": operator.and_, "__rand__": operator.and_, "bitwise_and": operator.and_,
    "__or__": operator.or_, "__ror__": operator.or_, "bitwise_or": operator.or_,
    "__xor__": operator.xor, "__rxor__": operator.xor, "bitwise_xor": operator.xor,
    "logical_and": lambda a, b: bool(a) and bool(b), "logical_or": lambda a, b: bool(a) or bool(b),
    "logical_xor": lambda a, b: bool(a) != bool(b),
}  # fmt: skip
#: Element-wise ops whose nonzero elements are at most the sum (``OR``) or the smaller (``AND``)
#: of their operands'.
OR = frozenset({"__or__", "__ror__", "bitwise_or", "logical_or"})
AND = frozenset({"__and__", "__rand__", "bitwise_and", "logical_and", "mul", "__mul__", "__rmul__"})
#: Ops computed on the real values of their arguments where every tensor argument has them.
ON_VALUES = (
    SAME_VALUE
    | frozenset(COMPARISONS)
    | frozenset(ARITHMETIC)
    | OR
    | AND
    | frozenset(
        {
            "__invert__", "bitwise_not", "logical_not", "__xor__", "bitwise_xor", "logical_xor", "all", "any",
            "_is_all_true", "_is_any_true",
            "sum", "cumsum", "max", "min", "amax", "amin", "argmax", "argmin", "count_nonzero", "masked_fill",
            "isin", "clamp", "abs", "neg", "__neg__", "__floordiv__", "floor_divide", "remainder", "__mod__",
            "eq", "ne", "ge", "gt", "le", "lt", "where", "diff", "roll", "flip", "repeat", "repeat_interleave",
            "index_select", "gather", "cat", "stack", "split", "chunk", "tril", "triu", "ones_like", "zeros_like",
            "unbind", "pad", "cumprod", "prod", "__truediv__", "div", "__pow__", "pow", "minimum", "maximum", "sign",
            "__rtruediv__", "__rpow__", "round", "floor", "ceil", "trunc", "log", "log2", "exp", "sqrt", "rsqrt",
            "reciprocal", "sin", "cos", "mean", "unique", "outer", "matmul", "__matmul__", "einsum",
        }
    )
)  # fmt: skip
#: Ops whose results' sizes depend on their inputs' values: where every input has real values,
#: the result is computed on them, and its meta twin takes the real size (the meta kernel's
#: would be the largest).
VALUE_SIZED = frozenset({"unique", "unique_consecutive", "masked_select", "bincount"})
#: Factories of tensors filled with one value: that value, from their arguments.
FILLED = {
    "ones": lambda a, k: 1, "ones_like": lambda a, k: 1, "new_ones": lambda a, k: 1,
    "zeros": lambda a, k: 0, "zeros_like": lambda a, k: 0, "new_zeros": lambda a, k: 0,
    "full": lambda a, k: _scalar(k["fill_value"] if "fill_value" in k else a[1] if len(a) > 1 else None),
    "full_like": lambda a, k: _scalar(k["fill_value"] if "fill_value" in k else a[1] if len(a) > 1 else None),
    "new_full": lambda a, k: _scalar(k["fill_value"] if "fill_value" in k else a[2] if len(a) > 2 else None),
}  # fmt: skip
#: Python reads of a tensor's value (``tolist`` aside: ``KnownValues.tolist``).
READS = frozenset({"__bool__", "item", "__int__", "__float__", "__index__"})


def constant_of(real: Any) -> Any:
    """The value every element of ``real`` holds, for an integer or bool tensor with data whose
    elements are all equal (a Python scalar); else ``None``."""
    if not isinstance(real, torch.Tensor) or real.device.type == "meta":
        return None
    if real.dtype.is_floating_point or real.is_complex() or real.numel() == 0 or real.numel() > MAX_CHECKED:
        return None
    first = real.reshape(-1)[0]
    return first.item() if bool((real == first).all()) else None


def as_dtype(v: Any, dtype: torch.dtype) -> Any:
    """``v`` as a Python value of a tensor of ``dtype`` (as ``.item()`` gives it)."""
    if dtype == torch.bool:
        return bool(v)
    if dtype.is_floating_point:
        return float(v)
    return v if dtype.is_complex else int(v)


def writes(name: str, kwargs: dict) -> bool:
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


def has_dim(args: tuple, kwargs: dict) -> bool:
    return len(args) > 1 or "dim" in kwargs or "axis" in kwargs


def basic_index(index: tuple) -> bool:
    """Whether ``t[index]`` is a view (ints, slices, None, ...): it cannot repeat an element."""
    parts = index[0] if len(index) == 1 and isinstance(index[0], tuple) else index
    return all(p is None or p is Ellipsis or isinstance(p, (int, slice)) for p in parts)


def small_exact(t: Any) -> bool:
    """A tensor with data whose values are kept: integers or bools of at most ``MAX_CHECKED``
    elements, floats of at most ``MAX_FLOATS``."""
    if not isinstance(t, torch.Tensor) or t.device.type == "meta" or t.is_complex():
        return False
    return t.numel() <= (MAX_FLOATS if t.dtype.is_floating_point else MAX_CHECKED)


def checks_floats(float_checks: WeakIdKeyDictionary, name: str, args: tuple) -> bool:
    """Whether ``name(*args)`` (a bool result) checks float values: a comparison or predicate of
    floats, or a view or conjunction of such checks."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors:
        return False
    if name in COMPARISONS or name in ("isfinite", "isclose", "isreal"):
        return any(t.dtype.is_floating_point for t in tensors)
    if name in SAME_VALUE or name in AND:
        return all(t in float_checks for t in tensors)
    return False
