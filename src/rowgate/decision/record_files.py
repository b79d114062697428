"""Signed single-file JSON records (reviews, attestations, merge records).

A record is schema-checked, written atomically (temporary file, fsync, rename), and
signed beside itself as `X.sigstore.json`, also atomically; a record whose signature
cannot be written is removed again, so a record on disk is always a signed one. Records
are read strictly (a regular file, strict JSON, schema, model).
model-signing signs directories, so a record is signed and
verified as a temporary directory holding just that one file: the signed
in-toto statement's one resource is the record's file name.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from rowgate.errors import VerificationError
from rowgate.records.canonical import canonical_json
from rowgate.records.identity import SignerIdentity
from rowgate.records.schema import load_checked, validate
from rowgate.seal.signing import Signer, Verifier
from rowgate.storage import read_regular, write_atomic, writing


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
    write_atomic(path, raw)
    return raw


def file_record(model: BaseModel, schema: str, path: Path, signer: Signer, what: str) -> bytes:
    """Write and sign a record, both or neither: a signature that cannot be written takes
    the record away again. A filesystem that refuses a write is StorageError ("…; WHAT")."""
    with writing(what, path):
        raw = write_record(model, schema, path)
        try:
            sign_record(signer, path)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
    return raw


M = TypeVar("M", bound=BaseModel)


def read_record(model: type[M], schema: str, path: Path) -> M:
    return load_checked(model, schema, read_regular(path, str(path)), str(path))


def _single_file_dir(record: Path, tmp: str) -> Path:
    holder = Path(tmp) / record.name.removesuffix(".json")
    holder.mkdir()
    (holder / record.name).write_bytes(read_regular(record, str(record)))
    return holder


def sign_record(signer: Signer, record: Path) -> Path:
    """Sign one record file; the signature goes beside it (atomically)."""
    sig = signature_path(record)
    with tempfile.TemporaryDirectory(prefix="rowgate-sign-") as tmp:
        holder = _single_file_dir(record, tmp)
        signer.sign(holder, Path(tmp) / "signature.json", ignore=[])
        write_atomic(sig, (Path(tmp) / "signature.json").read_bytes())
    return sig


def verify_record(verifier: Verifier, record: Path) -> SignerIdentity:
    """Verify a record against its signature; raises VerificationError naming the file."""
    sig = signature_path(record)
    if not sig.is_file() or sig.is_symlink():
        raise VerificationError(f"{record}: no signature ({sig.name} missing)")
    with tempfile.TemporaryDirectory(prefix="rowgate-verify-") as tmp:
        holder = _single_file_dir(record, tmp)
        try:
            return verifier.verify(holder, sig)
        except VerificationError as exc:
            raise VerificationError(f"{record.name}: {exc.diagnostics()}") from exc


def file_sha256(path: Path) -> str:
    return hashlib.sha256(read_regular(path, str(path))).hexdigest()
