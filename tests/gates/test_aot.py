"""AOT gate on a real subject's Triton kernel, compiled here by the installed Triton:
reachability per arch and why not, the embedded image verified against the compiled
cubin, the PTX fallback, a subject kernel that breaks where Triton reaches the arch,
and "enable AOT for arch X" decided by a trace gate's verdict."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rowgate.cli.progress import PlainProgress
from rowgate.cuda import _triton_subject
from rowgate.gates.aot import ADMISSION, Aot
from rowgate.gates.build import build_into
from rowgate.gates.interface import GateContext
from rowgate.records.status import Status
from rowgate.rows import row as rows
from tests.subjects import SIGNOFF, paged_decode_subject

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ROW = rows.load_row(ROOT / "tests" / "data" / "rows" / "SUBJECT-PAGEDMINI-SM90.toml").row
QUIET = PlainProgress(quiet=True)


def _measure(repo_root: Path, out: Path, spec) -> Path:
    build_into(repo_root, ["sm_90"], [], {}, out / "build", QUIET)
    ctx = GateContext(repo=repo_root, artifact_dir=out / spec.id, subject=None, provenance=None)
    ctx.artifact_dir.mkdir(parents=True)
    Aot().measure(ROW, spec, ctx)
    return ctx.artifact_dir


@pytest.fixture(scope="module")
def measured(tmp_path_factory, build_cache):
    tmp = tmp_path_factory.mktemp("aot")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROWGATE_CACHE_DIR", str(build_cache))
        repo = paged_decode_subject(tmp / "subject")
        spec = ROW.gate("triton-aot").model_copy(update={"enable": ["sm_90"]})
        out = _measure(tmp / "subject", tmp / "artifacts", spec)
        repo.close()
    return out, spec


def _copy(measured, tmp_path: Path) -> Path:
    out, _ = measured
    shutil.copytree(out.parent, tmp_path / "artifacts")
    return tmp_path / "artifacts" / out.name


def test_reachability_per_arch_and_the_verified_image(measured):
    out, spec = measured
    derived = Aot().derive(ROW, spec, out)
    assert derived.status is Status.PASS, derived.reason
    assert derived.metrics["aot_reachable_sm_90"] == 1
    assert derived.metrics["aot_enabled_sm_90"] == 1  # no admitting gate: nothing to wait for
    cell = derived.cells["pm_rms_norm@sm_90"]
    assert cell["reachable"] and cell["embedded_verified"] and cell["cubin_sha256"]
    sm110 = derived.cells["pm_rms_norm@sm_110"]
    assert sm110["reachable"] or sm110["error"]  # yes, or Triton's exact error
    if not sm110["reachable"]:
        assert derived.metrics["aot_reachable_sm_110"] == 0 and "sm_110 no: " in derived.reason
    index = json.loads((out / "aot.json").read_text())
    assert index["arches"]["sm_90"]["kernels"]["pm_rms_norm"]["ptx_target"] == "sm_90a"
    # what ran is the subject's @triton.jit function alone, kept beside the image
    module = (out / "sm_90" / "pm_rms_norm" / _triton_subject.MODULE).read_text()
    assert module.startswith(_triton_subject.HEADER) and "def pm_rms_norm(" in module


def test_a_tampered_image_or_a_missing_fallback_fails(measured, tmp_path):
    _, spec = measured
    out = _copy(measured, tmp_path)
    image = next((out / "sm_90" / "pm_rms_norm" / "embedded").glob("*.cubin"))
    image.write_bytes(image.read_bytes() + b"\0")
    derived = Aot().derive(ROW, spec, out)
    assert derived.status is Status.FAIL and derived.metrics["aot_image_mismatches"] == 1
    assert "pm_rms_norm sm_90: embedded image sha256" in derived.reason
    assert "enable refused: sm_90: not reachable or not verified" in derived.reason
    index = json.loads((out / "aot.json").read_text())
    index["arches"]["sm_90"]["kernels"]["pm_rms_norm"]["embed"]["ptx_listed"] = []
    (out / "aot.json").write_text(json.dumps(index))
    image.write_bytes(image.read_bytes()[:-1])
    assert "the portable fallback is missing" in Aot().derive(ROW, spec, out).reason


def _admission(out: Path, status: str, verdict: str | None) -> None:
    metrics = {"capacity_verdict": verdict} if verdict else {}
    (out / ADMISSION).write_text(json.dumps({"admitted_by": "trace", "found": True, "result": {
        "status": status, "reason": "traced", "metrics": metrics}}))


@pytest.mark.parametrize("status,verdict,expected,enabled", [
    ("PASS", "material", Status.PASS, 1),
    ("PASS", "not material", Status.FAIL, 0),
    ("PENDING", None, Status.PENDING, None),
])
def test_enable_follows_the_trace_verdict(measured, tmp_path, status, verdict, expected, enabled):
    _, spec = measured
    spec = spec.model_copy(update={"admitted_by": "trace"})
    out = _copy(measured, tmp_path)
    _admission(out, status, verdict)
    derived = Aot().derive(ROW, spec, out)
    assert derived.status is expected, derived.reason
    if enabled is not None:
        assert derived.metrics["aot_enabled_sm_90"] == enabled
    if expected is Status.FAIL:
        assert "enable refused: sm_90: trace verdict not material" in derived.reason
    if expected is Status.PENDING:
        assert derived.reason.startswith("enable undecided: sm_90: trace is PENDING")


def test_a_subject_kernel_that_fails_where_triton_reaches_the_arch_fails(tmp_path, build_cache):
    repo = paged_decode_subject(tmp_path / "subject")
    src = tmp_path / "subject" / "kernels" / "triton" / "rms_norm.py"
    src.write_text(src.read_text().replace("tl.rsqrt(", "tl.no_such_function("))
    repo.git.commit("-qam", "rms_norm: a typo" + SIGNOFF)
    spec = ROW.gate("triton-aot").model_copy(update={"arches": ["sm_90"]})
    out = _measure(tmp_path / "subject", tmp_path / "artifacts", spec)
    derived = Aot().derive(ROW, spec, out)
    assert derived.status is Status.FAIL and derived.metrics["aot_subject_failures"] == 1
    assert derived.reason.startswith("pm_rms_norm sm_90: ")
    repo.close()


def test_only_the_files_jit_functions_are_taken():
    text = ("import os\nos.system('touch /tmp/owned')\n\nimport triton\n\n"
            "@triton.jit\ndef k(x, N: tl.constexpr = 4):\n    pass\n\n"
            "def helper():\n    pass\n")
    module = _triton_subject.extract(text, "t.py")
    assert "os.system" not in module and "def helper" not in module and "def k(" in module
    with pytest.raises(_triton_subject.Refused, match=r"^t.py:5: k: only a bare @triton.jit"):
        _triton_subject.extract("import triton\n\n@triton.jit\n@other\ndef k(x):\n    pass\n",
                                "t.py")
    with pytest.raises(_triton_subject.Refused, match="default values must be literals"):
        _triton_subject.extract("@triton.jit\ndef k(x=os.getcwd()):\n    pass\n", "t.py")
    with pytest.raises(_triton_subject.Refused, match="no top-level @triton.jit function"):
        _triton_subject.extract("x = 1\n", "t.py")
