"""rowgate review / attest-operator on real bundles, real repos, real signatures."""

from __future__ import annotations

import json
from pathlib import Path

import git
import pytest

from rowgate.decision import attest, criteria, record_files, review
from rowgate.errors import VerificationError
from rowgate.records import schema
from rowgate.records.gate_result import GateResult
from rowgate.records.review import Outcome, ReviewRecord, Verdict
from rowgate.records.status import Status
from rowgate.rows.row import Row
from rowgate.seal import signing
from rowgate.seal.bundle import Bundle
from tests.review_support import HOST_ROW, World, commit_file, thaw


@pytest.fixture
def world(tmp_path, monkeypatch, capsys):
    world = World(tmp_path, monkeypatch, capsys)
    yield world
    world.close()


def _record(lines: list[str]) -> tuple[Path, ReviewRecord]:
    path = Path(lines[-1])
    return path, review.load_review(path)


def test_approve_writes_a_signed_schema_valid_record(world):
    bundle = world.gate(world.row())
    code, out, err = world.review(bundle, world.row())
    assert code == 0, err
    path, record = _record(out)
    assert path == world.reviews / "TEST-REVIEW" / f"{bundle.name}.review.json"
    assert record.verdict is Verdict.APPROVE and record.summary == "APPROVE"
    schema.validate("review", json.loads(path.read_text()), str(path))
    [line] = record.criteria
    assert (line.id, line.outcome, line.measured, line.threshold) == (
        "commands-pass", Outcome.PASS, {"(gate)": 0}, 0.0)
    assert [g.rederived for g in record.gates] == ["consistent"]
    assert record.freshness.moved == []
    reviewer = world.as_reviewer()
    assert record.reviewer == reviewer.identity
    assert record_files.verify_record(reviewer.verifier(), path) == reviewer.identity
    # the signature covers the record: one changed byte and it no longer verifies
    path.write_text(path.read_text().replace('"APPROVE"', '"APPROVE" '))
    with pytest.raises(VerificationError):
        record_files.verify_record(reviewer.verifier(), path)


def test_review_with_the_bundle_signers_key_is_refused(world):
    bundle = world.gate(world.row())
    world.as_gate()
    code, out, err = world.cli("review", bundle, "--repo", world.repo_dir, "--row", world.row(),
                               "--reviews", world.reviews, "--key", world.gate_pub)
    assert code == 2
    assert "fresh review refused" in err and "signed the bundle" in err
    assert not world.reviews.exists()


def test_review_needs_the_bundle_signers_key(world):
    bundle = world.gate(world.row())
    world.as_reviewer()
    code, _, err = world.cli("review", bundle, "--repo", world.repo_dir, "--row", world.row(),
                             "--reviews", world.reviews)
    assert code == 2 and "--key" in err


def test_new_commit_after_the_bundle_is_stale(world):
    bundle = world.gate(world.row())
    old = world.repo.head.commit.hexsha
    new = commit_file(world.repo, "src/kernel.txt", "v3\n", "kernel v3").hexsha
    code, out, _ = world.review(bundle, world.row())
    assert code == 1
    _, record = _record(out)
    assert record.verdict is Verdict.REJECT
    assert record.summary == (f"REJECT: stale: branch feature moved from {old[:12]} to "
                              f"{new[:12]}")


def test_edited_row_file_is_stale(world):
    row = world.row()
    bundle = world.gate(row)
    row.write_text(row.read_text() + "\n# edited after the gate ran\n")
    code, out, _ = world.review(bundle, row)
    assert code == 1
    _, record = _record(out)
    assert record.reasons[0].startswith(f"stale: row file {row} changed")
    assert record.criteria == []  # criteria of another row text are not evaluated


def test_base_that_is_not_the_merge_base_is_stale(world):
    first = world.repo.commit("main~1").hexsha
    bundle = world.gate(world.row(), base=first)
    code, out, _ = world.review(bundle, world.row())
    assert code == 1
    assert "stale: base moved: merge-base with main is now" in _record(out)[1].summary


def test_a_change_for_another_branch_is_fresh_against_that_branch(world):
    # the row merges into `release` (one commit ahead of main): the gate records the
    # merge-base with release, which is what the review recomputes
    world.repo.git.checkout("main")
    world.repo.git.checkout("-b", "release")
    commit_file(world.repo, "release.txt", "r\n", "release moves")
    world.repo.git.checkout("-b", "fix")
    commit_file(world.repo, "src/kernel.txt", "v3\n", "kernel fix")
    row = world.row(merge_into="release")
    code, out, _ = world.review(world.gate(row), row)
    _, record = _record(out)
    assert not [r for r in record.reasons if r.startswith("stale")], record.reasons
    assert record.freshness.merge_base == world.repo.heads["release"].commit.hexsha


