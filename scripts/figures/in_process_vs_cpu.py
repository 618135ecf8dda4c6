"""The in-process estimator's lifetimes against a real run: for each Hugging Face architecture below
(small configs, dropout 0, attention in matmuls), two AdamW steps trained with `input_ids`,
`attention_mask` and `labels`, and for torchvision's Swin-T (4x3x224x224, the sum of its outputs),
estimated under `with Estimator():` and really run on the CPU under `MemTracker(device="cpu")`.
Each line: the peak above the model and the batch, both ways.

Where CPU and CUDA kernels allocate alike (they do here; not for dropout, which on the CPU keeps a
float32 noise tensor where CUDA keeps a bool mask, nor for convolutions or fused attention), the two
agree to within the scalars a GPU run keeps on the CPU: a wrong lifetime shows as a whole tensor.

usage: python scripts/figures/in_process_vs_cpu.py [NAME ...]   (needs gpu_mem_track, transformers,
       torchvision)
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
import warnings

import gpu_mem_track
import torch
import torchvision
import transformers

MIB = 2**20
COMMON = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000}
KV = {"num_key_value_heads": 2}
# name: (config class, auto class, config fields beyond COMMON)
ARCHS = {
    "llama": ("LlamaConfig", "AutoModelForCausalLM", KV),
    "mistral": ("MistralConfig", "AutoModelForCausalLM", KV),
    "qwen2": ("Qwen2Config", "AutoModelForCausalLM", KV),
    "qwen3": ("Qwen3Config", "AutoModelForCausalLM", {**KV, "head_dim": 32}),
    "phi": ("PhiConfig", "AutoModelForCausalLM", {}),
    "phi3": ("Phi3Config", "AutoModelForCausalLM", {"pad_token_id": 0}),
    "gemma": ("GemmaConfig", "AutoModelForCausalLM", {"num_key_value_heads": 1, "head_dim": 32}),
    "gemma2": ("Gemma2Config", "AutoModelForCausalLM", {**KV, "head_dim": 32}),
    "gpt2": ("GPT2Config", "AutoModelForCausalLM", {"n_embd": 128, "n_layer": 2, "n_head": 4}),
    "gpt_neox": ("GPTNeoXConfig", "AutoModelForCausalLM", {}),
    "gptj": ("GPTJConfig", "AutoModelForCausalLM", {"n_embd": 128, "n_layer": 2, "n_head": 4, "rotary_dim": 16}),
    "falcon": ("FalconConfig", "AutoModelForCausalLM", {}),
    "opt": ("OPTConfig", "AutoModelForCausalLM", {"ffn_dim": 256, "word_embed_proj_dim": 128}),
    "bloom": ("BloomConfig", "AutoModelForCausalLM", {"n_layer": 2, "n_head": 4}),
    "olmo": ("OlmoConfig", "AutoModelForCausalLM", {}),
    "mixtral": ("MixtralConfig", "AutoModelForCausalLM", {**KV, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "AutoModelForCausalLM",
        {**KV, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 128},
    ),
    "bert": ("BertConfig", "AutoModelForMaskedLM", {}),
    "roberta": ("RobertaConfig", "AutoModelForMaskedLM", {}),
    "deberta-v2": ("DebertaV2Config", "AutoModelForMaskedLM", {}),
    "electra": ("ElectraConfig", "AutoModelForMaskedLM", {"embedding_size": 128}),
    "bart": (
        "BartConfig",
        "AutoModelForSeq2SeqLM",
        {"d_model": 128, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
         "decoder_attention_heads": 4, "encoder_ffn_dim": 256, "decoder_ffn_dim": 256},
    ),
}


# torchvision models whose CPU kernels allocate as CUDA's do (no dropout; one patchifying convolution)
TORCHVISION = {"swin_t": (4, 3, 224, 224)}


def build(name: str) -> torch.nn.Module:
    if name in TORCHVISION:
        torch.manual_seed(0)
        return getattr(torchvision.models, name)()
    config_class, auto_class, fields = ARCHS[name]
    config = getattr(transformers, config_class)(**{**COMMON, **fields})
    for key, value in list(vars(config).items()):
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
            setattr(config, key, 0.0)
    torch.manual_seed(0)
    return getattr(transformers, auto_class).from_config(config, attn_implementation="eager")


def batch(name: str) -> dict:
    torch.manual_seed(1)
    if name in TORCHVISION:
        return {"x": torch.rand(TORCHVISION[name])}
    ids = torch.randint(3, 1000, (4, 64))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def step(model, opt: torch.optim.Optimizer, inputs: dict) -> None:
    """One training step: a Hugging Face model's loss, or the sum of a torchvision model's outputs."""
    if "x" in inputs:
        model(inputs["x"]).sum().backward()
    else:
        model(**inputs).loss.backward()
    opt.step()
    opt.zero_grad()


def train(model: torch.nn.Module, inputs: dict) -> None:
    opt = torch.optim.AdamW(model.parameters(), foreach=True)  # the CUDA default, asked for on the CPU
    for _ in range(2):
        step(model, opt, inputs)


def main() -> int:
    warnings.filterwarnings("ignore")
    known = [*ARCHS, *TORCHVISION]
    names = sys.argv[1:] or known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"in_process_vs_cpu.py: unknown {unknown}; one of {', '.join(known)}")
    logs = tempfile.mkdtemp()
    print(
        f"peak above the model and the batch, MiB (torch {torch.__version__}, transformers {transformers.__version__},"
        f" torchvision {torchvision.__version__})"
    )
    worst = 0.0
    for name in names:
        started = time.time()
        inputs = batch(name)
        with gpu_mem_track.Estimator(device_profile="cuda") as est:
            train(build(name).cuda(), {k: v.cuda() for k, v in inputs.items()})
        e = est.result
        estimated = max(p["peak_bytes"] for p in e["phases"]) - e["param_bytes"] - e["buffer_bytes"] - e["input_bytes"]
        model, inputs = build(name), batch(name)
        tracker = gpu_mem_track.MemTracker(device="cpu", path=f"{logs}/", detail=False)
        before = tracker.track()["allocated"]
        train(model, inputs)
        measured = tracker.track()["peak_allocated"] - before
        worst = max(worst, abs(estimated - measured))
        print(
            f"{name:<12} in-process {estimated / MIB:9.2f}  CPU run {measured / MIB:9.2f}"
            f"  ({estimated - measured:+d} B)  [{time.time() - started:.0f} s]",
            flush=True,
        )
        del model, tracker
        gc.collect()
    print(f"largest difference: {worst:.0f} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
