"""Calibrate the throughput gate: A/A and planted-slowdown runs through the gate's own
code, reporting how often it is wrong and what it can detect.

    python benchmarks/calibrate_throughput.py sim  [--trials 200] [--out DIR]
    python benchmarks/calibrate_throughput.py cpu  [--runs 2] [--out DIR]      (smoke)
    python benchmarks/calibrate_throughput.py cuda [--runs 20] [--budget-s 520] [--phases KEY …] --out DIR

Every run is one throughput gate run: `Throughput.measure_on` (warm-up until stable,
interleaved rounds, clocks, looks, stop) on engines loaded once per process, then
`Throughput.derive` on the artifacts it wrote — the code a row's gate runs, minus
starting the engines. An A/A is the reference engine against itself: ONE loaded engine
object serves both arms (what "the reference engine graph vs itself" means: same
weights in memory, same CUDA graph, same allocator). A planted slowdown is a view on
that same object (`Planted`) whose calls alone stretch every token interval by a known
fraction f: after each token the engine spins for f times the work since its previous
token (a self-calibrating spin: drift in the machine scales the spin with it), so the
candidate's speed is exactly 1 / (1 + f) of the baseline's and no difference between
two loads confounds it. A short "two loads" A/A (two engine objects of the same model)
measures that instance difference separately and reports it as such (not in the bars).

Modes:
  sim   synthetic engines (implementing the Engine interface) on a virtual clock,
        with per-step noise, per-pass host noise, slow drift, stray slow steps and
        planted clock drops: many trials per noise scenario in seconds; the rates
        are the gate's operating characteristic under a known truth.
  cpu   the reference engine (eager, tiny model) on this machine's CPU: a smoke run
        of the real path (honest verdicts under the machine's own load).
  cuda  the H200 calibration: reference engine, CUDA graph, tiny and probe models,
        cells c1/c4/c8, in this order while --budget-s lasts (`CUDA_PHASES`; --phases
        picks some): A/A tiny, A/A probe, planted 5 % and 2 % tiny, planted 5 % and 2 %
        probe, two loads tiny (5 runs), planted 1 %; and today's 9-repeat schedule
        timed on the same c1 cell for comparison.

Reported: false-difference rate (A/A called better or worse, per cell), false-fail
rate (A/A runs not PASS), detection rate (planted runs whose cells are all called
worse), rounds and wall time per cell, and the minimum detectable effect as a
function of the round budget at the per-round spread the runs measured.
Everything lands in OUT/calibration.json (rewritten after every phase, so a run cut
short keeps what it measured); a table is printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from rowgate.engines.interface import Engine, PassResult, RequestOutput, WorkloadPass

REPO = Path(__file__).resolve().parents[1]

EFFECTS = (0.0, 0.05, 0.02, 0.01)
"""Planted slowdowns of the sim mode (A/A first); the engine modes run `CUDA_PHASES`."""


def log(*parts) -> None:
    print(*parts, flush=True)


# ------------------------------------------------------------------ synthetic


@dataclass
class Machine:
    """A virtual clock and what makes one machine's timings noisy."""

    rng: np.random.Generator
    step_noise: float = 0.03
    """Log-normal sd of one decode step."""
    pass_noise: float = 0.003
    """Log-normal sd of a whole pass (host state, frequency): what pairing cannot cancel."""
    drift: float = 0.01
    """Amplitude of a slow sinusoidal drift of the machine's speed."""
    drift_period_s: float = 60.0
    slope: float = 0.0
    """Linear drift of the machine's slowness per second (thermal creep, a growing heap)."""
    outlier_rate: float = 0.001
    """Probability that a step is hit by a stray pause (GC, scheduler)."""
    outlier_s: float = 0.002
    clock_drop_rate: float = 0.0
    """Probability that a pass runs at a dropped SM clock (slower, and seen by NVML)."""
    slow_state: float = 0.0
    """A two-state host (measured on the H200's, benchmarks/host_noise.py): in its slow
    state every pass takes this fraction longer, unseen by any counter the guest has."""
    enter_slow: float = 0.0
    """Per pass, the probability that a fast host turns slow (H200: ~0.03)."""
    leave_slow: float = 1.0
    """Per pass, the probability that a slow host turns fast (H200: ~0.1: slow stretches
    of ~9 passes on average, up to seconds)."""
    t: float = 0.0
    _dropped: bool = False
    _slow: bool = False

    def now(self) -> float:
        return self.t

    def factor(self) -> float:
        return (1 + self.drift * math.sin(2 * math.pi * self.t / self.drift_period_s)
                + self.slope * self.t)

    def start_pass(self) -> float:
        self._dropped = bool(self.rng.random() < self.clock_drop_rate)
        if self.slow_state:
            self._slow = bool(self.rng.random() < (1 - self.leave_slow if self._slow
                                                   else self.enter_slow))
        f = math.exp(self.rng.normal(0, self.pass_noise)) * (1 + self.slow_state * self._slow)
        return f * (1980 / 1500 if self._dropped else 1.0)

    def clock(self):
        from rowgate.seal.device import ClockSample

        return ClockSample(t=self.t, sm_clock_mhz=1500 if self._dropped else 1980,
                           mem_clock_mhz=3201, temperature_c=40)


