"""The kernel gates on a GPU (marker gpu; the H200 through the device tool), through
`rowgate gate` exactly as any subject goes: an external subject's operator (pagedmini)
bitwise and against fp64, its planted last-page bug caught with the case named, a hostile
candidate's writes outside its output caught from the sandboxed kernel child, its
phase gate collecting counters with ncu, and rowgate's own split-KV kernels through the
same path. Small matrices here; benchmarks/subject_gates.py runs the rows' full ones.
The device's own nvcc builds (`ROWGATE_NVCC`, else the one on PATH)."""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
ROWS = ROOT / "tests" / "data" / "rows"
SMALL = '''
    batches = [4]
    layouts = ["uniform", "ragged"]
    contexts = ["1", "page", "page+1", "1024"]
    page_sizes = [16]
    kv_dtypes = ["e5m2", "bf16"]
    heads = [[32, 8], [8, 1]]
    head_dims = [128, 64]
    seeds = [0]
'''


def _small_row(tmp: Path, name: str) -> Path:
    """The row with each operator matrix cut down (the keys the small matrix sets replaced)."""
    text = (ROWS / name).read_text()
    keys = {line.split("=")[0].strip() for line in SMALL.strip().splitlines()}
    start = text.find('kind = "operator"')
    while start >= 0:
        end = text.index("[gates.tolerance]", start)
        body = [ln for ln in text[start:end].splitlines() if ln.split("=")[0].strip() not in keys]
        small = "\n".join(body) + "\n" + textwrap.dedent(SMALL) + "\n"
        text = text[:start] + small + text[end:]
        start = text.find('kind = "operator"', start + len(small))
    path = tmp / name
    path.write_text(text)
    return path


def _gate(row: Path, subject: Path, tmp: Path) -> dict:
    from rowgate.cli.progress import PlainProgress
    from rowgate.rows import row as rows
    from rowgate.run import runner
    from rowgate.seal import signing

    nvcc = os.environ.get("ROWGATE_NVCC") or shutil.which("nvcc")
    run = runner.run_row(rows.load_row(row), subject, tmp / "evidence",
                         signing.default_signer(announce=lambda msg: None),
                         PlainProgress(quiet=True), options={"nvcc": nvcc} if nvcc else {})
    return {r.gate_id: r for r in run.results}


@pytest.fixture(scope="module")
def pagedmini(tmp_path_factory) -> dict:
    from tests.subjects import paged_decode_subject

    tmp = tmp_path_factory.mktemp("pagedmini-gpu")
    row = _small_row(tmp, "SUBJECT-PAGEDMINI-SM90.toml")
    out = {}
    for name in ("clean", "bug", "hostile"):
        repo = paged_decode_subject(tmp / name, planted_bug=name == "bug",
                                    hostile=name == "hostile")
        out[name] = _gate(row, tmp / name, tmp / f"{name}-out")
        repo.close()
    return out


def test_the_external_candidate_is_bitwise_equal_and_within_fp64(pagedmini):
    op = pagedmini["clean"]["operator"]
    assert op.status.value == "PASS", op.reason
    assert op.metrics["bitwise_mismatches"] == 0 and op.metrics["reference_failures"] == 0
    assert op.metrics["guard_writes"] == 0 and op.metrics["counters_left_set"] == 0
    assert op.metrics["cases"] > 0 and op.metrics["time_us_B4x16384_baseline"] > 0


def test_the_planted_last_page_bug_is_caught_with_the_case_named(pagedmini):
    op = pagedmini["bug"]["operator"]
    assert op.status.value == "FAIL", op.reason
    # a length that is a multiple of the page drops the last page: the first such case
    assert "first e5m2-h32x8-d128-p16-B4-uniform-page-s0 " in op.reason
    assert op.metrics["bitwise_mismatches"] > 0 and op.metrics["reference_failures"] > 0
    assert op.cells["B4-uniform-1"]["bitwise_mismatches"] == 0  # 1 token: no multiple


def test_a_kernel_writing_outside_its_output_fails_the_gate_and_nothing_else(pagedmini):
    """The hostile candidate flips a byte of the K cache and writes before its output,
    from the sandboxed kernel child: the gate FAILs naming both, the baseline's records
    stay clean (inputs drawn again after the write), and the bundle still seals."""
    op = pagedmini["hostile"]["operator"]
    assert op.status.value == "FAIL", op.reason
    assert "guard 1," in op.reason and "inputs written yes" in op.reason
    cases = op.metrics["cases"]
    assert op.metrics["inputs_written"] == cases and op.metrics["guard_writes"] == cases
    assert op.metrics["reference_failures"] == cases  # the candidate's record, every case
    assert op.sandbox is not None and op.sandbox.mode == "bubblewrap"


def test_the_phase_gate_collects_the_rows_counters(pagedmini):
    from rowgate.ops import ncu

    phase = pagedmini["clean"]["phase"]
    if ncu.find() is None:
        assert phase.status.value == "PENDING" and "ncu" in phase.reason
        pytest.skip("ncu is not on PATH on this GPU host")
    assert phase.status.value == "PASS", phase.reason
    for role in ("baseline", "candidate"):
        assert phase.metrics[f"counter_{role}_gpu__time_duration.sum"] > 0
        assert phase.metrics[f"full_us_{role}"] > 0
    assert phase.metrics["dominant_phase_baseline"] in ("v_load", "qk")


def test_rowgates_own_kernels_go_through_the_same_path(tmp_path):
    from tests.subjects import snapshot_of

    row = _small_row(tmp_path, "SUBJECT-ROWGATE-SM90.toml")
    subject = snapshot_of(ROOT, tmp_path / "rowgate") / "lab"  # rowgate's kernels: the lab
    results = _gate(row, subject, tmp_path / "out")
    for gate_id in ("operator", "operator-bulk", "operator-deep"):  # split_kv, _bulk, _deep
        op = results[gate_id]
        assert op.status.value == "PASS", (gate_id, op.reason)
        assert op.metrics["bitwise_mismatches"] == 0 and op.metrics["counters_left_set"] == 0


@pytest.fixture(scope="module")
def pagedv(tmp_path_factory) -> dict:
    """A kernel in vLLM's own cache layout and launch parameters, gated through its
    harness (harness/1), clean and with a planted prefetch bug."""
    from tests.subjects import vllm_paged_subject

    tmp = tmp_path_factory.mktemp("pagedv-gpu")
    out = {}
    for name, bug in (("clean", False), ("bug", True)):
        repo = vllm_paged_subject(tmp / name, planted_bug=bug)
        out[name] = _gate(ROWS / "SUBJECT-PAGEDV-SM90.toml", tmp / name, tmp / f"{name}-out")
        repo.close()
    return out


def test_a_kernel_in_its_own_layout_is_gated_through_its_harness(pagedv):
    op = pagedv["clean"]["operator"]
    assert op.status.value == "PASS", op.reason
    assert op.metrics["cases"] > 0 and op.metrics["bitwise_mismatches"] == 0
    assert op.metrics["reference_failures"] == 0 and op.metrics["guard_writes"] == 0
    assert op.metrics["time_us_B4x16384_baseline"] > 0


def test_the_harness_catches_the_planted_prefetch_bug_with_the_case_named(pagedv):
    op = pagedv["bug"]["operator"]
    assert op.status.value == "FAIL", op.reason
    # a length that is a multiple of the block size reuses the token before: the first
    assert "first bf16-h32x8-d128-p16-B1-uniform-page-s0 " in op.reason
    assert op.cells["B1-uniform-1"]["bitwise_mismatches"] == 0  # 1 token: no multiple
