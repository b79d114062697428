"""Sealing and verification of evidence bundles: every byte is covered."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rowgate.errors import VerificationError
from rowgate.records.status import Status
from rowgate.seal import signing
from rowgate.seal.bundle import MANIFEST_FILE, Bundle, find_bundles
from rowgate.seal.signing import SIGNATURE_FILE
from tests.support import thaw


def _verify(bundle: Path, signer) -> None:
    Bundle.open(bundle).verify(signer.verifier())


def test_sealed_bundle_verifies_and_is_read_only(sealed):
    bundle, signer = sealed
    _verify(bundle, signer)
    manifest = Bundle.open(bundle).manifest
    assert manifest.status is Status.PASS
    assert manifest.signer == signer.identity
    assert set(manifest.files) >= {"gates/host.json", "artifacts/host/commands.json"}
    for dirpath, _, files in os.walk(bundle):
        for f in files:
            assert not os.stat(Path(dirpath) / f).st_mode & 0o222
    assert find_bundles(bundle.parent.parent) == [bundle]


def test_bundle_id_derives_from_manifest(sealed):
    import hashlib

    bundle, _ = sealed
    digest = hashlib.sha256((bundle / MANIFEST_FILE).read_bytes()).hexdigest()
    assert bundle.name == digest[:16]


def _tamper_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("rel", ["artifacts/host/commands.json", "artifacts/host/command-0.log",
                                 "gates/host.json", "artifacts/host/status.txt"])
def test_one_byte_changed_in_any_file_is_refused(sealed, rel):
    bundle, signer = sealed
    thaw(bundle)
    target = bundle / rel
    if target.stat().st_size == 0:
        target.write_bytes(b"x")
    else:
        _tamper_byte(target)
    with pytest.raises(VerificationError, match=rel.replace(".", r"\.")):
        _verify(bundle, signer)


def test_one_byte_changed_in_manifest_is_refused(sealed):
    bundle, signer = sealed
    thaw(bundle)
    _tamper_byte(bundle / MANIFEST_FILE)
    with pytest.raises(VerificationError, match="manifest"):
        _verify(bundle, signer)


def test_manifest_edited_consistently_is_refused(sealed):
    """Change a gate summary in manifest and gate file alike: the id and signature catch it."""
    bundle, signer = sealed
    thaw(bundle)
    m = json.loads((bundle / MANIFEST_FILE).read_text())
    m["gates"][0]["reason"] = "all good, trust me"
    (bundle / MANIFEST_FILE).write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")
    with pytest.raises(VerificationError, match="bundle id"):
        _verify(bundle, signer)


def test_one_byte_changed_in_signature_is_refused(sealed):
    bundle, signer = sealed
    thaw(bundle)
    sig = json.loads((bundle / SIGNATURE_FILE).read_text())
    env = sig["dsseEnvelope"]
    raw = bytearray(__import__("base64").b64decode(env["signatures"][0]["sig"]))
    raw[-1] ^= 0x01
    env["signatures"][0]["sig"] = __import__("base64").b64encode(bytes(raw)).decode()
    (bundle / SIGNATURE_FILE).write_text(json.dumps(sig))
    with pytest.raises(VerificationError, match="signature"):
        _verify(bundle, signer)


def test_added_file_is_refused(sealed):
    bundle, signer = sealed
    thaw(bundle)
    (bundle / "artifacts" / "host" / "extra.txt").write_text("planted\n")
    with pytest.raises(VerificationError, match="artifacts/host/extra.txt: file added"):
        _verify(bundle, signer)


@pytest.mark.parametrize("name", [".gitignore", ".git/config"])
def test_added_hidden_file_is_refused(sealed, name):
    # model-signing itself ignores git paths; the manifest comparison must not
    bundle, signer = sealed
    thaw(bundle)
    (bundle / name).parent.mkdir(exist_ok=True)
    (bundle / name).write_text("x\n")
    with pytest.raises(VerificationError, match="added"):
        _verify(bundle, signer)


def test_removed_file_is_refused(sealed):
    bundle, signer = sealed
    thaw(bundle)
    (bundle / "artifacts" / "host" / "status.txt").unlink()
    with pytest.raises(VerificationError, match="status.txt: file listed in the manifest is missing"):
        _verify(bundle, signer)


def test_renamed_file_is_refused(sealed):
    bundle, signer = sealed
    thaw(bundle)
    os.rename(bundle / "artifacts/host/command-0.log", bundle / "artifacts/host/command-9.log")
    with pytest.raises(VerificationError, match="renamed"):
        _verify(bundle, signer)


def test_symlink_inserted_is_refused(sealed, tmp_path):
    bundle, signer = sealed
    thaw(bundle)
    (tmp_path / "outside.txt").write_text("outside\n")
    os.symlink(tmp_path / "outside.txt", bundle / "artifacts" / "host" / "link.txt")
    with pytest.raises(VerificationError, match="symbolic link"):
        _verify(bundle, signer)


def test_file_replaced_by_symlink_is_refused(sealed, tmp_path):
    bundle, signer = sealed
    thaw(bundle)
    target = bundle / "artifacts" / "host" / "status.txt"
    copy = tmp_path / "status.txt"
    shutil.copy(target, copy)
    target.unlink()
    os.symlink(copy, target)
    with pytest.raises(VerificationError, match="symbolic link"):
        _verify(bundle, signer)


def test_signature_by_another_key_is_refused(sealed, make_key):
    bundle, signer = sealed
    thaw(bundle)
    other = signing.KeySigner(make_key("other"))
    (bundle / SIGNATURE_FILE).unlink()
    other.sign(bundle, bundle / SIGNATURE_FILE, ignore=[SIGNATURE_FILE])
    with pytest.raises(VerificationError, match="not by the expected key"):
        _verify(bundle, signer)
    # and verifying with the other key fails on the manifest's declared signer
    with pytest.raises(VerificationError, match="names signer"):
        Bundle.open(bundle).verify(other.verifier())


def test_bundle_moved_under_another_row_is_refused(sealed):
    bundle, signer = sealed
    moved = bundle.parent.parent / "OTHER-ROW" / bundle.name
    moved.parent.mkdir()
    os.rename(bundle, moved)
    with pytest.raises(VerificationError, match="filed under row 'OTHER-ROW'"):
        _verify(moved, signer)


def test_bundle_renamed_is_refused(sealed):
    bundle, signer = sealed
    renamed = bundle.parent / ("0" * 16)
    os.rename(bundle, renamed)
    with pytest.raises(VerificationError, match="bundle id"):
        _verify(renamed, signer)


def test_each_seal_is_a_new_bundle(tmp_path, git_repo, host_row):
    from rowgate.cli.progress import PlainProgress
    from rowgate.rows import row as rows
    from rowgate.run import runner

    signer = signing.default_signer(announce=lambda m: None)
    runs = [runner.run_row(rows.load_row(host_row), Path(git_repo.working_dir), tmp_path / "ev",
                           signer, PlainProgress(True)) for _ in range(2)]
    assert runs[0].bundle != runs[1].bundle
    assert not list((tmp_path / "ev" / "TEST-HOST").glob(".staging-*"))
