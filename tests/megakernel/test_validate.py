"""The host validator refuses what the persistent kernel must not run, naming the task."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.megakernel import builder
from pipeline.megakernel.abi import Opcode, Operand, Task
from pipeline.megakernel.validate import TaskListError, validate

DIMS = builder.ModelDims(vocab=512, hidden=128, intermediate=256, layers=2, heads=4, kv_heads=2,
                         head_dim=64, rms_eps=1e-6, max_position=256)


@pytest.fixture
def plan():
    return builder.build_step(DIMS, 2, 16, num_blocks=8)


def _check(plan, tasks):
    return validate(tasks, plan.shape, plan.buffers, plan.num_counters)


def _replace(tasks, i, **changes):
    out = list(tasks)
    out[i] = dataclasses.replace(out[i], **changes)
    return out


def _first(plan, op):
    return next(i for i, t in enumerate(plan.tasks) if t.opcode == op)


def test_the_built_list_is_accepted(plan):
    report = _check(plan, plan.tasks)
    assert report.ok, report.problems
    report.raise_if_bad()


def test_a_cycle_is_refused_naming_its_tasks(plan):
    tasks = list(plan.tasks)
    # The embed task (0) now waits on the final logits counter: logits depend on the
    # embed transitively, so the counter graph has a cycle through task 0.
    last = tasks[-1].signal
    n = sum(1 for t in tasks if t.signal == last)
    tasks = _replace(tasks, 0, waits=((last, n),))
    report = _check(plan, tasks)
    cycle = [p for p in report.problems if "dependency cycle" in p]
    assert len(cycle) == 1
    assert cycle[0].startswith("task 0 (EMBED embed[0]): dependency cycle through tasks 0 -> ")
    assert cycle[0].endswith(" -> 0")
    with pytest.raises(TaskListError, match="task list refused: .*task 0"):
        report.raise_if_bad()


def test_a_missing_producer_is_refused(plan):
    i = _first(plan, Opcode.ATTN_MERGE)
    (c, v), = plan.tasks[i].waits
    report = _check(plan, _replace(plan.tasks, i, waits=((c, v + 1),)))
    assert report.problems == [
        f"task {i} (ATTN_MERGE {plan.tasks[i].label}): missing producer: waits for counter {c} "
        f"to reach {v + 1}, only {v} task(s) signal it"]


def test_a_producer_after_its_consumer_is_refused(plan):
    # Move the first split after its merge: no cycle, but the list order could deadlock.
    s = _first(plan, Opcode.ATTN_SPLIT)
    m = _first(plan, Opcode.ATTN_MERGE)
    tasks = list(plan.tasks)
    split = tasks.pop(s)
    tasks.insert(m, split)
    merge_at = m - 1
    report = _check(plan, tasks)
    assert len(report.problems) == 1
    assert report.problems[0].startswith(f"task {merge_at} (ATTN_MERGE ")
    assert "precede it in the list" in report.problems[0]


def test_an_out_of_bounds_operand_is_refused(plan):
    # The last tile of a matrix reaches its end: one granule further is out of bounds.
    i = next(i for i, t in enumerate(plan.tasks)
             if t.opcode == Opcode.GEMV and t.tile[0] + t.tile[1] == t.tile[3])
    t = plan.tasks[i]
    w = t.operands[0]
    size = plan.buffers[w.buffer].size
    report = _check(plan, _replace(plan.tasks, i, operands=(Operand(w.buffer, 1),)
                                   + t.operands[1:]))
    assert report.problems == [
        f"task {i} (GEMV {t.label}): operand weight out of bounds: bytes 16..{16 + size} of "
        f"buffer {plan.buffers[w.buffer].name!r} ({size} bytes)"]


def test_a_tile_outside_the_matrix_is_refused(plan):
    i = _first(plan, Opcode.LOGITS)
    t = plan.tasks[i]
    row0, rows, k, n = t.tile
    report = _check(plan, _replace(plan.tasks, i, tile=(n - 1, rows, k, n)))
    assert any(p.startswith(f"task {i} (LOGITS {t.label}): output rows: rows "
               f"{n - 1}..{n - 1 + rows} exceed {n}") for p in report.problems)


def test_a_write_into_weights_is_refused(plan):
    i = _first(plan, Opcode.RMS_NORM)
    t = plan.tasks[i]
    report = _check(plan, _replace(plan.tasks, i, operands=t.operands[:2] + (t.operands[1],)))
    assert any(f"task {i} (RMS_NORM {t.label}): operand out writes read-only buffer" in p
               for p in report.problems)


def test_an_unknown_opcode_is_refused(plan):
    i = _first(plan, Opcode.SILU_MUL)
    report = _check(plan, _replace(plan.tasks, i, opcode=42, label=""))
    assert report.problems == [f"task {i} (opcode 42): unknown opcode 42 (ABI 1 knows 0..10)"]


def test_unknown_flags_and_counters_are_refused(plan):
    i = _first(plan, Opcode.KV_APPEND)
    t = plan.tasks[i]
    report = _check(plan, _replace(plan.tasks, i, flags=0x8, signal=plan.num_counters))
    assert f"task {i} (KV_APPEND {t.label}): unknown flag bits 0x8" in report.problems
    assert (f"task {i} (KV_APPEND {t.label}): counter {plan.num_counters} outside the "
            f"{plan.num_counters}-counter array") in report.problems


def test_a_short_meta_buffer_is_refused(plan):
    shape = dataclasses.replace(plan.shape, table_width=plan.shape.table_width + 100)
    report = validate(plan.tasks, shape, plan.buffers, plan.num_counters)
    assert any(p.startswith("step shape: meta buffer 'meta' holds ") for p in report.problems)


def test_an_operand_slot_outside_the_table_is_refused():
    plan = builder.build_step(DIMS, 1, 4, num_blocks=4)
    bad = Task(Opcode.RESIDUAL_ADD, (0, 8, DIMS.hidden, 0),
               (Operand(len(plan.buffers), 0), Operand(0, 0)))
    report = validate([bad], plan.shape, plan.buffers, plan.num_counters)
    assert report.problems == [f"task 0 (RESIDUAL_ADD): operand x: buffer slot "
                               f"{len(plan.buffers)} not in the {len(plan.buffers)}-slot table"]
