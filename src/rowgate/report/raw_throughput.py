"""A throughput gate's sealed raw samples, read back, and the plots drawn from them.

The gate's result holds summaries (the ratio and its CI); the bundle holds every
sample they came from. `read_samples` reads them back with the definitions the gate
uses (`rowgate.stats.latency`: vLLM's benchmark names, and the per-pass `pass_speed`) into
one shape: per metric, per cell, per arm, (pass, value) pairs — output tok/s per pass,
TTFT / TPOT / E2EL per request and ITL per inter-token gap (ms) — plus, for format 2,
each pass's speed on the gate's own metric (what the gate pairs round by round).

* Format 2 (`meta.json` says `"format": 2`; what every new bundle is): `passes.csv`,
  `requests.jsonl`, `clocks.csv`. Only timed passes of the rounds the gate kept count:
  warm-up rounds, and rounds whose clocks moved beyond the plan's `clock_tolerance`
  (`rowgate.stats.noise.clock_move`, as the gate decides it), are left out. The arms are
  `baseline` and `candidate`; meta.json's `baseline_arm` names the row's arm the
  baseline was (the report labels it so).
* Format 1 (sealed by an older rowgate): `samples.csv` (one wall time per repeat and
  arm) and `requests.jsonl`; the arms are `oracle` and `candidate`.

The report draws each cell's distribution of both arms from it (`distributions`),
`rowgate compare` compares two bundles' samples with it. A sample file that is not
sealed (or does not parse) is reported as missing, never silently skipped.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rowgate import compressed
from rowgate.records.canonical import strict_loads
from rowgate.records.gate_result import GateResult
from rowgate.records.status import Status
from rowgate.report.model import DistributionFigure, Figure, Panel
from rowgate.report.tables import natural_key

FORMAT = 2
META, PASSES, CLOCKS = "meta.json", "passes.csv", "clocks.csv"
SAMPLES, REQUESTS = "samples.csv", "requests.jsonl"
"""samples.csv: format 1 only; requests.jsonl: both formats."""
ARMS = {1: ("oracle", "candidate"), 2: ("baseline", "candidate")}
"""(baseline, candidate) as each format names them."""
MAX_BYTES = 64 << 20
Record = dict[str, Any]
"""One line of requests.jsonl, or one row of passes.csv / samples.csv."""


@dataclass(frozen=True)
class Metric:
    name: str
    label: str
    unit: str
    better: str
    """"lower" or "higher"."""
    per: str
    """What one value is: "timed pass", "request" or "inter-token gap"."""


METRICS = {
    "tok_s": Metric("tok_s", "output tok/s", "tok/s", "higher", "timed pass"),
    "ttft": Metric("ttft", "TTFT (time to first token)", "ms", "lower", "request"),
    "tpot": Metric("tpot", "TPOT (time per output token)", "ms", "lower", "request"),
    "itl": Metric("itl", "ITL (inter-token latency)", "ms", "lower", "inter-token gap"),
    "e2el": Metric("e2el", "E2EL (request latency)", "ms", "lower", "request"),
}
GATE_METRICS = {"output_throughput": "tok_s", "ttft": "ttft", "tpot": "tpot", "itl": "itl",
                "e2el": "e2el"}
"""The gate's `metric` (a row key) -> its key in METRICS."""
LATENCIES = ("ttft", "tpot", "itl", "e2el")

Values = dict[str, dict[str, list[tuple[int, float]]]]
"""cell -> arm -> [(pass, value)] in the order sealed; the pass is its round (format 2)
or repeat (format 1)."""