def test_resigned_bundle_whose_summary_was_edited_is_inconsistent(world):
    failing = HOST_ROW.replace('[["git", "status", "--short"]]',
                               '[["python", "-c", "raise SystemExit(3)"]]')
    row = world.row(failing)
    bundle = world.gate(row)
    assert Bundle.open(bundle).manifest.status is Status.FAIL
    sealed = Bundle.open(bundle).gate_result("host")
    forged = world.resign_edited(
        bundle, "host", status="PASS", reason="clean tree, 2 commit(s) signed off",
        metrics={**sealed.metrics, "commands_failed": 0})
    # validly signed by the gate machine's own key: verify alone cannot tell
    assert Bundle.open(forged).verify(signing.KeyVerifier(world.gate_pub)).id.startswith("sha256:")
    code, out, _ = world.review(forged, row)
    assert code == 1
    _, record = _record(out)
    assert record.summary.startswith(
        "REJECT: inconsistent: gate host: status: sealed 'PASS', re-derived 'FAIL'")
    assert record.gates[0].rederived == "inconsistent"
    # criteria are judged on the re-derived values, not the forged summary
    assert record.criteria[0].measured == {"(gate)": 1}


def test_bundle_that_does_not_verify_is_rejected_with_the_reason(world):
    bundle = world.gate(world.row())
    thaw(bundle)
    (bundle / "artifacts" / "host" / "status.txt").write_text("tampered\n")
    code, out, _ = world.review(bundle, world.row())
    assert code == 1
    _, record = _record(out)
    assert record.summary.startswith("REJECT: invalid bundle: artifacts/host/status.txt: sha256")


def test_bundle_whose_manifest_is_unreadable_is_rejected_on_the_record(world):
    bundle = world.gate(world.row())
    thaw(bundle)
    (bundle / "manifest.json").write_text("{ not json")
    code, out, _ = world.review(bundle, world.row())
    assert code == 1
    path, record = _record(out)
    assert path == world.reviews / "TEST-REVIEW" / f"{bundle.name}.review.json"
    assert record.summary.startswith("REJECT: invalid bundle: manifest.json: not JSON")
    assert record.bundle.signer is not None and record.subject is None


def test_pending_gate_makes_the_verdict_pending(world):
    row = world.row(HOST_ROW + '''
        [[gates]]
        id = "tokens"
        kind = "tokens"

        [[pending]]
        gate = "tokens"
        reason = "no sm_110 device here"
        until = "a Thor runs the gate"
    ''', arch="sm_110")
    bundle = world.gate(row)
    code, out, _ = world.review(bundle, row)
    assert code == 3
    _, record = _record(out)
    assert record.verdict is Verdict.PENDING
    [item] = record.pending
    assert item.gate == "tokens" and "sm_110" in item.reason
    assert item.until == "a Thor runs the gate"
    assert record.summary.startswith("PENDING: gate tokens PENDING: needs an sm_110 device")
    assert [g.rederived for g in record.gates] == ["consistent", "not re-derivable"]


def test_failing_criterion_rejects(world):
    row = world.row(HOST_ROW + '''
        [[criteria]]
        id = "five-commands"
        gate = "host"
        metric = "commands"
        comparison = "ge"
        threshold = 5
    ''')
    code, out, _ = world.review(world.gate(row), row)
    assert code == 1
    _, record = _record(out)
    assert record.summary == ("REJECT: criterion five-commands: commands >= 5 does not hold: "
                              "(gate)=1")
    assert [c.outcome for c in record.criteria] == [Outcome.PASS, Outcome.FAIL]


def test_refuse_stop_condition_rejects(world):
    row = world.row(HOST_ROW + '''
        [[stop_conditions]]
        id = "any-command"
        gate = "host"
        metric = "commands"
        comparison = "gt"
        threshold = 0
        action = "refuse"
        says = "refuse when any host command ran"
    ''')
    code, out, _ = world.review(world.gate(row), row)
    assert code == 1
    _, record = _record(out)
    assert record.summary.startswith("REJECT: stop any-command: refuse when any host command ran")
    assert record.stop_conditions[0].triggered is True


def test_operator_attestation_is_signed_by_the_bundles_signer(world):
    bundle = world.gate(world.row())
    _, out, _ = world.review(bundle, world.row())
    review_file = Path(out[-1])
    world.as_reviewer()
    code, _, err = world.cli("attest-operator", review_file)
    assert code == 2 and "bundle's signer" in err
    operator = world.as_gate()
    code, out, err = world.cli("attest-operator", review_file, "--note", "H200 in rack 4")
    assert code == 0, err
    path = Path(out[-1])
    assert path == review_file.with_name(f"{bundle.name}.attestation.json")
    att = attest.load_attestation(path)
    assert (att.bundle_id, att.review_sha256, att.note) == (
        bundle.name, record_files.file_sha256(review_file), "H200 in rack 4")
    assert att.operator == operator.identity
    assert record_files.verify_record(operator.verifier(), path) == operator.identity


