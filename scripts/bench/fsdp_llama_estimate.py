"""The distributed estimate's benchmark at the scale people rent machines for: a Llama-3-70B-shaped
config (80 layers, 8192 wide, 64 heads with 8 KV heads, FFN 28672, vocabulary 128 256), FSDP2 on
each decoder layer and the root with a bfloat16 `MixedPrecisionPolicy`, activation checkpointing,
one AdamW step (foreach; fp32 weights and states) at 1 x 8 192 tokens, as rank 0 of 64. The program
is torchtitan's order: built on meta, sharded, then given memory with `to_empty`. Prints the
seconds, the process's peak RSS and rank 0's estimate on h100-80g; `--fit 8,16,32,64` searches the
largest batch per rank at each world size and names the fewest ranks that fit. `--config 8b`: a
Llama-3-8B shape (32 layers, 4096 wide, 32 heads, FFN 14336).

Usage: python scripts/bench/fsdp_llama_estimate.py [--config 70b|8b] [--ranks N] [--seq S] [--fit N,N,... [--max B]]
                                                     [--fsdpmemtracker]
       (needs torch >= 2.11, transformers, gpu_mem_track; no GPU)
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import torch
import transformers

CONFIGS = {
    "70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64},
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32},
}


def config(name: str) -> transformers.LlamaConfig:
    return transformers.LlamaConfig(
        **CONFIGS[name],
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    )


def program(cfg: transformers.LlamaConfig, batch: int, seq: int, device: str = "cuda", step=None, model=None, mesh=None) -> None:
    """The user's program, as torchrun runs it on each rank (`step`: runs the step, given the
    model, the optimizer and the batch; FSDPMemTracker wraps it; `model` and `mesh`: made already)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        dist.init_process_group("nccl")
    mesh = mesh or init_device_mesh(device, (dist.get_world_size(),))
    if model is None:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    model.gradient_checkpointing_enable()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.to_empty(device=device)  # then the program's own weight init, which allocates nothing
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    (step or train_step)(model, optimizer, ids)


def train_step(model, optimizer, ids) -> None:
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def fsdp_mem_tracker(cfg: transformers.LlamaConfig, ranks: int, seq: int) -> int:
    """Rank 0's peak by PyTorch's FSDPMemTracker, as torchtitan's estimator runs it: the program
    under FakeTensorMode on a fake process group, on the CPU (the mesh built before the mode)."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=ranks, store=FakeStore())
    peak = []

    def tracked(model, optimizer, ids) -> None:
        tracker = FSDPMemTracker(model, optimizer)
        tracker.track_inputs((ids,))
        with tracker:
            train_step(model, optimizer, ids)
        peak.append(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])

    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (ranks,))  # its rank table is read: made before the fake mode
    with torch.device("meta"):  # Hugging Face's init reads values, which fake tensors have not
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    with FakeTensorMode(allow_non_fake_inputs=True):
        program(cfg, 1, seq, device="cpu", step=tracked, model=model, mesh=mesh)
    return peak[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="70b")
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--fit", help="world sizes to search, comma-separated (8,16,32,64)")
    parser.add_argument("--max", type=int, default=16, help="the largest batch per rank --fit tries")
    parser.add_argument("--fsdpmemtracker", action="store_true", help="PyTorch's FSDPMemTracker's figure instead")
    args = parser.parse_args()
    import warnings

    import gpu_mem_track

    warnings.filterwarnings("ignore")
    cfg = config(args.config)
    started = time.time()
    if args.fsdpmemtracker:
        peak = fsdp_mem_tracker(cfg, args.ranks, args.seq)
        print(f"FSDPMemTracker: rank 0's peak {peak / 2**20:.1f} MiB")
    elif args.fit:
        sizes = [int(n) for n in args.fit.split(",")]
        found = gpu_mem_track.fit(
            lambda batch: program(cfg, batch, args.seq), device_profile="h100-80g", world_size=sizes, max=args.max
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
