"""The acceptance a GPU prediction is held to, read from where the Rust GPU tests take it
(gpu-mem-track-testkit/src/lib.rs: one copy of the figures), and the line that holds one
prediction to what a GPU measured (`scripts/gpu-check`'s estimates.txt, in_process.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "gpu-mem-track-testkit/src/lib.rs"
HEADER = "model mode shape: GPU allocated, predicted (% above high, % below low); GPU reserved, predicted (% off)"


def limits() -> tuple[float, float, float]:
    """(% above the predicted high end, % below its low end) for peak allocated, and % outside the
    predicted range for peak reserved, each in % of the GPU's figure."""
    text = SOURCE.read_text()

    def pct(name: str) -> float:
        m = re.search(rf"pub const {name}: f64 = ([0-9.]+);", text)
        if m is None:
            raise SystemExit(f"{SOURCE}: no `pub const {name}: f64`")
        return float(m.group(1))

    return pct("GPU_ALLOCATED_ABOVE_PCT"), pct("GPU_ALLOCATED_BELOW_PCT"), pct("GPU_RESERVED_PCT")


def verdict(truth: dict, gpu: dict) -> str:
    """One line: `ok ` or `OFF`, the row (a truth.jsonl line), what the GPU measured beside the
    prediction (an estimate's `gpu` object), in MiB, and by how much it misses."""
    max_above, max_below, max_off = limits()
    mib = 2**20
    a, r = truth["peak_allocated"] / mib, truth["peak_reserved"] / mib
    lo, hi = gpu["peak_allocated"]["low"] / mib, gpu["peak_allocated"]["high"] / mib
    rlo, rhi = gpu["peak_reserved"]["low"] / mib, gpu["peak_reserved"]["high"] / mib
    above, below = max(a - hi, 0) / a * 100, max(lo - a, 0) / a * 100
    off = max(r - rhi, rlo - r, 0) / r * 100
    ok = above <= max_above and below <= max_below and off <= max_off
    name = truth["name"] + (" (eager)" if truth.get("eager") else "")
    shape = "x".join(map(str, truth["shape"]))
    return (
        f"{'ok ' if ok else 'OFF'} {name} {truth['mode']} {shape}: {a:.1f}, {lo:.1f}-{hi:.1f}"
        f" ({above:.2f} % above, {below:.2f} % below); {r:.0f}, {rlo:.0f}-{rhi:.0f} ({off:.2f} % off)"
    )
