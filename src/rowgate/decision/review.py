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
How a single file is signed: `rowgate.decision.record_files`; the record models:
`rowgate.records.review`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import git

from rowgate import __version__
from rowgate.decision.change import already_present, empty_change
from rowgate.decision.criteria import Evaluation, judge, verdict_of
from rowgate.decision.freshness import freshness
from rowgate.decision.record_files import file_record, now, read_record
from rowgate.decision.rederive import check_gates
from rowgate.errors import UsageError, VerificationError
from rowgate.records.identity import SignerIdentity
from rowgate.records.ids import BUNDLE_ID, ROW_ID
from rowgate.records.review import REVIEW_SUFFIX, BundleRef, BundleVerifierRef, ReviewRecord, Verdict
from rowgate.rows.row import LoadedRow, Row, load_row, recorded_places
from rowgate.seal.bundle import Bundle
from rowgate.seal.gitrepo import open_repo, target_branch
from rowgate.seal.signing import (
    SIGNATURE_FILE,
    KeyVerifier,
    Signer,
    SigstoreVerifier,
    Verifier,
    signature_identity,
)


def review_path(reviews_dir: Path, row_id: str, bundle_id: str) -> Path:
    return reviews_dir / row_id / f"{bundle_id}{REVIEW_SUFFIX}"


def verifier_ref(verifier: Verifier) -> BundleVerifierRef:
    """How `verifier` checks a bundle, as the review records it."""
    if isinstance(verifier, KeyVerifier):
        return BundleVerifierRef(kind="key", public_key_pem=verifier.public_pem.decode())
    if isinstance(verifier, SigstoreVerifier):
        return BundleVerifierRef(kind="sigstore", identity=verifier.identity.id,
                                 issuer=verifier.identity.issuer)
    raise UsageError(f"cannot record verifier {type(verifier).__name__}")


def bundle_verifier(ref: BundleVerifierRef) -> Verifier:
    """The verifier a review recorded for its bundle (merge and attestation use it again)."""
    if ref.kind == "sigstore":
        return SigstoreVerifier(ref.identity, ref.issuer)
    return KeyVerifier.of_pem(ref.public_key_pem.encode(), "the review record's bundle key")


def evaluate(row: Row, bundle: Bundle) -> Evaluation:
    """Re-derive every gate of the bundle, then judge the row on the re-derived results."""
    ev = Evaluation()
    results = check_gates(row, bundle, ev)
    judge(row, results, ev)
    return ev


@dataclass(frozen=True)
class ReviewResult:
    record: ReviewRecord
    path: Path


def _row_for(bundle: Bundle, row_file: Path | None) -> LoadedRow:
    ref = bundle.manifest.row
    if row_file is None:
        # relative to where the gate ran; here, the cwd (or a demo in this install)
        places = recorded_places(ref.file, Path.cwd())
        # the recorded path is the bundle's word: a FIFO or device there is refused, unread
        present = [p for p in places if os.path.lexists(p)]
        odd = [p for p in present if not p.is_file()]
        if odd:
            raise UsageError(f"row file {odd[0]} (recorded in the bundle): not a regular file")
        row_file = present[0] if present else None
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
                    verifier=verifier_ref(verifier), status=m.status, created=m.created)
    base = dict(rowgate_version=__version__, created=now(), row_id=m.row.id, bundle=ref,
                subject=m.subject, reviewer=signer.identity)
    try:
        bundle.verify(verifier)
    except VerificationError as exc:
        reason = f"invalid bundle: {exc.diagnostics()}"
        return _finish(ReviewRecord(verdict=Verdict.REJECT, summary=f"REJECT: {reason}",
                                    reasons=[reason], **base), signer, reviews_dir)
    loaded = _row_for(bundle, row_file)
    into = target_branch(repo, loaded.row.review.merge_into)
    fresh = freshness(repo, m.subject, into, loaded.sha256, m.row.sha256, loaded.path)
    present = already_present(repo, m.subject, into)
    if present:
        fresh = fresh.model_copy(update={"already_present": present})
    rejects = list(fresh.moved)
    empty = empty_change(repo, m.subject.commit, m.subject.base)
    if empty:  # whatever the gates said: there is nothing to review
        rejects.insert(0, empty)
    ev = Evaluation()
    if loaded.sha256 == m.row.sha256:  # criteria of another row text say nothing
        ev = evaluate(loaded.row, bundle)
    rejects += ev.rejects + unconfined(bundle, loaded.row.review.allow_unconfined)
    verdict, summary = verdict_of(rejects, ev.pendings)
    if present:
        summary += f" ({present})"
    record = ReviewRecord(verdict=verdict, summary=summary, reasons=rejects + ev.pendings,
                          freshness=fresh, gates=ev.gates, criteria=ev.criteria,
                          stop_conditions=ev.stops, implementation=ev.admissions,
                          pending=ev.pending, **base)
    return _finish(record, signer, reviews_dir)


def unconfined(bundle: Bundle, allowed: bool) -> list[str]:
    """A reject for each gate whose subject steps ran outside the sandbox, unless the row
    allows it (`review.allow_unconfined`): a subject's code could have written what that
    gate measured."""
    if allowed:
        return []
    return [f"{r.gate_id}: its subject steps ran unconfined (sandbox off: {r.sandbox.reason}); "
            f"the row does not allow it (review.allow_unconfined)"
            for r in bundle.results() if r.sandbox is not None and not r.sandbox.confined]


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
                                           verifier=verifier_ref(verifier)),
                          reviewer=signer.identity)
    return _finish(record, signer, reviews_dir)


def _finish(record: ReviewRecord, signer: Signer, reviews_dir: Path) -> ReviewResult:
    if not re.fullmatch(ROW_ID, record.row_id):
        raise UsageError(f"bundle row id {record.row_id!r} is not a row id")
    if not re.fullmatch(BUNDLE_ID, record.bundle.id):
        # the record is filed under the bundle's name: refuse names that are not ids
        raise VerificationError(f"{record.bundle.path}: directory name is not a bundle id")
    path = review_path(reviews_dir, record.row_id, record.bundle.id)
    file_record(record, "review", path, signer, "the review was not written")
    return ReviewResult(record=record, path=path)


def load_review(path: Path) -> ReviewRecord:
    return read_record(ReviewRecord, "review", path)
