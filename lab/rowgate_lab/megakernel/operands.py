"""What each opcode's operands are and how many bytes of them one task touches.

The same table as docs/task-abi.md ("Operation codes"); the validator checks
every operand against it, and the kernel reads exactly these extents. Extents
are from the operand's start (the builder points operands at tensor starts,
or at a column of a region; tile coordinates select rows inside). ABI v2 flags
change what an operand is (a GEMV's input is a norm's, a SiLU-mul's or the
attention merge's input; its output may be the residual stream, read and
written), so an operand spec says when it applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rowgate_lab.megakernel.abi import INPUT_FLAGS, NO_COUNTER, Flag, Opcode, StepShape, Task

BF16 = 2
F32 = 4


@dataclass(frozen=True)
class OperandSpec:
    name: str
    access: str
    """`r`, `w` or `rw`; a written operand must live in a writable buffer."""
    extent: Callable[[Task, StepShape], int]
    """Bytes from the operand's start the task may touch."""
    when: Callable[[Task], bool] = lambda t: True
    """Whether the operand is used (e.g. the cache of a ROPE task only when appending)."""
    index: int = -1
    """Operand slot a..h (0..7); -1: its position in the spec's tuple."""


@dataclass(frozen=True)
class OpSpec:
    operands: tuple[OperandSpec, ...]
    tile: tuple[str, ...]
    checks: Callable[[Task, StepShape], list[str]]
    """Tile facts that must hold (each failure one short phrase)."""

    def used(self, t: Task) -> list[tuple[int, OperandSpec]]:
        """(operand index, spec) of every operand the task uses."""
        return [(o.index if o.index >= 0 else k, o) for k, o in enumerate(self.operands)
                if o.when(t)]


def _has(flag: Flag) -> Callable[[Task], bool]:
    return lambda t: bool(t.flags & flag)


def _not(flag: Flag) -> Callable[[Task], bool]:
    return lambda t: not t.flags & flag


def _rows(t: Task, s: StepShape, limit: int, what: str) -> list[str]:
    row0, rows = t.tile[0], t.tile[1]
    if rows == 0:
        return [f"{what}: zero rows"]
    if row0 + rows > limit:
        return [f"{what}: rows {row0}..{row0 + rows} exceed {limit}"]
    return []


def _embed_checks(t: Task, s: StepShape) -> list[str]:
    return _rows(t, s, s.batch, "batch rows") + ([] if t.tile[2] == s.hidden else [
        f"width {t.tile[2]} != hidden {s.hidden}"])


def _norm_checks(t: Task, s: StepShape) -> list[str]:
    return [] if t.tile[1] and t.tile[2] else ["zero rows or width"]


def x_stride(t: Task) -> int:
    """A GEMV's input row stride in elements (tile word 5; 0 means K)."""
    return t.tile[5] or t.tile[2]


def _gemv_checks(t: Task, s: StepShape) -> list[str]:
    row0, rows, k, n, col = t.tile[:5]
    out = [] if rows else ["output rows: zero rows"]
    if col + row0 + rows > n:
        out.append(f"output columns {col + row0}..{col + row0 + rows} exceed the row stride {n}")
    if k == 0 or k % 8:
        out.append(f"K={k} is not a positive multiple of 8 (16-byte weight loads)")
    if x_stride(t) < k:
        out.append(f"input row stride {x_stride(t)} < K={k}")
    inputs = t.flags & INPUT_FLAGS
    if inputs & (inputs - 1):
        out.append(f"more than one input flag ({Flag(inputs)!r}): the staged input comes from "
                   f"one place")
    if t.flags & Flag.SILU_OUT and t.flags & Flag.RESIDUAL_OUT:
        out.append("SILU_OUT and RESIDUAL_OUT: the output is SiLU(gate) * up or a residual "
                   "add, not both")
    if t.flags & Flag.MERGE_IN and k != s.num_heads * s.head_dim:
        out.append(f"MERGE_IN: K={k} is not heads x head_dim = {s.num_heads * s.head_dim}")
    return out


def _head_checks(t: Task, s: StepShape) -> list[str]:
    nheads, d = t.tile[2], t.tile[3]
    out = _rows(t, s, s.batch * nheads, "head rows")
    if d != s.head_dim:
        out.append(f"head_dim {d} != step head_dim {s.head_dim}")
    return out


