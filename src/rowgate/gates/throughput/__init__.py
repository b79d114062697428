"""Throughput gate: candidate vs baseline per workload cell, decided by a sequential
paired design with known power.

measure starts both arms once. Per cell (`_timed`): warm-up rounds until both arms'
speeds settle, then rounds whose arm order alternates, each of k passes per arm run in
A B, B A pairs (`schedule`; k fixed from the warm-up so that an arm's sample lasts
`min_sample_s`), SM and memory
clocks before and after every pass, a look at the repeated confidence interval every
`min_rounds` valid rounds, a stop at the first verdict or at the budget (rounds,
seconds, discarded rounds). Every pass is sealed raw: per request its TTFT, every
inter-token gap, its latency, a digest of its tokens (`_tp_artifacts` documents the
files).

derive re-takes every decision from those records (`_ab`): the warm-up, the discarded
rounds, the looks and the stop must be the plan's, or the gate is an ERROR. The
statistics are `rowgate.stats.paired` (docs/gates.md says which, and why); the verdict per
cell is better / worse / equivalent / underpowered; vLLM-bench metrics per arm come from
`rowgate.stats.latency`. The timed passes' tokens must be those of the tokens gate's pass of
the same requests (MLPerf TEST06's matched window): otherwise the comparison is refused.

Bundles sealed before this design (no `format` in meta.json) re-derive with the
statistics they were sealed under (`_throughput_v1`).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, model_validator

import rowgate.gates.arms as _arms
import rowgate.gates.throughput.artifacts as art
import rowgate.gates.throughput.compat_v1 as _throughput_v1
import rowgate.gates.throughput.measure as _timed
from rowgate.gates.artifacts import read_json
from rowgate.gates.interface import Derived, Gate, GateContext, GateError, gate_arch
from rowgate.records.status import Status
from rowgate.rows.options import ENGINE_KEYS
from rowgate.rows.spec import Arm, GateSpec
from rowgate.rows.workload import WorkloadMismatch, check_same_workload, workload_digest
from rowgate.seal import device

if TYPE_CHECKING:
    from rowgate.engines.divergence import Out
    from rowgate.engines.interface import Engine, WorkloadPass
    from rowgate.rows.row import Row

ROLES = _timed.ROLES
TOKENS_FILES = {"candidate": "candidate.jsonl", "oracle": "oracle.jsonl"}
"""The tokens gate's outputs per arm (its artifacts beside this gate's)."""


class ThroughputGate(GateSpec):
    kind: Literal["throughput"]
    metric: Literal["itl", "tpot", "ttft", "e2el", "output_throughput"] = "itl"
    """What a pass's speed is: 1 / the pass's median of a latency (`itl`: every
    inter-token gap, the decode step as the client sees it), or output tok/s."""
    min_effect: Annotated[float, Field(gt=0, lt=1)] = 0.02
    """Smallest relative difference that matters: equivalence is a CI inside
    ±min_effect; worse / better need it clear of ±min_effect/2."""
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.05
    """Total two-sided error rate, spent over the looks (Lan-DeMets)."""
    spending: Literal["pocock", "obrien-fleming"] = "pocock"
    claim_rule: Literal["narrow", "narrow-or-clear"] = "narrow-or-clear"
    """How precise a better / worse claim's CI must be: `narrow`, no wider than the
    equivalence band; `narrow-or-clear`, that or wholly beyond the band at any width
    (`rowgate.stats.paired`, docs/gates.md). Bundles sealed before the field re-derive under
    `narrow`, the rule they stopped by."""
    min_rounds: Annotated[int, Field(ge=3)] = 8
    """Valid rounds before the first look, and between looks."""
    max_rounds: Annotated[int, Field(ge=3)] = 40
    """The round budget: underpowered when no verdict by then."""
    max_seconds: Annotated[float, Field(gt=0)] = 600.0
    """The time budget per cell, warm-up included: then one last look, and underpowered
    unless it decides."""
    underpowered_blocks: bool = True
    """Whether an underpowered cell fails the gate (else PASS, said in the reason)."""
    warmup: Annotated[int, Field(ge=0)] = 1
    """Fewest warm-up rounds; more run until both arms' speeds settle (0: none at all)."""
    max_warmup: Annotated[int, Field(ge=1)] = 6
    warmup_tolerance: Annotated[float, Field(gt=0)] = 0.05
    """Settled: no arm's last warm-up speed more than this fraction above the one before
    (`warmup_until = "no-gain"`), or each arm's last two within it (`"agree"`)."""
    warmup_until: Literal["no-gain", "agree"] = "no-gain"
    """When the warm-up ends: once no arm is still getting faster (warming makes early
    passes slower, never faster), or once the last two speeds agree (stricter: on a noisy
    host it often runs to `max_warmup`)."""
    warmup_carry: bool = True
    """A cell's warm-up starts from both engines' latest pass of the cell's requests in an
    earlier gate of the run (the tokens gate's), sealed as round 0 with that gate's name;
    false: every warm-up round is this gate's own."""
    min_sample_s: Annotated[float, Field(ge=0, le=10)] = 0.1
    """Sample length: after the warm-up each cell fixes k, the passes per arm per round,
    so that k passes last at least this long (pyperf's `--min-time`, 100 ms); how they
    make the arm's speed in the round: `schedule` (0: one pass)."""
    clock_tolerance: Annotated[float, Field(ge=0)] = 0.02
    """A round whose SM or memory clock samples spread more than this is discarded."""
    max_discarded: Annotated[int, Field(ge=0)] = 8
    """More discarded rounds than this end the cell (underpowered unless decided)."""
    order: Literal["alternating", "random"] = "alternating"
    """The arm order of each timed round (alternating: A first, then B first, …)."""
    schedule: Literal["interleaved", "blocked"] = "interleaved"
    """How an arm's k passes sit in a round: interleaved in pairs A B, B A, … (an arm's
    sample is the mean of its k passes' speeds) or blocked, k of one arm then k of the
    other (the sample: the metric over its k passes pooled). Interleaved is the default:
    on the H200's host it cut the per-round spread of a host-bound A/A from 4 % to
    1.5 % (docs/perf.md); blocked is how bundles before it were sealed."""
    slo_ttft_ms: Annotated[float, Field(gt=0)] | None = None
    """Goodput SLOs (vLLM's `--goodput ttft:… tpot:… e2el:…`, ms): with any set, each arm
    reports `request_goodput`."""
    slo_tpot_ms: Annotated[float, Field(gt=0)] | None = None
    slo_e2el_ms: Annotated[float, Field(gt=0)] | None = None
    cells: list[str] = []
    """Subset of the workload matrix; empty means every cell."""
    endpoint: bool = False
    """Drive the arms through their OpenAI endpoints (streamed TTFT/TPOT/ITL)."""
    baseline: str = "oracle"
    """The A side, any arm of the row by name (`_arms.resolve_arm`): `oracle`, a fallback's
    `name` (the SM70 row's `accepted` kernel), or a fallback's mode (e.g. `graph`: the
    persistent candidate against CUDA-graph replay on the same device). The artifacts
    call the A side `baseline`; meta.json names the arm."""
    repeats: Annotated[int, Field(ge=5)] = 9
    """Format-1 bundles only (sealed before the sequential design): repeats per arm."""
    bootstrap: Annotated[int, Field(ge=1000)] = 10000
    """Format-1 bundles only: bootstrap resamples of their CI."""

    @model_validator(mode="after")
    def _budgets(self) -> ThroughputGate:
        if self.min_rounds > self.max_rounds:
            raise ValueError(f"min_rounds {self.min_rounds} is above max_rounds "
                             f"{self.max_rounds}")
        if self.warmup > self.max_warmup:
            raise ValueError(f"warmup {self.warmup} is above max_warmup {self.max_warmup}")
        return self

    def slo_ms(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft", self.slo_ttft_ms), ("tpot", self.slo_tpot_ms),
                                  ("e2el", self.slo_e2el_ms)) if v is not None}


