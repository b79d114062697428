"""The task ABI of `kernels/persistent/task_abi.cuh`, byte for byte, on the host.

`TASK_DTYPE` and `SHAPE_DTYPE` are numpy structured dtypes with the header's
field offsets (the layout test compiles the header with g++ and compares
`offsetof`). `OPERANDS` says, per opcode, what each operand is and how many
bytes of it a task touches: the validator's bounds check and the docs' table
both come from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Any

import numpy as np

from rowgate.errors import UsageError
from rowgate_lab import LAB

ABI_VERSION = 2
TASK_BYTES = 128
SHAPE_BYTES = 80
OPERANDS = 8
WAITS = 3
TILE_WORDS = 8
GRANULE = 16
NO_COUNTER = 0xFFFFFFFF
NO_BUFFER = 0xFFFF
HEADER = LAB / "kernels" / "persistent" / "task_abi.cuh"


class AbiError(UsageError):
    """Descriptor bytes that do not decode, or a task that cannot be encoded."""


class Opcode(IntEnum):
    NOP = 0
    EMBED = 1
    RMS_NORM = 2
    GEMV = 3
    ROPE = 4
    KV_APPEND = 5
    ATTN_SPLIT = 6
    ATTN_MERGE = 7
    SILU_MUL = 8
    RESIDUAL_ADD = 9
    LOGITS = 10
    PREFETCH_L2 = 11
    """Ask L2 for t0 bytes of operand a (read-only weights): no result, a hint that lets
    blocks idle during the attention phase pull a later stage's weights in."""


class Flag(IntFlag):
    NONE = 0
    APPEND_KV = 1
    """ROPE: also write the rotated row into the cache."""
    NORM_IN = 2
    """GEMV/LOGITS: stage x as bf16(rmsnorm(x) * w) (w: operand d)."""
    SILU_IN = 4
    """GEMV: stage x as bf16(bf16(silu(gate)) * up) (gate: operand b, up: operand d)."""
    MERGE_IN = 8
    """GEMV: stage x as the merged attention splits (partials: operand b)."""
    RESIDUAL_OUT = 16
    """GEMV: y = bf16(y + bf16(x . W)): the output is added into the residual stream."""
    ROPE_IN = 32
    """ATTN_SPLIT: q/k/v rows (operand a) get the head norm and RoPE in the task; the split
    holding the sequence's position appends that token's K and V to the caches first."""
    SILU_OUT = 64
    """GEMV: the tile's rows of two weights, gate (operand a) and up (operand e), and
    y = bf16(bf16(silu(bf16(x . Wg))) * bf16(x . Wu)): the gate|up GEMV and SILU_MUL in one
    task, so the SiLU is computed once an element, not once a down tile."""
    EVEN_SPLITS = 128
    """ATTN_SPLIT: the sequence's context spread over the step's max_splits splits,
    `even_chunk` tokens each, instead of the planned chunk (t3): a plan for the longest
    context leaves a short one in a few long splits (129 tokens in one of 4 at b8)."""


KNOWN_FLAGS = {
    # which flags each opcode accepts (anything else is refused by the validator)
    Opcode.ROPE: Flag.APPEND_KV,
    Opcode.GEMV: Flag.NORM_IN | Flag.SILU_IN | Flag.MERGE_IN | Flag.RESIDUAL_OUT |
    Flag.SILU_OUT,
    Opcode.LOGITS: Flag.NORM_IN,
    Opcode.ATTN_SPLIT: Flag.ROPE_IN | Flag.EVEN_SPLITS,
}
FUSED_BY = {Opcode.RMS_NORM: Flag.NORM_IN, Opcode.ROPE: Flag.ROPE_IN,
            Opcode.KV_APPEND: Flag.ROPE_IN, Opcode.ATTN_MERGE: Flag.MERGE_IN,
            Opcode.SILU_MUL: Flag.SILU_IN | Flag.SILU_OUT,
            Opcode.RESIDUAL_ADD: Flag.RESIDUAL_OUT}
"""The flags that do an op's work inside another task in a fused list (any one of them)."""


OPTIONAL = frozenset({Opcode.NOP, Opcode.PREFETCH_L2})
"""Opcodes a decode step may leave out: they compute nothing (every other op must run, as
a task or as a flag of one: the abi gate's coverage)."""


