"""Puts an excerpt of a demo log into README.md, between its demo-log-excerpt markers.

    python scripts/figures/readme_sample.py logs/<timestamp>-<device>-gpu_mem_track.txt

`scripts/dev demo` writes the log. The excerpt is the header and the blocks up to the first one at
the end of a forward pass (`train_step`'s first `track!`, line 39 of examples/train.rs), each with
its first six group lines. `gpu-mem-track-testkit/tests/readme.rs` checks that every line of the excerpt parses and
that each `At` line names a `track!` of examples/train.rs and its function.
"""
import pathlib
import re
import sys

START, END = "<!-- demo-log-excerpt:start -->", "<!-- demo-log-excerpt:end -->"
LINES_PER_BLOCK = 6


def excerpt(log: str) -> list[str]:
    lines = log.splitlines()
    out, block = [lines[0], ""], []
    for line in lines[1:]:
        if line.startswith(("+ |", "- |")):
            block.append(line)
        elif line.startswith("At "):
            kept = block[:LINES_PER_BLOCK]
            if len(block) > LINES_PER_BLOCK:
                kept.append(f"... ({len(block) - LINES_PER_BLOCK} more lines)")
            out += kept + ([""] if kept else []) + [line, ""]
            block = []
            # train_step's own track! after the forward pass (not its `(enter)` line).
            if re.search(r": train_step\s+Total", line):
                break
    return out[:-1]


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    log = pathlib.Path(sys.argv[1]).read_text()
    readme = pathlib.Path(__file__).resolve().parents[2] / "README.md"
    text = readme.read_text()
    if START not in text or END not in text:
        print(f"{readme}: no {START} / {END} markers", file=sys.stderr)
        return 1
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    block = "\n".join(["```text", *excerpt(log), "```"])
    readme.write_text(f"{head}{START}\n{block}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
