"""A distributed program estimated per rank against the same program really run: a small Hugging Face
Llama (4 layers, 256 wide, 8 heads, 4 KV heads, vocabulary 4 000, eager attention, dropout 0), two
AdamW steps (foreach) on 4 x 128 tokens, under each layout below. The truth is the program run
under torchrun with gloo on the CPU, each rank's peak measured by `MemTracker(device="cpu")`; the
estimate is the same program in `Estimator(device_profile="cuda", world_size=N, rank=r)`, one
process a rank, with "cuda" for its device. Each line: a rank's peak, both ways.

usage: python scripts/figures/distributed_vs_cpu.py [--ranks N] [--json] [--anchor] [LAYOUT ...]
       (needs gpu_mem_track, transformers and torchvision; LAYOUT one of LAYOUTS, default all;
       fsdp2-tp needs an even number of ranks)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

LAYOUTS = {
    "fsdp2": "FSDP2 fully_shard on each decoder layer and the root",
    "fsdp2-noreshard": "the same, reshard_after_forward=False",
    "fsdp2-bf16": "the same, MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)",
    "fsdp2-root": "FSDP2 on the root only",
    "fsdp2-reshard-2": "FSDP2 on each layer and the root, reshard_after_forward=2 (to groups of 2 after forward)",
    "fsdp2-hsdp": "HSDP: FSDP2 on a 2-D mesh (ranks / 2 replicas x 2 shards)",
    "fsdp2-checkpointed": "FSDP2 on each layer and the root, activation checkpointing",
    "fsdp1-checkpointed": "FSDP1 FULL_SHARD, transformer auto-wrap, activation checkpointing",
    "ddp-checkpointed": "DDP, default buckets, activation checkpointing",
    "tp-checkpointed": "tensor parallelism on each layer's attention and MLP, activation checkpointing",
    "fsdp2-meta": "FSDP2 on each layer and the root of a model built on meta, then to_empty (torchtitan's order)",
    "ddp": "DDP, default buckets",
    "ddp-bucket-view": "DDP, gradient_as_bucket_view=True",
    "ddp-bucket-cap": "DDP, bucket_cap_mb=1",
    "ddp-static": "DDP, static_graph=True",
    "ddp-fp16-hook": "DDP with the program's own comm hook: fp16_compress_hook (each bucket allreduced in float16)",
    "ddp-resnet18": "DDP on torchvision's ResNet-18, 8 images of 224 x 224, SGD with momentum",
    "resnet18": "the same step without DDP: the CPU's convolutions hold 4.5 MiB a GPU's do not, in both lines",
    "fsdp1": "FSDP1 FULL_SHARD, transformer auto-wrap on the decoder layer",
    "fsdp1-grad-op": "FSDP1 SHARD_GRAD_OP, the same auto-wrap",
    "fsdp1-orig-params": "FSDP1 FULL_SHARD, the same auto-wrap, use_orig_params=True",
    "fsdp1-hybrid": "FSDP1 HYBRID_SHARD on a 2-D mesh (ranks / 2 replicas x 2 shards), the same auto-wrap",
    "tp": "tensor parallelism on each layer's attention and MLP (ColwiseParallel, RowwiseParallel), AdamW for-loop",
    "tp-sp": "tensor and sequence parallelism: the same split, the norms and the residual stream sharded by sequence (SequenceParallel)",
    "fsdp2-tp": "FSDP2 over tensor parallelism, a 2-D mesh (ranks / 2 data-parallel x 2 tensor-parallel)",
}


def build():
    import torch
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=4000,
        attention_dropout=0.0,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def tensor_parallel(model, mesh) -> None:
    """Megatron's split of each decoder layer: q, k, v, gate and up by columns, o and down by rows
    (the heads divide among the ranks; HF's attention reshapes to its local heads)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {name: ColwiseParallel() for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")}
    plan |= {"self_attn.o_proj": RowwiseParallel(), "mlp.down_proj": RowwiseParallel()}
    plan |= {"mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel()}
    for layer in model.model.layers:
        parallelize_module(layer, mesh, plan)


def sequence_parallel(model, mesh) -> None:
    """Megatron's sequence parallelism over the same split (torchtitan's plan): the embedding's
    output, the norms and the residual stream sharded by sequence, gathered before attention and
    the MLP, reduce-scattered after them."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    parallelize_module(
        model,
        mesh,
        {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1), use_local_output=False),
            "model.norm": SequenceParallel(),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        },
    )
    plan = {
        "input_layernorm": SequenceParallel(),
        "post_attention_layernorm": SequenceParallel(),
        "self_attn": PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)},
            desired_input_kwarg_layouts={"hidden_states": Replicate()},
            use_local_output=True,
        ),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True),
    }
    plan |= {name: ColwiseParallel() for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")}
    plan |= {name: ColwiseParallel() for name in ("mlp.gate_proj", "mlp.up_proj")}
    plan |= {name: RowwiseParallel(output_layouts=Shard(1), use_local_output=False) for name in ("self_attn.o_proj", "mlp.down_proj")}
    for layer in model.model.layers:
        parallelize_module(layer, mesh, plan)


def program(device: str, layout: str) -> None:
    """The user's program: the same lines under torchrun and in the estimator."""
    import torch.distributed as dist

    dist.init_process_group("gloo" if device == "cpu" else "nccl")
    if layout.endswith("resnet18"):
        resnet(device, ddp=layout == "ddp-resnet18")
        return
    train(*setup(device, layout, mesh_of(device, layout)))


def mesh_of(device: str, layout: str):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if layout == "fsdp2-tp":
        return init_device_mesh(device, (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp"))
    if layout in ("fsdp2-hsdp", "fsdp1-hybrid"):
        return init_device_mesh(device, (dist.get_world_size() // 2, 2), mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device, (dist.get_world_size(),))


def setup(device: str, layout: str, mesh, move: bool = True):
    """The model in its layout, its optimizer and the batch (`move`: to the device; a fake CPU
    model is on it, and cannot be swapped for itself)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if layout == "fsdp2-meta":
        with torch.device("meta"):
            model = build()
    else:
        model = build().to(device) if move else build()
    options = {}
    if layout == "fsdp2-noreshard":
        options = {"reshard_after_forward": False}
    if layout == "fsdp2-reshard-2":
        options = {"reshard_after_forward": 2}
    if layout == "fsdp2-bf16":
        options = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
    if layout.endswith("-checkpointed"):  # the layout it names, checkpointed
        model.gradient_checkpointing_enable()
        layout = layout.removesuffix("-checkpointed")
    if layout.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(
            model,
            gradient_as_bucket_view=layout == "ddp-bucket-view",
            bucket_cap_mb=1 if layout == "ddp-bucket-cap" else None,
            static_graph=layout == "ddp-static",
        )
        if layout == "ddp-fp16-hook":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

            model.register_comm_hook(None, fp16_compress_hook)
    elif layout.startswith("fsdp1"):
        import functools

        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
        strategy = {"fsdp1-grad-op": ShardingStrategy.SHARD_GRAD_OP, "fsdp1-hybrid": ShardingStrategy.HYBRID_SHARD}
        model = FullyShardedDataParallel(
            model,
            auto_wrap_policy=policy,
            sharding_strategy=strategy.get(layout, ShardingStrategy.FULL_SHARD),
            device_mesh=mesh if layout == "fsdp1-hybrid" else None,
            use_orig_params=layout == "fsdp1-orig-params",
            device_id=torch.device(device),  # on the CPU, FSDP1 asks for it
        )
    elif layout == "tp":
        tensor_parallel(model, mesh)
    elif layout == "tp-sp":
        sequence_parallel(model, mesh)
    else:
        if layout == "fsdp2-tp":
            tensor_parallel(model, mesh["tp"])
            mesh = mesh["dp"]
        if layout != "fsdp2-root":
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh, **options)
        fully_shard(model, mesh=mesh, **options)
        if layout == "fsdp2-meta":
            model.to_empty(device=device)  # its values do not matter here: no init
    # foreach cannot mix the DTensor parameters tensor parallelism makes with plain ones.
    optimizer = torch.optim.AdamW(model.parameters(), foreach=not layout.startswith("tp"))
    torch.manual_seed(1)
    return model, optimizer, torch.randint(3, 4000, (4, 128), device=device)


def train(model, optimizer, ids, after_step=lambda: None) -> None:
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        after_step()


def resnet(device: str, ddp: bool) -> None:
    """torchvision's ResNet-18, in DDP or not: two SGD steps with momentum on 8 images."""
    import torch
    import torchvision
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torchvision.models.resnet18().to(device)
    if ddp:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    torch.manual_seed(1)
    images = torch.randn(8, 3, 224, 224, device=device)
    labels = torch.randint(0, 1000, (8,), device=device)
    for _ in range(2):
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad()


def truth(layout: str, out: str) -> None:
    """Under torchrun: this rank's peak, measured while the program runs on the CPU, into
    ``out/rank<r>.json`` (the ranks share one stdout, where lines interleave)."""
    import tempfile

    import gpu_mem_track
    import torch.distributed as dist

    tracker = gpu_mem_track.MemTracker(device="cpu", path=tempfile.mkdtemp() + "/", detail=False)
    before = tracker.track()["allocated"]
    program("cpu", layout)
    peak = tracker.track()["peak_allocated"] - before
    with open(os.path.join(out, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"rank": dist.get_rank(), "peak": peak}, f)
    dist.destroy_process_group()


def estimate(layout: str, ranks: int, rank: int) -> None:
    """This rank's peak, estimated in-process."""
    import gpu_mem_track

    with gpu_mem_track.Estimator(device_profile="cuda", world_size=ranks, rank=rank) as est:
        program("cuda", layout)
    peak = max(p["peak_bytes"] for p in est.result["phases"])
    print(json.dumps({"rank": rank, "peak": peak}), flush=True)


def anchor(layout: str, ranks: int, rank: int) -> None:
    """This rank's peak by PyTorch's `FSDPMemTracker`, as torchtitan's estimator runs it: the program
    under `FakeTensorMode` on a fake process group, the mesh built before the fake mode."""
    import torch
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=ranks, store=FakeStore())
    mesh = mesh_of("cpu", layout)
    with FakeTensorMode():
        model, optimizer, ids = setup("cpu", layout, mesh, move=False)
        tracker = FSDPMemTracker(model, optimizer)
        tracker.track_inputs((ids,))
        with tracker:
            # It tracks one step at a time; its peak stays over them.
            train(model, optimizer, ids, after_step=tracker.reset_mod_stats)
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    print(json.dumps({"rank": rank, "peak": peak}), flush=True)


def real_peaks(layout: str, ranks: int) -> dict[int, int]:
    """Each rank's real peak: the program under torchrun, gloo on the CPU."""
    import tempfile

    out = tempfile.mkdtemp()
    run(["--truth", layout, "--out", out], ranks=ranks)
    peaks = {}
    for rank in range(ranks):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            peaks[rank] = json.load(f)["peak"]
    return peaks


def run(args: list[str], ranks: int | None = None) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")}
    launch = [sys.executable]
    if ranks is not None:
        launch += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
    out = subprocess.run([*launch, __file__, *args], capture_output=True, text=True, env=env, timeout=600, check=False)
    if out.returncode != 0:
        raise SystemExit(f"distributed_vs_cpu.py {' '.join(args)} failed:\n{out.stderr[-4000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="one JSON line a rank")
    parser.add_argument(
        "--anchor", action="store_true", help="FSDPMemTracker's figure beside them (FSDP2 layouts; others cannot run)"
    )
    parser.add_argument("--truth", metavar="LAYOUT", help=argparse.SUPPRESS)
    parser.add_argument("--estimate", metavar="LAYOUT", help=argparse.SUPPRESS)
    parser.add_argument("--anchor-of", metavar="LAYOUT", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("layouts", nargs="*", metavar="LAYOUT")
    args = parser.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    if args.truth:
        truth(args.truth, args.out)
        return 0
    if args.estimate:
        estimate(args.estimate, args.ranks, args.rank)
        return 0
    if args.anchor_of:
        anchor(args.anchor_of, args.ranks, args.rank)
        return 0
    unknown = [name for name in args.layouts if name not in LAYOUTS]
    if unknown:
        parser.error(f"unknown layout(s) {unknown}; one of {', '.join(LAYOUTS)}")
    if not args.json:
        print(f"rank peaks at {args.ranks} ranks, bytes: the real CPU run and the estimate")
    for layout in args.layouts or LAYOUTS:
        started = time.time()
        real = real_peaks(layout, args.ranks)
        for rank in range(args.ranks):
            estimated = run(["--estimate", layout, "--ranks", str(args.ranks), "--rank", str(rank)])[0]["peak"]
            line = {"layout": layout, "ranks": args.ranks, "rank": rank, "real": real[rank], "estimate": estimated}
            beside = ""
            if args.anchor and layout.startswith("fsdp2") and layout != "fsdp2-tp":
                at = run(["--anchor-of", layout, "--ranks", str(args.ranks), "--rank", str(rank)])[0]["peak"]
                line["fsdp_mem_tracker"] = at
                beside = f"  FSDPMemTracker {at:>11} ({100 * (at - real[rank]) / real[rank]:+.2f} %)"
            if args.json:
                print(json.dumps(line), flush=True)
            else:
                diff = estimated - real[rank]
                print(
                    f"{layout:<19} rank {rank}  real {real[rank]:>11}  estimate {estimated:>11}"
                    f"  ({diff:+d} B, {100 * diff / real[rank]:+.4f} %){beside}  [{time.time() - started:.0f} s]",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
