"""What the shell gave scripts/dev for free: its log lines (`[dev] ...` on stderr), commands whose
exit status the caller reads, `date +%s`, `tail -n`."""

from __future__ import annotations

import subprocess
import sys
import time

# A child's stdout sent here is the shell's `>&2`.
ERR = sys.stderr.fileno()


def log(msg: str) -> None:
    log_raw(f"[dev] {msg}")


def log_raw(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(cmd: list, **kwargs) -> subprocess.CompletedProcess:
    """A command whose exit status the caller reads (as the shell's)."""
    sys.stdout.flush()
    return subprocess.run(cmd, check=False, **kwargs)


def now() -> int:
    """Whole seconds, as `date +%s`: the shell's durations and these agree."""
    return int(time.time())


def tail(text: str, n: int) -> str:
    return "".join(text.splitlines(keepends=True)[-n:])
