"""One report section per gate result: a generic view, plus richer views by kind.

Every result renders from the generic `GateResult` fields alone (status,
reason, metrics, cells, artifacts). A gate kind names one of the richer views in
`VIEWS` (its class's `report_view`, read from the gate registry); the view adds
tables and figures when the data it recognises is there, and adds nothing
otherwise, so a gate whose result shape is new still shows in full:

* `throughput`: a sequential result (`src/rowgate/report/throughput.py`) shows per
  cell its power verdict, the repeated CI reached, the rounds taken and needed,
  per arm the vLLM-bench metrics, and a ratio-with-CI plot per ratio; a format-1
  one's cells carrying `<prefix>ratio_median`, `<prefix>ratio_ci_low` and
  `<prefix>ratio_ci_high` become a ratio-with-CI plot and a summary table per prefix;
* any kind: PNG artifacts (plots the gate drew itself) are shown as sealed;
* `throughput`: per cell, the distributions of both arms' raw samples (format 2:
  each timed pass's speed on the gate's metric first; output tok/s per timed pass,
  TTFT / TPOT / E2EL per request and ITL per gap, ms), computed from the sealed
  `passes.csv` (format 1: `samples.csv`) and `requests.jsonl[.gz]` (`raw_throughput`); a
  missing one is said in red;
* `trace`: the trace gate's captures (`ROLE-MODE/` with its `trace.json.gz`) are
  re-analysed from the sealed trace (`raw_trace`): per capture the range's first
  steps as a timeline and its idle breakdown; a missing trace is said in red.
  For a trace of another layout with no PNG of its own, numeric metrics or cell
  metrics whose name contains `idle` become an idle-breakdown bar chart, and an
  artifact in Chrome trace format (a JSON object with `traceEvents`, as
  torch.profiler / Kineto writes it, gzipped or not) becomes a timeline of its
  device (`kernel`, `gpu_memcpy`, `gpu_memset`) complete events per stream;
* `build` / `audit`: cells that name an arch (an `arch` metric, or `sm_XY` in
  the cell name, as in `decode/split_kv@sm_90`) become one table per arch;
* `tokens`: the two arms' sealed outputs (`oracle.jsonl`, `candidate.jsonl`)
  are compared with the tokens gate's own `compare_request`, and every request
  that diverges is listed (position, both tokens, both logprobs); JSON
  artifacts whose name contains `diverg` holding a list of records are listed too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import rowgate.report.throughput as throughput_view
from rowgate import compressed
from rowgate.errors import VerificationError
from rowgate.records.canonical import strict_loads
from rowgate.records.gate_result import GateResult
from rowgate.records.status import MetricValue
from rowgate.report.model import (
    BarFigure,
    Figure,
    ImageFigure,
    IntervalFigure,
    Section,
    Span,
    Table,
    TimelineFigure,
)
from rowgate.report.raw_throughput import claim_rules, distributions
from rowgate.report.raw_trace import figures as trace_figures
from rowgate.report.tables import cells_table, metric_columns, metrics_table, natural_key, table
from rowgate.report.units import metric

RATIO_METRICS = ("ratio_median", "ratio_ci_low", "ratio_ci_high")
"""Format-1 throughput names (`rowgate.stats.compat_v1`; not imported: it needs scipy)."""
LATENCY_PREFIXES = {"ttft", "tpot", "itl", "e2el"}
"""Ratio prefixes of latencies: below 1 is faster."""
ARCH_IN_NAME = re.compile(r"\bsm_[0-9]{2,3}a?\b")
MAX_SPANS = 4000
MAX_IMAGE_BYTES = 8 << 20
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_ARTIFACT_BYTES = 64 << 20
"""Larger artifacts are not parsed for the page (the bundle still holds them)."""


@dataclass
class Extra:
    """What a kind adds to the generic view."""

    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    """Artifacts the kind needs that are not sealed (shown in red)."""
    replaces_cells: bool = False
    """True when the tables already show every cell metric."""
    drawn_from_raw: bool = False
    """True when the figures were computed from the raw artifacts the gate's own PNGs
    were drawn from: those PNGs are then only listed, not shown twice."""


def section_for(result: GateResult, bundle_root: Path, spec: object | None = None,
                required: bool = True) -> Section:
    """`spec` is the row's gate spec when the row file is at hand (it may add the
    row's thresholds to a plot); the section is complete without it. `required`: False
    for an informational gate (the manifest says)."""
    ordered = dict(sorted(result.cells.items(), key=lambda kv: natural_key(kv[0])))
    result = result.model_copy(update={"cells": ordered})
    special = VIEWS.get(_view_of(result.kind))
    extra = special(result, bundle_root, spec) if special else Extra()
    if not extra.drawn_from_raw:
        extra.figures += sealed_images(result, bundle_root)
    tables = [t for t in (metrics_table(result),) if t]
    tables += extra.tables
    if not extra.replaces_cells:
        cells = cells_table("cell metrics", result.cells)
        if cells:
            tables.append(cells)
    return Section(gate_id=result.gate_id, kind=result.kind, status=result.status,
                   reason=result.reason, arch=result.arch, stand_in=result.stand_in,
                   tables=tuple(tables), figures=tuple(extra.figures), notes=tuple(extra.notes),
                   artifacts=tuple(result.artifacts), missing=tuple(extra.missing),
                   required=required)


def _inside(bundle_root: Path, rel: str) -> Path | None:
    path = (bundle_root / rel).resolve()
    return path if path.is_relative_to(bundle_root.resolve()) and path.is_file() else None


def sealed_images(result: GateResult, bundle_root: Path) -> list[ImageFigure]:
    """PNG artifacts of any gate (its own plots), shown as sealed."""
    images = []
    for rel in result.artifacts:
        path = _inside(bundle_root, rel) if rel.endswith(".png") else None
        if path is None or path.stat().st_size > MAX_IMAGE_BYTES:
            continue
        data = path.read_bytes()
        if data.startswith(PNG_SIGNATURE):
            images.append(ImageFigure(title=f"{result.gate_id}: {rel}", png=data))
    return images


def _number(value: MetricValue) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


# ------------------------------------------------------------------ throughput


def _ratio_prefixes(cells: dict[str, dict[str, MetricValue]]) -> list[str]:
    prefixes: dict[str, None] = {}
    for metrics in cells.values():
        for key in metrics:
            if key.endswith(RATIO_METRICS[0]):
                p = key[: -len(RATIO_METRICS[0])]
                if all(_number(metrics.get(p + m)) is not None for m in RATIO_METRICS):
                    prefixes.setdefault(p, None)
    return list(prefixes)


def throughput(result: GateResult, bundle_root: Path, spec: object | None) -> Extra:
    if throughput_view.is_sequential(result):  # format 2: src/rowgate/report/throughput.py
        tables, figures, notes = throughput_view.view(result, spec)
        notes += throughput_view.claim_notes(claim_rules(result, bundle_root))
        extra = Extra(tables=tables, figures=figures, notes=notes)
        _distributions(extra, result, bundle_root)
        return extra
    extra = Extra()
    band = None
    min_effect = _number(result.metrics.get("min_effect"))
    if min_effect is None:
        min_effect = getattr(spec, "min_effect", None)
    if min_effect is not None:
        band = (1 - min_effect, 1 + min_effect)
    prefixes = sorted(_ratio_prefixes(result.cells), key=lambda q: (q != "", q))
    for p in prefixes:
        name = p.strip("._-") or "throughput"
        lower = p.strip("._-") in LATENCY_PREFIXES  # a latency ratio: below 1 is faster
        rows = [(cell, m) for cell, m in result.cells.items()
                if all(_number(m.get(p + k)) is not None for k in RATIO_METRICS)]
        what = name.upper() if lower else ("output tok/s" if not p else name)
        extra.figures.append(IntervalFigure(
            title=f"{result.gate_id}: candidate / oracle {what}, median with CI per cell",
            ylabel="candidate / oracle " + ("(lower is better)" if lower
                                            else "(higher is better)"),
            labels=tuple(c for c, _ in rows),
            values=tuple(_number(m[p + "ratio_median"]) or 0.0 for _, m in rows),
            lows=tuple(_number(m[p + "ratio_ci_low"]) or 0.0 for _, m in rows),
            highs=tuple(_number(m[p + "ratio_ci_high"]) or 0.0 for _, m in rows), band=band,
            better="lower" if lower else "higher"))
        wanted = _ab_columns(p, [q for q in prefixes if q != p and q.startswith(p)],
                             metric_columns(m for _, m in rows))
        verdict = next((i + 1 for i, k in enumerate(wanted) if k.endswith("verdict")), None)
        extra.tables.append(table(f"{name}: A/B per cell", ("cell", *wanted),
                                  ([c, *(metric(k, m.get(k)) for k in wanted)] for c, m in rows),
                                  verdict))
    _distributions(extra, result, bundle_root)
    return extra


def _distributions(extra: Extra, result: GateResult, bundle_root: Path) -> None:
    if result.cells:  # a throughput run: its raw samples give the distributions
        figures, missing = distributions(result, bundle_root)
        extra.figures += figures
        extra.missing += missing


def _ab_columns(prefix: str, longer: list[str], keys: list[str]) -> list[str]:
    """The A/B summary columns of one prefix (medians, ratio and CI, p, verdict),
    leaving out those of longer prefixes (`ttft_` when the prefix is empty)."""
    order = ("median_oracle", "median_candidate", "ratio_median", "ratio_ci_low",
             "ratio_ci_high", "p_value", "verdict")

    def rank(key: str) -> int:
        return next((i for i, t in enumerate(order) if t in key[len(prefix):]), len(order))

    mine = [k for k in keys if k.startswith(prefix) and not any(k.startswith(q) for q in longer)]
    return sorted((k for k in mine if rank(k) < len(order)), key=rank)


# ----------------------------------------------------------------------- trace


def _idle_metrics(metrics: dict[str, MetricValue]) -> list[tuple[str, float]]:
    return [(k, v) for k, v in ((k, _number(v)) for k, v in metrics.items())
            if "idle" in k and v is not None]


def _bar(title: str, items: list[tuple[str, float]]) -> BarFigure:
    fraction = all(0 <= v <= 1 for _, v in items)
    return BarFigure(title=title, unit="fraction of the window" if fraction else "value",
                     labels=tuple(k for k, _ in items), values=tuple(v for _, v in items))


def _json_artifact(bundle_root: Path, rel: str) -> object | None:
    """A JSON artifact inside the bundle, or None (not JSON, too large, outside)."""
    path = _inside(bundle_root, rel) if rel.endswith((".json", ".json.gz")) else None
    if path is None:
        return None
    try:
        if path.stat().st_size > MAX_ARTIFACT_BYTES:
            return None
        data = compressed.read_bytes(path, limit=MAX_ARTIFACT_BYTES)  # traces are gzipped
        return strict_loads(data, rel) if len(data) <= MAX_ARTIFACT_BYTES else None
    except (OSError, ValueError, EOFError, VerificationError):  # BadGzipFile is an OSError
        return None


def chrome_trace_timeline(title: str, doc: object) -> TimelineFigure | None:
    """Complete events of a Chrome-format trace, per (pid, tid) lane, in ms from the first."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return None
    events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
    lane_names = {(e.get("pid"), e.get("tid")): str(e.get("args", {}).get("name"))
                  for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"
                  and isinstance(e.get("args"), dict)}
    complete = [e for e in events if e.get("ph") == "X" and _number(e.get("ts")) is not None
                and _number(e.get("dur")) is not None]
    gpu = [e for e in complete if str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy",
                                                                     "gpu_memset")]
    chosen = sorted(gpu or complete, key=lambda e: e["ts"])
    if not chosen:
        return None
    t0 = chosen[0]["ts"]
    spans = tuple(Span(lane=lane_names.get((e.get("pid"), e.get("tid")),
                                           f"{e.get('pid')}/{e.get('tid')}"),
                       start=(e["ts"] - t0) / 1000.0, duration=e["dur"] / 1000.0,
                       name=str(e.get("name", ""))) for e in chosen[:MAX_SPANS])
    return TimelineFigure(title=title, unit="ms from the first event", spans=spans,
                          omitted=max(0, len(chosen) - MAX_SPANS))


