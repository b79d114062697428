"""The host validator refuses what the persistent kernel must not run, naming the task:
on the unfused stages (every opcode) and on the fused list (ABI v2 flags)."""

from __future__ import annotations

import dataclasses

import pytest

from rowgate_lab.megakernel import abi, builder
from rowgate_lab.megakernel.abi import NO_COUNTER, Flag, Opcode, Operand, Task
from rowgate_lab.megakernel.validate import TaskListError, validate

DIMS = builder.ModelDims(vocab=512, hidden=128, intermediate=256, layers=2, heads=4, kv_heads=2,
                         head_dim=64, rms_eps=1e-6, max_position=256)


@pytest.fixture
def plan():
    return builder.build_step(DIMS, 2, 16, num_blocks=8, fuse=False)


@pytest.fixture
def fused():
    return builder.build_step(DIMS, 2, 16, num_blocks=8, fuse_norm=True, fuse_merge=True)


def _check(plan, tasks):
    return validate(tasks, plan.shape, plan.buffers, plan.num_counters)


def _replace(tasks, i, **changes):
    out = list(tasks)
    out[i] = dataclasses.replace(out[i], **changes)
    return out


def _first(plan, op):
    return next(i for i, t in enumerate(plan.tasks) if t.opcode == op)


def test_the_built_lists_are_accepted(plan, fused):
    for p in (plan, fused):
        report = _check(p, p.tasks)
        assert report.ok, report.problems
        report.raise_if_bad()
    assert fused.options["fused"] and not plan.options["fused"]


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
    row0, rows, k, n = t.tile[:4]
    report = _check(plan, _replace(plan.tasks, i, tile=(n - 1, rows, k, n)))
    assert any(p.startswith(f"task {i} (LOGITS {t.label}): output columns "
               f"{n - 1}..{n - 1 + rows} exceed the row stride {n}") for p in report.problems)


def test_a_write_into_weights_is_refused(plan):
    i = _first(plan, Opcode.RMS_NORM)
    t = plan.tasks[i]
    report = _check(plan, _replace(plan.tasks, i, operands=t.operands[:2] + (t.operands[1],)))
    assert any(f"task {i} (RMS_NORM {t.label}): operand out writes read-only buffer" in p
               for p in report.problems)


def test_an_unknown_opcode_is_refused(plan):
    i = _first(plan, Opcode.SILU_MUL)
    report = _check(plan, _replace(plan.tasks, i, opcode=42, label=""))
    assert report.problems == [f"task {i} (opcode 42): unknown opcode 42 (ABI 2 knows 0..11)"]


def test_unknown_flags_and_counters_are_refused(plan):
    i = _first(plan, Opcode.KV_APPEND)
    t = plan.tasks[i]
    report = _check(plan, _replace(plan.tasks, i, flags=0x8, signal=plan.num_counters))
    assert (f"task {i} (KV_APPEND {t.label}): flag bits 0x8 are not flags of KV_APPEND "
            f"(it takes 0x0)") in report.problems
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


def _first_flagged(plan, op, flag):
    return next(i for i, t in enumerate(plan.tasks) if t.opcode == op and t.flags & flag)


def test_a_gemv_with_two_inputs_is_refused(fused):
    i = _first_flagged(fused, Opcode.GEMV, Flag.NORM_IN)
    t = fused.tasks[i]
    report = _check(fused, _replace(fused.tasks, i, flags=int(Flag.NORM_IN | Flag.SILU_IN)))
    assert any(p.startswith(f"task {i} (GEMV {t.label}): more than one input flag")
               for p in report.problems)


def test_a_flag_of_another_opcode_is_refused(fused):
    i = _first_flagged(fused, Opcode.GEMV, Flag.NORM_IN)
    t = fused.tasks[i]
    report = _check(fused, _replace(fused.tasks, i, flags=int(Flag.ROPE_IN)))
    assert report.problems == [f"task {i} (GEMV {t.label}): flag bits 0x20 are not flags of "
                               f"GEMV (it takes 0x5e)"]


def test_a_merge_over_the_wrong_width_is_refused(fused):
    i = _first_flagged(fused, Opcode.GEMV, Flag.MERGE_IN)
    t = fused.tasks[i]
    k = DIMS.heads * DIMS.head_dim
    report = _check(fused, _replace(fused.tasks, i, tile=(t.tile[0], t.tile[1], k - 8,
                                                           *t.tile[3:])))
    assert (f"task {i} (GEMV {t.label}): MERGE_IN: K={k - 8} is not heads x head_dim = {k}"
            in report.problems)


