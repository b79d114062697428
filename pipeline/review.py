"""The review: a sealed bundle becomes a signed decision (APPROVE, REJECT, PENDING).

The review trusts nothing it can recompute. In order it
1. verifies the bundle (signature, every digest, schemas);
2. checks freshness against the reviewer's clone (branch head, merge-base, row digest);
3. re-derives every PASS/FAIL gate from its raw artifacts with the gate kind's pure
   `derive` and compares with the sealed summary;
4. evaluates the row's criteria and stop conditions on the re-derived values.

Records are single JSON files beside their signatures:
`REVIEWS/ROW/BUNDLE-ID.review.json` + `BUNDLE-ID.review.sigstore.json`, and the
operator's `BUNDLE-ID.attestation.json` + `BUNDLE-ID.attestation.sigstore.json`.
How a single file is signed: `pipeline._records`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Literal

import git
from pydantic import BaseModel, ConfigDict, Field

from pipeline import CHECKOUT, __version__
from pipeline._records import file_sha256, now, read_record, sign_record, write_record
from pipeline.device import Gpu
from pipeline.errors import ExitCode, RepoError, UsageError, VerificationError
from pipeline.evidence import BUNDLE_ID_LEN, Bundle
from pipeline.gates import gate_for
from pipeline.gates.interface import GateError, GateResult, MetricValue, Status
from pipeline.provenance import Host, Subject, default_base, open_repo
from pipeline.rows import (
    Comparison,
    Criterion,
    LoadedRow,
    Row,
    StopAction,
    StopCondition,
    load_row,
)
from pipeline.signing import (
    SIGNATURE_FILE,
    KeyVerifier,
    Signer,
    SignerIdentity,
    SigstoreVerifier,
    Verifier,
    public_key_file,
    signature_identity,
)

ROW_ID = r"^[A-Z0-9][A-Z0-9-]*$"
BUNDLE_ID = rf"^[0-9a-f]{{{BUNDLE_ID_LEN}}}$"
REVIEW_SUFFIX = ".review.json"
ATTESTATION_SUFFIX = ".attestation.json"
GATE_LEVEL = "(gate)"
"""Key of the gate-level value in a criterion's `measured` table."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Verdict(str, Enum):
    APPROVE = "APPROVE"
    REJECT = "REJECT"
    PENDING = "PENDING"


class Outcome(str, Enum):
    """What one criterion came to."""

    PASS = "pass"
    FAIL = "fail"
    PENDING = "pending"
    """Its gate could not run here."""
    NOT_SATISFIABLE = "not satisfiable here"
    """Measured on a stand-in or another arch: says nothing about the target arch."""
    MISSING = "missing"
    """The gate ran but did not produce the metric or cell the criterion names."""
    ERROR = "error"


# -------------------------------------------------------------------- models


class BundleVerifierRef(_Model):
    """How the reviewer verified the bundle, so merge and attestation can do it again."""

    kind: Literal["key", "sigstore"]
    public_key_pem: str = ""
    identity: str = ""
    issuer: str = ""

    @classmethod
    def of(cls, verifier: Verifier) -> "BundleVerifierRef":
        if isinstance(verifier, KeyVerifier):
            return cls(kind="key", public_key_pem=verifier.public_pem.decode())
        if isinstance(verifier, SigstoreVerifier):
            return cls(kind="sigstore", identity=verifier.identity.id,
                       issuer=verifier.identity.issuer)
        raise UsageError(f"cannot record verifier {type(verifier).__name__}")

    def verifier(self) -> Verifier:
        if self.kind == "sigstore":
            return SigstoreVerifier(self.identity, self.issuer)
        return KeyVerifier(public_key_file(self.public_key_pem.encode()))


class BundleRef(_Model):
    id: str
    path: str
    """Where the reviewer had the bundle (absolute)."""
    signer: SignerIdentity | None = None
    verifier: BundleVerifierRef | None = None
    status: Status | None = None
    created: str = ""


