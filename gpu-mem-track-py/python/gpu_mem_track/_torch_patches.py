"""What an ``Estimator`` block changes in torch, where meta stands for the GPU: optimizers take
their GPU implementations (foreach, fused) on meta parameters, ``autocast("cuda")`` runs without
a GPU and answers for meta, and the block's meta kernels (``_meta_kernels``); ``torch.compile``'d
code is ``_compiled``'s. Each change appends what gives it back to ``undo``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.optim.optimizer as _optim  # the module (torch.optim's namespace hides it)

from ._meta_kernels import LargestResults, block_meta_kernel, grouped_mm_as_on_a_gpu, libtorch_meta_kernels


class _DevicesWithMeta(list):
    """A list of device types with meta in it while CUDA is."""

    def __init__(self, devices: list) -> None:
        super().__init__([*devices, "meta"] if "cuda" in devices else devices)

    def remove(self, device: str) -> None:
        super().remove(device)
        if device == "cuda" and "meta" in self:
            super().remove("meta")


def patch_torch(undo: list, largest: LargestResults) -> None:
    """What the block changes in torch, given back on leaving it (``undo``, run last first)."""

    def patch(owner: Any, name: str, value: Any) -> None:
        old = getattr(owner, name)
        setattr(owner, name, value)
        undo.append(lambda: setattr(owner, name, old))

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
    block_meta_kernel(undo, "aten", "_grouped_mm", grouped_mm_as_on_a_gpu)
    # Detection models' nms, where torchvision's ops are loaded: its own meta function refuses
    # meta tensors.
    block_meta_kernel(undo, "torchvision", "nms", largest.nms)
    libtorch_meta_kernels(undo, largest)
