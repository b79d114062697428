"""benchmarks/megakernel_ab.py's variant tables, checked on the CPU before a device call
spends minutes on them: every `--variants` set has its greedy check (a device call once
lost its timings to a set without one), and every variant and greedy path names options
the fused list builder accepts."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

import pytest

from rowgate_lab.megakernel.builder import build_step
from rowgate_lab.megakernel.fused_list import emit_fused

ROOT = Path(__file__).resolve().parents[1]


def _benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module (it may import its siblings, e.g. megakernel.py)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


@pytest.fixture(scope="module")
def ab() -> ModuleType:
    return _benchmark("megakernel_ab")


def test_every_variant_set_has_a_greedy_check(ab: ModuleType) -> None:
    missing = sorted(set(ab.VARIANT_SETS) - set(ab.GREEDY))
    assert not missing, f"--variants sets without a GREEDY entry: {missing}"


def test_every_set_names_known_options(ab: ModuleType) -> None:
    # the fused list's options, and the split plan's that the builder takes (one_wave)
    accepted = (set(inspect.signature(emit_fused).parameters) - {"e", "lay"}) | \
        (set(inspect.signature(build_step).parameters) - {"dims", "batch", "sm_count"})
    for name in ab.VARIANT_SETS:
        for row in [*ab.VARIANT_SETS[name], *ab.GREEDY[name]]:
            options = row[2]
            if options.get("fuse") is False:  # the staged reference list, no fused options
                continue
            assert set(options) <= accepted, f"{name}: {row[0]} has {set(options) - accepted}"


def test_ncu_stall_samples_sum_by_line_and_instruction_of_the_named_file() -> None:
    """megakernel_ncu.by_key: the source view of the split measurement keeps
    the named file's lines only (by file name, whatever the build's path), sums each line's
    (or SASS instruction's, its line kept) samples by reason and in all, and drops zero
    counts; by_file totals every file's samples."""
    ncu = _benchmark("megakernel_ncu")
    split = "kernels/persistent/attention_split.cuh"
    samples = [("/tmp/b/" + split, 142, "long_scoreboard", 7, 0x40),
               (split, 142, "long_scoreboard", 3, 0x50),
               (split, 142, "short_scoreboard", 2, 0x40),
               (split, 150, "wait", 0, 0x60),
               ("kernels/persistent/megakernel.cu", 142, "barrier", 50, 0x70)]
    assert ncu.by_key(samples, split, "line") == {
        "142": {"all": 12, "long_scoreboard": 10, "short_scoreboard": 2}}
    assert ncu.by_key(samples, split, "pc") == {
        "0x40": {"all": 9, "line": 142, "long_scoreboard": 7, "short_scoreboard": 2},
        "0x50": {"all": 3, "line": 142, "long_scoreboard": 3}}
    assert ncu.by_file(samples) == {"attention_split.cuh": 12, "megakernel.cu": 50}
