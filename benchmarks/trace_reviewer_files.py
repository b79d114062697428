"""Where the trace gate's `analysis` phase goes: redo a sealed trace gate's analysis and
reviewer files (timeline PNG, HTA breakdown, per-kernel CSV, idle picture) on a copy of
its raw captures, and time each part.

    python benchmarks/trace_reviewer_files.py BUNDLE ROW.toml [--gate trace] [--repeats 3]

ROW.toml is the row the bundle was sealed from (its trace gate gives the judging). Prints
the median of each part over the repeats; nothing in the bundle is touched.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rowgate.gates.trace import TraceGate, captured, judging
from rowgate.rows import row as rows
from rowgate.trace import captures, events, holistic, plots
from rowgate.trace.capture import TRACE_FILE


def _timed(parts: dict[str, list[float]], name: str, fn: Callable[..., object],
           *args: object) -> None:
    start = time.monotonic()
    fn(*args)
    parts.setdefault(name, []).append(time.monotonic() - start)


def once(bundle: Path, row_file: Path, gate: str, parts: dict[str, list[float]]) -> None:
    row = rows.load_row(row_file).row
    spec = next(g for g in row.gates if g.id == gate)
    assert isinstance(spec, TraceGate), f"{gate} is a {spec.kind} gate, not a trace gate"
    with tempfile.TemporaryDirectory(prefix="rowgate-bench-") as tmp:
        out = Path(tmp) / gate
        shutil.copytree(bundle / "artifacts" / gate, out)
        which = captured(row, spec)
        found: list[captures.Result] = []
        _timed(parts, "validity and analysis",
               lambda: found.extend(captures.analyse(judging(spec), out, which)))
        for r in found:
            if r.analysis is not None:
                _timed(parts, f"{r.name}: timeline", plots.timeline, r.analysis, r.name,
                       out / "bench-timeline.png")
            _timed(parts, f"{r.name}: HTA", holistic.breakdown,
                   events.read_doc(out / r.name / TRACE_FILE))
        _timed(parts, "all reviewer files", captures.write_reviewer_files, found, out, row.id)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("row", type=Path)
    ap.add_argument("--gate", default="trace")
    ap.add_argument("--repeats", type=int, default=3)
    ns = ap.parse_args()
    parts: dict[str, list[float]] = {}
    for _ in range(ns.repeats):
        once(ns.bundle, ns.row, ns.gate, parts)
    for name, seconds in parts.items():
        print(f"{name:45s} median {statistics.median(seconds):7.2f} s  "
              f"({', '.join(f'{s:.2f}' for s in seconds)})")


if __name__ == "__main__":
    main()
