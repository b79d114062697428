"""A key argument is parsed as the key it must be.

Real keys of every kind (P-256, P-384, RSA, encrypted, public where private is expected and
the reverse, CRLF, no final newline, empty, garbage, a directory, a FIFO, a missing file),
handed to every command that takes one. A wrong key is a configuration error: exit 2, one
line naming the argument, nothing written — and a private key is never copied anywhere.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.review_support import World, make_key
from tests.security._support import (
    Keys,
    assert_one_line,
    cli,
    host_row,
    make_subject,
    private_key_text,
    proc_env,
    rowgate,
    tree_text,
)


@pytest.fixture
def world(tmp_path, monkeypatch, capsys):
    world = World(tmp_path, monkeypatch, capsys)
    yield world
    world.close()


def _everything_written(tmp: Path, keys_dir: Path) -> str:
    """The bytes of every file under tmp except the key files the test made."""
    return "\n".join(tree_text(p) for p in tmp.iterdir() if p != keys_dir and p.is_dir())


# ------------------------------------------------------------------- --key


def test_a_private_key_as_review_key_is_refused_and_never_recorded(world, tmp_path):
    """Case 9: before, the review record carried "public_key_pem": "-----BEGIN PRIVATE KEY"."""
    row = world.row()
    bundle = world.gate(row)
    world.as_reviewer()
    code, out, err = world.cli("review", bundle, "--repo", world.repo_dir, "--row", row,
                               "--reviews", world.reviews, "--key", world.gate_key)
    assert "Traceback" not in err
    assert code == 2, (out, err)
    assert re.fullmatch(rf"--key {re.escape(str(world.gate_key))}: .*private key.*", err.strip()), err
    assert not world.reviews.exists() or not list(world.reviews.rglob("*.json"))
    secret = private_key_text(world.gate_key)
    written = "\n".join(tree_text(p) for p in tmp_path.iterdir() if p.is_dir())
    assert secret not in written
    assert "PRIVATE KEY" not in tree_text(world.reviews) if world.reviews.exists() else True


@pytest.fixture
def bundle(tmp_path, capsys):
    subject = make_subject(tmp_path / "subject")
    row = host_row(tmp_path / "rows", "TEST-KEYS", ["git", "status", "--short"])
    run = cli(capsys, "-q", "gate", row, "--repo", subject, "--out", tmp_path / "evidence")
    assert run.code == 0, run.err
    return Path(run.last)


KEY_ARGS = {  # attribute of Keys -> what the refusal says
    "private": "private key",
    "encrypted": "private key",
    "p384_public": "P-256",
    "rsa_private": "private key",
    "empty": "not a PEM public key",
    "garbage": "not a PEM public key",
    "directory": "not a regular file",
    "missing": "No such file or directory",
}


@pytest.mark.parametrize("command", ["verify", "report", "review"])
@pytest.mark.parametrize("which", list(KEY_ARGS))
def test_a_key_argument_that_is_not_a_p256_public_key_is_refused(bundle, keys, capsys, tmp_path,
                                                                  monkeypatch, command, which):
    key = getattr(keys, which)
    monkeypatch.setenv("ROWGATE_SIGNING_KEY", str(make_key(tmp_path / "reviewer.pem")))
    extra = {"report": ["--markdown", tmp_path / "page.md"],
             "review": ["--repo", tmp_path / "subject", "--reviews", tmp_path / "reviews"],
             "verify": []}[command]
    run = cli(capsys, command, bundle, "--key", key, *extra)
    assert_one_line(run, 2, rf"--key {re.escape(str(key))}: .*{KEY_ARGS[which]}.*")
    assert not (tmp_path / "reviews").exists() and not (tmp_path / "page.md").exists()
    assert private_key_text(keys.private) not in _everything_written(tmp_path, keys.root)


def test_a_fifo_as_key_is_refused_not_read(bundle, keys):
    run = rowgate("verify", bundle, "--key", keys.fifo, timeout=60)
    assert_one_line(run, 2, rf"--key {re.escape(str(keys.fifo))}: .*not a regular file.*")


def test_a_private_key_as_oracle_verify_key_is_refused(keys, capsys):
    from tests.support import DEMOS

    record = DEMOS / "oracle-records" / "DEMO-GPU-DECODE" / "11b423834e1ece54"
    run = cli(capsys, "oracle", "verify", record, "--key", keys.private)
    assert_one_line(run, 2, rf"--key {re.escape(str(keys.private))}: .*private key.*")


@pytest.mark.parametrize("variant", ["crlf_public", "bare_public"])
def test_the_right_key_with_crlf_or_no_final_newline_verifies(tmp_path, capsys, keys, variant,
                                                              monkeypatch):
    """Case 10: the fingerprint is the key's, not its text's."""
    monkeypatch.setenv("ROWGATE_SIGNING_KEY", str(keys.private))
    subject = make_subject(tmp_path / "subject")
    row = host_row(tmp_path / "rows", "TEST-KEYS", ["git", "status", "--short"])
    run = cli(capsys, "-q", "gate", row, "--repo", subject, "--out", tmp_path / "evidence")
    assert run.code == 0, run.err
    bundle = Path(run.last)
    canonical = cli(capsys, "verify", bundle, "--key", keys.public)
    assert canonical.code == 0, canonical.err
    other = cli(capsys, "verify", bundle, "--key", getattr(keys, variant))
    assert other.code == 0, other.err
    assert other.out.split("signed by ")[1] == canonical.out.split("signed by ")[1]


def test_a_review_records_the_canonical_public_key_whatever_its_file_looks_like(world, tmp_path):
    row = world.row()
    bundle = world.gate(row)
    crlf = tmp_path / "gate.crlf.pub.pem"
    crlf.write_bytes(world.gate_pub.read_bytes().replace(b"\n", b"\r\n").rstrip(b"\r\n"))
    world.as_reviewer()
    code, out, err = world.cli("review", bundle, "--repo", world.repo_dir, "--row", row,
                               "--reviews", world.reviews, "--key", crlf)
    assert code == 0, (out, err)
    record = json.loads(Path(out[-1]).read_text())
    assert record["bundle"]["verifier"]["public_key_pem"] == world.gate_pub.read_text()


# ------------------------------------------------------- ROWGATE_SIGNING_KEY


ENV_VALUES = {  # attribute of Keys (or a literal) -> what the refusal says
    "": "empty",
    "public": "public key",
    "p384_private": "P-256",
    "rsa_private": "P-256",
    "encrypted": "encrypted",
    "missing": "No such file or directory",
    "directory": "not a regular file",
    "garbage": "not a PEM private key",
}


def _env_value(keys: Keys, which: str) -> str:
    return str(getattr(keys, which)) if which else ""


class Commands:
    """One real world in which every signing command can run: (argv, what it would write)."""

    def __init__(self, world: World, keys: Keys, tmp: Path):
        self.world = world
        row = world.row(attestation=True)
        bundle = world.gate(row)
        code, out, err = world.review(bundle, row)
        assert code == 0, (out, err)
        review = Path(out[-1])
        oracle_out = tmp / "oracle-out"
        self.argv = {
            "gate": (["-q", "gate", row, "--repo", world.repo_dir, "--out", tmp / "ev2"], tmp / "ev2"),
            "review": (["review", bundle, "--repo", world.repo_dir, "--row", row,
                        "--reviews", tmp / "rv2", "--key", world.gate_pub], tmp / "rv2"),
            "attest-operator": (["attest-operator", review],
                                review.with_name(review.name.replace(".review.", ".attestation."))),
            "merge": (["merge", "--row", row, "--repo", world.repo_dir, "--reviews", world.reviews],
                      world.reviews / row.stem / "merges"),
            "oracle-record": (["oracle", "record", row, "--out", oracle_out], oracle_out),
        }
        self.bundle = bundle


@pytest.mark.parametrize("command", ["gate", "review", "attest-operator", "merge", "oracle-record"])
def test_a_bad_signing_key_is_a_configuration_error_everywhere(world, keys, tmp_path, monkeypatch,
                                                               capsys, command):
    """Case 11: exit 2 (not REJECT's or FAIL's 1), one line, nothing written."""
    commands = Commands(world, keys, tmp_path)
    argv, writes = commands.argv[command]
    main_before = world.repo.heads.main.commit.hexsha
    for which, phrase in ENV_VALUES.items():
        value = _env_value(keys, which)
        monkeypatch.setenv("ROWGATE_SIGNING_KEY", value)
        run = cli(capsys, *argv)
        assert_one_line(run, 2, rf"ROWGATE_SIGNING_KEY={re.escape(value)}: .*{phrase}.*")
        assert writes is None or not writes.exists(), (which, writes)
    monkeypatch.setenv("ROWGATE_SIGNING_KEY", str(keys.fifo))
    run = rowgate(*argv, timeout=60, env=proc_env())
    assert_one_line(run, 2, rf"ROWGATE_SIGNING_KEY={re.escape(str(keys.fifo))}: .*not a regular file.*")
    assert world.repo.heads.main.commit.hexsha == main_before
    assert private_key_text(keys.p384_private) not in _everything_written(tmp_path, keys.root)


def test_verify_names_its_signer_and_never_reads_the_signing_key(world, keys, tmp_path,
                                                                 monkeypatch, capsys):
    """Case 11 for verify: it signs nothing, and it checks against the signer
    its caller names, never a default; so a bad ROWGATE_SIGNING_KEY changes nothing, and
    without --key (or --identity/--issuer) it is a usage error, exit 2, one line."""
    bundle = Commands(world, keys, tmp_path).bundle
    for which in ENV_VALUES:
        value = _env_value(keys, which)
        monkeypatch.setenv("ROWGATE_SIGNING_KEY", value)
        run = cli(capsys, "verify", bundle, "--key", world.gate_pub)
        assert run.code == 0 and "Traceback" not in run.err, (which, run.err)
        assert_one_line(cli(capsys, "verify", bundle), 2, r"verify: pass --key PUB\.pem .*")
    assert private_key_text(keys.p384_private) not in _everything_written(tmp_path, keys.root)


def test_a_crlf_signing_key_is_accepted(tmp_path, capsys, keys, monkeypatch):
    monkeypatch.setenv("ROWGATE_SIGNING_KEY", str(keys.crlf_private))
    subject = make_subject(tmp_path / "subject")
    row = host_row(tmp_path / "rows", "TEST-KEYS", ["git", "status", "--short"])
    run = cli(capsys, "-q", "gate", row, "--repo", subject, "--out", tmp_path / "evidence")
    assert run.code == 0, run.err
    assert cli(capsys, "verify", run.last, "--key", keys.public).code == 0