class SyntheticEngine(Engine):
    """Decodes in lockstep waves of `concurrency` requests on a `Machine`'s clock."""

    name = "synthetic"

    def __init__(self, machine: Machine, step_s: float, prefill_s: float = 0.0,
                 slowdown: float = 0.0):
        self.machine, self.step_s, self.prefill_s = machine, step_s, prefill_s
        self.slowdown = slowdown

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def describe(self) -> dict[str, str]:
        return {"engine": self.name, "step_s": repr(self.step_s),
                "slowdown": repr(self.slowdown)}

    def _steps(self, n: int, host: float) -> np.ndarray:
        m = self.machine
        dt = self.step_s * host * np.exp(m.rng.normal(0, m.step_noise, n))
        dt += m.outlier_s * (m.rng.random(n) < m.outlier_rate)
        return dt * (1 + self.slowdown) * m.factor()

    def generate(self, work: WorkloadPass) -> PassResult:
        m, start = self.machine, self.machine.t
        host = m.start_pass()
        outputs = []
        reqs = list(work.requests)
        for i in range(0, len(reqs), work.concurrency):
            wave, admitted = reqs[i:i + work.concurrency], m.t
            first = []
            for _ in wave:
                m.t += self.prefill_s * host * (1 + self.slowdown)
                first.append(m.t)
            steps = self._steps(max(r.max_tokens for r in wave) - 1, host)
            times = m.t + np.concatenate([[0.0], np.cumsum(steps)])
            m.t = float(times[-1])
            for r, f in zip(wave, first):
                ts = [f] + [float(x) for x in times[1:r.max_tokens]]
                outputs.append(RequestOutput(
                    id=r.id, token_ids=tuple((zlib.crc32(r.id.encode()) + j) % 997 for j in range(len(ts))),
                    logprobs=(0.0,) * len(ts), ttft_s=f - admitted, latency_s=ts[-1] - admitted,
                    itl_s=tuple(b - a for a, b in zip(ts, ts[1:]))))
        return PassResult(outputs=tuple(outputs), wall_s=m.t - start)


@dataclass(frozen=True)
class Scenario:
    """A noise regime for the synthetic engines."""

    name: str
    step_s: float
    step_noise: float
    pass_noise: float
    drift: float
    outlier_rate: float
    outlier_s: float
    clock_drop_rate: float = 0.0
    bias: float = 0.0
    """A systematic A/A difference between the two instances (two engine objects)."""
    slow_state: float = 0.0
    enter_slow: float = 0.0
    leave_slow: float = 1.0


SCENARIOS = (
    Scenario("graph-quiet", 0.0006, 0.03, 0.002, 0.01, 0.001, 0.002),
    Scenario("graph-host-noise", 0.0006, 0.05, 0.006, 0.02, 0.002, 0.003, 0.02, 0.002),
    Scenario("noisy", 0.004, 0.10, 0.015, 0.03, 0.01, 0.02, 0.05),
    Scenario("cpu-loaded", 0.003, 0.25, 0.04, 0.05, 0.02, 0.03),
    Scenario("host-states", 0.0006, 0.05, 0.006, 0.02, 0.002, 0.003, 0.0, 0.0,
             slow_state=0.25, enter_slow=0.03, leave_slow=0.1),
)
"""`host-states` is the H200 host as benchmarks/host_noise.py measured it: passes 25 %
slower in stretches (22 % of the passes, ~9 passes long on average, up to seconds)."""


