"""The distributed estimate's benchmark on a model that does not fit one GPU: a Llama-3-8B-shaped
config (32 layers, 4096 wide, 32 heads with 8 KV heads, FFN 14336, vocabulary 128 256) trained with
AdamW (fp32 weights and states: 16 bytes a parameter, 128 GB), FSDP2 on each decoder layer and the
root with a bfloat16 `MixedPrecisionPolicy`, activation checkpointing, one step at 1 x 8 192 tokens,
as rank 0 of N. The model is built on the GPU, then sharded. Prints the seconds, the process's peak
RSS and rank 0's estimate on h100-80g; `--fit 1,2,4,8` searches the largest batch per rank at each
world size and names the fewest ranks that fit.

(A 70B model is built on meta before `fully_shard` and given memory with `to_empty`, which swaps
each parameter: with gpu_mem_track imported, torch.utils.swap_tensors refuses tensors the
live-tensor registry holds weakly, so that program does not run yet.)

Usage: python scripts/bench/fsdp_llama_estimate.py [--ranks N] [--seq S] [--fit N,N,...]
       (needs torch >= 2.11, transformers, gpu_mem_track; no GPU)
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import torch
import transformers


def config() -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    )


def program(cfg: transformers.LlamaConfig, batch: int, seq: int) -> None:
    """The user's program, as torchrun runs it on each rank."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.gradient_checkpointing_enable()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--fit", help="world sizes to search, comma-separated (1,2,4,8)")
    args = parser.parse_args()
    import warnings

    import gpu_mem_track

    warnings.filterwarnings("ignore")
    cfg = config()
    started = time.time()
    if args.fit:
        sizes = [int(n) for n in args.fit.split(",")]
        found = gpu_mem_track.fit(
            lambda batch: program(cfg, batch, args.seq), device_profile="h100-80g", world_size=sizes, max=16
        )
        for at in found["world_sizes"]:
            print(f"{at['world_size']:>3} ranks: largest batch per rank {at['largest']} (x {args.seq} tokens)")
        print(f"fewest ranks that fit h100-80g: {found['smallest_world_size']}")
    else:
        with gpu_mem_track.Estimator(device_profile="h100-80g", world_size=args.ranks, rank=0) as est:
            program(cfg, 1, args.seq)
        print(est)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{time.time() - started:.1f} s, max RSS {rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
