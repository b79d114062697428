"""Build a `Report` from one sealed bundle: verification, review record, row, gates.

Only reading happens here: the bundle's files, the review record filed for
it, and the row file it names (when this rowgate checkout has it). A bundle
that does not verify is still reported, marked as such, so a reviewer sees
why it was refused.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import ValidationError

from rowgate.errors import EvidenceError, RowError, UsageError, VerificationError
from rowgate.records.canonical import strict_loads
from rowgate.records.gate_result import GateResult
from rowgate.records.review import REVIEW_SUFFIX
from rowgate.records.status import Status
from rowgate.report.model import PendingItem, Report, ReviewSummary, Table, Verification
from rowgate.report.sections import section_for
from rowgate.report.tables import fmt, gates_table, metric_columns, table
from rowgate.report.timing import time_figure, time_table
from rowgate.rows.row import Row, load_row, recorded_places, rows_dirs
from rowgate.seal import signing
from rowgate.seal.bundle import Bundle


def verify(bundle: Bundle, key: Path | None = None, identity: str | None = None,
           issuer: str | None = None) -> Verification:
    """Verify as `rowgate verify` does; a failure becomes part of the report.

    Raises `UsageError` only for verification options the user gave that are
    unusable (an unreadable --key, --identity without --issuer).
    """
    explicit = key is not None or identity is not None or issuer is not None
    against = ""
    try:
        verifier = signing.verifier_for(key, identity, issuer,
                                        bundle.path / signing.SIGNATURE_FILE)
        if isinstance(verifier, signing.KeyVerifier):
            against = f"the key {verifier.public_key}"
        else:
            against = f"the identity {identity} issued by {issuer}"
        if not explicit:
            # `rowgate verify` refuses this: nobody named whom to trust. The page says
            # what matched, and never that the signature is verified.
            against = (f"the implicit local key {getattr(verifier, 'public_key', '?')} (no "
                       f"--key given: pass the signer's key or identity to verify)")
        who = bundle.verify(verifier)
    except VerificationError as exc:
        return Verification(False, f"{exc.diagnostics()} (checked against {against})"
                            if against else exc.diagnostics())
    except UsageError as exc:
        if explicit:
            raise
        return Verification(False, f"not checked: {exc.diagnostics()}")
    return Verification(explicit, f"signed by {who}, checked against {against}",
                        implicit=not explicit)


def review_path(reviews_dir: Path, bundle: Bundle) -> Path:
    return reviews_dir / bundle.manifest.row.id / f"{bundle.id}{REVIEW_SUFFIX}"


REVIEW_TABLES = (("criteria", "criteria", "outcome"), ("stop_conditions", "stop conditions", None),
                 ("implementation", "implementation admission", None),
                 ("gates", "gate checks (re-derived)", "status"))
"""(record key, table title, status column) of the review record's lists shown."""


def _flat(value: object) -> object:
    """A record field as one table cell: nested tables become `k=v, …`."""
    if isinstance(value, dict):
        return ", ".join(f"{k}={fmt(v)}" for k, v in value.items()) or "—"
    if isinstance(value, list):
        return ", ".join(fmt(v) for v in value) or "—"
    return value


COLUMN_ORDER = ("id", "gate_id", "gate", "kind", "metric", "comparison", "threshold", "cells",
                "arch", "stand_in", "required", "measured", "status", "outcome", "triggered",
                "admitted", "action", "rederived", "dependents")
"""Record fields first in this order (records are stored with sorted keys); the rest,
long texts such as `reason`, `detail`, `says`, after them."""


def _ordered(columns: list[str]) -> list[str]:
    known = [c for c in COLUMN_ORDER if c in columns]
    return known + [c for c in columns if c not in known]


def _records(title: str, records: object, status: str | None) -> Table | None:
    if not isinstance(records, list) or not records:
        return None
    records = [r for r in records if isinstance(r, dict)]
    columns = _ordered(metric_columns(records))
    return table(title, columns, ([_flat(r.get(c)) for c in columns] for r in records),
                 columns.index(status) if status in columns else None)


def _unreadable(path: Path, why: str) -> ReviewSummary:
    return ReviewSummary(path=str(path), verdict="UNREADABLE", reason=why)


def read_review(path: Path) -> ReviewSummary | None:
    """The review record at `path` as `rowgate review` writes it (`review.ReviewRecord`),
    read tolerantly so the page still renders a record of another rowgate version.
    None when no record is filed."""
    if not path.is_file():
        return None
    try:
        doc = strict_loads(path.read_bytes(), path.name)  # a verdict said twice is no verdict
    except OSError as exc:
        return _unreadable(path, f"review record is not JSON: {exc}")
    except VerificationError as exc:
        return _unreadable(path, f"review record unreadable: {exc.diagnostics()}")
    if not isinstance(doc, dict) or not isinstance(doc.get("verdict"), str):
        return _unreadable(path, "review record has no verdict")
    reasons = tuple(str(r) for r in doc.get("reasons") or [] if r)
    pending = tuple(PendingItem("review", str(p.get("gate", "—")), str(p.get("reason", "")),
                                str(p.get("until", "")))
                    for p in doc.get("pending") or [] if isinstance(p, dict))
    reviewer = doc.get("reviewer")
    if isinstance(reviewer, dict) and isinstance(reviewer.get("id"), str):
        issuer = reviewer.get("issuer")
        reviewer = f"{reviewer['id']} ({issuer})" if issuer else reviewer["id"]
    signature = path.with_name(path.name.removesuffix(".json") + ".sigstore.json")
    tables = (_records(title, doc.get(key), status) for key, title, status in REVIEW_TABLES)
    return ReviewSummary(
        path=str(path), verdict=doc["verdict"].upper(),
        reason=str(doc.get("summary") or (reasons[0] if reasons else "")), reasons=reasons,
        reviewer=fmt(_flat(reviewer)) if reviewer else "",
        signature=signature.name if signature.is_file() else "no signature file beside it",
        tables=tuple(t for t in tables if t), pending=pending)


