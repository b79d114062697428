"""Freshness: what moved in the reviewer's clone since the bundle was sealed (branch
head, merge-base with the row's merge target, the row file), each one `stale: …` line."""

from __future__ import annotations

from pathlib import Path

import git

from rowgate.records.provenance import Subject
from rowgate.records.review import Freshness
from rowgate.seal.gitrepo import default_base, local_branch


def freshness(repo: git.Repo, subject: Subject, into: str, row_sha256: str,
              recorded_row_sha256: str, row_file: Path) -> Freshness:
    """What moved since sealing, each as one `stale: …` line."""
    where = repo.working_dir
    moved: list[str] = []
    head = base = ""
    try:
        commit = repo.commit(subject.commit)
    except (ValueError, git.BadName):
        commit = None
        moved.append(f"stale: subject commit {subject.commit[:12]} is not in {where}")
    if subject.branch == "(detached)":
        head = repo.head.commit.hexsha
        label = "HEAD"
    elif subject.branch in repo.heads:
        head = repo.heads[subject.branch].commit.hexsha
        label = f"branch {subject.branch}"
    else:
        label = ""
        moved.append(f"stale: branch {subject.branch} does not exist in {where}")
    if label and head != subject.commit:
        moved.append(f"stale: {label} moved from {subject.commit[:12]} to {head[:12]}")
    if commit is not None:
        base = default_base(repo, commit, local_branch(repo, into)) or ""
        if base != subject.base:
            moved.append(f"stale: base moved: merge-base with {into} is now "
                         f"{base[:12] or '(none)'}, the bundle recorded {subject.base[:12]}")
    if row_sha256 != recorded_row_sha256:
        moved.append(f"stale: row file {row_file} changed: sha256 {row_sha256[:12]} now, the "
                     f"bundle recorded {recorded_row_sha256[:12]}")
    return Freshness(branch_head=head, merge_base=base, row_sha256=row_sha256, moved=moved)
