"""The in-process estimate of a torch.compile'd training step against the same compiled step really
run on the CPU (inductor's CPU backend), measured by `MemTracker(device="cpu")`; and the eager
estimate beside it.

For each model: `torch.compile(model)` with the default backend (inductor), a warm-up step (it
compiles), then two AdamW steps (foreach, the CUDA default). Hugging Face models: small configs,
eager attention, dropout 0, trained with `input_ids` and `labels`; torchvision's: the sum of the
outputs. Each line: the peak above the model and the batch of the two steps after the warm-up: the
compiled estimate, the real compiled run, the eager estimate. Each step's batch is made for it (as a
data loader makes it) in the estimate, and is the same tensor in the run: the same bytes.

Where the model has convolutions, the run's peak holds scratch of the CPU's convolution kernels
(oneDNN's, allocated and freed within the kernel), which a GPU's kernels do not allocate there
(cuDNN's workspace is the caching allocator model's). The line then also gives the run without it:
one more step under torch.profiler, whose allocation events name the op that made each storage.

usage: python scripts/figures/compiled_vs_cpu.py [--budget F] [NAME ...]
       (needs gpu_mem_track, transformers, torchvision, and a C++ compiler for the real run)
--budget F sets torch._functorch.config.activation_memory_budget for both the estimate and the run.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import warnings

import gpu_mem_track
import torch
import torchvision
import transformers
from in_process_vs_cpu import step  # this folder's: the same training step
from torch._C._profiler import _EventType

MIB = 2**20
LLM = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8, "vocab_size": 4000}
# name: (config class, auto class, config fields), or a torchvision model and its input's shape
MODELS = {
    "gpt2": ("GPT2Config", "AutoModelForCausalLM", {"n_embd": 256, "n_layer": 2, "n_head": 8, "vocab_size": 4000}),
    "llama": ("LlamaConfig", "AutoModelForCausalLM", {**LLM, "num_key_value_heads": 4}),
    "bert": ("BertConfig", "AutoModelForMaskedLM", LLM),
    "vit_b_16": (16, 3, 224, 224),
    "resnet50": (8, 3, 224, 224),
}


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    spec = MODELS[name]
    if isinstance(spec[0], int):
        return getattr(torchvision.models, name)()
    config_class, auto_class, fields = spec
    config = getattr(transformers, config_class)(**fields)
    for key, value in list(vars(config).items()):
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
            setattr(config, key, 0.0)
    return getattr(transformers, auto_class).from_config(config, attn_implementation="eager")


def batch(name: str) -> dict:
    torch.manual_seed(1)
    spec = MODELS[name]
    if isinstance(spec[0], int):
        return {"x": torch.rand(spec)}
    ids = torch.randint(3, 4000, (8, 256))
    return {"input_ids": ids, "labels": ids}


def above_model(e) -> int:
    """The estimate's peak of the steps after the warm-up, above the model and the batch."""
    later = [p["peak_bytes"] for p in e["phases"] if p.get("iteration", 1) > 1] or [p["peak_bytes"] for p in e["phases"]]
    return max(later) - e["param_bytes"] - e["buffer_bytes"] - e["input_bytes"]


def estimated(name: str, compiled: bool) -> tuple[int, dict | None]:
    inputs = batch(name)
    with gpu_mem_track.Estimator(device_profile="cuda") as est:
        model = build(name).cuda()
        run = torch.compile(model) if compiled else model
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        for _ in range(3):
            step(run, opt, {k: v.cuda() for k, v in inputs.items()})
    return above_model(est.result), est.result.get("compiled")


def kernel_scratch(run, opt, inputs) -> int:
    """How far one step's peak falls without the CPU convolution kernels' own scratch: the storages
    a convolution's kernel allocates itself (the innermost op at the allocation is the convolution)
    and frees before it returns. What the kernel makes through other ops (a weight copied to the
    input's memory format) is kept: cuDNN makes it too."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step(run, opt, inputs)
    events = []  # (time, storage, bytes: negative when freed, the ops it was made in, outermost first)

    def walk(node, ops: list) -> None:
        if node.typed[0] == _EventType.Allocation:
            if node.typed[1].device.type == "cpu":
                events.append((node.start_time_ns, node.typed[1].ptr, node.typed[1].alloc_size, ops))
            return
        for child in node.children:
            walk(child, [*ops, (node.name, node.start_time_ns, node.end_time_ns)])

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, [])
    events.sort(key=lambda e: e[0])
    made, scratch = {}, set()
    for i, (t, ptr, n, ops) in enumerate(events):
        if n > 0:
            made[ptr] = i
        elif ptr in made:
            j = made.pop(ptr)
            inner = events[j][3][-1] if events[j][3] else ("", 0, 0)
            if "convolution" in inner[0] and t <= inner[2]:
                scratch.update((i, j))

    def peak(skip: set) -> int:
        live = top = 0
        for i, e in enumerate(events):
            if i not in skip:
                live += e[2]
                top = max(top, live)
        return top

    return peak(set()) - peak(scratch)


def measured(name: str, logs: str) -> tuple[int, int]:
    """The real compiled run's peak above the model and the batch, and its convolutions' scratch."""
    torch._dynamo.reset()
    model, inputs = build(name), batch(name)
    tracker = gpu_mem_track.MemTracker(device="cpu", path=f"{logs}/", detail=False)
    base = tracker.track()["allocated"]  # the model and the batch
    run = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    step(run, opt, inputs)  # compiles
    tracker.track()
    for _ in range(2):
        step(run, opt, inputs)
    peak = tracker.track()["peak_allocated"] - base
    scratch = kernel_scratch(run, opt, inputs)
    del model, run, opt, tracker
    gc.collect()
    return peak, scratch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=None)
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    names = args.names or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise SystemExit(f"compiled_vs_cpu.py: unknown {unknown}; one of {', '.join(MODELS)}")
    if args.budget is not None:
        torch._functorch.config.activation_memory_budget = args.budget
    logs = tempfile.mkdtemp()
    print(
        f"peak above the model and the batch, MiB (torch {torch.__version__}, transformers {transformers.__version__},"
        f" torchvision {torchvision.__version__}, activation_memory_budget"
        f" {torch._functorch.config.activation_memory_budget})"
    )
    worst = 0.0
    for name in names:
        started = time.time()
        compiled, graphs = estimated(name, compiled=True)
        eager, _ = estimated(name, compiled=False)
        real, scratch = measured(name, logs)
        off = (compiled - real) / real * 100
        worst = max(worst, abs(off))
        breaks = len(graphs["graph_breaks"]) if graphs else 0
        less = ""
        if scratch:
            kernels = real - scratch
            less = (
                f"  the run less its convolutions' scratch ({scratch / MIB:.1f}) {kernels / MIB:8.1f}:"
                f" compiled {(compiled - kernels) / kernels * 100:+.2f} %, eager {(eager - kernels) / kernels * 100:+.2f} %"
            )
        print(
            f"{name:<10} compiled estimate {compiled / MIB:8.1f}  compiled CPU run {real / MIB:8.1f} ({off:+.2f} %)"
            f"  eager estimate {eager / MIB:8.1f} ({(eager - real) / real * 100:+.1f} %){less}"
            f"  graphs {len(graphs['graphs']) if graphs else 0}, breaks {breaks}  [{time.time() - started:.0f} s]",
            flush=True,
        )
    print(f"largest difference of the compiled estimate: {worst:.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
