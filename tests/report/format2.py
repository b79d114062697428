"""Format-2 throughput bundles for the report and compare tests: the throughput gate's
own `measure_on` and `derive`, on synthetic engines — real `Engine` implementations on
a virtual clock (benchmarks/calibrate_throughput.py, through tests/gates/test_timed_rounds.py),
so the speeds, and any planted change, are known — then staged and sealed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rowgate.engines.interface import WorkloadPass
from rowgate.gates.interface import GateContext
from rowgate.gates.throughput import Throughput
from rowgate.records.gate_result import GateResult
from rowgate.rows import row as rows
from rowgate.run import provenance
from rowgate.seal import signing
from rowgate.seal.bundle import Stage
from tests.gates.test_timed_rounds import cal


def measure(row: rows.Row, gate_id: str, out: Path, rng: np.random.Generator,
            step_ms: dict[str, float], passes: list[WorkloadPass], **machine: float) -> None:
    """The gate's measure on synthetic engines decoding at `step_ms["oracle"]` (the
    baseline) and `step_ms["candidate"]` per token, prefill four steps."""
    m = cal.Machine(rng, **machine)
    engines = {role: cal.SyntheticEngine(m, step_ms[arm] / 1e3, 4 * step_ms[arm] / 1e3)
               for role, arm in (("baseline", "oracle"), ("candidate", "candidate"))}
    ctx = GateContext(repo=Path.cwd(), artifact_dir=out, subject=None, provenance=None)
    out.mkdir(parents=True)
    Throughput().measure_on(row, row.gate(gate_id), ctx, engines, passes)


def result_of(row: rows.Row, gate_id: str, out: Path, root: Path) -> GateResult:
    """The gate's derive on `out` (in the stage `root`), as the runner records it."""
    derived = Throughput().derive(row, row.gate(gate_id), out)
    return GateResult(gate_id=gate_id, kind="throughput", status=derived.status,
                      reason=derived.reason, metrics=derived.metrics, cells=derived.cells,
                      arch="cpu", artifacts=sorted(str(p.relative_to(root))
                                                   for p in out.iterdir()))


def seal(evidence: Path, row_path: Path, repo: Path, key: Path, step_ms: dict[str, float],
         seed: int, passes: list[WorkloadPass], gate_id: str = "throughput",
         cpu: str | None = None) -> Path:
    """A signed bundle of the row's throughput gate alone, under `evidence`."""
    loaded = rows.load_row(row_path)
    stage = Stage(evidence, loaded.row.id)
    out = stage.artifact_dir(gate_id)
    measure(loaded.row, gate_id, out, np.random.default_rng(seed), step_ms, passes)
    stage.add_result(result_of(loaded.row, gate_id, out, stage.root))
    prov = provenance.collect()
    if cpu is not None:
        prov = prov.model_copy(update={"host": prov.host.model_copy(update={"cpu": cpu})})
    return stage.seal(row=loaded, row_file=str(row_path), subject=provenance.subject(repo),
                      provenance=prov, signer=signing.KeySigner(key), order=[gate_id])
