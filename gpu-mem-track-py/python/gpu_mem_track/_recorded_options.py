"""What an ``Estimator``'s recording is finished with, read back from what its block ran: the
input's shape and kind, the precision and optimizer, the model's and its optimizer's sizes.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch

from ._vocabulary import optimizer_name, precision_of


class FirstInput(NamedTuple):
    """What the options keep of the block's first forward's input: its figures, not its tensors.
    A batch is the program's to drop: one the block held would stay alive through every later
    step, memory a real run does not use."""

    shape: list[int]
    is_index: bool
    nbytes: int

    @staticmethod
    def of(tensors: list[torch.Tensor]) -> FirstInput:
        first = tensors[0] if tensors else None
        return FirstInput(
            shape=list(first.shape) if first is not None else [],
            is_index=first is not None and not (first.is_floating_point() or first.is_complex()),
            nbytes=sum(t.numel() * t.element_size() for t in tensors),
        )


def recorded_options(
    roots: dict[int, torch.nn.Module],
    optimizers_seen: dict[int, weakref.ref],
    first_input: FirstInput | None,
    backward_ran: bool,
) -> tuple[dict[str, Any], dict[str, int]]:
    """What the block ran, for ``Recording.finish``: the run's part of its ``EstimateRequest``
    (``input_shape``, ``input_is_index``, ``dtype``, ``optimizer``) and the sizes, from the
    block's models (``roots``), its optimizers (held weakly), the first forward's input
    and whether a backward ran."""
    params: dict[int, torch.Tensor] = {}
    buffers: dict[int, torch.Tensor] = {}
    for m in roots.values():
        params.update((id(p), p) for p in m.parameters())
        buffers.update((id(b), b) for b in m.buffers())

    def nbytes(ts) -> int:
        return sum(t.numel() * t.element_size() for t in ts)

    trainable = [p for p in params.values() if p.requires_grad]
    optimizers = [o for o in (r() for r in optimizers_seen.values()) if o is not None]
    state = 0
    for o in optimizers:
        for s in o.state.values():
            state += nbytes(v for v in s.values() if isinstance(v, torch.Tensor) and v.device.type == "meta")
    first_input = first_input or FirstInput.of([])
    dtypes = [p.dtype for p in params.values()]
    dtype = max(set(dtypes), key=dtypes.count) if dtypes else torch.float32
    if optimizers:
        optimizer = optimizer_name(optimizers[0])
        if optimizer is None:  # named by the state it keeps per parameter byte
            ratio = state / max(nbytes(trainable), 1)
            optimizer = "adamw" if ratio >= 1.5 else "momentum" if ratio >= 0.5 else "sgd"
    else:
        optimizer = "sgd" if backward_ran else None
    sizes = {
        "param_count": sum(p.numel() for p in params.values()),
        "param_bytes": nbytes(params.values()),
        "buffer_bytes": nbytes(buffers.values()),
        "input_bytes": first_input.nbytes,
        "grad_bytes": nbytes(trainable) if backward_ran else 0,
        "optimizer_state_bytes": state,
    }
    run = {
        "input_shape": first_input.shape,
        "input_is_index": first_input.is_index,
        "dtype": precision_of(dtype),
        "optimizer": optimizer,
    }
    return run, sizes
