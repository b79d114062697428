"""Host-side validation of a task list before any kernel sees it.

Refuses: unknown opcodes or flags, operands outside their buffer (or written
into a read-only one), tiles outside the step's shape, counters outside the
counter array, waits nobody signals often enough (missing producers), cycles
in the counter graph, and waits whose producers do not all precede the waiter
in the list. The last rule is what keeps both schedules deadlock-free: blocks
take tasks in list order, so the lowest unfinished task always has its
producers done (docs/task-abi.md, "Progress").

Every problem names the task index and the fact.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rowgate.errors import UsageError
from rowgate_lab.megakernel.abi import (
    ABI_VERSION,
    GRANULE,
    INPUT_FLAGS,
    KNOWN_FLAGS,
    NO_BUFFER,
    NO_COUNTER,
    SCRATCH_BYTES,
    STAGE_BYTES,
    Flag,
    Opcode,
    StepShape,
    Task,
    merge_floats,
)
from rowgate_lab.megakernel.operands import OPS


class TaskListError(UsageError):
    """A task list the persistent kernel must not run."""


@dataclass(frozen=True)
class Buffer:
    """One slot of the buffer table the kernel gets at launch."""

    name: str
    size: int
    """Bytes."""
    writable: bool


@dataclass
class Report:
    tasks: int
    counters: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_bad(self) -> None:
        if self.problems:
            more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
            raise TaskListError(f"task list refused: {self.problems[0]}{more}")

    def to_json(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "counters": self.counters, "ok": self.ok,
                "problems": self.problems}


def validate(tasks: list[Task], shape: StepShape, buffers: list[Buffer],
             num_counters: int) -> Report:
    report = Report(len(tasks), num_counters)
    p = report.problems
    if shape.abi_version != ABI_VERSION:
        p.append(f"step shape: ABI version {shape.abi_version}, this validator speaks "
                 f"{ABI_VERSION}")
    p += _meta_problems(shape, buffers)
    for i, t in enumerate(tasks):
        p += [f"task {i} ({_name(t)}): {fact}" for fact in _task_problems(t, shape, buffers,
                                                                          num_counters)]
    p += _dependency_problems(tasks)
    return report


def _name(t: Task) -> str:
    op = Opcode(t.opcode).name if t.opcode in Opcode._value2member_map_ else f"opcode {t.opcode}"
    return f"{op} {t.label}" if t.label else op


def _meta_problems(shape: StepShape, buffers: list[Buffer]) -> list[str]:
    if shape.meta_buffer >= len(buffers):
        return [f"step shape: meta buffer slot {shape.meta_buffer} is not in the "
                f"{len(buffers)}-slot buffer table"]
    need = shape.meta_elements * 4
    have = buffers[shape.meta_buffer].size
    return [] if need <= have else [f"step shape: meta buffer {buffers[shape.meta_buffer].name!r} "
                                    f"holds {have} bytes, the step reads {need}"]


def _task_problems(t: Task, shape: StepShape, buffers: list[Buffer],
                   num_counters: int) -> Iterator[str]:
    if t.opcode not in Opcode._value2member_map_:
        yield f"unknown opcode {t.opcode} (ABI {ABI_VERSION} knows 0..{max(Opcode)})"
        return
    allowed = int(KNOWN_FLAGS.get(Opcode(t.opcode), Flag.NONE))
    if t.flags & ~allowed:
        yield (f"flag bits {t.flags & ~allowed:#x} are not flags of "
               f"{Opcode(t.opcode).name} (it takes {allowed:#x})")
    for c in [w[0] for w in t.waits] + ([t.signal] if t.signal != NO_COUNTER else []):
        if c >= num_counters:
            yield f"counter {c} outside the {num_counters}-counter array"
    spec = OPS[Opcode(t.opcode)]
    yield from spec.checks(t, shape)
    yield from _smem_problems(t, shape)
    for k, o in spec.used(t):
        op = t.operand(k)
        if op.buffer == NO_BUFFER or op.buffer >= len(buffers):
            yield f"operand {o.name}: buffer slot {op.buffer} not in the {len(buffers)}-slot table"
            continue
        buf = buffers[op.buffer]
        end = op.offset * GRANULE + o.extent(t, shape)
        if end > buf.size:
            yield (f"operand {o.name} out of bounds: bytes {op.offset * GRANULE}..{end} of "
                   f"buffer {buf.name!r} ({buf.size} bytes)")
        if "w" in o.access and not buf.writable:
            yield f"operand {o.name} writes read-only buffer {buf.name!r}"


def _smem_problems(t: Task, shape: StepShape) -> Iterator[str]:
    """What a fused task keeps in the kernel's shared memory must fit there."""
    if t.opcode in (Opcode.GEMV, Opcode.LOGITS) and t.flags & INPUT_FLAGS:
        need = shape.batch * t.tile[2] * 2
        if need > STAGE_BYTES:
            yield (f"staged input of {need} bytes (batch x K bf16) exceeds the kernel's "
                   f"{STAGE_BYTES}-byte staging buffer")
    if t.opcode == Opcode.GEMV and t.flags & Flag.MERGE_IN:
        need = merge_floats(shape.batch * shape.num_heads, shape.max_splits) * 4
        if need > SCRATCH_BYTES:
            yield (f"MERGE_IN: {need} bytes of split weights exceed the kernel's "
                   f"{SCRATCH_BYTES}-byte scratch")
    if t.opcode == Opcode.ATTN_MERGE and shape.num_kv_heads:
        need = merge_floats(shape.num_heads // shape.num_kv_heads, t.tile[2]) * 4
        if need > SCRATCH_BYTES:
            yield (f"ATTN_MERGE: {need} bytes of split weights exceed the kernel's "
                   f"{SCRATCH_BYTES}-byte scratch")


def _dependency_problems(tasks: list[Task]) -> list[str]:
    signalers: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(tasks):
        if t.signal != NO_COUNTER:
            signalers[t.signal].append(i)
    out = []
    unsatisfiable = set()
    for i, t in enumerate(tasks):
        for c, v in t.waits:
            have = len(signalers[c])
            if have < v:
                unsatisfiable.add(i)
                out.append(f"task {i} ({_name(t)}): missing producer: waits for counter {c} to "
                           f"reach {v}, only {have} task(s) signal it")
    cycle = _find_cycle(tasks, signalers)
    if cycle:
        path = " -> ".join(str(i) for i in cycle)
        out.append(f"task {cycle[0]} ({_name(tasks[cycle[0]])}): dependency cycle through "
                   f"tasks {path}")
    on_cycle = set(cycle)
    for i, t in enumerate(tasks):
        if i in unsatisfiable or i in on_cycle:
            continue
        for c, v in t.waits:
            before = bisect.bisect_left(signalers[c], i)  # signalers are in list order
            if before < v:
                out.append(f"task {i} ({_name(t)}): waits for counter {c} to reach {v} but "
                           f"only {before} of its producers precede it in the list (tasks are "
                           f"claimed in list order: this could deadlock)")
    return out


def _find_cycle(tasks: list[Task], signalers: dict[int, list[int]]) -> list[int]:
    """A cycle of 'waits on a counter that task j signals' edges, as task indices (first
    repeated at the end), or []. Searched on the task/counter graph (task -> the counter
    it signals -> the tasks waiting on it): linear in tasks, where the task graph has a
    stage's producers times its consumers edges. Iterative DFS: lists run to ~10^5."""
    n = len(tasks)
    waiters: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(tasks):
        for c in {w[0] for w in t.waits}:
            waiters[c].append(i)

    def succ(node: int) -> list[int]:
        if node < n:
            s = tasks[node].signal
            return [n + s] if s != NO_COUNTER else []
        return waiters.get(node - n, [])

    state: dict[int, int] = {}  # 1 on the stack, 2 done
    for root in range(n):
        if root in state:
            continue
        stack, path = [(root, iter(succ(root)))], [root]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                return [v for v in cycle if v < n]
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(succ(nxt))))
                path.append(nxt)
    return []
