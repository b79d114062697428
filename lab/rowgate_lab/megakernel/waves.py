"""A task list's dependency levels, and the list padded to whole waves of the grid.

On the static schedule block i runs tasks i, i + grid, ...: with each level padded by NOP
tasks to a multiple of the grid, block i runs the i-th task of every level and so knows
its next GEMV task before it claims it (builder `pad_levels`; a build whose ring ran on into
that task measured slower and was removed, docs/perf.md).
"""

from __future__ import annotations

from rowgate.errors import UsageError
from rowgate_lab.megakernel.abi import NO_COUNTER, Opcode, Task


def levels(tasks: list[Task]) -> list[int]:
    """Each task's dependency level: 0 without waits, else one more than the highest
    level among the tasks signalling a counter it waits on (producers precede consumers,
    so one pass in list order sees every producer first)."""
    counter_level: dict[int, int] = {}
    out = []
    for t in tasks:
        level = 1 + max((counter_level.get(c, -1) for c, _ in t.waits), default=-1)
        out.append(level)
        if t.signal != NO_COUNTER:
            counter_level[t.signal] = max(counter_level.get(t.signal, 0), level)
    return out


def padded_to_waves(tasks: list[Task], sm_count: int) -> list[Task]:
    """`tasks` with NOPs after each run of one level, up to a multiple of `sm_count`: on
    the static schedule (block i runs tasks i, i + grid, ...) every block then runs one
    task of each wave. The levels must rise along the list (each stage waits for the one
    before, as every list the builder emits)."""
    out: list[Task] = []
    lv = levels(tasks)
    for i, t in enumerate(tasks):
        if i and lv[i] < lv[i - 1]:
            raise UsageError(f"pad_levels: task {i} ({t.label}) is at level {lv[i]} after "
                             f"level {lv[i - 1]}: the levels must rise along the list")
        out.append(t)
        if i + 1 == len(tasks) or lv[i + 1] != lv[i]:
            out.extend(Task(Opcode.NOP, label=f"pad[{lv[i]}]")
                       for _ in range(-len(out) % sm_count))
    return out
