"""`free-in-ci`: in CI, what has served is removed (the disk is shared with what ran before)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess

from .checkout import ROOT
from .shell import log, run


def free_in_ci(paths: list[str]) -> None:
    """CI's disk is shared with whatever ran before it: there, what has served is removed as soon
    as it has (the wheels stay in the wheel folder, so nothing is downloaded twice). Elsewhere it
    stays, for reruns."""
    if not os.environ.get("CI"):
        return
    du = run(["du", "-shc", *paths], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    total = du.splitlines()[-1].split("\t")[0] if du.strip() else ""
    log(f"removing what has served ({total}): {' '.join(paths).replace(f'{ROOT}/', '')}")
    for p in paths:
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        elif os.path.lexists(p):
            os.unlink(p)


def cmd_free_in_ci(args: argparse.Namespace) -> int:
    free_in_ci(args.paths)
    return 0