RUN_KEYS = ("verdict", "ratio", "ratio_ci_low", "ratio_ci_high", "rounds", "rounds_discarded",
            "warmup_rounds", "passes_per_sample", "sd_log_ratio", "elapsed_s", "stop")
"""Per cell of every run, kept in calibration.json (raw artifacts only for a few runs)."""


@dataclass
class Tally:
    """Counts over runs of one (scenario or model, effect)."""

    runs: int = 0
    passed: int = 0
    cells: dict[str, int] = field(default_factory=dict)
    all_worse: int = 0
    rounds: list[int] = field(default_factory=list)
    elapsed: list[float] = field(default_factory=list)
    sd: list[float] = field(default_factory=list)
    per_run: list[dict] = field(default_factory=list)

    def add(self, status: str, cells: dict[str, dict]) -> None:
        self.per_run.append({"status": status, "cells": {c: {k: m.get(k) for k in RUN_KEYS}
                                                         for c, m in cells.items()}})
        self.runs += 1
        self.passed += status == "PASS"
        verdicts = [c["verdict"] for c in cells.values()]
        for v in verdicts:
            self.cells[v] = self.cells.get(v, 0) + 1
        self.all_worse += all(v == "worse" for v in verdicts)
        self.rounds += [int(c["rounds"]) for c in cells.values()]
        self.elapsed += [float(c["elapsed_s"]) for c in cells.values()]
        self.sd += [float(c["sd_log_ratio"]) for c in cells.values()
                    if c.get("sd_log_ratio") is not None]

    def summary(self, effect: float) -> dict:
        n = sum(self.cells.values()) or 1
        out = {"runs": self.runs, "cells": self.cells, "per_run": self.per_run,
               "rounds_mean": round(float(np.mean(self.rounds)), 2) if self.rounds else None,
               "cell_s_mean": round(float(np.mean(self.elapsed)), 3) if self.elapsed else None,
               "sd_log_ratio_median": round(float(np.median(self.sd)), 6) if self.sd else None}
        if effect == 0:
            out["false_difference_rate"] = round(
                (self.cells.get("better", 0) + self.cells.get("worse", 0)) / n, 4)
            out["false_fail_rate"] = round(1 - self.passed / max(self.runs, 1), 4)
        else:  # a planted slowdown must be called worse, a planted speed-up (< 0) better
            found = "worse" if effect > 0 else "better"
            out["detection_rate"] = round(self.cells.get(found, 0) / n, 4)
            out["wrong_direction_rate"] = round(
                self.cells.get("better" if effect > 0 else "worse", 0) / n, 4)
            out["runs_all_cells_worse"] = self.all_worse
        return out


# ----------------------------------------------------------------- the gate run


class _Quiet:
    def update(self, message: str) -> None:
        pass

    def advance(self, total: int | None = None) -> None:
        pass

    def task(self, label: str, total: int | None = None):
        import contextlib

        return contextlib.nullcontext(self)


def synthetic_passes(concurrency=(1, 4, 8), output_len: int = 32, input_len: int = 16,
                     waves: int = 1) -> list[WorkloadPass]:
    from rowgate.engines.interface import Request

    return [WorkloadPass(cell=f"i{input_len}-c{c}", concurrency=c, requests=tuple(
        Request(id=f"i{input_len}-c{c}-r{r}", cell=f"i{input_len}-c{c}",
                prompt_ids=(1,) * input_len, max_tokens=output_len, seed=0)
        for r in range(c * waves))) for c in concurrency]


