"""`rowgate history ROW`: every sealed bundle of a row, in the order it was sealed.

Per bundle: when, which commit and branch, the bundle's own status, the review
verdict when a record is filed, whether its signature verified (only when the
caller gives a verifier: a listing does not guess whose key counts), each gate's
status, and the value of one chosen metric — gate-level, or one series per cell
when the gate measured cells. Pure reading: `collect` builds a `History`, the
renderers (terminal table, JSON, CSV, PNG) only lay it out.

A row's history spans the throughput gate's change of format (format 1: bootstrap
ratio of medians per repeat; format 2: the sequential paired design,
`src/rowgate/report/throughput.py`). Where the two name one quantity differently
(`FORMAT_NAMES`: output tok/s ratio `ratio_median` / `output_throughput_ratio`, a
latency's `ttft_ratio_median` / `ttft_ratio`, …), following either name reads the
other in bundles of the other format, and the history's notes say so. Where one name
means two things (`ratio_ci_low`: output tok/s in format 1, the gate's metric in
format 2), the values are shown as sealed and a note says the series changes meaning.
"""

from __future__ import annotations

import csv
import difflib
import io
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rowgate.errors import EvidenceError, UsageError
from rowgate.records.gate_result import GateResult
from rowgate.report.assemble import read_review, review_path
from rowgate.report.model import SeriesFigure
from rowgate.report.tables import natural_key
from rowgate.seal.bundle import Bundle, find_bundles
from rowgate.seal.signing import Verifier

GATE_LEVEL = "(gate)"
"""The series name of a gate-level metric."""
FORMAT_NAMES = {
    "output_throughput_ratio": "ratio_median",
    "output_throughput_ratio_ci_low": "ratio_ci_low",
    "output_throughput_ratio_ci_high": "ratio_ci_high",
    **{f"{lat}_ratio": f"{lat}_ratio_median" for lat in ("ttft", "tpot", "itl")}}
"""A throughput quantity's format-2 name -> its format-1 name (candidate / baseline)."""
TWO_MEANINGS = ("ratio_ci_low", "ratio_ci_high", "ratio_ci_low_min", "ratio_ci_high_max",
                "verdict")
"""Throughput names both formats write, for different quantities (output tok/s and
parity/better/worse/inconclusive in format 1; the gate's metric and
better/worse/equivalent/underpowered in format 2)."""
FORMAT_ONE_NAMES = {v: k for k, v in FORMAT_NAMES.items() if v not in TWO_MEANINGS}
"""Format-1 name -> format-2 name, where the format-1 name is not also a format-2 name."""


@dataclass(frozen=True)
class Entry:
    bundle_id: str
    path: str
    created: str
    commit: str
    branch: str
    status: str
    review: str
    """The filed review's verdict, or empty."""
    signature: str
    """`verified`, `NOT verified: <first problem>` or `not checked`."""
    gates: tuple[tuple[str, str], ...]
    """(gate id, status) in the row's order."""
    values: tuple[tuple[str, float | None], ...]
    """(series, value) of the chosen metric."""


@dataclass(frozen=True)
class History:
    row_id: str
    evidence: str
    metric: str
    series: tuple[str, ...]
    entries: tuple[Entry, ...]
    unreadable: tuple[tuple[str, str], ...] = ()
    """(path, why) of bundle directories that could not be read."""
    notes: tuple[str, ...] = ()
    """What a reader of the series must know (a throughput metric read under its other
    format's name, or one name meaning two things across the bundles)."""

    def doc(self) -> dict[str, Any]:
        return {"row": self.row_id, "evidence": self.evidence, "metric": self.metric or None,
                "series": list(self.series),
                "bundles": [{**asdict(e), "gates": dict(e.gates), "values": dict(e.values)}
                            for e in self.entries],
                "unreadable": [{"path": p, "why": w} for p, w in self.unreadable],
                "notes": list(self.notes)}

    def csv(self) -> str:
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        w.writerow(["created", "commit", "branch", "bundle", "status", "review", "signature",
                    *self.series])
        for e in self.entries:
            values = dict(e.values)
            w.writerow([e.created, e.commit, e.branch, e.bundle_id, e.status, e.review,
                        e.signature, *("" if values.get(s) is None else repr(values[s])
                                       for s in self.series)])
        return out.getvalue()


def _row_id(ref: str) -> str:
    if ref.endswith(".toml"):
        from rowgate.rows.row import load_row

        return load_row(Path(ref)).row.id
    return ref


def _format(result: GateResult) -> int | None:
    """A throughput result's format (1 or 2); None for any other kind."""
    from rowgate.report.throughput import is_sequential

    if result.kind != "throughput":
        return None
    return 2 if is_sequential(result) else 1


def _name_in(result: GateResult, name: str) -> str:
    """The name `name`'s quantity has in this result (its format's, for throughput)."""
    fmt = _format(result)
    other = FORMAT_NAMES.get(name) if fmt == 1 else FORMAT_ONE_NAMES.get(name) if fmt else None
    names = set(result.metrics).union(*result.cells.values())
    return other if name not in names and other is not None and other in names else name


def _values(result: GateResult, name: str) -> dict[str, float | None]:
    found: dict[str, float | None] = {}
    if name in result.metrics:
        found[GATE_LEVEL] = _float(result.metrics[name])
    for cell, metrics in result.cells.items():
        if name in metrics:
            found[cell] = _float(metrics[name])
    return found


