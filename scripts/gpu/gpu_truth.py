"""What a GPU measures for one model, in its own process (the GPU table's rows).

The models are models.py's (torchvision's by name, and the Hugging Face ones there). A torchvision
model is exported as TorchScript (scripted); a Hugging Face one (hf-bert, hf-gpt2) is traced on
cuda:0, as users trace where they train. The file is loaded on cuda:0 and run the way the estimator
models a step:
  inference: a no-grad forward;
  train:     models.train: forward, the loss (the model's own given labels, else the sum of every
             output tensor), backward, AdamW (foreach, PyTorch's CUDA default), grads set to None
             between two steps.
Prints one JSON line: baseline allocated (parameters + buffers + input), peak allocated and peak
reserved (`torch.cuda.max_memory_*`), the sizes of the blocks live at the peak, largest first, and
what a device profile is made of: the memory CUDA gives the device (`device_total`, as PyTorch's
`total_memory`), NVML's total and driver-reserved memory (what `--device-profile auto` reads), and
what NVML shows this process holding beyond PyTorch's reserved memory at the end
(`outside_pytorch`: the CUDA context, kernels and library handles); null where NVML cannot say.
The exported file stays in OUTDIR, for `gpu-mem-track estimate OUTDIR/NAME.pt --input SHAPE --mode
MODE --optimizer adamw --device-profile h100-80g`. With --snapshot FILE the run's memory history is
also written there (PyTorch's snapshot pickle from the model's and the input's allocation on, each
entry with the step's line as its one frame), for memory_viz and scripts/gpu/snapshot_gaps.py.

With --eager the Python model itself runs on cuda:0 (no TorchScript, no file): what
`gpu_mem_track.estimate(model, x)` and `Estimator` estimate in-process, where a traced graph may
free some tensors at other times (in_process.py sets the two side by side). Models trained with
labels (hf-llama) run eagerly only.

Usage: gpu_truth.py NAME MODE SHAPE OUTDIR [--eager] [--snapshot FILE]   (MODE train|inference, SHAPE 16x3x224x224)
"""
import ctypes
import gc
import json
import os
import subprocess
import sys
import time
import warnings
from collections import Counter

import torch
from models import HF, build, inputs, train

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
if not eager and name in HF and HF[name].with_labels:
    sys.exit(f"gpu_truth.py: {name} is trained with labels: run it with --eager")

if len(sys.argv) == 6 and sys.argv[5] == "--export-only":
    # Tracing runs the model on cuda:0, which leaves cuBLAS workspaces and cached blocks behind:
    # the file is written in a process of its own, so the measured one starts clean.
    if name in HF:
        traced = build(name, torchscript=True).to(dev).train(mode == "train")
        torch.jit.trace(traced, inputs(name, shape, dev)[0], strict=False).save(path)
    else:
        torch.jit.script(build(name).eval()).save(path)
    sys.exit(0)
if not eager:
    subprocess.run([sys.executable, __file__, *sys.argv[1:5], "--export-only"], check=True)
gc.collect()
start = torch.cuda.memory_allocated()
# Every allocation and free from the model's and the input's on (so that a replay of the history
# places them too): what is live at the peak, and the history to set beside the estimator's. The
# model first, as programs (and the estimator) do.
torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=1_000_000)
mod = build(name).to(dev) if eager else torch.jit.load(path, map_location=dev)
args, kwargs = inputs(name, shape, dev)
mod.train(mode == "train")
gc.collect()
torch.cuda.synchronize()
torch.cuda.empty_cache()
base = torch.cuda.memory_allocated()
torch.cuda.reset_peak_memory_stats()
if mode == "train":
    train(mod, args, kwargs)
else:
    with torch.no_grad():
        r = mod(*args, **kwargs)
        del r
torch.cuda.synchronize()
peak_allocated = torch.cuda.max_memory_allocated()
history = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
if snapshot:
    import pickle

    # Each entry keeps one frame, the step's line (forward, backward or the optimizer step, in
    # models.py or here): the Python stacks of a TorchScript model say nothing more, and would make
    # the file too big to bring back from a GPU machine.
    def here(frames):
        return [f for f in frames if f.get("filename", "").endswith(("models.py", "gpu_truth.py"))][:1]

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


def nvml_figures() -> dict:
    """What NVML shows of cuda:0, through the driver's libnvidia-ml: the device's total and the
    memory the driver reserves (`nvmlDeviceGetMemoryInfo_v2`, what `DeviceProfile::auto` reads),
    and what this process holds (nvidia-smi's per-process figure). Each is missing where NVML
    cannot say (no driver library, another PID namespace)."""

    class Memory(ctypes.Structure):  # nvmlMemory_v2_t
        _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                    ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    class ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t, as nvmlDeviceGetComputeRunningProcesses_v3 fills it
        _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]

    found: dict = {}
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return found
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
        handle = ctypes.c_void_p()
        if visible.isdigit():
            status = nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(visible)), ctypes.byref(handle))
        else:
            status = nvml.nvmlDeviceGetHandleByUUID(visible.encode(), ctypes.byref(handle))
        if status != 0:
            return found
        memory = Memory(version=ctypes.sizeof(Memory) | 2 << 24)
        if nvml.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(memory)) == 0:
            found.update(nvml_total=int(memory.total), nvml_reserved=int(memory.reserved))
        count, infos = ctypes.c_uint(256), (ProcessInfo * 256)()
        if nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), infos) == 0:
            used = [int(p.used) for p in infos[: count.value] if p.pid == os.getpid()]
            if used:
                found["process_used"] = used[0]
    except (OSError, AttributeError):
        pass
    return found


nvml = nvml_figures()
print(json.dumps({
    "name": name, "mode": mode, "shape": shape, "eager": eager, "baseline": base,
    "peak_allocated": peak_allocated, "peak_reserved": torch.cuda.max_memory_reserved(),
    "end_allocated": torch.cuda.memory_allocated(), "replayed_peak": best,
    "live_at_peak": sorted(([s, n] for s, n in sizes.items()), reverse=True),
    "device_total": torch.cuda.mem_get_info(0)[1],
    "outside_pytorch": nvml["process_used"] - torch.cuda.memory_reserved() if "process_used" in nvml else None,
    "nvml_total": nvml.get("nvml_total"), "nvml_reserved": nvml.get("nvml_reserved"),
    "seconds": round(time.time() - t0, 2),
    "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
}))