def _split_checks(t: Task, s: StepShape) -> list[str]:
    seq, kvh, split, chunk, stride, k_col, v_col, q_col = t.tile
    out = []
    if seq >= s.batch:
        out.append(f"sequence {seq} >= batch {s.batch}")
    if kvh >= s.num_kv_heads:
        out.append(f"kv head {kvh} >= {s.num_kv_heads}")
    if split >= s.max_splits:
        out.append(f"split {split} >= max_splits {s.max_splits}")
    if chunk == 0:
        out.append("empty chunk")
    if t.flags & Flag.ROPE_IN:
        d = s.head_dim
        for what, col, width in (("q", q_col, s.num_heads * d), ("k", k_col, s.num_kv_heads * d),
                                 ("v", v_col, s.num_kv_heads * d)):
            if col % 8 or col + width > stride:
                out.append(f"ROPE_IN: {what} columns {col}..{col + width} outside the "
                           f"{stride}-wide q/k/v rows (or not a multiple of 8)")
    return out


def _merge_checks(t: Task, s: StepShape) -> list[str]:
    seq, kvh, splits = t.tile[:3]
    out = []
    if seq >= s.batch:
        out.append(f"sequence {seq} >= batch {s.batch}")
    if kvh >= s.num_kv_heads:
        out.append(f"kv head {kvh} >= {s.num_kv_heads}")
    if not 0 < splits <= s.max_splits:
        out.append(f"{splits} splits outside 1..max_splits {s.max_splits}")
    return out


def _prefetch_checks(t: Task, s: StepShape) -> list[str]:
    out = [] if t.tile[0] and t.tile[0] % 16 == 0 else [
        f"{t.tile[0]} bytes to prefetch: expected a positive multiple of 16"]
    if t.signal != NO_COUNTER or t.waits:
        out.append("a prefetch waits for nothing and signals nothing (it has no result)")
    return out


def _cols_checks(t: Task, s: StepShape) -> list[str]:
    col0, cols, n = t.tile[:3]
    if cols == 0 or col0 + cols > n:
        return [f"columns {col0}..{col0 + cols} outside 0..{n}"]
    return []


def partials_bytes(s: StepShape) -> int:
    return s.batch * s.num_kv_heads * s.max_splits * s.group * (s.head_dim + 2) * F32


def _partials(t: Task, s: StepShape) -> int:
    return partials_bytes(s)


def _cache_row(t: Task, s: StepShape) -> int:
    return t.tile[2] * t.tile[3] * BF16


def _kv_cache(t: Task, s: StepShape) -> int:
    return s.page_size * s.num_kv_heads * s.head_dim * BF16


def _gemv_in(t: Task, s: StepShape) -> int:
    return ((s.batch - 1) * x_stride(t) + t.tile[2]) * BF16


def _gemv_out(elem: int) -> Callable[[Task, StepShape], int]:
    return lambda t, s: ((s.batch - 1) * t.tile[3] + t.tile[4] + t.tile[0] + t.tile[1]) * elem


def _weight(t: Task, s: StepShape) -> int:
    return (t.tile[0] + t.tile[1]) * t.tile[2] * BF16


_MERGE = _has(Flag.MERGE_IN)
_RESIDUAL = _has(Flag.RESIDUAL_OUT)
_ROPE_IN = _has(Flag.ROPE_IN)
_GEMV = (
    OperandSpec("weight", "r", _weight, index=0),
    OperandSpec("x", "r", _gemv_in, when=lambda t: not t.flags & (Flag.MERGE_IN | Flag.SILU_IN),
                index=1),
    OperandSpec("gate", "r", _gemv_in, when=_has(Flag.SILU_IN), index=1),
    OperandSpec("partials", "r", _partials, when=_MERGE, index=1),
    OperandSpec("y", "w", _gemv_out(BF16), when=_not(Flag.RESIDUAL_OUT), index=2),
    OperandSpec("residual", "rw", _gemv_out(BF16), when=_RESIDUAL, index=2),
    OperandSpec("norm_weight", "r", lambda t, s: t.tile[2] * BF16, when=_has(Flag.NORM_IN),
                index=3),
    OperandSpec("up", "r", _gemv_in, when=_has(Flag.SILU_IN), index=3),
    OperandSpec("up_weight", "r", _weight, when=_has(Flag.SILU_OUT), index=4),
)
_GEMV_TILE = ("row0", "rows", "K", "N (y row stride)", "y column", "x row stride", "-", "-")