class Freshness(_Model):
    branch_head: str = ""
    """Head of the subject's branch in the reviewer's clone when reviewed."""
    merge_base: str = ""
    row_sha256: str = ""
    """Digest of the row file the review was made against."""
    moved: list[str] = Field(default_factory=list)
    """What moved since the bundle was sealed; empty when fresh."""


class GateCheck(_Model):
    gate_id: str
    kind: str
    status: Status
    reason: str
    required: bool
    arch: str = ""
    stand_in: bool = False
    rederived: Literal["consistent", "inconsistent", "not re-derivable"]
    detail: str = ""


class CriterionRow(_Model):
    """One row of the per-criterion table."""

    id: str
    gate: str
    metric: str
    comparison: Comparison
    threshold: float
    cells: list[str]
    arch: str
    """Arch the measurement must come from."""
    measured: dict[str, MetricValue]
    """Measured value per cell (`(gate)` for the gate-level metric)."""
    outcome: Outcome
    detail: str = ""


class StopRow(_Model):
    id: str
    gate: str
    metric: str
    comparison: Comparison
    threshold: float
    cells: list[str]
    action: StopAction
    says: str
    measured: dict[str, MetricValue]
    triggered: bool | None
    """None when it could not be evaluated (gate PENDING/ERROR, metric missing)."""
    detail: str = ""


class Admission(_Model):
    """Whether implementation work gated on `gate` is admitted."""

    gate: str
    admitted: bool | None
    reason: str
    dependents: list[str]
    """Row gates that exist only if admitted (an `abi` gate's `admitted_by`)."""


class PendingItem(_Model):
    gate: str
    reason: str
    until: str = ""


class ReviewRecord(_Model):
    """`REVIEWS/ROW/BUNDLE-ID.review.json`: the signed decision on one bundle."""

    schema_version: Literal[1] = 1
    rowgate_version: str
    created: str
    verdict: Verdict
    summary: str
    """One line: the verdict and its first reason."""
    reasons: list[str]
    """Every reason for REJECT or PENDING, in the order found."""
    row_id: str
    bundle: BundleRef
    subject: Subject | None = None
    reviewer: SignerIdentity
    freshness: Freshness | None = None
    gates: list[GateCheck] = Field(default_factory=list)
    criteria: list[CriterionRow] = Field(default_factory=list)
    stop_conditions: list[StopRow] = Field(default_factory=list)
    implementation: list[Admission] = Field(default_factory=list)
    pending: list[PendingItem] = Field(default_factory=list)


class Hardware(_Model):
    host: Host
    gpus: list[Gpu]


class Attestation(_Model):
    """`REVIEWS/ROW/BUNDLE-ID.attestation.json`: the operator's signed statement."""

    schema_version: Literal[1] = 1
    rowgate_version: str
    created: str
    row_id: str
    bundle_id: str
    review_file: str
    review_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    operator: SignerIdentity
    statement: str
    hardware: Hardware
    note: str = ""


# ------------------------------------------------------------ record files


def review_path(reviews_dir: Path, row_id: str, bundle_id: str) -> Path:
    return reviews_dir / row_id / f"{bundle_id}{REVIEW_SUFFIX}"


def attestation_path(review: Path) -> Path:
    return review.with_name(review.name.removesuffix(REVIEW_SUFFIX) + ATTESTATION_SUFFIX)


# --------------------------------------------------------------- freshness


def local_branch(repo: git.Repo, name: str) -> str:
    """`name` if it is a local branch; rowgate never fetches, so a branch that exists
    only as a remote-tracking ref is the user's to create."""
    if name in repo.heads:
        return name
    tracking = [r.name for r in repo.refs if isinstance(r, git.RemoteReference)
                and r.remote_head == name]
    hint = f" (create it: git branch {name} {tracking[0]})" if tracking else ""
    raise RepoError(f"{repo.working_dir}: no local branch {name}{hint}")