def _notes(results: list[GateResult], gate: str, name: str) -> list[str]:
    formats = {f for r in results if (f := _format(r)) is not None}
    notes = [f"{gate}.{name} is read as {gate}.{read} in {n} format-{f} bundle(s) (the "
             f"same quantity under that format's name)"
             for (f, read), n in _counts([(_format(r), _name_in(r, name)) for r in results
                                          if _name_in(r, name) != name]).items()]
    if formats == {1, 2} and name in TWO_MEANINGS:
        same = next((k for k, v in FORMAT_NAMES.items() if v == name), None)
        hint = f"; {gate}.{same} is the output tok/s one in both" if same else ""
        notes.append(f"{gate}.{name} means different things across these bundles: output "
                     f"tok/s (format 1) and the gate's own metric (format 2){hint}")
    return notes


def _counts(items: list[tuple[int | None, str]]) -> dict[tuple[int | None, str], int]:
    out: dict[tuple[int | None, str], int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _known_metrics(results_by_bundle: list[list[GateResult]], gate: str) -> list[str]:
    names: dict[str, None] = {}
    for results in results_by_bundle:
        for r in results:
            if r.gate_id == gate:
                names.update(dict.fromkeys(r.metrics))
                for metrics in r.cells.values():
                    names.update(dict.fromkeys(metrics))
                if _format(r) is not None:  # a throughput quantity by either format's name
                    aliases = {**FORMAT_NAMES, **FORMAT_ONE_NAMES}
                    names.update(dict.fromkeys(k for k, v in aliases.items() if v in names))
    return list(names)


def _check_metric(metric: str, results_by_bundle: list[list[GateResult]], row_id: str) -> None:
    gate, sep, name = metric.partition(".")
    if not sep or not name:
        raise UsageError(f"--metric {metric!r}: expected GATE.METRIC (e.g. "
                         f"throughput.ratio)")
    gates = {r.gate_id for results in results_by_bundle for r in results}
    if gate not in gates:
        close = difflib.get_close_matches(gate, sorted(gates), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UsageError(f"--metric {metric}: no bundle of {row_id} has a gate {gate!r}{hint} "
                         f"(gates: {', '.join(sorted(gates))})")
    known = _known_metrics(results_by_bundle, gate)
    if name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {gate}.{close[0]}?" if close else ""
        raise UsageError(f"--metric {metric}: gate {gate} has no metric {name!r} in any bundle"
                         f"{hint}")


def _signature(bundle: Bundle, verifier: Verifier | None) -> str:
    if verifier is None:
        return "not checked"
    try:
        bundle.verify(verifier)
    except EvidenceError as exc:
        return f"NOT verified: {exc.diagnostics()}"
    return "verified"


def collect(row: str, evidence: Path, *, metric: str | None = None,
            verifier: Verifier | None = None,
            reviews_dir: Path | None = None) -> History:
    """Every bundle of `row` under `evidence`, oldest first, with `metric`'s values."""
    row_id = _row_id(row)
    if not (evidence / row_id).is_dir():
        there = sorted(p.name for p in evidence.iterdir() if p.is_dir()) if evidence.is_dir() else []
        raise UsageError(f"no bundles of row {row_id} under {evidence} (rows there: "
                         f"{', '.join(there) or 'none'})")
    bundles, unreadable = [], []
    for path in find_bundles(evidence, row_id):
        try:
            b = Bundle.open(path)
            bundles.append((b, b.results()))
        except EvidenceError as exc:
            unreadable.append((str(path), exc.diagnostics()))
        except (OSError, ValueError) as exc:  # a gate file that is not a GateResult
            unreadable.append((str(path), f"a gate result cannot be read ({exc})"))
    # stable: bundles sealed within one second (`created` has seconds) keep the order
    # they were published in (find_bundles sorts by mtime)
    bundles.sort(key=lambda br: br[0].manifest.created)
    if metric:
        _check_metric(metric, [r for _, r in bundles], row_id)
    gate, _, name = (metric or "").partition(".")
    entries, series = [], {}
    notes: list[str] = []
    if metric:
        followed = [r for _, rs in bundles for r in rs if r.gate_id == gate]
        notes = _notes(followed, gate, name)
    for b, results in bundles:
        result = next((r for r in results if r.gate_id == gate), None)
        values = {} if not metric or result is None else _values(result, _name_in(result, name))
        series.update(dict.fromkeys(values))
        review = read_review(review_path(reviews_dir, b)) if reviews_dir else None
        m = b.manifest
        entries.append(Entry(
            bundle_id=b.id, path=str(b.path), created=m.created, commit=m.subject.commit,
            branch=m.subject.branch, status=m.status.value,
            review=review.verdict if review else "", signature=_signature(b, verifier),
            gates=tuple((g.gate_id, g.status.value) for g in m.gates),
            values=tuple(values.items())))
    ordered = tuple(sorted(series, key=lambda s: (s != GATE_LEVEL, natural_key(s))))
    return History(row_id=row_id, evidence=str(evidence), metric=metric or "", series=ordered,
                   entries=tuple(entries), unreadable=tuple(unreadable), notes=tuple(notes))


def figure(history: History) -> SeriesFigure:
    """The chosen metric over the bundles, one line per series."""
    if not history.metric:
        raise UsageError("--plot needs --metric GATE.METRIC (what to plot)")
    labels = tuple(f"{e.commit[:8]}\n{e.created[:16].replace('T', ' ')}"
                   for e in history.entries)
    lines = tuple((s, tuple(dict(e.values).get(s) for e in history.entries))
                  for s in history.series)
    return SeriesFigure(title=f"{history.row_id}: {history.metric} per bundle",
                        ylabel=history.metric.partition(".")[2], xlabels=labels, series=lines)


def plot(history: History, out: Path) -> Path:
    from rowgate.report.plots import render

    png = render(figure(history))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png)
    return out