def trace(result: GateResult, bundle_root: Path, spec: object | None) -> Extra:
    figures, notes, missing = trace_figures(result, bundle_root, spec)
    if figures or missing:  # the trace gate's captures: drawn from their sealed traces
        return Extra(figures=figures, notes=notes, missing=missing, drawn_from_raw=True)
    extra = Extra()
    if any(rel.endswith(".png") for rel in result.artifacts):
        return extra  # a trace of another layout with the gate's own plots: those are shown
    idle = _idle_metrics(result.metrics)
    if idle:
        extra.figures.append(_bar(f"{result.gate_id}: idle breakdown", idle))
    for cell, metrics in result.cells.items():
        idle = _idle_metrics(metrics)
        if idle:
            extra.figures.append(_bar(f"{result.gate_id} {cell}: idle breakdown", idle))
    for rel in result.artifacts:
        timeline = chrome_trace_timeline(f"{result.gate_id}: {Path(rel).name}",
                                         _json_artifact(bundle_root, rel))
        if timeline:
            extra.figures.append(timeline)
            if timeline.omitted:
                extra.notes.append(f"{rel}: timeline shows the first {len(timeline.spans)} "
                                   f"events; {timeline.omitted} more are in the artifact")
    return extra


# ----------------------------------------------------------------- build/audit