def freshness(repo: git.Repo, subject: Subject, into: str, row_sha256: str,
              recorded_row_sha256: str, row_file: Path) -> Freshness:
    """What moved since sealing, each as one `stale: …` line."""
    where = repo.working_dir
    moved: list[str] = []
    head = base = ""
    try:
        commit = repo.commit(subject.commit)
    except (ValueError, git.BadName):
        commit = None
        moved.append(f"stale: subject commit {subject.commit[:12]} is not in {where}")
    if subject.branch == "(detached)":
        head = repo.head.commit.hexsha
        label = "HEAD"
    elif subject.branch in repo.heads:
        head = repo.heads[subject.branch].commit.hexsha
        label = f"branch {subject.branch}"
    else:
        label = ""
        moved.append(f"stale: branch {subject.branch} does not exist in {where}")
    if label and head != subject.commit:
        moved.append(f"stale: {label} moved from {subject.commit[:12]} to {head[:12]}")
    if commit is not None:
        base = default_base(repo, commit, local_branch(repo, into)) or ""
        if base != subject.base:
            moved.append(f"stale: base moved: merge-base with {into} is now "
                         f"{base[:12] or '(none)'}, the bundle recorded {subject.base[:12]}")
    if row_sha256 != recorded_row_sha256:
        moved.append(f"stale: row file {row_file} changed: sha256 {row_sha256[:12]} now, the "
                     f"bundle recorded {recorded_row_sha256[:12]}")
    return Freshness(branch_head=head, merge_base=base, row_sha256=row_sha256, moved=moved)


# -------------------------------------------------------------- re-derivation


def _normal(result: GateResult) -> dict:
    """The comparable part of a result, as it round-trips through JSON."""
    data = json.loads(result.model_dump_json())
    return {k: data[k] for k in ("status", "reason", "metrics", "cells")}


def _first_difference(sealed: dict, derived: dict) -> str:
    for key in ("status", "reason"):
        if sealed[key] != derived[key]:
            return f"{key}: sealed {sealed[key]!r}, re-derived {derived[key]!r}"
    for key in ("metrics", "cells"):
        names = sorted(set(sealed[key]) | set(derived[key]))
        for name in names:
            a, b = sealed[key].get(name, "(absent)"), derived[key].get(name, "(absent)")
            if a != b:
                return f"{key}.{name}: sealed {a!r}, re-derived {b!r}"
    return "differs"


def rederive(row: Row, bundle: Bundle, sealed: GateResult) -> tuple[GateResult, str, str]:
    """(result to evaluate, consistency, detail) for one sealed PASS/FAIL gate."""
    spec = row.gate(sealed.gate_id)
    artifacts = bundle.path / "artifacts" / sealed.gate_id
    try:
        derived = gate_for(spec.kind).derive(row, spec, artifacts)
    except GateError as exc:
        why = f"cannot be re-derived from its artifacts: {exc.diagnostics()}"
        return sealed, "inconsistent", why
    except (ValueError, KeyError, TypeError, IndexError, OSError) as exc:
        # Signed artifacts can still be malformed (a buggy or hostile producer); a
        # derive that trips on them yields no evidence, not a crashed review.
        why = f"cannot be re-derived from its artifacts: {type(exc).__name__}: {exc}"
        return sealed, "inconsistent", why
    again = sealed.model_copy(update={"status": derived.status, "reason": derived.reason,
                                      "metrics": derived.metrics, "cells": derived.cells})
    again = GateResult.model_validate_json(again.model_dump_json())
    a, b = _normal(sealed), _normal(again)
    if a != b:
        return again, "inconsistent", _first_difference(a, b)
    return again, "consistent", ""


# --------------------------------------------------------------- evaluation


@dataclass
class Evaluation:
    gates: list[GateCheck] = field(default_factory=list)
    criteria: list[CriterionRow] = field(default_factory=list)
    stops: list[StopRow] = field(default_factory=list)
    admissions: list[Admission] = field(default_factory=list)
    pending: list[PendingItem] = field(default_factory=list)
    rejects: list[str] = field(default_factory=list)
    pendings: list[str] = field(default_factory=list)


