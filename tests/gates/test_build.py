"""Build and audit gates with real compilers (CUDA 12.8 NVRTC + ptxas for sm_70, CUDA 13
nvcc for sm_90 / sm_110, from the cuda12/cuda13 extras). Failing cases build the
fixtures in tests/fixtures/kernels/, never anything in kernels/.

Compile time is kept modest: each repository is built once per session and rowgate's
build cache (outside the subjects: the session's ROWGATE_CACHE_DIR) serves every later
use.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import git
import pytest

from rowgate import compressed
from rowgate.cli.progress import PlainProgress
from rowgate.cuda import cudabuild, kernels, toolchains
from rowgate.gates import audit, build
from rowgate.gates.interface import GateError
from rowgate.records.status import Status
from tests.support import BUILD_AUDIT_GATES, LAB, killed_nvcc, write_row

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "kernels"
QUIET = PlainProgress(quiet=True)
ARCHES = ["sm_70", "sm_90", "sm_110"]


def _fixture_repo(root: Path, source: str, arches: list[str], extra: str = "") -> Path:
    """A repository whose kernels/ holds one fixture kernel and its kernels.toml."""
    (root / "kernels" / "include").mkdir(parents=True)
    shutil.copyfile(FIXTURES / source, root / "kernels" / source)
    entry = source.removesuffix(".cu") if source != "clean.cu" else "scale"
    (root / "kernels" / "kernels.toml").write_text(textwrap.dedent(f'''
        version = 1
        [kernels.k]
        source = "{source}"
        entry_points = ["{entry}"]
        arches = {json.dumps(arches)}
    ''') + textwrap.dedent(extra))
    return root


@pytest.fixture(scope="session")
def kernels_repo(tmp_path_factory) -> Path:
    """A copy of the real kernels/, built and audited once for the session."""
    root = tmp_path_factory.mktemp("kernels-repo")
    shutil.copytree(LAB / "kernels", root / "kernels")
    return root


@pytest.fixture(scope="session")
def audited(kernels_repo, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("audit")
    # decode_attention only: the counts below are its own (other kernels test themselves).
    audit.measure_audit(kernels_repo, ARCHES, ["decode_attention"], {}, out, QUIET)
    return out


def test_clean_build_of_kernels_for_every_arch(audited):
    derived = build.derive_builds(audited)
    assert derived.status is Status.PASS, derived.reason
    assert derived.metrics["builds"] == 3 and derived.metrics["failed_builds"] == 0
    assert derived.metrics["toolchain_sm_70"] == "cuda-12.8-nvrtc 12.8.93 + ptxas 12.8.93"
    assert derived.metrics["toolchain_sm_110"].startswith("cuda-13-nvcc 13.5.37 + g++ ")
    record = json.loads((audited / "sm_110" / "decode_attention" / "build.json").read_text())
    argv = record["steps"][0]["argv"]
    assert argv[argv.index("-Werror") + 1] == "all-warnings"
    assert "-v,-warn-spills,-warn-lmem-usage" in argv and "-Wall,-Wextra,-Werror" in argv
    assert "arch=compute_110,code=[sm_110,compute_110]" in argv


def test_audit_of_kernels_passes_with_resources_per_entry_point(audited):
    derived = audit.derive_audit(audited)
    assert derived.status is Status.PASS, derived.reason
    # 4 entry points x 3 arches; sm_90 and sm_110 each embed one image in the fatbin
    # and one in the object; the sm_70 NVRTC build is a bare cubin.
    assert derived.metrics["entry_points"] == 12
    assert derived.metrics["embedded_images_verified"] == 4
    cell = derived.cells["decode_attention/decode_attention_e5m2_hd128@sm_70"]
    assert 0 < cell["registers"] <= cell["max_registers"]
    assert cell["spill_stores"] == cell["spill_loads"] == cell["stack_frame"] == 0
    sass = compressed.read_text(audited / "sm_70" / "decode_attention" / audit.SASS)
    assert sass.count("code for sm_70")


def test_unchanged_rebuild_is_served_from_the_cache(kernels_repo, audited):
    manifest = kernels.load(kernels_repo)
    again = cudabuild.build(kernels_repo, manifest, "decode_attention", "sm_90",
                            toolchains.for_arch("sm_90"))
    assert again.cached
    (kernels_repo / "kernels" / "include" / "rowgate" / "extra.cuh").write_text("#pragma once\n")
    try:
        key = cudabuild.cache_key(kernels.source_digest(kernels_repo, manifest, "decode_attention"),
                                  manifest.kernels["decode_attention"].model_dump(mode="json"),
                                  "sm_90", toolchains.for_arch("sm_90"))
        assert key != again.record["cache_key"]  # any header edit invalidates
    finally:
        (kernels_repo / "kernels" / "include" / "rowgate" / "extra.cuh").unlink()


def test_a_cached_build_whose_outputs_changed_is_built_again(tmp_path):
    # The cache is reused across gates and runs: what it serves must be what was built.
    repo = _fixture_repo(tmp_path / "repo", "clean.cu", ["sm_90"])
    manifest, tc, cache_root = kernels.load(repo), toolchains.for_arch("sm_90"), tmp_path / "c"
    first = cudabuild.build(repo, manifest, "k", "sm_90", tc, cache_root)
    cubin = first.path / first.record["cubin"]
    good = cubin.read_bytes()
    assert cudabuild.build(repo, manifest, "k", "sm_90", tc, cache_root).cached
    cubin.write_bytes(good[: len(good) // 2])  # a cut-short copy, a disk error, an edit
    again = cudabuild.build(repo, manifest, "k", "sm_90", tc, cache_root)
    assert not again.cached and again.path == first.path
    assert (again.path / again.record["cubin"]).read_bytes() == good
    (again.path / cudabuild.BUILD_RECORD).write_text("{")  # a record cut short
    assert not cudabuild.build(repo, manifest, "k", "sm_90", tc, cache_root).cached


def test_tampered_embedded_image_fails_the_audit(audited, tmp_path):
    copy = tmp_path / "audit"
    shutil.copytree(audited, copy)
    image = next((copy / "sm_90" / "decode_attention" / "embedded" / "decode_attention.fatbin")
                 .glob("*.cubin.gz"))
    compressed.write_bytes(image, compressed.read_bytes(image) + b"\0")
    derived = audit.derive_audit(copy)
    assert derived.status is Status.FAIL
    assert "decode_attention.fatbin embedded image sha256" in derived.reason


@pytest.mark.parametrize("arch", ["sm_70", "sm_90"])
def test_device_code_warning_fails_with_its_text(tmp_path, arch):
    repo = _fixture_repo(tmp_path, "warn_device.cu", [arch])
    build.build_into(repo, [arch], [], {}, tmp_path / "out", QUIET)
    derived = build.derive_builds(tmp_path / "out")
    assert derived.status is Status.FAIL
    assert 'variable "unused_in_device_code" was declared but never referenced' in derived.reason
    assert ("nvrtc exited 0" if arch == "sm_70" else "nvcc exited") in derived.reason


def test_an_arch_without_its_toolchain_errors_and_the_others_are_still_built(tmp_path,
                                                                              monkeypatch):
    # the H200 runner has no CUDA 12.8 NVRTC: the SM70 row's sm_70 build cannot run there,
    # and its operator A/B on the sm_90 stand-in measures the build gate's sm_90 cubin
    def absent() -> toolchains.Toolchain:
        raise toolchains.ToolchainError("nvidia-cuda-nvrtc-cu12 is not installed: "
                                        "pip install 'rowgate[cuda12]'")

    monkeypatch.setattr(toolchains, "_cuda12", absent)
    repo = _fixture_repo(tmp_path, "clean.cu", ["sm_70", "sm_90"])
    with pytest.raises(GateError, match=r"^sm_70: nvidia-cuda-nvrtc-cu12 is not installed: "
                                        r".* \(built for sm_90\)$"):
        build.build_into(repo, ["sm_70", "sm_90"], [], {}, tmp_path / "out", QUIET)
    index = json.loads((tmp_path / "out" / build.INDEX).read_text())
    assert [(e["arch"], e["kernel"]) for e in index] == [("sm_90", "k")]
    assert (tmp_path / "out" / build.MANIFEST_COPY).is_file()
    assert build.derive_builds(tmp_path / "out").status is Status.PASS  # what was built


def test_a_compile_killed_by_a_signal_errors_and_leaves_nothing_cached(tmp_path, monkeypatch):
    # builds run side by side, and Ctrl-C (or the OOM killer) reaches a compile: its death
    # is the machine's, not the kernel's, so it must not be cached as the kernel's FAIL
    monkeypatch.setenv("ROWGATE_CACHE_DIR", str(tmp_path / "cache"))
    real = toolchains.for_arch("sm_90", None).compiler.path
    killed = killed_nvcc(tmp_path / "bin")
    repo = _fixture_repo(tmp_path / "repo", "clean.cu", ["sm_90"])
    with pytest.raises(GateError, match=r"^nvcc building k for sm_90 was killed by signal 9; "
                                        r"nothing was cached, build again$"):
        build.build_into(repo, ["sm_90"], [], {"nvcc": str(killed)}, tmp_path / "a", QUIET)
    assert not list((tmp_path / "cache").rglob(cudabuild.BUILD_RECORD))
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_dir() and
                p.name.startswith(".")]  # no half-built work directory either
    build.build_into(repo, ["sm_90"], [], {"nvcc": real}, tmp_path / "b", QUIET)
    assert build.derive_builds(tmp_path / "b").status is Status.PASS


def test_builds_run_side_by_side_and_keep_the_plans_order(kernels_repo, tmp_path, monkeypatch):
    monkeypatch.setattr(build, "build_jobs", lambda n: 2)  # two at a time even on one CPU
    seen: list[str] = []

    class Seen(PlainProgress):
        def update(self, message: str) -> None:
            seen.append(message)

    build.build_into(kernels_repo, ["sm_90"], ["decode_attention", "split_kv"], {},
                     tmp_path / "out", Seen(quiet=True))
    index = json.loads((tmp_path / "out" / build.INDEX).read_text())
    assert [e["kernel"] for e in index] == ["decode_attention", "split_kv"]
    assert seen[0].startswith("build 2 kernel(s) with cuda-13-nvcc 13.") and \
        seen[0].endswith(", 2 at a time")
    done = sorted(m.rsplit(" (", 1) for m in seen[1:])  # in whichever order they ended
    assert [m for m, _ in done] == ["built decode_attention for sm_90", "built split_kv for sm_90"]
    assert sorted(k for _, k in done) == ["1/2)", "2/2)"]
    assert build.derive_builds(tmp_path / "out").status is Status.PASS


def test_no_more_compiles_at_once_than_builds_or_cpus():
    assert build.build_jobs(1) == 1
    assert 1 <= build.build_jobs(64) <= len(os.sched_getaffinity(0))


def test_host_code_warning_fails_with_its_text(tmp_path):
    repo = _fixture_repo(tmp_path, "warn_host.cu", ["sm_90"])
    build.build_into(repo, ["sm_90"], [], {}, tmp_path / "out", QUIET)
    derived = build.derive_builds(tmp_path / "out")
    assert derived.status is Status.FAIL
    assert "format" in derived.reason and "expects argument of type" in derived.reason


@pytest.mark.parametrize("arch", ["sm_70", "sm_90"])
def test_spilling_kernel_fails_under_werror(tmp_path, arch):
    repo = _fixture_repo(tmp_path, "spill.cu", [arch])
    build.build_into(repo, [arch], [], {}, tmp_path / "out", QUIET)
    derived = build.derive_builds(tmp_path / "out")
    assert derived.status is Status.FAIL
    assert "Registers are spilled to local memory in function 'spill'" in derived.reason


def test_register_budget_below_real_count_names_both_numbers(tmp_path):
    repo = _fixture_repo(tmp_path, "clean.cu", ["sm_90"], '''
        [kernels.k.budgets.all]
        max_registers = 4
    ''')
    audit.measure_audit(repo, ["sm_90"], [], {}, tmp_path / "out", QUIET)
    assert build.derive_builds(tmp_path / "out").status is Status.PASS
    derived = audit.derive_audit(tmp_path / "out")
    used = derived.cells["k/scale@sm_90"]["registers"]
    assert derived.status is Status.FAIL and used > 4
    assert f"k/scale sm_90: registers {used} exceeds budget 4" in derived.reason


def test_sass_rule_violation_fails(tmp_path):
    repo = _fixture_repo(tmp_path, "clean.cu", ["sm_70"], '''
        [[kernels.k.sass]]
        forbid = ["STG"]
        require = ["HMMA"]
    ''')
    audit.measure_audit(repo, ["sm_70"], [], {}, tmp_path / "out", QUIET)
    derived = audit.derive_audit(tmp_path / "out")
    assert derived.status is Status.FAIL
    assert "k/scale sm_70: SASS forbids STG: 1 STG instruction(s)" in derived.reason
    assert "SASS requires HMMA: no HMMA instruction" in derived.reason


def test_triton_aot_reachability_is_recorded_per_arch(tmp_path, audited):
    out = tmp_path / "out"
    shutil.copytree(audited, out)
    build.measure_aot(["sm_90", "sm_110"], out, QUIET)
    derived = build.derive_builds(out)
    assert derived.status is Status.PASS  # reachability is a fact, not a verdict
    sm90 = json.loads((out / "triton-aot" / "sm_90.json").read_text())
    assert sm90["reachable"] is True and sm90["triton"] and sm90["cubin_bytes"] > 0
    sm110 = derived.cells["triton-aot@sm_110"]
    assert sm110["reachable"] or sm110["error"]  # yes, or the exact error
    assert f"Triton {sm90['triton']} AOT: sm_110 " in derived.reason


def test_row_build_and_audit_pass_in_a_sealed_bundle(tmp_path, kernels_repo):
    from rowgate.rows import row as rows
    from rowgate.run import runner
    from rowgate.seal import signing
    from rowgate.seal.bundle import Bundle

    repo = git.Repo.init(tmp_path / "subject", initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Test Author")
        cw.set_value("user", "email", "author@example.com")
    root = Path(repo.working_dir)
    shutil.copytree(LAB / "kernels", root / "kernels")
    repo.index.add(["kernels"])
    repo.index.commit("kernels\n\nSigned-off-by: Test Author <author@example.com>\n")
    # The session's build cache (outside the subject) serves it: same sources, same keys.
    row_path = write_row(tmp_path, "TEST-BUILD-SM70", BUILD_AUDIT_GATES, arch="sm_70",
                         kind="kernel-pr", target_extra='build_arches = ["sm_70", "sm_110"]')

    signer = signing.default_signer(announce=lambda msg: None)
    loaded = rows.load_row(row_path)
    run = runner.run_row(loaded, root, tmp_path / "evidence", signer, QUIET)
    results = {r.gate_id: r for r in run.results}
    assert results["build"].status is Status.PASS, results["build"].reason
    assert results["audit"].status is Status.PASS, results["audit"].reason
    bundle = Bundle.open(run.bundle)
    bundle.verify(signer.verifier())
    files = set(bundle.manifest.files)
    for arch, log in (("sm_70", "ptxas.log"), ("sm_110", "nvcc.log")):
        assert f"artifacts/build/{arch}/decode_attention/{log}" in files
        assert f"artifacts/audit/{arch}/decode_attention/sass.txt.gz" in files
    # derive is pure: re-running it on the sealed artifacts gives the recorded result
    # (with the row: the audit references its build gate's builds).
    again = audit.Audit().derive(loaded.row, None, run.bundle / "artifacts" / "audit")
    assert (again.status, again.reason) == (results["audit"].status, results["audit"].reason)


def test_sass_that_cannot_be_checked_here_is_pending_with_the_reason(audited, tmp_path):
    copy = tmp_path / "audit"
    shutil.copytree(audited, copy)
    entries = json.loads((copy / "audit.json").read_text())
    for e in entries:
        if e["arch"] == "sm_70":
            e["sass"], e["sass_pending"] = None, "no CUDA 12.x cuobjdump/nvdisasm for sm_70 SASS"
    (copy / "audit.json").write_text(json.dumps(entries))
    derived = audit.derive_audit(copy)
    assert derived.status is Status.PENDING
    assert derived.reason == ("budgets hold; SASS not checked: decode_attention sm_70: "
                              "no CUDA 12.x cuobjdump/nvdisasm for sm_70 SASS")


def test_malformed_artifacts_are_a_gate_error_not_a_crash(audited, tmp_path):
    from rowgate.gates.interface import GateError

    copy = tmp_path / "audit"
    shutil.copytree(audited, copy)
    entries = json.loads((copy / "audit.json").read_text())
    del entries[0]["resource_usage"]
    (copy / "audit.json").write_text(json.dumps(entries))
    with pytest.raises(GateError, match="not in this rowgate's format: missing or malformed "
                                        "'resource_usage'"):
        audit.Audit().derive(None, None, copy)
