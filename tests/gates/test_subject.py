"""An external subject through rowgate's gates on a CPU machine, as a user's project goes:
pagedmini (tests/fixtures/subjects/paged_decode: its own kernels, kernels.toml v2 operator,
phase variants and Triton kernel) made a real repository. Host, build and audit with the
real CUDA 13 toolchain, operator and phase PENDING without a GPU (with that reason), the
Triton AOT gate; the subject tree untouched; the same commit gated twice; the operator's
one-line refusals; the phase variants built through the build gate's recipe; review,
attestation and merge. The GPU half is test_subject_gpu.py."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from rowgate.cli.progress import PlainProgress
from rowgate.cuda import cudabuild
from rowgate.gates import _phase_measure, operator, phase
from rowgate.gates.interface import GateError
from rowgate.rows import row as rows
from rowgate.run import runner
from rowgate.seal import signing
from tests.review_support import World
from tests.subjects import CANDIDATE_SOURCE, SIGNOFF, paged_decode_subject
from tests.support import BUILD_AUDIT_GATES, killed_nvcc, write_row

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ROW = ROOT / "tests" / "data" / "rows" / "SUBJECT-PAGEDMINI-SM90.toml"
QUIET = PlainProgress(quiet=True)


def tree(root: Path) -> dict[str, str]:
    """sha256 of every file of the working tree (the repository's own .git aside)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.parts}


@pytest.fixture(scope="module")
def gated(tmp_path_factory, build_cache):
    """The subject gated twice with its row, as the gate machine (module scope: the
    environment the autouse fixture gives each test is set here for the runs)."""
    tmp = tmp_path_factory.mktemp("pagedmini")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CONFIG_HOME", str(tmp / "config"))
        mp.setenv("ROWGATE_SIGNER", "key")
        mp.setenv("ROWGATE_CACHE_DIR", str(build_cache))
        repo = paged_decode_subject(tmp / "subject")
        root = Path(repo.working_dir)
        before = tree(root)
        signer = signing.default_signer(announce=lambda msg: None)
        runs = [runner.run_row(rows.load_row(ROW), root, tmp / "evidence", signer, QUIET)
                for _ in range(2)]
        yield {"root": root, "repo": repo, "before": before, "runs": runs,
               "verifier": signer.verifier()}
        repo.close()


def _results(run) -> dict:
    return {r.gate_id: r for r in run.results}


def test_every_gate_runs_on_the_subjects_own_code(gated):
    res = _results(gated["runs"][0])
    for gate in ("host", "build", "audit"):
        assert res[gate].status.value == "PASS", (gate, res[gate].reason)
    assert res["build"].cells["pm_decode@sm_90"]["status"] == "PASS"
    assert res["audit"].metrics["entry_points"] == 32
    assert res["audit"].metrics["embedded_images_verified"] == 2
    for gate in ("operator", "phase"):  # the hardware is all that is missing
        assert res[gate].status.value == "PENDING"
        assert res[gate].reason.startswith("needs an sm_90 device")
    aot = res["triton-aot"]
    assert aot.status.value == "PASS", aot.reason
    assert aot.metrics["aot_reachable_sm_90"] == 1 and aot.metrics["aot_image_mismatches"] == 0
    assert aot.cells["pm_rms_norm@sm_90"]["embedded_verified"] is True
    assert "sm_110 " in aot.reason  # reachable, or why not (Triton 3.4 aborts in LLVM)
    bundle = gated["runs"][0].bundle
    files = set(json.loads((bundle / "manifest.json").read_text())["files"])
    assert "artifacts/build/kernels.toml" in files  # the declarations in force, sealed
    assert "artifacts/triton-aot/sm_90/pm_rms_norm/embedded/" \
           "pm_rms_norm.sm_90.1.sm_90a.cubin" in files


def test_the_subject_is_read_never_written(gated):
    root = gated["root"]
    assert tree(root) == gated["before"]
    assert gated["repo"].git.status("--porcelain", "--ignored") == ""


def test_the_same_commit_gated_twice(gated):
    first, second = gated["runs"]
    assert first.bundle != second.bundle
    assert [(r.gate_id, r.status) for r in first.results] == \
           [(r.gate_id, r.status) for r in second.results]
    from rowgate.seal.bundle import Bundle

    for run in (first, second):
        Bundle.open(run.bundle).verify(gated["verifier"])


def _artifacts(gated) -> Path:
    return gated["runs"][0].bundle / "artifacts"


KERNEL_ONLY = '''
    [[gates]]
    id = "host"
    kind = "host"
    commands = [["git", "fsck", "--no-progress", "--no-dangling"]]
''' + BUILD_AUDIT_GATES + '''
    [[gates]]
    id = "operator"
    kind = "operator"
    operator = "pm_paged_decode"
    batches = [4]
    contexts = ["page"]
    page_sizes = [16]
    kv_dtypes = ["e5m2"]
    heads = [[32, 8]]
    head_dims = [128]
'''


def test_a_kernel_only_row_without_arms_or_workload_runs(gated, tmp_path):
    row = write_row(tmp_path, "KERNELS-ONLY", KERNEL_ONLY, arch="sm_90", kind="kernel-pr",
                    engines=False)
    signer = signing.default_signer(announce=lambda msg: None)
    run = runner.run_row(rows.load_row(row), gated["root"], tmp_path / "evidence", signer, QUIET)
    got = {r.gate_id: r.status.value for r in run.results}
    assert got == {"host": "PASS", "build": "PASS", "audit": "PASS", "operator": "PENDING"}, \
        [(r.gate_id, r.reason) for r in run.results]
    assert run.status.value == "PENDING"
    # a PENDING reason names everything missing: the device, and what launching needs
    reason = run.results[-1].reason
    assert "needs an sm_90 device" in reason and "torch" in reason, reason


def test_shapes_the_operator_does_not_declare_are_refused_in_one_line(gated):
    row = rows.load_row(ROW).row
    spec = row.gate("operator").model_copy(update={"head_dims": [128, 96]})
    with pytest.raises(GateError, match=r"^operator gate: case e5m2-h32x8-d96-p16-B4-uniform-1-s0: "
                                        r"operator pm_paged_decode declares no head dim 96 "
                                        r"\(head dims: 64, 128\)$"):
        operator.resolve(row, spec, _artifacts(gated), "sm_90")
    spec = row.gate("operator").model_copy(update={"operator": "xqa"})
    with pytest.raises(GateError, match=r"^operator gate: operator 'xqa': not in kernels.toml "
                                        r"\(operators: pm_paged_decode\)$"):
        operator.resolve(row, spec, _artifacts(gated), "sm_90")
    with pytest.raises(GateError, match=r"^the build gate built no pm_decode for sm_110 "
                                        r"\(it built it for: sm_90\); add sm_110 to its arches$"):
        operator.resolve(row, row.gate("operator"), _artifacts(gated), "sm_110")
    op, built, build_id = operator.resolve(row, row.gate("operator"), _artifacts(gated), "sm_90")
    assert (build_id, built.rel) == ("build", "build/sm_90/pm_decode/pm_decode.sm_90.cubin")
    assert built.sha256 == hashlib.sha256(built.cubin.read_bytes()).hexdigest()
    assert op.entries("bf16", 64, 1)["candidate"] in built.entry_points


def test_entry_points_the_build_lacks_are_refused(tmp_path):
    """The kernels.toml promises g8 entry points the source no longer defines: the build
    is clean, the operator gate refuses to run it, naming them."""
    repo = paged_decode_subject(tmp_path / "subject")
    source = tmp_path / "subject" / CANDIDATE_SOURCE
    source.write_text(source.read_text().replace(
        "PM_BOTH(KV, T, D, 4) PM_BOTH(KV, T, D, 8)", "PM_BOTH(KV, T, D, 4)"))
    repo.git.commit("-qam", "drop group 8" + SIGNOFF)
    row = rows.load_row(ROW).row
    from rowgate.gates.build import build_into

    build_into(tmp_path / "subject", ["sm_90"], [], {}, tmp_path / "artifacts" / "build", QUIET)
    with pytest.raises(GateError, match=r"^operator pm_paged_decode: entry point\(s\) "
                                        r"pm_decode_bf16_h128_g8_pf, pm_decode_bf16_h128_g8_ref, "
                                        r"pm_decode_bf16_h64_g8_pf \(\+5 more\) are not in "
                                        r"build/sm_90/pm_decode/pm_decode.sm_90.cubin$"):
        operator.resolve(row, row.gate("operator"), tmp_path / "artifacts", "sm_90")
    repo.close()


def test_a_phase_variant_compile_killed_by_a_signal_is_the_gates_error(gated, tmp_path,
                                                                       monkeypatch):
    # the phase gate builds through the build gate's build_kernel: a killed compile ERRORs
    # the gate (run_gate maps GateError) instead of escaping the row's run, nothing cached
    monkeypatch.setenv("ROWGATE_CACHE_DIR", str(tmp_path / "cache"))
    row = rows.load_row(ROW).row
    _, decl, _, _, variants, _ = phase.resolve(row, row.gate("phase"), _artifacts(gated))
    with pytest.raises(GateError, match=r"^nvcc building pm_decode for sm_90 was killed by "
                                        r"signal 9; nothing was cached, build again$"):
        _phase_measure.build_variants(gated["root"], decl.kernel, "sm_90", variants,
                                      {"nvcc": str(killed_nvcc(tmp_path / "bin"))}, tmp_path / "out",
                                      QUIET)
    assert not list((tmp_path / "cache").rglob(cudabuild.BUILD_RECORD))


def test_phase_variants_build_through_the_build_gates_recipe(gated, tmp_path):
    row = rows.load_row(ROW).row
    spec = row.gate("phase")
    name, decl, op, case, variants, entries = phase.resolve(row, spec, _artifacts(gated))
    assert variants == {"full": [], "v_load": ["PM_PHASE=1"], "qk": ["PM_PHASE=2"]}
    assert (case.batch, case.kv, case.hq, case.hkv, case.dim, case.page) == (16, "e5m2", 32, 8,
                                                                             128, 64)
    builds = _phase_measure.build_variants(gated["root"], decl.kernel, "sm_90", variants, None,
                                           tmp_path, QUIET)
    assert all(not b["problems"] for b in builds.values()), builds
    assert len({b["sha256"] for b in builds.values()}) == 3  # three different kernels
    phase.check_entries(builds, entries, spec.shape)
    argv = json.loads((tmp_path / "builds" / "qk" / "build.json").read_text())["steps"][0]["argv"]
    assert "-DPM_PHASE=2" in argv and "-Werror" in argv  # the recipe, warnings as errors
    with pytest.raises(GateError, match=r"^phase gate: phase 'pv' is not declared by the "
                                        r"operator \(phases: v_load, qk\)$"):
        phase.resolve(row, spec.model_copy(update={"phases": ["pv"]}), _artifacts(gated))
    assert gated["repo"].git.status("--porcelain", "--ignored") == ""


def test_the_planted_bug_builds_and_audits_clean(tmp_path, build_cache):
    """A semantic bug compiles: only the operator gate on a GPU catches it
    (test_subject_gpu.py names the case)."""
    repo = paged_decode_subject(tmp_path / "subject", planted_bug=True)
    from rowgate.gates.audit import derive_audit, measure_audit

    measure_audit(tmp_path / "subject", ["sm_90"], [], {}, tmp_path / "out", QUIET)
    assert derive_audit(tmp_path / "out").status.value == "PASS"
    assert repo.active_branch.name == "last-page"
    repo.close()


MERGE_ROW = '''
    [[gates]]
    id = "host"
    kind = "host"
''' + BUILD_AUDIT_GATES + '''
    [[gates]]
    id = "triton-aot"
    kind = "aot"
    arches = ["sm_90"]

    [[criteria]]
    id = "audit-clean"
    gate = "audit"
    metric = "violations"
    comparison = "eq"
    threshold = 0

    [[criteria]]
    id = "aot-images"
    gate = "triton-aot"
    metric = "aot_image_mismatches"
    comparison = "eq"
    threshold = 0

    [review]
    require_operator_attestation = true
    merge_into = "main"
'''


def test_review_attestation_and_merge_of_a_subject_branch(tmp_path, monkeypatch, capsys):
    """The gates a CPU machine completes (any PENDING gate keeps a review PENDING; the
    full row's device gates run on the H200: test_subject_gpu.py)."""
    world = World(tmp_path, monkeypatch, capsys)
    world.close()
    shutil.rmtree(tmp_path / "subject")
    world.repo = paged_decode_subject(tmp_path / "subject")
    world.repos = [world.repo]
    world.repo.git.checkout("-b", "feature")
    readme = tmp_path / "subject" / "README.md"
    readme.write_text(readme.read_text() + "\nThe pf variant is bitwise equal to ref.\n")
    world.repo.git.commit("-qam", "README: say what pf promises" + SIGNOFF)
    row = write_row(tmp_path / "rows", "SUBJECT-MERGE", MERGE_ROW, arch="sm_90",
                    kind="kernel-pr", target_extra='build_arches = ["sm_90"]')
    bundle = world.gate(row)
    code, out, err = world.review(bundle, row)
    assert code == 0, (out, err)
    world.as_gate()
    code, _, err = world.cli("attest-operator", out[-1])
    assert code == 0, err
    code, out, err = world.merge(row)
    assert code == 0, (out, err)
    assert world.repo.heads.main.commit.message.startswith("Merge")
    assert "The pf variant" in world.repo.git.show("main:README.md")
    world.close()
