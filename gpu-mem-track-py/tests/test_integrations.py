"""The trainer callbacks, each with the real package, on the CPU: a two-epoch run with validation
writes one log with a block at each boundary."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import logdir, parse_blocks  # noqa: F401


def at_lines(path: str) -> list[str]:
    return [at for _, at in parse_blocks(path)]


def boundaries(path: str) -> list[str]:
    """What each At line names (after ``: ``), without the figures."""
    return [re.match(r"At .* line \d+: (.*?)\s+Total Tensor", at).group(1) for at in at_lines(path)]


def test_the_lightning_callback_tracks_steps_epochs_and_validation(logdir):  # noqa: F811
    pl = pytest.importorskip("lightning.pytorch", reason="Lightning is not installed here")
    from gpu_mem_track.integrations.lightning import MemTrackerCallback

    class Regressor(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16, generator=g), torch.randn(64, 1, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    callback = MemTrackerCallback(path="lit-", every_n_steps=2)
    trainer = pl.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Regressor(), loader, loader)
    names = boundaries(callback.tracker.log_path)
    assert names[0] == "fit start" and names[-1] == "fit end", names
    for epoch in (0, 1):
        assert f"train epoch start (epoch {epoch})" in names
        assert f"train epoch end (epoch {epoch})" in names
        assert f"validation start (epoch {epoch})" in names
        assert f"validation end (epoch {epoch})" in names
    # 4 batches an epoch, 8 steps: a block after every second one.
    steps = [n for n in names if n.startswith("train batch end")]
    assert steps == [f"train batch end (epoch {(s - 1) // 4}, step {s})" for s in (2, 4, 6, 8)], steps
    # The At lines point at the module's training_step (validation_step for validation).
    first = at_lines(callback.tracker.log_path)[0]
    assert __file__ in first and "line" in first
    # Adam's state is marked as such: two moments per parameter, and its step counters. Lightning
    # runs the forward and backward in a closure inside the optimizer's step: the gradients and
    # activations it makes are not.
    with open(callback.tracker.log_path) as f:
        text = f.read()
    block = text.split("train batch end (epoch 0, step 2)")[0].rsplit("train epoch start (epoch 0)", 1)[1]
    marked = {}
    for line in block.splitlines():
        m = re.match(r"\+ \| +(\d+) \* Size:(\(.*?\)) .*\| optimizer state$", line)
        if m:
            marked[m.group(2)] = int(m.group(1))
    assert marked == {"(64, 16)": 2, "(64,)": 2, "(1, 64)": 2, "(1,)": 2, "()": 4}, block


def test_the_transformers_callback_tracks_steps_epochs_and_evaluation(logdir, tmp_path):  # noqa: F811
    transformers = pytest.importorskip("transformers", reason="transformers is not installed here")
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate, not installed here")
    from gpu_mem_track.integrations.transformers import MemTrackerCallback

    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=97, n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            ids = torch.arange(i, i + 12) % 97
            return {"input_ids": ids, "attention_mask": torch.ones(12, dtype=torch.long), "labels": ids}

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        num_train_epochs=2,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        eval_strategy="epoch",
        save_strategy="no",
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    callback = MemTrackerCallback(path="hf-")
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=Tokens(), eval_dataset=Tokens(), callbacks=[callback]
    )
    trainer.train()
    names = boundaries(callback.tracker.log_path)
    assert names[0] == "train start" and names[-1] == "train end", names
    for epoch in (0, 1):
        assert f"epoch start (epoch {epoch})" in names, names
        assert f"epoch end (epoch {epoch})" in names, names
    steps = [n for n in names if n.startswith("step end")]
    assert steps == [f"step end (epoch {(s - 1) // 4}, step {s})" for s in range(1, 9)], steps
    assert [n for n in names if n.startswith("evaluate end")] == ["evaluate end (step 4)", "evaluate end (step 8)"]
    # The At lines point at the model's forward.
    assert "modeling_gpt2.py" in at_lines(callback.tracker.log_path)[0]


def test_a_callback_refuses_a_bad_step_interval():
    pytest.importorskip("lightning.pytorch", reason="Lightning is not installed here")
    from gpu_mem_track.integrations.lightning import MemTrackerCallback

    with pytest.raises(ValueError, match="every_n_steps=0"):
        MemTrackerCallback(every_n_steps=0)
