"""The torch<->tch table, read from scripts/ci/torch-pairs.tsv (the one copy of it), and
docs/compatibility.md's table generated from it: the `tch` and `pairs-doc` subcommands."""

from __future__ import annotations

import argparse
import re

from .checkout import ROOT, rel
from .shell import log

PAIRS = ROOT / "scripts/ci/torch-pairs.tsv"
DOC = ROOT / "docs/compatibility.md"
DOC_START, DOC_END = "<!-- torch-pairs:start -->", "<!-- torch-pairs:end -->"


def minor(version: str) -> str:
    """2.13 for 2.13.0 (`cut -d. -f1,2`)."""
    return ".".join(version.split(".")[:2])


def pairs() -> list[dict[str, str]]:
    rows = [line.rstrip("\n").split("\t") for line in PAIRS.read_text().splitlines() if not line.startswith("#")]
    header, body = rows[0], [r for r in rows[1:] if r != [""]]
    return [dict(zip(header, r)) for r in body]


def role(name: str) -> list[str]:
    return [p["torch"] for p in pairs() if name in p["roles"].split(",")]


def tch_for(version: str) -> str | None:
    """The tch release whose bindings match torch `version` ("0.26.0", with " bypass" when its
    version check must be bypassed), "none" when no tch release builds against it, None when the
    torch is not supported."""
    m = re.match(r"2\.(\d+)\.", version)
    table = pairs()
    if m is None:
        return None
    first, last = int(table[0]["torch"].split(".")[1]), int(table[-1]["torch"].split(".")[1])
    n = int(m.group(1))
    if n > last:
        return "none"
    for p in table:
        if int(p["torch"].split(".")[1]) == n and n >= first:
            return p["tch"] + (" bypass" if p["check"] == "bypass" else "")
    return None


def cmd_tch(args: argparse.Namespace) -> int:
    tch = tch_for(args.version)
    if tch is None:
        log(f"torch {args.version} is not supported ({pairs()[0]['torch']} and later are)")
        return 1
    print(tch)
    return 0


def pairs_doc() -> str:
    lines = ["| torch | tch | tested how |", "|---|---|---|"]
    for p in pairs():
        tch = "none" if p["tch"] == "none" else minor(p["tch"])
        if p["check"] == "bypass":
            tch += " + `LIBTORCH_BYPASS_VERSION_CHECK=1`"
        lines.append(f"| {minor(p['torch'])} | {tch} | {p['tested']} |")
    return "\n".join(lines) + "\n"


def cmd_pairs_doc(args: argparse.Namespace) -> int:
    """docs/compatibility.md's table, between its torch-pairs markers, from the data file."""
    text = DOC.read_text()
    start, end = text.index(DOC_START) + len(DOC_START) + 1, text.index(DOC_END)
    want = text[:start] + pairs_doc() + text[end:]
    if args.write:
        DOC.write_text(want)
    elif text != want:
        log(f"{rel(DOC)}'s table differs from {rel(PAIRS)}: run python3 scripts/ci/dev.py pairs-doc --write")
        return 1
    else:
        print(pairs_doc(), end="")
    return 0