def _clock_sampler(row: Row, ctx: GateContext) -> _timed.ClockFn | None:
    """NVML clocks of the row's GPU around every pass; None without a GPU."""
    gpu = _arms.gpu_index(row, ctx)
    return None if gpu is None else (lambda: device.sample_clocks(gpu, time.time()))


def cell_seed(row: Row, spec: ThroughputGate, cell: str) -> int:
    """A stable seed per (row, gate, cell): same schedule on every run and machine."""
    h = hashlib.sha256(f"{row.id}/{spec.id}/{cell}".encode()).digest()
    return int.from_bytes(h[:8], "big")


def plan(row: Row, spec: ThroughputGate, cell: str) -> _timed.Plan:
    """What a cell's rounds follow: the row's spec, and the cell's schedule seed."""
    from rowgate.stats import paired as stats

    design = stats.Design(min_effect=spec.min_effect, alpha=spec.alpha,
                          min_rounds=spec.min_rounds, max_rounds=spec.max_rounds,
                          spending=spec.spending, claim_rule=spec.claim_rule)
    return _timed.Plan(design=design, metric=spec.metric, order=spec.order,
                       seed=cell_seed(row, spec, cell), warmup=spec.warmup,
                       max_warmup=spec.max_warmup, warmup_tolerance=spec.warmup_tolerance,
                       warmup_until=spec.warmup_until, warmup_carry=spec.warmup_carry,
                       clock_tolerance=spec.clock_tolerance, max_seconds=spec.max_seconds,
                       max_discarded=spec.max_discarded, min_sample_s=spec.min_sample_s,
                       schedule=spec.schedule)


