"""``torch.autocast("cuda")`` on meta tensors, as it would run on the GPU.

PyTorch's autocast casts only tensors of its own device (``is_autocast_eligible``: a CUDA tensor
for ``autocast("cuda")``); a meta tensor is never cast, so a meta run under autocast would compute
everything in float32. While an ``Estimator`` runs, its torch-function mode applies the CUDA
policy of ``aten/src/ATen/autocast_mode.cpp`` to meta tensors instead, op by op: the same casts
(lower precision, float32, "float32 unless a dtype is given", widest type), and the same cache
of lower-precision copies of leaf tensors that require grad (the weights), kept until autocast
is left.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves, tree_map

# Ops that run in the autocast dtype (float16 / bfloat16).
LOWER_PRECISION = frozenset(
    [
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_tbc",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "convolution",
        "_convolution",
        "prelu",
        "addmm",
        "addmv",
        "addr",
        "matmul",
        "__matmul__",
        "__rmatmul__",
        "einsum",
        "mm",
        "mv",
        "linalg_vecdot",
        "linear",
        "addbmm",
        "baddbmm",
        "bmm",
        "chain_matmul",
        "linalg_multi_dot",
        "lstm_cell",
        "gru_cell",
        "rnn_tanh_cell",
        "rnn_relu_cell",
        "scaled_dot_product_attention",
        "lstm",
        "gru",
        "rnn_tanh",
        "rnn_relu",
    ]
)
# Ops that run in float32.
FLOAT32 = frozenset(
    [
        "acos",
        "asin",
        "cosh",
        "erfinv",
        "exp",
        "expm1",
        "log",
        "log10",
        "log2",
        "log1p",
        "reciprocal",
        "rsqrt",
        "sinh",
        "tan",
        "pow",
        "__pow__",
        "__rpow__",
        "softplus",
        "layer_norm",
        "native_layer_norm",
        "group_norm",
        "frobenius_norm",
        "nuclear_norm",
        "cosine_similarity",
        "poisson_nll_loss",
        "cosine_embedding_loss",
        "nll_loss",
        "nll_loss2d",
        "hinge_embedding_loss",
        "kl_div",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "mse_loss",
        "margin_ranking_loss",
        "multilabel_margin_loss",
        "soft_margin_loss",
        "triplet_margin_loss",
        "multi_margin_loss",
        "binary_cross_entropy_with_logits",
        "dist",
        "pdist",
        "cdist",
        "renorm",
        "logsumexp",
        "upsample_nearest1d",
        "upsample_nearest2d",
        "upsample_nearest3d",
        "upsample_linear1d",
        "upsample_bilinear2d",
        "upsample_trilinear3d",
        "upsample_bicubic2d",
        "interpolate",
    ]
)
# Ops that run in float32 unless the call names a dtype: the input is not copied, the op is
# asked for a float32 result.
FLOAT32_UNLESS_DTYPE = frozenset(
    ["prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm", "linalg_matrix_norm", "sum"]
)
# Ops that run in the widest floating type among their tensor arguments.
PROMOTE = frozenset(
    [
        "addcdiv",
        "addcmul",
        "atan2",
        "bilinear",
        "cross",
        "dot",
        "vdot",
        "grid_sampler",
        "index_put",
        "scatter_add",
        "tensordot",
        "cat",
        "stack",
    ]
)

#: Every op the policy casts for, by name.
CAST_OPS = LOWER_PRECISION | FLOAT32 | FLOAT32_UNLESS_DTYPE | PROMOTE | {"cross_entropy"}

_LOW = (torch.float16, torch.bfloat16)
# Marks a cross_entropy call that `cross_entropy` below runs instead.
_CROSS_ENTROPY = "_gpu_mem_track_autocast"


def enabled() -> bool:
    """Whether ``autocast("cuda")`` is on for this thread."""
    return torch.is_autocast_enabled("cuda")


class Casts:
    """The autocast state of one estimate: the cache of lower-precision weight copies."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def clear(self) -> None:
        self._cache.clear()

    def _cast(self, t: torch.Tensor, dtype: torch.dtype, cache: bool) -> torch.Tensor:
        if not t.is_floating_point() or t.dtype == dtype or t.dtype == torch.float64:
            return t
        # autocast_mode.cpp caches casts of leaf tensors that require grad (weights), while
        # autocast is on and its cache is enabled.
        cacheable = cache and t.is_leaf and t.requires_grad and torch.is_autocast_cache_enabled()
        if cacheable:
            hit = self._cache.get(id(t))
            if hit is not None and hit[0] is t:
                return hit[1]
        out = t.to(dtype)
        if cacheable:
            self._cache[id(t)] = (t, out)
        return out

    def apply(self, func: Callable, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The arguments ``func`` gets under ``autocast("cuda")``; unchanged for other ops."""
        name = getattr(func, "__name__", "")
        if name in LOWER_PRECISION:
            dtype = torch.get_autocast_dtype("cuda")
            return self._map(args, kwargs, lambda t: self._cast(t, dtype, cache=True))
        if name in FLOAT32:
            return self._map(args, kwargs, lambda t: self._cast(t, torch.float32, cache=False))
        if name in FLOAT32_UNLESS_DTYPE:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if kwargs.get("dtype") is None and first is not None and first.dtype in _LOW:
                kwargs = {**kwargs, "dtype": torch.float32}
            return args, kwargs
        if name == "cross_entropy" and args and isinstance(args[0], torch.Tensor) and args[0].dtype in _LOW:
            return args, {**kwargs, _CROSS_ENTROPY: True}
        if name in PROMOTE:
            tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor) and a.is_floating_point()]
            if tensors:
                widest = max((t.dtype for t in tensors), key=lambda d: torch.finfo(d).bits)
                return self._map(args, kwargs, lambda t: self._cast(t, widest, cache=False))
        return args, kwargs

    def run(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        """``func(*args, **kwargs)`` as autocast runs it: its arguments cast by the policy, and
        ``cross_entropy`` as autocast computes it."""
        args, kwargs = self.apply(func, args, kwargs)
        return cross_entropy(func, args, kwargs)

    @staticmethod
    def _map(args: tuple, kwargs: dict, cast: Callable[[torch.Tensor], torch.Tensor]) -> tuple[tuple, dict]:
        def one(v: Any) -> Any:
            return cast(v) if isinstance(v, torch.Tensor) else v

        return tree_map(one, args), tree_map(one, kwargs)


def cross_entropy(func: Callable, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)``, or for a cross_entropy call ``apply`` marked, what it computes
    under autocast: ``cross_entropy_loss`` runs ``log_softmax`` asked for a float32 result (no copy
    of the input) and ``nll_loss`` on it."""
    if not kwargs.pop(_CROSS_ENTROPY, False):
        return func(*args, **kwargs)
    names = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing")
    bound = {**dict(zip(names, args)), **kwargs}
    target = bound["target"]
    if bound.get("label_smoothing", 0.0) or target.is_floating_point():
        # Probabilities or smoothing: float32 input, as the policy's nll_loss/log_softmax give.
        return func(bound.pop("input").float(), **bound)
    logp = torch.log_softmax(bound["input"], 1 if bound["input"].dim() > 1 else 0, dtype=torch.float32)
    return torch.nn.functional.nll_loss(
        logp,
        target,
        weight=bound.get("weight"),
        ignore_index=bound.get("ignore_index", -100),
        reduction=bound.get("reduction", "mean"),
    )
