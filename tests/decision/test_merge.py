"""rowgate merge in real repositories: every outcome and every refusal."""

from __future__ import annotations

import shutil
from pathlib import Path

import git
import pytest

from rowgate.decision import attest, record_files, review
from rowgate.records.merge import MergeOutcome, MergeRecord
from rowgate.seal import signing
from tests.review_support import HOST_ROW, World, commit_file, thaw


@pytest.fixture
def world(tmp_path, monkeypatch, capsys):
    world = World(tmp_path, monkeypatch, capsys)
    yield world
    world.close()


def _approved(world: World, row: Path | None = None) -> tuple[Path, Path]:
    """Gate and APPROVE the current head: (row, review file)."""
    row = row or world.row()
    code, out, err = world.review(world.gate(row), row)
    assert code == 0, (out, err)
    return row, Path(out[-1])


def _merge_record(lines: list[str]) -> MergeRecord:
    path = Path(lines[-1])
    assert path.parent.name == "merges"
    record = record_files.read_record(MergeRecord, "merge", path)
    # every outcome is signed by the merger
    assert record_files.verify_record(signing.default_signer().verifier(), path) == record.merger
    return record


def _refused(world: World, row: Path, precondition: str) -> str:
    main_before = world.repo.heads.main.commit.hexsha
    code, out, err = world.merge(row)
    assert code == 1
    record = _merge_record(out)
    assert (record.outcome, record.precondition) == (MergeOutcome.REFUSED, precondition)
    assert err.strip() == record.message  # one line, the same as recorded
    assert world.repo.heads.main.commit.hexsha == main_before
    return record.message


def _refs(repo: git.Repo) -> str:
    return repo.git.for_each_ref("--format=%(refname) %(objectname)")


def test_approved_head_is_merged_with_trailers_and_the_remote_is_untouched(world, tmp_path):
    remote = git.Repo.init(tmp_path / "remote.git", bare=True, initial_branch="main")
    world.repos.append(remote)
    world.repo.create_remote("origin", remote.git_dir)
    world.repo.git.push("origin", "main", "feature")  # test setup only: the remote has refs
    before = _refs(remote)
    row, review_file = _approved(world)
    head = world.repo.head.commit
    main_before = world.repo.heads.main.commit

    code, out, err = world.merge(row)
    assert code == 0, err
    record = _merge_record(out)
    merge = world.repo.heads.main.commit
    assert record.outcome is MergeOutcome.MERGED and record.merge_commit == merge.hexsha
    assert [p.hexsha for p in merge.parents] == [main_before.hexsha, head.hexsha]  # --no-ff
    trailers = world.repo.git.log("-1", "--format=%(trailers:unfold)", merge.hexsha)
    bundle_id = review_file.name.split(".")[0]
    assert f"Rowgate-Row: TEST-REVIEW\nRowgate-Bundle: {bundle_id}\n" in trailers
    assert f"Rowgate-Review: sha256:{record_files.file_sha256(review_file)}" in trailers
    assert "Signed-off-by: Test Author <author@example.com>" in trailers
    assert merge.tree.hexsha == head.tree.hexsha
    assert world.repo.active_branch.name == "main"
    # nothing contacted the remote: its refs are as they were, nothing was fetched
    assert _refs(remote) == before
    assert not (Path(world.repo.git_dir) / "FETCH_HEAD").exists()
    assert world.repo.git.rev_parse("origin/main") == main_before.hexsha


def test_dirty_tree_is_refused(world):
    row, _ = _approved(world)
    (world.repo_dir / "src" / "kernel.txt").write_text("uncommitted\n")
    assert _refused(world, row, "clean-tree").startswith(
        "merge refused (clean-tree): working tree not clean: M src/kernel.txt")


def test_untracked_file_outside_the_reviews_dir_is_refused(world):
    row, _ = _approved(world)
    (world.repo_dir / "notes.txt").write_text("scratch\n")
    assert "working tree not clean: ?? notes.txt" in _refused(world, row, "clean-tree")


