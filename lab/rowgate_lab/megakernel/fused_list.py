"""The fused decode-step task list (ABI v2 flags), emitted for `builder.build_step`.

Per layer: q|k|v tiles (NORM_IN: the input norm in their prologue), attention splits
(ROPE_IN: head norms, RoPE and the newest token's append in the split), o_proj tiles
(MERGE_IN | RESIDUAL_OUT), gate|up tiles (NORM_IN), down tiles (SILU_IN |
RESIDUAL_OUT); the logits (NORM_IN). `silu_out`: each gate|up tile takes the same rows of
both weights and stores SiLU(gate) * up (SILU_OUT) into the region's first columns, and
the down tiles stage that plain: the SiLU once an element, not once a down tile (it was
11.7 of a b8 down tile's 20.6 us prologue). `even_splits`: the splits
(EVEN_SPLITS) spread each sequence's context over all of them. `fuse_norm=False` keeps
each RMS norm a stage of its own (one task per sequence, into `h`); `fuse_merge=False` keeps the attention
merge a stage (one task per sequence and kv head, into `attn`, its splits signalling
their own counter): every consumer tile redoes a fused prologue, which at larger
batches costs more than the stage it saves (docs/perf.md). Each fused op computes what
the unfused op computes, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rowgate_lab.megakernel.abi import GRANULE, UNUSED, Flag, Opcode, Operand, Task
from rowgate_lab.megakernel.tiling import gemv_rows

if TYPE_CHECKING:
    from rowgate_lab.megakernel.step import Emitter, ModelDims, Region

Waits = tuple[tuple[int, int], ...]
"""A task's (counter, value) waits."""
Source = tuple[tuple[Operand, ...], int, Waits]
"""A consumer's input operands, its flags, and the waits before it."""


