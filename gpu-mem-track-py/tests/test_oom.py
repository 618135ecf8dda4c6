"""Out of memory from Python: the block and the snapshot are written, and the program still gets
torch's own exception, unchanged."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import logdir, needs_gpu, read  # noqa: F401
from gpu_mem_track import MemTracker


def test_cpu_memory_limit_writes_the_oom_block_and_raises_torchs_error(logdir):  # noqa: F811
    tracker = MemTracker(device="cpu", cpu_memory_limit=64 << 20)
    keep = torch.ones(1024, 1024)
    tracker.track()
    with pytest.raises(torch.OutOfMemoryError) as caught:
        torch.empty(128 << 20, dtype=torch.uint8)
    assert "not enough memory" in str(caught.value)
    text = read(tracker.log_path)
    assert "! OUT OF MEMORY on cpu in aten::empty" in text, text
    assert ">> OUT OF MEMORY in aten::empty" in text
    snapshots = [line.split("snapshot: ")[1].split(" ")[0] for line in text.splitlines() if "snapshot: " in line]
    assert snapshots and os.path.getsize(snapshots[0]) > 0, text
    # The program goes on: memory under the limit still works, and tracking too.
    small = torch.ones(10)
    tracker.track()
    del keep, small


@needs_gpu
def test_cuda_oom_writes_the_block_and_raises_torchs_error(logdir):  # noqa: F811
    tracker = MemTracker(device=0)
    free, _ = torch.cuda.mem_get_info()
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(free * 4, dtype=torch.uint8, device="cuda")
    text = read(tracker.log_path)
    assert "OUT OF MEMORY on cuda:0" in text, text