ROUNDS = "rounds"


def _split_rounds(ctx: GateContext) -> None:
    """The rounds' wall time split by what passes.csv says each pass was: `warm-up` and
    `measurement` (the passes themselves), `rounds (between passes)` the rest (clock
    samples, request bookkeeping, the arms taking turns)."""
    spent = ctx.phase.seconds.pop(ROUNDS, 0.0)
    by_phase: dict[str, float] = {}
    for rec in art.read_csv(ctx.artifact_dir / art.PASSES):
        if rec.get("carried_from"):
            continue  # an earlier gate ran it, on its own clock
        by_phase[rec["phase"]] = by_phase.get(rec["phase"], 0.0) + float(rec["wall_s"])
    warm, timed = by_phase.get("warmup", 0.0), by_phase.get("timed", 0.0)
    ctx.phase.seconds.update({"warm-up": warm, "measurement": timed,
                              "rounds (between passes)": max(spent - warm - timed, 0.0)})


class Throughput(Gate[ThroughputGate]):
    kind = "throughput"
    drives_arms = True
    shares_engines = True
    spec_model = ThroughputGate
    needs_device = True
    workload_matrix = True
    arm_fields = ("baseline",)
    report_view = "throughput"
    options = (*ENGINE_KEYS, _arms.CANDIDATE_MODEL_OPTION)

    def estimate(self, row: Row, spec: ThroughputGate) -> list[str]:
        cells = len(spec.cells or row.cells()) or 1
        return [f"time: at most {cells} cell(s) x {spec.max_seconds:g} s budget = "
                f"{cells * spec.max_seconds:g} s of rounds (the budget per cell, warm-up "
                f"included)"]

    def requirements(self, row: Row, spec: ThroughputGate, ctx: GateContext) -> str | None:
        try:
            base = _arms.baseline_arm(row, spec.baseline)
        except GateError:  # measure raises it: a row naming a missing arm is an ERROR
            return None
        return _arms.arms_requirement(row, {"oracle": base, "candidate": row.arms.candidate})

    def arch(self, row: Row, spec: ThroughputGate, ctx: GateContext) -> tuple[str, bool]:
        return gate_arch(row, ctx.gpu)

    def pooled_arms(self, row: Row, spec: ThroughputGate) -> list[Arm]:
        return [_arms.baseline_arm(row, spec.baseline), row.arms.candidate]

    # ------------------------------------------------------------- measure

    def measure(self, row: Row, spec: ThroughputGate, ctx: GateContext) -> None:
        with ctx.phase("model"):  # every model of the row (its own arms), resolved or built
            runs = _arms.model_runs(row, spec.cells)
        base = _arms.baseline_arm(row, spec.baseline)
        endpoint = {"endpoint": "true"} if spec.endpoint else {}
        clocks = _clock_sampler(row, ctx)
        passes = [p for run in runs for p in run.passes]
        plans = {p.cell: plan(row, spec, p.cell) for p in passes}
        records: dict[str, dict[str, Any]] = {}
        engines_seen: dict[str, dict[str, str]] = {}
        with art.open_sink(ctx.artifact_dir, clocks is not None) as sink:
            for n, run in enumerate(runs):
                arms = {"baseline": (base, run.info),
                        "candidate": (row.arms.candidate, _arms.candidate_model(run.info, ctx))}
                with _arms.started(arms, row, ctx, endpoint) as engines:
                    later = sum(len(r.passes) for r in runs[n + 1:])
                    with ctx.phase(ROUNDS):
                        records.update(art.measure_cells(
                            engines, run.passes, plans, sink, ctx.progress, clocks,
                            time_left=ctx.time_left, later=later,
                            journal=ctx.engines.journal(ctx.gate_id) if ctx.engines else None))
                    for role in ROLES:
                        engines_seen.setdefault(role, engines[role].describe())
        _split_rounds(ctx)
        self._meta(spec, ctx, row, records, plans, passes, engines_seen, clocks is not None, {
            "model_digest": runs[0].info.digest,
            "models": {run.ref.id: run.info.digest for run in runs}})

    def measure_on(self, row: Row, spec: ThroughputGate, ctx: GateContext,
                   engines: dict[str, Engine], passes: list[WorkloadPass],
                   extra: dict[str, Any] | None = None) -> None:
        """The cells on started engines ({'baseline', 'candidate'}): what `measure` does
        once its arms are up (the calibration benchmark calls it on engines it keeps)."""
        clocks = _clock_sampler(row, ctx)
        plans = {p.cell: plan(row, spec, p.cell) for p in passes}
        with art.open_sink(ctx.artifact_dir, clocks is not None) as sink:
            records = art.measure_cells(engines, passes, plans, sink, ctx.progress, clocks)
        self._meta(spec, ctx, row, records, plans, passes,
                   {role: engines[role].describe() for role in ROLES}, clocks is not None, extra)

    def _meta(self, spec: ThroughputGate, ctx: GateContext, row: Row,
              records: dict[str, dict[str, Any]], plans: dict[str, _timed.Plan],
              passes: list[WorkloadPass], described: dict[str, dict[str, str]],
              clocked: bool, extra: dict[str, Any] | None) -> None:
        digest = workload_digest(passes)
        art.write_meta(ctx.artifact_dir, records, plans, clocked, {
            **(extra or {}), "baseline_arm": spec.baseline,
            "device": _arms.device_name(row, ctx),
            **{role: {"engine": described[role], "workload_digest": digest}
               for role in ROLES}})

    # -------------------------------------------------------------- derive

    def derive(self, row: Row, spec: ThroughputGate, artifact_dir: Path) -> Derived:
        meta = read_json(artifact_dir / art.META)
        if meta.get("format") != art.FORMAT:
            return _throughput_v1.derive(row, spec, artifact_dir)
        try:
            check_same_workload(meta["baseline"]["workload_digest"],
                                meta["candidate"]["workload_digest"])
        except WorkloadMismatch as exc:
            return Derived(Status.ERROR, str(exc))
        meta, passes, requests, clocks = art.read_raw(artifact_dir)
        earlier = {g.id for g in row.gates_before(spec.id)}
        strays = sorted({p["carried_from"] for p in passes if p.get("carried_from")} - earlier)
        if strays:
            return Derived(Status.ERROR, f"warm-up passes carried from {', '.join(strays)}: "
                                         f"no gate of the row that runs before {spec.id}")
        plans = {cell: plan(row, spec, cell) for cell in meta["cells"]}
        cells = art.derive_cells(plans, meta, passes, requests, clocks, spec.slo_ms(),
                                 row_budget=row.budget is not None)
        window = art.timed_window(requests, *_correctness(row, spec, artifact_dir))
        return art.gate_verdict(cells, meta["baseline_arm"], spec.underpowered_blocks, window,
                                spec.min_effect)


