"""The per-task trace -> time breakdown (waits, GEMV, other ops, idle), on a constructed
trace whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.megakernel import timeline
from pipeline.megakernel.abi import Opcode, Task

HZ = 1e9  # 1 cycle = 1 ns


def _trace(rows):
    return np.array(rows, dtype=np.uint64)


def test_breakdown_of_two_blocks():
    tasks = [Task(Opcode.EMBED), Task(Opcode.GEMV), Task(Opcode.GEMV), Task(Opcode.LOGITS)]
    # block, claim ns, wait cycles, run cycles: block 0 runs 0 and 2, block 1 runs 1 and 3
    tr = _trace([[0, 1_000, 0, 1_000], [1, 1_000, 1_000, 2_000],
                 [0, 2_000, 500, 1_500], [1, 4_000, 0, 1_000]])
    b = timeline.breakdown(tr, tasks, HZ, grid=2)
    assert b["span_us"] == pytest.approx(4.0)  # 1 us .. 5 us
    assert b["block_time_us"] == pytest.approx(8.0)
    assert b["wait_fraction"] == pytest.approx(1.5 / 8)
    assert b["gemv_fraction"] == pytest.approx((2.0 + 1.5 + 1.0) / 8)
    assert b["run_fraction"] == pytest.approx(5.5 / 8)
    assert b["other_fraction"] == pytest.approx(1 - 7.0 / 8)
    assert b["tasks_per_block"] == [2, 2]
    assert b["ops"]["GEMV"] == {"tasks": 2, "run_us": 3.5, "wait_us": 1.5}


def test_a_task_the_launch_never_ran_is_named():
    tasks = [Task(Opcode.EMBED), Task(Opcode.GEMV)]
    with pytest.raises(timeline.TraceError, match="task 1 has no timestamp"):
        timeline.breakdown(_trace([[0, 5, 1, 1], [0, 0, 0, 0]]), tasks, HZ, grid=1)
    with pytest.raises(timeline.TraceError, match="trace holds 1 tasks, the list 2"):
        timeline.breakdown(_trace([[0, 5, 1, 1]]), tasks, HZ, grid=1)
