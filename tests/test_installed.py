"""rowgate as a user has it: the installed wheel's console script, run from an empty
directory, through gate → verify → review → attest → merge on a real subject, changing
nothing in the installed package or in the subject."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import git
import pytest

import rowgate
from rowgate.seal import signing
from tests.review_support import make_key
from tests.security._support import make_subject, snapshot
from tests.support import REPO, write_row

ROWGATE = Path(sys.executable).with_name("rowgate")
PACKAGE = Path(rowgate.__file__).resolve().parent

ROW = '''
    [[gates]]
    id = "host"
    kind = "host"
    commands = [["git", "status", "--short"]]

    [[gates]]
    id = "build"
    kind = "build"
    arches = ["sm_90"]

    [[criteria]]
    id = "builds"
    gate = "build"
    metric = "failed_builds"
    comparison = "eq"
    threshold = 0

    [review]
    require_operator_attestation = true
    merge_into = "main"
'''
SUBJECT_TOML = '''
    version = 1
    [kernels.k]
    source = "clean.cu"
    entry_points = ["scale"]
    arches = ["sm_90"]
'''


def test_the_package_under_test_is_the_installed_wheel():
    """Not the checkout's source: the tests would otherwise prove nothing about what ships."""
    assert "site-packages" in PACKAGE.parts and not PACKAGE.is_relative_to(REPO / "src")
    assert ROWGATE.is_file()
    proc = subprocess.run([sys.executable, "-c", "import pipeline"], capture_output=True,
                          cwd=PACKAGE.parent.parent)
    assert proc.returncode != 0 and b"No module named 'pipeline'" in proc.stderr


def test_the_demo_rows_and_schemas_ship_as_package_data(tmp_path):
    proc = subprocess.run([str(ROWGATE), "rows"], cwd=tmp_path, capture_output=True, text=True,
                          env=_env(tmp_path, "anyone"))
    assert proc.returncode == 0, proc.stderr
    assert "DEMO-CPU-DECODE" in proc.stdout and "DEMO-GPU-DECODE" in proc.stdout
    check = subprocess.run([str(ROWGATE), "schemas", "--check"], cwd=tmp_path,
                           capture_output=True, text=True, env=_env(tmp_path, "anyone"))
    assert (check.returncode, check.stdout.strip()) == (0, "schemas match the models")


def _content(snap: dict[str, tuple]) -> dict[str, tuple]:
    """A snapshot less the times git itself refreshes (its index stat cache, loose objects
    it freshens when it reads them): every byte, mode and entry still counts."""
    return {path: entry[:3] + entry[4:] if path.startswith(".git") else entry
            for path, entry in snap.items()}


def _env(tmp: Path, who: str, key: Path | None = None) -> dict[str, str]:
    """A user's environment: own config and cache dirs, the key signer."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("ROWGATE_")}
    env.update(XDG_CONFIG_HOME=str(tmp / who / "config"), XDG_STATE_HOME=str(tmp / who / "state"),
               ROWGATE_SIGNER="key", ROWGATE_CACHE_DIR=os.environ.get("ROWGATE_CACHE_DIR",
                                                                    str(tmp / "cache")))
    if key is not None:
        env["ROWGATE_SIGNING_KEY"] = str(key)
    return env


def _run(cwd: Path, env: dict[str, str], *args: object, codes: tuple[int, ...] = (0,)) -> str:
    proc = subprocess.run([str(ROWGATE), *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode in codes and "Traceback" not in proc.stderr, \
        (args, proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_gate_review_attest_merge_from_an_empty_directory_changes_no_package_or_subject(tmp_path):
    subject = make_subject(tmp_path / "subject", toml=SUBJECT_TOML)
    clone = tmp_path / "reviewer-clone"
    git.Repo.clone_from(subject, clone, branch="feature").close()
    with git.Repo(clone) as repo:
        repo.git.branch("main", "origin/main")
        with repo.config_writer() as cw:
            cw.set_value("user", "name", "Reviewer")
            cw.set_value("user", "email", "reviewer@example.com")
    row = write_row(tmp_path / "rows", "TEST-INSTALLED", textwrap.dedent(ROW))
    empty = tmp_path / "empty"
    empty.mkdir()
    gate_key, review_key = make_key(tmp_path / "gate.pem"), make_key(tmp_path / "review.pem")
    operator = _env(tmp_path, "operator", gate_key)
    reviewer = _env(tmp_path, "reviewer", review_key)
    package, before = snapshot(PACKAGE, skip=("__pycache__",)), _content(snapshot(subject))

    bundle = Path(_run(empty, operator, "gate", row, "--repo", subject,
                       "--out", tmp_path / "evidence"))
    pub = tmp_path / "gate.pub.pem"
    pub.write_bytes(signing.KeySigner(gate_key).public_pem)
    _run(empty, operator, "verify", bundle, "--key", pub)
    reviews = tmp_path / "reviews"
    review = Path(_run(empty, reviewer, "review", bundle, "--key", pub, "--repo", clone,
                       "--row", row, "--reviews", reviews))
    _run(empty, operator, "attest-operator", review)
    merged = _run(empty, reviewer, "merge", "--row", row, "--repo", clone, "--reviews", reviews)

    assert Path(merged).is_file()
    with git.Repo(clone) as repo:  # the reviewer's main now holds the approved head
        assert repo.heads.main.commit.tree == repo.heads.feature.commit.tree
        assert repo.heads.feature.commit in repo.heads.main.commit.parents
    assert snapshot(PACKAGE, skip=("__pycache__",)) == package
    assert _content(snapshot(subject)) == before
    assert not list(empty.iterdir())
