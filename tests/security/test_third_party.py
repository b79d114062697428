"""Third parties still accept what rowgate signs, after every hardening:
model-signing's own CLI (the command docs/reviewers.md gives), and sigstore-js
(@sigstore/verify, a second implementation in another language) on the same bundle.
A CRLF copy of the public key works for both, as it does for rowgate."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rowgate.seal import signing
from tests.security._support import cli, host_row, make_subject, make_writable
from tests.support import REPO

SIGSTORE_JS = Path(__file__).with_name("sigstore_js_verify.js")


@pytest.fixture
def bundle(tmp_path, capsys) -> Path:
    subject = make_subject(tmp_path / "subject")
    row = host_row(tmp_path / "rows", "TEST-THIRD", [sys.executable, "-c", "print('ok')"])
    run = cli(capsys, "-q", "gate", row, "--repo", subject, "--out", tmp_path / "evidence")
    assert run.code == 0, run.err
    return Path(run.last)


def _crlf_public(tmp_path: Path) -> Path:
    crlf = tmp_path / "gate.crlf.pub.pem"
    crlf.write_bytes(signing.local_public_key().read_bytes().replace(b"\n", b"\r\n"))
    return crlf


def test_model_signing_cli_accepts_a_rowgate_bundle(bundle, tmp_path):
    found = shutil.which("model_signing", path=str(Path(sys.executable).parent)) or \
        shutil.which("model_signing")
    if not found:
        pytest.skip("model_signing's CLI is not installed")
    for pub in (signing.local_public_key(), _crlf_public(tmp_path)):
        proc = subprocess.run([found, "--log-level", "ERROR", "verify", "key", str(bundle),
                               "--signature", str(bundle / "signature.sigstore.json"),
                               "--public_key", str(pub)],
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def _node_modules() -> Path | None:
    """Where sigstore-js is installed: $ROWGATE_SIGSTORE_JS, else .nox/sigstore-js (the
    tests session installs it there when npm is available)."""
    for root in (os.environ.get("ROWGATE_SIGSTORE_JS"), str(REPO / ".nox" / "sigstore-js")):
        if root and (Path(root) / "node_modules" / "@sigstore" / "verify").is_dir():
            return Path(root) / "node_modules"
    return None


def _sigstore_js(signature: Path, pub: Path) -> subprocess.CompletedProcess[str]:
    modules = _node_modules()
    if modules is None or not shutil.which("node"):
        pytest.skip("sigstore-js is not installed (node and @sigstore/verify: see noxfile)")
    return subprocess.run(["node", str(SIGSTORE_JS), str(signature), str(pub)],
                          env={**os.environ, "NODE_PATH": str(modules)},
                          capture_output=True, text=True, timeout=120, check=False)


def test_sigstore_js_accepts_a_rowgate_bundle_and_names_every_file(bundle, tmp_path):
    for pub in (signing.local_public_key(), _crlf_public(tmp_path)):
        proc = _sigstore_js(bundle / "signature.sigstore.json", pub)
        assert proc.returncode == 0, proc.stderr
        signed = dict(json.loads(line) for line in proc.stdout.splitlines())
        on_disk = {p.relative_to(bundle).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                   for p in bundle.rglob("*") if p.is_file() and p.name != "signature.sigstore.json"}
        assert signed == on_disk


def test_sigstore_js_refuses_a_signature_changed_by_one_byte(bundle):
    import base64

    make_writable(bundle)
    sig = bundle / "signature.sigstore.json"
    doc = json.loads(sig.read_text())
    raw = bytearray(base64.b64decode(doc["dsseEnvelope"]["signatures"][0]["sig"]))
    raw[-1] ^= 0x01
    doc["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(raw)).decode()
    sig.write_text(json.dumps(doc))
    proc = _sigstore_js(sig, signing.local_public_key())
    assert proc.returncode != 0
