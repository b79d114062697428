"""The deep candidate's measurement builds (docs/perf.md), with the project's nvcc and
warnings as errors: benchmarks/probes/paged_read.cu, its read ceilings, as
benchmarks/deep_ceiling.py builds it on the device, both entry points present and neither
spilling (the same flags refuse a planted warning, so the check can fail); the timing-only
ablations with the copies on, each changing the kernel; the shared memory of the E5M2
entry points that run three CTAs an SM, inside the carveout they were measured in; and the
trace build (deep_trace.py), which changes the deep kernels only and keeps that carveout."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from rowgate.cuda import resources, toolchains

pytestmark = pytest.mark.slow

PROBE = Path(__file__).resolve().parents[1] / "benchmarks" / "probes" / "paged_read.cu"
FLAGS = ["-cubin", "-arch=sm_90", "-O3", "-std=c++17", "-Werror", "all-warnings",
         "-Xptxas", "-warn-spills,-warn-lmem-usage"]


def _nvcc(src: Path, out: Path) -> subprocess.CompletedProcess[str]:
    tc = toolchains.for_arch("sm_90")
    return subprocess.run([tc.compiler.path, *FLAGS, "-o", str(out), str(src)],
                          capture_output=True, text=True, timeout=300)


def _deep_unit(out: Path, defines: list[str]) -> subprocess.CompletedProcess[str]:
    """split_kv.cu's deep unit for sm_90 as the benchmarks build it (their nvcc_cmd)."""
    from benchmarks.decode_attention import nvcc_cmd

    nvcc = str(toolchains.for_arch("sm_90").compiler.path)
    return subprocess.run(nvcc_cmd(nvcc, "sm_90", out, ["RG_UNIT=3", *defines]),
                          capture_output=True, text=True, timeout=600)


def _deep_units(tmp_path: Path, builds: dict[str, list[str]],
                workers: int) -> dict[str, subprocess.CompletedProcess[str]]:
    """_deep_unit of each build (name: defines) into tmp_path/<name>.cubin, `workers` at once."""
    import concurrent.futures

    def one(item: tuple[str, list[str]]) -> tuple[str, subprocess.CompletedProcess[str]]:
        return item[0], _deep_unit(tmp_path / f"{item[0]}.cubin", item[1])

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return dict(pool.map(one, builds.items()))


def _cuobjdump(*args: str) -> str:
    tool = toolchains.for_arch("sm_90").cuobjdump
    assert tool is not None
    return subprocess.run([tool.path, *args], capture_output=True, text=True, timeout=120,
                          check=True).stdout


def test_the_probes_build_clean_with_both_entry_points_and_no_spills(tmp_path: Path) -> None:
    out = tmp_path / "paged_read.cubin"
    built = _nvcc(PROBE, out)
    assert built.returncode == 0, built.stderr
    funcs = resources.parse_resource_usage(_cuobjdump("--dump-resource-usage", str(out)))
    assert set(funcs) == {"paged_read", "paged_bulk_read"}
    assert all(f.get("LOCAL", 0) == 0 and f.get("STACK", 0) == 0 for f in funcs.values())


def test_a_planted_warning_fails_the_same_build(tmp_path: Path) -> None:
    src = tmp_path / "paged_read.cu"
    src.write_text(PROBE.read_text().replace(
        "  const int b = blockIdx.z;", "  const int b = blockIdx.z;\n  int unused = 1;", 1))
    built = _nvcc(src, tmp_path / "x.cubin")
    assert built.returncode != 0 and "unused" in built.stderr


def test_the_streaming_ablations_build_clean_and_each_changes_the_kernel(tmp_path: Path) -> None:
    """deep_ceiling.py's timing-only builds with the copies on (RG_DEEP_ABLATE 7-10): each
    compiles with the benchmark's own flags (warnings as errors), and no two leave the E5M2
    D128 G4 kernel the same (an ablation that changed nothing would)."""
    from benchmarks import deep_ceiling

    names = ["noqk", "nopv", "noepi", "storeonly"]
    built = _deep_units(tmp_path, {n: deep_ceiling.ABLATIONS[n] for n in names}, len(names))
    for name, done in built.items():
        assert done.returncode == 0, f"{name}: {done.stderr[-2000:]}"
    sass = {n: _cuobjdump("-sass", "-fun", "split_kv_e5m2_d128_g4_deep",
                          str(tmp_path / f"{n}.cubin")) for n in names}
    assert all("HMMA" in s or n == "noqk" for n, s in sass.items())
    assert len(set(sass.values())) == len(names)


def test_three_e5m2_ctas_fit_the_196_kb_carveout(tmp_path: Path) -> None:
    """Each E5M2 `_deep` entry point runs three CTAs an SM (DeepCfg::BLOCKS) at the
    B16x16K plan's 1024-token chunk. Their shared memory (dynamic, static, and the 1 KB the
    SM reserves a CTA, both in cuobjdump's SHARED) must fit the 196 KB carveout: past it
    the SM takes 228 KB and leaves the cp.async.ca copies 28 KB of L1 instead of 60, 6 %
    slower on the H200 (benchmarks/deep_carveout.py: 156.0 against 147.0 us).
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


def _sass_by_function(cubin: Path) -> dict[str, str]:
    """cuobjdump's SASS of each entry point, addresses stripped and blanks collapsed (the
    columns' padding follows the longest address in the whole dump)."""
    out: dict[str, str] = {}
    name = ""
    for line in _cuobjdump("-sass", str(cubin)).splitlines():
        if "Function : " in line:
            name = line.split("Function : ", 1)[1].strip()
            out[name] = ""
        elif name:
            out[name] += " ".join(re.sub(r"/\*[0-9a-f]{4,}\*/", "", line).split()) + "\n"
    return out


def test_the_trace_build_changes_the_deep_kernels_only_and_keeps_their_carveout(
        tmp_path: Path) -> None:
    """deep_trace.py's build (split_kv.cu's RG_DEEP_TRACE=1: each CTA of split_kv_deep
    records its start, end and SM) compiles with warnings as errors and changes the deep
    candidate's entry points (`_deep` and `_deepc`) and none other; its one added word of
    static shared memory leaves three E5M2 CTAs inside the 196 KB carveout, so the traced
    launch runs in the same L1 split as the default it stands for."""
    builds = {"main": [], "trace": ["RG_DEEP_TRACE=1"]}
    built = _deep_units(tmp_path, builds, 2)
    for name, done in built.items():
        assert done.returncode == 0, f"{name}: {done.stderr[-2000:]}"
    sass = {n: _sass_by_function(tmp_path / f"{n}.cubin") for n in builds}
    main, trace = sass["main"], sass["trace"]
    usage = {n: resources.parse_resource_usage(_cuobjdump("--dump-resource-usage",
                                                          str(tmp_path / f"{n}.cubin")))
             for n in builds}
    deep = {f for f in main if f.endswith(("_deep", "_deepc"))}
    assert set(main) == set(trace) and len(deep) == 20
    assert {f for f in main if main[f] != trace[f]} == deep
    for entry in deep:
        added = usage["trace"][entry]["SHARED"] - usage["main"][entry]["SHARED"]
        assert 0 <= added <= 16, (entry, added)  # one word, within the padding or not
    from rowgate_lab.ops import split_kv as op

    for dim in (128, 64):
        for group in (4, 8):
            entry = f"split_kv_e5m2_d{dim}_g{group}_deep"
            dynamic = op.SPLIT_KV_DEEP.smem(entry, 1024, group, dim)
            assert 3 * (dynamic + usage["trace"][entry]["SHARED"]) <= 196 * 1024, entry