def _values(result: GateResult, metric: str, cells: list[str]
            ) -> tuple[dict[str, MetricValue], str]:
    """Measured values a criterion or stop looks at, and what is missing ("" if nothing)."""
    if not cells:
        if metric not in result.metrics:
            return {}, f"gate {result.gate_id} has no gate-level metric {metric!r}"
        return {GATE_LEVEL: result.metrics[metric]}, ""
    names = sorted(result.cells) if cells == ["*"] else cells
    if not names:
        return {}, f"gate {result.gate_id} recorded no cells"
    out: dict[str, MetricValue] = {}
    for cell in names:
        if metric not in result.cells.get(cell, {}):
            return out, f"gate {result.gate_id} has no {metric!r} in cell {cell!r}"
        out[cell] = result.cells[cell][metric]
    return out, ""


def _number(value: MetricValue) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _holding(comparison: Comparison, threshold: float, values: dict[str, MetricValue]
             ) -> tuple[list[str], list[str], str]:
    """(cells that hold, cells that do not, a non-number problem or "")."""
    holds, fails = [], []
    for cell, value in values.items():
        number = _number(value)
        if number is None:
            return holds, fails, f"cell {cell}: {value!r} is not a number"
        (holds if not math.isnan(number) and comparison.holds(number, threshold)
         else fails).append(cell)
    return holds, fails, ""


def _arch_problem(c: Criterion, row: Row, result: GateResult) -> str:
    """Why a result cannot satisfy a criterion bound to an arch ("" if it can).

    The binding is the criterion's `arch`, else the row's target arch. A result
    that recorded no arch (host checks) is bound only by an explicit `arch`."""
    arch = c.arch or row.target.arch
    if result.stand_in:
        return f"measured on stand-in {result.arch or '?'}; criterion is bound to {arch}"
    if result.arch and result.arch != arch:
        return f"measured on {result.arch}; criterion is bound to {arch}"
    if c.arch and not result.arch:
        return f"gate {result.gate_id} recorded no arch; criterion is bound to {arch}"
    return ""


def evaluate_criterion(c: Criterion, row: Row, result: GateResult | None) -> CriterionRow:
    def row_(outcome: Outcome, detail: str = "", measured=None) -> CriterionRow:
        return CriterionRow(id=c.id, gate=c.gate, metric=c.metric, comparison=c.comparison,
                            threshold=c.threshold, cells=c.cells, arch=c.arch or row.target.arch,
                            measured=measured or {}, outcome=outcome, detail=detail)

    if result is None:
        return row_(Outcome.MISSING, f"no result for gate {c.gate}")
    if result.status is Status.PENDING:
        return row_(Outcome.PENDING, f"gate {c.gate} PENDING: {result.reason}")
    if result.status is Status.ERROR:
        return row_(Outcome.ERROR, f"gate {c.gate} ERROR: {result.reason}")
    if why := _arch_problem(c, row, result):
        return row_(Outcome.NOT_SATISFIABLE, why)
    values, missing = _values(result, c.metric, c.cells)
    if missing:
        return row_(Outcome.MISSING, missing, values)
    _, fails, bad = _holding(c.comparison, c.threshold, values)
    if bad:
        return row_(Outcome.MISSING, bad, values)
    if fails:
        shown = ", ".join(f"{cell}={values[cell]}" for cell in fails[:4])
        return row_(Outcome.FAIL, f"{c.metric} {c.comparison.symbol} {c.threshold:g} does not "
                                  f"hold: {shown}", values)
    return row_(Outcome.PASS, "", values)


def evaluate_stop(s: StopCondition, result: GateResult | None) -> StopRow:
    def row_(triggered: bool | None, detail: str, measured=None) -> StopRow:
        return StopRow(id=s.id, gate=s.gate, metric=s.metric, comparison=s.comparison,
                       threshold=s.threshold, cells=s.cells, action=s.action, says=s.says,
                       measured=measured or {}, triggered=triggered, detail=detail)

    if result is None:
        return row_(None, f"no result for gate {s.gate}")
    if result.status in (Status.PENDING, Status.ERROR):
        return row_(None, f"gate {s.gate} {result.status.value}: {result.reason}")
    values, missing = _values(result, s.metric, s.cells)
    if missing:
        return row_(None, f"cannot be evaluated: {missing}", values)
    holds, _, bad = _holding(s.comparison, s.threshold, values)
    if bad:
        return row_(None, f"cannot be evaluated: {bad}", values)
    if holds:
        shown = ", ".join(f"{cell}={values[cell]}" for cell in holds[:4])
        return row_(True, f"{s.metric} {s.comparison.symbol} {s.threshold:g}: {shown}", values)
    return row_(False, "", values)