def _arch_of(cell: str, metrics: dict[str, MetricValue]) -> str:
    arch = metrics.get("arch")
    if isinstance(arch, str) and arch:
        return arch
    found = ARCH_IN_NAME.search(cell)
    return found.group(0) if found else ""


def _without_arch(cell: str, arch: str) -> str:
    """`kernel@sm_90` -> `kernel`: only the arch and its one separator go; every other
    character of a name is shown as it is (a mangled C++ name ends in `_`)."""
    for sep in "@/:":
        if cell.endswith(sep + arch):
            return cell[: -len(sep + arch)] or cell
        if cell.startswith(arch + sep):
            return cell[len(arch + sep):] or cell
    return cell


def per_arch(result: GateResult, bundle_root: Path, spec: object | None) -> Extra:
    groups: dict[str, dict[str, dict[str, MetricValue]]] = {}
    for cell, metrics in result.cells.items():
        arch = _arch_of(cell, metrics)
        if not arch:
            return Extra()  # cells are not per arch: the generic table shows them
        name = _without_arch(cell, arch)
        groups.setdefault(arch, {})[name] = {k: v for k, v in metrics.items() if k != "arch"}
    tables = [cells_table(f"{arch}: {result.kind} per kernel", cells, first_column="kernel")
              for arch, cells in sorted(groups.items(), key=lambda kv: natural_key(kv[0]))]
    return Extra(tables=[t for t in tables if t], replaces_cells=bool(groups))