def gate_run(engines: dict[str, Engine], passes: list[WorkloadPass], plans: dict, out: Path,
             clocks=None, now=time.monotonic) -> tuple[str, dict[str, dict]]:
    """One throughput gate run on started engines: measure the cells, derive the verdict."""
    from rowgate.gates.throughput import artifacts as art

    out.mkdir(parents=True, exist_ok=True)
    with art.open_sink(out, clocks is not None) as sink:
        records = art.measure_cells(engines, passes, plans, sink, _Quiet(), clocks, now=now)
    art.write_meta(out, records, plans, clocks is not None)
    meta, rows, requests, clock_rows = art.read_raw(out)
    cells = art.derive_cells(plans, meta, rows, requests, clock_rows)
    derived = art.gate_verdict(cells, "baseline", True, None)
    return derived.status.value, cells


def default_plans(passes: list[WorkloadPass], **overrides) -> dict:
    from rowgate.gates.throughput.measure import Plan
    from rowgate.stats import paired as stats

    design = stats.Design(**{"min_effect": 0.02, **{
        k: overrides.pop(k) for k in list(overrides)
        if k in ("min_effect", "alpha", "min_rounds", "max_rounds", "spending", "claim_rule")}})
    return {p.cell: Plan(design=design, metric=overrides.get("metric", "itl"),
                         seed=i, **{k: v for k, v in overrides.items() if k != "metric"})
            for i, p in enumerate(passes)}


def _sim_seed(seed: int, trial: int, effect: float) -> list[int]:
    """A trial's seed (entries must be >= 0: a speed-up's gets one more entry, so the
    seeds of the slowdowns and A/A are those of every earlier sim run)."""
    key = [seed, trial, int(abs(effect) * 1e4)]
    return key + [1] if effect < 0 else key


def sim(trials: int, seed: int, scratch: Path, scenarios=SCENARIOS,
        schedule: str = "interleaved", effects: tuple[float, ...] = EFFECTS,
        claim_rule: str | None = None) -> dict:
    """Every scenario x effect: `trials` synthetic gate runs over cells c1/c4/c8 (an
    effect < 0 is a planted speed-up: the candidate's steps take 1 + effect as long)."""
    import shutil

    passes = synthetic_passes()
    rule = {"claim_rule": claim_rule} if claim_rule else {}
    plans = default_plans(passes, schedule=schedule, **rule)
    results: dict = {}
    for sc in scenarios:
        for effect in effects:
            tally = Tally()
            for i in range(trials):
                m = Machine(np.random.default_rng(_sim_seed(seed, i, effect)), sc.step_noise,
                            sc.pass_noise, sc.drift, outlier_rate=sc.outlier_rate,
                            outlier_s=sc.outlier_s, clock_drop_rate=sc.clock_drop_rate,
                            slow_state=sc.slow_state, enter_slow=sc.enter_slow,
                            leave_slow=sc.leave_slow)
                engines = {"baseline": SyntheticEngine(m, sc.step_s, sc.step_s * 4),
                           "candidate": SyntheticEngine(m, sc.step_s * (1 + sc.bias),
                                                        sc.step_s * 4, slowdown=effect)}
                out = scratch / f"{sc.name}-{effect}-{i}"
                status, cells = gate_run(engines, passes, plans, out,
                                         clocks=m.clock if sc.clock_drop_rate else None,
                                         now=m.now)
                tally.add(status, cells)
                shutil.rmtree(out)
            results[f"{sc.name}/{effect:g}"] = tally.summary(effect)
            log(f"{sc.name:18} effect {effect:5.0%}: " + json.dumps(
                {k: v for k, v in results[f"{sc.name}/{effect:g}"].items() if k != "per_run"}))
    return results


# ------------------------------------------------------------- real engines


def slowed_engine_class():
    """The reference engine with a planted slowdown (imported lazily: torch)."""
    from rowgate.engines.reference import ReferenceEngine

    class Slowed(ReferenceEngine):
        """After every token, spin for `slowdown` x the work since the previous token
        (its timestamp is taken before the spin), so every interval is stretched by
        exactly that fraction of the engine's own time, prefill included."""

        slowdown = 0.0
        _mark = 0.0

        def generate(self, work):
            self._mark = time.perf_counter()
            return super().generate(work)

        def _append(self, seqs, logits, work) -> None:
            super()._append(seqs, logits, work)
            if self.slowdown:
                now = time.perf_counter()
                end = now + self.slowdown * (now - self._mark)
                while time.perf_counter() < end:
                    pass
            self._mark = time.perf_counter()

    return Slowed


