"""Every path argument is checked before work starts, one line each.

Files where directories are expected and the reverse, FIFOs and devices (refused, never
opened: a FIFO would block), paths under /proc, names that are not UTF-8, a 50 MB
command argument. Each is one line on stderr with its exit code, and no traceback.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.security._support import (
    assert_one_line,
    cli,
    host_row,
    make_subject,
    own_key,
    proc_env,
    rowgate,
    subject_state,
)

ROW = "TEST-PATHS"


@pytest.fixture
def subject(tmp_path) -> Path:
    return make_subject(tmp_path / "subject")


@pytest.fixture
def row(tmp_path) -> Path:
    return host_row(tmp_path / "rows", ROW, [sys.executable, "-c", "print('ok')"])


@pytest.fixture
def bundle(tmp_path, capsys, subject, row) -> Path:
    run = cli(capsys, "-q", "gate", row, "--repo", subject, "--out", tmp_path / "evidence")
    assert run.code == 0, run.err
    return Path(run.last)


def _fifo(tmp_path: Path, name: str = "fifo") -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


def _file(tmp_path: Path, name: str = "a-file") -> Path:
    path = tmp_path / name
    path.write_text("not a directory\n")
    return path


# ---------------------------------------------------------------- --out


@pytest.mark.parametrize("kind", ["file", "fifo", "device", "proc", "under-a-file"])
def test_gate_out_that_cannot_be_an_evidence_dir(tmp_path, subject, row, kind):
    out = {"file": lambda: _file(tmp_path), "fifo": lambda: _fifo(tmp_path),
           "device": lambda: Path("/dev/null"), "proc": lambda: Path("/proc/rowgate-evidence"),
           "under-a-file": lambda: _file(tmp_path) / "evidence"}[kind]()
    before = subject_state(subject)
    run = rowgate("-q", "gate", row, "--repo", subject, "--out", out, timeout=120)
    assert_one_line(run, 2, rf"--out {re.escape(str(out))}: .*")
    assert subject_state(subject) == before


def test_gate_out_whose_name_is_not_utf8(tmp_path, subject, row):
    out = os.fsencode(tmp_path) + b"/evidence-\xff"
    run = rowgate("-q", "gate", row, "--repo", subject, "--out", out, timeout=120)
    assert_one_line(run, 2, r"--out .*evidence-\\xff.*: .*not UTF-8.*")
    assert not os.path.exists(out)


def test_oracle_record_out_that_is_a_file(tmp_path, capsys, row):
    out = _file(tmp_path)
    assert_one_line(cli(capsys, "oracle", "record", row, "--out", out), 2,
                    rf"--out {re.escape(str(out))}: .*not a directory.*")


# ------------------------------------------------------------ --reviews


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_review_and_merge_reviews_that_is_not_a_directory(tmp_path, capsys, bundle, subject, row,
                                                          kind, keys):
    reviews = _file(tmp_path, "reviews") if kind == "file" else _fifo(tmp_path, "reviews")
    from rowgate.seal import signing

    pub = tmp_path / "gate.pub.pem"
    pub.write_bytes(signing.KeySigner(signing.config_dir() / "signing-key.pem").public_pem)
    run = rowgate("review", bundle, "--repo", subject, "--row", row, "--key", pub,
                  "--reviews", reviews, timeout=120, env=proc_env(ROWGATE_SIGNING_KEY=str(keys.private)))
    assert_one_line(run, 2, rf"--reviews {re.escape(str(reviews))}: .*not a directory.*")
    run = rowgate("merge", "--row", row, "--repo", subject, "--reviews", reviews, timeout=120)
    assert_one_line(run, 2, rf"--reviews {re.escape(str(reviews))}: .*not a directory.*")


# -------------------------------------------------------------- report


def test_report_html_that_is_a_directory(tmp_path, capsys, bundle):
    target = tmp_path / "page-dir"
    target.mkdir()
    assert_one_line(cli(capsys, "report", bundle, "--html", target), 2,
                    rf"--html {re.escape(str(target))}: .*directory.*")
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("target", ["/proc/rowgate-report.md", "/dev/null"])
def test_report_markdown_where_a_file_cannot_be(tmp_path, capsys, bundle, target):
    assert_one_line(cli(capsys, "report", bundle, "--markdown", target), 2,
                    rf"--markdown {re.escape(target)}: .*")


def test_report_markdown_that_is_a_fifo_is_refused_not_opened(tmp_path, bundle):
    fifo = _fifo(tmp_path, "page.md")
    run = rowgate("report", bundle, "--markdown", fifo, timeout=60)
    assert_one_line(run, 2, rf"--markdown {re.escape(str(fifo))}: .*not a regular file.*")


# ------------------------------------------------------------ row files


@pytest.mark.parametrize("argv", [["rows", "check", "{fifo}"], ["gate", "{fifo}", "--repo", "{subject}"],
                                  ["merge", "--row", "{fifo}", "--repo", "{subject}"]])
def test_a_fifo_as_row_file_is_refused_not_read(tmp_path, subject, argv):
    fifo = _fifo(tmp_path, "TEST-FIFO.toml")
    args = [a.format(fifo=fifo, subject=subject) for a in argv]
    run = rowgate(*args, "--out", tmp_path / "ev", timeout=60) if argv[0] == "gate" else \
        rowgate(*args, timeout=60)
    assert_one_line(run, 2, rf"{re.escape(str(fifo))}: .*not a regular file.*")


def test_a_fifo_as_review_record_is_refused_not_read(tmp_path):
    fifo = _fifo(tmp_path, "0123456789abcdef.review.json")
    run = rowgate("attest-operator", fifo, timeout=60)
    assert_one_line(run, 2, rf"{re.escape(str(fifo))}: .*not a regular file.*")


@pytest.mark.parametrize("command", ["verify", "inspect", "report"])
@pytest.mark.parametrize("kind", ["file", "fifo", "missing"])
def test_a_bundle_argument_that_is_not_a_directory(tmp_path, command, kind):
    path = {"file": lambda: _file(tmp_path), "fifo": lambda: _fifo(tmp_path),
            "missing": lambda: tmp_path / "nothing"}[kind]()
    run = rowgate(command, path, timeout=60)
    assert_one_line(run, 2, rf"{re.escape(str(path))}: not a bundle directory.*")


# ---------------------------------------------- a 50 MB host-command argument


@pytest.mark.slow
def test_a_50_mb_command_argument_is_one_line(tmp_path, capsys, subject):
    huge = "A" * (50 << 20)
    row = tmp_path / "rows" / f"{ROW}.toml"
    host_row(tmp_path / "rows", ROW, ["echo", "placeholder"])
    row.write_text(row.read_text().replace("placeholder", huge))
    run = cli(capsys, "-q", "gate", row, "--repo", subject, "--out", tmp_path / "evidence")
    assert "Traceback" not in run.err, run.err[-2000:]
    assert run.code == 1, run.err[-2000:]
    gate = json.loads((Path(run.last) / "gates" / "host.json").read_text())
    assert gate["status"] == "FAIL"
    assert "Argument list too long" in gate["reason"]
    assert len(gate["reason"]) < 1000 and "\n" not in gate["reason"]
    assert cli(capsys, "verify", run.last, *own_key()).code == 0
    assert len(run.out) < 100_000, "the 50 MB argument was printed"
