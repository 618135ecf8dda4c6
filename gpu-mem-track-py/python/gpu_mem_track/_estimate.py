"""``estimate()``: will a model fit on a GPU? The estimator's meta-device run, in-process."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import torch

from ._load import native as _native

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


class Estimate(dict):
    """The figures of ``gpu-mem-track estimate --json`` (a dict of the same JSON), with shortcuts.

    Bytes throughout. ``["peak"]["bytes"]`` is the peak of the tensors the step holds at once;
    ``["cuda"]`` the caching allocator model's figures on a plain CUDA device; ``["gpu"]`` the
    prediction for the GPU asked for (``device``), with ``fits``.
    """

    @property
    def peak_bytes(self) -> int:
        """The peak bytes of live tensors during the step."""
        return self["peak"]["bytes"]

    @property
    def gpu(self) -> dict | None:
        """The prediction for the GPU asked for, or ``None`` (``device='cuda'`` or ``'none'``)."""
        return self.get("gpu")

    @property
    def fits(self) -> bool | None:
        """Whether the step fits the GPU asked for (``None`` without one)."""
        return None if self.gpu is None else self.gpu["fits"]

    def __repr__(self) -> str:
        gpu = self.gpu
        where = f", {gpu['profile']['name']}: fits={gpu['fits']}" if gpu else ""
        return f"Estimate(peak={self.peak_bytes / 2**20:.1f} MiB{where})"


def _scripted(model: torch.nn.Module, inputs: tuple) -> torch.jit.ScriptModule:
    if isinstance(model, torch.jit.ScriptModule):
        return model
    try:
        return torch.jit.script(model)
    except Exception as scripting:  # noqa: BLE001 - any scripting failure falls back to tracing
        try:
            with torch.no_grad():
                return torch.jit.trace(model, inputs)
        except Exception as tracing:
            raise ValueError(
                f"estimate(): {type(model).__name__} can be neither scripted ({scripting}) nor traced "
                f"with example_inputs ({tracing})"
            ) from tracing


def estimate(
    model: torch.nn.Module,
    example_inputs: Any,
    mode: str = "train",
    optimizer: str = "adamw",
    device: str = "h100-80g",
    *,
    lifetimes: str = "eager",
) -> Estimate:
    """Estimates the memory of one step of ``model`` without a GPU, as ``gpu-mem-track estimate``.

    The model is scripted (or traced with ``example_inputs`` when it cannot be), then run on the
    meta device in this process: exact shapes, no compute, no memory. ``mode='train'`` is forward,
    backward and an ``optimizer`` step (``sgd``, ``momentum``, ``adam``, ``adamw``) over two
    iterations; ``'inference'`` one forward without grad. ``device`` names a GPU profile
    (``a100-80g``, ``h100-80g``, ``rtx4090``, ``l4``, ``t4``, ... or a profile ``.json``), ``'all'``
    for every preset, ``'cuda'`` for none. ``lifetimes='eager'`` frees values as eager PyTorch does;
    ``'torchscript'`` as the TorchScript interpreter does.

    ``example_inputs`` is one batch-first tensor (or a 1-tuple of it): its shape, and its dtype
    (integer: token ids; float16/bfloat16: the model runs in that precision), are what count.

    Raises:
        ValueError: an input, option or profile the estimator cannot take, or a model that can be
            neither scripted nor traced.
        GpuMemTrackError: an op without a meta kernel, or another failure of the run (named).
    """
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if len(inputs) != 1 or not isinstance(inputs[0], torch.Tensor):
        raise ValueError("estimate(): example_inputs must be one tensor (the model's batch-first input)")
    x = inputs[0]
    is_index = not (x.dtype.is_floating_point or x.dtype.is_complex)
    dtype = "f32" if is_index else _DTYPES.get(x.dtype)
    if dtype is None:
        raise ValueError(f"estimate(): input dtype {x.dtype} (use float32, float16, bfloat16 or integer ids)")
    was_training = model.training
    model.train(mode == "train")
    try:
        scripted = _scripted(model, inputs)
    finally:
        model.train(was_training)
    with tempfile.TemporaryDirectory(prefix="gpu_mem_track-") as folder:
        path = os.path.join(folder, "model.pt")
        torch.jit.save(scripted, path)
        text = _native.estimate(path, list(x.shape), is_index, mode, optimizer, device, lifetimes, dtype)
    return Estimate(json.loads(text))
