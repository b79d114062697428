"""The task list of one decode step of the reference engine's Qwen3 model.

Mirrors `rowgate.engines.qwen3.Qwen3Model.forward` for one new token per
sequence. Unfused (`fuse=False`, the ABI v1 stages): embed; per layer input
RMSNorm, q/k/v GEMV tiles, q/k head norm + RoPE (k appended to the paged cache,
v appended as is), attention splits and their merge, o_proj tiles, residual
add, post-attention RMSNorm, gate/up tiles, SiLU·mul, down tiles, residual
add; final RMSNorm and lm_head logits: 12 stages a layer.

Fused (ABI v2 flags; lab/rowgate_lab/megakernel/fused_list.py): q|k|v tiles into one
region; attention splits that apply the head norms and RoPE to their own heads
and append the newest token themselves (ROPE_IN); o_proj tiles that add into the
residual stream (RESIDUAL_OUT); gate|up tiles that each take the same rows of both
weights and store SiLU·mul (SILU_OUT), and down tiles that add into the residual
stream (RESIDUAL_OUT; `silu_out=False`: gate|up tiles into one region and down tiles
that apply SiLU·mul while staging, SILU_IN | RESIDUAL_OUT): seven stages a layer with
the input/post norms and the merge as stages (the default), five with
`fuse_norm` (NORM_IN) and `fuse_merge` (MERGE_IN). Every fused op computes
exactly what the unfused stages compute, in the same order (docs/task-abi.md).

Each stage signals one counter that the next stage waits on (its full task
count), except attention: unfused, the splits of one (sequence, kv head) signal
their own counter for its merge; fused with `fine_deps`, a kv head's splits wait
only for the q/k/v tiles of that head. GEMV tiles (about one per SM, times
`tile_scale`) and attention splits are sized to the SM count.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rowgate.errors import UsageError
from rowgate_lab.megakernel.abi import (
    SCRATCH_BYTES,
    STAGE_BYTES,
    Flag,
    Opcode,
    Operand,
    StepShape,
    Task,
    merge_floats,
)
from rowgate_lab.megakernel.step import Emitter, ModelDims, Region
from rowgate_lab.megakernel.tiling import gemv_rows, up
from rowgate_lab.megakernel.validate import Buffer
from rowgate_lab.megakernel.waves import padded_to_waves

PAGE_SIZE = 16
ALIGN = 256
COLS_MIN = 256


@dataclass
class StepPlan:
    """Everything a launch needs besides the device pointers."""

    dims: ModelDims
    batch: int
    sm_count: int
    tasks: list[Task]
    shape: StepShape
    buffers: list[Buffer]
    num_counters: int
    slots: dict[str, int] = field(default_factory=dict)
    """Buffer-table slot of each weight / cache / workspace / meta buffer."""
    regions: dict[str, Region] = field(default_factory=dict)
    """Workspace regions (activations, partials, logits)."""
    options: dict[str, Any] = field(default_factory=dict)
    """How the list was built: fused, fine_deps, tile_scale (and why not fused)."""

    def summary(self) -> dict[str, Any]:
        ops: dict[str, int] = {}
        for t in self.tasks:
            ops[Opcode(t.opcode).name] = ops.get(Opcode(t.opcode).name, 0) + 1
        return {"batch": self.batch, "sm_count": self.sm_count, "tasks": len(self.tasks),
                "counters": self.num_counters, "buffers": len(self.buffers),
                "max_splits": self.shape.max_splits, "ops": ops, **self.options}


def col_chunk(n: int, sm_count: int) -> int:
    return min(n, max(COLS_MIN, up(math.ceil(n / sm_count), 8)))


def attention_splits(batch: int, kv_heads: int, max_context: int, sm_count: int,
                     page_size: int = PAGE_SIZE, one_wave: bool = False,
                     kv_splits: int | None = None) -> tuple[int, int]:
    """(splits per (sequence, kv head), tokens per split): at least one split task
    per SM, chunks a whole number of pages; `one_wave`: at most one per SM (so the
    split stage is one wave of tasks, not up to two); `kv_splits`: at most that many a
    (sequence, kv head) (one wave's fewer, fatter tasks)."""
    pages = math.ceil(max_context / page_size)
    if one_wave:
        splits = max(1, min(pages, sm_count // (batch * kv_heads), kv_splits or pages))
        chunk = math.ceil(pages / splits) * page_size  # round up: at most `splits` chunks
        return math.ceil(max_context / chunk), chunk
    splits = max(1, min(pages, math.ceil(sm_count / (batch * kv_heads))))
    chunk = max(1, pages // splits) * page_size  # round down: at least `splits` chunks
    return math.ceil(max_context / chunk), chunk


def fusion_blockers(dims: ModelDims, batch: int, splits: int,
                    fuse_merge: bool = True) -> list[str]:
    """Why the fused list cannot be used at this shape ([] when it can): what the
    fused tasks keep in the kernel's shared memory must fit there."""
    out = []
    k = max(dims.hidden, dims.intermediate, dims.heads * dims.head_dim)
    if batch * k * 2 > STAGE_BYTES:
        out.append(f"batch {batch} x K {k} bf16 exceeds the {STAGE_BYTES}-byte staging buffer")
    if fuse_merge and merge_floats(batch * dims.heads, splits) * 4 > SCRATCH_BYTES:
        out.append(f"{splits} splits' merge weights exceed the {SCRATCH_BYTES}-byte scratch")
    return out


def build_step(dims: ModelDims, batch: int, sm_count: int, *, num_blocks: int,
               max_context: int | None = None, page_size: int = PAGE_SIZE, fuse: bool = True,
               fine_deps: bool = False, tile_scale: int = 1, fuse_norm: bool | None = None,
               fuse_merge: bool = False, l2_ahead: int = 0, one_wave: bool | None = None,
               silu_out: bool = True, even_splits: bool = True,
               kv_splits: int | None = None, pad_levels: bool = False) -> StepPlan:
    """Task list, step shape and buffer table for one decode step at `batch`: fused
    (ABI v2 flags) where the shape allows, else the unfused stages. By default the
    attention merge stays a stage of its own and so do the norms at batch > 1
    (`fuse_norm` / `fuse_merge` True move them into every consumer tile's prologue,
    which redoes them per tile), and splits wait for the whole q|k|v stage (`fine_deps`
    True: only for their kv head's tiles): the fastest combination measured on the H200
    (docs/perf.md). At batch 1 a norm stage is one task on one SM that
    every tile of the next GEMV waits for, twice a layer: moving it into the prologues
    made the b1 step 5 % faster there (1,183 -> 1,121 us), and 5-20 % slower at b4/b8,
    where a norm stage is already one task per sequence. `l2_ahead` (0-8, fused lists): after
    each layer's attention, PREFETCH_L2 tasks ask L2 for that many eighths of every gate|up
    tile's weights, which the blocks idle in the attention phase issue while DRAM is idle.
    `one_wave`: at most one attention split task per SM (`attention_splits`); by default
    (None) it follows `even_splits`. With planned chunks it made a token-bearing split hold
    more tokens (2.4 % slower at b1); with even splits a split's tokens do not depend
    on the plan, and one wave of split tasks made the step 7.2 / 6.4 % faster at b4 / b8 and
    no slower at b1. `silu_out`
    (fused lists, the default): SiLU·mul in the gate|up tiles' epilogue (SILU_OUT), once an
    element; False: in every down tile's prologue (SILU_IN), which redoes it per tile (on
    the H200 the step 4.5 / 10.7 / 17.7 % faster at b1 / b4 / b8 with SILU_OUT, bit
    for bit the same logits). `even_splits` (the default): each attention split takes an
    even share of its sequence's context (EVEN_SPLITS, at least 16 tokens); False: the
    planned chunk, which leaves a context shorter than the plan in a few long splits (the
    step 5.3 / 7.3 / 3.0 % slower at b1 / b4 / b8 on 129-token contexts). Another
    partition of the tokens, so another bitwise family than False's. `kv_splits` (one
    wave only): at most that many splits a (sequence, kv head): a trace found the split
    window set by when blocks reach the split tasks in the queue, not by a split's own
    loads, so a few fat tasks a kv head instead of a wave of thin ones (each split count
    its own bitwise family). On the H100 and H200: slower at every cap and
    batch (b1 989-1293 against 966 us), since a split warp pays ~1 us a token; off.
    `pad_levels` (for the static schedule): NOP tasks pad each dependency level of the list
    to a whole number of waves (`waves.padded_to_waves`), so block i runs the i-th task of every
    level and knows its next GEMV task (a build whose ring ran on into it measured slower and
    was removed); the same tasks in the same order otherwise, so the same bits."""
    if batch < 1 or sm_count < 1 or num_blocks < 1 or tile_scale < 1:
        raise UsageError(f"build_step: batch {batch}, sm_count {sm_count}, num_blocks "
                         f"{num_blocks}, tile_scale {tile_scale} must all be positive")
    if pad_levels and l2_ahead:
        raise UsageError("build_step: pad_levels and l2_ahead: PREFETCH_L2 tasks wait for "
                         "nothing, so they would break the levels' order")
    if kv_splits is not None and (kv_splits < 1 or one_wave is False or not even_splits):
        raise UsageError(f"build_step: kv_splits {kv_splits}: expected a positive cap on "
                         "one wave of even splits")
    if not 0 <= l2_ahead <= 8:
        raise UsageError(f"build_step: l2_ahead {l2_ahead}: expected eighths of a tile, 0..8")
    fuse_norm = batch == 1 if fuse_norm is None else fuse_norm
    one_wave = even_splits if one_wave is None else one_wave
    max_context = max_context or dims.max_position
    splits, chunk = attention_splits(batch, dims.kv_heads, max_context, sm_count, page_size,
                                     one_wave, kv_splits)
    table_width = math.ceil(max_context / page_size)
    buffers: list[Buffer] = []
    slots: dict[str, int] = {}

    def add(name: str, size: int, writable: bool) -> int:
        slots[name] = len(buffers)
        buffers.append(Buffer(name, size, writable))
        return slots[name]

    for name, tensor_shape in dims.weight_shapes().items():
        add(name, math.prod(tensor_shape) * 2, False)
    cache_bytes = (1 + num_blocks) * page_size * dims.kv_heads * dims.head_dim * 2
    for i in range(dims.layers):
        add(f"k_cache.{i}", cache_bytes, True)
        add(f"v_cache.{i}", cache_bytes, True)
    blockers = fusion_blockers(dims, batch, splits, fuse_merge) if fuse else []
    fused = fuse and not blockers
    regions = _workspace(dims, batch, splits, add, fused)
    meta_at = {"ids": 0, "positions": batch, "slots": 2 * batch, "context_lens": 3 * batch,
               "block_tables": 4 * batch}
    meta = add("meta", (4 * batch + batch * table_width) * 4, False)
    shape = StepShape(batch=batch, hidden=dims.hidden, num_heads=dims.heads,
                      num_kv_heads=dims.kv_heads, head_dim=dims.head_dim,
                      intermediate=dims.intermediate, vocab=dims.vocab, page_size=page_size,
                      table_width=table_width, max_splits=splits, rms_eps=dims.rms_eps,
                      softmax_scale=dims.head_dim ** -0.5, meta_buffer=meta,
                      ids_at=meta_at["ids"], positions_at=meta_at["positions"],
                      slots_at=meta_at["slots"], context_lens_at=meta_at["context_lens"],
                      block_tables_at=meta_at["block_tables"])
    e = Emitter()
    if fused:
        from rowgate_lab.megakernel.fused_list import Layout, emit_fused

        emit_fused(e, Layout(dims, batch, sm_count, splits, chunk, slots, regions, tile_scale),
                   fine_deps=fine_deps, fuse_norm=fuse_norm, fuse_merge=fuse_merge,
                   l2_ahead=l2_ahead, silu_out=silu_out, even_splits=even_splits)
    else:
        _emit(e, dims, batch, sm_count, splits, chunk, slots, regions, tile_scale,
              int(Flag.EVEN_SPLITS) if even_splits else 0)
    if pad_levels:
        e.tasks = padded_to_waves(e.tasks, sm_count)
    # The plan's build flags (not operator `--option`s, which tests/test_options.py audits).
    flags: dict[str, Any] = {"fused": fused, "fine_deps": fused and fine_deps,
                             "tile_scale": tile_scale, "fuse_norm": fused and fuse_norm,
                             "fuse_merge": fused and fuse_merge,
                             "l2_ahead": l2_ahead if fused else 0, "one_wave": one_wave,
                             "silu_out": fused and silu_out, "even_splits": even_splits}
    if kv_splits is not None:
        flags["kv_splits"] = splits
    if pad_levels:
        flags["pad_levels"] = True
    if blockers:
        flags["not_fused"] = blockers
    return StepPlan(dims=dims, batch=batch, sm_count=sm_count, tasks=e.tasks, shape=shape,
                    buffers=buffers, num_counters=e.counters, slots=slots, regions=regions,
                    options=flags)


def _workspace(dims: ModelDims, batch: int, splits: int, add: Callable[[str, int, bool], int],
               fused: bool) -> dict[str, Region]:
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    partials = batch * dims.kv_heads * splits * (dims.heads // dims.kv_heads) * \
        (dims.head_dim + 2) * 4
    if fused:  # the residual stream, q|k|v rows, split states, gate|up rows, logits
        # (h and attn only for the norm and merge stages a list keeps unfused)
        sizes = {"x": batch * dims.hidden * 2, "h": batch * dims.hidden * 2,
                 "qkv": batch * (q + 2 * kv) * 2, "partials": partials,
                 "attn": batch * q * 2, "gu": batch * 2 * dims.intermediate * 2,
                 "logits": batch * dims.vocab * 4}
    else:
        sizes = {"x": batch * dims.hidden * 2, "h": batch * dims.hidden * 2, "q": batch * q * 2,
                 "k": batch * kv * 2, "v": batch * kv * 2, "attn": batch * q * 2,
                 "y": batch * dims.hidden * 2, "gate": batch * dims.intermediate * 2,
                 "up": batch * dims.intermediate * 2, "act": batch * dims.intermediate * 2,
                 "partials": partials, "logits": batch * dims.vocab * 4}
    offset, placed = 0, {}
    for name, n in sizes.items():
        placed[name] = (offset, n)
        offset = up(offset + n, ALIGN)
    slot = add("workspace", offset, True)
    return {name: Region(slot, off, n) for name, (off, n) in placed.items()}


def _gemv(op: Opcode, w: Operand, x: Operand, y: Operand, n: int, k: int, sm: int,
          label: str, scale: int = 1) -> list[Task]:
    rows = gemv_rows(n, sm, scale)
    return [Task(op, (r, min(rows, n - r), k, n), (w, x, y), label=f"{label}[{r}]")
            for r in range(0, n, rows)]


def _cols(op: Opcode, ops: tuple[Operand, ...], n: int, sm: int, label: str) -> list[Task]:
    c = col_chunk(n, sm)
    return [Task(op, (c0, min(c, n - c0), n, 0), ops, label=f"{label}[{c0}]")
            for c0 in range(0, n, c)]


def _rows(op: Opcode, ops: tuple[Operand, ...], batch: int, width: int, label: str,
          extra: int = 0) -> list[Task]:
    return [Task(op, (b, 1, width, extra), ops, label=f"{label}[{b}]") for b in range(batch)]


def _emit(e: Emitter, d: ModelDims, batch: int, sm: int, splits: int, chunk: int,
          slots: dict[str, int], r: dict[str, Region], scale: int = 1,
          split_flags: int = 0) -> None:
    def w(name: str) -> Operand:
        return Operand(slots[name], 0)

    ws = {k: v.operand for k, v in r.items()}
    qn, kvn = d.heads * d.head_dim, d.kv_heads * d.head_dim
    c, n = e.stage(_rows(Opcode.EMBED, (w("model.embed_tokens.weight"), ws["x"]), batch,
                         d.hidden, "embed", d.vocab), ())
    for i in range(d.layers):
        p = f"model.layers.{i}."
        c, n = e.stage(_rows(Opcode.RMS_NORM, (ws["x"], w(p + "input_layernorm.weight"), ws["h"]),
                             batch, d.hidden, f"L{i}.input_norm"), ((c, n),))
        c, n = e.stage(
            _gemv(Opcode.GEMV, w(p + "self_attn.q_proj.weight"), ws["h"], ws["q"], qn, d.hidden,
                  sm, f"L{i}.q", scale) +
            _gemv(Opcode.GEMV, w(p + "self_attn.k_proj.weight"), ws["h"], ws["k"], kvn, d.hidden,
                  sm, f"L{i}.k", scale) +
            _gemv(Opcode.GEMV, w(p + "self_attn.v_proj.weight"), ws["h"], ws["v"], kvn, d.hidden,
                  sm, f"L{i}.v", scale), ((c, n),))
        rope = w("rope.cos_sin")
        c, n = e.stage(
            [Task(Opcode.ROPE, (b * d.heads, d.heads, d.heads, d.head_dim),
                  (ws["q"], rope, w(p + "self_attn.q_norm.weight")), label=f"L{i}.rope_q[{b}]")
             for b in range(batch)] +
            [Task(Opcode.ROPE, (b * d.kv_heads, d.kv_heads, d.kv_heads, d.head_dim),
                  (ws["k"], rope, w(p + "self_attn.k_norm.weight"), w(f"k_cache.{i}")),
                  flags=int(Flag.APPEND_KV), label=f"L{i}.rope_k[{b}]") for b in range(batch)] +
            [Task(Opcode.KV_APPEND, (b * d.kv_heads, d.kv_heads, d.kv_heads, d.head_dim),
                  (ws["v"], w(f"v_cache.{i}")), label=f"L{i}.append_v[{b}]")
             for b in range(batch)], ((c, n),))
        merges = []
        for b in range(batch):
            for g in range(d.kv_heads):
                sc, sn = e.stage([Task(Opcode.ATTN_SPLIT, (b, g, s, chunk),
                                       (ws["q"], w(f"k_cache.{i}"), w(f"v_cache.{i}"),
                                        ws["partials"]), flags=split_flags,
                                       label=f"L{i}.split[{b},{g},{s}]")
                                  for s in range(splits)], ((c, n),))
                merges.append((sc, sn, Task(Opcode.ATTN_MERGE, (b, g, splits, 0),
                                            (ws["partials"], ws["attn"]),
                                            label=f"L{i}.merge[{b},{g}]")))
        mc = e.counter()
        for sc, sn, t in merges:
            e.tasks.append(Task(t.opcode, t.tile, t.operands, ((sc, sn),), mc, 0, t.label))
        c, n = mc, len(merges)
        c, n = e.stage(_gemv(Opcode.GEMV, w(p + "self_attn.o_proj.weight"), ws["attn"], ws["y"],
                             d.hidden, qn, sm, f"L{i}.o", scale), ((c, n),))
        c, n = e.stage(_cols(Opcode.RESIDUAL_ADD, (ws["x"], ws["y"]), d.hidden, sm,
                             f"L{i}.residual_attn"), ((c, n),))
        c, n = e.stage(_rows(Opcode.RMS_NORM,
                             (ws["x"], w(p + "post_attention_layernorm.weight"), ws["h"]),
                             batch, d.hidden, f"L{i}.post_norm"), ((c, n),))
        c, n = e.stage(
            _gemv(Opcode.GEMV, w(p + "mlp.gate_proj.weight"), ws["h"], ws["gate"], d.intermediate,
                  d.hidden, sm, f"L{i}.gate", scale) +
            _gemv(Opcode.GEMV, w(p + "mlp.up_proj.weight"), ws["h"], ws["up"], d.intermediate,
                  d.hidden, sm, f"L{i}.up", scale), ((c, n),))
        c, n = e.stage(_cols(Opcode.SILU_MUL, (ws["gate"], ws["up"], ws["act"]), d.intermediate,
                             sm, f"L{i}.silu_mul"), ((c, n),))
        c, n = e.stage(_gemv(Opcode.GEMV, w(p + "mlp.down_proj.weight"), ws["act"], ws["y"],
                             d.hidden, d.intermediate, sm, f"L{i}.down", scale), ((c, n),))
        c, n = e.stage(_cols(Opcode.RESIDUAL_ADD, (ws["x"], ws["y"]), d.hidden, sm,
                             f"L{i}.residual_mlp"), ((c, n),))
    c, n = e.stage(_rows(Opcode.RMS_NORM, (ws["x"], w("model.norm.weight"), ws["h"]), batch,
                         d.hidden, "final_norm"), ((c, n),))
    e.stage(_gemv(Opcode.LOGITS, w("lm_head.weight"), ws["h"], ws["logits"], d.vocab, d.hidden,
                  sm, "logits", scale), ((c, n),))

