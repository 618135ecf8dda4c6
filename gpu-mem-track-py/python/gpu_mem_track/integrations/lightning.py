"""``MemTrackerCallback`` for Lightning::

    from lightning.pytorch import Trainer
    from gpu_mem_track.integrations.lightning import MemTrackerCallback

    trainer = Trainer(max_epochs=2, callbacks=[MemTrackerCallback(path="logs/run1-")])
    trainer.fit(model, train_loader, val_loader)

One log per rank (named by the rank under DDP), on each rank's own device, with a block at the
start and end of fitting, of each training epoch and of each validation run, and after every
``every_n_steps``-th training batch. The ``At`` lines point at the module's ``training_step``
(``validation_step`` for validation) and name the boundary, the epoch and the step:
``At model.py line 12: train batch end (epoch 0, step 4)``.

Works with ``lightning`` (``lightning.pytorch``) or ``pytorch_lightning``, whichever is installed.
"""

from __future__ import annotations

from typing import Any

from . import Boundaries, code_site

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:
    try:
        from pytorch_lightning.callbacks import Callback
    except ImportError as e:
        raise ImportError(
            "gpu_mem_track.integrations.lightning needs Lightning: pip install lightning (or pytorch-lightning)"
        ) from e


class MemTrackerCallback(Callback):
    """Tracks a Lightning run at its boundaries.

    Args:
        path: put before each log's file name, as ``MemTracker(path=...)``.
        every_n_steps: track after every n-th training batch (1: each).
        device: the tracked device; by default the trainer's (``trainer.strategy.root_device``).
        **options: the other ``MemTracker`` options (``detail``, ``views``, ``op_names``, ...).
    """

    def __init__(self, path: str = "", every_n_steps: int = 1, device: Any = None, **options: Any) -> None:
        super().__init__()
        self._at = Boundaries(path, every_n_steps, device, options)

    @property
    def tracker(self):
        """The ``MemTracker`` (``None`` before fitting starts)."""
        return self._at.tracker

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._at.start(trainer.strategy.root_device, code_site(pl_module, "training_step"))

    def on_fit_start(self, trainer, pl_module) -> None:
        self._at.track("fit start")

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._at.track(f"train epoch start (epoch {trainer.current_epoch})")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        self._at.track_step(step, f"train batch end (epoch {trainer.current_epoch}, step {step})")

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._at.track(f"train epoch end (epoch {trainer.current_epoch})")

    def on_validation_start(self, trainer, pl_module) -> None:
        site = code_site(pl_module, "validation_step")
        self._at.track(f"validation start (epoch {trainer.current_epoch})", site)

    def on_validation_end(self, trainer, pl_module) -> None:
        site = code_site(pl_module, "validation_step")
        self._at.track(f"validation end (epoch {trainer.current_epoch})", site)

    def on_fit_end(self, trainer, pl_module) -> None:
        self._at.track("fit end")
