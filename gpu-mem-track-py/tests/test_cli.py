"""``python -m gpu_mem_track``: the command line of the lean binary, through the same extension."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from conftest import read
from gpu_mem_track import MemTracker


def cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpu_mem_track", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def make_log(folder) -> str:
    tracker = MemTracker(device="cpu", path=os.path.join(folder, "run-"))
    tracker.track()
    big = torch.ones(1024, 1024, 3)  # 12 MiB
    tracker.track()
    del big
    tracker.track()
    return tracker.log_path


def test_report_names_the_peak_line(tmp_path):
    log = make_log(tmp_path)
    out = cli("report", log, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "12.0" in out.stdout and "test_cli.py" in out.stdout, out.stdout
    as_json = cli("report", "--json", log, cwd=tmp_path)
    assert as_json.returncode == 0 and as_json.stdout.lstrip().startswith(("{", "[")), as_json.stdout


def test_plot_writes_a_png_and_refuses_other_extensions(tmp_path):
    log = make_log(tmp_path)
    out = cli("plot", log, "-o", str(tmp_path / "memory.png"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    with open(tmp_path / "memory.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    bad = cli("plot", log, "-o", str(tmp_path / "memory.txt"), cwd=tmp_path)
    assert bad.returncode == 1 and "memory.txt" in bad.stderr, bad.stderr


def test_errors_name_the_file_and_usage_exits_2(tmp_path):
    missing = cli("report", str(tmp_path / "missing-gpu_mem_track.txt"), cwd=tmp_path)
    assert missing.returncode == 1
    last = missing.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "missing-gpu_mem_track.txt" in last, missing.stderr
    usage = cli("no-such-command", cwd=tmp_path)
    assert usage.returncode == 2, usage
    helped = cli("--help", cwd=tmp_path)
    assert helped.returncode == 0 and "report" in helped.stdout


def test_watch_logs_samples(tmp_path):
    out = cli(
        "watch",
        "--simulate-nvml",
        "2",
        "--samples",
        "3",
        "--interval",
        "1ms",
        "--log-dir",
        str(tmp_path / "w"),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    logs = os.listdir(tmp_path / "w")
    assert logs and read(tmp_path / "w" / logs[0]).count("\nAt ") >= 3
