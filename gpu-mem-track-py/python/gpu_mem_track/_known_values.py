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

Integer and bool tensors the program made from data (token ids, labels, masks: ``torch.tensor``, a
tokenizer's output) keep their real values when they move to meta, up to ``_value_ops.MAX_CHECKED``
elements, and so does what element-wise ops, views, casts and reductions (``_value_ops.ON_VALUES``)
make of them, computed on the CPU from those values. A Python read of such a tensor reads the real
value, and ``nonzero`` of it (``x[ids == image_token]``, ``torch.where(labels != -100)``) takes its
real count: a vision-language model checks that its image tokens match its image features so.

Where no value is known, the most nonzero elements a tensor can hold sometimes is, and sizes what
``nonzero`` returns (``torch.where(mask)``, ``x[mask]``). Samplers build masks that way: zeros,
then ``mask[idx] = 1`` for ``k`` sampled indices, then ``pos | neg``: at most ``k`` (and the sum)
nonzero elements, where reading the values would give every element. torchvision's detection
heads sample 512 regions an image so; without the count their box and mask heads run on every
proposal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ._value_ops import (
    AND,
    ARITHMETIC,
    BITWISE,
    COMPARISONS,
    FILLED,
    MAX_CHECKED,
    MAX_FLOATS,
    ON_VALUES,
    OR,
    SAME_VALUE,
    VALUE_FACTORIES,
    as_dtype,
    basic_index,
    checks_floats,
    has_dim,
    small_exact,
    writes,
)


class KnownValues:
    """The constant value of each meta tensor that has one (a Python scalar), the real values of
    small integer and bool ones, and the most nonzero elements of others.

    ``real_values``: a context in which CPU ops run on real CPU tensors (the estimate's recording
    paused); the real values are computed and read there."""

    def __init__(self, real_values: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext) -> None:
        self._values: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._real: WeakIdKeyDictionary = WeakIdKeyDictionary()  # meta tensor -> its real values (CPU)
        self._at_most: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> most nonzero elements
        # Checks of float values (`boxes[:, 2:] >= boxes[:, :2]`, `x.isfinite()`), which a working
        # program passes: `.all()` of one, and torch._check_tensor_all of anything, reads true.
        self._float_checks: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._presumed_true: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._real_values = real_values

    def set_real(self, meta: Any, real: Any) -> None:
        """``meta`` holds the values of ``real`` (a tensor with data), kept where small enough."""
        if isinstance(meta, torch.Tensor) and meta.device.type == "meta" and small_exact(real) and real.shape == meta.shape:
            with self._real_values():
                self._real[meta] = real.detach().clone()

    def real(self, t: Any) -> torch.Tensor | None:
        """``t``'s real values: ``t`` itself when it has data and is small, integer or bool; the
        values kept for a meta tensor; else ``None``."""
        if not isinstance(t, torch.Tensor):
            return None
        if t.device.type == "meta":
            return self._real.get(t)
        return t if small_exact(t) else None

    def follow_values(self, func: Any, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        """Computes ``out`` = ``func(*args, **kwargs)`` on its arguments' real values, where every
        tensor argument has them and ``name`` is an op of ``ON_VALUES`` (or a small factory of
        ``VALUE_FACTORIES``)."""
        if name in VALUE_FACTORIES:
            if isinstance(out, torch.Tensor) and out.device.type == "meta" and out.numel() <= MAX_FLOATS:
                with self._real_values():
                    value = func(*args, **{k: v for k, v in kwargs.items() if k != "device"})
                if isinstance(value, torch.Tensor) and value.shape == out.shape:
                    self._real[out] = value
            return
        if name not in ON_VALUES or writes(name, kwargs):
            return
        outs = list(out) if isinstance(out, (tuple, list)) else [out]  # unbind, split, chunk
        if not outs or not all(isinstance(o, torch.Tensor) and o.device.type == "meta" for o in outs):
            return
        if sum(o.numel() for o in outs) > MAX_CHECKED:
            return
        try:
            value = self._on_values(func, args, kwargs)
        except Exception:  # noqa: BLE001 - the values are a help; the meta op already ran
            return
        values = list(value) if isinstance(value, (tuple, list)) else [value]
        if len(values) != len(outs):
            return
        for o, v in zip(outs, values):
            if isinstance(v, torch.Tensor) and v.shape == o.shape and v.device.type != "meta":
                self._real[o] = v

    def sized_by_values(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``func(*args, **kwargs)`` of an op of ``VALUE_SIZED`` where every tensor argument has
        real values: meta tensors of the real results' sizes (allocated as the op's results),
        which keep those values; ``None`` where some argument has none."""
        value = self._on_values(func, args, kwargs)
        if value is None:
            return None
        values = value if isinstance(value, tuple) else (value,)

        def twin(v: torch.Tensor) -> torch.Tensor:
            meta = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
            self._real[meta] = v
            return meta

        twins = tuple(twin(v) if isinstance(v, torch.Tensor) else v for v in values)
        return type(value)(twins) if isinstance(value, tuple) else twins[0]

    def _on_values(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """``func`` run on its arguments' real values (the tensors of a list argument too), with
        the recording paused; ``None`` where some tensor argument has none."""
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        tensors += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
        if not tensors or any(self.real(t) is None for t in tensors):
            return None

        def real(a: Any) -> Any:
            if isinstance(a, torch.Tensor):
                return self.real(a)
            if isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in a):
                return type(a)(self.real(t) if isinstance(t, torch.Tensor) else t for t in a)
            return a

        with self._real_values():
            return func(*(real(a) for a in args), **{k: real(v) for k, v in kwargs.items() if k != "device"})

    def knows(self, t: Any) -> bool:
        """Whether ``t``'s values are known: constant, or real."""
        return isinstance(t, torch.Tensor) and (t in self._values or self.real(t) is not None)

    def nonzero_count(self, t: Any) -> int | None:
        """The most nonzero elements ``t`` can hold (exact where its value is known), or ``None``."""
        if not isinstance(t, torch.Tensor):
            return None
        v = self._values.get(t)
        if v is not None:
            return t.numel() if v else 0
        real = self.real(t)
        if real is not None:
            with self._real_values():
                return int(real.count_nonzero())
        bound = self._at_most.get(t)
        return None if bound is None else min(bound, t.numel())

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
        if v is None and t.device.type == "meta" and t in self._real and t.numel() == 1:
            with self._real_values():
                v = self._real[t].item()
        if v is None and t in self._presumed_true:
            torch.Tensor.item(t)  # still a read of a value meta does not have: counted
            v = True
        if v is None or t.numel() != 1:
            return False, None
        if name == "__bool__":
            return True, bool(v)
        if name in ("__int__", "__index__"):
            return True, int(v)
        if name == "__float__":
            return True, float(v)
        return True, as_dtype(v, t.dtype)

    def tolist(self, t: torch.Tensor) -> Any:
        """``t.tolist()`` of a meta tensor: its known value in every element, else zeros (one
        read, counted as ``.item()`` counts it)."""
        if t in self._real:
            with self._real_values():
                return self._real[t].tolist()
        v = self._values.get(t)
        if v is None:
            v = t.reshape(-1)[0].item() if t.numel() else 0  # reads 0, and counts the read
        v = as_dtype(v, t.dtype)

        def filled(shape: tuple) -> Any:
            return [filled(shape[1:]) for _ in range(shape[0])] if shape else v

        return filled(tuple(t.shape))

    def follow(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        """Records the value of ``out``, the result of ``name(*args, **kwargs)``, where it follows
        from known ones."""
        if writes(name, kwargs):
            # An in-place op or out=: its target (and every view of the same storage) no longer
            # holds what was known.
            target = kwargs.get("out", args[0] if args else None)
            count = self._count_after_setitem(*args) if name == "__setitem__" and len(args) == 3 else None
            self._forget(target)
            if count is not None:
                self._at_most[target] = count
            return
        if not isinstance(out, torch.Tensor) or out.device.type != "meta":
            return
        if name in FILLED:  # a factory (on the CPU too: in the block the CPU means meta)
            self.set(out, FILLED[name](args, kwargs))
            return
        first = self.value(args[0]) if args and isinstance(args[0], torch.Tensor) else None
        result = None if first is None else _value_of(self, name, args, kwargs, first)
        if result is None:
            result = _absorbed(self, name, args, out)
        if result is not None:
            self._values[out] = as_dtype(result, out.dtype)
            return
        count = self._count_of(name, args, out)
        if count is not None:
            self._at_most[out] = min(count, out.numel())
        elif name == "_is_all_true" or (name == "all" and not has_dim(args, kwargs) and args[0] in self._float_checks):
            self._presumed_true[out] = True
        elif out.dtype == torch.bool and checks_floats(self._float_checks, name, args):
            self._float_checks[out] = True

    def numpy(self, t: torch.Tensor) -> Any:
        """``t.numpy()`` of a meta tensor: its real or constant values, else zeros (one read,
        counted as ``.item()`` counts it), as ``tolist`` gives them: a CPU library (scipy's
        ``linear_sum_assignment`` in a matching loss) runs on them."""
        import numpy  # only where a program asks for an array

        real = self._real.get(t)
        if real is not None:
            with self._real_values():
                return real.numpy().copy()
        return numpy.array(self.tolist(t), dtype=torch.empty((), dtype=t.dtype).numpy().dtype).reshape(tuple(t.shape))

    def _count_after_setitem(self, t: Any, index: Any, value: Any) -> int | None:
        """The most nonzero elements of ``t`` after ``t[index] = value``, where ``t``'s count is
        known and ``index`` is one index tensor (the rows it writes) or an int (one row)."""
        count = self.nonzero_count(t)
        if count is None or t.dim() == 0:
            return None
        row = t.numel() // t.shape[0] if t.shape[0] else 0
        if isinstance(index, torch.Tensor) and index.dim() == 1 and not index.is_floating_point():
            rows = self.nonzero_count(index) if index.dtype == torch.bool else index.numel()
            rows = index.numel() if rows is None else rows
        elif isinstance(index, int) and not isinstance(index, bool):
            rows = 1
        else:
            return None
        written = self.value(value)
        return count if written is not None and written == 0 else min(t.numel(), count + rows * row)

    def _count_of(self, name: str, args: tuple, out: torch.Tensor) -> int | None:
        """The most nonzero elements of ``out`` = ``name(*args)`` from its inputs' counts: views
        and casts keep it, ``|`` and ``cat`` add, ``&`` and ``*`` take the smaller."""
        if not args:
            return None
        if name in ("cat", "concat", "concatenate") and isinstance(args[0], (list, tuple)):
            counts = [self.nonzero_count(t) for t in args[0]]
            return None if None in counts else sum(counts)
        first = args[0]
        if not isinstance(first, torch.Tensor) or (name == "__getitem__" and not basic_index(args[1:])):
            return None
        if name in SAME_VALUE:
            count = self.nonzero_count(first)
            if count is None:
                return None
            # expand repeats elements; the others keep or select them
            return count * max(1, -(-out.numel() // max(first.numel(), 1)))
        if len(args) < 2:
            return None
        counts = [self.nonzero_count(a) if isinstance(a, torch.Tensor) and a.shape == out.shape else None for a in args[:2]]
        if name in OR:
            return None if None in counts else sum(counts)
        if name in AND:
            known = [c for c in counts if c is not None]
            return min(known) if known else None
        return None

    def _forget(self, target: Any) -> None:
        facts = (self._values, self._real, self._at_most, self._float_checks, self._presumed_true)
        if not any(facts):  # nothing known (an optimizer's foreach step writes hundreds)
            return
        targets = target if isinstance(target, (list, tuple)) else (target,)
        storages = {t.untyped_storage()._cdata for t in targets if isinstance(t, torch.Tensor) and t.device.type == "meta"}
        for known in facts:
            for k in [k for k in known if k.untyped_storage()._cdata in storages]:
                del known[k]


def _value_of(known: KnownValues, name: str, args: tuple, kwargs: dict, first: Any) -> Any:
    """The value of ``name(*args, **kwargs)`` when its first argument holds ``first``, where it
    follows; else ``None``."""
    if name in SAME_VALUE:
        return first
    if name in ("__invert__", "bitwise_not", "logical_not"):
        return (not first) if isinstance(first, bool) or name == "logical_not" else ~first
    if name in ("all", "any") and not has_dim(args, kwargs):
        return bool(first) if args[0].numel() else name == "all"
    if name == "sum" and not has_dim(args, kwargs):
        return first * args[0].numel()
    if name in ("max", "min", "amax", "amin") and not has_dim(args, kwargs) and args[0].numel():
        return first
    other = known.value(args[1]) if len(args) > 1 else None
    if other is None:
        return None
    if name in COMPARISONS:
        return COMPARISONS[name](first, other)
    if name in ARITHMETIC:
        return ARITHMETIC[name](first, other)
    if name in BITWISE and not isinstance(first, float) and not isinstance(other, float):
        return BITWISE[name](first, other)
    return None


def _absorbed(known: KnownValues, name: str, args: tuple, out: torch.Tensor) -> Any:
    """The value of ``name(a, b)`` that one known operand decides alone, the other unknown: a
    bool ``| True`` is true, an integer or bool ``& 0`` (or ``* 0``) is 0; else ``None``."""
    if len(args) < 2 or out.dtype.is_floating_point or out.is_complex():
        return None
    values = [known.value(a) for a in args[:2]]
    if name in OR and out.dtype == torch.bool and any(v is not None and bool(v) for v in values):
        return True
    if name in AND and any(v is not None and not v for v in values):
        return 0
    return None
