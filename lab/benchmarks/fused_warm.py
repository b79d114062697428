"""Compile a row's throughput baseline at every batch size of its workload, keep the
fastest of N compiles, and say what compiling costs.

The graph-fused engine (`lab/rowgate_lab/engines/fused.py`) compiles its step with
`max-autotune-no-cudagraphs` per batch size: inductor benchmarks ~19 Triton choices for
every GEMM shape (~6 s each on the H200) and keeps the fastest it measured, then the step
is captured in a CUDA graph. Those measurements are noisy enough that two compiles pick
different kernels: on the H200 the compiled step at batch 4 took 1,340-1,668 µs over five
compiles (docs/perf.md). A baseline has to be the strongest the device runs, so
with `--compiles N` each compile runs in its own process with its own fresh cache, every
cell is timed on it, and the cache of the fastest compile (the least geometric mean of
its cells' times over the best time of each cell) becomes `torchinductor/` in rowgate's
cache dir.

That directory is where the engine keeps torch.compile's cache in the gate process as
in an engine subprocess, so a later `rowgate gate ROW` on the same machine compiles
from it: the trace and throughput gates run the chosen kernels, and spend no time on
autotuning. On a device lent 10 minutes a call, one call runs this and the sealing call
right after it on the same, still warm, machine (lab/benchmarks/megakernel_seal.sh).

Per cell and compile: the first pass (compile and capture included) and the fastest of
`--passes` more passes of the same work, in seconds; the engine's describe().

    python3 lab/benchmarks/fused_warm.py KERNEL-CUDA-DECODE-MEGAKERNEL --compiles 3 --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rowgate import engines
from rowgate.engines import INDUCTOR_CACHE, INDUCTOR_CACHE_ENV
from rowgate.errors import Error
from rowgate.gates import arms as _arms
from rowgate.gates.throughput import ThroughputGate
from rowgate.rows.row import Row, resolve_row
from rowgate_lab.engines.fused import WARM_MARKER

ROOT = Path(__file__).resolve().parents[1]

RESULT = "fused-warm.json"


def _baseline(row_ref: str) -> tuple[Row, str]:
    """The row (an id under rows/, or a TOML path) and its throughput gate's baseline."""
    row = resolve_row(row_ref).row
    names = [g.baseline for g in row.gates if isinstance(g, ThroughputGate) and not g.cells]
    if not names:
        raise SystemExit(f"{row.id}: no throughput gate over the whole matrix")
    return row, names[0]


def warm(row_ref: str, device: str, options: dict[str, str], passes: int) -> dict[str, Any]:
    """One compile in this process, into the cache its environment names."""
    row, name = _baseline(row_ref)
    arm = _arms.resolve_arm(row, name)
    cells: dict[str, dict[str, float]] = {}
    described: dict[str, str] = {}
    for run in _arms.model_runs(row):
        with engines.create(arm, run.info.path, device=device, options=options) as engine:
            for work in run.passes:
                times = []
                for _ in range(1 + passes):
                    t0 = time.monotonic()
                    engine.generate(work)
                    times.append(time.monotonic() - t0)
                cells[work.cell] = {"first_s": round(times[0], 4),
                                    "best_s": round(min(times[1:]), 4)}
                print(f"{work.cell}: first pass {times[0]:.1f} s (compile and capture), "
                      f"best of {passes} more {min(times[1:]):.3f} s", flush=True)
            described = engine.describe()
    return {"row": row.id, "baseline": name, "device": device, "cells": cells,
            "engine": described, "cache": os.environ.get(INDUCTOR_CACHE_ENV, "")}


def choose(attempts: list[dict[str, Any]]) -> int:
    """The compile whose cells are fastest overall: least geometric mean, over the cells,
    of its time over the best time any compile had on that cell."""
    cells = attempts[0]["cells"]
    best = {c: min(a["cells"][c]["best_s"] for a in attempts) for c in cells}

    def score(a: dict[str, Any]) -> float:
        return math.exp(sum(math.log(a["cells"][c]["best_s"] / best[c]) for c in cells)
                        / len(cells))
    scores = [score(a) for a in attempts]
    for a, s in zip(attempts, scores):
        a["score"] = round(s, 4)
    return scores.index(min(scores))


