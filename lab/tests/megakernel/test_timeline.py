"""The per-task trace -> time breakdown (waits, GEMV, other ops, idle), on a constructed
trace whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from rowgate_lab.megakernel import timeline
from rowgate_lab.megakernel.abi import Opcode, Task

HZ = 1e9  # 1 cycle = 1 ns


def _trace(rows):
    return np.array(rows, dtype=np.uint64)


def test_breakdown_of_two_blocks():
    tasks = [Task(Opcode.EMBED), Task(Opcode.GEMV), Task(Opcode.GEMV), Task(Opcode.LOGITS)]
    # block, claim ns, wait cycles, run cycles: block 0 takes 0 and 2, block 1 takes 1 and 3
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


def test_stage_windows_per_kind_and_layer():
    def t(label):
        return Task(Opcode.GEMV, label=label)

    tasks = [t("embed[0]"), t("L0.q[0]"), t("L0.q[32]"), t("L1.q[0]"), t("L1.q[32]"),
             t("L0.split[0,1,2]"), t("logits[8]"), Task(Opcode.NOP)]
    # claims (ns) and wait + run cycles: a layer's q window runs from its first end of
    # wait to its last end: L0 1,000 .. 4,000 (3 us), L1 5,000 .. 6,000 (1 us); the split
    # waits 200 ns, so its window is 7,200 .. 8,000; block 1's first q task staged its
    # input 300 cycles into its run (word 0's high half)
    staged = 300 << 32
    tr = _trace([[0, 100, 0, 100], [0, 1_000, 0, 1_000], [1 | staged, 2_000, 1_000, 1_000],
                 [0, 5_000, 0, 500], [1, 5_500, 0, 500], [0, 7_000, 200, 800],
                 [1, 9_000, 0, 1_000], [0, 9_500, 0, 100]])
    b = timeline.breakdown(tr, tasks, HZ, grid=2)
    assert b["tasks_per_block"] == [5, 3]
    s = b["stages"]
    assert set(s) == {"embed", "q", "split", "logits"}  # the unlabelled NOP is left out
    assert s["q"] == {"tasks": 4, "run_us": pytest.approx(0.75), "wait_us": pytest.approx(0.25),
                      "prologue_us": pytest.approx(0.075), "window_us": pytest.approx(2.0),
                      "layers": 2}
    assert s["split"]["window_us"] == pytest.approx(0.8)
    assert s["logits"] == {"tasks": 1, "run_us": pytest.approx(1.0), "wait_us": 0.0,
                           "prologue_us": 0.0, "window_us": pytest.approx(1.0), "layers": 1}
