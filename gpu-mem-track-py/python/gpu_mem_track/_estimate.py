"""``estimate()`` and ``fit()``: will a model fit on a GPU? Its own code, run on meta in-process.

The one-call forms of :class:`Estimator`: ``estimate(model, *args, **kwargs)`` runs a training
step (or a forward) of a model already built, on meta copies of its parameters (its own weights
are neither copied nor touched); ``fit(step, ...)`` searches the largest batch (or sequence) whose
step fits a GPU (at one world size or several); ``estimate_ranks(program, world_size=N)``
estimates each rank of a distributed program.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

from ._estimate_result import Estimate
from ._estimator import Estimator, device_profile_argument
from ._load import native as _native
from ._value_ops import constant_of
from ._vocabulary import canonical, make_optimizer


def _loss_of(output: Any) -> torch.Tensor:
    """The loss a training step backpropagates: the output's ``loss`` (a Hugging Face
    ``ModelOutput`` given labels), else the sum of every floating tensor in the output, as the
    command line does for a model file."""
    loss = getattr(output, "loss", None)
    if isinstance(output, dict) and loss is None:
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    parts = [t.sum() for t in _floats(output)]
    if not parts:
        raise ValueError("estimate(): the model's output holds no floating tensor to train on")
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def _floats(tree: Any) -> list[torch.Tensor]:
    if hasattr(tree, "to_tuple"):  # transformers' ModelOutput
        tree = tree.to_tuple()
    return [v for v in tree_leaves(tree) if isinstance(v, torch.Tensor) and v.is_floating_point() and v.requires_grad]


def estimate(
    model: torch.nn.Module,
    *args: Any,
    mode: str = "train",
    optimizer: str = "adamw",
    device_profile: str | None = None,
    iterations: int = 2,
    gpu_memory: int | None = None,
    world_size: int = 1,
    shard: str = "none",
    precision: str = "fp32",
    device: str | None = None,
    **kwargs: Any,
) -> Estimate:
    """Estimates the memory of ``model(*args, **kwargs)`` without a GPU, in this process.

    The model runs on meta: meta copies of its parameters and buffers stand in for them (its own
    weights are neither copied nor changed; tied weights stay tied), the tensors in ``args`` and
    ``kwargs`` become meta tensors of the same shapes and dtypes. ``mode='train'`` runs
    ``iterations`` steps of forward, backward (of the output's ``loss``, else the sum of its
    floating tensors) and ``optimizer`` (``sgd``, ``momentum``, ``adam``, ``adamw``: torch's
    foreach implementations, as on a GPU); ``'inference'`` one forward without grad. Precision is
    the model's and its inputs' (``.half()``, ``bfloat16``); ``torch.autocast`` and activation
    checkpointing inside the model apply as on a GPU. ``device_profile`` (``device=``, its
    deprecated old name) and the rest are :class:`Estimator`'s.

    Raises:
        ValueError: an option, profile or output the estimator cannot take.
        TypeError: a TorchScript module (its file goes to the command line).
        GpuMemTrackError: an op without a meta kernel, or another failure of the run (named).
    """
    if mode not in ("train", "inference"):
        raise ValueError(f"estimate(): mode {mode!r} (use 'train' or 'inference')")
    if mode == "train":
        optimizer = canonical("estimate", "optimizer", optimizer)
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError(
            "estimate(): a TorchScript module; estimate the Python model, or the file with "
            "`gpu-mem-track estimate model.pt`"
        )
    if iterations < 1:
        raise ValueError(f"estimate(): iterations={iterations} (at least 1)")
    device_profile = device_profile_argument("estimate", device_profile, device)
    train = mode == "train"
    was_training = model.training
    est = Estimator(device_profile, gpu_memory=gpu_memory, world_size=world_size, shard=shard, precision=precision)
    # Constant inputs (an all-ones attention mask), read while they have data, outside the block.
    constants = {id(v): constant_of(v) for v in tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)}
    try:
        with est:
            twins = _meta_twins(model)
            inputs = tree_map(lambda v: _meta_input(v, est, constants.get(id(v))), (args, kwargs))
            model.train(train)
            trainable = list({id(t): t for t in twins.values() if t.requires_grad}.values())  # tied once
            opt = make_optimizer(optimizer, trainable) if train else None
            for it in range(iterations if train else 1):
                with torch.set_grad_enabled(train):
                    out = torch.func.functional_call(model, twins, inputs[0], inputs[1], tie_weights=True, strict=False)
                if not train:
                    del out
                    break
                loss = _loss_of(out)
                del out
                loss.backward()
                del loss
                opt.step()
                if it + 1 < iterations:
                    opt.zero_grad(set_to_none=True)
    finally:
        model.train(was_training)
    return est.result


def _meta_twins(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A meta tensor of the same shape, dtype and ``requires_grad`` for each parameter and buffer,
    by name; a tensor shared under two names (tied weights) gets one twin. Made in the order
    ``model.to("cuda")`` allocates them on a GPU (``Module._apply``: each module's children first,
    then its parameters, then its buffers), the order the caching allocator packs them in."""
    twins: dict[str, torch.Tensor] = {}
    made: dict[int, torch.Tensor] = {}

    def visit(module: torch.nn.Module, prefix: str) -> None:
        for name, child in module._modules.items():
            if child is not None:
                visit(child, f"{prefix}{name}.")
        for name, t in [*module._parameters.items(), *module._buffers.items()]:
            if t is None:
                continue
            twin = made.get(id(t))
            if twin is None:
                # No tensor argument: the CPU-means-meta mode would first make a meta twin of it.
                # "cuda", which the block makes meta: a twin stands for the GPU's copy (the
                # program's own "meta" is no memory).
                empty = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cuda")
                is_parameter = isinstance(t, torch.nn.Parameter)
                twin = torch.nn.Parameter(empty, requires_grad=t.requires_grad) if is_parameter else empty
                made[id(t)] = twin
            twins[prefix + name] = twin

    visit(model, "")
    return twins


