"""The decode-step task list: every op of the reference engine's step, dependencies that
order every read after its writer (and every overwrite after its readers), sizes from
the SM count, at batch 1/4/8."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from rowgate.errors import UsageError
from rowgate_lab.megakernel import builder, operands, step
from rowgate_lab.megakernel.abi import GRANULE, NO_COUNTER, OPTIONAL, Flag, Opcode
from rowgate_lab.megakernel.validate import validate
from rowgate_lab.megakernel.waves import levels, padded_to_waves

TINY = builder.ModelDims(vocab=1024, hidden=128, intermediate=256, layers=2, heads=4,
                         kv_heads=2, head_dim=64, rms_eps=1e-6, max_position=2048)
PROBE = builder.ModelDims(vocab=32768, hidden=2048, intermediate=6144, layers=16, heads=16,
                          kv_heads=8, head_dim=128, rms_eps=1e-6, max_position=4096)
EVERY_OP = set(Opcode) - OPTIONAL


def _ancestors(tasks) -> list[int]:
    """Bitset of every task each task transitively waits for (list order is topological)."""
    signalers: dict[int, list[int]] = {}
    for i, t in enumerate(tasks):
        signalers.setdefault(t.signal, []).append(i)
    anc = []
    for t in tasks:
        bits = 0
        for c, _ in t.waits:
            for j in signalers.get(c, []):
                bits |= anc[j] | (1 << j)
        anc.append(bits)
    return anc


def _column(plan, op) -> tuple[str, int]:
    """(region or buffer name, bf16 column the operand starts at within its region)."""
    at = op.offset * GRANULE
    for name, r in plan.regions.items():
        if r.slot == op.buffer and r.offset <= at < r.offset + r.nbytes:
            return name, (at - r.offset) // 2
    return plan.buffers[op.buffer].name, 0


def _touches(plan, t):
    """(key, lo, hi, access) per operand: workspace regions by name and the bf16 columns
    of their rows a task touches ([0, inf) where not narrowed), other buffers by name."""
    spec = operands.OPS[Opcode(t.opcode)]
    d = plan.dims
    out = []
    for k, o in spec.used(t):
        key, col = _column(plan, t.operand(k))
        lo, hi = 0, 1 << 62
        if key == "partials":  # one slice per (sequence, kv head)
            if t.opcode in (Opcode.ATTN_SPLIT, Opcode.ATTN_MERGE):
                out.append((f"partials[{t.tile[0]},{t.tile[1]}]", lo, hi, o.access))
            else:  # MERGE_IN reads every slice
                out += [(f"partials[{b},{h}]", lo, hi, o.access) for b in range(plan.batch)
                        for h in range(d.kv_heads)]
            continue
        if t.opcode in (Opcode.GEMV, Opcode.LOGITS) and k == 2:  # y: the tile's columns
            lo = t.tile[4] + t.tile[0]
            hi = lo + t.tile[1]
        elif t.opcode in (Opcode.GEMV, Opcode.LOGITS) and k in (1, 3) and key in plan.regions:
            lo, hi = col, col + t.tile[2]
        elif t.opcode == Opcode.ATTN_SPLIT and t.flags & Flag.ROPE_IN and k in (1, 2):
            key += f"[{t.tile[0]},{t.tile[1]}]"  # a split appends (and reads) its own rows
        elif t.opcode == Opcode.ATTN_SPLIT and t.flags & Flag.ROPE_IN and k == 0:
            g, dh, kvh = d.heads // d.kv_heads, d.head_dim, t.tile[1]
            out += [(key, t.tile[7] + kvh * g * dh, t.tile[7] + (kvh + 1) * g * dh, "r"),
                    (key, t.tile[5] + kvh * dh, t.tile[5] + (kvh + 1) * dh, "r"),
                    (key, t.tile[6] + kvh * dh, t.tile[6] + (kvh + 1) * dh, "r")]
            continue
        out.append((key, lo, hi, o.access))
    return out


FULL = {"fuse_norm": True, "fuse_merge": True, "fine_deps": True}
"""Every fusion flag (the defaults keep the norms and merges as stages)."""
MODES = [{"fuse": False}, {}, FULL, {**FULL, "fine_deps": False}, {**FULL, "tile_scale": 2},
         {**FULL, "fuse_norm": False}, {**FULL, "fuse_merge": False}, {"fine_deps": True},
         {"silu_out": False}, {**FULL, "silu_out": False}, {"even_splits": False},
         {"fuse": False, "even_splits": False}]


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_every_op_of_the_step_is_covered(batch):
    plan = builder.build_step(TINY, batch, 132, num_blocks=batch * 8, fuse=False)
    assert {Opcode(t.opcode) for t in plan.tasks} == EVERY_OP
    counts = plan.summary()["ops"]
    layers = TINY.layers
    assert counts["EMBED"] == batch
    assert counts["RMS_NORM"] == batch * (2 * layers + 1)
    assert counts["ROPE"] == 2 * batch * layers  # q and k heads of every sequence
    assert counts["KV_APPEND"] == batch * layers
    assert counts["ATTN_MERGE"] == batch * TINY.kv_heads * layers
    assert validate(plan.tasks, plan.shape, plan.buffers, plan.num_counters).ok


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_the_fully_fused_step_has_five_stages_a_layer_and_every_flag(batch):
    plan = builder.build_step(TINY, batch, 132, num_blocks=batch * 8, **FULL)
    assert plan.options == {"fused": True, "tile_scale": 1, "l2_ahead": 0, "one_wave": True,
                            "silu_out": True, "even_splits": True, **FULL}
    assert {Opcode(t.opcode) for t in plan.tasks} == {Opcode.EMBED, Opcode.GEMV,
                                                      Opcode.ATTN_SPLIT, Opcode.LOGITS}
    flags = {(Opcode(t.opcode), t.flags) for t in plan.tasks}
    assert flags == {(Opcode.EMBED, 0), (Opcode.GEMV, Flag.NORM_IN), (Opcode.LOGITS, Flag.NORM_IN),
                     (Opcode.ATTN_SPLIT, Flag.ROPE_IN | Flag.EVEN_SPLITS),
                     (Opcode.GEMV, Flag.MERGE_IN | Flag.RESIDUAL_OUT),
                     (Opcode.GEMV, Flag.NORM_IN | Flag.SILU_OUT), (Opcode.GEMV, Flag.RESIDUAL_OUT)}
    # counters: embed, per layer one per kv head (q/k/v) + splits + o + gate/up + down, logits
    assert plan.num_counters == 2 + TINY.layers * (TINY.kv_heads + 4)
    assert validate(plan.tasks, plan.shape, plan.buffers, plan.num_counters).ok


@pytest.mark.parametrize("options", MODES)
@pytest.mark.parametrize("batch", [1, 4, 8])
def test_every_read_waits_for_its_writer_and_every_overwrite_for_its_readers(batch, options):
    plan = builder.build_step(TINY, batch, 16, num_blocks=batch * 8, **options)
    assert validate(plan.tasks, plan.shape, plan.buffers, plan.num_counters).ok
    anc = _ancestors(plan.tasks)
    writes: dict[str, list[tuple[int, int, int]]] = {}
    reads: dict[str, list[tuple[int, int, int]]] = {}
    for i, t in enumerate(plan.tasks):
        touched = _touches(plan, t)
        # Tasks of one stage (one signal counter) touch disjoint tiles of a region.
        for key, lo, hi, access in touched:
            for wlo, whi, w in writes.get(key, []):
                if "r" in access and wlo < hi and lo < whi and plan.tasks[w].signal != t.signal:
                    assert anc[i] >> w & 1, f"task {i} {t.label} reads {key} before writer {w}"
            for rlo, rhi, r in reads.get(key, []):
                if "w" in access and rlo < hi and lo < rhi and plan.tasks[r].signal != t.signal:
                    assert anc[i] >> r & 1, \
                        f"task {i} {t.label} overwrites {key} before reader {r} is done"
        for key, lo, hi, access in touched:
            if "w" in access:
                writes.setdefault(key, []).append((lo, hi, i))
            if "r" in access:
                reads.setdefault(key, []).append((lo, hi, i))


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_probe_model_list_is_valid_and_sized_to_the_sms(batch):
    plan = builder.build_step(PROBE, batch, 132, num_blocks=batch * 64, fuse=False)
    assert validate(plan.tasks, plan.shape, plan.buffers, plan.num_counters).ok
    q_tiles = [t for t in plan.tasks if t.label.startswith("L0.q[")]
    # about one tile per SM, each a whole number of 8-row warps
    assert len(q_tiles) == 128 and all(t.tile[1] == 16 for t in q_tiles)
    fused = builder.build_step(PROBE, batch, 132, num_blocks=batch * 64, **FULL)
    assert validate(fused.tasks, fused.shape, fused.buffers, fused.num_counters).ok
    qkv = [t for t in fused.tasks if t.label.startswith(("L0.q[", "L0.k[", "L0.v["))]
    assert len(qkv) == 128 and all(t.tile[1] == 32 for t in qkv)  # one q|k|v stage
    bigger = builder.build_step(PROBE, batch, 132, num_blocks=batch * 64, tile_scale=2, **FULL)
    assert sum(t.opcode == Opcode.GEMV for t in bigger.tasks) * 2 == \
        sum(t.opcode == Opcode.GEMV for t in fused.tasks)
    # by default (even splits) one wave of split tasks, as full as whole splits allow;
    # planned splits at least one split task per SM
    for options, waves in (({}, 1), ({"even_splits": False}, 2)):
        listed = builder.build_step(PROBE, batch, 132, num_blocks=batch * 64, fuse=False,
                                    **options)
        splits = {t.tile[2] for t in listed.tasks
                  if t.opcode == Opcode.ATTN_SPLIT and t.label.startswith("L0.")}
        tasks = len(splits) * batch * PROBE.kv_heads
        assert (132 - batch * PROBE.kv_heads < tasks <= 132) if waves == 1 else tasks >= 132
        assert listed.shape.max_splits == len(splits)


def test_attention_merge_waits_only_for_its_own_splits():
    plan = builder.build_step(TINY, 2, 16, num_blocks=8, fuse=False)
    by_counter: dict[int, list] = {}
    for t in plan.tasks:
        by_counter.setdefault(t.signal, []).append(t)
    for m in (t for t in plan.tasks if t.opcode == Opcode.ATTN_MERGE):
        (c, n), = m.waits
        splits = by_counter[c]
        assert len(splits) == n == m.tile[2]
        assert {(s.tile[0], s.tile[1]) for s in splits} == {(m.tile[0], m.tile[1])}


def test_fused_splits_wait_only_for_the_qkv_tiles_of_their_kv_head():
    plan = builder.build_step(TINY, 2, 16, num_blocks=8, fine_deps=True)
    signalers: dict[int, list] = {}
    for t in plan.tasks:
        signalers.setdefault(t.signal, []).append(t)
    g, d = TINY.heads // TINY.kv_heads, TINY.head_dim
    for s in (t for t in plan.tasks if t.opcode == Opcode.ATTN_SPLIT):
        (c, n), = s.waits
        tiles = signalers[c]
        assert len(tiles) == n
        kvh = s.tile[1]
        for t in tiles:  # every one lies in the q, k or v rows of this kv head
            col = t.tile[4] + t.tile[0]
            q, k, v = (kvh * g * d, (kvh + 1) * g * d), (s.tile[5] + kvh * d,) * 2, \
                (s.tile[6] + kvh * d,) * 2
            assert q[0] <= col < q[1] or k[0] <= col < k[0] + d or v[0] <= col < v[0] + d


def test_k_is_appended_after_rope_and_v_as_is():
    plan = builder.build_step(TINY, 1, 16, num_blocks=8, fuse=False)
    ropes = [t for t in plan.tasks if t.opcode == Opcode.ROPE and t.label.startswith("L1.")]
    assert [bool(t.flags & Flag.APPEND_KV) for t in ropes] == [False, True]
    assert plan.buffers[ropes[1].operands[3].buffer].name == "k_cache.1"
    (v,) = [t for t in plan.tasks if t.opcode == Opcode.KV_APPEND and t.label.startswith("L1.")]
    assert plan.buffers[v.operands[1].buffer].name == "v_cache.1"


def test_dims_from_a_model_directory(tmp_path):
    cfg = {"vocab_size": 1024, "hidden_size": 128, "intermediate_size": 256,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 64, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert builder.ModelDims.load(tmp_path) == TINY
    del cfg["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(step.ModelConfigError, match="missing key 'intermediate_size'"):
        builder.ModelDims.load(tmp_path)


def test_at_batch_1_the_norms_move_into_their_consumers_by_default():
    # one norm task on one SM that a whole GEMV stage waits for, twice a layer
    plan = builder.build_step(TINY, 1, 16, num_blocks=8)
    assert "RMS_NORM" not in plan.summary()["ops"]
    assert any(t.flags & Flag.NORM_IN for t in plan.tasks)
    assert plan.options["fuse_norm"] is True and plan.options["fuse_merge"] is False
    staged = builder.build_step(TINY, 1, 16, num_blocks=8, fuse_norm=False)
    assert staged.summary()["ops"]["RMS_NORM"] == 2 * TINY.layers + 1


def test_by_default_norms_and_merges_are_stages_of_a_fused_list():
    plan = builder.build_step(TINY, 2, 16, num_blocks=8, fine_deps=True)
    counts = plan.summary()["ops"]
    assert counts["RMS_NORM"] == 2 * (2 * TINY.layers + 1)
    assert counts["ATTN_MERGE"] == 2 * TINY.kv_heads * TINY.layers
    assert not any(t.flags & (Flag.NORM_IN | Flag.MERGE_IN) for t in plan.tasks)
    assert {t.flags for t in plan.tasks if t.opcode == Opcode.ATTN_SPLIT} == {
        Flag.ROPE_IN | Flag.EVEN_SPLITS}
    assert plan.options == {"fused": True, "fine_deps": True, "tile_scale": 1,
                            "fuse_norm": False, "fuse_merge": False, "l2_ahead": 0,
                            "one_wave": True, "silu_out": True, "even_splits": True}


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_one_wave_of_split_tasks_follows_even_splits_by_default(batch):
    """On the H200, with splits sized by the context, one wave of split tasks is 7.2 /
    6.4 % faster at b4 / b8 and no slower at b1; with planned chunks it is slower at b1,
    so a planned-split list keeps up to two waves unless asked."""
    sms = 129  # not a multiple of batch x kv heads: one wave and two differ at every batch

    def per_layer(**options) -> tuple[bool, int]:
        plan = builder.build_step(TINY, batch, sms, num_blocks=sms, **options)
        n = sum(t.opcode == Opcode.ATTN_SPLIT for t in plan.tasks)
        return plan.options["one_wave"], n // TINY.layers

    assert per_layer() == (True, per_layer(one_wave=True)[1])
    assert per_layer()[1] <= sms < per_layer(even_splits=False)[1]
    assert per_layer(even_splits=False) == (False, per_layer(one_wave=False)[1])


@pytest.mark.parametrize("batch,default,one_wave", [(1, (22, 48), (16, 64)),
                                                    (4, (6, 192), (4, 256)),
                                                    (8, (4, 336), (2, 512))])
def test_split_plans_of_the_probe_model(batch, default, one_wave):
    # the probe model's shape on the H200: 8 kv heads, 1024 positions, 132 SMs, 16-token
    # pages; by default at least one split task per SM (up to two waves of them), with
    # one_wave at most one
    assert builder.attention_splits(batch, 8, 1024, 132) == default
    assert builder.attention_splits(batch, 8, 1024, 132, one_wave=True) == one_wave
    assert batch * 8 * one_wave[0] <= 132 < batch * 8 * default[0]


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_kv_splits_caps_one_wave_of_even_splits(batch):
    """Fat split tasks: at most kv_splits a (sequence, kv head), each chunk still
    a whole number of pages covering the plan; one task a kv head holds the whole context."""
    full = builder.attention_splits(batch, 8, 1024, 132, one_wave=True)
    for cap in (1, 2, 3, 64):
        splits, chunk = builder.attention_splits(batch, 8, 1024, 132, one_wave=True,
                                                 kv_splits=cap)
        assert splits == min(cap, full[0]) and chunk % 16 == 0 and splits * chunk >= 1024
    assert builder.attention_splits(batch, 8, 1024, 132, one_wave=True, kv_splits=1) == \
        (1, 1024)
    plan = builder.build_step(TINY, batch, 132, num_blocks=16, kv_splits=1)
    assert plan.options["kv_splits"] == plan.shape.max_splits == 1
    assert sum(t.opcode == Opcode.ATTN_SPLIT for t in plan.tasks) == \
        batch * TINY.kv_heads * TINY.layers
    assert "kv_splits" not in builder.build_step(TINY, batch, 132, num_blocks=16).options


@pytest.mark.parametrize("options", [{"kv_splits": 0}, {"kv_splits": 1, "one_wave": False},
                                     {"kv_splits": 1, "even_splits": False}])
def test_kv_splits_outside_one_wave_of_even_splits_is_refused(options):
    with pytest.raises(UsageError, match="kv_splits"):
        builder.build_step(TINY, 1, 132, num_blocks=16, **options)


def test_splits_are_emitted_split_major():
    plan = builder.build_step(TINY, 2, 132, num_blocks=16)
    first = [t.tile[:3] for t in plan.tasks
             if t.opcode == Opcode.ATTN_SPLIT and t.label.startswith("L0.")]
    assert [s for _, _, s in first] == sorted(s for _, _, s in first)  # every head's split 0 first
    assert len({(b, g) for b, g, s in first if s == 0}) == 2 * TINY.kv_heads


@pytest.mark.parametrize("batch", [1, 4, 8])
@pytest.mark.parametrize("options", [{}, {"fuse": False}, FULL])
def test_padded_levels_give_every_block_one_wave_of_each_level(batch, options):
    # on the static schedule block i runs tasks i, i + 132, ...: after padding, each wave of
    # 132 holds tasks of one level only, and the list is the same tasks in the same order
    plain = builder.build_step(PROBE, batch, 132, num_blocks=batch * 64, **options)
    padded = builder.build_step(PROBE, batch, 132, num_blocks=batch * 64, pad_levels=True,
                                **options)
    assert validate(padded.tasks, padded.shape, padded.buffers, padded.num_counters).ok
    assert [t for t in padded.tasks if t.opcode != Opcode.NOP] == plain.tasks
    assert len(padded.tasks) % 132 == 0 and padded.options["pad_levels"] is True
    assert "pad_levels" not in plain.options
    level = levels(padded.tasks)
    real = [i for i, t in enumerate(padded.tasks) if t.opcode != Opcode.NOP]
    for w in range(len(padded.tasks) // 132):
        in_wave = {level[i] for i in real if i // 132 == w}
        assert len(in_wave) <= 1, f"wave {w} mixes levels {sorted(in_wave)}"
    # a level spans the fewest whole waves its tasks fill (the fused lists' stages: one)
    waves_of: dict[int, set[int]] = {}
    for i in real:
        waves_of.setdefault(level[i], set()).add(i // 132)
    count = Counter(level[i] for i in real)
    assert all(len(w) == -(-count[lv] // 132) for lv, w in waves_of.items())
    if options.get("fuse", True):
        assert all(len(w) == 1 for w in waves_of.values())
    # every NOP is a bare task: no waits, no signal, no operands
    nops = [t for t in padded.tasks if t.opcode == Opcode.NOP]
    assert nops and all(not t.waits and t.signal == NO_COUNTER and not t.operands
                        for t in nops)


def test_levels_count_the_longest_chain_of_waits():
    plan = builder.build_step(TINY, 1, 8, num_blocks=64, **FULL)
    level = levels(plan.tasks)
    by_label = dict(zip((t.label for t in plan.tasks), level))
    assert by_label["embed[0]"] == 0
    # q|k|v after the embed; the splits after their kv head's tiles; o_proj after the splits
    assert by_label["L0.q[0]"] == 1 and by_label["L0.split[0,0,0]"] == 2
    assert by_label["L0.o[0]"] == 3 and by_label["L1.q[0]"] == 6


def test_padded_levels_refuse_a_list_whose_levels_fall():
    from rowgate_lab.megakernel.abi import Task

    rising = [Task(Opcode.EMBED, signal=0), Task(Opcode.GEMV, waits=((0, 1),), signal=1)]
    assert len(padded_to_waves(rising, 4)) == 8
    falling = [*rising, Task(Opcode.EMBED, signal=2, label="late")]
    with pytest.raises(UsageError, match=r"task 2 \(late\) is at level 0 after level 1"):
        padded_to_waves(falling, 4)


def test_padded_levels_refuse_l2_ahead():
    with pytest.raises(UsageError, match="pad_levels and l2_ahead"):
        builder.build_step(PROBE, 1, 132, num_blocks=64, pad_levels=True, l2_ahead=2)
