"""scripts/dev's usage text (`usage`)."""

from __future__ import annotations

import argparse

USAGE = """\
One entry point for a fresh machine: installs libtorch (a torch wheel from the Python package
index into a project-local virtualenv) unless the user brings their own, then builds and runs
what was asked.

  scripts/dev demo             build and run the demo training loop, print the log it wrote
  scripts/dev test             what CI runs: fmt, ruff, these scripts' own tests, clippy, every
                               test (one process per test), doc tests, docs, packaging; the
                               Python package's tests on
                               the main torch; the shim and the estimator's C++ against the
                               headers of the oldest torch of the Python package, of the Rust
                               crate, and of the newest. Every step runs; a table of
                               their times and results ends it, and it fails if any step did
  scripts/dev matrix           the version matrix CI leaves out: the pair tests against the
                               oldest pair (torch 2.9) and the GPU machines' (torch 2.11), the
                               latter's GPU bundle run without cargo, the Python package's tests
                               on the newest torch. Run it before resolving a change to the C++,
                               the Python package or the build scripts
  scripts/dev compat [V ...]   only the pair tests, against the pairs of these torch versions
                               (default: every supported pair but the main one)
  scripts/dev bundle-check     build the GPU bundle for torch 2.11 and run it without cargo
  scripts/dev shim-check [V]   compile the shim against torch V's headers only (default: the
                               newest torch, which no tch release builds against yet)
  scripts/dev wheel [V]        build the Python package's wheel against torch V (the main one, or
                               --torch's) into dist/torch-2.X/, from its sdist (dist/) as pip
                               builds it: abi3, manylinux_2_28, torch pinned to that minor
                               version (torch>=2.X,<2.X+1), libtorch not bundled
  scripts/dev wheels [V ...]   the same for every supported torch minor (default: WHEEL_TORCH)
  scripts/dev python [V ...]   build the wheel against each torch V (default: the main one and
                               the newest), install it into a fresh virtualenv holding only that
                               torch and pytest, run the Python tests there, one result line each
  scripts/dev bench [NAME]     criterion benchmarks; `bench python` times track() from Python
                               (beside Pytorch-Memory-Utils' when GMT_PMU_TRACKER names its
                               gpu_mem_track.py) and the registry's per-op cost
  scripts/dev env              print the environment the other commands use (eval-able)
  scripts/dev --torch V CMD    any of these against torch==V and the tch that matches it
                               (scripts/ci/torch-pairs.tsv: 2.9 to 2.13; 2.14 and later: no tch
                               builds yet, see shim-check)
"""


def cmd_usage(_: argparse.Namespace) -> int:
    """The usage, as the comment it was at the head of scripts/dev."""
    print("".join(f"# {line}\n" if line else "#\n" for line in USAGE.splitlines()), end="")
    return 0
