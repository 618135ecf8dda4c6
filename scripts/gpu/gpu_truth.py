"""What a GPU measures for one model, in its own process (the GPU table's rows).

A torchvision model is exported as TorchScript (scripted); a Hugging Face one (NAME hf-bert: BERT
base, hf-gpt2: GPT-2 small, random weights, SHAPE batch x sequence of token ids) is traced on cuda:0,
as users trace where they train. The file is loaded on cuda:0 and run the way the estimator models a
step:
  inference: a no-grad forward;
  train:     forward, loss = sum of every output tensor, backward, AdamW (foreach, PyTorch's CUDA
             default), grads set to None between two steps.
Prints one JSON line: baseline allocated (parameters + buffers + input), peak allocated and peak
reserved (`torch.cuda.max_memory_*`), and the sizes of the blocks live at the peak, largest first.
The exported file stays in OUTDIR, for `gpu-mem-track estimate OUTDIR/NAME.pt --input SHAPE --mode
MODE --optimizer adamw --device-profile h100-80g`. With --snapshot FILE the run's memory history is
also written there (PyTorch's snapshot pickle from the input's and the model's allocation on, each
entry with this script's line as its one frame), for memory_viz and scripts/gpu/snapshot_gaps.py.

With --eager the Python model itself runs on cuda:0 (no TorchScript, no file): what
`gpu_mem_track.estimate(model, x)` and `Estimator` estimate in-process, where a traced graph may
free some tensors at other times.

Usage: gpu_truth.py NAME MODE SHAPE OUTDIR [--eager] [--snapshot FILE]   (MODE train|inference, SHAPE 16x3x224x224)
"""
import gc
import json
import subprocess
import sys
import time
import warnings
from collections import Counter

import torch
import torchvision

warnings.filterwarnings("ignore")
eager = "--eager" in sys.argv
if eager:
    sys.argv.remove("--eager")
if len(sys.argv) not in (5, 6, 7) or sys.argv[5:6] not in ([], ["--snapshot"], ["--export-only"]):
    sys.exit(__doc__)
name, mode, shape, out = sys.argv[1:5]
snapshot = sys.argv[6] if len(sys.argv) == 7 else None
if len(sys.argv) == 6 and sys.argv[5] == "--snapshot":
    sys.exit(__doc__)
if mode not in ("train", "inference"):
    sys.exit(f"gpu_truth.py: mode {mode!r}: train or inference")
shape = [int(s) for s in shape.split("x")]
path = f"{out}/{name}.pt"
t0 = time.time()
dev = torch.device("cuda:0")
if name.startswith("hf-"):
    ids = torch.randint(0, 1000, shape)
    x = ids.to(dev)
else:
    x = None


def build(name: str) -> torch.nn.Module:
    """The Python model (random weights, seeded), on the CPU."""
    torch.manual_seed(0)
    if name.startswith("hf-"):
        import transformers

        config, model = {
            "hf-bert": (transformers.BertConfig, transformers.BertModel),
            "hf-gpt2": (transformers.GPT2Config, transformers.GPT2Model),
        }[name]
        return model(config(torchscript=not eager, use_cache=False))
    return getattr(torchvision.models, name)()


if len(sys.argv) == 6 and sys.argv[5] == "--export-only":
    # Tracing runs the model on cuda:0, which leaves cuBLAS workspaces and cached blocks behind:
    # the file is written in a process of its own, so the measured one starts clean.
    if name.startswith("hf-"):
        traced = build(name).to(dev).train(mode == "train")
        torch.jit.trace(traced, (x,), strict=False).save(path)
    else:
        torch.jit.script(build(name).eval()).save(path)
    sys.exit(0)
if not eager:
    subprocess.run([sys.executable, __file__, *sys.argv[1:5], "--export-only"], check=True)
gc.collect()
start = torch.cuda.memory_allocated()
# Every allocation and free from the input's and the model's on (so that a replay of the history
# places them too): what is live at the peak, and the history to set beside the estimator's.
torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=1_000_000)
if x is None:
    x = torch.rand(shape, device=dev)
mod = build(name).to(dev) if eager else torch.jit.load(path, map_location=dev)
mod.train(mode == "train")
gc.collect()
torch.cuda.synchronize()
torch.cuda.empty_cache()
base = torch.cuda.memory_allocated()
torch.cuda.reset_peak_memory_stats()


def loss_of(v):
    """Sum of every tensor in a model output (tensor, tuple, list, dict values)."""
    if hasattr(v, "to_tuple"):  # a Hugging Face ModelOutput (eager)
        v = v.to_tuple()
    if isinstance(v, torch.Tensor):
        return v.sum()
    items = list(v.values()) if isinstance(v, dict) else list(v) if isinstance(v, (tuple, list)) else []
    total = None
    for item in items:
        part = loss_of(item)
        if part is not None:
            total = part if total is None else total + part
    return total


if mode == "train":
    opt = torch.optim.AdamW(list(mod.parameters()), lr=1e-3)
    for it in range(2):
        r = mod(x)
        loss = loss_of(r)
        del r
        loss.backward()
        del loss
        opt.step()
        if it < 1:
            opt.zero_grad(set_to_none=True)
else:
    with torch.no_grad():
        r = mod(x)
        del r
torch.cuda.synchronize()
peak_allocated = torch.cuda.max_memory_allocated()
history = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
if snapshot:
    import pickle

    # Each entry keeps one frame, this script's line (forward, backward or the optimizer step):
    # the Python stacks of a TorchScript model say nothing more, and would make the file too big
    # to bring back from a GPU machine.
    def here(frames):
        return [f for f in frames if f.get("filename", "").endswith("gpu_truth.py")][:1]

    for e in history["device_traces"][0]:
        e["frames"] = here(e.get("frames", []))
    for seg in history["segments"]:
        seg["frames"] = here(seg.get("frames", []))
        for b in seg.get("blocks", []):
            b["frames"] = here(b.get("frames", []))
    with open(snapshot, "wb") as f:
        pickle.dump(history, f)

# Replays the trace from where it started: the blocks live when allocated memory was highest.
live, now, best, at_peak = {}, start, start, {}
for e in history["device_traces"][0]:
    if e["action"] == "alloc":
        live[e["addr"]] = e["size"]
        now += e["size"]
        if now > best:
            best, at_peak = now, dict(live)
    elif e["action"] == "free_requested" and e["addr"] in live:
        now -= live.pop(e["addr"])
sizes = Counter(at_peak.values())
print(json.dumps({
    "name": name, "mode": mode, "shape": shape, "eager": eager, "baseline": base,
    "peak_allocated": peak_allocated, "peak_reserved": torch.cuda.max_memory_reserved(),
    "end_allocated": torch.cuda.memory_allocated(), "replayed_peak": best,
    "live_at_peak": sorted(([s, n] for s, n in sizes.items()), reverse=True),
    "seconds": round(time.time() - t0, 2),
    "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
}))