def _meta_input(v: Any, est: Estimator, constant: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.device.type != "meta":
        t = torch.empty_strided(v.size(), v.stride(), dtype=v.dtype, device="cuda")  # the GPU's copy, on meta
        est._note_constant(t, constant)
        return t.requires_grad_(v.requires_grad)
    return v


def fit(
    step: Callable[[int], Any],
    *,
    device_profile: str | None = None,
    max: int = 4096,
    dimension: str = "batch",
    gpu_memory: int | None = None,
    world_size: int | Sequence[int] = 1,
    rank: int = 0,
    shard: str = "none",
    precision: str = "fp32",
    device: str | None = None,
) -> dict:
    """The largest value in ``1..max`` for which ``step(value)`` fits the GPU ``device_profile``
    (``device=``, its deprecated old name): ``step``
    runs the program's step for a batch (or sequence length, ``dimension='seq'``) of that size -
    building the model if it likes - and runs under an :class:`Estimator` for each value tried
    (about log2(max) of them). Returns ``gpu-mem-track fit --json``'s object: ``largest`` (``None``
    when even 1 does not fit), ``prediction`` for it, ``binds`` (which figure the next size is
    above the device by: ``"allocated"``, the tensors and workspaces themselves, or
    ``"reserved"``, the caching allocator's segments; ``None`` when every size tried fits), and
    every probe.

    A distributed ``step`` runs as rank ``rank`` of ``world_size`` (see :class:`Estimator`); its
    value is then the batch per rank. ``world_size`` may be several sizes (``[8, 16, 32, 64]``):
    the result is then ``{"world_sizes": [...], "smallest_world_size": N}``, the search above at
    each size (with its ``world_size``), and the fewest ranks at which a batch of 1 fits (``None``
    when none does).

    Raises:
        ValueError: ``device_profile`` is not one GPU profile, or another option is wrong.
    """
    device_profile = device_profile_argument("fit", device_profile, device)
    if device_profile in _native.NOT_ONE_GPU:
        raise ValueError(f"fit(): device_profile={device_profile!r}; name one GPU profile (h100-80g, a100-40g, ...)")
    if not isinstance(world_size, int):
        sizes = sorted({int(n) for n in world_size})
        if not sizes:
            raise ValueError("fit(): world_size=[]; give the world sizes to try")
        at = [
            {"world_size": n, **fit(step, device_profile=device_profile, max=max, dimension=dimension,
                                    gpu_memory=gpu_memory, world_size=n, rank=rank, shard=shard, precision=precision)}
            for n in sizes
        ]
        fitting = [r["world_size"] for r in at if r["largest"] is not None]
        return {"world_sizes": at, "smallest_world_size": fitting[0] if fitting else None}

    def probe(value: int) -> Any:
        est = Estimator(
            device_profile, gpu_memory=gpu_memory, world_size=world_size, rank=rank, shard=shard, precision=precision
        )
        with est:
            step(value)
        return est._finished

    return json.loads(_native.fit_search(probe, max, dimension))


class RankEstimates(dict):
    """Each rank's :class:`Estimate` (rank -> estimate), from :func:`estimate_ranks`. ``str()``
    names the rank that peaks highest, and which ranks have the same figures."""

    @property
    def highest(self) -> int:
        """The rank whose peak is highest (the lowest such rank on a tie)."""
        return max(self, key=lambda r: (self[r].peak_bytes, -r))

    def alike(self) -> list[list[int]]:
        """The ranks in groups of equal peaks, highest first."""
        groups: dict[int, list[int]] = {}
        for r, e in sorted(self.items()):
            groups.setdefault(e.peak_bytes, []).append(r)
        return [groups[peak] for peak in sorted(groups, reverse=True)]

    def __str__(self) -> str:
        top = self[self.highest]
        gpu = top.gpu
        fits = f"; {gpu['profile']['name']}: {'fits' if gpu['fits'] else 'does not fit'}" if gpu else ""
        lines = [f"rank {self.highest} of {len(self)} peaks highest: {top.peak_bytes / 2**20:.1f} MiB{fits}"]
        for group in self.alike():
            ranks = f"rank {group[0]}" if len(group) == 1 else f"ranks {_spans(group)}"
            lines.append(f"  {ranks}: peak {self[group[0]].peak_bytes / 2**20:.1f} MiB")
        return "\n".join(lines)


def _spans(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and spans[-1][1] == r - 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def estimate_ranks(
    program: Callable[[], Any],
    *,
    world_size: int,
    ranks: str | Sequence[int] = "all",
    device_profile: str | None = None,
    gpu_memory: int | None = None,
) -> RankEstimates:
    """Each rank of a distributed ``program`` (a callable that runs it, with its
    ``init_process_group``), estimated as in ``Estimator(world_size=world_size, rank=r)``, one
    rank after the other in this process: ``ranks="all"`` for every rank, or a list of them.
    Ranks differ when ``world_size`` does not divide a sharded dimension; the result's ``str()``
    names the highest and groups the ranks whose figures are alike.

    Raises:
        ValueError: a rank outside ``0..world_size-1``, or ``ranks`` neither ``"all"`` nor ranks.
    """
    if isinstance(ranks, str):
        if ranks != "all":
            raise ValueError(f"estimate_ranks(): ranks={ranks!r}; 'all' or a list of ranks")
        chosen = list(range(world_size))
    else:
        chosen = sorted({int(r) for r in ranks})
    out = RankEstimates()
    for r in chosen:
        est = Estimator(device_profile, gpu_memory=gpu_memory, world_size=world_size, rank=r)
        with est:
            program()
        out[r] = est.result
    return out
