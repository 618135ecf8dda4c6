"""`bench-package`: which package's benches/ holds a benchmark."""

from __future__ import annotations

import argparse
import sys


def cmd_bench_package(args: argparse.Namespace) -> int:
    """The package whose benches/ has the benchmark, from `cargo metadata` on stdin."""
    import json

    for p in json.load(sys.stdin)["packages"]:
        if any(t["name"] == args.name and "bench" in t["kind"] for t in p["targets"]):
            print(p["name"])
            break
    return 0