def _correctness(row: Row, spec: ThroughputGate, artifact_dir: Path
                 ) -> tuple[dict[str, dict[str, Out]], float, dict[str, str]]:
    """The tokens gate's outputs of each arm this gate timed (its artifacts beside this
    gate's in the bundle), its near-tie margin, and why any arm has none."""
    from rowgate.engines.divergence import Out

    tokens = next((g for g in row.gates if getattr(g, "kind", "") == "tokens"), None)
    if tokens is None:
        return {}, 0.0, {role: "the row has no tokens gate" for role in ROLES}
    files = {"candidate": TOKENS_FILES["candidate"]}
    why = {}
    if spec.baseline == "oracle":
        files["baseline"] = TOKENS_FILES["oracle"]
    else:
        why["baseline"] = (f"the {spec.baseline} arm has no pass in gate {tokens.id} (it runs "
                           f"the oracle and the candidate)")
    correct = {}
    # a tokens gate after this one had left nothing when this gate ran (Row.gates_before)
    ran_before = tokens.id in {g.id for g in row.gates_before(spec.id)}
    for role, name in files.items():
        path = artifact_dir.parent / tokens.id / name
        try:
            lines = path.read_text().splitlines() if ran_before else None
        except OSError:
            lines = None
        if lines is None:
            why[role] = f"gate {tokens.id} left no {name} in this bundle (it did not run here)"
            continue
        docs = [json.loads(line) for line in lines if line.strip()]
        correct[role] = {d["id"]: Out.from_json(d) for d in docs}
    return correct, float(getattr(tokens, "tie_margin", 0.0)), why
