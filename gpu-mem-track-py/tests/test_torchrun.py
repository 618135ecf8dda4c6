"""Under torchrun: each rank's ``MemTracker`` writes a log of its own, named by its rank, with its
own tensors and DDP's gradient bucket, and ``gpu-mem-track report`` reads the ranks' logs together, naming the rank that peaks highest and
what it holds beyond the other.
Two gloo ranks on the CPU (``torch.distributed.run``, what the ``torchrun`` command runs)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest
import torch

SCRIPT = """
import os, sys
import torch, torch.distributed as dist
from gpu_mem_track import MemTracker

dist.init_process_group("gloo")
rank = dist.get_rank()
tracker = MemTracker(path=os.path.join(sys.argv[1], "run-"), device="cpu")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 32))
mine = torch.zeros(rank + 3, 7)  # a tensor only this rank holds
extra = torch.zeros(1024, 256) if rank == 1 else None  # 1 MiB more on rank 1: its peak is higher
tracker.track()
model(torch.randn(16, 64)).sum().backward()
tracker.track()
# DDP's reducer outliving the process group aborts some exits ("terminate called without an
# active exception", 2 in 12 runs of this script without gpu_mem_track): it goes first.
del model
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.skipif(not torch.distributed.is_available(), reason="this torch has no torch.distributed")
def test_two_gloo_ranks_log_their_own_tensors_and_report_reads_both(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_PROCID")}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    out = subprocess.run(
        [*launch, str(script), str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    logs = sorted(glob.glob(str(tmp_path / "run-*gpu_mem_track.txt")))
    assert [os.path.basename(p).split("-")[-2] for p in logs] == ["rank0", "rank1"], logs
    for rank, log in enumerate(logs):
        with open(log) as f:
            text = f.read()
        assert f"Size:({rank + 3}, 7)" in text, text
        assert f"Size:({4 - rank}, 7)" not in text, "another rank's tensor in this rank's log"
        # DDP's gradient bucket: one flat tensor holding every parameter's gradient (64*32 + 32).
        assert "Size:(2080,)" in text, text
    report = subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", "report", *logs], check=False, capture_output=True, text=True, timeout=120
    )
    assert report.returncode == 0, report.stderr
    assert "rank 0" in report.stdout and "rank 1" in report.stdout, report.stdout
    # The combined part names the higher rank, its peak's line, and what it holds beyond rank 0.
    assert "rank 1 (" in report.stdout and "peaks highest" in report.stdout, report.stdout
    # Its peak (at the log's 0.1 MiB, first reached) is the first track() after `extra` is made.
    first_track = next(i for i, line in enumerate(SCRIPT.splitlines()) if line.startswith("extra =")) + 2  # 1-based
    assert f"train.py line {first_track}:" in report.stdout.split("peaks highest")[1].splitlines()[0], report.stdout
    extra = [line for line in report.stdout.splitlines() if "Size:(1024, 256) torch.float32" in line]
    assert extra and "(others at most 0) (+1.0 MiB)" in extra[-1], report.stdout
    assert "1 x Size:(4, 7) torch.float32" in report.stdout, report.stdout
