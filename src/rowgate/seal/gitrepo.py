"""The subject's git repository through gitpython: open it, name its branches, find the
base a change is gated against. Nothing here fetches, pushes or writes."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import git

from rowgate.errors import RepoError

MAIN_BRANCHES = ("main", "master")
SIGNED_OFF = re.compile(r"^Signed-off-by: .+ <[^<>@\s]+@[^<>\s]+>\s*$", re.MULTILINE)
"""A DCO sign-off trailer (`git commit -s`): the host gate and the merge require one on
every commit since the base."""


def open_repo(path: Path, *, inside: bool = False) -> git.Repo:
    """The repository at `path`; with `inside`, the one `path` is a directory of (a
    subject that is one directory of a larger repository)."""
    try:
        return git.Repo(path, search_parent_directories=inside)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise RepoError(f"--repo {path}: not a git repository") from exc


def main_branch(repo: git.Repo) -> str:
    names = {h.name for h in repo.heads}
    for name in MAIN_BRANCHES:
        if name in names:
            return name
    raise RepoError(f"{repo.working_dir}: no branch {' or '.join(MAIN_BRANCHES)}")


def target_branch(repo: git.Repo, into: str | None) -> str:
    """The branch a change is gated, reviewed and merged against: the row's `merge_into`
    where this repository has it, else its main branch (`main`, else `master`). Gate,
    review and merge use this one rule, so a `master` repository needs no row edit."""
    if into and into in repo.heads:
        return into
    names = {h.name for h in repo.heads}
    found = next((name for name in MAIN_BRANCHES if name in names), None)
    return found or local_branch(repo, into or MAIN_BRANCHES[0])  # raises, with a hint


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


def merge_tree(repo: git.Repo, into: str, head: str) -> tuple[str | None, list[str]]:
    """(tree, []) of a three-way merge of `head` into `into`, or (None, conflicted paths),
    computed without touching the work tree (`git merge-tree --write-tree`, git >= 2.38)."""
    status, out, err = repo.git.merge_tree("--write-tree", "--name-only", into, head,
                                           with_extended_output=True, with_exceptions=False)
    if status == 1:  # conflicts: the tree, the conflicted paths, a blank line, messages
        return None, list(itertools.takewhile(str.strip, out.splitlines()[1:]))
    if status != 0:
        raise RepoError(f"git merge-tree failed (exit {status}): {err.strip()}")
    return out.splitlines()[0].strip(), []