@dataclass
class Samples:
    """Every raw sample of one throughput gate, by metric (keys of METRICS)."""

    values: dict[str, Values] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    format: int = 1
    baseline_arm: str = "oracle"
    """The row's arm the baseline is (format 1: always the oracle)."""
    metric: str | None = None
    """The key in METRICS of the metric the gate decided on (format 2), else None."""
    speeds: Values = field(default_factory=dict)
    """Format 2: each timed pass's speed on the gate's metric (`latency.pass_speed`)."""
    discarded: int = 0
    """Format 2: timed rounds left out because their clocks moved."""

    @property
    def arms(self) -> tuple[str, str]:
        """(baseline, candidate) as the bundle names them."""
        return ARMS[self.format]

    def label(self, arm: str) -> str:
        if self.format == 1 or arm != "baseline":
            return arm
        return f"baseline ({self.baseline_arm})"


def _artifact(result: GateResult, bundle_root: Path, name: str) -> Path | None:
    """The sealed file `name`, or `name.gz` (requests.jsonl is sealed gzipped since
    2026-12-02; `rowgate.compressed`: the name says which)."""
    for rel in result.artifacts:
        if Path(rel).name in (name, name + compressed.SUFFIX):
            path = (bundle_root / rel).resolve()
            if path.is_relative_to(bundle_root.resolve()) and path.is_file():
                return path
    return None


def _by_cell(records: Iterable[Record], arms: tuple[str, str], key: str,
             value: Callable[[Record], list[float]]) -> Values:
    out: Values = {}
    for r in records:
        if r.get("arm") in arms:
            got = out.setdefault(str(r["cell"]), {k: [] for k in arms})
            got[r["arm"]] += [(int(r[key]), v) for v in value(r)]
    return dict(sorted(out.items(), key=lambda kv: natural_key(kv[0])))


def _latency(kind: str) -> Callable[[Record], list[float]]:
    from rowgate.stats.latency import request_values

    def get(r: Record) -> list[float]:
        if kind == "e2el" and r.get("latency_s") is None:
            return []
        return [1e3 * x for x in request_values(r)[kind]]  # TTFT etc.: streamed arms only
    return get


def _tok_s(r: Record) -> list[float]:
    from rowgate.stats.latency import pass_speed

    return [pass_speed("output_throughput", [], float(r["wall_s"]), int(r["output_tokens"]))]


def _csv(path: Path) -> list[Record]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _jsonl(path: Path) -> list[Record]:
    data = compressed.read_bytes(path, limit=MAX_BYTES)  # a gzip bomb stops at the limit
    if len(data) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES >> 20} MiB")
    return [strict_loads(line, path.name) for line in data.decode().splitlines()
            if line.strip()]


def _latencies(records: list[Record], arms: tuple[str, str], key: str) -> dict[str, Values]:
    out = {kind: _by_cell(records, arms, key, _latency(kind)) for kind in LATENCIES}
    return {k: v for k, v in out.items() if any(any(a.values()) for a in v.values())}


class _Reader:
    """Reads one gate's files into `got`; what is absent or broken goes to `missing`."""

    def __init__(self, result: GateResult, bundle_root: Path, got: Samples):
        self.result, self.root, self.got = result, bundle_root, got
        self.where = f"artifacts/{result.gate_id}/"

    def read(self, name: str, what: str, parse: Callable[[Path], Any]) -> Any:
        path = _artifact(self.result, self.root, name)
        if path is None:
            self.got.missing.append(f"{self.where}{name} is not sealed: no {what}")
            return None
        try:
            return parse(path)
        except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
            self.got.missing.append(f"{self.where}{name} does not parse ({exc}): no {what}")
            return None


def _meta(result: GateResult, bundle_root: Path) -> tuple[Record | None, str | None]:
    """meta.json, or None and why (None, None: not sealed)."""
    path = _artifact(result, bundle_root, META)
    if path is None:
        return None, None
    try:
        doc = strict_loads(path.read_bytes(), META)
    except (OSError, ValueError) as exc:
        return None, f"does not parse ({exc})"
    return (doc, None) if isinstance(doc, dict) else (None, "is not a JSON object")


SEALED_CLAIM_RULE = "narrow"
"""A plan sealed before the design's `claim_rule` stopped by this one (rowgate.stats.paired)."""


