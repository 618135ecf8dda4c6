"""What an estimate says: :class:`Estimate` (``gpu-mem-track estimate --json``'s figures, with
shortcuts) and :class:`Breakdown` (what each module and category held at the peak), and the
``Estimate`` of a finished in-process recording.
"""

from __future__ import annotations

import json
from typing import Any

from ._vocabulary import CATEGORIES as _CATEGORIES


class Breakdown(dict):
    """What each module held at the peak, by category (bytes): ``{module path: {category: bytes}}``,
    largest module first. ``str()`` is a table. ``""`` is memory allocated outside any module's
    forward or backward (the loss, the optimizer step, the input)."""

    def __init__(self, rows: dict[str, dict[str, int]], workspaces: int) -> None:
        super().__init__(sorted(rows.items(), key=lambda kv: -sum(kv[1].values())))
        self.workspaces = workspaces

    def by_category(self) -> dict[str, int]:
        """Bytes of each category at the peak, over all modules, with the GPU's workspaces."""
        out: dict[str, int] = {}
        for cats in self.values():
            for c, b in cats.items():
                out[c] = out.get(c, 0) + b
        if self.workspaces:
            out["workspace"] = out.get("workspace", 0) + self.workspaces
        return dict(sorted(out.items(), key=lambda kv: _CATEGORIES.index(kv[0]) if kv[0] in _CATEGORIES else 99))

    def __str__(self) -> str:
        cats = [c for c in _CATEGORIES if any(c in v for v in self.values())]
        width = max([len("module")] + [len(m or "(outside modules)") for m in self]) + 2
        head = f"{'module':<{width}}{'total MiB':>11}" + "".join(f"{c.replace('_', ' '):>17}" for c in cats)
        lines = [head]
        for module, v in self.items():
            row = f"{module or '(outside modules)':<{width}}{sum(v.values()) / 2**20:>11.1f}"
            lines.append(row + "".join(f"{v.get(c, 0) / 2**20:>17.1f}" for c in cats))
        total = self.by_category()
        lines.append(
            "at the peak: " + ", ".join(f"{c.replace('_', ' ')} {b / 2**20:.1f} MiB" for c, b in total.items())
        )
        return "\n".join(lines)


class Estimate(dict):
    """The figures of ``gpu-mem-track estimate --json`` (a dict of the same JSON), with shortcuts.

    Bytes throughout. ``["peak"]["bytes"]`` is the peak of the tensors the step holds at once;
    ``["cuda"]`` the caching allocator model's figures on a plain CUDA device; ``["gpu"]`` the
    prediction for the GPU asked for (``device_profile``), with ``fits``; ``["breakdown"]`` what each
    module and category held at the peak. ``str()`` is the text ``estimate`` prints. From the
    in-process ``Estimator`` only, ``["largest_results"]`` (when any): the ops whose result's size
    depends on values, which took their largest result (op -> calls), so the peak is an upper bound;
    ``["compiled"]`` (when torch.compile'd graphs ran in the block): each graph's backend, the bytes
    its forward saves for the backward, and the graph break before it, at the program's line.
    """

    def __init__(self, figures: dict, text: str = "") -> None:
        super().__init__(figures)
        self.text = text

    @property
    def peak_bytes(self) -> int:
        """The peak bytes of live tensors during the step."""
        return self["peak"]["bytes"]

    @property
    def gpu(self) -> dict | None:
        """The prediction for the GPU asked for, or ``None`` (``device_profile='cuda'`` or ``'all'``)."""
        return self.get("gpu")

    @property
    def fits(self) -> bool | None:
        """Whether the step fits the GPU asked for (``None`` without one)."""
        return None if self.gpu is None else self.gpu["fits"]

    def breakdown(self, depth: int | None = None) -> Breakdown:
        """What each module held at the peak, by category. ``depth`` sums each module into its
        ancestor at that depth (0: the model as one row, 1: its children, ...); ``None``: every
        module as itself."""
        rows: dict[str, dict[str, int]] = {}
        for r in self.get("breakdown", []):
            module = r["module"]
            if depth is not None and module:
                module = ".".join(module.split(".")[: depth + 1])
            cats = rows.setdefault(module, {})
            cats[r["category"]] = cats.get(r["category"], 0) + r["bytes"]
        gpu = self.gpu or {}
        return Breakdown(rows, gpu.get("cublas_workspace", 0) + gpu.get("cudnn_workspace_max", 0))

    def __str__(self) -> str:
        return self.text or dict.__repr__(self)

    def __repr__(self) -> str:
        gpu = self.gpu
        where = f", {gpu['profile']['name']}: fits={gpu['fits']}" if gpu else ""
        return f"Estimate(peak={self.peak_bytes / 2**20:.1f} MiB{where})"


def estimate_of(finished: Any, largest_results: dict[str, int]) -> Estimate:
    """The :class:`Estimate` of a finished in-process recording (``_native.Finished``), with the
    ops that took their largest result (``largest_results``: op -> calls), when any, in its
    figures and text: the peak is then an upper bound."""
    figures, text = json.loads(finished.json), finished.text
    if largest_results:
        figures["largest_results"] = dict(largest_results)
        calls = ", ".join(f"{op} ({n} call{'s' if n > 1 else ''})" for op, n in largest_results.items())
        text = (
            f"{text.rstrip(chr(10))}\n  upper bound: {calls} sized their results by values a meta tensor does "
            "not have, and took the largest; a real run can peak well below this\n"
        )
    return Estimate(figures, text)
