"""What each opcode's operands are and how many bytes of them one task touches.

The same table as docs/task-abi.md ("Operation codes"); the validator checks
every operand against it, and the kernel reads exactly these extents. Extents
are from the operand's start (the builder points operands at tensor starts;
tile coordinates select rows inside).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.megakernel.abi import Flag, Opcode, StepShape, Task

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


@dataclass(frozen=True)
class OpSpec:
    operands: tuple[OperandSpec, ...]
    tile: tuple[str, str, str, str]
    checks: Callable[[Task, StepShape], list[str]]
    """Tile facts that must hold (each failure one short phrase)."""


def _rows(t: Task, s: StepShape, limit: int, what: str) -> list[str]:
    row0, rows = t.tile[0], t.tile[1]
    if rows == 0:
        return [f"{what}: zero rows"]
    if row0 + rows > limit:
        return [f"{what}: rows {row0}..{row0 + rows} exceed {limit}"]
    return []


def _embed_checks(t, s):
    return _rows(t, s, s.batch, "batch rows") + ([] if t.tile[2] == s.hidden else [
        f"width {t.tile[2]} != hidden {s.hidden}"])


def _norm_checks(t, s):
    return [] if t.tile[1] and t.tile[2] else ["zero rows or width"]


def _gemv_checks(t, s):
    k, n = t.tile[2], t.tile[3]
    out = _rows(t, s, n, "output rows")
    if k == 0 or k % 8:
        out.append(f"K={k} is not a positive multiple of 8 (16-byte weight loads)")
    return out


def _head_checks(t, s):
    nheads, d = t.tile[2], t.tile[3]
    out = _rows(t, s, s.batch * nheads, "head rows")
    if d != s.head_dim:
        out.append(f"head_dim {d} != step head_dim {s.head_dim}")
    return out


def _split_checks(t, s):
    seq, kvh, split, chunk = t.tile
    out = []
    if seq >= s.batch:
        out.append(f"sequence {seq} >= batch {s.batch}")
    if kvh >= s.num_kv_heads:
        out.append(f"kv head {kvh} >= {s.num_kv_heads}")
    if split >= s.max_splits:
        out.append(f"split {split} >= max_splits {s.max_splits}")
    if chunk == 0:
        out.append("empty chunk")
    return out


def _merge_checks(t, s):
    seq, kvh, splits = t.tile[:3]
    out = []
    if seq >= s.batch:
        out.append(f"sequence {seq} >= batch {s.batch}")
    if kvh >= s.num_kv_heads:
        out.append(f"kv head {kvh} >= {s.num_kv_heads}")
    if not 0 < splits <= s.max_splits:
        out.append(f"{splits} splits outside 1..max_splits {s.max_splits}")
    return out


def _cols_checks(t, s):
    col0, cols, n = t.tile[:3]
    if cols == 0 or col0 + cols > n:
        return [f"columns {col0}..{col0 + cols} outside 0..{n}"]
    return []


def _partials(t: Task, s: StepShape) -> int:
    return s.batch * s.num_kv_heads * s.max_splits * s.group * (s.head_dim + 2) * F32


def _cache_row(t: Task, s: StepShape) -> int:
    return t.tile[2] * t.tile[3] * BF16


def _kv_cache(t: Task, s: StepShape) -> int:
    return s.page_size * s.num_kv_heads * s.head_dim * BF16


OPS: dict[Opcode, OpSpec] = {
    Opcode.NOP: OpSpec((), ("-", "-", "-", "-"), lambda t, s: []),
    Opcode.EMBED: OpSpec((
        OperandSpec("table", "r", lambda t, s: t.tile[3] * t.tile[2] * BF16),
        OperandSpec("out", "w", lambda t, s: (t.tile[0] + t.tile[1]) * t.tile[2] * BF16),
    ), ("row0", "rows", "hidden", "vocab"), _embed_checks),
    Opcode.RMS_NORM: OpSpec((
        OperandSpec("x", "r", lambda t, s: (t.tile[0] + t.tile[1]) * t.tile[2] * BF16),
        OperandSpec("weight", "r", lambda t, s: t.tile[2] * BF16),
        OperandSpec("out", "w", lambda t, s: (t.tile[0] + t.tile[1]) * t.tile[2] * BF16),
    ), ("row0", "rows", "width", "-"), _norm_checks),
    Opcode.GEMV: OpSpec((
        OperandSpec("weight", "r", lambda t, s: (t.tile[0] + t.tile[1]) * t.tile[2] * BF16),
        OperandSpec("x", "r", lambda t, s: s.batch * t.tile[2] * BF16),
        OperandSpec("y", "w", lambda t, s: s.batch * t.tile[3] * BF16),
    ), ("row0", "rows", "K", "N"), _gemv_checks),
    Opcode.LOGITS: OpSpec((
        OperandSpec("weight", "r", lambda t, s: (t.tile[0] + t.tile[1]) * t.tile[2] * BF16),
        OperandSpec("x", "r", lambda t, s: s.batch * t.tile[2] * BF16),
        OperandSpec("logits", "w", lambda t, s: s.batch * t.tile[3] * F32),
    ), ("row0", "rows", "K", "N"), _gemv_checks),
    Opcode.ROPE: OpSpec((
        OperandSpec("x", "rw", lambda t, s: (t.tile[0] + t.tile[1]) * t.tile[3] * BF16),
        OperandSpec("cos_sin", "r", lambda t, s: t.tile[3] * BF16),
        OperandSpec("norm_weight", "r", lambda t, s: t.tile[3] * BF16),
        OperandSpec("cache", "w", _cache_row, when=lambda t: bool(t.flags & Flag.APPEND_KV)),
    ), ("row0", "rows", "heads", "head_dim"), _head_checks),
    Opcode.KV_APPEND: OpSpec((
        OperandSpec("src", "r", lambda t, s: (t.tile[0] + t.tile[1]) * t.tile[3] * BF16),
        OperandSpec("cache", "w", _cache_row),
    ), ("row0", "rows", "heads", "head_dim"), _head_checks),
    Opcode.ATTN_SPLIT: OpSpec((
        OperandSpec("q", "r", lambda t, s: s.batch * s.num_heads * s.head_dim * BF16),
        OperandSpec("k_cache", "r", _kv_cache),
        OperandSpec("v_cache", "r", _kv_cache),
        OperandSpec("partials", "w", _partials),
    ), ("seq", "kv_head", "split", "chunk"), _split_checks),
    Opcode.ATTN_MERGE: OpSpec((
        OperandSpec("partials", "r", _partials),
        OperandSpec("out", "w", lambda t, s: s.batch * s.num_heads * s.head_dim * BF16),
    ), ("seq", "kv_head", "splits", "-"), _merge_checks),
    Opcode.SILU_MUL: OpSpec((
        OperandSpec("gate", "r", lambda t, s: s.batch * t.tile[2] * BF16),
        OperandSpec("up", "r", lambda t, s: s.batch * t.tile[2] * BF16),
        OperandSpec("out", "w", lambda t, s: s.batch * t.tile[2] * BF16),
    ), ("col0", "cols", "width", "-"), _cols_checks),
    Opcode.RESIDUAL_ADD: OpSpec((
        OperandSpec("x", "rw", lambda t, s: s.batch * t.tile[2] * BF16),
        OperandSpec("y", "r", lambda t, s: s.batch * t.tile[2] * BF16),
    ), ("col0", "cols", "width", "-"), _cols_checks),
}
