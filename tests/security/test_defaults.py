"""The defaults keep the subject clean.

`cd SUBJECT && rowgate gate ROW` twice, with every default: bundles go to the user's state
dir (`$XDG_STATE_HOME/rowgate/evidence`), builds to the user's cache dir, so the second run
finds the tree exactly as the first did. An explicit --out inside the subject that git does
not ignore is refused before anything runs (the next gate would find the tree dirty);
one that git ignores works.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.security._support import (
    BUILD_GATE,
    assert_one_line,
    git_commit_all,
    host_row,
    make_subject,
    own_key,
    rowgate,
    subject_state,
    write_row,
)


def _state_evidence() -> Path:
    return Path(os.environ["XDG_STATE_HOME"]) / "rowgate" / "evidence"


def test_gate_twice_from_inside_the_subject_with_the_defaults(tmp_path):
    subject = make_subject(tmp_path / "subject")
    before = subject_state(subject)
    row = host_row(tmp_path / "rows", "TEST-DEFAULTS", [sys.executable, "-c", "print('ok')"])
    bundles = []
    for _ in range(2):
        run = rowgate("-q", "gate", row, cwd=subject)
        assert run.code == 0, (run.out, run.err)
        bundles.append(Path(run.last))
        assert subject_state(subject) == before, "the gate wrote into the subject"
    assert bundles[0] != bundles[1]
    for bundle in bundles:
        assert bundle.parent == _state_evidence() / "TEST-DEFAULTS"
        assert rowgate("verify", bundle, *own_key()).code == 0


@pytest.mark.slow
def test_gate_with_a_build_twice_from_inside_the_subject(tmp_path):
    subject = make_subject(tmp_path / "subject")
    before = subject_state(subject)
    host = f'\n[[gates]]\nid = "host"\nkind = "host"\ncommands = [["{sys.executable}", "-V"]]\n'
    row = write_row(tmp_path / "rows", "TEST-DEFAULTS", host + BUILD_GATE)
    for _ in range(2):
        run = rowgate("-q", "gate", row, cwd=subject)
        assert run.code == 0, (run.out, run.err)
        assert subject_state(subject) == before, "the gate or its build wrote into the subject"


def test_an_explicit_out_inside_the_subject_that_git_tracks_is_refused(tmp_path):
    subject = make_subject(tmp_path / "subject")
    before = subject_state(subject)
    row = host_row(tmp_path / "rows", "TEST-DEFAULTS", [sys.executable, "-c", "print('ok')"])
    run = rowgate("-q", "gate", row, "--out", "evidence", cwd=subject)
    out = re.escape(str(subject / "evidence"))
    assert_one_line(run, 2, rf"--out {out}: inside the subject {re.escape(str(subject))} .*ignore.*")
    assert subject_state(subject) == before


def test_an_explicit_out_the_subject_ignores_works_twice(tmp_path):
    subject = make_subject(tmp_path / "subject")
    (subject / ".gitignore").write_text("/evidence/\n")
    import git

    with git.Repo(subject) as repo:
        git_commit_all(repo, "ignore evidence")
    before = subject_state(subject)
    row = host_row(tmp_path / "rows", "TEST-DEFAULTS", [sys.executable, "-c", "print('ok')"])
    for _ in range(2):
        run = rowgate("-q", "gate", row, "--out", "evidence", cwd=subject)
        assert run.code == 0, (run.out, run.err)
        assert Path(run.last).parent == subject / "evidence" / "TEST-DEFAULTS"
    status = subprocess.run(["git", "status", "--porcelain"], cwd=subject, capture_output=True,
                            text=True, check=True).stdout
    assert status == ""
    assert subject_state(subject)[1] != before[1]  # only the ignored evidence/ appeared
