"""Signed single-file JSON records (reviews, attestations, merge records).

A record is schema-checked, written atomically, and signed beside itself as
`X.sigstore.json`. model-signing signs directories, so a record is signed and
verified as a temporary directory holding just that one file: the signed
in-toto statement's one resource is the record's file name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel

from pipeline.errors import UsageError, VerificationError
from pipeline.records.canonical import canonical_json
from pipeline.records.identity import SignerIdentity
from pipeline.records.schema import load_checked, validate
from pipeline.signing import Signer, Verifier


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def signature_path(record: Path) -> Path:
    """`X.review.json` -> `X.review.sigstore.json`."""
    return record.with_name(record.name.removesuffix(".json") + ".sigstore.json")


def write_record(model: BaseModel, schema: str, path: Path) -> bytes:
    """Schema-check and write atomically; returns the bytes written."""
    data = json.loads(model.model_dump_json())
    validate(schema, data, str(path))
    raw = canonical_json(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return raw


def read_record(model: type[BaseModel], schema: str, path: Path):
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror})") from exc
    return load_checked(model, schema, data, str(path))


def _single_file_dir(record: Path, tmp: str) -> Path:
    holder = Path(tmp) / record.name.removesuffix(".json")
    holder.mkdir()
    shutil.copyfile(record, holder / record.name)
    return holder


def sign_record(signer: Signer, record: Path) -> Path:
    """Sign one record file; the signature goes beside it."""
    sig = signature_path(record)
    with tempfile.TemporaryDirectory(prefix="rowgate-sign-") as tmp:
        holder = _single_file_dir(record, tmp)
        signer.sign(holder, Path(tmp) / "signature.json", ignore=[])
        shutil.copyfile(Path(tmp) / "signature.json", sig)
    return sig


def verify_record(verifier: Verifier, record: Path) -> SignerIdentity:
    """Verify a record against its signature; raises VerificationError naming the file."""
    sig = signature_path(record)
    if not sig.is_file():
        raise VerificationError(f"{record}: no signature ({sig.name} missing)")
    with tempfile.TemporaryDirectory(prefix="rowgate-verify-") as tmp:
        holder = _single_file_dir(record, tmp)
        try:
            return verifier.verify(holder, sig)
        except VerificationError as exc:
            raise VerificationError(f"{record.name}: {exc.diagnostics()}") from exc


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
