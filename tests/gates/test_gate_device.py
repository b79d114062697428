"""One choice of a gate's GPU on a host with several: the requirement, the arch
recorded and the engines' device all follow the gate's own selector. The host's GPUs
are stood in for (this machine has none); the selection logic is rowgate's own."""

from __future__ import annotations

import pytest

from rowgate.gates import arms as _arms
from rowgate.gates import device_requirement
from rowgate.gates.interface import gate_arch, gate_device
from rowgate.rows.row import load_row
from rowgate.run import runner
from rowgate.seal import device
from tests.support import write_row

ROW = '''
    [[models]]
    id = "tiny"
    name = "tiny-qwen3"

    [[gates]]
    id = "tp"
    kind = "throughput"

    [[gates]]
    id = "h100-tp"
    kind = "throughput"
    device = "name:H100"
'''


def _gpu(index: int, name: str) -> device.Gpu:
    return device.Gpu(index=index, name=name, arch="sm_90", uuid=f"GPU-{index}", driver="580",
                      memory_total_mib=1, sm_clock_mhz=1, mem_clock_mhz=1,
                      max_sm_clock_mhz=1, temperature_c=30)


@pytest.fixture
def row(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "gpus", lambda: [_gpu(0, "NVIDIA H200"), _gpu(1, "NVIDIA H100")])
    return load_row(write_row(tmp_path, "TWO-GPUS", ROW, arch="sm_90")).row


def _ctx(row, spec, tmp_path):
    """The gate's context as the runner makes it: the GPU chosen once from one
    enumeration of the host's (`device.gpus`, stood in for above)."""
    return runner.gate_context(row, spec, repo=tmp_path, artifact_dir=tmp_path, subject=None,
                               provenance=None, devices=device.inventory())


def test_a_gate_with_its_own_selector_runs_on_that_gpu(row, tmp_path):
    spec = row.gate("h100-tp")
    ctx = _ctx(row, spec, tmp_path)
    assert gate_device(row, spec, device.inventory())[0].index == 1
    assert _arms.device_name(row, ctx) == "cuda:1" and _arms.gpu_index(row, ctx) == 1
    assert gate_arch(row, ctx.gpu) == ("sm_90", False)
    assert device_requirement(row, spec, ctx.gpu) is None


def test_a_gate_without_one_runs_on_the_rows_target(row, tmp_path):
    spec = row.gate("tp")
    assert _arms.device_name(row, _ctx(row, spec, tmp_path)) == "cuda:0"


def test_a_selector_no_gpu_matches_is_pending_with_the_reason(row, monkeypatch, tmp_path):
    monkeypatch.setattr(device, "gpus", lambda: [_gpu(0, "NVIDIA H200")])
    spec = row.gate("h100-tp")
    reason = device_requirement(row, spec, _ctx(row, spec, tmp_path).gpu)
    assert reason == "needs an sm_90 device (name:H100); this host has NVIDIA H200 (sm_90)"


def test_the_run_enumerates_the_gpus_once(row, tmp_path, monkeypatch):
    """One NVML enumeration per run, however many gates choose from it."""
    calls = []
    two = [_gpu(0, "NVIDIA H200"), _gpu(1, "NVIDIA H100")]
    monkeypatch.setattr(device, "gpus", lambda: calls.append(1) or two)
    devices = device.inventory()
    choices = [gate_device(row, spec, devices) for spec in row.gates]
    assert [c.gpu.index for c in choices] == [0, 1] and len(calls) == 1
