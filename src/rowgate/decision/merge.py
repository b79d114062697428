"""`rowgate merge`: a local `git merge --no-ff` of an approved head, or one line
saying which precondition refused it. gitpython only; nothing here fetches,
pushes or otherwise contacts a remote.

Every outcome (merged, already merged, refused) is written as a signed record
`REVIEWS/ROW/merges/STAMP-HEAD.merge.json` beside its `.merge.sigstore.json`.

Never an unrecorded merge: the merge commit is made as an object first (`git
commit-tree` on the tree `git merge-tree` computed; no ref or file moves), its record
is written, fsynced and signed, and only then does the target branch move, by a
compare-and-swap `git update-ref`. A record that cannot be written (a full disk) means
the branch never moves; a branch that cannot move takes the record away again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import git

from rowgate import __version__
from rowgate.decision.attest import attestation_path, load_attestation
from rowgate.decision.record_files import file_record, file_sha256, now, signature_path, verify_record
from rowgate.decision.review import bundle_verifier, load_review
from rowgate.errors import Error, RepoError, UsageError
from rowgate.records.merge import MergeOutcome, MergeRecord
from rowgate.records.review import ReviewRecord, Verdict
from rowgate.records.status import Status
from rowgate.rows.row import LoadedRow
from rowgate.seal.bundle import Bundle
from rowgate.seal.gitrepo import SIGNED_OFF, local_branch, merge_tree, open_repo, target_branch
from rowgate.seal.signing import Signer


class _Refused(Exception):
    def __init__(self, precondition: str, message: str):
        super().__init__(message)
        self.precondition = precondition
        self.message = message


@dataclass(frozen=True)
class MergeResult:
    record: MergeRecord
    path: Path


@dataclass
class _Approval:
    """What the review preconditions established."""

    path: Path
    record: ReviewRecord
    digest: str


# ----------------------------------------------------------- preconditions


def _check_clean(repo: git.Repo, reviews_dir: Path) -> None:
    work = Path(repo.working_dir).resolve()
    try:
        allowed = reviews_dir.resolve().relative_to(work).as_posix().rstrip("/") + "/"
    except ValueError:
        allowed = None
    # -z: paths verbatim (no quoting); a rename entry is followed by its old path.
    entries = repo.git.status("--porcelain=v1", "-z", "--untracked-files=all").split("\0")
    dirty, skip = [], False
    for entry in entries:
        if skip or not entry:
            skip = False
            continue
        code, path = entry[:2], entry[3:]
        skip = code[0] in "RC"
        if code == "??" and allowed and path.startswith(allowed):
            continue
        dirty.append(f"{code.strip()} {path}")
    if dirty:
        more = f" and {len(dirty) - 1} more" if len(dirty) > 1 else ""
        raise _Refused("clean-tree", f"working tree not clean: {dirty[0]}{more} (commit or "
                                     f"remove them; only the reviews dir may hold untracked files)")


def _find_review(reviews_dir: Path, row_id: str, head: str) -> tuple[Path, ReviewRecord]:
    found = []
    unreadable: list[str] = []
    for path in sorted((reviews_dir / row_id).glob("*.review.json")):
        try:
            record = load_review(path)
        except Error as exc:
            unreadable.append(exc.diagnostics())  # cannot approve anything; said below
            continue
        if record.subject is not None and record.subject.commit == head:
            found.append((record.created, path.stat().st_mtime_ns, path.name, path, record))
    if not found:
        also = f"; unreadable: {unreadable[0]}" if unreadable else ""
        raise _Refused("review", f"no review of HEAD {head[:12]} in {reviews_dir / row_id} "
                                 f"(run rowgate review on a bundle of this commit){also}")
    *_, path, record = max(found, key=lambda item: item[:3])  # the latest review
    return path, record


def _check_review(path: Path, record: ReviewRecord, loaded: LoadedRow, signer: Signer) -> None:
    me = signer.identity
    if (record.reviewer.kind, record.reviewer.id) != (me.kind, me.id):
        raise _Refused("review", f"review {path.name} was signed by {record.reviewer}; merge "
                                 f"accepts reviews signed by the merger ({me})")
    try:
        verify_record(signer.verifier(), path)
    except Error as exc:
        raise _Refused("review", f"review signature does not verify: {exc.diagnostics()}") from exc
    recorded = record.freshness.row_sha256 if record.freshness else ""
    if recorded and recorded != loaded.sha256:
        raise _Refused("review", f"row file {loaded.path} changed since review {path.name} "
                                 f"(sha256 {loaded.sha256[:12]} now, {recorded[:12]} reviewed)")


def _check_bundle(record: ReviewRecord) -> Bundle:
    ref = record.bundle
    if ref.verifier is None:
        raise _Refused("bundle", f"review of bundle {ref.id} records no verifier for it")
    try:
        bundle = Bundle.open(Path(ref.path))
        bundle.verify(bundle_verifier(ref.verifier))
    except Error as exc:
        why = f"bundle {ref.id} no longer verifies: {exc.diagnostics()}"
        raise _Refused("bundle", why) from exc
    return bundle


def _check_pending(bundle: Bundle) -> None:
    pending = [g for g in bundle.manifest.gates if g.status is Status.PENDING]
    if pending:
        listed = "; ".join(f"{g.gate_id}: {g.reason}" for g in pending)
        raise _Refused("pending", f"PENDING gate(s) in bundle {bundle.id}: {listed}")


def _check_verdict(path: Path, record: ReviewRecord) -> None:
    if record.verdict is not Verdict.APPROVE:
        raise _Refused("approve", f"review {path.name} is not APPROVE: {record.summary}")


def _check_attestation(review: Path, record: ReviewRecord, digest: str) -> None:
    path = attestation_path(review)
    verifier = record.bundle.verifier
    if verifier is None:  # _check_bundle has refused such a review already
        raise _Refused("bundle", f"review of bundle {record.bundle.id} records no verifier for it")
    if not path.exists():
        raise _Refused("attestation", f"the row requires an operator attestation and there is "
                                      f"none for bundle {record.bundle.id} ({path.name}: run "
                                      f"rowgate attest-operator {review})")
    try:
        att = load_attestation(path)
        verify_record(bundle_verifier(verifier), path)
    except Error as exc:
        raise _Refused("attestation", f"operator attestation {path.name} does not verify as the "
                                      f"bundle's signer: {exc.diagnostics()}") from exc
    if att.bundle_id != record.bundle.id or att.review_sha256 != digest:
        raise _Refused("attestation", f"operator attestation {path.name} is bound to bundle "
                                      f"{att.bundle_id} / review sha256 {att.review_sha256[:12]}, "
                                      f"not to this review (sha256 {digest[:12]})")


def _check_dco(repo: git.Repo, base: str, head: str) -> None:
    unsigned = [c for c in repo.iter_commits(f"{base}..{head}")
                if not SIGNED_OFF.search(_commit_text(c))]
    if unsigned:
        c = unsigned[0]
        raise _Refused("dco", f"{len(unsigned)} commit(s) since the base lack a DCO "
                              f"Signed-off-by, first {c.hexsha[:12]} {c.summary!r}")


def _commit_text(commit: git.Commit) -> str:
    # GitPython keeps the raw bytes only when the commit's declared encoding is unknown
    message = commit.message
    return message if isinstance(message, str) else message.decode("utf-8", "replace")


def _check_change(repo: git.Repo, base: str, head: git.Commit) -> None:
    if repo.commit(base).tree.hexsha == head.tree.hexsha:
        raise _Refused("change", f"nothing to merge: tree of HEAD is identical to base "
                                 f"({head.hexsha[:12]} and {base[:12]} both have tree "
                                 f"{head.tree.hexsha[:12]})")


def _merged_tree(repo: git.Repo, into: str, head: str) -> str:
    """The tree a three-way merge of `head` into `into` gives (`gitrepo.merge_tree`)."""
    tree, paths = merge_tree(repo, into, head)
    if tree is None:
        files = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        raise _Refused("conflict", f"merging HEAD into {into} conflicts ({files})")
    return tree


def _approval(repo: git.Repo, loaded: LoadedRow, reviews_dir: Path, signer: Signer,
              head: git.Commit) -> _Approval:
    """Every precondition, in the documented order; raises _Refused at the first."""
    _check_clean(repo, reviews_dir)
    path, record = _find_review(reviews_dir, loaded.row.id, head.hexsha)
    _check_review(path, record, loaded, signer)
    bundle = _check_bundle(record)
    _check_pending(bundle)
    _check_verdict(path, record)
    digest = file_sha256(path)
    if loaded.row.review.require_operator_attestation:
        _check_attestation(path, record, digest)
    if record.subject is None:  # _find_review picks only reviews of a subject commit
        raise _Refused("review", f"review {path.name} records no subject")
    base = record.subject.base
    try:
        repo.commit(base)
    except ValueError as exc:
        raise _Refused("review", f"the reviewed base {base[:12]} is not in this repo") from exc
    _check_dco(repo, base, head.hexsha)
    _check_change(repo, base, head)
    return _Approval(path=path, record=record, digest=digest)


# -------------------------------------------------------------------- merge


def _message(loaded: LoadedRow, branch: str, into: str, approval: _Approval) -> str:
    r = approval.record
    return (f"Merge branch '{branch}' into {into}\n\n"
            f"Row {loaded.row.id}: bundle {r.bundle.id} approved by {r.reviewer}.\n\n"
            f"Rowgate-Row: {loaded.row.id}\n"
            f"Rowgate-Bundle: {r.bundle.id}\n"
            f"Rowgate-Review: sha256:{approval.digest}\n")


def _merge_commit(repo: git.Repo, tree: str, into_before: str, head: str, message: str) -> str:
    """The `--no-ff` merge commit of `head` into `into` as an object only: parents
    (into, head), the tree merge-tree computed, signed off by the committer as `git
    merge --signoff` does. No ref, index or file changes."""
    ident = repo.git.var("GIT_COMMITTER_IDENT").rsplit(" ", 2)[0]
    return str(repo.git.commit_tree(tree, "-p", into_before, "-p", head,
                                    "-m", f"{message}Signed-off-by: {ident}\n"))


def _move_branch(repo: git.Repo, into: str, commit: str, before: str) -> None:
    """`into` from `before` to `commit` (compare-and-swap: a branch moved meanwhile is
    left alone), then the work tree checked out on it as a merge leaves it."""
    try:
        repo.git.update_ref(f"refs/heads/{into}", commit, before)
    except git.GitCommandError as exc:
        raise RepoError(f"cannot move {into} to the merge commit {commit[:12]}: "
                        f"{(exc.stderr or '').strip()}") from exc
    try:
        repo.git.checkout(into)
    except git.GitCommandError as exc:
        raise RepoError(f"merged and recorded, but checking out {into} failed: "
                        f"{(exc.stderr or '').strip()}") from exc


def merge(loaded: LoadedRow, repo_path: Path, into: str | None, reviews_dir: Path,
          signer: Signer) -> MergeResult:
    """Merge the checked-out head into `into` if every precondition holds; record it."""
    with open_repo(repo_path) as repo:  # closing ends git's persistent cat-file processes
        return _merge(loaded, repo, into, reviews_dir, signer)


def _merge(loaded: LoadedRow, repo: git.Repo, into: str | None, reviews_dir: Path,
           signer: Signer) -> MergeResult:
    into = local_branch(repo, into) if into else target_branch(repo, loaded.row.review.merge_into)
    if repo.head.is_detached:
        raise UsageError(f"{repo.working_dir}: HEAD is detached; check out the branch to merge")
    branch = repo.active_branch.name
    if branch == into:
        raise UsageError(f"{repo.working_dir}: HEAD is {into} itself; check out the branch to "
                         f"merge into it")
    head = repo.head.commit
    into_before = repo.heads[into].commit
    fields = dict(rowgate_version=__version__, created=now(), row_id=loaded.row.id,
                  repo=str(Path(repo.working_dir).resolve()), branch=branch, head=head.hexsha,
                  into=into, into_before=into_before.hexsha, merger=signer.identity)
    try:
        approval = _approval(repo, loaded, reviews_dir, signer, head)
        tree = _merged_tree(repo, into, head.hexsha)
    except _Refused as refusal:
        record = MergeRecord(outcome=MergeOutcome.REFUSED,
                             message=f"merge refused ({refusal.precondition}): {refusal.message}",
                             precondition=refusal.precondition, **fields)
        return _finish(record, reviews_dir, signer)
    fields.update(bundle_id=approval.record.bundle.id, review_file=approval.path.name,
                  review_sha256=approval.digest, merged_tree=tree)
    if tree == into_before.tree.hexsha:
        # The change is already in `into` (e.g. applied there by another route):
        # record it as merged; an empty merge commit would add nothing but noise.
        record = MergeRecord(outcome=MergeOutcome.ALREADY_MERGED, into_after=into_before.hexsha,
                             message=f"already merged: merging {head.hexsha[:12]} into {into} "
                                     f"yields {into}'s tree {tree[:12]}; no merge commit made",
                             **fields)
        return _finish(record, reviews_dir, signer)
    commit = _merge_commit(repo, tree, into_before.hexsha, head.hexsha,
                           _message(loaded, branch, into, approval))
    record = MergeRecord(outcome=MergeOutcome.MERGED, into_after=commit, merge_commit=commit,
                         message=f"merged {branch} ({head.hexsha[:12]}) into {into}: merge "
                                 f"commit {commit[:12]}, bundle {approval.record.bundle.id}",
                         **fields)
    result = _finish(record, reviews_dir, signer)  # recorded (fsynced, signed) first
    try:
        _move_branch(repo, into, commit, into_before.hexsha)
    except RepoError:
        if repo.heads[into].commit.hexsha != commit:  # not merged: no record of a merge
            result.path.unlink(missing_ok=True)
            signature_path(result.path).unlink(missing_ok=True)
        raise
    return result


def _finish(record: MergeRecord, reviews_dir: Path, signer: Signer) -> MergeResult:
    stamp = record.created.replace("-", "").replace(":", "").replace("+0000", "Z")
    path = reviews_dir / record.row_id / "merges" / f"{stamp}-{record.head[:12]}.merge.json"
    n = 1
    while path.exists():  # two merges of one head in the same second
        n += 1
        path = path.with_name(f"{stamp}-{record.head[:12]}-{n}.merge.json")
    what = "no merge was made" if record.outcome is MergeOutcome.MERGED else \
        "the merge record was not written"
    file_record(record, "merge", path, signer, what)
    return MergeResult(record=record, path=path)
