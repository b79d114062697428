"""The subject's git repository through gitpython: open it, name its branches, find the
base a change is gated against. Nothing here fetches, pushes or writes."""

from __future__ import annotations

import re
from pathlib import Path

import git

from pipeline.errors import RepoError

MAIN_BRANCHES = ("main", "master")
SIGNED_OFF = re.compile(r"^Signed-off-by: .+ <[^<>@\s]+@[^<>\s]+>\s*$", re.MULTILINE)
"""A DCO sign-off trailer (`git commit -s`): the host gate and the merge require one on
every commit since the base."""


def open_repo(path: Path) -> git.Repo:
    try:
        return git.Repo(path, search_parent_directories=False)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise RepoError(f"--repo {path}: not a git repository") from exc


def main_branch(repo: git.Repo) -> str:
    names = {h.name for h in repo.heads}
    for name in MAIN_BRANCHES:
        if name in names:
            return name
    raise RepoError(f"{repo.working_dir}: no branch {' or '.join(MAIN_BRANCHES)}")


def local_branch(repo: git.Repo, name: str) -> str:
    """`name` if it is a local branch; rowgate never fetches, so a branch that exists
    only as a remote-tracking ref is the user's to create."""
    if name in repo.heads:
        return name
    tracking = [r.name for r in repo.refs if isinstance(r, git.RemoteReference)
                and r.remote_head == name]
    hint = f" (create it: git branch {name} {tracking[0]})" if tracking else ""
    raise RepoError(f"{repo.working_dir}: no local branch {name}{hint}")


def default_base(repo: git.Repo, head: git.Commit, main: str) -> str | None:
    """The base a gate records for `head` (and the review re-computes for freshness):
    the merge-base with `main`, or None when they share no history."""
    bases = repo.merge_base(head, repo.heads[main].commit)
    if not bases:
        return None
    base = bases[0]
    # On main itself the merge-base is HEAD: the change under gate is then the
    # last commit, so the base is its first parent (the root commit has none).
    if base.hexsha == head.hexsha and head.parents:
        base = head.parents[0]
    return base.hexsha
