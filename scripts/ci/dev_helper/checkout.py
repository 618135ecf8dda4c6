"""The checkout, spelled as scripts/dev spells it, and paths under it."""

from __future__ import annotations

import os
from pathlib import Path

# Not resolved: the same spelling of the checkout as scripts/dev's `cd .. && pwd` (dev.py puts its
# own folder, unresolved, first on sys.path, so this file's path is spelled the same way).
ROOT = Path(os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
# The entry point: the subcommands that run in a process of their own (shim-check, compat-run,
# wheel, python-env) are started through it.
DEV_PY = str(ROOT / "scripts/ci/dev.py")


def rel(path: Path | str) -> str:
    """A path under the checkout, relative to it (as `${path#"$root"/}`)."""
    path = str(path)
    return path[len(str(ROOT)) + 1 :] if path.startswith(f"{ROOT}/") else path
