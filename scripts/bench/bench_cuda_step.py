"""The Python twin of `benches/cuda_step.rs`: what tracking a launch-bound CUDA training step costs
from Python, as a user runs it (`import gpu_mem_track`, a `MemTracker`, `track()` each step).

The same step: an 8-layer MLP (width 256 and 2048, batch 64, ReLU, cross-entropy,
`torch.optim.Adam`) on `cuda:0` without a sync per step, so the CPU's time per op is what the step
costs. Stages, in one process:

| stage | what runs |
|---|---|
| `without` | nothing of gpu-mem-track: measured before the package is imported |
| `registry_paused` | imported, the registry paused (`gpu_mem_track.registry_paused()`) |
| `registry` | the per-op callback recording every op's outputs |
| `track` | a `MemTracker(device=0, nvml=False)` and a `track()` after every step |
| `track_nvml` | the same with NVML read at each `track()` (the default) |

Each figure is the median of 7 runs of 300 steps, in ms per step, after 50 warm-up steps; the
installed stages take turns run by run. `scripts/gpu-check` runs it beside `bench/cuda_step`.
Without a CUDA device it says so and measures nothing.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import tempfile
import time

import torch

WIDTHS = (256, 2048)


class Mlp:
    def __init__(self, width: int) -> None:
        torch.manual_seed(0)
        layers: list[torch.nn.Module] = []
        for layer in range(8):
            layers.append(torch.nn.Linear(width, 10 if layer == 7 else width))
            if layer < 7:
                layers.append(torch.nn.ReLU())
        self.model = torch.nn.Sequential(*layers).cuda()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.x = torch.randn(64, width, device="cuda")
        self.y = torch.randint(10, (64,), device="cuda")

    def step(self) -> None:
        loss = torch.nn.functional.cross_entropy(self.model(self.x), self.y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


def run(mlp: Mlp, steps: int, after_step=None) -> float:
    """Ms per step of one run of `steps` steps."""
    start = time.perf_counter()
    for _ in range(steps):
        mlp.step()
        if after_step is not None:
            after_step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warm-up", type=int, default=50)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_cuda_step: torch sees no CUDA device; this bench measures a CUDA step, nothing ran")
        return
    if "gpu_mem_track" in sys.modules:
        raise SystemExit("bench_cuda_step: gpu_mem_track is imported already; `without` must run before it")
    without = {}
    for width in WIDTHS:
        mlp = Mlp(width)
        run(mlp, args.warm_up)
        without[width] = statistics.median(run(mlp, args.steps) for _ in range(args.runs))

    gmt = importlib.import_module("gpu_mem_track")
    callbacks = gmt._native.registry_callbacks
    with tempfile.TemporaryDirectory() as logs:
        quiet = gmt.MemTracker(path=os.path.join(logs, "quiet-"), device=0, nvml=False)
        with_nvml = gmt.MemTracker(path=os.path.join(logs, "nvml-"), device=0)
        print(
            f"ms per step (median of {args.runs} runs of {args.steps} steps; the installed stages take turns), "
            f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}:"
        )
        for width in WIDTHS:
            mlp = Mlp(width)
            run(mlp, args.warm_up)
            before = callbacks()
            mlp.step()
            per_step = callbacks() - before
            runs: dict[str, list[float]] = {s: [] for s in ("registry_paused", "registry", "track", "track_nvml")}
            for _ in range(args.runs):
                with gmt.registry_paused(find_tensors=False):
                    runs["registry_paused"].append(run(mlp, args.steps))
                runs["registry"].append(run(mlp, args.steps))
                runs["track"].append(run(mlp, args.steps, quiet.track))
                runs["track_nvml"].append(run(mlp, args.steps, with_nvml.track))
            base = without[width]
            print(f"width {width:>4} without          {base:.3f} ms")
            for stage, times in runs.items():
                ms = statistics.median(times)
                print(
                    f"width {width:>4} {stage:<16} {ms:.3f} ms ({100 * (ms / base - 1):+.1f} %, "
                    f"{(ms - base) * 1e3 / max(per_step, 1):.2f} us per op callback of {per_step})"
                )


if __name__ == "__main__":
    main()
