"""`rowgate compare A B`: what changed between two bundles of one row (before, after).

Both bundles are verified first. They must be comparable: the same row, the same
device (the GPUs a bundle's provenance names, or the host's CPU where there are
none) and, for every gate measured in both, the same workload digest and the same
baseline arm (`meta.json`). Anything else is refused: a difference between two
machines, two workloads or two controls is not a change of the subject.

Per gate: its status in A and in B. Per throughput cell, metric and arm: the change
from A to B computed from the sealed raw samples (`report.raw_throughput.read_samples`,
format 2 or 1, either side) with the unpaired statistics of `rowgate.stats.unpaired`:
bootstrap CI of the ratio of medians, Mann-Whitney, against the row's `min_effect`.
Unpaired, because A and B are two independent runs: pass *i* of A and pass *i* of B
share nothing (the gate itself pairs its two arms within a round; nothing pairs two
bundles). The unit is the gate's timed sample (an arm's k passes of a round): on the
gate's own metric it is the sample the gate paired (`latency.sample_speed` under the
sealed schedule: an interleaved round is the mean of its passes' speeds), as ms or
tok/s; on the other metrics the median of the round's values pooled. Requests of one
sample share its batch, clocks and host state, so treating them as
independent would understate the variance (Kalibera & Jones, ISMM 2013). Changes are
said as asv / pyperf do: `1.31× faster [1.27, 1.35]`, `no significant change`, with
the power of the comparison: the smallest slowdown it would have found (80 % power).

The baseline arm is the control: it ran the same pinned engine in both bundles, so
when it moved significantly in a cell, that cell's candidate change is confounded
(the machine or its load differed) and counts as inconclusive.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rowgate.errors import UsageError
from rowgate.records.canonical import strict_loads
from rowgate.records.gate_result import GateResult
from rowgate.records.status import Status
from rowgate.report.assemble import find_row
from rowgate.report.raw_throughput import METRICS, Samples, read_samples
from rowgate.seal.bundle import Bundle
from rowgate.seal.signing import Verifier

ALPHA = 0.05
DEFAULT_MIN_EFFECT = 0.02
"""Below this relative change a difference is negligible, when the row gives no
`min_effect` for the gate (the throughput gate's own default)."""
BOOTSTRAP = 10000
SEED = 20240917
"""The bootstrap's seed: the same two bundles give the same CI every time."""
WORSE = {Status.PASS: {Status.FAIL, Status.ERROR, Status.PENDING},
         Status.PENDING: {Status.FAIL, Status.ERROR}}
"""Status moves from A to B that are a regression."""


@dataclass(frozen=True)
class Side:
    bundle_id: str
    path: str
    commit: str
    created: str
    status: str
    signer: str


@dataclass(frozen=True)
class GateChange:
    gate: str
    kind: str
    status_a: str
    status_b: str

    @property
    def regressed(self) -> bool:
        return Status(self.status_b) in WORSE.get(Status(self.status_a), set())


@dataclass(frozen=True)
class Change:
    """One metric of one arm in one cell, A -> B."""

    gate: str
    cell: str
    metric: str
    arm: str
    unit: str
    better: str
    n_a: int
    n_b: int
    median_a: float
    median_b: float
    speedup: float
    """> 1: B is better (faster, or more tok/s) by this factor; < 1: worse."""
    ci_low: float
    ci_high: float
    p_value: float
    detectable: float
    """The smallest slowdown (fraction) this comparison would have found, with 80 % power
    at the spread seen (`rowgate.stats.unpaired.detectable`)."""
    decides: bool
    """Whether this is the metric B's gate decides on (format 2)."""
    outcome: str
    """`faster`, `slower`, `no significant change`, `inconclusive` (no significant change,
    but the CI is too wide to rule out one of the row's minimum effect) or `confounded`
    (the baseline arm moved as well)."""
    min_effect: float

    def says(self) -> str:
        ci = f"[{self.ci_low:.3g}, {self.ci_high:.3g}]"
        power = f"would find a slowdown of {self.detectable:.1%}"
        if self.outcome == "faster":
            return f"{self.speedup:.3g}× faster {ci}"
        if self.outcome == "slower":
            return f"{1 / self.speedup:.3g}× slower [{1 / self.ci_high:.3g}, {1 / self.ci_low:.3g}]"
        if self.outcome == "confounded":
            return f"confounded: the baseline arm moved too ({self.speedup:.3g}× {ci})"
        if self.outcome == "inconclusive":
            return (f"no significant change, but {ci} does not rule out ±{self.min_effect:.0%} "
                    f"({self.speedup:.3g}×, p={self.p_value:.2g}; {power} only): more passes "
                    f"needed")
        return (f"no significant change ({self.speedup:.3g}× {ci}, p={self.p_value:.2g}; "
                f"{power})")


@dataclass(frozen=True)
class Comparison:
    row_id: str
    a: Side
    b: Side
    gates: tuple[GateChange, ...]
    changes: tuple[Change, ...]
    notes: tuple[str, ...] = ()

    @property
    def outcome(self) -> str:
        """`regression` (a required slowdown or a gate gone worse), `inconclusive`
        (nothing worse, but something could not be told apart), `no regression`."""
        candidate = {c.outcome for c in self.changes if c.arm == "candidate"}
        if any(g.regressed for g in self.gates) or "slower" in candidate:
            return "regression"
        if candidate & {"confounded", "inconclusive"}:
            return "inconclusive"
        return "no regression"

    def doc(self) -> dict[str, Any]:
        return {"row": self.row_id, "a": asdict(self.a), "b": asdict(self.b),
                "outcome": self.outcome,
                "gates": [{**asdict(g), "regressed": g.regressed} for g in self.gates],
                "changes": [{**asdict(c), "says": c.says()} for c in self.changes],
                "notes": list(self.notes)}


def _side(bundle: Bundle) -> Side:
    m = bundle.manifest
    return Side(bundle_id=bundle.id, path=str(bundle.path), commit=m.subject.commit,
                created=m.created, status=m.status.value, signer=str(m.signer))


def device_of(bundle: Bundle) -> str:
    """The device a bundle measured on: its GPUs, or the host CPU where it has none."""
    p = bundle.manifest.provenance
    if p.gpus:
        return ", ".join(f"{g.name} ({g.arch})" for g in p.gpus)
    return f"{p.host.cpu}, {p.host.cores} cores (no GPU)"


def _meta(bundle: Bundle, gate: str) -> dict[str, Any] | None:
    path = bundle.path / "artifacts" / gate / "meta.json"
    if not path.is_file():
        return None
    doc = strict_loads(path.read_bytes(), f"artifacts/{gate}/meta.json")
    return doc if isinstance(doc, dict) else None


def _workloads(meta: dict[str, Any]) -> set[str]:
    """Every workload digest the gate's meta.json records."""
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "workload_digest" and isinstance(v, str):
                    found.add(v)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(meta)
    return found


def _baseline_arm(meta: dict[str, Any]) -> str:
    """The row's arm the gate measured the candidate against (format 1: the oracle)."""
    arm = meta.get("baseline_arm", meta.get("baseline"))  # format 1: "baseline" names it
    return arm if isinstance(arm, str) else "oracle"


def check_comparable(a: Bundle, b: Bundle) -> None:
    """Raise UsageError (exit 2) for two bundles whose difference would not be a change."""
    ma, mb = a.manifest, b.manifest
    if ma.row.id != mb.row.id:
        raise UsageError(f"compare: bundles of different rows ({ma.row.id}, {mb.row.id})")
    if device_of(a) != device_of(b):
        raise UsageError(f"compare: measured on different devices: A {device_of(a)}; "
                         f"B {device_of(b)}")
    kinds = {s.gate_id: s.kind for s in mb.gates}
    for g in sorted({s.gate_id for s in ma.gates} & set(kinds)):
        meta_a, meta_b = _meta(a, g), _meta(b, g)
        if meta_a is None or meta_b is None:
            continue
        wa, wb = _workloads(meta_a), _workloads(meta_b)
        if wa and wb and wa != wb:
            raise UsageError(f"compare: gate {g} ran different workloads: A "
                             f"{', '.join(sorted(wa))}; B {', '.join(sorted(wb))}")
        ba, bb = _baseline_arm(meta_a), _baseline_arm(meta_b)
        if kinds[g] == "throughput" and ba != bb:
            raise UsageError(f"compare: gate {g} measured against different baseline arms: "
                             f"A {ba}; B {bb} (the baseline is the control of the change)")


def _per_pass(pairs: list[tuple[int, float]]) -> list[float]:
    """One value per timed sample (an arm's passes of a round): the median of its
    values pooled (requests, gaps)."""
    by_pass: dict[int, list[float]] = {}
    for n, v in pairs:
        by_pass.setdefault(n, []).append(v)
    return [statistics.median(vs) for _, vs in sorted(by_pass.items())]


def _per_sample(s: Samples, name: str, cell: str, arm: str) -> list[float]:
    """One value per timed sample. On the gate's own metric (format 2) it is the gate's
    sample itself, `latency.sample_speed` under the sealed schedule (an interleaved
    round: the mean of its passes' speeds), as ms (1 / the speed) or tok/s: so compare
    and the gate judge the same numbers. Other metrics: `_per_pass`."""
    speeds = s.speeds.get(cell, {}).get(arm) if name == s.metric else None
    if not speeds:
        return _per_pass(s.values[name][cell][arm])
    return [v if name == "tok_s" else 1e3 / v for _, v in speeds]


def _min_effect(bundle: Bundle, gate: str) -> float:
    row, _ = find_row(bundle)
    value = getattr(row.gate(gate), "min_effect", None) if row is not None else None
    return float(value) if value else DEFAULT_MIN_EFFECT


def _change(gate: str, cell: str, name: str, arm: str, a: list[float], b: list[float],
            min_effect: float, decides: bool) -> Change:
    from rowgate.stats import unpaired

    m = METRICS[name]
    # ratio B / A of medians, with its CI: B is the later run
    u = unpaired.compare(b, a, n_resamples=BOOTSTRAP, seed=SEED, names=("B", "A"))
    d = unpaired.decide(u, min_effect=min_effect, alpha=ALPHA,
                        higher_is_better=m.better == "higher")
    return Change(gate=gate, cell=cell, metric=name, arm=arm, unit=m.unit, better=m.better,
                  n_a=len(a), n_b=len(b), median_a=u.median_y, median_b=u.median_x,
                  speedup=d.speedup, ci_low=d.low, ci_high=d.high, p_value=u.p_value,
                  detectable=d.detectable, decides=decides, outcome=d.change.value,
                  min_effect=min_effect)


def _cell_changes(gate: str, cell: str, name: str, sa: Samples, sb: Samples,
                  min_effect: float, notes: list[str]) -> list[Change]:
    """The candidate's and the baseline's change in one cell and metric; the candidate's
    confounded when the baseline moved."""
    got: dict[int, Change] = {}
    for i in (1, 0):  # candidate, then baseline: arms as each bundle names them
        va, vb = (_per_sample(s, name, cell, s.arms[i]) for s in (sa, sb))
        if va and vb:
            got[i] = _change(gate, cell, name, sb.arms[i], va, vb, min_effect,
                             name == sb.metric)
    base, cand = got.get(0), got.get(1)
    if base is not None and cand is not None and base.outcome in ("faster", "slower"):
        notes.append(f"{gate} {cell} {name}: the baseline arm moved ({base.says()}): "
                     f"the candidate's change there is confounded")
        got[1] = _replace(cand, outcome="confounded")
    return [got[i] for i in (1, 0) if i in got]


def _sample_changes(gate: str, ra: GateResult, a: Bundle, rb: GateResult, b: Bundle,
                    notes: list[str]) -> list[Change]:
    sa, sb = read_samples(ra, a.path), read_samples(rb, b.path)
    notes += [f"A: {m}" for m in sa.missing] + [f"B: {m}" for m in sb.missing]
    if sa.format != sb.format:
        notes.append(f"{gate}: A is a format-{sa.format} bundle, B format-{sb.format}: the "
                     f"passes of both are compared all the same (the same metrics per pass)")
    min_effect = _min_effect(b, gate)
    out: list[Change] = []
    names = sorted((n for n in METRICS if n in sa.values and n in sb.values),
                   key=lambda n: n != sb.metric)  # the gate's own metric first
    cells = list(dict.fromkeys(c for n in names for c in sa.values[n] if c in sb.values[n]))
    for cell in cells:
        for name in [n for n in names if cell in sa.values[n] and cell in sb.values[n]]:
            out += _cell_changes(gate, cell, name, sa, sb, min_effect, notes)
    return out


def _replace(c: Change, **kw: Any) -> Change:
    return Change(**{**asdict(c), **kw})


def compare(path_a: Path, path_b: Path, verifier_a: Verifier, verifier_b: Verifier) -> Comparison:
    """Verify both, refuse what is not comparable, and say what changed A -> B."""
    a, b = Bundle.open(path_a), Bundle.open(path_b)
    a.verify(verifier_a)  # VerificationError (exit 1) names the first problem
    b.verify(verifier_b)
    check_comparable(a, b)
    ra, rb = {r.gate_id: r for r in a.results()}, {r.gate_id: r for r in b.results()}
    gates = tuple(GateChange(g, rb[g].kind, ra[g].status.value, rb[g].status.value)
                  for g in rb if g in ra)
    notes: list[str] = [f"gate {g} is only in {'A' if g in ra else 'B'}"
                        for g in sorted(set(ra) ^ set(rb))]
    changes: list[Change] = []
    for g in (g for g in rb if g in ra and rb[g].kind == "throughput"):
        changes += _sample_changes(g, ra[g], a, rb[g], b, notes)
    return Comparison(row_id=a.manifest.row.id, a=_side(a), b=_side(b), gates=gates,
                      changes=tuple(changes), notes=tuple(notes))
