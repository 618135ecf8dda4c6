"""The pair tests against other (tch, torch) pairs, each in its pair's tree (`compat`, and its
child `compat-run`)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from .checkout import DEV_PY, ROOT, rel
from .ci_disk import free_in_ci
from .libtorch import pair_env, venv_for
from .pair_tree import pair_tree
from .pairs import pairs, role, tch_for
from .shell import log, now, run, tail

# The tests every pair must pass: log lines, registry (and its walk split across threads), CPU
# allocator counts, history, estimates on the meta device (tch, and TorchScript exported by
# that pair's torch), the dependent crate. Three packages: the tracker's tests, the estimator's
# (tch_model, estimate, saved), the dependent fixture's.
PAIR_TESTS = "-p gpu-mem-track -p gpu-mem-track-estimate -p dependent --lib --test log_lines --test history"
PAIR_TESTS += " --test tch_model --test estimate --test errors --test saved --test sampler --test concurrency"
PAIR_TESTS += " --test linking --test dependent --test large_walk"


def cmd_compat_run(args: argparse.Namespace) -> int:
    """The pair tests against torch VERSION and its tch, in the pair's tree with its own
    virtualenv, lockfile and target folder (compat's log holds this process's output)."""
    env = pair_env(args.version)
    d = pair_tree(args.version, env)
    return run(["cargo", "nextest", "run", "--no-fail-fast", *PAIR_TESTS.split()], cwd=d, env=env).returncode


def cmd_compat(args: argparse.Namespace) -> int:
    """The pair tests against each torch's pair, one result line each."""
    if run(["cargo", "nextest", "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode:
        log("installing cargo-nextest")
        run(["cargo", "install", "--locked", "cargo-nextest"])
    failed = 0
    (ROOT / "target/compat").mkdir(parents=True, exist_ok=True)
    for v in args.versions:
        tch, d, started = tch_for(v), ROOT / f"target/compat/torch-{v}", now()
        if tch is None:
            log(f"torch {v} is not supported ({pairs()[0]['torch']} and later are)")
            rc = 1
        elif tch == "none":
            print(f"compat: torch {v}: no tch release builds against it (scripts/dev shim-check {v} checks the shim)")
            rc = 1
        else:
            with open(f"{d}.log", "w") as f:
                rc = run([sys.executable, DEV_PY, "compat-run", v], stdout=f, stderr=f).returncode
            found = [
                line
                for line in Path(f"{d}.log").read_text(errors="replace").splitlines()
                if re.match(r" +Summary", line)
            ]
            summary = re.sub(r".*\] +", "", found[-1]) if found else "no test ran"
            bypass = " (LIBTORCH_BYPASS_VERSION_CHECK=1)" if tch.endswith(" bypass") else ""
            print(
                f"compat: tch {tch.split(' ')[0]} + torch {v}{bypass}: {summary} in {now() - started} s (log: {rel(d)}.log)"
            )
        if rc != 0:
            failed = 1
            if os.path.exists(f"{d}.log"):
                print(tail(Path(f"{d}.log").read_text(errors="replace"), 40), end="", file=sys.stderr, flush=True)
        # The bundle's pair serves once more (bundle-check).
        if v != role("bundle")[0]:
            free_in_ci([str(d), venv_for(v)])
    return failed