# ---------------------------------------------------------------------- tokens


def _records_table(title: str, doc: object) -> Table | None:
    if not isinstance(doc, list) or not doc or not all(isinstance(d, dict) for d in doc):
        return None
    columns = metric_columns(doc)
    return table(title, columns, ([d.get(c) for c in columns] for d in doc))


def _jsonl(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.is_file() or path.stat().st_size > MAX_ARTIFACT_BYTES:
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _request_divergences(result: GateResult, bundle_root: Path) -> Table | None:
    """Every request whose ids differ, by the tokens gate's own comparison of the
    two arms' sealed outputs (`oracle.jsonl`, `candidate.jsonl`)."""
    try:
        from rowgate.gates.tokens import ARM_FILES, compare_request
    except ImportError:
        return None
    by_name = {Path(a).name: _inside(bundle_root, a) for a in result.artifacts}
    if not all(by_name.get(name) for name in ARM_FILES.values()):
        return None
    try:
        arms = {arm: {o["id"]: o for o in _jsonl(by_name[name])} for arm, name in ARM_FILES.items()}
        diffs = [compare_request(o, arms["candidate"][rid]) for rid, o in arms["oracle"].items()
                 if rid in arms["candidate"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # an older or newer output format: the gate's own tables still show
    rows = [(d.id, d.cell, d.first_divergence, d.tokens[0], d.tokens[1], d.logprobs[0],
             d.logprobs[1], f"{d.agreeing}/{d.oracle_tokens}")
            for d in diffs if d.first_divergence is not None]
    return table("requests that diverge from the oracle", (
        "request", "cell", "first divergence (position)", "oracle token", "candidate token",
        "oracle logprob", "candidate logprob", "agreeing / oracle tokens"), rows)


def tokens(result: GateResult, bundle_root: Path, spec: object | None) -> Extra:
    extra = Extra()
    divergences = _request_divergences(result, bundle_root)
    if divergences is not None:
        if divergences.rows:
            extra.tables.append(divergences)
        else:
            extra.notes.append("every request is token-identical to the oracle")
    for rel in result.artifacts:
        if "diverg" in Path(rel).name:
            records = _records_table(f"divergences ({rel})", _json_artifact(bundle_root, rel))
            if records:
                extra.tables.append(records)
    return extra


VIEWS: dict[str, Callable[[GateResult, Path, object | None], Extra]] = {
    "throughput": throughput,
    "trace": trace,
    "per_arch": per_arch,
    "tokens": tokens,
}
"""The richer views, by the name a gate class gives as its `report_view`."""


def _view_of(kind: str) -> str:
    """The view the kind's gate class names; "" for a kind this rowgate does not know
    (a bundle of another version): the generic view."""
    from rowgate.gates import registry

    gate = registry.lookup(kind)
    return gate.report_view if gate is not None else ""
