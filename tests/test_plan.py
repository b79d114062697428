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