@dataclass(frozen=True)
class Layout:
    """What the fused emitter needs of a planned step."""

    d: ModelDims
    batch: int
    sm: int
    splits: int
    chunk: int
    slots: dict[str, int]
    regions: dict[str, Region]
    scale: int

    def w(self, name: str) -> Operand:
        return Operand(self.slots[name], 0)

    def ws(self, name: str, column: int = 0) -> Operand:
        """A workspace region, optionally from a bf16 column of its rows (a multiple of
        8 elements: one granule)."""
        r = self.regions[name]
        return Operand(r.slot, (r.offset + 2 * column) // GRANULE)


def _tiles(op: Opcode, n: int, rows: int, rest: tuple[int, ...], ops: tuple[Operand, ...],
           flags: int, label: str) -> list[Task]:
    """GEMV tiles of rows [r, r + rows) of an n-row weight; `rest` = tile words 2.."""
    return [Task(op, (r, min(rows, n - r), *rest), ops, flags=flags, label=f"{label}[{r}]")
            for r in range(0, n, rows)]


def _normed(e: Emitter, lay: Layout, weight: str, waits: Waits, fuse: bool,
            label: str) -> Source:
    """A GEMV input normalised with `weight`: (x, weight, NORM_IN) with the same waits,
    or an RMS_NORM stage into h and (h, -, 0) waiting for it."""
    if fuse:
        return (lay.ws("x"), lay.w(weight)), int(Flag.NORM_IN), waits
    c, n = e.stage([Task(Opcode.RMS_NORM, (b, 1, lay.d.hidden), (lay.ws("x"), lay.w(weight),
                                                                 lay.ws("h")),
                         label=f"{label}[{b}]") for b in range(lay.batch)], waits)
    return (lay.ws("h"),), 0, ((c, n),)


def _qkv(e: Emitter, lay: Layout, i: int, waits: Waits, fine_deps: bool,
         fuse_norm: bool) -> list[Waits]:
    """q | k | v tiles of every sequence; the waits of each kv head's splits."""
    d = lay.d
    D, G = d.head_dim, d.heads // d.kv_heads
    qn, kvn = d.heads * D, d.kv_heads * D
    p = f"model.layers.{i}."
    src, flags, waits = _normed(e, lay, p + "input_layernorm.weight", waits, fuse_norm,
                                f"L{i}.input_norm")
    rows = gemv_rows(qn + 2 * kvn, lay.sm, lay.scale)
    tiles = []
    for name, n_rows, col in (("q", qn, 0), ("k", kvn, qn), ("v", kvn, qn + kvn)):
        for t in _tiles(Opcode.GEMV, n_rows, rows, (d.hidden, qn + 2 * kvn, col),
                        (lay.w(p + f"self_attn.{name}_proj.weight"), src[0], lay.ws("qkv"),
                         *src[1:]), flags, f"L{i}.{name}"):
            tiles.append((t.tile[0] // (G * D if name == "q" else D), t))
    if not (fine_deps and D % rows == 0):
        c, n = e.stage([t for _, t in tiles], waits)
        return [((c, n),)] * d.kv_heads
    # one counter per kv head: its splits start once its rows are in
    counters = [e.counter() for _ in range(d.kv_heads)]
    count = [0] * d.kv_heads
    for kvh, t in tiles:
        e.tasks.append(Task(t.opcode, t.tile, t.operands, waits, counters[kvh], t.flags,
                            t.label))
        count[kvh] += 1
    return [((counters[g], count[g]),) for g in range(d.kv_heads)]


def _attention(e: Emitter, lay: Layout, i: int, split_waits: list[Waits],
               fuse_merge: bool, even_splits: bool) -> Source:
    """Splits (ROPE_IN) and, unfused, their merges; returns (o_proj input operands and
    flags, the waits of o_proj)."""
    d = lay.d
    qn, kvn = d.heads * d.head_dim, d.kv_heads * d.head_dim
    p = f"model.layers.{i}."
    shared = e.counter() if fuse_merge else None
    merges = [(shared if shared is not None else e.counter(), b, g)
              for b in range(lay.batch) for g in range(d.kv_heads)]
    # split-major: blocks claim in list order, so every (sequence, kv head)'s first splits
    # -- the ones holding tokens when contexts are short of the planned maximum -- start
    # in the first wave; the empty ones go last (a kv head's splits in a row had put the
    # last heads' token-bearing splits behind the other heads' empty ones)
    for s in range(lay.splits):
        for c, b, g in merges:
            e.tasks.append(Task(
                Opcode.ATTN_SPLIT, (b, g, s, lay.chunk, qn + 2 * kvn, qn, qn + kvn, 0),
                (lay.ws("qkv"), lay.w(f"k_cache.{i}"), lay.w(f"v_cache.{i}"),
                 lay.ws("partials"), lay.w("rope.cos_sin"),
                 lay.w(p + "self_attn.q_norm.weight"), lay.w(p + "self_attn.k_norm.weight")),
                split_waits[g], c, int(Flag.ROPE_IN | (Flag.EVEN_SPLITS if even_splits else 0)),
                f"L{i}.split[{b},{g},{s}]"))
    if shared is not None:  # fuse_merge
        return (lay.ws("partials"),), int(Flag.MERGE_IN), ((shared, len(merges) * lay.splits),)
    mc = e.counter()
    for c, b, g in merges:
        e.tasks.append(Task(Opcode.ATTN_MERGE, (b, g, lay.splits), (lay.ws("partials"),
                                                                     lay.ws("attn")),
                            ((c, lay.splits),), mc, label=f"L{i}.merge[{b},{g}]"))
    return (lay.ws("attn"),), 0, ((mc, len(merges)),)


def _ahead(lay: Layout, i: int, rows: int, eighths: int) -> list[Task]:
    """PREFETCH_L2 tasks for the first `eighths` / 8 of each gate | up tile's rows (whole
    16-row rounds: the order a tensor-core tile reads its rows in), no waits, no signal."""
    d = lay.d
    ahead = max(16, rows * eighths // 8 // 16 * 16)
    out = []
    for name in ("gate_proj", "up_proj"):
        w = lay.w(f"model.layers.{i}.mlp.{name}.weight")
        for r in range(0, d.intermediate, rows):
            n = min(ahead, d.intermediate - r)
            out.append(Task(Opcode.PREFETCH_L2, (n * d.hidden * 2,),
                            (Operand(w.buffer, r * d.hidden * 2 // GRANULE),),
                            label=f"L{i}.l2_{name.split('_')[0]}[{r}]"))
    return out


def _mlp(e: Emitter, lay: Layout, i: int, src: Source, silu_out: bool) -> Waits:
    """gate | up tiles (normalised on the way in) and down tiles adding into the residual
    stream: SiLU-mul while the down tiles stage, or in the gate|up epilogue (`silu_out`)."""
    d = lay.d
    p, gu_n = f"model.layers.{i}.", 2 * d.intermediate
    ops, flags, waits = src
    gate, up = lay.w(p + "mlp.gate_proj.weight"), lay.w(p + "mlp.up_proj.weight")
    down_rows = gemv_rows(d.hidden, lay.sm, lay.scale)
    if silu_out:  # operand e: the up weight (SILU_OUT); act = the region's first I columns
        norm = ops[1] if len(ops) > 1 else UNUSED  # operand d: NORM_IN's weight
        c, n = e.stage(_tiles(Opcode.GEMV, d.intermediate,
                              gemv_rows(d.intermediate, lay.sm, lay.scale),
                              (d.hidden, d.intermediate, 0),
                              (gate, ops[0], lay.ws("gu"), norm, up),
                              flags | int(Flag.SILU_OUT), f"L{i}.gate_up"), waits)
        c, n = e.stage(_tiles(Opcode.GEMV, d.hidden, down_rows, (d.intermediate, d.hidden, 0),
                              (lay.w(p + "mlp.down_proj.weight"), lay.ws("gu"), lay.ws("x")),
                              int(Flag.RESIDUAL_OUT), f"L{i}.down"), ((c, n),))
        return ((c, n),)
    rows = gemv_rows(gu_n, lay.sm, lay.scale)
    c, n = e.stage(
        _tiles(Opcode.GEMV, d.intermediate, rows, (d.hidden, gu_n, 0),
               (gate, ops[0], lay.ws("gu"), *ops[1:]), flags, f"L{i}.gate") +
        _tiles(Opcode.GEMV, d.intermediate, rows, (d.hidden, gu_n, d.intermediate),
               (up, ops[0], lay.ws("gu"), *ops[1:]), flags, f"L{i}.up"), waits)
    # down: SiLU-mul while staging, add into the residual stream
    c, n = e.stage(_tiles(Opcode.GEMV, d.hidden, down_rows, (d.intermediate, d.hidden, 0, gu_n),
                          (lay.w(p + "mlp.down_proj.weight"), lay.ws("gu"), lay.ws("x"),
                           lay.ws("gu", d.intermediate)),
                          int(Flag.SILU_IN | Flag.RESIDUAL_OUT), f"L{i}.down"), ((c, n),))
    return ((c, n),)


def emit_fused(e: Emitter, lay: Layout, *, fine_deps: bool, fuse_norm: bool,
               fuse_merge: bool, l2_ahead: int = 0, silu_out: bool = False,
               even_splits: bool = False) -> None:
    d, batch = lay.d, lay.batch
    qn, gu_n = d.heads * d.head_dim, 2 * d.intermediate
    c, n = e.stage([Task(Opcode.EMBED, (b, 1, d.hidden, d.vocab),
                         (lay.w("model.embed_tokens.weight"), lay.ws("x")), label=f"embed[{b}]")
                    for b in range(batch)], ())
    waits: Waits = ((c, n),)
    for i in range(d.layers):
        p = f"model.layers.{i}."
        split_waits = _qkv(e, lay, i, waits, fine_deps, fuse_norm)
        src, flags, waits = _attention(e, lay, i, split_waits, fuse_merge, even_splits)
        if l2_ahead:  # claimed by blocks done with their splits, while DRAM idles
            e.tasks.extend(_ahead(lay, i, gemv_rows(gu_n, lay.sm, lay.scale), l2_ahead))
        # o_proj: (merge while staging,) add into the residual stream
        c, n = e.stage(_tiles(Opcode.GEMV, d.hidden, gemv_rows(d.hidden, lay.sm, lay.scale),
                              (qn, d.hidden, 0),
                              (lay.w(p + "self_attn.o_proj.weight"), src[0], lay.ws("x")),
                              flags | int(Flag.RESIDUAL_OUT), f"L{i}.o"), waits)
        waits = _mlp(e, lay, i, _normed(e, lay, p + "post_attention_layernorm.weight",
                                        ((c, n),), fuse_norm, f"L{i}.post_norm"), silu_out)
    src, flags, waits = _normed(e, lay, "model.norm.weight", waits, fuse_norm, "final_norm")
    e.stage(_tiles(Opcode.LOGITS, d.vocab, gemv_rows(d.vocab, lay.sm, lay.scale),
                   (d.hidden, d.vocab, 0), (lay.w("lm_head.weight"), src[0], lay.ws("logits"),
                                            *src[1:]), flags, "logits"), waits)
