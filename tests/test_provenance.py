"""Provenance against real repositories: commit, tree, base, dirty."""

from __future__ import annotations

from pathlib import Path

import pytest

from rowgate.errors import RepoError
from rowgate.run import provenance
from tests.support import commit_file


def test_feature_branch_base_is_merge_base(git_repo):
    main_head = git_repo.heads["main"].commit
    s = provenance.subject(Path(git_repo.working_dir))
    assert s.branch == "feature" and s.base_branch == "main"
    assert s.commit == git_repo.head.commit.hexsha and s.tree == git_repo.head.commit.tree.hexsha
    assert s.base == main_head.hexsha and not s.dirty


def test_the_base_is_taken_against_the_rows_merge_target_where_it_exists(git_repo):
    # a release branch one commit ahead of main: a change meant for it has that base
    git_repo.git.checkout("main")
    git_repo.git.checkout("-b", "release")
    release_head = commit_file(git_repo, "rel.txt", "r\n", "release moves").hexsha
    git_repo.git.checkout("-b", "fix")
    commit_file(git_repo, "fix.txt", "f\n", "the fix")
    path = Path(git_repo.working_dir)
    into = provenance.subject(path, into="release")
    assert into.base_branch == "release" and into.base == release_head
    against_main = provenance.subject(path)
    assert against_main.base_branch == "main" and against_main.base != release_head
    assert provenance.subject(path, into="no-such-branch").base_branch == "main"


def test_on_main_the_base_is_the_first_parent(git_repo):
    git_repo.git.checkout("main")
    s = provenance.subject(Path(git_repo.working_dir))
    assert s.base == git_repo.head.commit.parents[0].hexsha


def test_base_stays_after_main_moves(git_repo):
    old_base = git_repo.heads["main"].commit.hexsha
    git_repo.git.checkout("main")
    commit_file(git_repo, "other.txt", "x\n", "main moves")
    git_repo.git.checkout("feature")
    assert provenance.subject(Path(git_repo.working_dir)).base == old_base


def test_dirty_flag(git_repo):
    (Path(git_repo.working_dir) / "README.md").write_text("changed\n")
    assert provenance.subject(Path(git_repo.working_dir)).dirty


def test_explicit_base_must_exist(git_repo):
    with pytest.raises(RepoError, match="--base nope"):
        provenance.subject(Path(git_repo.working_dir), base="nope")


def test_host_and_packages():
    p = provenance.collect()
    assert p.host.cores >= 1 and p.host.python.count(".") == 2
    assert "pydantic" in p.packages and "model-signing" in p.packages
    assert p.gpus == [] or all(g.arch.startswith("sm_") for g in p.gpus)
