"""The words the estimator's options take, from Rust (``_native.vocabulary()``): the command line
and this package accept the same words, spelled the same way, and Python lists none itself.
"""

from __future__ import annotations

from typing import Any

import torch

from ._load import native as _native

#: Each option's canonical words (``optimizer``, ``dtype``, ``precision``, ``shard``, ...,
#: ``category``, ``phase``), as the Rust types name them.
VOCABULARY: dict[str, list[str]] = _native.vocabulary()

#: The categories of an estimate's bytes, in stacking order.
CATEGORIES: tuple[str, ...] = tuple(VOCABULARY["category"])

#: The GPU an estimate is for when none is named (``auto``: the first GPU CUDA shows the process,
#: as NVML describes it, else the command line's fallback preset), as on the command line.
DEFAULT_DEVICE_PROFILE: str = _native.DEFAULT_GPU_TARGET


def canonical(caller: str, option: str, value: str) -> str:
    """``value``'s canonical word for ``option`` (``sgd-momentum`` gives ``momentum``); a
    ``ValueError`` naming ``caller``, the option and its words otherwise."""
    try:
        return _native.canonical(option, value)
    except ValueError as e:
        raise ValueError(f"{caller}(): {option}: {e}") from None


def make_optimizer(name: str, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The torch optimizer ``optimizer=name`` steps with: torch's foreach implementation, as on a
    GPU."""
    cls, kwargs = _native.torch_optimizer(name)
    return getattr(torch.optim, cls)(params, foreach=True, **kwargs)


def optimizer_name(optimizer: Any) -> str | None:
    """The estimator's word for a torch optimizer a program made (SGD with momentum is
    ``momentum``), ``None`` for a class it has no word for."""
    momentum = bool(getattr(optimizer, "defaults", {}).get("momentum"))
    for name in VOCABULARY["optimizer"]:
        cls, kwargs = _native.torch_optimizer(name)
        if type(optimizer).__name__ == cls and bool(kwargs.get("momentum")) == momentum:
            return name
    return None


def precision_of(dtype: torch.dtype) -> str:
    """The precision word of a model's dtype (``f16`` for ``torch.float16``); float32's for any
    dtype without one."""
    for name in VOCABULARY["dtype"]:
        if str(dtype) == _native.precision_dtype(name):
            return name
    return canonical("precision_of", "dtype", "float32")