def _admissions(row: Row, stops: list[StopRow], results: dict[str, GateResult]
                ) -> list[Admission]:
    """Implementation admission per admitting gate (stop-implementation conditions and
    gates whose `admitted_by` names it)."""
    dependents: dict[str, list[str]] = {}
    for spec in row.gates:
        if getattr(spec, "admitted_by", ""):
            dependents.setdefault(spec.admitted_by, []).append(spec.id)
    for s in stops:
        if s.action is StopAction.STOP_IMPLEMENTATION:
            dependents.setdefault(s.gate, [])
    out = []
    for gate, deps in dependents.items():
        conds = [s for s in stops if s.gate == gate and s.action is StopAction.STOP_IMPLEMENTATION]
        result = results.get(gate)
        if hit := [s for s in conds if s.triggered]:
            admitted, reason = False, f"stop {hit[0].id}: {hit[0].says} ({hit[0].detail})"
        elif result is None or result.status is not Status.PASS:
            state = ("has no result" if result is None
                     else f"is {result.status.value}: {result.reason}")
            admitted = False if result is not None and result.status is Status.FAIL else None
            reason = f"admitting gate {gate} {state}"
        elif undecided := [s for s in conds if s.triggered is None]:
            admitted, reason = None, f"stop {undecided[0].id} {undecided[0].detail}"
        else:
            admitted, reason = True, f"gate {gate} shows no stop-implementation condition"
        out.append(Admission(gate=gate, admitted=admitted, reason=reason, dependents=deps))
    return out


def _check_gates(row: Row, bundle: Bundle, ev: Evaluation) -> dict[str, GateResult]:
    """Re-derive each sealed gate; returns the results to evaluate criteria on."""
    sealed_ids = [g.gate_id for g in bundle.manifest.gates]
    for spec in row.gates:
        if spec.id not in sealed_ids:
            ev.rejects.append(f"inconsistent: row gate {spec.id} has no result in the bundle")
    results: dict[str, GateResult] = {}
    pending_notes = {p.gate: p.until for p in row.pending}
    for summary in bundle.manifest.gates:
        sealed = bundle.gate_result(summary.gate_id)
        try:
            spec = row.gate(sealed.gate_id)
        except KeyError:
            ev.rejects.append(f"inconsistent: bundle gate {sealed.gate_id} is not in the row")
            continue
        if spec.kind != sealed.kind:
            ev.rejects.append(f"inconsistent: gate {spec.id} is kind {spec.kind} in the row, "
                              f"{sealed.kind} in the bundle")
            continue
        result, state, detail = _gate_state(row, bundle, sealed)
        results[sealed.gate_id] = result
        ev.gates.append(GateCheck(gate_id=result.gate_id, kind=result.kind, status=result.status,
                                  reason=result.reason, required=spec.required, arch=result.arch,
                                  stand_in=result.stand_in, rederived=state, detail=detail))
        if state == "inconsistent":
            ev.rejects.append(f"inconsistent: gate {sealed.gate_id}: {detail}")
        if result.status is Status.ERROR:
            ev.rejects.append(f"gate {result.gate_id} ERROR: {result.reason}")
        elif result.status is Status.FAIL and spec.required:
            ev.rejects.append(f"gate {result.gate_id} FAIL: {result.reason}")
        elif result.status is Status.PENDING:
            ev.pending.append(PendingItem(gate=result.gate_id, reason=result.reason,
                                          until=pending_notes.get(result.gate_id, "")))
            ev.pendings.append(f"gate {result.gate_id} PENDING: {result.reason}")
    return results