def _attempt(argv: list[str], work: Path) -> dict[str, Any]:
    """One compile in a fresh process (no in-memory cache of an earlier one) and a fresh
    cache directory."""
    env = {**os.environ, INDUCTOR_CACHE_ENV: str(work / "cache")}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv,
                           "--out", str(work)], env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"fused_warm: compile in {work} exited {done.returncode}")
    doc: dict[str, Any] = json.loads((work / RESULT).read_text())
    return doc


def _install(cache: Path, dest: Path, record: dict[str, Any]) -> str:
    """Make `cache` the compile cache at `dest` (the old one moved aside, then removed),
    with `record` in it: the engine's describe() names the choice in every bundle sealed
    from this cache (`fused_compile_cache`)."""
    if not cache.is_dir():
        return "none (nothing was compiled: no CUDA device)"
    (cache / WARM_MARKER).write_text(json.dumps(record, indent=2) + "\n")
    old = dest.with_name(dest.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(cache), dest)
    shutil.rmtree(old, ignore_errors=True)
    return str(dest)


def best_of(argv: list[str], compiles: int, out: Path, dest: Path,
            budget_s: float | None = None) -> dict[str, Any]:
    """Up to `compiles` compiles; with `budget_s`, none is started that would end past it
    (judged by the slowest compile so far)."""
    work = out / "compiles"
    shutil.rmtree(work, ignore_errors=True)
    t0, longest = time.monotonic(), 0.0
    attempts: list[dict[str, Any]] = []
    for i in range(compiles):
        if attempts and budget_s is not None and time.monotonic() - t0 + longest > budget_s:
            print(f"fused_warm: {len(attempts)} of {compiles} compiles fit {budget_s:.0f} s")
            break
        start = time.monotonic()
        attempts.append(_attempt(argv, work / str(i)))
        longest = max(longest, time.monotonic() - start)
    chosen = choose(attempts)
    for i, a in enumerate(attempts):
        print(f"compile {i}: " + ", ".join(f"{c} {v['best_s']:.3f} s"
                                           for c, v in a["cells"].items())
              + f"; score {a['score']:.3f}" + (" (chosen)" if i == chosen else ""))
    doc = {"row": attempts[0]["row"], "baseline": attempts[0]["baseline"],
           "compiles_asked": compiles, "compiles": attempts, "chosen": chosen}
    return {**doc, "installed": _install(work / str(chosen) / "cache", dest, doc)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("row")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="engine options, as `rowgate gate --option`")
    ap.add_argument("--passes", type=int, default=3, help="timed passes a cell after the first")
    ap.add_argument("--compiles", type=int, default=1,
                    help="compiles, each in its own process and cache; the fastest is kept")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float,
                    help="start no compile that would end past this many seconds")
    ap.add_argument("--install-to", type=Path, default=INDUCTOR_CACHE,
                    help="where the chosen compile's cache goes (default: the engine's)")
    args = ap.parse_args(argv)
    if args.passes < 1 or args.compiles < 1:
        ap.error("--passes and --compiles must be at least 1")
    bad = [o for o in args.option if "=" not in o]
    if bad:
        ap.error(f"--option {bad[0]}: not KEY=VALUE")
    options = dict(o.split("=", 1) for o in args.option)
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        if args.compiles == 1:
            doc = warm(args.row, args.device, options, args.passes)
        else:
            inner = [args.row, "--device", args.device, "--passes", str(args.passes),
                     *(f"--option={o}" for o in args.option)]
            doc = best_of(inner, args.compiles, args.out, args.install_to, args.budget_s)
    except Error as exc:
        print(f"fused_warm: {exc.diagnostics()}", file=sys.stderr)
        return 1
    (args.out / RESULT).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
