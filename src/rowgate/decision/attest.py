"""The operator attestation: the bundle signer's signed statement that the evidence came
from the hardware its provenance names, bound to the bundle id and the review's digest.
Filed beside the review as `BUNDLE-ID.attestation.json` + `.attestation.sigstore.json`."""

from __future__ import annotations

from pathlib import Path

from rowgate import __version__
from rowgate.decision.record_files import file_record, file_sha256, now, read_record
from rowgate.decision.review import load_review
from rowgate.errors import UsageError
from rowgate.records.attestation import ATTESTATION_SUFFIX, Attestation, Hardware
from rowgate.records.review import REVIEW_SUFFIX
from rowgate.seal.bundle import Bundle
from rowgate.seal.signing import Signer


def attestation_path(review: Path) -> Path:
    return review.with_name(review.name.removesuffix(REVIEW_SUFFIX) + ATTESTATION_SUFFIX)


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
    file_record(attestation, "attestation", path, signer, "the attestation was not written")
    return path


def load_attestation(path: Path) -> Attestation:
    return read_record(Attestation, "attestation", path)