def _gate_state(row: Row, bundle: Bundle, sealed: GateResult) -> tuple[GateResult, str, str]:
    # PENDING gates never ran and ERROR gates broke: there is nothing to re-derive,
    # but a summary that carries numbers anyway did not come from run_gate.
    if sealed.status in (Status.PENDING, Status.ERROR):
        if sealed.metrics or sealed.cells:
            return sealed, "inconsistent", f"a {sealed.status.value} gate carries metrics"
        return sealed, "not re-derivable", f"{sealed.status.value}: nothing was measured"
    return rederive(row, bundle, sealed)


def evaluate(row: Row, bundle: Bundle) -> Evaluation:
    """Re-derive every gate of the bundle, then judge the row on the re-derived results."""
    ev = Evaluation()
    results = _check_gates(row, bundle, ev)
    judge(row, results, ev)
    return ev


def judge(row: Row, results: dict[str, GateResult], ev: Evaluation) -> None:
    """Criteria, stop conditions and implementation admission; adds to `ev`."""
    for c in row.criteria:
        line = evaluate_criterion(c, row, results.get(c.gate))
        ev.criteria.append(line)
        if line.outcome in (Outcome.FAIL, Outcome.MISSING):
            ev.rejects.append(f"criterion {c.id}: {line.detail}")
        elif line.outcome is Outcome.NOT_SATISFIABLE:
            ev.pendings.append(f"criterion {c.id} not satisfiable here: {line.detail}")
    for s in row.stop_conditions:
        line = evaluate_stop(s, results.get(s.gate))
        ev.stops.append(line)
        if s.action is not StopAction.REFUSE:
            continue
        if line.triggered:
            ev.rejects.append(f"stop {s.id}: {s.says} ({line.detail})")
        elif line.triggered is None and results.get(s.gate) is not None and \
                results[s.gate].status in (Status.PASS, Status.FAIL):
            ev.rejects.append(f"stop {s.id} {line.detail}")
    ev.admissions = _admissions(row, ev.stops, results)
    for adm in ev.admissions:
        for dep in adm.dependents:
            res = results.get(dep)
            if res is not None and res.status in (Status.PASS, Status.FAIL) and not adm.admitted:
                ev.rejects.append(f"implementation not admitted: gate {dep} has results but "
                                  f"{adm.reason}")


def verdict_of(rejects: list[str], pendings: list[str]) -> tuple[Verdict, str]:
    for verdict, reasons in ((Verdict.REJECT, rejects), (Verdict.PENDING, pendings)):
        if reasons:
            more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
            return verdict, f"{verdict.value}: {reasons[0]}{more}"
    return Verdict.APPROVE, "APPROVE"


# ----------------------------------------------------------------- review


@dataclass(frozen=True)
class ReviewResult:
    record: ReviewRecord
    path: Path


def _row_for(bundle: Bundle, row_file: Path | None) -> LoadedRow:
    ref = bundle.manifest.row
    if row_file is None:
        recorded = Path(ref.file)
        # relative to the rowgate checkout that gated; here, this checkout or the cwd
        places = [recorded] if recorded.is_absolute() else [CHECKOUT / recorded,
                                                            Path.cwd() / recorded]
        row_file = next((p for p in places if p.is_file()), None)
        if row_file is None:
            raise UsageError(f"row file {ref.file} (recorded in the bundle) not found here: "
                             f"pass --row FILE")
    loaded = load_row(row_file)
    if loaded.row.id != ref.id:
        raise UsageError(f"--row {row_file}: row {loaded.row.id}, but the bundle is for {ref.id}")
    return loaded


def _fresh_reviewer(reviewer: SignerIdentity, bundle_signer: SignerIdentity) -> None:
    if (reviewer.kind, reviewer.id) == (bundle_signer.kind, bundle_signer.id):
        raise UsageError(f"fresh review refused: the reviewer {reviewer} is the identity that "
                         f"signed the bundle; review with a different key or identity")


