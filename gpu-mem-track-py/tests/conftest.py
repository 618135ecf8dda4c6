"""Helpers for the tests of the installed wheel. Each test that counts bytes runs in its own forked
process (pytest --forked): the registry and the wrapped CPU allocator are process-wide."""

from __future__ import annotations

import glob
import os
import re

import pytest
import torch

GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (none visible to torch here)")
LINE = re.compile(r"^([+-]) \| (\d+) \* Size:(\(.*?\))\s* \| Memory: ([0-9.e-]+) M \| (<class '[^']+'>)\s* \| (\S+)")


def read(path) -> str:
    with open(path) as f:
        return f.read()


def parse_blocks(path: str) -> list[tuple[list[tuple], str]]:
    """The log's blocks: (group lines as (sign, count, shape, MiB, class, dtype), At line)."""
    blocks, lines = [], []
    for raw in read(path).splitlines()[1:]:
        m = LINE.match(raw)
        if m:
            sign, n, shape, mib, cls, dtype = m.groups()
            lines.append((sign, int(n), shape, float(mib), cls, dtype))
        elif raw.startswith("At "):
            blocks.append((lines, raw))
            lines = []
    return blocks


@pytest.fixture
def logdir(tmp_path, monkeypatch):
    """A fresh working folder: MemTracker(path='') writes its log here."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def only_log(folder) -> str:
    logs = glob.glob(os.path.join(folder, "*gpu_mem_track.txt"))
    assert len(logs) == 1, logs
    return logs[0]


def device() -> torch.device:
    return torch.device("cuda:0" if GPU else "cpu")
