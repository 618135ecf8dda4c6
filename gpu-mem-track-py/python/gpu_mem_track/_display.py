"""Notebook display: a tracker shows its last block, and :func:`report` its logs' report, as HTML
tables (Jupyter calls ``_repr_html_``); both print as the text the log and the command line give."""

from __future__ import annotations

import html
import json
import os
import re
from typing import Any

from ._load import native as _native

# A group line of the log: sign, count, shape, MiB, class, dtype, then optional fields.
_GROUP = re.compile(r"^([+-]) \| +(\d+) \* Size:(\(.*?\)) +\| Memory: (\S+) M \| (.*?) \| ([^|]+?)(?: \| (.*))?$")
_STYLE = "border-collapse:collapse;font-family:monospace;font-size:90%"
_CELL = "padding:2px 8px;border-bottom:1px solid #ddd"


_NUMERIC = {1, 3}  # count, MiB: right-aligned


def _cell(text: str, column: int, tag: str = "td", style: str = "") -> str:
    side = "right" if column in _NUMERIC else "left"
    return f'<{tag} style="{_CELL};text-align:{side}{style}">{html.escape(text)}</{tag}>'


def _row(cells: list[str], header: bool = False) -> str:
    tag = "th" if header else "td"
    return "<tr>" + "".join(_cell(c, i, tag) for i, c in enumerate(cells)) + "</tr>"


def block_html(lines: list[str], at: str) -> str:
    """One block of the log as a table: a row per group line (``+`` green, ``-`` red), the ``At``
    line as its caption."""
    rows = [_row(["", "count", "shape", "MiB", "class", "dtype", "notes"], header=True)]
    for line in lines:
        m = _GROUP.match(line)
        if m:
            sign, count, shape, mib, cls, dtype, notes = m.groups()
            color = ";color:#1a7f37" if sign == "+" else ";color:#cf222e"
            cells = [sign, count, shape, mib, cls, dtype.strip(), notes or ""]
            rows.append("<tr>" + "".join(_cell(c, i, style=color if i == 0 else "") for i, c in enumerate(cells)) + "</tr>")
        else:  # a line this display does not know: shown whole
            rows.append(f'<tr><td colspan="7" style="{_CELL}">{html.escape(line)}</td></tr>')
    if len(rows) == 1:
        rows.append(f'<tr><td colspan="7" style="{_CELL};color:#666">no group changed</td></tr>')
    caption = f'<caption style="caption-side:bottom;text-align:left;font-family:monospace">{html.escape(at)}</caption>'
    return f'<table style="{_STYLE}">{caption}{"".join(rows)}</table>'


class Report:
    """What ``gpu-mem-track report`` says about one or more logs (one per rank or GPU).

    ``str(report)`` is the command line's text, :attr:`data` its ``--json`` dict, and a notebook
    shows a table per log (peaks, growth, leak suspects, out-of-memory blocks) above that text.
    """

    def __init__(self, text: str, data: dict[str, Any]) -> None:
        self.text = text
        self.data = data

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        logs = ", ".join(os.path.basename(str(log["path"])) for log in self.data["logs"])
        return f"Report({logs})"

    def _repr_html_(self) -> str:
        # Columns 1 and 3 are the numeric ones (_NUMERIC).
        rows = [_row(["log", "points", "device", "peak MiB", "rank", "figure", "at"], header=True)]
        for log in self.data["logs"]:
            peak = log.get("peak") or {}
            rank = log.get("rank")
            rows.append(
                "<tr>"
                + "".join(
                    _cell(c, i)
                    for i, c in enumerate([
                        os.path.basename(str(log["path"])),
                        str(log.get("points", 0)),
                        str(log.get("device") or ""),
                        f"{peak['mib']:.1f}" if "mib" in peak else "",
                        "" if rank is None else str(rank),
                        str(peak.get("field", "")),
                        str(peak.get("at", "")),
                    ])
                )
                + "</tr>"
            )
        table = f'<table style="{_STYLE}">{"".join(rows)}</table>'
        return f'{table}<details><summary>the whole report</summary><pre>{html.escape(self.text)}</pre></details>'


def report(*logs: str | os.PathLike, top: int = 5) -> Report:
    """The report of ``gpu-mem-track report`` on these logs (each rank's, merged), as a
    :class:`Report`: peaks, the largest growths, leak suspects (``top`` of each), out-of-memory
    blocks, headroom and fragmentation.

    Raises:
        ValueError: no log was given.
        OSError: a log cannot be read.
    """
    if top < 1:
        raise ValueError(f"top={top}: must be at least 1")
    text, data = _native.report([os.fspath(log) for log in logs], top)
    return Report(text, json.loads(data))
