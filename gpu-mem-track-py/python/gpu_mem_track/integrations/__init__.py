"""Callbacks for the trainers people already use, each a ``MemTrackerCallback`` that tracks at the
step, epoch and validation boundaries, into one log per rank:

- ``gpu_mem_track.integrations.lightning``: Lightning (``lightning`` or ``pytorch_lightning``);
- ``gpu_mem_track.integrations.transformers``: Hugging Face ``transformers.Trainer``.

Each module imports its trainer only when imported itself.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from .._tracker import MemTracker


def code_site(obj: Any, method: str) -> tuple[str, int]:
    """The file and first line of ``type(obj).method`` (the user's ``training_step`` or
    ``forward``), where the ``At`` lines point; the class itself, or ``<trainer>``, when the
    source cannot be found."""
    cls = type(obj)
    fn = inspect.unwrap(getattr(cls, method, None) or cls)
    code = getattr(fn, "__code__", None)
    if code is not None:
        return code.co_filename, code.co_firstlineno
    try:
        return inspect.getsourcefile(cls) or "<trainer>", inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return "<trainer>", 0


class Boundaries:
    """What both callbacks share: the tracker, made when training starts on the trainer's device,
    and a track for each boundary, every ``every_n_steps`` steps for the step's."""

    def __init__(self, path: str, every_n_steps: int, device: Any, options: dict[str, Any]) -> None:
        if not isinstance(every_n_steps, int) or isinstance(every_n_steps, bool) or every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps!r}: must be a positive integer")
        self.path = path
        self.every_n_steps = every_n_steps
        self.device = device
        self.options = options
        self.tracker: MemTracker | None = None
        self.site = ("<trainer>", 0)

    def start(self, device: torch.device, site: tuple[str, int]) -> MemTracker:
        if self.tracker is None:
            wanted = self.device if self.device is not None else device
            self.tracker = MemTracker(path=self.path, device=wanted, **self.options)
        self.site = site
        return self.tracker

    def track(self, what: str, site: tuple[str, int] | None = None) -> None:
        if self.tracker is not None:
            file, line = site or self.site
            self.tracker._track_at(file, line, what)

    def track_step(self, step: int, what: str, site: tuple[str, int] | None = None) -> None:
        if step % self.every_n_steps == 0:
            self.track(what, site)
