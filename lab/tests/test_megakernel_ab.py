"""benchmarks/megakernel_ab.py's variant tables, checked on the CPU before a device call
spends minutes on them: every `--variants` set has its greedy check (run 13's first call
lost its timings to a set without one), and every variant and greedy path names a cubin
key the set's device script passes and options the fused list builder accepts."""

from __future__ import annotations

import gzip
import importlib.util
import inspect
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


SCRIPTS = {"raw": "issue19_raw.sh", "rawl2": "issue19_raw.sh"}
"""The device script of a set not run by issue19_attention.sh."""


@pytest.mark.parametrize("name", ["silu", "siludiag", "attention", "siluout", "even",
                                  "stack", "fat", "raw", "rawl2"])
def test_the_device_scripts_sets_name_known_options(ab: ModuleType, name: str) -> None:
    # the fused list's options, and the split plan's that the builder takes (one_wave)
    accepted = (set(inspect.signature(emit_fused).parameters) - {"e", "lay"}) | \
        (set(inspect.signature(build_step).parameters) - {"dims", "batch", "sm_count"})
    for row in [*ab.VARIANT_SETS[name], *ab.GREEDY[name]]:
        options = row[2]
        if options.get("fuse") is False:  # the staged reference list, no fused options
            continue
        assert set(options) <= accepted, f"{name}: {row[0]} has {set(options) - accepted}"
    script = (ROOT / "benchmarks" / SCRIPTS.get(name, "issue19_attention.sh")).read_text()
    keys = {row[1] for row in [*ab.VARIANT_SETS[name], *ab.GREEDY[name]]}
    for key in keys - {"mma", "mma9"}:  # the two the script always passes
        # by name, or (issue19_raw.sh) as the build mk_KEY it passes as KEY=
        assert f"{key}=" in script or f"mk_{key} " in script or f"mk_{key}\"" in script, \
            f"{name}: cubin key {key} is not passed by the script"


FAT_RUNS = {"run75": "h100-2026-12-05", "run76": "h100-2026-12-05", "run77": "h200-2026-12-05"}
RUNS = {**FAT_RUNS, "run79": "h200-2026-12-05"}


def _recorded(run: str) -> dict[str, Any]:
    path = ROOT / "benchmarks" / "results" / RUNS[run] / run / "results.json.gz"
    with gzip.open(path, "rt") as f:
        record: dict[str, Any] = json.load(f)
    return record


def _all_bitwise(batch: dict[str, Any]) -> bool:
    """Every list of a recorded batch bit for bit its family's unfused list."""
    return bool(batch["bitwise"]) and all(v["equal"] for v in batch["bitwise"].values())


def _medians(batch: dict[str, Any]) -> dict[str, float]:
    """A recorded batch's persistent paths (without `mk-`): their median step, µs."""
    return {k[3:]: v["median_us"] for k, v in batch["modes"].items() if k.startswith("mk-")}


def _split_runs(batch: dict[str, Any]) -> dict[str, float]:
    """A recorded batch's persistent paths (without `mk-`): a split task's traced run, µs."""
    return {k[3:]: v["stages"]["split"]["run_us"] for k, v in batch["breakdown"].items()
            if "stages" in v}


@pytest.mark.parametrize("run", sorted(FAT_RUNS))
def test_the_recorded_fat_splits_lose_to_the_thin_wave(run: str) -> None:
    """Runs 75-77 (docs/perf.md): every list bitwise its family's unfused list; at b1 no
    kv_splits cap beats the default thin wave (16 splits a kv head of 2 tokens a warp), and
    a split task's traced run grows with its tokens a warp (kv4 < kv2 < kv1), whatever the
    build (the pages one reads no block table in the loop)."""
    rec = _recorded(run)
    for batch in ("b1", "b8"):
        assert _all_bitwise(rec[batch])
    median, split = _medians(rec["b1"]), _split_runs(rec["b1"])
    fat = [k for k in median if k.startswith("kv") and not k.endswith("stages")]
    assert fat and all(median["evenwave-norm-in"] < median[k] for k in fat)
    for build in ("", "pg-") if "kv1-pg-norm-in" in split else ("",):
        runs = [split[f"kv{n}-{build}norm-in"] for n in (1, 2, 4)]
        assert runs == sorted(runs, reverse=True) and runs[-1] > split["evenwave-norm-in"]
    if "kv1-pg-norm-in" in median:  # the pages build moves neither the split nor the step
        assert abs(split["kv1-pg-norm-in"] / split["kv1-norm-in"] - 1) < 0.05
        assert abs(median["evenwave-pg-norm-in"] / median["evenwave-norm-in"] - 1) < 0.02
        assert split["kv1-sa8pg-norm-in"] > split["kv1-pg-norm-in"]


def test_the_recorded_raw_split_loop_is_bitwise_and_faster_at_every_batch() -> None:
    """Run 79 (docs/perf.md): every list bitwise its family's unfused list and greedy
    tokens never mismatched; RG_MK_SPLIT_RAW=4 is the fastest list at every batch (the
    norms in at b1, staged at b4 and b8, as the default lists), its split task shorter than
    the default loop's; with 16 tokens a warp (kv1) it cuts the split task by over 20 %, and
    still no kv_splits cap beats the thin wave."""
    rec = _recorded("run79")
    best = {"b1": "evenwave-raw4-norm-in", "b4": "evenwave-raw4", "b8": "evenwave-raw4"}
    for batch, name in best.items():
        b = rec[batch]
        assert _all_bitwise(b)
        assert all(g["mismatched_requests"] == 0 for k, g in b["greedy_vs_eager"].items()
                   if k != "tie_margin")
        median, split = _medians(b), _split_runs(b)
        assert min(median, key=median.__getitem__) == name
        default = name.replace("raw4", "").replace("--", "-").rstrip("-")
        assert split[name] < split[default]
    median, split = _medians(rec["b1"]), _split_runs(rec["b1"])
    assert split["kv1-raw4-norm-in"] < 0.8 * split["kv1-norm-in"]
    fat = [k for k in median if k.startswith("kv") and not k.endswith("stages")]
    assert fat and all(median["evenwave-raw4-norm-in"] < median[k] for k in fat)


def test_ncu_stall_samples_sum_by_line_and_instruction_of_the_named_file() -> None:
    """megakernel_ncu.by_key: the source view of the split measurement (runs 75-78) keeps
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
