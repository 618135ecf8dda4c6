"""Pytorch-Memory-Utils' README code, unchanged, writes our log."""

from __future__ import annotations

import inspect
import re
import warnings

import torch
from conftest import GPU, device, only_log, parse_blocks, read
from gpu_mem_track import MemTracker

PARAM = "<class 'torch.nn.parameter.Parameter'>"
TENSOR = "<class 'torch.Tensor'>"


def test_readme_snippet_logs_parameters_activation_and_the_calling_line(logdir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gpu_tracker = MemTracker()  # the Python tool's defaults: detail=True, path='', device=0
    if not GPU:
        assert [str(w.message) for w in caught if "tracks the CPU" in str(w.message)], caught
    gpu_tracker.track()
    first_line = inspect.currentframe().f_lineno - 1
    layer = torch.nn.Linear(256, 128).to(device())
    x = torch.randn(64, 256, device=device())
    out = layer(x)
    gpu_tracker.track()
    second_line = inspect.currentframe().f_lineno - 1
    del out
    gpu_tracker.clear_cache()
    gpu_tracker.track()
    gpu_tracker.print_all_gpu_tensor()

    path = only_log(logdir)
    blocks = parse_blocks(path)
    assert len(blocks) == 3
    lines, at = blocks[1]
    assert at.startswith(f"At {__file__} line {second_line}: test_readme_snippet"), at
    assert f"At {__file__} line {first_line}: " in blocks[0][1]
    # nn.Linear's weight and bias, the input and the activation, each once.
    assert ("+", 1, "(128, 256)", 0.125, PARAM, "torch.float32") in lines, lines
    assert ("+", 1, "(128,)", 0.0005, PARAM, "torch.float32") in lines, lines
    assert ("+", 1, "(64, 256)", 0.0625, TENSOR, "torch.float32") in lines, lines
    assert ("+", 1, "(64, 128)", 0.0312, TENSOR, "torch.float32") in lines, lines
    # Freeing the activation is the third block's one line.
    assert blocks[2][0] == [("-", 1, "(64, 128)", 0.0312, TENSOR, "torch.float32")]
    header = read(path).splitlines()[0]
    assert header.startswith("GPU Memory Track | ") and "Total Tensor Used Memory:" in header


def test_path_is_a_prefix_of_the_file_name(logdir):
    (logdir / "runs").mkdir()
    tracker = MemTracker(path="runs/exp1-", device="cpu")
    tracker.track()
    name = tracker.log_path.rsplit("/", 1)[-1]
    assert tracker.log_path.startswith(str(logdir / "runs" / "exp1-")) or tracker.log_path.startswith("runs/exp1-")
    assert name.startswith("exp1-") and name.endswith("-gpu_mem_track.txt")


def test_bad_options_name_the_problem(logdir):
    import pytest

    with pytest.raises(FileNotFoundError, match="missing"):
        MemTracker(path="missing/run-", device="cpu")
    with pytest.raises(ValueError, match="prefix"):
        MemTracker(path="bad prefix*", device="cpu")
    with pytest.raises(ValueError, match="sample_every"):
        MemTracker(device="cpu", sample_every=-1.0)
    with pytest.raises(ValueError, match="device"):
        MemTracker(device="mps")
    if GPU:
        with pytest.raises(ValueError, match="cpu_memory_limit"):
            MemTracker(device=0, cpu_memory_limit=1 << 20)


def test_detail_off_writes_only_at_lines(logdir):
    tracker = MemTracker(detail=False, device="cpu")
    keep = torch.ones(1000)
    tracker.track()
    assert read(tracker.log_path).count("+ |") == 0
    assert len(parse_blocks(tracker.log_path)) == 1
    del keep


def test_op_names_name_the_op_that_made_each_group(logdir):
    tracker = MemTracker(device="cpu", op_names=True)
    a = torch.ones(300, 300)
    b = a.mm(a)
    tracker.track()
    text = read(tracker.log_path)
    assert "| aten::mm" in text and "| aten::ones" in text, text
    del b


def test_verbose_prints_the_block(logdir, capsys):
    tracker = MemTracker(device="cpu", verbose=True)
    keep = torch.zeros(123, 7)
    tracker.track()
    out = capsys.readouterr().out
    assert "Size:(123, 7)" in out and out.rstrip().splitlines()[-1].startswith("At ")
    del keep


def test_usage_figures_count_each_storage_once(logdir):
    tracker = MemTracker(device="cpu")
    before = tracker.get_tensor_usage()
    big = torch.empty(1024, 1024)  # 4 MiB
    view = big[:10]
    assert abs(tracker.get_tensor_usage() - before - 4.0) < 1e-9
    assert tracker.get_allocate_usage() >= 4.0
    del big, view


def test_the_at_line_adds_up_tensors_workspaces_and_the_rest(logdir):
    # Memory no tensor holds (a bare storage, as a library's buffer would be) is printed as
    # unattributed; on CUDA a first matmul's cuBLAS workspaces as workspaces. The three add up to
    # Total Allocated Memory, to the byte in the figures and to the rounding in the line.
    tracker = MemTracker(device=str(device()))
    x = torch.randn(300, 300, device=device())
    first = tracker.track()
    # Allocated for a tensor (through the allocator the log counts), then kept without one.
    bare = torch.empty(3 << 20, dtype=torch.uint8, device=device()).untyped_storage()
    y = x @ x
    point = tracker.track()
    workspace = point["workspace_bytes"]
    assert point["tensor_bytes"] + (workspace or 0) + point["unattributed_bytes"] == point["allocated"]
    assert point["unattributed_bytes"] >= first["unattributed_bytes"] + (3 << 20)
    fields = dict(re.findall(r" ([A-Za-z ]+?):(-?[0-9.]+) *Mb", point["at"]))
    if GPU:
        assert workspace >= 1 << 20, point
        parts = ("Total Tensor Used Memory", "Workspace Memory", "Unattributed Memory")
    else:
        assert workspace is None and "Workspace Memory" not in fields, point["at"]
        assert point["unattributed_bytes"] == first["unattributed_bytes"] + (3 << 20)
        parts = ("Total Tensor Used Memory", "Unattributed Memory")
    total = sum(float(fields[p]) for p in parts)
    assert abs(total - float(fields["Total Allocated Memory"])) <= 0.15, point["at"]
    del bare, y, x