@dataclass(frozen=True)
class Model:
    name: str
    """A name of rowgate_lab.megakernel.models.NAMED."""
    dtype: str
    input_len: int
    output_len: int


CUDA_MODELS = (Model("tiny-qwen3", "float32", 16, 32),
               Model("probe-qwen3-h2048-l16", "bfloat16", 128, 16))
CPU_MODELS = (Model("tiny-qwen3", "float32", 16, 8),)
CPU_PLAN = {"min_effect": 0.05, "min_rounds": 8, "max_rounds": 8, "max_seconds": 30.0,
            "max_warmup": 3}
"""The smoke's gate keys (the CPU is shared; verdicts are honest, often underpowered).
The cuda mode uses the gate's defaults: none set here."""


ROW = """id = "CALIBRATE-{tag}"
title = "throughput gate calibration ({name})"
kind = "demo"
[target]
arch = "{arch}"
[[models]]
id = "m"
name = "{name}"
[arms.oracle]
engine = "reference"
version = "rowgate"
mode = "{mode}"
dtype = "{dtype}"
[arms.candidate]
engine = "reference"
mode = "{mode}"
dtype = "{dtype}"
[workload]
input_lens = [{input_len}]
concurrency = [1]
output_len = {output_len}
[[gates]]
id = "throughput"
kind = "throughput"
{keys}
"""


class Planted(Engine):
    """The candidate arm of an A/A or planted run: a view on the baseline's own engine
    object (one load, one CUDA graph, one allocator), that spins `slowdown` x the work
    per token during its own calls only. The two arms then differ by exactly the
    planted fraction; no difference between two loads of the model can confound it."""

    name = "planted"

    def __init__(self, base, slowdown: float = 0.0):
        self.base, self.slowdown = base, slowdown

    def start(self) -> None:
        pass  # the baseline's object, started once

    def stop(self) -> None:
        pass

    def describe(self) -> dict[str, str]:
        return {**self.base.describe(), "planted_slowdown": repr(self.slowdown),
                "same_object_as_baseline": "true"}

    def generate(self, work: WorkloadPass) -> PassResult:
        self.base.slowdown = self.slowdown
        try:
            return self.base.generate(work)
        finally:
            self.base.slowdown = 0.0


@dataclass
class Loaded:
    """One model's calibration row, its engine (loaded once) serving both arms, its
    cells."""

    model: Model
    row: object
    spec: object
    base: object
    passes: list
    ctx: object
    second: object = None
    """A second load of the model, for the two-loads A/A only."""

    def engines(self, effect: float, two_loads: bool = False) -> dict:
        """A/A (effect 0) and planted runs: the reference engine against itself, the
        candidate a `Planted` view on the same object; `two_loads`: the candidate is
        another load of the same model (what the instance difference costs)."""
        if two_loads:
            return {"baseline": self.base, "candidate": self.second}
        return {"baseline": self.base, "candidate": Planted(self.base, effect)}

    def run(self, out: Path, engines: dict) -> tuple[str, dict[str, dict]]:
        """One throughput gate run: the gate's measure (on these engines) and derive."""
        from rowgate.gates.throughput import Throughput

        out.mkdir(parents=True)
        self.ctx.artifact_dir = out
        gate = Throughput()
        gate.measure_on(self.row, self.spec, self.ctx, engines, self.passes)
        derived = gate.derive(self.row, self.spec, out)
        return derived.status.value, derived.cells


@dataclass(frozen=True)
class Phase:
    """`runs` gate runs of one model at one planted effect (0: A/A)."""

    model: str
    effect: float
    runs: int = 20
    two_loads: bool = False
    """A/A of two separately loaded engines: reported, not counted in the bars."""

    @property
    def key(self) -> str:
        return f"{self.model}/{self.effect:g}" + ("/two-loads" if self.two_loads else "")


