"""The in-process estimate of a torch.compile'd training step against the same compiled step really
run on the CPU (inductor's CPU backend), measured by `MemTracker(device="cpu")`; and the eager
estimate beside it.

For each model: `torch.compile(model)` with the default backend (inductor), a warm-up step (it
compiles), then two AdamW steps (foreach, the CUDA default). Hugging Face models: small configs,
eager attention, dropout 0, trained with `input_ids` and `labels`; torchvision's: the sum of the
outputs. Each line: the peak above the model and the batch of the two steps after the warm-up: the
compiled estimate, the real compiled run, the eager estimate.

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


def measured(name: str, logs: str) -> int:
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
    del model, run, opt, tracker
    gc.collect()
    return peak


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
        real = measured(name, logs)
        off = (compiled - real) / real * 100
        worst = max(worst, abs(off))
        breaks = len(graphs["graph_breaks"]) if graphs else 0
        print(
            f"{name:<10} compiled estimate {compiled / MIB:8.1f}  compiled CPU run {real / MIB:8.1f} ({off:+.2f} %)"
            f"  eager estimate {eager / MIB:8.1f} ({(eager - real) / real * 100:+.1f} %)"
            f"  graphs {len(graphs['graphs']) if graphs else 0}, breaks {breaks}  [{time.time() - started:.0f} s]",
            flush=True,
        )
    print(f"largest difference of the compiled estimate: {worst:.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
