"""The GPU table's two Hugging Face rows, estimated in-process from the Python models.

Each model is built as scripts/gpu/gpu_truth.py builds it (random weights, `use_cache=False`)
and estimated by `gpu_mem_track.estimate(model, ids, optimizer="adamw")`: two training steps of
forward, loss = the sum of the outputs, backward and AdamW foreach, as gpu_truth.py runs them on a
GPU. Each is printed beside what an H100 measured for the traced model (issue 41's reference
figures: NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, 2026-11-27).

usage: python scripts/figures/hf_rows.py        (needs gpu_mem_track and transformers installed)
"""

from __future__ import annotations

import gpu_mem_track
import torch
import transformers

MIB = 2**20
# name: (config, model class, input shape, GPU peak allocated MiB, GPU peak reserved MiB)
ROWS = {
    "hf-bert": (transformers.BertConfig, transformers.BertModel, (8, 128), 2191.1, 2472),
    "hf-gpt2": (transformers.GPT2Config, transformers.GPT2Model, (4, 128), 2448.8, 2760),
}


def main() -> None:
    print("row       shape    predicted allocated  GPU  (GPU % above)  predicted reserved  GPU  (% off)")
    for name, (config, model_class, shape, gpu_allocated, gpu_reserved) in ROWS.items():
        torch.manual_seed(0)
        model = model_class(config(use_cache=False))
        ids = torch.randint(0, 1000, shape)
        gpu = gpu_mem_track.estimate(model, ids, optimizer="adamw", device_profile="h100-80g").gpu
        allocated = gpu["peak_allocated"]["high"] / MIB
        reserved = gpu["peak_reserved"]["high"] / MIB
        print(
            f"{name:9} {'x'.join(map(str, shape)):8} {allocated:15.1f} {gpu_allocated:10.1f} "
            f"{100 * (gpu_allocated / allocated - 1):+8.2f} {reserved:15.0f} {gpu_reserved:9.0f} "
            f"{100 * (reserved / gpu_reserved - 1):+8.2f}"
        )


if __name__ == "__main__":
    main()