def find_row(bundle: Bundle, checkout: Path | None = None) -> tuple[Row | None, str]:
    """The row the bundle names, if it is here (under `checkout`, default the cwd) with
    the same bytes."""
    ref = bundle.manifest.row
    path = recorded_places(ref.file, checkout or Path.cwd())[0]
    if not path.is_file():  # not where it was gated from: where rows are looked up by id
        path = next((d / f"{ref.id}.toml" for d in rows_dirs(None)
                     if (d / f"{ref.id}.toml").is_file()), path)
    try:
        data = path.read_bytes()
    except OSError:
        return None, f"row file {ref.file} is not in this checkout, nor row {ref.id} where " \
                     f"rows are looked up"
    if hashlib.sha256(data).hexdigest() != ref.sha256:
        return None, f"row file {ref.file} here differs from the one gated (sha256 mismatch)"
    try:
        return load_row(path).row, f"row file {ref.file} matches the gated digest"
    except RowError as exc:
        return None, f"row file {ref.file} does not load: {exc.problems[0]}"


def _results(bundle: Bundle) -> list[GateResult]:
    try:
        return bundle.results()
    except (OSError, ValidationError) as exc:
        raise EvidenceError(f"{bundle.path}: a gate result cannot be read ({exc})") from exc


def _facts(bundle: Bundle, verification: Verification) -> tuple[tuple[str, str], ...]:
    m = bundle.manifest
    s, host = m.subject, m.provenance.host
    gpus = ", ".join(f"{g.name} ({g.arch})" for g in m.provenance.gpus) or "none"
    return (
        ("subject", f"{s.repo} @ {s.branch} {s.commit}"),
        ("tree / base", f"{s.tree} / {s.base} ({s.base_branch}){' DIRTY' if s.dirty else ''}"),
        ("signer", str(m.signer)),
        ("signature", ("verified: " if verification.verified else
                       "matches an implicit key only: " if verification.implicit else
                       "NOT VERIFIED: ") + verification.detail),
        ("sealed", f"{m.created} by rowgate {m.rowgate_version}"),
        ("host", f"{host.hostname}: {host.os}, {host.cpu}, {host.cores} cores, "
                 f"Python {host.python}"),
        ("GPUs", gpus),
        ("sandbox", _sandbox_fact(bundle.results())),
    )


def _sandbox_fact(results: list[GateResult]) -> str:
    """How the subject's steps ran: `UNCONFINED` first, naming the gates and the reason."""
    off = [r for r in results if r.sandbox is not None and not r.sandbox.confined]
    if off:
        return "UNCONFINED: " + "; ".join(f"{r.gate_id} (sandbox off: {s.reason})"
                                          for r in off if (s := r.sandbox) is not None)
    on = [(r.gate_id, s) for r in results if (s := r.sandbox) is not None]
    if not on:
        return "no subject steps recorded"
    first = on[0][1]
    return (f"{first.tool} {first.version} (profile {first.profile_sha256[:12]}) for "
            f"{', '.join(gate for gate, _ in on)}")


def _pending(results: list[GateResult], row: Row | None,
             review: ReviewSummary | None) -> tuple[PendingItem, ...]:
    items = [PendingItem("gate", r.gate_id, r.reason) for r in results
             if r.status is Status.PENDING]
    if row is not None:
        items += [PendingItem("row", p.gate, p.reason, p.until) for p in row.pending]
    if review is not None:  # what the review adds; a gate's own reason is listed once
        known = {(p.gate, p.reason) for p in items}
        items += [p for p in review.pending if (p.gate, p.reason) not in known]
    return tuple(items)


def _spec(row: Row | None, gate_id: str) -> object | None:
    try:
        return row.gate(gate_id) if row is not None else None
    except KeyError:
        return None


def build(bundle: Bundle, verification: Verification, review: ReviewSummary | None = None,
          row: Row | None = None, row_note: str = "") -> Report:
    """The page for one bundle. Reads the bundle's files; computes no verdict."""
    m = bundle.manifest
    results = _results(bundle)
    info = set(m.informational())
    required = {g.gate_id: g.gate_id not in info for g in m.gates}
    return Report(
        bundle_id=bundle.id, bundle_path=str(bundle.path), row_id=m.row.id,
        row_title=row.title if row else "", row_file=m.row.file, row_sha256=m.row.sha256,
        row_note=row_note, created=m.created, rowgate_version=m.rowgate_version,
        status=m.status, signer=str(m.signer), verification=verification, review=review,
        facts=_facts(bundle, verification),
        gates=gates_table(results, required),
        time=time_table(results), time_figure=time_figure(results),
        sections=tuple(section_for(r, bundle.path, _spec(row, r.gate_id),
                                   required.get(r.gate_id, True))
                       for r in results),
        pending=_pending(results, row, review))


def report_for(bundle_path: Path, *, key: Path | None = None, identity: str | None = None,
               issuer: str | None = None, reviews_dir: Path | None = None) -> Report:
    """Open, verify, find the review record and the row, and build the page."""
    bundle = Bundle.open(bundle_path)
    verification = verify(bundle, key, identity, issuer)
    review = read_review(review_path(reviews_dir or Path.cwd() / "reviews", bundle))
    row, note = find_row(bundle)
    return build(bundle, verification, review, row, note)