OPS: dict[Opcode, OpSpec] = {
    Opcode.NOP: OpSpec((), ("-",) * 8, lambda t, s: []),
    Opcode.EMBED: OpSpec((
        OperandSpec("table", "r", lambda t, s: t.tile[3] * t.tile[2] * BF16),
        OperandSpec("out", "w", lambda t, s: (t.tile[0] + t.tile[1]) * t.tile[2] * BF16),
    ), ("row0", "rows", "hidden", "vocab", "-", "-", "-", "-"), _embed_checks),
    Opcode.RMS_NORM: OpSpec((
        OperandSpec("x", "r", lambda t, s: (t.tile[0] + t.tile[1]) * t.tile[2] * BF16),
        OperandSpec("weight", "r", lambda t, s: t.tile[2] * BF16),
        OperandSpec("out", "w", lambda t, s: (t.tile[0] + t.tile[1]) * t.tile[2] * BF16),
    ), ("row0", "rows", "width", "-", "-", "-", "-", "-"), _norm_checks),
    Opcode.GEMV: OpSpec(_GEMV, _GEMV_TILE, _gemv_checks),
    Opcode.LOGITS: OpSpec((
        OperandSpec("weight", "r", _weight),
        OperandSpec("x", "r", _gemv_in),
        OperandSpec("logits", "w", _gemv_out(F32)),
        OperandSpec("norm_weight", "r", lambda t, s: t.tile[2] * BF16, when=_has(Flag.NORM_IN)),
    ), _GEMV_TILE, _gemv_checks),
    Opcode.ROPE: OpSpec((
        OperandSpec("x", "rw", lambda t, s: (t.tile[0] + t.tile[1]) * t.tile[3] * BF16),
        OperandSpec("cos_sin", "r", lambda t, s: t.tile[3] * BF16),
        OperandSpec("norm_weight", "r", lambda t, s: t.tile[3] * BF16),
        OperandSpec("cache", "w", _cache_row, when=_has(Flag.APPEND_KV)),
    ), ("row0", "rows", "heads", "head_dim", "-", "-", "-", "-"), _head_checks),
    Opcode.KV_APPEND: OpSpec((
        OperandSpec("src", "r", lambda t, s: (t.tile[0] + t.tile[1]) * t.tile[3] * BF16),
        OperandSpec("cache", "w", _cache_row),
    ), ("row0", "rows", "heads", "head_dim", "-", "-", "-", "-"), _head_checks),
    Opcode.ATTN_SPLIT: OpSpec((
        OperandSpec("q", "r", lambda t, s: s.batch * s.num_heads * s.head_dim * BF16,
                    when=_not(Flag.ROPE_IN), index=0),
        OperandSpec("qkv", "r", lambda t, s: s.batch * t.tile[4] * BF16, when=_ROPE_IN, index=0),
        OperandSpec("k_cache", "r", _kv_cache, when=_not(Flag.ROPE_IN), index=1),
        OperandSpec("k_cache", "rw", _kv_cache, when=_ROPE_IN, index=1),
        OperandSpec("v_cache", "r", _kv_cache, when=_not(Flag.ROPE_IN), index=2),
        OperandSpec("v_cache", "rw", _kv_cache, when=_ROPE_IN, index=2),
        OperandSpec("partials", "w", _partials, index=3),
        OperandSpec("cos_sin", "r", lambda t, s: s.head_dim * BF16, when=_ROPE_IN, index=4),
        OperandSpec("q_norm", "r", lambda t, s: s.head_dim * BF16, when=_ROPE_IN, index=5),
        OperandSpec("k_norm", "r", lambda t, s: s.head_dim * BF16, when=_ROPE_IN, index=6),
    ), ("seq", "kv_head", "split", "chunk", "q/k/v row stride", "k column", "v column",
        "q column"), _split_checks),
    Opcode.ATTN_MERGE: OpSpec((
        OperandSpec("partials", "r", _partials),
        OperandSpec("out", "w", lambda t, s: s.batch * s.num_heads * s.head_dim * BF16),
    ), ("seq", "kv_head", "splits", "-", "-", "-", "-", "-"), _merge_checks),
    Opcode.SILU_MUL: OpSpec((
        OperandSpec("gate", "r", lambda t, s: s.batch * t.tile[2] * BF16),
        OperandSpec("up", "r", lambda t, s: s.batch * t.tile[2] * BF16),
        OperandSpec("out", "w", lambda t, s: s.batch * t.tile[2] * BF16),
    ), ("col0", "cols", "width", "-", "-", "-", "-", "-"), _cols_checks),
    Opcode.RESIDUAL_ADD: OpSpec((
        OperandSpec("x", "rw", lambda t, s: s.batch * t.tile[2] * BF16),
        OperandSpec("y", "r", lambda t, s: s.batch * t.tile[2] * BF16),
    ), ("col0", "cols", "width", "-", "-", "-", "-", "-"), _cols_checks),
    Opcode.PREFETCH_L2: OpSpec((
        OperandSpec("weights", "r", lambda t, s: t.tile[0]),
    ), ("bytes", "-", "-", "-", "-", "-", "-", "-"), _prefetch_checks),
}
