"""The deep candidate's shared memory against the carveout it was measured in, on the
build the benchmarks make (lab/benchmarks/decode_attention.py's nvcc_cmd: the project's
nvcc, warnings as errors): the E5M2 entry points that run three CTAs an SM must fit the
196 KB carveout."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from rowgate.cuda import resources, toolchains

pytestmark = pytest.mark.slow

LAB = Path(__file__).resolve().parents[1]


def _nvcc_cmd():
    """lab/benchmarks/decode_attention.py's nvcc_cmd (the benchmarks are scripts, not a
    package: loaded from their file)."""
    spec = importlib.util.spec_from_file_location("lab_bench_decode_attention",
                                                  LAB / "benchmarks" / "decode_attention.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench.nvcc_cmd


def _deep_unit(out: Path, defines: list[str]) -> subprocess.CompletedProcess[str]:
    """split_kv.cu's deep unit for sm_90 as the benchmarks build it (their nvcc_cmd)."""
    nvcc = str(toolchains.for_arch("sm_90").compiler.path)
    return subprocess.run(_nvcc_cmd()(nvcc, "sm_90", out, ["RG_UNIT=3", *defines]),
                          capture_output=True, text=True, timeout=600)


def _cuobjdump(*args: str) -> str:
    tool = toolchains.for_arch("sm_90").cuobjdump
    assert tool is not None
    return subprocess.run([tool.path, *args], capture_output=True, text=True, timeout=120,
                          check=True).stdout


def test_three_e5m2_ctas_fit_the_196_kb_carveout(tmp_path: Path) -> None:
    """Each E5M2 `_deep` entry point runs three CTAs an SM (DeepCfg::BLOCKS) at the
    B16x16K plan's 1024-token chunk. Their shared memory (dynamic, static, and the 1 KB the
    SM reserves a CTA, both in cuobjdump's SHARED) must fit the 196 KB carveout: past it
    the SM takes 228 KB and leaves the cp.async.ca copies 28 KB of L1 instead of 60, 6 %
    slower on the H200 (156.0 against 147.0 us: lab/NOTEBOOK.md, the carveout probe).
    D128 G8 is 16 bytes inside it; so this guards every byte of static shared memory a
    change adds."""
    from rowgate_lab.ops import split_kv as op

    cubin = tmp_path / "deep.cubin"
    built = _deep_unit(cubin, [])
    assert built.returncode == 0, built.stderr[-2000:]
    usage = resources.parse_resource_usage(_cuobjdump("--dump-resource-usage", str(cubin)))
    for dim in (128, 64):
        for group in (4, 8):
            entry = f"split_kv_e5m2_d{dim}_g{group}_deep"
            dynamic = op.SPLIT_KV_DEEP.smem(entry, 1024, group, dim)
            shared = usage[entry]["SHARED"]  # sm_90: the static bytes and the 1 KB reserved
            assert shared >= 1024, (entry, shared)
            assert 3 * (dynamic + shared) <= 196 * 1024, (entry, dynamic, shared)
