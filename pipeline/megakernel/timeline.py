"""Where a persistent step's time goes, from the kernel's per-task trace.

A traced launch writes, per task index, four u64: the block that ran it, the
globaltimer at its claim (ns), the SM cycles it waited on counters and the SM
cycles it ran until its signal. `breakdown` turns that into the issue's
breakdown: counter waits (sync), GEMV and every other op's run time, and the
blocks' idle tail, as fractions of block-time over the step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.megakernel.abi import Opcode, Task

WORDS = 4


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
            "tasks_per_block": np.bincount(rec[:, 0].astype(np.int64),
                                           minlength=grid).tolist(),
            "ops": ops}