def _check_reviews_dir(reviews_dir: Path, repo: git.Repo) -> None:
    """The review never writes into the subject repo unless that is where it was run."""
    work = Path(repo.working_dir).resolve()
    inside = reviews_dir.resolve().is_relative_to(work)
    if inside and not Path.cwd().resolve().is_relative_to(work):
        raise UsageError(f"--reviews {reviews_dir}: inside the subject repo {work}; the review "
                         f"does not write there (run it from the repo or pick another dir)")


def review(bundle_path: Path, repo_path: Path, row_file: Path | None, verifier: Verifier,
           signer: Signer, reviews_dir: Path) -> ReviewResult:
    """Review one bundle and write the signed record."""
    with open_repo(repo_path) as repo:  # closing ends git's persistent cat-file processes
        return _review(bundle_path, repo, row_file, verifier, signer, reviews_dir)


def _review(bundle_path: Path, repo: git.Repo, row_file: Path | None, verifier: Verifier,
            signer: Signer, reviews_dir: Path) -> ReviewResult:
    _check_reviews_dir(reviews_dir, repo)
    try:
        bundle = Bundle.open(bundle_path)
    except VerificationError as exc:
        return _unreadable(Path(bundle_path), exc, verifier, signer, reviews_dir)
    m = bundle.manifest
    _fresh_reviewer(signer.identity, m.signer)
    ref = BundleRef(id=bundle.id, path=str(bundle.path), signer=m.signer,
                    verifier=BundleVerifierRef.of(verifier), status=m.status, created=m.created)
    base = dict(rowgate_version=__version__, created=now(), row_id=m.row.id, bundle=ref,
                subject=m.subject, reviewer=signer.identity)
    try:
        bundle.verify(verifier)
    except VerificationError as exc:
        reason = f"invalid bundle: {exc.diagnostics()}"
        return _finish(ReviewRecord(verdict=Verdict.REJECT, summary=f"REJECT: {reason}",
                                    reasons=[reason], **base), signer, reviews_dir)
    loaded = _row_for(bundle, row_file)
    fresh = freshness(repo, m.subject, loaded.row.review.merge_into, loaded.sha256, m.row.sha256,
                      loaded.path)
    rejects = list(fresh.moved)
    ev = Evaluation()
    if loaded.sha256 == m.row.sha256:  # criteria of another row text say nothing
        ev = evaluate(loaded.row, bundle)
    rejects += ev.rejects
    verdict, summary = verdict_of(rejects, ev.pendings)
    record = ReviewRecord(verdict=verdict, summary=summary, reasons=rejects + ev.pendings,
                          freshness=fresh, gates=ev.gates, criteria=ev.criteria,
                          stop_conditions=ev.stops, implementation=ev.admissions,
                          pending=ev.pending, **base)
    return _finish(record, signer, reviews_dir)


def _unreadable(path: Path, exc: VerificationError, verifier: Verifier, signer: Signer,
                reviews_dir: Path) -> ReviewResult:
    """A bundle whose manifest cannot be read is still REJECTed on the record, filed
    under the names its directory claims (ROW/BUNDLE-ID)."""
    path = path.absolute()
    if not (re.fullmatch(ROW_ID, path.parent.name) and re.fullmatch(BUNDLE_ID, path.name)):
        raise exc
    claimed = None
    if (path / SIGNATURE_FILE).is_file():
        try:
            claimed = signature_identity(path / SIGNATURE_FILE)
        except VerificationError:
            claimed = None
    if claimed is not None:
        _fresh_reviewer(signer.identity, claimed)
    reason = f"invalid bundle: {exc.diagnostics()}"
    record = ReviewRecord(rowgate_version=__version__, created=now(), verdict=Verdict.REJECT,
                          summary=f"REJECT: {reason}", reasons=[reason], row_id=path.parent.name,
                          bundle=BundleRef(id=path.name, path=str(path), signer=claimed,
                                           verifier=BundleVerifierRef.of(verifier)),
                          reviewer=signer.identity)
    return _finish(record, signer, reviews_dir)


