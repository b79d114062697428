"""Host gate against real git repositories."""

from __future__ import annotations

from pathlib import Path

import git

from rowgate.gates.host import Host
from rowgate.gates.interface import GateContext, run_gate
from rowgate.records.status import Status
from rowgate.rows.row import load_row
from rowgate.run import provenance
from tests.support import HOST_GATE, commit_file, write_row


def _run(repo_path: Path, row_path: Path, tmp_path: Path):
    loaded = load_row(row_path)
    ctx = GateContext(repo=repo_path, artifact_dir=tmp_path / "stage" / "artifacts" / "host",
                      subject=provenance.subject(repo_path), provenance=provenance.collect())
    return run_gate(Host(), loaded.row, loaded.row.gates[0], ctx, tmp_path / "stage")


def test_clean_signed_repo_passes(git_repo, host_row, tmp_path):
    result = _run(Path(git_repo.working_dir), host_row, tmp_path)
    assert result.status is Status.PASS, result.reason
    assert result.metrics["commits_since_base"] == 1
    assert "artifacts/host/command-0.log" in result.artifacts


def test_dirty_tree_fails(git_repo, host_row, tmp_path):
    (Path(git_repo.working_dir) / "untracked.txt").write_text("x\n")
    result = _run(Path(git_repo.working_dir), host_row, tmp_path)
    assert result.status is Status.FAIL
    assert "working tree not clean" in result.reason and "untracked.txt" in result.reason


def test_unsigned_commit_fails_naming_it(git_repo, host_row, tmp_path):
    bad = commit_file(git_repo, "src/other.txt", "x\n", "no sign-off here", signoff=False)
    result = _run(Path(git_repo.working_dir), host_row, tmp_path)
    assert result.status is Status.FAIL
    assert bad.hexsha[:12] in result.reason and "without DCO" in result.reason
    assert result.metrics["commits_without_signoff"] == 1


def test_signoff_must_be_a_trailer_with_email(git_repo, host_row, tmp_path):
    commit_file(git_repo, "src/x.txt", "x\n", "mentions Signed-off-by: inline only", signoff=False)
    result = _run(Path(git_repo.working_dir), host_row, tmp_path)
    assert result.status is Status.FAIL


def test_failing_command_fails(git_repo, tmp_path):
    row = write_row(tmp_path, "FAILCMD", HOST_GATE.replace(
        "print('ok')", "import sys; print('boom'); sys.exit(3)"))
    result = _run(Path(git_repo.working_dir), row, tmp_path)
    assert result.status is Status.FAIL and "exited 3" in result.reason


def test_missing_command_fails(git_repo, tmp_path):
    row = write_row(tmp_path, "NOCMD", HOST_GATE.replace('["python", "-c", "print(\'ok\')"]',
                                                         '["no-such-tool-xyz"]'))
    result = _run(Path(git_repo.working_dir), row, tmp_path)
    assert result.status is Status.FAIL and "exited 127" in result.reason


def test_derive_is_pure_and_repeatable(git_repo, host_row, tmp_path):
    result = _run(Path(git_repo.working_dir), host_row, tmp_path)
    again = Host().derive(load_row(host_row).row, load_row(host_row).row.gates[0],
                          tmp_path / "stage" / "artifacts" / "host")
    assert (again.status, again.reason, again.metrics) == (result.status, result.reason, result.metrics)


def test_a_head_with_its_base_tree_is_no_change_to_gate(git_repo, host_row, tmp_path):
    """The SM70 PR's head: a signed commit with zero changed files."""
    git_repo.git.reset("--hard", "main")
    git_repo.git.commit("--allow-empty", "-s", "-m", "empty change")
    result = _run(Path(git_repo.working_dir), host_row, tmp_path)
    assert result.status is Status.FAIL and result.metrics["changed"] == 0
    assert result.reason.startswith("no change to gate: head ")
    assert "has the tree of its base" in result.reason


def test_a_subject_directory_inside_a_repository_is_gated_there(tmp_path, capsys):
    """`--repo` names a monorepo's project: git is read at the repository's root, the
    commands run in the project directory, and the bundle records it as `subject.path`."""
    import json

    import pytest

    from rowgate.cli import main as cli

    repo = git.Repo.init(tmp_path / "mono", initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Test Author")
        cw.set_value("user", "email", "author@example.com")
    commit_file(repo, "README.md", "mono\n", "initial")
    repo.git.checkout("-b", "feature")
    commit_file(repo, "proj/marker.txt", "here\n", "the project")
    row = write_row(tmp_path / "rows", "TEST-MONO", '''
        [[gates]]
        id = "host"
        kind = "host"
        commands = [["cat", "marker.txt"]]
    ''')
    with pytest.raises(SystemExit) as exc:
        cli.main(["-q", "gate", str(row), "--repo", str(tmp_path / "mono" / "proj"),
                  "--out", str(tmp_path / "evidence")])
    out = capsys.readouterr().out
    assert exc.value.code == 0, out
    bundle = Path(out.strip().splitlines()[-1])
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["subject"]["path"] == "proj"
    assert manifest["subject"]["repo"] == str((tmp_path / "mono").resolve())
    assert (bundle / "artifacts/host/command-0.log").read_text() == "here\n"
    repo.close()
