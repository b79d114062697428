"""Tokens gate: the candidate's token ids against the pinned oracle's.

measure runs the identical workload through the oracle (or reads a signed
oracle record when `spec.oracle_record` is set) and through the candidate, and
writes the raw per-request token ids and logprobs of both arms, both workload
digests and both engine descriptions. derive compares them:

* exact (default): every request's ids must equal the oracle's, at the
  oracle's precision; the first divergence (request, position, both tokens,
  both logprobs) is the reason.
* quantized (`spec.quantized`): position-wise agreement rate over the oracle's
  tokens must reach `min_agreement`, and the largest |logprob difference| over
  the positions before each request's first divergence (same context, same
  token, so the numbers are comparable) must stay within
  `max_logprob_divergence`.

Arms whose workload digests differ did not run the same workload: ERROR.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

from pydantic import Field

import rowgate.gates.arms as _arms
from rowgate.engines.interface import Engine, PassResult, WorkloadPass
from rowgate.errors import Error
from rowgate.gates.artifacts import read_json, read_jsonl, write_json
from rowgate.gates.interface import Derived, Gate, GateContext, GateError, gate_arch
from rowgate.records.status import Status
from rowgate.rows.options import ENGINE_KEYS
from rowgate.rows.spec import Arm, GateSpec
from rowgate.rows.workload import WorkloadMismatch, check_same_workload, workload_digest

if TYPE_CHECKING:
    from rowgate.rows.row import Row

META = "meta.json"
ARM_FILES = {"oracle": "oracle.jsonl", "candidate": "candidate.jsonl"}
RECORD_KEY_OPTION = "oracle_record_key"


class TokensGate(GateSpec):
    kind: Literal["tokens"]
    oracle_record: str = ""
    """Path of a signed oracle record to compare against when the oracle cannot
    run beside the candidate; empty means run the oracle here."""
    oracle_record_key: str = ""
    """Public key (PEM, a path in the repo) the record must be signed with: pinned in
    the row so a reviewer sees whose record counts (`--option oracle_record_key`
    overrides it)."""
    tie_margin: Annotated[float, Field(ge=0)] = 0.0
    """Near-tie rule (src/rowgate/engines/divergence.py) for arms that round differently from the
    oracle (bf16 against fp32, another engine's kernels): a request whose first
    divergence keeps, on each side, a token the other side had within this many nats of
    its own choice is not a mismatch. 0 holds the ids exactly equal. The row says why."""
    quantized: bool = False
    min_agreement: Annotated[float, Field(ge=0, le=1)] = 1.0
    max_logprob_divergence: Annotated[float, Field(ge=0)] = 0.0


class Tokens(Gate[TokensGate]):
    kind = "tokens"
    drives_arms = True
    shares_engines = True
    spec_model = TokensGate
    needs_device = True
    workload_matrix = True
    report_view = "tokens"
    options = (*ENGINE_KEYS, _arms.CANDIDATE_MODEL_OPTION, RECORD_KEY_OPTION)

    def requirements(self, row: Row, spec: TokensGate, ctx: GateContext) -> str | None:
        # a record stands in for the oracle arm: then only the candidate must run here
        arms = {"candidate": row.arms.candidate}
        return _arms.arms_requirement(row, arms if spec.oracle_record
                                      else {"oracle": row.arms.oracle, **arms})

    def arch(self, row: Row, spec: TokensGate, ctx: GateContext) -> tuple[str, bool]:
        return gate_arch(row, ctx.gpu)

    def pooled_arms(self, row: Row, spec: TokensGate) -> list[Arm]:
        return ([] if spec.oracle_record else [row.arms.oracle]) + [row.arms.candidate]

    # ------------------------------------------------------------- measure

    def measure(self, row: Row, spec: TokensGate, ctx: GateContext) -> None:
        with ctx.phase("model"):  # resolved, or built from its seed on a fresh machine
            runs = _arms.model_runs(row)
        if spec.oracle_record and len(runs) > 1:
            raise GateError(f"tokens: an oracle record covers one model; row {row.id} gates "
                            f"{len(runs)} (run the oracle live)")
        oracle = _record_side(spec, ctx) if spec.oracle_record else None
        outputs: dict[str, list[dict[str, Any]]] = {}
        engines_seen: dict[str, dict[str, dict[str, Any]]] = {}
        for run in runs:  # every model of the row, its arms started for it
            arms = {"candidate": (row.arms.candidate, _arms.candidate_model(run.info, ctx))}
            if oracle is None:
                arms = {"oracle": (row.arms.oracle, run.info), **arms}
            with _arms.started(arms, row, ctx) as engines:
                for role, engine in engines.items():
                    side = _run_side(role, engine, run.passes, ctx)
                    outputs.setdefault(role, []).extend(side.outputs)
                    engines_seen.setdefault(role, {})[run.ref.id] = side.meta["engine"]
        passes = [p for run in runs for p in run.passes]
        sides = {role: _Side(outs, {"source": "live",
                                    "engine": next(iter(engines_seen[role].values())),
                                    "engines": engines_seen[role],
                                    "workload_digest": workload_digest(passes)})
                 for role, outs in outputs.items()}
        if oracle is not None:
            sides["oracle"] = oracle
        for role, side in sides.items():
            _write_outputs(ctx.artifact_dir / ARM_FILES[role], side.outputs)
        write_json(ctx.artifact_dir / META, {
            "model_digest": runs[0].info.digest,
            "models": {run.ref.id: run.info.digest for run in runs},
            "cells": [p.cell for p in passes],
            **{role: side.meta for role, side in sides.items()}})

    # -------------------------------------------------------------- derive

    def derive(self, row: Row, spec: TokensGate, artifact_dir: Path) -> Derived:
        meta = read_json(artifact_dir / META)
        source = _source_text(meta["oracle"])
        try:
            check_same_workload(meta["oracle"]["workload_digest"],
                                meta["candidate"]["workload_digest"], source)
        except WorkloadMismatch as exc:
            return Derived(Status.ERROR, str(exc))
        recorded = meta["oracle"].get("model_digest")
        if recorded and recorded != meta["model_digest"]:
            return Derived(Status.ERROR, f"the {source} was made on model {recorded}; this "
                                         f"row's model is {meta['model_digest']}")
        if not spec.quantized and not spec.tie_margin and \
                row.arms.candidate.dtype != row.arms.oracle.dtype:
            return Derived(Status.ERROR, f"exact token comparison needs the candidate at the "
                                         f"oracle's precision ({row.arms.oracle.dtype}), not "
                                         f"{row.arms.candidate.dtype}; declare quantized = true "
                                         f"with agreement thresholds for a quantized arm, or a "
                                         f"tie_margin for one that only rounds differently")
        oracle = read_jsonl(artifact_dir / ARM_FILES["oracle"])
        candidate = {o["id"]: o for o in read_jsonl(artifact_dir / ARM_FILES["candidate"])}
        missing = [o["id"] for o in oracle if o["id"] not in candidate]
        if missing or len(candidate) != len(oracle):
            raise GateError(f"tokens artifacts in {artifact_dir}: the arms answered different "
                            f"requests (candidate lacks {missing[:3]}, "
                            f"{len(candidate)} vs {len(oracle)} outputs)")
        diffs = [compare_request(o, candidate[o["id"]]) for o in oracle]
        if spec.tie_margin and not spec.quantized:
            return _tie_verdict(spec, oracle, candidate, diffs, source)
        return _verdict(spec, diffs, source)


# ------------------------------------------------------------------ sides


@dataclass(frozen=True)
class _Side:
    outputs: list[dict[str, Any]]
    meta: dict[str, Any]


def _run_side(role: str, engine: Engine, passes: list[WorkloadPass], ctx: GateContext) -> _Side:
    outputs: list[dict[str, Any]] = []
    journal = ctx.engines.journal(ctx.gate_id) if ctx.engines else None
    for work in passes:
        ctx.progress.update(f"tokens: {role} cell {work.cell} ({len(work.requests)} requests)")
        with ctx.phase("generate"):
            start = time.monotonic()
            result = cast(PassResult, _arms.generate(engine, role, work))
        if journal is not None:  # a later throughput gate's warm-up starts from it
            journal.note(engine, work, start, time.monotonic(), result)
        outputs += [{"id": o.id, "cell": work.cell, "token_ids": list(o.token_ids),
                     "logprobs": list(o.logprobs), "alternatives": o.alternatives}
                    for o in result.outputs]
    return _Side(outputs, {"source": "live", "engine": engine.describe(),
                           "workload_digest": workload_digest(passes)})


def _record_side(spec: TokensGate, ctx: GateContext) -> _Side:
    """The oracle's outputs from a signed record, verified by the runner's record opener
    (`ctx.records`) with the record signer's public key (`--option
    oracle_record_key=PUB.pem`, else the row's `oracle_record_key`) or, with neither,
    the verifier `rowgate verify` would use here."""
    path_text = spec.oracle_record
    path = _in_repo(path_text, ctx)
    if ctx.records is None:
        raise GateError(f"oracle record {path}: this gate context opens no signed records")
    ctx.progress.update(f"tokens: verifying oracle record {path}")
    key = ctx.options.get(RECORD_KEY_OPTION) or spec.oracle_record_key
    try:
        record = ctx.records.oracle_record(path, _in_repo(key, ctx) if key else None)
    except Error as exc:
        raise GateError(f"oracle record {path}: {exc.diagnostics()}") from exc
    outputs = [{"id": o.id, "cell": o.cell, "token_ids": list(o.token_ids),
                "logprobs": list(o.logprobs), "alternatives": o.alternatives}
               for o in record.outputs]
    return _Side(outputs, {"source": "record", "record": str(path_text),
                           "record_id": record.record_id, "record_sha256": record.sha256,
                           "record_signer": str(record.signer), "record_row": record.row_id,
                           "engine": record.engine, "workload_digest": record.workload_digest,
                           "model_digest": record.model_digest})


def _in_repo(path_text: str, ctx: GateContext) -> Path:
    path = Path(path_text)
    return path if path.is_absolute() else ctx.repo / path


def _source_text(meta: dict[str, Any]) -> str:
    if meta.get("source") == "record":
        return f"oracle record {meta['record']} (sha256 {meta['record_sha256'][:16]})"
    return "live oracle"


def _write_outputs(path: Path, outputs: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(o, sort_keys=True) + "\n" for o in outputs))


# -------------------------------------------------------------- comparison


@dataclass(frozen=True)
class RequestDiff:
    id: str
    cell: str
    oracle_tokens: int
    agreeing: int
    """Positions (over the oracle's length) where both arms emitted the same id."""
    first_divergence: int | None
    """First position where the ids differ (or one sequence ends); None if equal."""
    max_logprob_divergence: float
    """Max |logprob difference| over the positions before the first divergence."""
    tokens: tuple[int | None, int | None] = (None, None)
    logprobs: tuple[float | None, float | None] = (None, None)
    """(oracle, candidate) id and logprob at the first divergence."""


def compare_request(oracle: dict[str, Any], candidate: dict[str, Any]) -> RequestDiff:
    o_ids, c_ids = oracle["token_ids"], candidate["token_ids"]
    o_lp, c_lp = oracle["logprobs"], candidate["logprobs"]
    first = next((i for i, (a, b) in enumerate(zip(o_ids, c_ids)) if a != b), None)
    if first is None and len(o_ids) != len(c_ids):
        first = min(len(o_ids), len(c_ids))  # one arm stopped early or ran on
    prefix = len(o_ids) if first is None else first
    lp_div = max((abs(a - b) for a, b in zip(o_lp[:prefix], c_lp[:prefix])), default=0.0)
    diff = RequestDiff(id=oracle["id"], cell=oracle["cell"], oracle_tokens=len(o_ids),
                       agreeing=sum(a == b for a, b in zip(o_ids, c_ids)),
                       first_divergence=first, max_logprob_divergence=lp_div)
    if first is None:
        return diff

    def at(seq: list[Any], i: int) -> Any:
        return seq[i] if i < len(seq) else None

    return RequestDiff(**{**diff.__dict__,
                          "tokens": (at(o_ids, first), at(c_ids, first)),
                          "logprobs": (at(o_lp, first), at(c_lp, first))})


def _summary(diffs: list[RequestDiff]) -> dict[str, Any]:
    total = sum(d.oracle_tokens for d in diffs)
    return {"requests": len(diffs),
            "mismatched_requests": sum(d.first_divergence is not None for d in diffs),
            "agreement": round(sum(d.agreeing for d in diffs) / total, 9) if total else 1.0,
            "max_logprob_divergence": round(max((d.max_logprob_divergence for d in diffs),
                                                default=0.0), 9)}


def _describe(d: RequestDiff) -> str:
    (ot, ct), (ol, cl) = d.tokens, d.logprobs

    def lp(v: float | None) -> str:
        return "none" if v is None else f"{v:.6f}"

    return (f"request {d.id} (cell {d.cell}) position {d.first_divergence}: oracle token "
            f"{ot} (logprob {lp(ol)}), candidate token {ct} (logprob {lp(cl)})")


def _verdict(spec: TokensGate, diffs: list[RequestDiff], source: str) -> Derived:
    cells: dict[str, list[RequestDiff]] = {}
    for d in diffs:
        cells.setdefault(d.cell, []).append(d)
    metrics = _summary(diffs)
    first = next((d for d in diffs if d.first_divergence is not None), None)
    metrics.update(oracle_source=source,
                   first_divergence_request=first.id if first else None,
                   first_divergence_position=first.first_divergence if first else None)
    per_cell = {cell: _summary(ds) for cell, ds in cells.items()}
    if spec.quantized:
        ok = (metrics["agreement"] >= spec.min_agreement
              and metrics["max_logprob_divergence"] <= spec.max_logprob_divergence)
        text = (f"agreement {metrics['agreement']:.4f} (min {spec.min_agreement}), max logprob "
                f"divergence {metrics['max_logprob_divergence']:.6f} (max "
                f"{spec.max_logprob_divergence}) against the {source}")
        if first:
            text += f"; first divergence at {_describe(first)}"
        return Derived(Status.PASS if ok else Status.FAIL, text, metrics, per_cell)
    if first is None:
        return Derived(Status.PASS, f"all {len(diffs)} requests token-identical to the "
                                    f"{source}", metrics, per_cell)
    return Derived(Status.FAIL, f"{metrics['mismatched_requests']} of {len(diffs)} requests "
                                f"differ from the {source}; first divergence at "
                                f"{_describe(first)}", metrics, per_cell)


def _tie_verdict(spec: TokensGate, oracle: list[dict[str, Any]], candidate: dict[str, dict[str, Any]],
                 diffs: list[RequestDiff], source: str) -> Derived:
    """Exact, near-tie or mismatch per request (src/rowgate/engines/divergence.py); PASS iff no
    mismatch. The position-wise agreement and logprob figures stay beside the counts."""
    from rowgate.engines.divergence import Out, divergence

    parted = {o["id"]: divergence(Out.from_json(o), Out.from_json(candidate[o["id"]]),
                                  spec.tie_margin, ("oracle", "candidate")) for o in oracle}

    def counts(ids: list[str]) -> dict[str, int]:
        ties = sum(1 for i in ids if (p := parted[i]) and p["tie"])
        bad = sum(1 for i in ids if (p := parted[i]) and not p["tie"])
        return {"exact_requests": len(ids) - ties - bad, "tie_requests": ties,
                "mismatched_requests": bad}

    cells: dict[str, list[RequestDiff]] = {}
    for d in diffs:
        cells.setdefault(d.cell, []).append(d)
    per_cell = {cell: {**_summary(ds), **counts([d.id for d in ds])} for cell, ds in cells.items()}
    metrics = {**_summary(diffs), **counts([d.id for d in diffs]), "oracle_source": source,
               "tie_margin": spec.tie_margin}
    first = next((d for d in diffs if (p := parted[d.id]) and not p["tie"]), None)
    metrics.update(first_divergence_request=first.id if first else None,
                   first_divergence_position=first.first_divergence if first else None)
    text = (f"{metrics['exact_requests']} of {len(diffs)} requests token-identical to the "
            f"{source}, {metrics['tie_requests']} parting at a near-tie within "
            f"{spec.tie_margin} nats")
    if first is None:
        return Derived(Status.PASS, text, metrics, per_cell)
    return Derived(Status.FAIL, f"{metrics['mismatched_requests']} request(s) differ beyond a "
                                f"near-tie ({text}); first at {_describe(first)}",
                   metrics, per_cell)
