"""Is there a change to gate, and is its effect already in the merge target?

The SM70 row's review history: its PR head once had a tree byte-for-byte identical to
its base (zero changed files: nothing to merge), and later a three-way merge of it
into main gave exactly main's tree (its change was already present). Both are found
from the subject's commits alone, before any criterion is read: an empty change is
refused (`no change to gate`), a change already in the target is reported (`already
present in <branch>`; the merge then records it as merged without a merge commit).
"""

from __future__ import annotations

import git

from rowgate.errors import RepoError
from rowgate.records.provenance import Subject
from rowgate.seal.gitrepo import local_branch, merge_tree


def empty_change(repo: git.Repo, commit: str, base: str) -> str | None:
    """Why `commit` has nothing to gate against `base` (equal trees), or None."""
    try:
        head_tree, base_tree = repo.commit(commit).tree.hexsha, repo.commit(base).tree.hexsha
    except (ValueError, git.BadName):
        return None  # freshness reports a commit that is not in the clone
    if head_tree != base_tree:
        return None
    return (f"no change to gate: head {commit[:12]} has the tree of its base {base[:12]} "
            f"({head_tree[:12]}): zero changed files")


def already_present(repo: git.Repo, subject: Subject, into: str) -> str | None:
    """`already present in <into>` when merging the head into `into` changes nothing."""
    try:
        target = repo.heads[local_branch(repo, into)].commit
        tree, _ = merge_tree(repo, target.hexsha, subject.commit)
    except (RepoError, ValueError, git.BadName, git.GitCommandError):
        return None  # no target branch or commit here: freshness reports what is missing
    if tree is None or tree != target.tree.hexsha:
        return None
    return (f"already present in {into}: a three-way merge of {subject.commit[:12]} into "
            f"{into} gives {into}'s own tree {tree[:12]}; merging it adds nothing")