def claim_rules(result: GateResult, bundle_root: Path) -> dict[str, str]:
    """Each cell's claim rule, as its sealed plan names it ({} without a format-2 meta)."""
    meta, _ = _meta(result, bundle_root)
    plans = meta.get("plans") if meta is not None and meta.get("format") == FORMAT else None
    if not isinstance(plans, dict):
        return {}
    rules = {}
    for cell, plan in plans.items():
        design = plan.get("design") if isinstance(plan, dict) else None
        if isinstance(design, dict):
            rules[str(cell)] = str(design.get("claim_rule", SEALED_CLAIM_RULE))
    return rules


def _read_v1(reader: _Reader) -> None:
    got, arms = reader.got, ARMS[1]
    passes = reader.read(SAMPLES, "per-pass output tok/s", _csv)
    if passes is not None:
        got.values["tok_s"] = _by_cell(passes, arms, "repeat", _tok_s)
    requests = reader.read(REQUESTS, "per-request latencies", _jsonl)
    if requests is not None:
        got.values.update(_latencies(requests, arms, "repeat"))


def _kept_rounds(reader: _Reader, meta: Record) -> set[tuple[str, int]] | None:
    """(cell, round) of the timed rounds whose clocks held; None: every timed round
    (no clocks sampled, or clocks.csv unreadable, said in `missing`)."""
    from rowgate.stats.noise import clock_move

    if not meta.get("clocks_sampled"):
        return None
    rows = reader.read(CLOCKS, "clock samples: rounds the gate discarded are shown too",
                       _csv)
    if rows is None:
        return None
    by_round: dict[tuple[str, int], list[Record]] = {}
    for c in rows:
        if c["phase"] == "timed":
            by_round.setdefault((c["cell"], int(c["round"])), []).append(c)
    kept = {k for k, cs in by_round.items()
            if clock_move(cs, float(meta["plans"][k[0]]["clock_tolerance"])) is None}
    reader.got.discarded = len(by_round) - len(kept)
    return kept


def _speeds(passes: list[Record], requests: list[Record], meta: Record) -> Values:
    """Each sample's speed on its cell's metric, exactly as the gate computes it: a
    sample is an arm's k passes of one round (`passes_per_sample`, k = 1 in bundles
    sealed before the sample length), as the cell's schedule takes them (the mean of
    the passes' speeds when interleaved, pooled when blocked: `latency.sample_speed`)."""
    from rowgate.gates.throughput.measure import sealed_schedule
    from rowgate.stats.latency import sample_speed, schedule_statistic

    reqs: dict[tuple[str, int, str], list[Record]] = {}
    for r in requests:
        reqs.setdefault((r["cell"], int(r["round"]), r["arm"]), []).append(r)
    grouped: dict[tuple[str, int, str], list[Record]] = {}
    for p in passes:
        grouped.setdefault((p["cell"], int(p["round"]), p["arm"]), []).append(p)
    firsts = [p for p in passes if int(p.get("pass") or 0) == 0]  # one row per sample

    def speed(p: Record) -> list[float]:
        key = (p["cell"], int(p["round"]), p["arm"])
        plan = meta["plans"][p["cell"]]
        sample = sorted(grouped[key], key=lambda q: int(q.get("pass") or 0))
        return [sample_speed(plan["metric"], reqs.get(key, []),
                             [float(q["wall_s"]) for q in sample],
                             [int(q["output_tokens"]) for q in sample],
                             schedule_statistic(sealed_schedule(plan)))]
    return _by_cell(firsts, ARMS[2], "round", speed)


