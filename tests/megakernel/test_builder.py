"""The decode-step task list: every op of the reference engine's step, dependencies that
order every read after its writer (and every overwrite after its readers), sizes from
the SM count, at batch 1/4/8."""

from __future__ import annotations

import json

import pytest

from pipeline.megakernel import builder, operands
from pipeline.megakernel.abi import GRANULE, Flag, Opcode
from pipeline.megakernel.validate import validate

TINY = builder.ModelDims(vocab=1024, hidden=128, intermediate=256, layers=2, heads=4,
                         kv_heads=2, head_dim=64, rms_eps=1e-6, max_position=2048)
PROBE = builder.ModelDims(vocab=32768, hidden=2048, intermediate=6144, layers=16, heads=16,
                          kv_heads=8, head_dim=128, rms_eps=1e-6, max_position=4096)
EVERY_OP = set(Opcode) - {Opcode.NOP}


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


def _touches(plan, t):
    """(key, access) per operand: workspace regions by name, other buffers by name."""
    spec = operands.OPS[Opcode(t.opcode)]
    by_start = {(r.slot, r.offset): name for name, r in plan.regions.items()}
    out = []
    for k, o in enumerate(spec.operands):
        if not o.when(t):
            continue
        op = t.operand(k)
        key = by_start.get((op.buffer, op.offset * GRANULE), plan.buffers[op.buffer].name)
        if key == "partials":  # one slice per (sequence, kv head), its own counter
            key += f"[{t.tile[0]},{t.tile[1]}]"
        out.append((key, o.access))
    return out


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_every_op_of_the_step_is_covered(batch):
    plan = builder.build_step(TINY, batch, 132, num_blocks=batch * 8)
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
def test_every_read_waits_for_its_writer_and_every_overwrite_for_its_readers(batch):
    plan = builder.build_step(TINY, batch, 16, num_blocks=batch * 8)
    anc = _ancestors(plan.tasks)
    last_write: dict[str, list[int]] = {}
    reads_since: dict[str, list[int]] = {}
    for i, t in enumerate(plan.tasks):
        touched = _touches(plan, t)
        # Tasks of one stage (one signal counter) touch disjoint tiles of a region.
        def others(tasks, i=i, t=t):
            return [j for j in tasks if plan.tasks[j].signal != t.signal]

        for key, access in touched:
            if "r" in access:
                for w in others(last_write.get(key, [])):
                    assert anc[i] >> w & 1, f"task {i} {t.label} reads {key} before writer {w}"
        for key, access in touched:
            if "w" in access:
                for r in others(reads_since.get(key, [])):
                    assert anc[i] >> r & 1, \
                        f"task {i} {t.label} overwrites {key} before reader {r} is done"
        for key, access in touched:
            if "w" in access:
                stage = [w for w in last_write.get(key, []) if plan.tasks[w].signal == t.signal]
                last_write[key] = stage + [i]
                reads_since[key] = []
            if "r" in access:
                reads_since.setdefault(key, []).append(i)


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_probe_model_list_is_valid_and_sized_to_the_sms(batch):
    plan = builder.build_step(PROBE, batch, 132, num_blocks=batch * 64)
    assert validate(plan.tasks, plan.shape, plan.buffers, plan.num_counters).ok
    q_tiles = [t for t in plan.tasks if t.label.startswith("L0.q[")]
    # about one tile per SM, each a whole number of 8-row warps
    assert len(q_tiles) == 128 and all(t.tile[1] == 16 for t in q_tiles)
    splits = {t.tile[2] for t in plan.tasks
              if t.opcode == Opcode.ATTN_SPLIT and t.label.startswith("L0.")}
    assert len(splits) * batch * PROBE.kv_heads >= 132
    assert plan.shape.max_splits == len(splits)


def test_attention_merge_waits_only_for_its_own_splits():
    plan = builder.build_step(TINY, 2, 16, num_blocks=8)
    by_counter: dict[int, list] = {}
    for t in plan.tasks:
        by_counter.setdefault(t.signal, []).append(t)
    for m in (t for t in plan.tasks if t.opcode == Opcode.ATTN_MERGE):
        (c, n), = m.waits
        splits = by_counter[c]
        assert len(splits) == n == m.tile[2]
        assert {(s.tile[0], s.tile[1]) for s in splits} == {(m.tile[0], m.tile[1])}


def test_k_is_appended_after_rope_and_v_as_is():
    plan = builder.build_step(TINY, 1, 16, num_blocks=8)
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
    with pytest.raises(builder.ModelConfigError, match="missing key 'intermediate_size'"):
        builder.ModelDims.load(tmp_path)
