"""Benchmark of the Python package (run by `scripts/dev bench python`, in a virtualenv holding
torch and the wheel).

1. `MemTracker.track()` at 1 000, 10 000 and 100 000 live tensors (on the CPU, or on CUDA with
   --device cuda), in the mix of `benches/track.rs`: 16 shapes, a quarter of the tensors views. Beside
   it, the Rust tracker's own track (`track!()`) timed in Rust on the same tensors, and their ratio (the
   Python call, the caller's frame and the returned dict); and Pytorch-Memory-Utils'
   `track()` in the same process when GMT_PMU_TRACKER (or --reference) names its
   `gpu_mem_track.py`. Its `get_tensors()` yields CUDA tensors only; the copy loaded here has that
   one test (`if tensor.is_cuda:`) made true, so it counts the CPU tensors, and nothing else
   changed. It is quadratic in the tensor count (`ts_list.count` per tensor), so it runs at 100 000
   only with --reference-all.
2. The installed registry's cost per op: a loop of small `torch.add`s, and a torchvision
   ResNet-18 forward on the CPU (when torchvision is installed), with the registry's callback on
   and off in alternating rounds.

Medians of repeated runs; the machine's load shows in the spread, so the min and max are printed
too.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time

import gpu_mem_track
import torch
from gpu_mem_track import MemTracker


def live_tensors(n: int, device: str) -> list[torch.Tensor]:
    """The mix of `benches/track.rs`: 16 shapes, every fourth tensor a view of its own base."""
    out = []
    for i in range(n):
        base = torch.zeros((i % 16 + 1, 4), device=device)
        out.append(base.view(-1) if i % 4 == 0 else base)
    return out


def load_reference(path: str):
    with open(path) as f:
        source = f.read()
    if "if tensor.is_cuda:" not in source:
        raise SystemExit(f"{path}: no `if tensor.is_cuda:` line; is this Pytorch-Memory-Utils' gpu_mem_track.py?")
    source = source.replace("if tensor.is_cuda:", "if True:  # CPU tensors counted", 1)
    spec = importlib.util.spec_from_loader("pmu_gpu_mem_track", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - the user's own copy of the tool
    return module


def timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < 1 else f"{seconds:.2f} s"


def spread(samples: list[float]) -> str:
    return f"{fmt(statistics.median(samples))} (min {fmt(min(samples))}, max {fmt(max(samples))})"


def bench_track(sizes: list[int], device: str, reference, reference_all: bool, folder: str) -> None:
    print(
        f"track() from Python, live {device} tensors, a quarter of them views (torch {torch.__version__}, "
        f"{os.cpu_count()} cores)"
    )
    print(
        f"{'live tensors':>12} | {'gpu_mem_track, Python':>38} | {'Rust tracker, same tensors':>38} | Python/Rust"
        f" | {'Pytorch-Memory-Utils':>38} | ratio"
    )
    for n in sizes:
        tensors = live_tensors(n, device)
        ours = MemTracker(device=device, path=os.path.join(folder, f"ours-{n}-"))
        ours.track()  # the first block lists them all
        runs = 50 if n <= 10_000 else 10
        mine = timed(ours.track, runs)
        rust = ours._tracker.time_tracks(__file__, 0, "bench_track", runs)
        versus = f"{statistics.median(mine) / statistics.median(rust):.2f}x"
        theirs_text, ratio = "not run", ""
        if reference is not None and (n <= 10_000 or reference_all):
            theirs = reference.MemTracker(path=os.path.join(folder, f"pmu-{n}-"))
            theirs.track()
            samples = timed(theirs.track, 3 if n <= 1_000 else 1)
            theirs_text = spread(samples)
            ratio = f"{statistics.median(samples) / statistics.median(mine):,.0f}x"
        elif reference is not None:
            theirs_text = "not run (quadratic; --reference-all)"
        print(f"{n:>12,} | {spread(mine):>38} | {spread(rust):>38} | {versus:>11} | {theirs_text:>38} | {ratio}")
        del tensors


def alternate(fn, rounds: int) -> tuple[list[float], list[float]]:
    """Times `fn` with the registry's callback on and off, alternating, `rounds` times each."""
    on, off = [], []
    for _ in range(rounds):
        with gpu_mem_track.registry_paused(find_tensors=False):
            off.append(timed(fn, 1)[0])
        on.append(timed(fn, 1)[0])
    return on, off


def bench_per_op(rounds: int) -> None:
    a, b = torch.ones(8), torch.ones(8)
    ops = 200_000

    def loop():
        for _ in range(ops):
            torch.add(a, b)

    loop()
    on, off = alternate(loop, rounds)
    on_us, off_us = (
        statistics.median(on) / ops * 1e6,
        statistics.median(off) / ops * 1e6,
    )
    print(
        f"\nper op, torch.add on 8 floats ({ops:,} ops x {rounds} rounds): registry on {on_us:.3f} us, "
        f"off {off_us:.3f} us: +{on_us - off_us:.3f} us per op"
    )
    try:
        import torchvision
    except ImportError:
        print("ResNet-18 forward: torchvision is not installed here")
        return
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(8, 3, 224, 224)

    def forward():
        with torch.no_grad():
            model(x)

    forward()
    on, off = alternate(forward, rounds)
    on_ms, off_ms = statistics.median(on) * 1e3, statistics.median(off) * 1e3
    print(
        f"ResNet-18 forward, batch 8, 224x224, CPU ({torch.get_num_threads()} threads, {rounds} rounds): "
        f"registry on {on_ms:.1f} ms, off {off_ms:.1f} ms: {100 * (on_ms / off_ms - 1):+.2f} %"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sizes",
        default="1000,10000,100000",
        help="live tensor counts, comma-separated",
    )
    parser.add_argument(
        "--reference",
        default=os.environ.get("GMT_PMU_TRACKER"),
        help="Pytorch-Memory-Utils' gpu_mem_track.py (default: $GMT_PMU_TRACKER)",
    )
    parser.add_argument("--reference-all", action="store_true", help="run the reference at every size")
    parser.add_argument("--device", default="cpu", help="where the live tensors are: cpu (default) or cuda")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds of the per-op figures")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    reference = load_reference(args.reference) if args.reference else None
    if reference is None:
        print(
            "(Pytorch-Memory-Utils' column needs its gpu_mem_track.py: GMT_PMU_TRACKER=path)",
            file=sys.stderr,
        )
    with tempfile.TemporaryDirectory() as folder:
        bench_track(sizes, args.device, reference, args.reference_all, folder)
    bench_per_op(args.rounds)


if __name__ == "__main__":
    main()
