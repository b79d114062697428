"""Bundles and records that are validly signed and still lie.

Each forgery is re-signed with the very key that sealed the original (the worst case: a
compromised gate machine, or a careless one), so the signature and every digest check
out. What must refuse them is the strict reading: a JSON key said twice (two parsers, two
readings) and a path in a manifest or gate result that would leave the bundle.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

import pytest

from rowgate.seal import signing
from tests.review_support import World, make_key
from tests.security._support import (
    assert_one_line,
    cli,
    duplicate_before,
    host_row,
    make_subject,
    own_key,
    proc_env,
    reseal,
    rowgate,
    sign_dir,
    sign_record,
)
from tests.support import DEMOS

ROW = "TEST-FORGE"


@pytest.fixture
def sealed(tmp_path, capsys):
    """A real PASS bundle of a host gate: (bundle, the key that sealed it)."""
    subject = make_subject(tmp_path / "subject")
    row = host_row(tmp_path / "rows", ROW, [sys.executable, "-c", "print('ok')"])
    run = cli(capsys, "-q", "gate", row, "--repo", subject, "--out", tmp_path / "evidence")
    assert run.code == 0, run.err
    return Path(run.last), signing.config_dir() / "signing-key.pem"


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


# ------------------------------------------------------------ duplicated keys


def _dup_top_status(bundle):
    return {"manifest_text": lambda t: duplicate_before(t, '  "status": "PASS"', '"status": "FAIL"')}


def _dup_gate_summary_status(bundle):
    return {"manifest_text": lambda t: duplicate_before(t, '      "status": "PASS"',
                                                        '"status": "FAIL"')}


def _dup_subject_commit(bundle):
    commit = _manifest(bundle)["subject"]["commit"]
    return {"manifest_text": lambda t: duplicate_before(t, f'    "commit": "{commit}"',
                                                        f'"commit": "{"0" * 40}"')}


def _dup_file_digest(bundle):
    def edit(text: str) -> str:
        digest = json.loads(text)["files"]["gates/host.json"]["sha256"]
        return duplicate_before(text, f'      "sha256": "{digest}"', f'"sha256": "{"f" * 64}"')
    return {"manifest_text": edit}


def _dup_gate_file_status(bundle):
    return {"files": {"gates/host.json": lambda t: duplicate_before(t, '  "status": "PASS"',
                                                                    '"status": "FAIL"')}}


def _dup_gate_metric(bundle):
    return {"files": {"gates/host.json": lambda t: duplicate_before(
        t, '    "commands_failed": 0', '"commands_failed": 1')}}


DUPLICATES = {
    "manifest-top-level": (_dup_top_status, "manifest.json", "status"),
    "manifest-gate-summary": (_dup_gate_summary_status, "manifest.json", "status"),
    "manifest-nested-object": (_dup_subject_commit, "manifest.json", "commit"),
    "manifest-files-entry": (_dup_file_digest, "manifest.json", "sha256"),
    "gate-result-top-level": (_dup_gate_file_status, "gates/host.json", "status"),
    "gate-result-metrics": (_dup_gate_metric, "gates/host.json", "commands_failed"),
}


@pytest.mark.parametrize("case", list(DUPLICATES))
def test_a_duplicated_key_anywhere_in_a_sealed_document_fails_verify(sealed, capsys, case):
    """Case 7 (`"status": "FAIL"` then `"status": "PASS"`) at every level."""
    bundle, key = sealed
    forge, where, dup = DUPLICATES[case]
    forged = reseal(bundle, key, **forge(bundle))
    run = cli(capsys, "verify", forged, *own_key())
    assert_one_line(run, 1, rf"{re.escape(where)}: duplicate key '{dup}'.*")
    run = cli(capsys, "inspect", forged)
    assert_one_line(run, 1, rf"{re.escape(where)}: duplicate key '{dup}'.*")


def test_a_duplicated_key_in_a_raw_artifact_is_rejected_by_the_review(tmp_path, monkeypatch,
                                                                       capsys):
    """The review re-derives from the artifacts: `"returncode": 1` then `0` in commands.json
    reads as a pass to a last-wins parser and as a failure to a first-wins one."""
    world = World(tmp_path, monkeypatch, capsys)
    try:
        row = world.row()
        bundle = world.gate(row)
        forged = reseal(bundle, world.gate_key, files={
            "artifacts/host/commands.json":
                lambda t: duplicate_before(t, '    "returncode": 0', '"returncode": 1')})
        code, out, err = world.review(forged, row)
        assert "Traceback" not in err
        assert code == 1, (out, err)
        record = json.loads(Path(out[-1]).read_text())
        assert record["verdict"] == "REJECT"
        assert any("duplicate key 'returncode'" in r for r in record["reasons"]), record["reasons"]
    finally:
        world.close()


def _approved(world: World, attestation: bool = False) -> tuple[Path, Path, Path]:
    row = world.row(attestation=attestation)
    bundle = world.gate(row)
    code, out, err = world.review(bundle, row)
    assert code == 0, (out, err)
    return row, bundle, Path(out[-1])


def test_a_review_record_saying_verdict_twice_cannot_merge(tmp_path, monkeypatch, capsys):
    world = World(tmp_path, monkeypatch, capsys)
    try:
        row, _, review = _approved(world)
        text = duplicate_before(review.read_text(), '  "verdict": "APPROVE"', '"verdict": "REJECT"')
        os.chmod(review, 0o644)
        review.write_text(text)
        sign_record(world.review_key, review)
        main_before = world.repo.heads.main.commit.hexsha
        code, out, err = world.merge(row)
        assert "Traceback" not in err
        assert code == 1, (out, err)
        assert re.fullmatch(r"merge refused \(review\): .*duplicate key 'verdict'.*", err.strip()), err
        assert world.repo.heads.main.commit.hexsha == main_before
    finally:
        world.close()


def test_an_attestation_saying_a_digest_twice_cannot_merge(tmp_path, monkeypatch, capsys):
    world = World(tmp_path, monkeypatch, capsys)
    try:
        row, _, review = _approved(world, attestation=True)
        world.as_gate()
        code, out, err = world.cli("attest-operator", review)
        assert code == 0, (out, err)
        attestation = Path(out[-1])
        doc = json.loads(attestation.read_text())
        text = duplicate_before(attestation.read_text(), f'  "review_sha256": "{doc["review_sha256"]}"',
                                f'"review_sha256": "{"a" * 64}"')
        attestation.write_text(text)
        sign_record(world.gate_key, attestation)
        main_before = world.repo.heads.main.commit.hexsha
        code, out, err = world.merge(row)
        assert code == 1, (out, err)
        assert re.fullmatch(r"merge refused \(attestation\): .*duplicate key 'review_sha256'.*",
                            err.strip()), err
        assert world.repo.heads.main.commit.hexsha == main_before
    finally:
        world.close()


def test_an_oracle_record_saying_a_key_twice_does_not_verify(tmp_path, capsys, keys):
    source = DEMOS / "oracle-records" / "DEMO-GPU-DECODE" / "11b423834e1ece54" / "record.json"
    text = duplicate_before(source.read_text(), ' "format": "rowgate-oracle-record/1"',
                            '"format": "rowgate-oracle-record/0"')
    record_id = hashlib.sha256(text.encode()).hexdigest()[:16]
    directory = tmp_path / "oracle-records" / "DEMO-GPU-DECODE" / record_id
    directory.mkdir(parents=True)
    (directory / "record.json").write_text(text)
    sign_dir(keys.private, directory)
    run = cli(capsys, "oracle", "verify", directory, "--key", keys.public)
    assert_one_line(run, 1, r".*record\.json: duplicate key 'format'.*")


def test_a_signature_file_saying_its_key_hint_twice_does_not_verify(sealed, capsys):
    bundle, key = sealed
    forged = reseal(bundle, key)
    sig = forged / "signature.sigstore.json"
    doc = json.loads(sig.read_text())
    hint = doc["verificationMaterial"]["publicKey"]["hint"]
    raw = sig.read_text()
    assert raw.count(f'"hint": "{hint}"') == 1 or raw.count(f'"hint":"{hint}"') == 1
    sep = '": "' if f'"hint": "{hint}"' in raw else '":"'
    raw = raw.replace(f'"hint{sep}{hint}"', f'"hint{sep}{"0" * 64}", "hint{sep}{hint}"')
    os.chmod(sig, 0o644)
    sig.write_text(raw)
    run = cli(capsys, "verify", forged, *own_key())
    assert_one_line(run, 1, r"signature\.sigstore\.json: duplicate key 'hint'.*")


# -------------------------------------------------- paths that leave the bundle


def _outside_gate_id(bundle: Path, outside: Path) -> str:
    return os.path.relpath(outside / "gate", bundle / "gates")


def _with_gate_id(gate_id: str):
    def manifest(doc: dict) -> None:
        doc["gates"][0]["gate_id"] = gate_id

    def gate_file(text: str) -> str:
        doc = json.loads(text)
        doc["gate_id"] = gate_id
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"
    return {"manifest": manifest, "files": {"gates/host.json": gate_file}}


def _gate_result_edit(**changes):
    def gate_file(text: str) -> str:
        doc = json.loads(text)
        doc.update(changes)
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"
    return {"files": {"gates/host.json": gate_file}}


PATH_FORGERIES = {
    "gate-id-climbs-out": (lambda b, o: _with_gate_id(_outside_gate_id(b, o)),
                           r"manifest\.json: .*gates.*0.*gate_id.*"),
    "gate-id-absolute": (lambda b, o: _with_gate_id(str(o / "gate")),
                         r"manifest\.json: .*gates.*0.*gate_id.*"),
    "gate-id-homoglyph": (lambda b, o: _with_gate_id("h\u043est"),
                          r"manifest\.json: .*gates.*0.*gate_id.*"),
    "gate-file-elsewhere": (lambda b, o: {"manifest": lambda d: d["gates"][0].update(
        file=os.path.relpath(o / "gate.json", b))}, r"manifest\.json: .*gates.*0.*file.*"),
    "row-id-climbs-out": (lambda b, o: {"manifest": lambda d: d["row"].update(id="../" + ROW)},
                          r"manifest\.json: .*row.*id.*"),
    "files-key-climbs-out": (lambda b, o: {"manifest": lambda d: d["files"].update(
        {"../outside.txt": {"sha256": "0" * 64, "size": 1}})}, r"manifest\.json: .*files.*"),
    "files-key-absolute": (lambda b, o: {"manifest": lambda d: d["files"].update(
        {str(o / "precious.txt"): {"sha256": "0" * 64, "size": 1}})}, r"manifest\.json: .*files.*"),
    "artifact-path-climbs-out": (lambda b, o: _gate_result_edit(
        artifacts=["artifacts/host/../../../../../sentinel/secret.cu"]),
        r"gates/host\.json: .*artifacts.*"),
    "artifact-path-absolute": (lambda b, o: _gate_result_edit(artifacts=[str(o / "secret.cu")]),
                               r"gates/host\.json: .*artifacts.*"),
    "artifact-of-another-gate": (lambda b, o: _gate_result_edit(
        artifacts=["artifacts/other/x.txt"]), r"gates/host\.json: .*artifacts.*"),
}


@pytest.mark.parametrize("case", list(PATH_FORGERIES))
def test_a_path_in_a_resigned_manifest_that_leaves_the_bundle_is_refused(sealed, sentinel,
                                                                        capsys, case):
    """Case 8: verify refuses, and inspect and report never print what lies outside."""
    bundle, key = sealed
    forge, pattern = PATH_FORGERIES[case]
    forged = reseal(bundle, key, **forge(bundle, sentinel.root))
    assert_one_line(cli(capsys, "verify", forged, *own_key()), 1, pattern)
    for command in (["inspect", forged], ["inspect", forged, "--json"],
                    ["report", forged, "--markdown", forged.parent.parent / "r.md"]):
        run = cli(capsys, *command)
        assert "SENTINEL" not in run.out + run.err
        assert_one_line(run, 1, pattern)
    sentinel.assert_untouched()


def test_inspect_of_a_garbage_gate_file_is_one_line(sealed, capsys):
    """Case 15: inspect does not verify, but it reads strictly."""
    bundle, _ = sealed
    os.chmod(bundle, 0o755)
    os.chmod(bundle / "gates", 0o755)
    os.chmod(bundle / "gates" / "host.json", 0o644)
    (bundle / "gates" / "host.json").write_text("{garbage")
    for args in (["inspect", bundle], ["inspect", bundle, "--json"]):
        assert_one_line(cli(capsys, *args), 1, r"gates/host\.json: not JSON.*")


def test_review_of_a_manifest_naming_a_fifo_as_its_row_file_does_not_hang(sealed, tmp_path):
    """The recorded row path is untrusted: a FIFO is refused, never opened."""
    bundle, key = sealed
    fifo = tmp_path / "row.toml"
    os.mkfifo(fifo)
    forged = reseal(bundle, key, manifest=lambda d: d["row"].update(file=str(fifo)))
    pub = tmp_path / "gate.pub.pem"
    pub.write_bytes(signing.KeySigner(key).public_pem)
    reviewer = make_key(tmp_path / "reviewer.pem")
    run = rowgate("review", forged, "--repo", tmp_path / "subject", "--key", pub, "--reviews",
                  tmp_path / "reviews", timeout=60, env=proc_env(ROWGATE_SIGNING_KEY=str(reviewer)))
    assert_one_line(run, 2, rf"row file {re.escape(str(fifo))} .*not a regular file.*")