def test_a_staged_input_too_large_for_shared_memory_is_refused():
    wide = dataclasses.replace(DIMS, hidden=8192, intermediate=8192, heads=64, kv_heads=16)
    plan = builder.build_step(wide, 8, 16, num_blocks=8, fuse=False)
    i = next(i for i, t in enumerate(plan.tasks) if t.opcode == Opcode.GEMV)
    t = plan.tasks[i]
    report = validate(_replace(plan.tasks, i, flags=int(Flag.NORM_IN),
                               operands=t.operands + (t.operands[0],)),
                      plan.shape, plan.buffers, plan.num_counters)
    assert any("exceeds the kernel's 98304-byte staging buffer" in p for p in report.problems)
    assert builder.fusion_blockers(wide, 8, plan.shape.max_splits)
    assert not builder.build_step(wide, 8, 16, num_blocks=8, fuse_merge=True).options["fused"]


def test_rope_in_columns_outside_the_rows_are_refused(fused):
    i = _first_flagged(fused, Opcode.ATTN_SPLIT, Flag.ROPE_IN)
    t = fused.tasks[i]
    tile = list(t.tile)
    tile[6] = tile[4] - 8  # v columns run past the q|k|v rows
    report = _check(fused, _replace(fused.tasks, i, tile=tuple(tile)))
    assert any(p.startswith(f"task {i} (ATTN_SPLIT {t.label}): ROPE_IN: v columns")
               for p in report.problems)


def test_a_merge_whose_split_states_overflow_the_scratch_is_refused(plan, fused):
    # a merge keeps every split's weight and each row's maximum in the 16 KB scratch:
    # group x (splits + 1) floats for ATTN_MERGE, batch x heads x (max_splits + 1) for
    # MERGE_IN
    group = DIMS.heads // DIMS.kv_heads
    splits = 16384 // 4 // group  # one past what fits
    shape = dataclasses.replace(plan.shape, max_splits=splits)
    i = _first(plan, Opcode.ATTN_MERGE)
    t = plan.tasks[i]
    report = validate(_replace(plan.tasks, i, tile=(t.tile[0], t.tile[1], splits, *t.tile[3:])),
                      shape, plan.buffers, plan.num_counters)
    need = group * (splits + 1) * 4
    assert (f"task {i} (ATTN_MERGE {t.label}): ATTN_MERGE: {need} bytes of split weights "
            f"exceed the kernel's 16384-byte scratch") in report.problems
    ok = dataclasses.replace(plan.shape, max_splits=splits - 1)
    fits = validate(_replace(plan.tasks, i, tile=(t.tile[0], t.tile[1], splits - 1,
                                                  *t.tile[3:])), ok, plan.buffers,
                    plan.num_counters)
    assert not any("ATTN_MERGE: " in p and "scratch" in p for p in fits.problems)
    rows = fused.shape.batch * DIMS.heads
    s = 16384 // 4 // rows
    j = _first_flagged(fused, Opcode.GEMV, Flag.MERGE_IN)
    report = validate(fused.tasks, dataclasses.replace(fused.shape, max_splits=s),
                      fused.buffers, fused.num_counters)
    assert any(p.startswith(f"task {j} (GEMV ") and
               f"MERGE_IN: {rows * (s + 1) * 4} bytes of split weights" in p
               for p in report.problems)
    assert builder.fusion_blockers(DIMS, fused.shape.batch, s) == [
        f"{s} splits' merge weights exceed the 16384-byte scratch"]
    assert builder.fusion_blockers(DIMS, fused.shape.batch, s - 1) == []


def test_l2_prefetch_tasks_lie_in_the_mlp_weights_and_wait_for_nothing():
    plan = builder.build_step(DIMS, 2, 16, num_blocks=8, l2_ahead=4)
    assert _check(plan, plan.tasks).ok
    ahead = [(i, t) for i, t in enumerate(plan.tasks) if t.opcode == Opcode.PREFETCH_L2]
    gate_up = {plan.slots[f"model.layers.{i}.mlp.{n}_proj.weight"]
               for i in range(DIMS.layers) for n in ("gate", "up")}
    assert ahead and {t.operands[0].buffer for _, t in ahead} == gate_up
    assert all(not t.waits and t.signal == NO_COUNTER for _, t in ahead)
    assert builder.build_step(DIMS, 2, 16, num_blocks=8).summary()["ops"].get("PREFETCH_L2") is None
    i, t = ahead[0]
    report = _check(plan, _replace(plan.tasks, i, tile=(t.tile[0] + 8,)))
    assert report.problems == [f"task {i} (PREFETCH_L2 {t.label}): {t.tile[0] + 8} bytes to "
                               f"prefetch: expected a positive multiple of 16"]
    report = _check(plan, _replace(plan.tasks, i, tile=(1 << 30,)))
    assert any(p.startswith(f"task {i} (PREFETCH_L2 {t.label}): operand weights out of bounds")
               for p in report.problems)
    report = _check(plan, _replace(plan.tasks, i, waits=((0, 1),)))
    assert f"task {i} (PREFETCH_L2 {t.label}): a prefetch waits for nothing and signals " \
           f"nothing (it has no result)" in report.problems
    with pytest.raises(builder.UsageError, match="l2_ahead 9: expected eighths of a tile"):
        builder.build_step(DIMS, 2, 16, num_blocks=8, l2_ahead=9)