def _read_v2(reader: _Reader, meta: Record) -> None:
    got, arms = reader.got, ARMS[2]
    got.baseline_arm = str(meta.get("baseline_arm", "oracle"))
    metrics = {GATE_METRICS.get(str(p.get("metric"))) for p in meta.get("plans", {}).values()}
    got.metric = metrics.pop() if len(metrics) == 1 else None
    kept = _kept_rounds(reader, meta)

    def timed(rows: list[Record]) -> list[Record]:
        return [r for r in rows if r["phase"] == "timed"
                and (kept is None or (r["cell"], int(r["round"])) in kept)]
    passes = reader.read(PASSES, "per-pass output tok/s or speeds",
                         lambda p: timed(_csv(p)))
    if passes is not None:
        got.values["tok_s"] = _by_cell(passes, arms, "round", _tok_s)
    requests = reader.read(REQUESTS, "per-request latencies or speeds",
                           lambda p: timed(_jsonl(p)))
    if requests is not None:
        got.values.update(_latencies(requests, arms, "round"))
    if passes is not None and requests is not None:
        try:
            got.speeds = _speeds(passes, requests, meta)
        except (ValueError, KeyError, TypeError) as exc:  # LatencyError is a ValueError
            got.missing.append(f"{reader.where}{PASSES} gives no speed on the gate's metric "
                               f"({exc})")


_NOT_MEASURED = (Status.PENDING,)
"""Statuses a gate may seal without having measured anything."""


def read_samples(result: GateResult, bundle_root: Path) -> Samples:
    """The gate's raw samples; what is not sealed or does not parse, in `missing`."""
    meta, broken = _meta(result, bundle_root)
    if meta is None and broken is None and _artifact(result, bundle_root, SAMPLES) is not None:
        meta = {}  # format 1 needs no meta.json to read its samples
    got = Samples(format=2 if meta is None or meta.get("format") == FORMAT else 1)
    reader = _Reader(result, bundle_root, got)
    if meta is None and broken is None and result.status in _NOT_MEASURED:
        # a gate that never measured (e.g. PENDING: an arm cannot run here) has no
        # samples by design; saying its meta.json "is not sealed" read like a lost file
        got.missing.append(f"{result.gate_id} was not measured ({result.status.value}: "
                           f"{result.reason}): no samples")
    elif meta is None:
        got.missing.append(f"{reader.where}{META} {broken or 'is not sealed'}: no format, "
                           f"plan or baseline arm, no samples read")
    elif got.format == 1:
        _read_v1(reader)
    else:
        _read_v2(reader, meta)
    return got


def _figure(result: GateResult, got: Samples, name: str, cells: Values, title: str,
            unit: str, better: str) -> DistributionFigure | None:
    panels = tuple(Panel(title=cell, series=tuple(
        (got.label(arm), tuple(v for _, v in arms[arm])) for arm in got.arms))
        for cell, arms in cells.items() if any(arms.values()))
    if not panels:
        return None
    mark = " (the gate's metric)" if name == got.metric else ""
    return DistributionFigure(title=f"{result.gate_id}: {title}{mark}, both arms", unit=unit,
                              better=better, panels=panels)


def distributions(result: GateResult, bundle_root: Path) -> tuple[list[Figure], list[str]]:
    """(figures, missing): per cell, the distribution of both arms, from the raw samples;
    for format 2 the per-pass speeds on the gate's metric first."""
    got = read_samples(result, bundle_root)
    found: list[DistributionFigure | None] = []
    if got.speeds and got.metric is not None:
        m = METRICS[got.metric]
        what = m.label if m.better == "higher" else f"1 / median {m.name.upper()}"
        unit = m.unit if m.better == "higher" else "1/s"
        left = f"; {got.discarded} discarded round(s) left out" if got.discarded else ""
        found.append(_figure(result, got, "", got.speeds, f"speed per sample (an arm's "
                             f"passes of a round, as its schedule takes them; {what}, what "
                             f"the gate pairs{left})", unit,
                             "higher"))
    order = sorted(got.values, key=lambda n: n != got.metric)
    for name in order:
        m = METRICS[name]
        found.append(_figure(result, got, name, got.values[name], f"{m.label} per {m.per}",
                             m.unit, m.better))
    return [f for f in found if f is not None], got.missing
