"""Nsight Compute (`ncu`) for the phase gate: the command that collects a row's
counters for one entry point, and the parser of its raw CSV page.

`ncu --csv --page raw` prints a header row (`"ID","Process ID",…,"Kernel Name",…`
then one column per metric), a row of units, and one row per profiled launch; its
own messages are lines starting with `==PROF==` / `==ERROR==` / `==WARNING==`.
Numbers may carry thousands separators. The CSV is sealed as ncu wrote it; this
parser is what derive uses on it.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
from typing import Any

MESSAGE = re.compile(r"^==(PROF|ERROR|WARNING)==")


def find() -> str | None:
    return shutil.which("ncu")


def command(ncu: str, metrics: list[str], entry: str, warmup: int, launches: int,
            program: list[str]) -> list[str]:
    """Profile launches warmup+1 .. warmup+launches of `entry` (exact name) in `program`."""
    return [ncu, "--csv", "--page", "raw", "--metrics", ",".join(metrics),
            "--kernel-name", f"regex:^{re.escape(entry)}$", "--launch-skip", str(warmup),
            "--launch-count", str(launches), "--target-processes", "all", *program]


def messages(text: str) -> list[str]:
    """ncu's own lines (errors and warnings first in what a gate quotes)."""
    return [line.strip() for line in text.splitlines() if MESSAGE.match(line.strip())]


def _number(text: str) -> float | str:
    cleaned = text.replace(",", "").strip()
    try:
        return float(cleaned)
    except ValueError:
        return text


def parse(text: str) -> list[dict[str, Any]]:
    """[{kernel, metrics: {name: value}, units: {name: unit}}] per profiled launch.
    ValueError when there is no header row."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    start = next((i for i, r in enumerate(rows) if r and r[0] == "ID"), None)
    if start is None:
        raise ValueError("no CSV header row (\"ID\", …) in ncu's output")
    header = rows[start]
    body = rows[start + 1:]
    units = {}
    if body and body[0] and body[0][0] == "":
        units = dict(zip(header, body[0]))
        body = body[1:]
    kernel_col = header.index("Kernel Name") if "Kernel Name" in header else None
    first_metric = next((i for i, h in enumerate(header) if re.match(r"^[a-z0-9]+__", h)),
                        len(header))
    out = []
    for r in body:
        if len(r) != len(header):
            continue
        metrics = {h: _number(v) for h, v in zip(header[first_metric:], r[first_metric:])}
        out.append({"kernel": r[kernel_col] if kernel_col is not None else "",
                    "metrics": metrics,
                    "units": {h: units.get(h, "") for h in header[first_metric:]}})
    return out


__all__ = ["command", "find", "messages", "parse"]