def _finish(record: ReviewRecord, signer: Signer, reviews_dir: Path) -> ReviewResult:
    if not re.fullmatch(ROW_ID, record.row_id):
        raise UsageError(f"bundle row id {record.row_id!r} is not a row id")
    if not re.fullmatch(BUNDLE_ID, record.bundle.id):
        # the record is filed under the bundle's name: refuse names that are not ids
        raise VerificationError(f"{record.bundle.path}: directory name is not a bundle id")
    path = review_path(reviews_dir, record.row_id, record.bundle.id)
    write_record(record, "review", path)
    sign_record(signer, path)
    return ReviewResult(record=record, path=path)


VERDICT_EXIT = {Verdict.APPROVE: ExitCode.OK, Verdict.REJECT: ExitCode.FAILED,
                Verdict.PENDING: ExitCode.PENDING}


def describe(record: ReviewRecord) -> list[str]:
    """Plain lines for a terminal: the summary, then the per-criterion table."""
    lines = [f"{record.row_id} bundle {record.bundle.id}: {record.verdict.value}"]
    lines += [f"  {reason}" for reason in record.reasons]
    for c in record.criteria:
        measured = ", ".join(f"{k}={v}" for k, v in c.measured.items()) or "-"
        # a pending criterion's detail repeats its gate's reason, listed above
        detail = f" ({c.detail})" if c.detail and c.outcome is not Outcome.PENDING else ""
        lines.append(f"  criterion {c.id}: {c.outcome.value}: {c.gate}.{c.metric} "
                     f"{c.comparison.symbol} {c.threshold:g} [{c.arch}] measured {measured}"
                     f"{detail}")
    for a in record.implementation:
        state = {True: "admitted", False: "not admitted", None: "undecided"}[a.admitted]
        lines.append(f"  implementation gated on {a.gate}: {state}: {a.reason}")
    return lines


def load_review(path: Path) -> ReviewRecord:
    return read_record(ReviewRecord, "review", path)


# ------------------------------------------------------------- attestation


def attest(review_file: Path, signer: Signer, note: str = "") -> Path:
    """The operator's signed statement that the bundle's evidence came from the
    hardware its provenance names, bound to the bundle id and the review's digest.

    The operator is the identity that produced (signed) the bundle: it is the one
    that was at the hardware. Its signature on the bundle is checked first."""
    if not review_file.name.endswith(REVIEW_SUFFIX):
        raise UsageError(f"{review_file}: not a review record (expected ROW/BUNDLE-ID"
                         f"{REVIEW_SUFFIX})")
    record = load_review(review_file)
    bundle = Bundle.open(Path(record.bundle.path))
    if bundle.id != record.bundle.id:
        raise UsageError(f"{review_file}: reviews bundle {record.bundle.id}, but "
                         f"{record.bundle.path} is bundle {bundle.id}")
    m = bundle.manifest
    if (signer.identity.kind, signer.identity.id) != (m.signer.kind, m.signer.id):
        raise UsageError(f"operator attestation refused: it must be signed by the bundle's "
                         f"signer {m.signer} (the operator of the hardware), not {signer.identity}")
    bundle.verify(signer.verifier())
    gpus = ", ".join(f"{g.name} ({g.arch})" for g in m.provenance.gpus) or "no GPU"
    statement = (f"I operated the hardware that produced bundle {bundle.id} of row {m.row.id}: "
                 f"host {m.provenance.host.hostname} ({m.provenance.host.cpu}), {gpus}; the "
                 f"evidence in it was measured there, for commit {m.subject.commit}.")
    attestation = Attestation(rowgate_version=__version__, created=now(), row_id=m.row.id,
                              bundle_id=bundle.id, review_file=review_file.name,
                              review_sha256=file_sha256(review_file), operator=signer.identity,
                              statement=statement, note=note,
                              hardware=Hardware(host=m.provenance.host, gpus=m.provenance.gpus))
    path = attestation_path(review_file)
    write_record(attestation, "attestation", path)
    sign_record(signer, path)
    return path


def load_attestation(path: Path) -> Attestation:
    return read_record(Attestation, "attestation", path)
