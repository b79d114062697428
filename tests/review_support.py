"""A review/merge scenario: a real subject repo, two real signing keys (the gate
machine's and the reviewer's), real rows, real sealed bundles and the real CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import textwrap
from pathlib import Path

import git
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from rowgate.cli import main as cli
from rowgate.cli.progress import PlainProgress
from rowgate.records.canonical import canonical_json
from rowgate.rows import row as rows
from rowgate.run import runner
from rowgate.seal import signing
from rowgate.seal.bundle import MANIFEST_FILE, digest_tree
from rowgate.seal.signing import SIGNATURE_FILE
from tests.support import write_row

SIGNOFF = "\n\nSigned-off-by: Test Author <author@example.com>\n"
ROW_ID = "TEST-REVIEW"

HOST_ROW = '''
    [[gates]]
    id = "host"
    kind = "host"
    commands = [["git", "status", "--short"]]

    [[criteria]]
    id = "commands-pass"
    gate = "host"
    metric = "commands_failed"
    comparison = "eq"
    threshold = 0
'''


def make_key(path: Path) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return path


def commit_file(repo: git.Repo, name: str, content: str, message: str,
                signoff: bool = True) -> git.Commit:
    path = Path(repo.working_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    repo.index.add([name])
    return repo.index.commit(message + (SIGNOFF if signoff else "\n"))


def thaw(path: Path) -> None:
    for dirpath, _, filenames in os.walk(path):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(Path(dirpath) / name, 0o644)


class World:
    """tmp/subject (repo: main + feature checked out), tmp/evidence, tmp/reviews, keys."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys):
        self.tmp, self.mp, self.capsys = tmp, monkeypatch, capsys
        monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp / "config"))
        monkeypatch.setenv("ROWGATE_SIGNER", "key")  # never ambient CI OIDC in tests
        self.gate_key = make_key(tmp / "gate-key.pem")
        self.review_key = make_key(tmp / "review-key.pem")
        self.gate_pub = tmp / "gate-key.pub.pem"
        self.gate_pub.write_bytes(signing.KeySigner(self.gate_key).public_pem)
        self.evidence = tmp / "evidence"
        self.reviews = tmp / "reviews"
        self.repo = git.Repo.init(tmp / "subject", initial_branch="main")
        self.repos = [self.repo]
        with self.repo.config_writer() as cw:
            cw.set_value("user", "name", "Test Author")
            cw.set_value("user", "email", "author@example.com")
        commit_file(self.repo, "README.md", "subject\n", "initial")
        commit_file(self.repo, "src/kernel.txt", "v1\n", "kernel v1")
        self.repo.git.checkout("-b", "feature")
        commit_file(self.repo, "src/kernel.txt", "v2\n", "kernel v2")

    def close(self) -> None:
        """End git's persistent cat-file processes of every repo a test opened."""
        for repo in self.repos:
            repo.close()

    def open(self, path: Path) -> git.Repo:
        repo = git.Repo(path)
        self.repos.append(repo)
        return repo

    @property
    def repo_dir(self) -> Path:
        return Path(self.repo.working_dir)

    # ------------------------------------------------------------ identities

    def as_gate(self) -> signing.Signer:
        self.mp.setenv(signing.KEY_ENV, str(self.gate_key))
        return signing.default_signer()

    def as_reviewer(self) -> signing.Signer:
        self.mp.setenv(signing.KEY_ENV, str(self.review_key))
        return signing.default_signer()

    # ------------------------------------------------------------------ rows

    def row(self, body: str = HOST_ROW, *, arch: str = "cpu", attestation: bool = False,
            row_id: str = ROW_ID, merge_into: str = "main") -> Path:
        review = (f"\n[review]\nrequire_operator_attestation = {str(attestation).lower()}\n"
                  f"merge_into = \"{merge_into}\"\n")
        return write_row(self.tmp / "rows", row_id, textwrap.dedent(body) + review, arch=arch)

    def gate(self, row: Path, base: str | None = None) -> Path:
        """Run the row's gates on the subject repo as the gate machine; the bundle path."""
        signer = self.as_gate()
        run = runner.run_row(rows.load_row(row), self.repo_dir, self.evidence, signer,
                             PlainProgress(quiet=True), base=base)
        return run.bundle

    # ------------------------------------------------------------------- CLI

    def cli(self, *args: str) -> tuple[int, list[str], str]:
        """`rowgate ARGS` in-process: (exit code, stdout lines, stderr)."""
        self.capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            cli.main([str(a) for a in args])
        out, err = self.capsys.readouterr()
        return exc.value.code, out.splitlines(), err

    def review(self, bundle: Path, row: Path, *extra: str) -> tuple[int, list[str], str]:
        self.as_reviewer()
        return self.cli("review", bundle, "--repo", self.repo_dir, "--row", row,
                        "--reviews", self.reviews, "--key", self.gate_pub, *extra)

    def merge(self, row: Path, *extra: str) -> tuple[int, list[str], str]:
        self.as_reviewer()
        return self.cli("merge", "--row", row, "--repo", self.repo_dir,
                        "--reviews", self.reviews, *extra)

    # --------------------------------------------------------------- tamper

    def resign_edited(self, bundle: Path, gate_id: str, **changes) -> Path:
        """Edit a gate summary (and the manifest to match), then re-seal and re-sign
        with the gate machine's own key: a validly signed, inconsistent bundle."""
        work = self.tmp / "tamper" / bundle.name
        shutil.copytree(bundle, work)
        thaw(work)
        gate_file = work / "gates" / f"{gate_id}.json"
        result = json.loads(gate_file.read_text())
        result.update(changes)
        gate_file.write_bytes(canonical_json(result))
        manifest = json.loads((work / MANIFEST_FILE).read_text())
        for g in manifest["gates"]:
            if g["gate_id"] == gate_id:
                g.update(status=result["status"], reason=result["reason"])
        manifest["status"] = result["status"]
        manifest["files"] = {rel: d.model_dump() for rel, d in
                             digest_tree(work, exclude={MANIFEST_FILE, SIGNATURE_FILE}).items()}
        data = canonical_json(manifest)
        (work / MANIFEST_FILE).write_bytes(data)
        (work / SIGNATURE_FILE).unlink()
        forged = bundle.parent / hashlib.sha256(data).hexdigest()[:16]
        shutil.move(work, forged)
        signing.KeySigner(self.gate_key).sign(forged, forged / SIGNATURE_FILE,
                                             ignore=[SIGNATURE_FILE])
        return forged