def covered(tasks: "list[Task]") -> set[Opcode]:
    """The ops a list runs: its opcodes, and each op a flag of its tasks fuses in."""
    ops = {Opcode(t.opcode) for t in tasks if t.opcode in Opcode._value2member_map_}
    flags = Flag(0)
    for t in tasks:
        flags |= Flag(t.flags & int(sum(Flag)))
    return ops | {op for op, flag in FUSED_BY.items() if flags & flag}


STAGE_BYTES = 96 * 1024
"""The kernel's shared staging buffer for a GEMV's input (kStageBytes): a GEMV with an
input flag stages batch x K bf16 there, so it must fit."""
SCRATCH_BYTES = 16 * 1024
"""The kernel's shared scratch (kScratchBytes): the merges keep each (sequence, head)'s
split weights and maximum there -- MERGE_IN batch x heads x (max_splits + 1) floats,
ATTN_MERGE group x (splits + 1) (`merge_floats`)."""


MIN_EVEN_CHUNK = 16
"""kMinEvenChunk: an EVEN_SPLITS split takes at least this many tokens (two a warp)."""


def even_chunk(length: int, max_splits: int, chunk: int) -> int:
    """task::even_chunk: ceil(length / max_splits) tokens, at least MIN_EVEN_CHUNK, at most
    the planned chunk."""
    return min(chunk, max(MIN_EVEN_CHUNK, -(-length // max_splits)))


def split_chunk(t: "Task", max_splits: int, length: int) -> int:
    """The tokens of an ATTN_SPLIT task's chunk for a context of `length` (its split s
    covers [s * chunk, (s + 1) * chunk))."""
    if t.flags & Flag.EVEN_SPLITS:
        return even_chunk(length, max_splits, t.tile[3])
    return t.tile[3]


def merge_floats(rows: int, splits: int) -> int:
    """Scratch floats a merge of `rows` (sequence, head) rows over `splits` splits keeps:
    each split's weight and each row's maximum (`split_weights` in
    kernels/persistent/attention_split.cuh)."""
    return rows * (splits + 1)
INPUT_FLAGS = Flag.NORM_IN | Flag.SILU_IN | Flag.MERGE_IN
"""At most one of these per GEMV: each says where its staged input comes from."""


class Schedule(IntEnum):
    STATIC_ROUND_ROBIN = 0
    DYNAMIC_QUEUE = 1

    @classmethod
    def from_row(cls, name: str) -> "Schedule":
        """Row spelling (`static-round-robin`) -> member."""
        return cls[name.upper().replace("-", "_")]


TASK_DTYPE = np.dtype({
    "names": ["opcode", "flags", "signal", "wait_counter", "wait_value", "buffer", "offset",
              "tile", "reserved"],
    "formats": ["<u2", "<u2", "<u4", ("<u4", WAITS), ("<u4", WAITS), ("<u2", OPERANDS),
                ("<u4", OPERANDS), ("<u4", TILE_WORDS), ("<u4", 4)],
    "offsets": [0, 2, 4, 8, 20, 32, 48, 80, 112],
    "itemsize": TASK_BYTES,
})

SHAPE_FIELDS = ("abi_version", "batch", "hidden", "num_heads", "num_kv_heads", "head_dim",
                "intermediate", "vocab", "page_size", "table_width", "max_splits", "rms_eps",
                "softmax_scale", "meta_buffer", "reserved0", "ids_at", "positions_at",
                "slots_at", "context_lens_at", "block_tables_at", "reserved1")
SHAPE_DTYPE = np.dtype({
    "names": list(SHAPE_FIELDS),
    "formats": ["<u4"] * 11 + ["<f4", "<f4", "<u2", "<u2"] + ["<u4"] * 6,
    "offsets": [0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 54, 56, 60, 64, 68, 72,
                76],
    "itemsize": SHAPE_BYTES,
})


@dataclass(frozen=True)
class Operand:
    buffer: int
    offset: int
    """In 16-byte granules from the buffer's base."""


UNUSED = Operand(NO_BUFFER, 0)


@dataclass(frozen=True)
class Task:
    opcode: int
    tile: tuple[int, ...] = (0,) * TILE_WORDS
    """Up to TILE_WORDS words; shorter tuples are padded with zeros."""
    operands: tuple[Operand, ...] = ()
    waits: tuple[tuple[int, int], ...] = ()
    """(counter, value) pairs: proceed once counter >= value; at most WAITS."""
    signal: int = NO_COUNTER
    flags: int = 0
    label: str = ""
    """Host-side only (not packed): what the builder meant, for reports."""

    def __post_init__(self) -> None:
        tile = tuple(self.tile)
        if len(tile) < TILE_WORDS:
            object.__setattr__(self, "tile", tile + (0,) * (TILE_WORDS - len(tile)))

    def operand(self, i: int) -> Operand:
        return self.operands[i] if i < len(self.operands) else UNUSED


@dataclass(frozen=True)
class StepShape:
    batch: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    page_size: int
    table_width: int
    max_splits: int
    rms_eps: float
    softmax_scale: float
    meta_buffer: int
    ids_at: int
    positions_at: int
    slots_at: int
    context_lens_at: int
    block_tables_at: int
    abi_version: int = ABI_VERSION
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def meta_elements(self) -> int:
        return self.block_tables_at + self.batch * self.table_width


def pack(tasks: list[Task]) -> bytes:
    """Descriptors as the kernel reads them (little-endian, 64 bytes each)."""
    arr = np.zeros(len(tasks), dtype=TASK_DTYPE)
    for i, t in enumerate(tasks):
        if len(t.waits) > WAITS or len(t.operands) > OPERANDS or len(t.tile) > TILE_WORDS:
            raise AbiError(f"task {i}: {len(t.waits)} waits / {len(t.operands)} operands / "
                           f"{len(t.tile)} tile words; the ABI holds at most {WAITS} waits, "
                           f"{OPERANDS} operands and {TILE_WORDS} tile words")
        waits = list(t.waits) + [(NO_COUNTER, 0)] * (WAITS - len(t.waits))
        ops = [t.operand(k) for k in range(OPERANDS)]
        try:
            arr[i] = (t.opcode, t.flags, t.signal, [w[0] for w in waits], [w[1] for w in waits],
                      [o.buffer for o in ops], [o.offset for o in ops], list(t.tile), [0] * 4)
        except (OverflowError, ValueError) as exc:
            raise AbiError(f"task {i} ({t.label or t.opcode}): a field does not fit its "
                           f"ABI width: {exc}") from exc
    return arr.tobytes()


def unpack(data: bytes) -> list[Task]:
    """Inverse of `pack` (labels are not stored)."""
    if len(data) % TASK_BYTES:
        raise AbiError(f"task list: {len(data)} bytes is not a multiple of {TASK_BYTES}")
    out = []
    for i, rec in enumerate(np.frombuffer(data, dtype=TASK_DTYPE)):
        if rec["reserved"].any():
            raise AbiError(f"task {i}: reserved descriptor words are not zero")
        waits = tuple((int(c), int(v)) for c, v in zip(rec["wait_counter"], rec["wait_value"])
                      if c != NO_COUNTER)
        ops = [Operand(int(b), int(o)) for b, o in zip(rec["buffer"], rec["offset"])]
        while ops and ops[-1] == UNUSED:
            ops.pop()
        out.append(Task(opcode=int(rec["opcode"]), tile=tuple(int(x) for x in rec["tile"]),
                        operands=tuple(ops), waits=waits, signal=int(rec["signal"]),
                        flags=int(rec["flags"])))
    return out


def pack_shape(shape: StepShape) -> bytes:
    arr = np.zeros(1, dtype=SHAPE_DTYPE)
    for name in SHAPE_FIELDS:
        if not name.startswith("reserved"):
            arr[0][name] = getattr(shape, name)
    return arr.tobytes()


def unpack_shape(data: bytes) -> StepShape:
    if len(data) != SHAPE_BYTES:
        raise AbiError(f"step shape: {len(data)} bytes, expected {SHAPE_BYTES}")
    rec = np.frombuffer(data, dtype=SHAPE_DTYPE)[0]
    kw = {n: rec[n].item() for n in SHAPE_FIELDS if not n.startswith("reserved")}
    return StepShape(**kw)


def to_json(t: Task) -> dict[str, Any]:
    """One task as the gate's artifact records it."""
    return {"op": Opcode(t.opcode).name if t.opcode in Opcode._value2member_map_ else t.opcode,
            "label": t.label, "tile": list(t.tile), "flags": t.flags,
            "operands": [[o.buffer, o.offset] for o in t.operands],
            "waits": [list(w) for w in t.waits],
            "signal": None if t.signal == NO_COUNTER else t.signal}