TINY, PROBE = "tiny-qwen3", "probe-qwen3-h2048-l16"
CUDA_PHASES = (Phase(TINY, 0.0), Phase(PROBE, 0.0), Phase(TINY, 0.05), Phase(TINY, 0.02),
               Phase(PROBE, 0.05), Phase(PROBE, 0.02), Phase(TINY, 0.0, 5, two_loads=True),
               Phase(TINY, 0.01), Phase(PROBE, 0.01))
"""The cuda mode's order: what the bars need first, so a budget that ends early cuts
the least important runs."""
CPU_PHASES = (Phase(TINY, 0.0, 2), Phase(TINY, 0.05, 2), Phase(TINY, 0.0, 1, two_loads=True))
BUDGET_S = 520.0
"""Fits one 600 s device call: the loads (~25 s) count in it; leave `timeout 575` around
the script and ~20 s for the wheel install and the tarball."""
RUN_S_PRIOR = {TINY: 12.0, PROBE: 22.0}
"""Seconds one gate run is expected to take before any has run (the H200's first calibration, one pass per
sample: tiny A/A 2.4-11.7 s, probe 15-20 s; at min_sample_s 0.1 the tiny model's 22 /
34 / 64 ms passes (c1/c4/c8) take k = 5 / 3 / 2, the probe's 82 ms c1 pass k = 2, its
170 / 250 ms c4/c8 passes k = 1): a run starts only when it fits the budget by this or
by the longest measured so far of the same model."""


def load(model: Model, device: str, mode: str, keys: dict, scratch: Path,
         concurrency) -> Loaded:
    """The model's row (the gate's defaults but `keys`), its engine started, its cells:
    one wave of `c` requests per cell, so every pass decodes at full concurrency."""
    from rowgate.gates.interface import GateContext, gate_device
    from rowgate.rows.row import load_row
    from rowgate.rows.spec import Workload
    from rowgate.rows.workload import build_passes
    from rowgate.seal import device as dev
    from rowgate_lab.megakernel import models

    inv = dev.inventory()
    arch = inv.gpus[0].arch if device.startswith("cuda") and inv.gpus else "cpu"
    text = ROW.format(tag=model.name.upper(), name=model.name, arch=arch, mode=mode, dtype=model.dtype,
                      input_len=model.input_len, output_len=model.output_len,
                      keys="\n".join(f"{k} = {json.dumps(v)}" for k, v in keys.items()))
    path = scratch / f"CALIBRATE-{model.name.upper()}.toml"
    scratch.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    row = load_row(path).row
    spec = row.gate("throughput")
    info = models.build(models.NAMED[model.name])
    passes = [build_passes(Workload(input_lens=[model.input_len], concurrency=[c],
                                    output_len=model.output_len, requests_per_cell=c),
                           info.vocab_size, info.special_ids)[0] for c in concurrency]
    base = slowed_engine_class()(info.path, device=device, mode=mode, dtype=model.dtype)
    base.start()
    ctx = GateContext(repo=REPO, artifact_dir=scratch, subject=None, provenance=None,
                      progress=_Quiet(), gpu=gate_device(row, spec, inv), devices=inv)
    return Loaded(model, row, spec, base, passes, ctx)


def second_load(m: Loaded, device: str, mode: str):
    """Another engine object of the same model (the two-loads A/A)."""
    from rowgate_lab.megakernel import models

    e = slowed_engine_class()(models.build(models.NAMED[m.model.name]).path, device=device,
                              mode=mode, dtype=m.model.dtype)
    e.start()
    for work in m.passes:
        e.generate(work)  # graph capture and first-pass costs out of the timings
    return e


def legacy_cell_s(engines, work: WorkloadPass, repeats: int = 9, warmup: int = 1) -> float:
    """Wall time of today's schedule on one cell: `warmup` rounds, then `repeats` A B B A
    pairs (what the format-1 gate ran), on the same engines."""
    t0 = time.monotonic()
    for k in range(warmup + repeats):
        order = ("candidate", "baseline") if k % 2 else ("baseline", "candidate")
        for role in order:
            engines[role].generate(work)
    return time.monotonic() - t0


