"""Where a persistent step's time goes, from the kernel's per-task trace.

A traced launch writes, per task index, four u64: the block that ran it (low 32
bits; the high 32: the SM cycles from the end of its wait to its staged input, a
GEMV's prologue), the globaltimer at its claim (ns), the SM cycles it waited on
counters and the SM cycles it ran until its signal. `breakdown` turns that into the issue's
breakdown: counter waits (sync), GEMV and every other op's run time, and the
blocks' idle tail, as fractions of block-time over the step; and per stage kind (a
task label's name without its layer and tile: `q`, `split`, `merge`, `o`, `gate`, ...)
how long a layer's stage of that kind runs, from its first task's end of wait to its
last task's signal: what the step's dependency chain adds up.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import numpy as np
import numpy.typing as npt

from rowgate_lab.megakernel.abi import Opcode, Task

WORDS = 4
LABEL = re.compile(r"^(?:L(?P<layer>\d+)\.)?(?P<kind>[A-Za-z_][A-Za-z0-9_]*)")
"""A task label: optional layer prefix `L<i>.`, the stage kind, then its tile."""


class TraceError(ValueError):
    """A trace that does not belong to the task list."""


def breakdown(trace: npt.NDArray[np.uint64], tasks: list[Task], sm_clock_hz: float,
              grid: int) -> dict[str, Any]:
    """Per op: tasks, run and wait time (us summed over blocks); totals and fractions of
    `grid` blocks x the traced span. Cycles become time at `sm_clock_hz`."""
    rec = np.asarray(trace, dtype=np.uint64).reshape(-1, WORDS)
    if len(rec) != len(tasks):
        raise TraceError(f"trace holds {len(rec)} tasks, the list {len(tasks)}")
    if not rec[:, 1].all():
        missing = int(np.flatnonzero(rec[:, 1] == 0)[0])
        raise TraceError(f"task {missing} has no timestamp: the launch did not run it")
    to_us = 1e6 / sm_clock_hz
    blocks = (rec[:, 0] & np.uint64(0xFFFFFFFF)).astype(np.int64)
    prologue = (rec[:, 0] >> np.uint64(32)).astype(np.float64) * to_us
    wait = rec[:, 2].astype(np.float64) * to_us
    run = rec[:, 3].astype(np.float64) * to_us
    claims = rec[:, 1].astype(np.int64)
    ends = claims + ((rec[:, 2] + rec[:, 3]).astype(np.float64) * to_us * 1e3).astype(np.int64)
    span_us = float(ends.max() - claims.min()) / 1e3
    ops: dict[str, dict[str, float]] = {}
    codes = np.array([t.opcode for t in tasks])
    for code in np.unique(codes):
        sel = codes == code
        ops[Opcode(int(code)).name] = {"tasks": int(sel.sum()), "run_us": float(run[sel].sum()),
                                       "wait_us": float(wait[sel].sum())}
    block_time = grid * span_us
    busy = float(run.sum() + wait.sum())
    return {"span_us": span_us, "blocks": grid, "block_time_us": block_time,
            "wait_fraction": float(wait.sum()) / block_time,
            "run_fraction": float(run.sum()) / block_time,
            "gemv_fraction": (ops.get("GEMV", {}).get("run_us", 0.0)
                              + ops.get("LOGITS", {}).get("run_us", 0.0)) / block_time,
            "other_fraction": max(0.0, 1.0 - busy / block_time),
            "tasks_per_block": np.bincount(blocks, minlength=grid).tolist(),
            "ops": ops, "stages": stages(tasks, claims, ends, run, wait, prologue)}


def stages(tasks: list[Task], claims: npt.NDArray[np.int64], ends: npt.NDArray[np.int64],
           run: npt.NDArray[np.float64], wait: npt.NDArray[np.float64],
           prologue: npt.NDArray[np.float64]) -> dict[str, Any]:
    """Per stage kind: tasks, mean run, wait and prologue (a GEMV's input staging, part
    of its run) per task (us), and the mean, over the layers, of the window a layer's
    tasks of that kind run in (the first one's end of wait to the last one's signal,
    us). Unlabelled tasks are left out."""
    starts = claims + (wait * 1e3).astype(np.int64)
    groups: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, t in enumerate(tasks):
        m = LABEL.match(t.label)
        if m:
            groups[m["kind"]][m["layer"] or ""].append(i)
    out = {}
    for kind, layers in groups.items():
        idx = np.array([i for ids in layers.values() for i in ids])
        windows = [float(ends[ids].max() - starts[ids].min()) / 1e3 for ids in layers.values()]
        out[kind] = {"tasks": int(len(idx)), "run_us": float(run[idx].mean()),
                     "wait_us": float(wait[idx].mean()),
                     "prologue_us": float(prologue[idx].mean()),
                     "window_us": float(np.mean(windows)), "layers": len(layers)}
    return out