def test_reviews_dir_inside_the_repo_may_hold_untracked_records(world, monkeypatch):
    monkeypatch.chdir(world.repo_dir)  # the reviewer works in their clone
    world.reviews = world.repo_dir / "reviews"
    row, review_file = _approved(world)
    assert review_file.is_relative_to(world.repo_dir)
    code, out, err = world.merge(row)
    assert code == 0, err
    assert _merge_record(out).outcome is MergeOutcome.MERGED


def test_no_review_of_the_head_is_refused(world):
    row, _ = _approved(world)
    new = commit_file(world.repo, "src/kernel.txt", "v3\n", "kernel v3")
    assert f"no review of HEAD {new.hexsha[:12]}" in _refused(world, row, "review")


def test_rejected_review_is_refused(world):
    row = world.row(HOST_ROW.replace('threshold = 0', 'threshold = 7'))
    code, _, _ = world.review(world.gate(row), row)
    assert code == 1
    message = _refused(world, row, "approve")
    assert "is not APPROVE: REJECT: criterion commands-pass" in message


def test_pending_gate_is_refused(world):
    row = world.row(HOST_ROW + '''
        [[gates]]
        id = "tokens"
        kind = "tokens"
    ''', arch="sm_110")
    code, _, _ = world.review(world.gate(row), row)
    assert code == 3
    assert "PENDING gate(s) in bundle" in _refused(world, row, "pending")
    assert "tokens: needs an sm_110 device" in _refused(world, row, "pending")


def test_bundle_that_no_longer_verifies_is_refused(world):
    row, review_file = _approved(world)
    bundle = Path(review.load_review(review_file).bundle.path)
    thaw(bundle)
    (bundle / "artifacts" / "host" / "commits.json").write_text("[]\n")
    assert "no longer verifies: artifacts/host/commits.json" in _refused(world, row, "bundle")


def test_review_signed_by_someone_else_is_refused(world):
    row, _ = _approved(world)
    world.as_gate()  # the gate machine's key tries to merge the reviewer's approval
    code, out, err = world.cli("merge", "--row", row, "--repo", world.repo_dir,
                               "--reviews", world.reviews)
    assert code == 1
    assert err.startswith("merge refused (review): review ")
    assert "merge accepts reviews signed by the merger" in err
    assert _merge_record(out).precondition == "review"


def test_required_attestation_missing_then_present(world):
    row = world.row(attestation=True)
    row, review_file = _approved(world, row)
    assert "requires an operator attestation" in _refused(world, row, "attestation")
    world.as_gate()
    code, _, err = world.cli("attest-operator", review_file)
    assert code == 0, err
    code, out, err = world.merge(row)
    assert code == 0, err
    assert _merge_record(out).outcome is MergeOutcome.MERGED


def test_attestation_of_an_earlier_review_is_refused(world, monkeypatch):
    row = world.row(attestation=True)
    row, review_file = _approved(world, row)
    world.as_gate()
    assert world.cli("attest-operator", review_file)[0] == 0
    # the same bundle reviewed again later: a new record, so a new digest
    monkeypatch.setattr(review, "now", lambda: "2030-01-01T00:00:00+00:00")
    world.review(Path(review.load_review(review_file).bundle.path), row)
    assert "not to this review" in _refused(world, row, "attestation")


def test_attestation_copied_from_another_bundle_is_refused(world):
    row = world.row(attestation=True)
    row, first = _approved(world, row)
    world.as_gate()
    assert world.cli("attest-operator", first)[0] == 0
    row, second = _approved(world, row)  # a second bundle of the same head
    for src in (attest.attestation_path(first), record_files.signature_path(
            attest.attestation_path(first))):
        dst = second.parent / src.name.replace(first.name.split(".")[0],
                                               second.name.split(".")[0])
        dst.write_bytes(src.read_bytes())
    assert "does not verify" in _refused(world, row, "attestation")


def test_commit_without_dco_is_refused(world):
    commit_file(world.repo, "src/extra.txt", "x\n", "unsigned change", signoff=False)
    row = world.row(HOST_ROW.replace('kind = "host"', 'kind = "host"\n    require_dco = false'))
    row, _ = _approved(world, row)
    assert "1 commit(s) since the base lack a DCO Signed-off-by" in _refused(world, row, "dco")


