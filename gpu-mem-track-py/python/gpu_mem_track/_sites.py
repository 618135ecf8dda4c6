"""The site of an ``Estimator`` block's allocations: the module running as each is made."""

from __future__ import annotations

from ._load import native as _native


class Sites:
    """The module running as each allocation is made: the innermost module whose forward, or
    backward, has begun and not ended, as ``ModTracker`` sees them (by their path from the root,
    ``GPT2LMHeadModel.transformer.h.0.attn``); its index is the recorder's site."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._index: dict[str, int] = {}
        self._active: list[tuple[str, bool]] = []  # (path, in backward), in the order they began

    def enter(self, fqn: str | None, backward: bool = False) -> None:
        if fqn is None:  # a module no longer alive in backward
            return
        self._active.append((fqn, backward))
        self._set()

    def leave(self, fqn: str | None) -> None:
        for i in range(len(self._active) - 1, -1, -1):
            if self._active[i][0] == fqn:
                del self._active[i]
                break
        self._set()

    def idle(self) -> bool:
        """No module's forward is running."""
        return not any(not backward for _, backward in self._active)

    def forget_backward(self) -> None:
        """Drops the modules whose backward began and never said it ended (before torch 2.7,
        ModTracker misses the end of a backward whose module returned no tensor, a dict)."""
        if self._active:
            self._active.clear()
            self._set()

    def _set(self) -> None:
        if not self._active:
            _native.recording_site(None)
            return
        depth = max(a.count(".") for a, _ in self._active)
        current = next(a for a, _ in reversed(self._active) if a.count(".") == depth)
        _native.recording_site(self.index(current))

    def index(self, fqn: str) -> int:
        """The site index of a module path."""
        index = self._index.get(fqn)
        if index is None:
            index = self._index[fqn] = len(self.names)
            self.names.append(fqn)
        return index
