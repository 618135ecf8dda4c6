"""``MemTrackerCallback`` for Hugging Face ``transformers.Trainer``::

    from transformers import Trainer
    from gpu_mem_track.integrations.transformers import MemTrackerCallback

    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val,
                      callbacks=[MemTrackerCallback(path="logs/run1-")])
    trainer.train()

One log per rank (named by the rank under ``torchrun``), on the trainer's device, with a block at
the start and end of training, of each epoch, after each evaluation, and after every
``every_n_steps``-th optimizer step. The ``At`` lines point at the model's ``forward`` and name
the boundary, the epoch and the step: ``At modeling_gpt2.py line 1043: step end (epoch 0, step 4)``.
"""

from __future__ import annotations

import math
from typing import Any

from . import Boundaries, code_site

try:
    from transformers import TrainerCallback
except ImportError as e:
    raise ImportError("gpu_mem_track.integrations.transformers needs transformers: pip install transformers") from e


def _epoch(state) -> int:
    """The epoch running, counted from 0, at its start (the Trainer's state counts epochs done)."""
    return int(state.epoch or 0)


def _epoch_of_step(state) -> int:
    """The epoch a step that has just ended belongs to: the state counts the epochs done, in
    fractions (0.25 after the first of four steps, 1.0 after the fourth)."""
    return max(math.ceil(state.epoch or 0) - 1, 0)


class MemTrackerCallback(TrainerCallback):
    """Tracks a ``Trainer`` run at its boundaries.

    Args:
        path: put before each log's file name, as ``MemTracker(path=...)``.
        every_n_steps: track after every n-th optimizer step (1: each).
        device: the tracked device; by default the trainer's (``TrainingArguments.device``).
        **options: the other ``MemTracker`` options (``detail``, ``views``, ``op_names``, ...).
    """

    def __init__(self, path: str = "", every_n_steps: int = 1, device: Any = None, **options: Any) -> None:
        self._at = Boundaries(path, every_n_steps, device, options)

    @property
    def tracker(self):
        """The ``MemTracker`` (``None`` before training starts)."""
        return self._at.tracker

    def on_train_begin(self, args, state, control, model=None, **kwargs) -> None:
        self._at.start(args.device, code_site(model, "forward") if model is not None else ("<trainer>", 0))
        self._at.track("train start")

    def on_epoch_begin(self, args, state, control, **kwargs) -> None:
        self._at.track(f"epoch start (epoch {_epoch(state)})")

    def on_step_end(self, args, state, control, **kwargs) -> None:
        step = state.global_step
        self._at.track_step(step, f"step end (epoch {_epoch_of_step(state)}, step {step})")

    def on_epoch_end(self, args, state, control, **kwargs) -> None:
        self._at.track(f"epoch end (epoch {_epoch_of_step(state)})")

    def on_evaluate(self, args, state, control, **kwargs) -> None:
        self._at.track(f"evaluate end (step {state.global_step})")

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self._at.track("train end")