# ------------------------------------------------ judging, on constructed results

MEGA = {
    "id": "TEST-MEGA", "title": "t", "kind": "research",
    "target": {"arch": "sm_110", "stand_in_arches": ["sm_90"]},
    "arms": {"oracle": {"engine": "vllm", "version": "0.32.0"},
             "candidate": {"engine": "reference"}},
    "workload": {"input_lens": [16], "concurrency": [1], "output_len": 4},
    "gates": [{"id": "trace", "kind": "trace"},
              {"id": "abi", "kind": "abi", "admitted_by": "trace"}],
    "criteria": [{"id": "trace-valid", "gate": "trace", "metric": "valid", "comparison": "eq",
                  "threshold": 1}],
    "stop_conditions": [{"id": "no-idle", "gate": "trace", "metric": "recoverable_idle_fraction",
                         "comparison": "lt", "threshold": 0.10, "action": "stop-implementation",
                         "says": "no material recoverable idle capacity"}],
}


def _result(gate_id: str, kind: str, status=Status.PASS, arch="sm_110", stand_in=False,
            **metrics) -> GateResult:
    return GateResult(gate_id=gate_id, kind=kind, status=status, reason="r", metrics=metrics,
                      arch=arch, stand_in=stand_in)


def _judge(results: list[GateResult], row: dict = MEGA) -> criteria.Evaluation:
    ev = criteria.Evaluation()
    criteria.judge(Row.model_validate(row), {r.gate_id: r for r in results}, ev)
    return ev


def test_no_idle_capacity_rejects_implementation_evidence():
    ev = _judge([_result("trace", "trace", valid=True, recoverable_idle_fraction=0.03),
                 _result("abi", "abi", abi_version=1)])
    [adm] = ev.admissions
    assert (adm.gate, adm.admitted, adm.dependents) == ("trace", False, ["abi"])
    assert ev.rejects == ["implementation not admitted: gate abi has results but stop no-idle: "
                          "no material recoverable idle capacity (recoverable_idle_fraction < "
                          "0.1: (gate)=0.03)"]


def test_idle_capacity_admits_implementation():
    ev = _judge([_result("trace", "trace", valid=True, recoverable_idle_fraction=0.25),
                 _result("abi", "abi")])
    assert ev.admissions[0].admitted is True and ev.rejects == [] and ev.pendings == []


def test_no_idle_capacity_without_implementation_is_an_outcome_not_a_rejection():
    ev = _judge([_result("trace", "trace", valid=True, recoverable_idle_fraction=0.0),
                 _result("abi", "abi", status=Status.PENDING)])
    assert ev.admissions[0].admitted is False and ev.rejects == []


@pytest.mark.parametrize("arch,stand_in", [("sm_90", True), ("sm_90", False)])
def test_stand_in_or_other_arch_never_satisfies_a_target_arch_criterion(arch, stand_in):
    ev = _judge([_result("trace", "trace", arch=arch, stand_in=stand_in, valid=True,
                         recoverable_idle_fraction=0.5)])
    [line] = ev.criteria
    assert line.outcome is Outcome.NOT_SATISFIABLE and line.arch == "sm_110"
    assert ev.pendings == [f"criterion trace-valid not satisfiable here: {line.detail}"]
    assert ev.rejects == []


def test_cells_star_checks_every_cell_and_names_the_failing_one():
    row = dict(MEGA, criteria=[{"id": "exact", "gate": "trace", "metric": "mismatched",
                                "comparison": "eq", "threshold": 0, "cells": ["*"]}],
               stop_conditions=[])
    result = _result("trace", "trace").model_copy(
        update={"cells": {"i16-c1": {"mismatched": 0}, "i16-c4": {"mismatched": 2}}})
    ev = _judge([result], row)
    assert ev.criteria[0].outcome is Outcome.FAIL
    assert ev.criteria[0].measured == {"i16-c1": 0, "i16-c4": 2}
    assert ev.rejects == ["criterion exact: mismatched == 0 does not hold: i16-c4=2"]


def test_missing_metric_rejects():
    ev = _judge([_result("trace", "trace", recoverable_idle_fraction=0.5)])
    assert ev.criteria[0].outcome is Outcome.MISSING
    assert ev.rejects == ["criterion trace-valid: gate trace has no gate-level metric 'valid'"]


def test_attest_operator_wants_a_review_record(world, tmp_path):
    other = tmp_path / "notes.json"
    other.write_text("{}")
    world.as_gate()
    code, _, err = world.cli("attest-operator", other)
    assert code == 2 and "not a review record" in err


