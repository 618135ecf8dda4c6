"""``gpu_mem_track.estimate()``: a built model's step on the meta device, in-process, without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import warnings

import gpu_mem_track
import pytest
import torch


def transformer_block() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=256, dropout=0.1, batch_first=True)


def test_transformer_block_with_dropout_trains_on_meta():
    block = transformer_block()
    params = sum(p.numel() * p.element_size() for p in block.parameters())
    e = gpu_mem_track.estimate(block, torch.randn(8, 32, 64), mode="train", optimizer="adamw", device_profile="h100-80g")
    # Parameters, their gradients and AdamW's two moments are all live at the step's end.
    assert e["param_bytes"] == params and e["optimizer_state_bytes"] == 2 * params
    assert e.peak_bytes >= 4 * params
    assert e.fits is True and e.gpu["profile"]["name"] == "h100-80g"
    assert "adamw" in json.dumps(e["options"]).lower()
    inference = gpu_mem_track.estimate(block, torch.randn(8, 32, 64), mode="inference", device_profile="cuda")
    assert inference.gpu is None and inference.peak_bytes < e.peak_bytes
    assert block.training  # the caller's mode is given back


def test_resnet50_training_matches_the_command_lines_torchscript_estimate(tmp_path):
    torchvision = pytest.importorskip("torchvision", reason="needs torchvision (installed beside the main torch)")
    model = torchvision.models.resnet50()
    x = torch.randn(16, 3, 224, 224)
    e = gpu_mem_track.estimate(model, x, mode="train", optimizer="adamw", device_profile="h100-80g")
    params = sum(p.numel() * 4 for p in model.parameters())
    assert e["param_bytes"] == params and e.peak_bytes > 4 * params and e.fits is True
    binary = os.environ.get("GMT_ESTIMATE_BINARY")
    if not binary:
        pytest.skip("GMT_ESTIMATE_BINARY names no gpu-mem-track-estimate binary to compare with")
    path = tmp_path / "resnet50.pt"
    with warnings.catch_warnings():  # the comparison's own file: TorchScript is deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.script(model).save(str(path))
    out = subprocess.run(
        [binary, "estimate", str(path), "--input", "16x3x224x224", "--mode", "train", "--optimizer", "adamw",
         "--lifetimes", "eager", "--device-profile", "h100-80g", "--json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    cli = json.loads(out.stdout)
    # The Python model, run eagerly in this process, against its TorchScript file run by the
    # command line with eager lifetimes: the same sizes, and the same peak within 1 % (eager
    # Python frees a few values at other points than the TorchScript interpreter).
    for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes", "input_bytes", "buffer_bytes"):
        assert e[key] == cli[key], key
    assert e["peak"]["phase"] == cli["peak"]["phase"]
    assert e.peak_bytes == pytest.approx(cli["peak"]["bytes"], rel=0.01)
    assert e["gpu"]["peak_allocated"]["high"] == pytest.approx(cli["gpu"]["peak_allocated"]["high"], rel=0.01)
    assert e["gpu"]["peak_reserved"]["high"] == pytest.approx(cli["gpu"]["peak_reserved"]["high"], rel=0.05)
    assert e["gpu"]["fits"] == cli["gpu"]["fits"]