def write_doc(out: Path, doc: dict, min_effect: float) -> None:
    """calibration.json and calibration.txt as they stand (after every phase, so a run
    cut short still leaves what it measured)."""
    doc["mde_vs_budget"] = mde_table(doc["results"], min_effect)
    (out / "calibration.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "calibration.txt").write_text(table(doc["results"]) + "\n")


def engine_runs(models, device: str, mode: str, phases, budget_s: float, scratch: Path,
                concurrency, keys: dict, doc: dict, min_effect: float,
                keep_raw: int = 2) -> dict:
    """The phases in order, each model's engine loaded once (serving both arms). No run
    starts unless it fits `budget_s` (counted from before the loads) by the longest run
    of its model so far (`RUN_S_PRIOR` before any); what ran is reported. The raw
    artifacts of the first `keep_raw` runs of each phase stay under `scratch`."""
    import shutil

    t_start = time.monotonic()
    by_name = {m.name: m for m in models}
    loaded: dict[str, Loaded] = {}
    for name in dict.fromkeys(ph.model for ph in phases):
        log(f"== loading {name} on {device} ({mode})")
        m = loaded[name] = load(by_name[name], device, mode, keys, scratch, concurrency)
        for work in m.passes:  # graph capture and first-pass costs out of the timings
            m.base.generate(work)
    log(f"   loaded in {time.monotonic() - t_start:.1f} s")
    legacy = {name: legacy_cell_s(m.engines(0.0), m.passes[0]) for name, m in loaded.items()}
    results: dict = doc.setdefault("results", {})
    took: dict[str, list[float]] = {name: [] for name in loaded}
    for ph in phases:
        m, tally = loaded[ph.model], Tally()
        if ph.two_loads and m.second is None:
            if time.monotonic() - t_start + 2 * RUN_S_PRIOR[ph.model] > budget_s:
                log(f"   budget: {ph.key} not started")
                continue
            m.second = second_load(m, device, mode)
        engines = m.engines(ph.effect, ph.two_loads)
        for i in range(ph.runs):
            guess = max(took[ph.model] or [RUN_S_PRIOR.get(ph.model, 30.0)])
            if time.monotonic() - t_start + guess > budget_s:
                log(f"   budget: {ph.key} stops at {i} runs")
                break
            t0 = time.monotonic()
            raw = scratch / "runs" / ph.key.replace("/", "-")
            status, cells = m.run(raw.with_name(f"{raw.name}-{i}"), engines)
            took[ph.model].append(time.monotonic() - t0)
            tally.add(status, cells)
            if i >= keep_raw:
                shutil.rmtree(raw.with_name(f"{raw.name}-{i}"))
            log(f"   {ph.key} run {i + 1}: {status} {took[ph.model][-1]:.1f} s " + ", ".join(
                f"{c} {v['verdict']} {v['ratio']} /{v['rounds']}r k={v['passes_per_sample']}"
                for c, v in cells.items()))
        results[ph.key] = tally.summary(ph.effect)
        if ph.two_loads:
            results[ph.key]["note"] = ("two separately loaded engines of the same model: "
                                       "the instance difference, not counted in the bars")
        elif ph.effect == 0 and tally.elapsed:
            c1 = tally.elapsed[0::len(m.passes)]
            results[ph.key].update(c1_cell_s_mean=round(float(np.mean(c1)), 3),
                                   legacy_c1_cell_s=round(legacy[ph.model], 3),
                                   c1_vs_legacy=round(float(np.mean(c1)) / legacy[ph.model], 3))
        log(f"   {ph.key}: " + json.dumps({k: v for k, v in results[ph.key].items()
                                            if k != "per_run"}))
        doc["wall_s"] = round(time.monotonic() - t_start, 1)
        write_doc(scratch, doc, min_effect)
    for m in loaded.values():
        for e in (m.base, m.second):
            if e is not None:
                e.stop()
    return results

def mde_table(results: dict, min_effect: float, rounds=(8, 16, 24, 40, 80)) -> dict:
    """Minimum detectable slowdown (80 % power) vs budget at each A/A's median sd."""
    from rowgate.stats import paired as stats

    design = stats.Design(min_effect=min_effect)
    return {key: {str(n): round(stats.detectable_effect(design, r["sd_log_ratio_median"], n), 4)
                  for n in rounds}
            for key, r in results.items()
            if key.endswith("/0") and r.get("sd_log_ratio_median")}


def table(results: dict) -> str:
    lines = [f"{'model/effect':34} {'runs':>4} {'pass/fail':>9} {'diff':>6} {'detect':>6} "
             f"{'rounds':>6} {'cell s':>7}  cells"]
    for key, r in results.items():
        passed = f"{r['runs'] - round(r.get('false_fail_rate', 0) * r['runs'])}/{r['runs']}"
        lines.append(f"{key:34} {r['runs']:>4} {passed if 'false_fail_rate' in r else '':>9} "
                     f"{r.get('false_difference_rate', ''):>6} {r.get('detection_rate', ''):>6} "
                     f"{r['rounds_mean'] or '':>6} {r['cell_s_mean'] or '':>7}  {r['cells']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("sim", "cpu", "cuda"))
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--trials", type=int, default=100, help="sim: runs per scenario and effect")
    p.add_argument("--runs", type=int, default=None,
                   help="cpu/cuda: runs per phase (the two-loads phase keeps its own)")
    p.add_argument("--budget-s", type=float, default=BUDGET_S,
                   help="cpu/cuda: no run starts unless it fits this many seconds (from "
                   "before the model loads)")
    p.add_argument("--phases", nargs="*", default=None, help="cpu/cuda: the phases to run "
                   "(KEY or KEY:RUNS), in the default order (default all: "
                   f"{', '.join(ph.key for ph in CUDA_PHASES)})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scenarios", nargs="*", default=None, help="sim: scenario names "
                   f"(default all: {', '.join(sc.name for sc in SCENARIOS)})")
    p.add_argument("--schedule", default="interleaved", choices=("interleaved", "blocked"),
                   help="sim: the rounds' pass schedule (the gate's default: interleaved)")
    p.add_argument("--effects", nargs="*", type=float, default=None,
                   help="sim: planted effects, fractions of step time (< 0: a speed-up; "
                   f"default {' '.join(f'{e:g}' for e in EFFECTS)})")
    p.add_argument("--claim-rule", default=None, choices=("narrow", "narrow-or-clear"),
                   help="sim: the design's claim rule (default: the gate's default)")
    args = p.parse_args(argv)
    import tempfile

    out = args.out or Path(tempfile.mkdtemp(prefix="calibrate-throughput-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    doc: dict = {"mode": args.mode, "argv": sys.argv[1:]}
    if args.mode == "sim":
        chosen = [sc for sc in SCENARIOS if args.scenarios is None or sc.name in args.scenarios]
        doc["results"] = sim(args.trials, args.seed, Path(tempfile.mkdtemp()), chosen,
                             args.schedule, tuple(args.effects or EFFECTS), args.claim_rule)
    else:
        cpu = args.mode == "cpu"
        # KEY:N runs N runs of that phase (e.g. to complete a phase a budget cut short)
        asked = dict(a.split(":", 1) if ":" in a else (a, "") for a in args.phases or ())
        phases = [replace(ph, runs=int(asked[ph.key])) if asked.get(ph.key) else
                  ph if args.runs is None or ph.two_loads else replace(ph, runs=args.runs)
                  for ph in (CPU_PHASES if cpu else CUDA_PHASES)
                  if args.phases is None or ph.key in asked]
        unknown = set(asked) - {ph.key for ph in CUDA_PHASES + CPU_PHASES}
        if unknown:
            p.error(f"unknown phases {sorted(unknown)}")
        doc["phases"] = [ph.key for ph in phases]
        engine_runs(CPU_MODELS if cpu else CUDA_MODELS, "cpu" if cpu else "cuda:0",
                    "eager" if cpu else "graph", phases, args.budget_s, out,
                    (1, 4) if cpu else (1, 4, 8), dict(CPU_PLAN) if cpu else {}, doc,
                    CPU_PLAN["min_effect"] if cpu else 0.02)
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    write_doc(out, doc, CPU_PLAN["min_effect"] if args.mode == "cpu" else 0.02)
    log(table(doc["results"]))
    log(f"mde vs budget (rounds -> slowdown detected at 80 % power): {doc['mde_vs_budget']}")
    log(f"wrote {out / 'calibration.json'} ({doc['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