@pytest.mark.parametrize("fuse_norm", [False, True])
def test_silu_out_tiles_read_both_mlp_weights_and_down_stages_their_output(fuse_norm):
    plan = builder.build_step(DIMS, 2, 16, num_blocks=8, silu_out=True, fuse_norm=fuse_norm)
    assert _check(plan, plan.tasks).ok and plan.options["silu_out"] is True
    gu = [(i, t) for i, t in enumerate(plan.tasks) if t.flags & Flag.SILU_OUT]
    default = builder.build_step(DIMS, 2, 16, num_blocks=8, fuse_norm=fuse_norm, silu_out=False)
    # as many tiles as the default's gate and up tiles, each half its rows of both weights
    assert len(gu) == sum(".gate[" in t.label or ".up[" in t.label for t in default.tasks)
    assert {t.tile[1] for _, t in gu} == {t.tile[1] // 2 for t in default.tasks
                                          if ".gate[" in t.label}
    for _, t in gu:
        layer = t.label.split(".")[0][1:]
        names = [plan.buffers[t.operands[k].buffer].name for k in (0, 4)]
        assert names == [f"model.layers.{layer}.mlp.{n}_proj.weight" for n in ("gate", "up")]
        assert t.flags & Flag.NORM_IN if fuse_norm else t.flags == Flag.SILU_OUT
    downs = [t for t in plan.tasks if ".down[" in t.label]
    assert downs and all(t.flags == Flag.RESIDUAL_OUT for t in downs)
    assert not any(t.flags & Flag.SILU_IN for t in plan.tasks)
    i, t = gu[0]
    both = _check(plan, _replace(plan.tasks, i, flags=t.flags | Flag.RESIDUAL_OUT))
    assert f"task {i} (GEMV {t.label}): SILU_OUT and RESIDUAL_OUT: the output is SiLU(gate) " \
           f"* up or a residual add, not both" in both.problems
    no_up = _check(plan, _replace(plan.tasks, i, operands=t.operands[:4]))
    assert no_up.problems == [f"task {i} (GEMV {t.label}): operand up_weight: buffer slot "
                              f"65535 not in the {len(plan.buffers)}-slot table"]
    past = _check(plan, _replace(plan.tasks, i, tile=(DIMS.intermediate - 8, 16, *t.tile[2:])))
    assert any("operand up_weight out of bounds" in p for p in past.problems)


def test_even_splits_spread_a_short_context_over_every_split():
    # the probe shape at b8 on the H200 plans 4 splits of 336 tokens for 1024 positions: a
    # 129-token context is one split of 129 (17 tokens a warp, one after the other); even,
    # each split takes 33
    assert abi.even_chunk(129, 4, 336) == 33
    assert abi.even_chunk(1000, 4, 336) == 250
    assert abi.even_chunk(1024, 4, 336) == 256
    assert abi.even_chunk(129, 22, 48) == 16  # at least two tokens a warp
    assert abi.even_chunk(5, 3, 16) == 16
    assert abi.even_chunk(40, 3, 8) == 8  # never past the planned chunk
    plan = builder.build_step(DIMS, 2, 16, num_blocks=8)  # even splits: the default
    assert _check(plan, plan.tasks).ok and plan.options["even_splits"] is True
    splits = [t for t in plan.tasks if t.opcode == Opcode.ATTN_SPLIT]
    assert splits and all(t.flags == Flag.ROPE_IN | Flag.EVEN_SPLITS for t in splits)
    s = plan.shape.max_splits
    for length in (1, 16 * s - 1, 16 * s, DIMS.max_position):
        chunks = {abi.split_chunk(t, s, length) for t in splits}
        (chunk,) = chunks
        covered = [min(length, (k + 1) * chunk) - min(length, k * chunk) for k in range(s)]
        assert sum(covered) == length  # every token in exactly one split
        if length >= 16 * s:
            assert min(covered) > 0  # and no split left empty
    unfused = builder.build_step(DIMS, 2, 16, num_blocks=8, fuse=False, even_splits=True)
    assert {t.flags for t in unfused.tasks if t.opcode == Opcode.ATTN_SPLIT} == {Flag.EVEN_SPLITS}
    assert not any(t.flags & Flag.EVEN_SPLITS for t in builder.build_step(
        DIMS, 2, 16, num_blocks=8, even_splits=False).tasks)
