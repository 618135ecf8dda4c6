"""The models the GPU checks run, and the step they train with: one definition for both sides.

`gpu_truth.py` runs a model on cuda:0 and measures it; `in_process.py` estimates the same Python
model, built by the same `build()` and trained by the same step, with `gpu_mem_track.estimate()`.
A name is a torchvision model (`resnet50`, SHAPE 16x3x224x224) or one of `HF` below (SHAPE
batch x sequence of token ids):
  hf-bert, hf-gpt2     BERT base and GPT-2 small, called with the ids alone (the GPU table's rows);
  hf-llama             a 4-layer Llama with grouped-query attention (16 query heads, 4 key/value
                       heads), float32, trained as users train causal LMs: `input_ids`,
                       `attention_mask` and `labels`, the loss the model returns;
  hf-llama-bf16        the same model in bfloat16.
Random weights, seeded: `build()` makes the same model on every machine.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

LLAMA = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
}


class HfModel(NamedTuple):
    config: str  # transformers' config class
    model: str  # and model class
    fields: dict  # config fields beyond the class's defaults
    dtype: torch.dtype
    with_labels: bool  # called with input_ids, attention_mask and labels, trained on its own loss


HF = {
    "hf-bert": HfModel("BertConfig", "BertModel", {}, torch.float32, False),
    "hf-gpt2": HfModel("GPT2Config", "GPT2Model", {}, torch.float32, False),
    "hf-llama": HfModel("LlamaConfig", "LlamaForCausalLM", LLAMA, torch.float32, True),
    "hf-llama-bf16": HfModel("LlamaConfig", "LlamaForCausalLM", LLAMA, torch.bfloat16, True),
}


def build(name: str, torchscript: bool = False) -> torch.nn.Module:
    """The Python model, random weights (seeded), on the CPU; ``torchscript``: a Hugging Face
    model that returns tuples, for ``torch.jit.trace``."""
    torch.manual_seed(0)
    if name in HF:
        import transformers

        hf = HF[name]
        config = getattr(transformers, hf.config)(torchscript=torchscript, use_cache=False, **hf.fields)
        return getattr(transformers, hf.model)(config).to(hf.dtype)
    import torchvision

    return getattr(torchvision.models, name)()


def inputs(name: str, shape: list[int], device: Any) -> tuple[tuple, dict]:
    """The model's call arguments on ``device`` (args, kwargs): token ids for a Hugging Face
    model (with an all-ones attention mask and the ids as labels for one trained with labels),
    an image batch for torchvision's."""
    if name not in HF:
        return (torch.rand(shape, device=device),), {}
    torch.manual_seed(1)
    ids = torch.randint(0, 1000, shape).to(device)
    if not HF[name].with_labels:
        return (ids,), {}
    return (), {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def loss_of(output: Any) -> torch.Tensor | None:
    """The loss a step backpropagates: the output's ``loss`` (a Hugging Face model given labels),
    else the sum of every tensor in it (tensor, tuple, list, dict values), as the estimator
    trains a model file."""
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if hasattr(output, "to_tuple"):  # a Hugging Face ModelOutput
        output = output.to_tuple()
    if isinstance(output, torch.Tensor):
        return output.sum()
    items = list(output.values()) if isinstance(output, dict) else list(output) if isinstance(output, (tuple, list)) else []
    total = None
    for item in items:
        part = loss_of(item)
        if part is not None:
            total = part if total is None else total + part
    return total


def train(model: torch.nn.Module, args: tuple, kwargs: dict, steps: int = 2) -> None:
    """``steps`` training steps as the estimator models one: forward, the loss, backward, AdamW
    (foreach, PyTorch's CUDA default), gradients set to None between steps."""
    opt = torch.optim.AdamW(list(model.parameters()), lr=1e-3, foreach=True)
    for it in range(steps):
        out = model(*args, **kwargs)
        loss = loss_of(out)
        del out
        loss.backward()
        del loss
        opt.step()
        if it + 1 < steps:
            opt.zero_grad(set_to_none=True)