def test_head_whose_tree_equals_its_base_is_refused_at_review_and_merge(world):
    world.repo.git.reset("--hard", "main")  # feature = main, then an empty signed commit
    world.repo.git.commit("--allow-empty", "-s", "-m", "empty change")
    row = world.row()
    bundle = world.gate(row)
    gate = (bundle / "gates" / "host.json").read_text()
    assert '"status": "FAIL"' in gate and "no change to gate: head" in gate
    code, out, _ = world.review(bundle, row)
    assert code == 1
    record = review.load_review(Path(out[-1]))
    assert record.verdict.value == "REJECT"
    assert record.reasons[0].startswith("no change to gate: head")
    # so the merge refuses it (its own check of the trees stays behind that)
    assert "is not APPROVE: REJECT: no change to gate" in _refused(world, row, "approve")


def test_change_already_in_main_is_recorded_without_a_merge_commit(world):
    row, _ = _approved(world)
    feature = world.repo.active_branch.name
    world.repo.git.checkout("main")
    commit_file(world.repo, "src/kernel.txt", "v2\n", "kernel v2, applied directly")
    world.repo.git.checkout(feature)
    main_before = world.repo.heads.main.commit.hexsha

    code, out, err = world.merge(row)
    assert code == 0, err
    record = _merge_record(out)
    assert record.outcome is MergeOutcome.ALREADY_MERGED
    assert out[0].startswith("already merged: merging")
    assert world.repo.heads.main.commit.hexsha == main_before == record.into_after
    assert record.merged_tree == world.repo.heads.main.commit.tree.hexsha
    assert record.merge_commit == ""


def test_conflicting_change_is_refused(world):
    row, _ = _approved(world)
    feature = world.repo.active_branch.name
    world.repo.git.checkout("main")
    commit_file(world.repo, "src/kernel.txt", "v9\n", "kernel v9 on main")
    world.repo.git.checkout(feature)
    assert "conflicts (src/kernel.txt)" in _refused(world, row, "conflict")


def test_bundle_from_another_machine_is_reviewed_and_merged_in_the_reviewers_clone(world, tmp_path):
    """The gate machine's repo and evidence stay there; the reviewer has a clone and a
    copy of the bundle (and the row), and the gate repo is the clone's remote."""
    row = world.row()
    sealed = world.gate(row)
    clone = git.Repo.clone_from(world.repo_dir, tmp_path / "reviewer" / "clone")
    world.repos.append(clone)
    world.repo = clone  # from here on, everything happens in the reviewer's clone
    # the clone checked out the remote's HEAD (feature); main is only origin/main
    code, _, err = world.review(sealed, row)
    assert code == 2
    assert err.strip().endswith("no local branch main (create it: git branch main origin/main)")
    clone.git.branch("main", "origin/main")
    with clone.config_writer() as cw:
        cw.set_value("user", "name", "Reviewer")
        cw.set_value("user", "email", "reviewer@example.com")
    moved = tmp_path / "reviewer" / "inbox" / sealed.parent.name / sealed.name
    shutil.copytree(sealed, moved)
    gate_refs = _refs(world.open(tmp_path / "subject"))

    code, out, err = world.review(moved, row)
    assert code == 0, err
    assert review.load_review(Path(out[-1])).bundle.path == str(moved)
    code, out, err = world.merge(row)
    assert code == 0, err
    merge = clone.heads.main.commit
    assert "Signed-off-by: Reviewer <reviewer@example.com>" in merge.message
    assert _refs(world.open(tmp_path / "subject")) == gate_refs  # origin untouched


@pytest.mark.parametrize("where", ["detached", "on-target"])
def test_head_that_is_not_a_branch_to_merge_is_a_usage_error(world, where):
    row, _ = _approved(world)
    world.repo.git.checkout("--detach" if where == "detached" else "main")
    code, out, err = world.merge(row)
    assert code == 2 and out == []
    assert ("HEAD is detached" if where == "detached" else "HEAD is main itself") in err
