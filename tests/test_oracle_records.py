"""The oracle records checked in under oracle-records/ stay valid for the rows that name
them: signed by the row's pinned key, made on the model rowgate builds today, over the
workload the row generates today (else the tokens gate would refuse them on the GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rowgate.errors import VerificationError
from rowgate.models.tiny import build_tiny_model
from rowgate.rows.row import load_row
from rowgate.rows.workload import build_passes, workload_digest
from rowgate.seal import oracle
from rowgate.seal.signing import KeyVerifier
from rowgate_lab.megakernel import models
from tests.support import DEMOS, ROWS

ROOT = Path(__file__).resolve().parents[1]
RECORD_ROWS = [p for p in sorted([*ROWS.glob("*.toml"), *DEMOS.glob("*.toml")])
               if any(getattr(g, "oracle_record", "") for g in load_row(p).row.gates)]


def test_the_gpu_rows_ship_with_a_record():
    assert [p.stem for p in RECORD_ROWS] == ["DEMO-GPU-DECODE", "KERNEL-CUDA-DECODE-MEGAKERNEL"]


@pytest.mark.parametrize("path", RECORD_ROWS, ids=lambda p: p.stem)
def test_the_record_verifies_and_matches_the_rows_model_and_workload(path, tmp_path):
    row = load_row(path).row
    spec = next(g for g in row.gates if getattr(g, "oracle_record", ""))
    record = oracle.load_record(ROOT / spec.oracle_record,
                                KeyVerifier(ROOT / spec.oracle_record_key))
    assert record.row_id == row.id and record.engine["version"] == row.arms.oracle.version
    model = build_tiny_model(models.spec_of(row.models[0]), root=tmp_path)
    assert record.model_digest == model.digest
    passes = build_passes(row.workload, model.vocab_size, model.special_ids)
    assert record.workload_digest == workload_digest(passes)


def test_another_key_is_refused(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    (tmp_path / "other.pem").write_bytes(pem)
    spec = next(g for g in load_row(RECORD_ROWS[0]).row.gates if getattr(g, "oracle_record", ""))
    with pytest.raises(VerificationError):
        oracle.load_record(ROOT / spec.oracle_record, KeyVerifier(tmp_path / "other.pem"))
