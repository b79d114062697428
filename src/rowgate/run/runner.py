"""The runs that measure and seal: `rowgate gate` (provenance, each gate in order, then
seal and sign a bundle) and `rowgate oracle record` (the row's pinned oracle once on its
workload, sealed as a signed oracle record).

The runner never measures (gates and engines do) and never signs by itself (the sealer
does, with the signer it is given). It chooses each gate's GPU from one enumeration of
the host's and opens the signed records gates read (`RecordOpener`): what a gate may
not do itself.
"""

from __future__ import annotations

import contextlib
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rowgate import __version__, gates, sandbox, storage
from rowgate.engines.interface import WorkloadPass
from rowgate.errors import Error, EvidenceError, UsageError
from rowgate.gates import registry
from rowgate.gates.engine_pool import EnginePool
from rowgate.gates.interface import GateContext, Progress, gate_device
from rowgate.records.gate_result import GateResult
from rowgate.records.provenance import Provenance, Subject
from rowgate.records.status import Status
from rowgate.rows.row import LoadedRow, Row, recorded_file
from rowgate.rows.spec import GateSpec
from rowgate.run import provenance
from rowgate.seal import oracle, signing
from rowgate.seal.bundle import Bundle, Stage
from rowgate.seal.device import Inventory, inventory
from rowgate.seal.gitrepo import open_repo
from rowgate.seal.oracle import OracleOutput, OracleRecord
from rowgate.seal.signing import Signer


@dataclass(frozen=True)
class GateRun:
    bundle: Path
    results: list[GateResult]
    status: Status
    """The sealed overall status (over the row's required gates)."""


class RecordOpener:
    """`gates.interface.SignedRecords`: signed records verified here, for the gates that
    read them (no gate imports the signing code)."""

    def oracle_record(self, path: Path, key: Path | None) -> OracleRecord:
        return oracle.load_record(path, signing.KeyVerifier(key, f"oracle_record_key {key}") if key else None)


def gate_context(row: Row, spec: GateSpec, *, repo: Path, artifact_dir: Path, subject: Subject,
                 provenance: Provenance, devices: Inventory, progress: Progress | None = None,
                 options: dict[str, str] | None = None,
                 earlier: list[GateResult] | None = None,
                 engines: EnginePool | None = None,
                 deadline: float | None = None) -> GateContext:
    """One gate's context as the runner makes it: its GPU chosen from the run's
    enumeration (`devices`), the runner's record opener, the results before it, the
    run's engine pool."""
    ctx = GateContext(repo=repo, artifact_dir=artifact_dir, subject=subject,
                      provenance=provenance, options=dict(options or {}),
                      gpu=gate_device(row, spec, devices), devices=devices,
                      records=RecordOpener(), sandbox=row.sandbox,
                      earlier={r.gate_id: r.model_copy(deep=True) for r in earlier or []},
                      gate_id=spec.id, engines=engines, deadline=deadline)
    if progress is not None:
        ctx.progress = progress
    return ctx


def run_row(loaded: LoadedRow, repo: Path, out_dir: Path, signer: Signer, progress: Progress,
            base: str | None = None, options: dict[str, str] | None = None) -> GateRun:
    """Gate and seal one row. A filesystem that refuses a write anywhere in the run is
    one StorageError (exit 4); the stage is discarded, nothing is published."""
    row = loaded.row
    if row.sandbox.confined and any(getattr(registry.lookup(g.kind), "subject_steps", False)
                                    for g in row.gates):
        sandbox.check_available()  # one configuration line (exit 2), never a silent fallback
    subject = provenance.subject(repo, base, row.review.merge_into)
    check_out_dir(out_dir, Path(subject.repo))
    devices = inventory()  # the run's one NVML enumeration
    prov = provenance.collect(gpus=list(devices.gpus))
    with storage.writing("nothing was sealed", out_dir):
        return _gate_and_seal(loaded, subject, prov, devices, out_dir, signer, progress, options)


def check_out_dir(out_dir: Path, repo: Path) -> None:
    """An evidence dir inside the subject must be one git ignores there: anything else
    makes the subject's tree dirty, and the next gate of it would fail its host gate."""
    work = repo.resolve()
    where = out_dir.resolve()
    if not where.is_relative_to(work):
        return
    probe = (where / "ROW" / "BUNDLE").relative_to(work).as_posix()
    with open_repo(work) as git_repo:
        status, _, _ = git_repo.git.check_ignore("-q", probe, with_extended_output=True,
                                                 with_exceptions=False)
    if status != 0:
        raise UsageError(f"--out {out_dir}: inside the subject {work} and not ignored by it "
                         f"(add it to the subject's .gitignore, or leave --out to its default "
                         f"{storage.default_evidence()})")


