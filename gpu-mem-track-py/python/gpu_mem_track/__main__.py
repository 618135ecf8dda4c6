"""``python -m gpu_mem_track report|plot|watch|timeline ...``: the ``gpu-mem-track`` command line
(the Rust binary's, through the same extension), with the same output.

    python -m gpu_mem_track report 26-Nov-26-10:00:00-cpu-gpu_mem_track.txt
    python -m gpu_mem_track plot LOG -o memory.png
    python -m gpu_mem_track watch --duration 60s
"""

from __future__ import annotations

import sys

from . import _native


def main(argv: list[str] | None = None) -> int:
    """Runs the command line on ``argv`` (default: ``sys.argv[1:]``); returns its exit code."""
    args = sys.argv[1:] if argv is None else argv
    sys.stdout.flush()
    sys.stderr.flush()
    return _native.cli(["python -m gpu_mem_track", *args])


if __name__ == "__main__":
    sys.exit(main())
