"""The options of a distributed program that change where its memory is: FSDP1's hybrid sharding
and DDP with the program's own comm hook, held to the same program really run under torchrun with
gloo on the CPU; FSDP2's CPU offload, whose host memory no CPU run tells apart from the GPU's,
held to the same program without it. A file of its own: each test file runs in a process of its
own, within ten minutes."""

from __future__ import annotations

import pytest
import torch
from test_distributed_estimate import ON_META, assert_within_a_thousandth, needs_transformers, pytestmark, rank_peaks

__all__ = ["pytestmark"]

needs_meta_collectives = pytest.mark.skipif(not ON_META, reason="needs torch >= 2.11 (c10d's meta kernels)")


@needs_transformers
def test_fsdp1_hybrid_sharding_and_a_ddp_comm_hook_of_the_program_are_estimated_as_each_rank_runs_them():
    # HYBRID_SHARD on a 1 x 2 mesh; DDP with torch's fp16_compress_hook registered by the program.
    layouts = ["fsdp1-hybrid", "ddp-fp16-hook"]
    lines = rank_peaks(2, *layouts)
    assert [(line["layout"], line["rank"]) for line in lines] == [(name, r) for name in layouts for r in (0, 1)]
    assert_within_a_thousandth(lines)
    peak = {line["layout"]: line["real"] for line in lines}
    # Hybrid sharding over one replica shards as FULL_SHARD does; DDP keeps the whole model.
    assert peak["ddp-fp16-hook"] > peak["fsdp1-hybrid"] * 1.2


@needs_meta_collectives
def test_a_ddp_comm_hook_of_the_program_runs_with_the_collective_results_it_reads():
    import gpu_mem_track
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    width, layers = 1000, 3
    kept: list[torch.Tensor] = []

    def hook(state, bucket):  # unannotated: DDP checks annotations, and this file's are strings
        # What a hook allocates is the GPU's: 1 MB a bucket, kept.
        kept.append(torch.empty(250_000, device=bucket.buffer().device))
        return allreduce_hook(state, bucket)  # reads the allreduce's result: fut.value()[0]

    def step(own_hook: bool) -> None:
        dist.init_process_group("nccl")
        model = DistributedDataParallel(torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers))).cuda())
        if own_hook:
            model.register_comm_hook(dist.group.WORLD, hook)
        model(torch.randn(4, width, device="cuda")).sum().backward()

    with gpu_mem_track.Estimator(device_profile="cuda", world_size=2) as plain:
        step(own_hook=False)
    with gpu_mem_track.Estimator(device_profile="cuda", world_size=2) as hooked:
        step(own_hook=True)
    assert kept, "the program's hook did not run"
    # The hook's tensors, made in the backward and kept, on top of the same step's gradients; the
    # buckets as without it.
    with_hook, without = hooked.breakdown().by_category(), plain.breakdown().by_category()
    assert with_hook["gradient"] == without["gradient"] + len(kept) * 1_000_000, (with_hook, without)
    assert with_hook["ddp_bucket"] == without["ddp_bucket"] == layers * width * (width + 1) * 4


def offloaded_step(offload: bool, train: bool, width: int = 1000, layers: int = 3) -> None:
    """FSDP2 on each of ``layers`` linear layers and the root, 2 ranks; offloaded, the model is
    built on the CPU, as FSDP asks, and stays there; ``train``: two AdamW steps, else a backward."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (2,))
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers)))
    model = model if offload else model.cuda()
    policy = {"offload_policy": CPUOffloadPolicy()} if offload else {}
    for layer in model:
        fully_shard(layer, mesh=mesh, **policy)
    fully_shard(model, mesh=mesh, **policy)
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(2 if train else 1):
        model(torch.randn(4, width, device="cuda")).sum().backward()
        if train:
            optimizer.step()
            optimizer.zero_grad()


@needs_meta_collectives
def test_fsdp2_offloaded_to_the_cpu_holds_on_the_gpu_what_the_same_program_holds_less_its_shards_gradients_and_step():
    import gpu_mem_track

    width, layers = 1000, 3
    shards = layers * (width // 2) * (width + 1) * 4  # this rank's half of each weight and bias
    whole_layer = width * (width + 1) * 4
    for train in (False, True):
        runs = {}
        for offload in (False, True):
            with gpu_mem_track.Estimator(device_profile="cuda", world_size=2) as est:
                offloaded_step(offload, train)
            runs[offload] = est
        on_gpu, offloaded = runs[False], runs[True]
        kept, at_peak = on_gpu.breakdown().by_category(), offloaded.breakdown().by_category()
        # The same peak of a backward, less what the offloaded program keeps on the host: the
        # shards, the gradient shard of the layer done, AdamW's state.
        on_host = kept["sharded_parameter"] + kept["sharded_gradient"] + kept.get("optimizer_state", 0)
        assert kept["sharded_parameter"] == shards and kept["sharded_gradient"] == whole_layer // 2, kept
        assert offloaded.result["peak"]["bytes"] == on_gpu.result["peak"]["bytes"] - on_host, (train, kept, at_peak)
        for category in ("sharded_parameter", "sharded_gradient", "optimizer_state", "parameter"):
            assert category not in at_peak, (train, at_peak)
        for category in ("all_gather_buffer", "unsharded_parameter", "unsharded_gradient", "reduce_scatter_buffer"):
            assert at_peak[category] == whole_layer, (train, category, at_peak)
        # On the host at once: the model built whole there, with the first layer's shard, while
        # FSDP shards it; or the shards and their gradients, and after a step AdamW's two states
        # of each, with the CPU step's temporaries (one shard's denominator: its square root, then
        # divided) at most.
        host = offloaded.result["host_peak"]
        states = 2 * shards if train else 0
        least = max(layers * whole_layer + whole_layer // 2, 2 * shards + states)
        largest = (width // 2) * width * 4
        assert least <= host <= least + 2 * largest + 4 * width, (train, host, least)
        assert "host memory" in str(offloaded) and "host memory" not in str(on_gpu)
