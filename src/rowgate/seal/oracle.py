"""Oracle records: the pinned oracle's outputs on a row's workload, kept as signed
evidence; their format, sealing and verified reading (`rowgate.run.runner.record_oracle`
runs the oracle to make one).

Where the oracle cannot run beside the candidate (the H200 has no vLLM), the
tokens gate compares against a record made where it can. A record is a small
directory:

    oracle-records/ROW-ID/RECORD-ID/
      record.json               row, arm, engine (exact version), model digest,
                                the workload (passes) and its digest, and per
                                request the token ids and logprobs
      signature.sigstore.json   rowgate's signer over every file (model-signing)

`RECORD-ID` is the first 16 hex digits of sha256(record.json), so a record
cannot be edited without renaming it, and `load_record` refuses one whose
signature, name or workload digest does not check out.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rowgate.errors import EvidenceError, VerificationError
from rowgate.records.canonical import strict_loads
from rowgate.records.identity import SignerIdentity
from rowgate.rows.requests import Alternatives, Request, WorkloadPass, alternatives_from_json
from rowgate.seal import staging
from rowgate.seal.signing import SIGNATURE_FILE, Signer, Verifier

FORMAT = "rowgate-oracle-record/1"
RECORD_FILE = "record.json"
RECORD_ID_LEN = 16
DEFAULT_DIR = Path("oracle-records")


@dataclass(frozen=True)
class OracleOutput:
    id: str
    cell: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    alternatives: Alternatives = ()
    """Per token the oracle's most likely other tokens (records made before they were
    kept have none: a near-tie cannot be told from a mismatch against them)."""


@dataclass(frozen=True)
class OracleRecord:
    """A verified record (only `load_record` and `record_oracle` make one)."""

    path: Path
    record_id: str
    row_id: str
    row_sha256: str
    engine: dict[str, str]
    """The oracle engine's `describe()`: engine, distribution, exact version, dtype, …"""
    version: str
    model_digest: str
    workload_digest: str
    passes: tuple[WorkloadPass, ...]
    outputs: tuple[OracleOutput, ...]
    created: str
    sha256: str
    """sha256 of record.json (hex): what a bundle cites."""
    signer: SignerIdentity


def canonical_record(doc: dict[str, Any]) -> bytes:
    """record.json's bytes (its digest names the record; not the bundles' canonical form)."""
    return (json.dumps(doc, sort_keys=True, indent=1) + "\n").encode()


def seal_record(row_dir: Path, data: bytes, signer: Signer) -> Path:
    """Sign `data` as a record under `row_dir/RECORD-ID/` and publish it whole."""
    record_id = hashlib.sha256(data).hexdigest()[:RECORD_ID_LEN]
    final = row_dir / record_id
    if final.exists():
        raise EvidenceError(f"oracle record {final} already exists")
    row_dir.mkdir(parents=True, exist_ok=True)
    staging.sweep(row_dir)
    holder = staging.Holder(row_dir)
    try:
        named = holder.path / record_id  # the signature covers the directory by its name
        named.mkdir()
        (named / RECORD_FILE).write_bytes(data)
        signer.sign(named, named / SIGNATURE_FILE, ignore=[SIGNATURE_FILE])
        staging.freeze(named)
        staging.publish(named, final, "oracle record")
    finally:
        holder.close()
    return final


def _default_verifier(signature: Path) -> Verifier:
    from rowgate.seal.signing import verifier_for

    return verifier_for(None, None, None, signature)


def load_record(path: Path, verifier: Verifier | None = None) -> OracleRecord:
    """Verify and read a record directory (or its record.json).

    `verifier` defaults to the one `rowgate verify` would use (ROWGATE_SIGNING_KEY
    or the local key). Raises VerificationError (signature, name, digests) or
    EvidenceError (not a record).
    """
    path = Path(path)
    directory = path.parent if path.name == RECORD_FILE else path
    record_file, signature = directory / RECORD_FILE, directory / SIGNATURE_FILE
    if not record_file.is_file():
        raise EvidenceError(f"{directory}: not an oracle record (no {RECORD_FILE})")
    if not signature.is_file():
        raise VerificationError(f"{directory}: {SIGNATURE_FILE} missing (an unsigned record)")
    identity = (verifier or _default_verifier(signature)).verify(directory, signature)
    data = record_file.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    if directory.name != sha[:RECORD_ID_LEN]:
        raise VerificationError(f"{directory}: {RECORD_FILE} digest gives record id "
                                f"{sha[:RECORD_ID_LEN]} (record edited or renamed)")
    return _parse(directory, data, sha, identity)


def _passes(docs: list[dict[str, Any]]) -> tuple[WorkloadPass, ...]:
    return tuple(WorkloadPass(**{**d, "requests": tuple(
        Request(**{**r, "prompt_ids": tuple(r["prompt_ids"])}) for r in d["requests"]),
        "dataset": tuple(tuple(kv) for kv in d.get("dataset", ()))})
        for d in docs)


def _parse(directory: Path, data: bytes, sha: str, identity: SignerIdentity) -> OracleRecord:
    from rowgate.rows.workload import workload_digest

    doc = strict_loads(data, f"{directory}/{RECORD_FILE}")
    try:
        if doc.get("format") != FORMAT:
            raise EvidenceError(f"{directory}/{RECORD_FILE}: format {doc.get('format')!r}, "
                                f"expected {FORMAT}")
        passes = _passes(doc["workload"]["passes"])
        outputs = tuple(OracleOutput(
            o["id"], o["cell"], tuple(o["token_ids"]), tuple(o["logprobs"]),
            alternatives_from_json(o.get("alternatives", ())))
            for o in doc["outputs"])
        record = OracleRecord(
            path=directory, record_id=directory.name, row_id=doc["row"]["id"],
            row_sha256=doc["row"]["sha256"], engine=doc["engine"], version=doc["version"],
            model_digest=doc["model"]["digest"], workload_digest=doc["workload"]["digest"],
            passes=passes, outputs=outputs, created=doc["created"], sha256=sha, signer=identity)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise EvidenceError(f"{directory}/{RECORD_FILE}: not a well-formed oracle record "
                            f"({type(exc).__name__}: {exc})") from exc
    if workload_digest(passes) != record.workload_digest:
        raise VerificationError(f"{directory}: the recorded workload does not give its "
                                f"recorded digest {record.workload_digest}")
    return record
