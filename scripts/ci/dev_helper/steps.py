"""`steps`: the table of a long command's steps (scripts/dev's `test`, `matrix`) that ends it."""

from __future__ import annotations

import argparse
import sys

from .shell import log, now


def cmd_steps(args: argparse.Namespace) -> int:
    """The table of the steps ("NAME|SECONDS|EXIT" each), the total since `started`, and the exit
    status: non-zero if any step failed."""

    def span(secs: int) -> str:
        return f"{secs // 60} min {secs % 60:02d} s"

    print("\n| step | time | result |\n|---|---|---|")
    failed = 0
    for row in args.rows:
        name, secs, rc = row.split("|")[:3]
        print(f"| {name} | {span(int(secs))} | {'ok' if int(rc) == 0 else f'FAILED (exit {rc})'} |")
        failed += int(rc) != 0
    secs = now() - args.started
    n = len(args.rows)
    print(f"| total | {span(secs)} | {f'all {n} steps ok' if failed == 0 else f'{failed} of {n} steps FAILED'} |\n")
    sys.stdout.flush()
    log(f"{args.what} took {secs} s" + (f" ({args.note})" if args.note else ""))
    return int(failed != 0)