def _gate_and_seal(loaded: LoadedRow, subject: Subject, prov: Provenance, devices: Inventory,
                   out_dir: Path, signer: Signer, progress: Progress,
                   options: dict[str, str] | None) -> GateRun:
    row = loaded.row
    stage = Stage(out_dir, row.id)
    deadline = time.monotonic() + row.budget.wall_s if row.budget else None
    try:
        with EnginePool() as pool:  # an arm is started once per row run (engine_pool)
            for n, spec in enumerate(row.gates):
                progress.update(f"gate {spec.id} ({spec.kind})")
                kind = registry.lookup(spec.kind)
                # Between gates, on no gate's clock: stop what neither this gate nor a
                # later one asks for (stopping an engine is no gate's work).
                pool.expect(_pooled_later(row, n - 1))
                pool.keep_only(set())
                pool.expect(_pooled_later(row, n))
                if getattr(kind, "drives_arms", False) and not getattr(kind, "shares_engines",
                                                                        False):
                    pool.keep_only(set())  # it starts engines of its own: free the device
                ctx = gate_context(row, spec, repo=Path(subject.repo) / subject.path,
                                   artifact_dir=stage.artifact_dir(spec.id), subject=subject,
                                   provenance=prov, devices=devices, progress=progress,
                                   options=options, earlier=stage.results(), engines=pool,
                                   deadline=deadline)
                stage.add_result(gates.run(row, spec, ctx, stage.root,
                                           refused=_over_budget(row, stage.results(), ctx)))
                progress.advance()
        progress.update("sealing and signing")
        bundle = stage.seal(row=loaded, row_file=recorded_file(loaded), subject=subject,
                            provenance=prov, signer=signer, order=[g.id for g in row.gates])
    except BaseException:
        stage.discard()
        raise
    sealed = Bundle.open(bundle)  # verified by the seal before it was published
    return GateRun(bundle=bundle, results=sealed.results(), status=sealed.manifest.status)


def _pooled_later(row: Row, n: int) -> list[dict[str, object]]:
    """The arms the gates after the `n`th (from the first for -1) will ask the engine pool
    for (declarations):
    their engines stay up through the gates between. A gate whose arms cannot be named
    expects none (it fails on its own, in its turn)."""
    later: list[dict[str, object]] = []
    for spec in row.gates[n + 1:]:
        with contextlib.suppress(Error):
            later += [a.model_dump(mode="json")
                      for a in gates.gate_for(spec.kind).pooled_arms(row, spec)]
    return later


def _over_budget(row: Row, before: list[GateResult], ctx: GateContext) -> str | None:
    """Why the gate is not run: the row's wall budget is spent (by the gates before it,
    named with their seconds). None while time is left or without a budget."""
    left = ctx.time_left()  # None exactly when the row has no [budget]
    if left is None or left > 0 or row.budget is None:
        return None
    spent = ", ".join(f"{r.gate_id} {r.duration_s:.0f} s" for r in before) or "nothing"
    return (f"not run: the row's wall budget ([budget] wall_s = {row.budget.wall_s:g} s) was "
            f"spent before this gate ({spent}); raise wall_s or split the row")


# ------------------------------------------------------------- oracle records


def _oracle_doc(loaded: LoadedRow, engine_info: dict[str, str], passes: list[WorkloadPass],
                outputs: list[OracleOutput], model_digest: str) -> dict[str, Any]:
    from rowgate.rows.workload import workload_digest

    arm = loaded.row.arms.oracle
    return {
        "format": oracle.FORMAT, "rowgate_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"), "host": platform.node(),
        "row": {"id": loaded.row.id, "sha256": loaded.sha256},
        "arm": json.loads(arm.model_dump_json()),
        "engine": engine_info, "version": engine_info.get("version", arm.version),
        "model": {"digest": model_digest},
        "workload": {"digest": workload_digest(passes), "passes": [asdict(p) for p in passes]},
        "outputs": [asdict(o) for o in outputs],
    }


def record_oracle(loaded: LoadedRow, signer: Signer, *, out_dir: Path = oracle.DEFAULT_DIR,
                  device: str = "cpu", options: dict[str, str] | None = None,
                  say: Callable[[str], None] = lambda _msg: None) -> OracleRecord:
    """Run the row's pinned oracle arm once on its workload and seal a signed record."""
    from rowgate import engines
    from rowgate.models.tiny import resolve_model
    from rowgate.rows.workload import build_passes

    row = loaded.row
    if not row.models:
        raise EvidenceError(f"row {row.id}: declares no [[models]]; nothing to record")
    model = resolve_model(row.models[0])
    passes = build_passes(row.workload, model.vocab_size, model.special_ids)
    arm = row.arms.oracle
    say(f"starting the oracle ({arm.engine} {arm.version}) on {device}")
    outputs: list[OracleOutput] = []
    with engines.create(arm, model.path, device=device, options=options) as engine:
        for work in passes:
            say(f"oracle: cell {work.cell} ({len(work.requests)} requests)")
            result = engine.generate(work)
            outputs += [OracleOutput(o.id, work.cell, tuple(o.token_ids), tuple(o.logprobs),
                                     o.alternatives)
                        for o in result.outputs]
        info = engine.describe()
    doc = _oracle_doc(loaded, info, passes, outputs, model.digest)
    with storage.writing("the oracle record was not written", out_dir):
        path = oracle.seal_record(out_dir / row.id, oracle.canonical_record(doc), signer)
    say(f"oracle record {path}")
    return oracle.load_record(path, signer.verifier())
