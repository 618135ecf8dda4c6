"""The model of an ``Estimator`` block, as its first forward meets it: its parameters on meta (one
the block made from data moved there), each parameter and buffer tagged and charged to the module
that holds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ._load import native as _native
from ._meta_mode import META
from ._value_ops import constant_of

if TYPE_CHECKING:
    from ._meta_mode import MetaMode
    from ._sites import Sites


def note_model(module: torch.nn.Module, mode: MetaMode | None, sites: Sites, owners: dict[int, Any]) -> None:
    """Tags ``module``'s parameters and buffers and charges them to the modules that hold them
    (``owners``: each parameter's id -> the parameter and its site); raises ``ValueError`` for a
    model built before the block (parameters with data the block did not make)."""
    off_meta = []
    for n, p in module.named_parameters():
        if p.device.type == "meta":
            continue
        if mode is not None and p.device.type == "cpu" and mode.made_from_data(p):
            parameter_to_meta(p, mode)
        else:
            off_meta.append(n)
    if off_meta:
        raise ValueError(
            f"Estimator: {type(module).__name__} has parameters on {module.get_parameter(off_meta[0]).device} "
            f"({off_meta[0]}, ...): it was built before the block. Build it inside `with Estimator():`, "
            "or estimate a built model with gpu_mem_track.estimate(model, ...), which leaves its weights alone."
        )
    # Parameters, buffers, gradients and optimizer state belong to the module that holds the
    # parameter (named as ModTracker names it: the class, then the attribute path).
    root = module._get_name()
    for name, sub in module.named_modules():
        site = sites.index(f"{root}.{name}" if name else root)
        for p in sub.parameters(recurse=False):
            _native.recording_tag(p._cdata, "parameter")
            _native.recording_owner(p._cdata, site)
            owners[id(p)] = (p, site)
        for b in sub.buffers(recurse=False):
            if b.device.type == "meta":
                _native.recording_tag(b._cdata, "buffer")
                _native.recording_owner(b._cdata, site)


def parameter_to_meta(p: torch.nn.Parameter, mode: MetaMode) -> None:
    """A parameter the block made from data (``nn.Parameter(torch.tensor(2.6))``), moved to
    meta in place (the same object: a module and an optimizer made before hold it), its value
    kept where it is constant."""
    with mode.cpu_is_cpu():  # while its values are read
        value = constant_of(p)
    p.data = p.data.to(META)
    mode.known.set(p, value)
