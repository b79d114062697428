"""`rowgate gate ROW --plan`: every seed row planned with its hardware stood in (at the
one place a gate's GPU is chosen), so no seed row can ERROR on its real device for a
reason visible here; planted problems are named; nothing runs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from rowgate.cli.main import main
from rowgate.rows import row as rows
from rowgate.run import plan

ROOT = Path(__file__).resolve().parents[1] / "lab"  # the seed rows gate the lab
# The hardware each seed row names, as NVML would describe it there.
HARDWARE = {
    "PERF-THOR-DECODE-PARITY": ["sm_110:NVIDIA Thor"],
    "SM70-XQA-E5M2-DECODE": ["sm_70:Tesla V100-SXM2-32GB"] * 4,
    "KERNEL-CUDA-DECODE-MEGAKERNEL": ["sm_90:NVIDIA H100 80GB HBM3"],
    "REFERENCE-COHERE-MEGAKERNEL": ["sm_90:NVIDIA H100 80GB HBM3"],
    "DEMO-GPU-DECODE": ["sm_90:NVIDIA H200"],
    "DEMO-CPU-DECODE": [],
}


def test_every_seed_row_is_covered():
    assert {r.row.id for r in rows.all_rows()} == set(HARDWARE)


@pytest.mark.parametrize("row_id", sorted(HARDWARE))
def test_no_seed_row_would_error_on_its_hardware(row_id):
    result = plan.plan_row(rows.resolve_row(row_id), ROOT, plan.stand_in_gpus(HARDWARE[row_id]))
    errors = [f"{g.gate_id}: {g.reasons}" for g in result.gates if g.status == plan.ERROR]
    assert not errors, errors
    for g in result.gates:
        if g.device not in ("cpu", "the host"):
            assert "(stand-in)" not in g.device and "(no device)" not in g.device, g
        # a PENDING gate says why; what it would use is listed whatever its state
        assert g.status != plan.PENDING or g.reasons


def test_the_thor_plan_names_both_models_its_servers_and_the_lease():
    result = plan.plan_row(rows.resolve_row("PERF-THOR-DECODE-PARITY"), ROOT,
                           plan.stand_in_gpus(HARDWARE["PERF-THOR-DECODE-PARITY"]))
    text = "\n".join(plan.render(result))
    assert "launcher: rc --" in text
    assert "model qwen3-4b" in text and "model qwen3.6-35b-a3b" in text
    assert "--port <free loopback port> --model <model>" in text
    assert "traced through its own profiler" in text
    trace = next(g for g in result.gates if g.gate_id == "trace")
    assert trace.device == "cuda:0 NVIDIA Thor sm_110" and trace.status == plan.PENDING


PLANTED = '''
    id = "PLAN-PLANTED"
    title = "planted plan problems"
    kind = "demo"

    [target]
    arch = "sm_90"

    [[models]]
    id = "tiny"
    name = "tiny-qwen3"

    [arms.oracle]
    engine = "vllm"
    version = "0.0.1"

    [arms.candidate]
    engine = "llama.cpp"
    version = "x"

    [workload]
    input_lens = [16]
    concurrency = [1]
    output_len = 4

    [[gates]]
    id = "trace"
    kind = "trace"
    arms = ["candidate"]

    [[gates]]
    id = "tokens"
    kind = "tokens"
'''


def test_planted_problems_are_errors_named_before_anything_runs(tmp_path):
    path = tmp_path / "PLAN-PLANTED.toml"
    path.write_text(textwrap.dedent(PLANTED))
    result = plan.plan_row(rows.load_row(path), ROOT, plan.stand_in_gpus(["sm_90:NVIDIA H200"]))
    by_id = {g.gate_id: g for g in result.gates}
    assert by_id["trace"].status == plan.ERROR
    reasons = " | ".join(by_id["trace"].reasons + by_id["tokens"].reasons)
    assert "cannot be traced: llama.cpp's server has no profiling endpoints" in reasons
    assert "the xllamacpp wheel is a CPU build" in reasons
    assert by_id["tokens"].status == plan.ERROR and "vLLM is pinned to 0.0.1" in reasons
    assert not (tmp_path / "evidence").exists()


def test_the_cli_plans_with_stood_in_gpus_and_maps_the_outcome(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["gate", "SM70-XQA-E5M2-DECODE", "--rows", str(ROOT.parent / "rows"),
              "--repo", str(ROOT), "--plan",
              "--plan-gpu", "sm_70:Tesla V100-SXM2-32GB"])
    assert exc.value.code == 3
    out = capsys.readouterr().out
    assert out.startswith("row SM70-XQA-E5M2-DECODE: plan PENDING")
    assert "needs arm accepted: openai" in out and "endpoint [throughput]: PENDING" in out
    assert not (tmp_path / "evidence").exists()


SUBJECT_ROW = '''
    [[gates]]
    id = "build"
    kind = "build"

    [[gates]]
    id = "operator"
    kind = "operator"
    operator = "{operator}"
    batches = [4]
    contexts = ["page"]
    page_sizes = [16]
    kv_dtypes = ["e5m2"]
    heads = [[32, 8]]
    head_dims = {dims}
'''


@pytest.mark.parametrize("operator,dims,said", [
    ("pm_paged_decodx", [128], "operator 'pm_paged_decodx': not in kernels.toml "
                               "(operators: pm_paged_decode)"),
    ("pm_paged_decode", [96], "head dim 96"),
], ids=["misspelled-operator", "undeclared-head-dim"])
def test_what_the_subject_does_not_declare_is_a_plan_error(tmp_path, capsys, operator, dims,
                                                            said):
    """The plan resolves every declaration a gate will read against the subject: what
    would fail only on the GPU is a configuration error here (exit 2, one line)."""
    from tests.subjects import paged_decode_subject
    from tests.support import write_row

    subject = paged_decode_subject(tmp_path / "subject")
    row = write_row(tmp_path / "rows", "PLAN-DECLARED", SUBJECT_ROW.format(
        operator=operator, dims=dims), arch="sm_90", kind="kernel-pr", engines=False)
    with pytest.raises(SystemExit) as exc:
        main(["gate", str(row), "--repo", subject.working_dir, "--plan",
              "--plan-gpu", "sm_90:NVIDIA H100"])
    subject.close()
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert "operator [operator]: ERROR" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rowgate: PLAN-DECLARED gate operator: ")
    assert said in lines[0], lines[0]


def test_the_plan_uses_the_nvcc_option_as_the_gate_does(tmp_path, capsys):
    """`--option nvcc=PATH`: the plan reports that toolchain, and a path that is not there
    is the build gate's ERROR in the plan (what the gate itself would say)."""
    from rowgate.cuda import toolchains
    from tests.subjects import paged_decode_subject
    from tests.support import write_row

    try:
        nvcc = toolchains.for_arch("sm_90").compiler.path
    except toolchains.ToolchainError as exc:
        pytest.skip(f"no CUDA 13 toolchain installed here: {exc}")
    given = tmp_path / "cuda" / "bin" / "nvcc"
    given.parent.mkdir(parents=True)
    given.symlink_to(nvcc)
    subject = paged_decode_subject(tmp_path / "subject")
    row = write_row(tmp_path / "rows", "PLAN-NVCC", SUBJECT_ROW.format(
        operator="pm_paged_decode", dims=[128]), arch="sm_90", kind="kernel-pr", engines=False)
    argv = ["gate", str(row), "--repo", subject.working_dir, "--plan", "--plan-gpu", "sm_90"]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--option", f"nvcc={given}"])
    out = capsys.readouterr().out
    assert exc.value.code == 3, out  # the operator gate: PENDING on this GPU-less host
    assert f"sm_90: kernels pm_decode; toolchain cuda-13-nvcc ({given})" in out
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--option", f"nvcc={tmp_path / 'nowhere' / 'nvcc'}"])
    subject.close()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"gate build: sm_90: no toolchain (option nvcc={tmp_path / 'nowhere' / 'nvcc'}: " \
           f"no such file)" in err


def test_each_gate_kind_says_what_the_row_asks_of_it():
    """`Gate.estimate`: the throughput gate's time budget per cell, the operator gate's
    cases counted from the row's grid (no torch needed), and nothing for a kind with
    nothing to say."""
    demo = plan.plan_row(rows.resolve_row("DEMO-CPU-DECODE"), ROOT, plan.stand_in_gpus([]))
    times = {g.gate_id: g.time for g in demo.gates}
    assert times["throughput"] == ["time: at most 4 cell(s) x 90 s budget = 360 s of rounds "
                                   "(the budget per cell, warm-up included)"]
    assert times["host"] == []
    sm70 = plan.plan_row(rows.resolve_row("SM70-XQA-E5M2-DECODE"), ROOT,
                         plan.stand_in_gpus(HARDWARE["SM70-XQA-E5M2-DECODE"]))
    operator = next(g for g in sm70.gates if g.kind == "operator")
    assert operator.time == ["work: 896 randomized-page case(s), each launched on baseline "
                             "and candidate, then 9 timed launches a side per timing shape"]
    assert "work: 896 randomized-page case(s)" in "\n".join(plan.render(sm70))