def test_bundle_under_a_name_that_is_not_its_id_is_refused_without_a_record(world, tmp_path):
    bundle = world.gate(world.row())
    renamed = bundle.with_name("latest")
    bundle.rename(renamed)
    code, out, err = world.review(renamed, world.row())
    assert code == 1 and out == []
    assert "directory name is not a bundle id" in err
    assert not list(world.reviews.rglob("*.json"))


def test_review_does_not_write_into_the_subject_repo_from_elsewhere(world):
    bundle = world.gate(world.row())
    world.reviews = world.repo_dir / "reviews"  # cwd is not the subject repo
    code, _, err = world.review(bundle, world.row())
    assert code == 2 and "inside the subject repo" in err
    assert not world.reviews.exists()


def test_subject_commit_missing_from_the_reviewers_repo_is_stale(world, tmp_path):
    bundle = world.gate(world.row())
    commit = world.repo.head.commit.hexsha
    other = git.Repo.init(tmp_path / "unrelated", initial_branch="main")
    world.repos.append(other)
    with other.config_writer() as cw:
        cw.set_value("user", "name", "Other")
        cw.set_value("user", "email", "other@example.com")
    commit_file(other, "x.txt", "x\n", "unrelated")
    world.repo = other
    code, out, _ = world.review(bundle, world.row())
    assert code == 1
    _, record = _record(out)
    where = other.working_dir
    assert record.reasons[:2] == [f"stale: subject commit {commit[:12]} is not in {where}",
                                  f"stale: branch feature does not exist in {where}"]


def test_without_row_the_recorded_row_file_is_used(world):
    row = world.row()
    bundle = world.gate(row)  # a row outside the checkout is recorded by absolute path
    world.as_reviewer()
    args = ("review", bundle, "--repo", world.repo_dir, "--reviews", world.reviews,
            "--key", world.gate_pub)
    assert world.cli(*args)[0] == 0
    row.rename(world.tmp / "moved.toml")
    code, _, err = world.cli(*args)
    assert code == 2 and "not found here: pass --row FILE" in err


def test_a_change_already_in_main_is_reported_by_the_review(world):
    """The SM70 PR's later merge: main had the change already, by another route."""
    row = world.row()
    bundle = world.gate(row)
    feature = world.repo.active_branch.name
    world.repo.git.checkout("main")
    commit_file(world.repo, "src/kernel.txt", "v2\n", "kernel v2, applied directly")
    world.repo.git.checkout(feature)
    code, out, err = world.review(bundle, row)
    assert code == 0, (out, err)
    record = review.load_review(Path(out[-1]))
    assert record.verdict is Verdict.APPROVE
    assert record.freshness.already_present.startswith("already present in main: a three-way")
    assert "(already present in main" in record.summary


def test_a_master_repository_is_reviewed_against_master_as_it_was_gated(tmp_path, monkeypatch,
                                                                       capsys):
    """The row's `merge_into` defaults to main; gate, review and merge all fall back to the
    repository's own main branch (`master` here) by one rule, with no row edit."""
    import textwrap

    import git

    from rowgate.cli import main as cli
    from rowgate.seal import signing
    from tests.review_support import HOST_ROW, commit_file, make_key
    from tests.support import write_row

    repo = git.Repo.init(tmp_path / "subject", initial_branch="master")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Test Author")
        cw.set_value("user", "email", "author@example.com")
    commit_file(repo, "README.md", "subject\n", "initial")
    repo.git.checkout("-b", "feature")
    commit_file(repo, "src/kernel.txt", "v2\n", "kernel v2")
    row = write_row(tmp_path / "rows", "TEST-MASTER", textwrap.dedent(HOST_ROW) +
                    "\n[review]\nrequire_operator_attestation = false\n")
    monkeypatch.setenv("ROWGATE_SIGNING_KEY", str(make_key(tmp_path / "gate.pem")))

    def run(*args: object) -> tuple[int, str, str]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            cli.main([str(a) for a in args])
        out, err = capsys.readouterr()
        return int(exc.value.code), out, err

    code, out, err = run("-q", "gate", row, "--repo", repo.working_dir,
                         "--out", tmp_path / "evidence")
    assert code == 0, out + err
    bundle = out.strip().splitlines()[-1]
    pub = tmp_path / "gate.pub.pem"
    pub.write_bytes(signing.KeySigner(tmp_path / "gate.pem").public_pem)
    monkeypatch.setenv("ROWGATE_SIGNING_KEY", str(make_key(tmp_path / "review.pem")))
    code, out, err = run("review", bundle, "--key", pub, "--repo", repo.working_dir,
                         "--row", row, "--reviews", tmp_path / "reviews")
    assert code == 0 and "no local branch" not in out + err, out + err
    repo.close()
