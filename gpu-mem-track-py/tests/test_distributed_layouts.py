"""More layouts of ``scripts/figures/distributed_vs_cpu.py``'s program, each rank's estimate held to
the same program really run under torchrun with gloo on the CPU: HSDP, DDP's bucket cap and static
graph, FSDP1's other strategies, sequence parallelism. A file of its own: each test file runs in a
process of its own, within ten minutes."""

from __future__ import annotations

from test_distributed_estimate import assert_within_a_thousandth, needs_transformers, pytestmark, rank_peaks

__all__ = ["pytestmark"]


@needs_transformers
def test_hsdp_ddp_options_fsdp1_strategies_and_sequence_parallelism_are_estimated_as_each_rank_runs_them():
    # HSDP on a 1 x 2 mesh, DDP's bucket cap and static graph, FSDP1's other strategies.
    layouts = ["fsdp2-hsdp", "ddp-bucket-cap", "ddp-static", "fsdp1-grad-op", "fsdp1-orig-params", "tp-sp"]
    # DDP with its gradients views of its buckets, FSDP2 over tensor parallelism, a model built on
    # meta then given memory with to_empty.
    layouts += ["ddp-bucket-view", "fsdp2-tp", "fsdp2-meta"]
    lines = rank_peaks(2, *layouts)
    assert [(line["layout"], line["rank"]) for line in lines] == [(name, r) for name in layouts for r in (0, 1)]
    assert_within_a_thousandth(lines)
    peak = {line["layout"]: line["real"] for line in lines}
    # SHARD_GRAD_OP keeps each layer gathered from its forward to its backward.
    assert peak["fsdp1-grad-op"] > peak["fsdp1-orig-params"] * 1.05
    # Tensor and sequence parallelism divide the layers and the residual stream among the ranks;
    # DDP keeps the whole model on each.
    assert peak["tp-sp"] < peak["ddp-static"] * 0.6
    # Built on meta and given memory with to_empty, the model holds what FSDP2 on each layer holds
    # built on the GPU (which HSDP with one replica is).
    assert abs(peak["fsdp2-meta"] - peak["fsdp2-hsdp"]) < 1000
