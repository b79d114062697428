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

import numpy as np

from pipeline import CHECKOUT
from pipeline.errors import UsageError

ABI_VERSION = 1
TASK_BYTES = 64
SHAPE_BYTES = 80
GRANULE = 16
NO_COUNTER = 0xFFFFFFFF
NO_BUFFER = 0xFFFF
HEADER = CHECKOUT / "kernels" / "persistent" / "task_abi.cuh"


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


class Flag(IntFlag):
    NONE = 0
    APPEND_KV = 1


class Schedule(IntEnum):
    STATIC_ROUND_ROBIN = 0
    DYNAMIC_QUEUE = 1

    @classmethod
    def from_row(cls, name: str) -> "Schedule":
        """Row spelling (`static-round-robin`) -> member."""
        return cls[name.upper().replace("-", "_")]


TASK_DTYPE = np.dtype({
    "names": ["opcode", "flags", "signal", "wait_counter", "wait_value", "buffer", "offset",
              "tile"],
    "formats": ["<u2", "<u2", "<u4", ("<u4", 2), ("<u4", 2), ("<u2", 4), ("<u4", 4), ("<u4", 4)],
    "offsets": [0, 2, 4, 8, 16, 24, 32, 48],
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
    tile: tuple[int, int, int, int] = (0, 0, 0, 0)
    operands: tuple[Operand, ...] = ()
    waits: tuple[tuple[int, int], ...] = ()
    """(counter, value) pairs: proceed once counter >= value; at most two."""
    signal: int = NO_COUNTER
    flags: int = 0
    label: str = ""
    """Host-side only (not packed): what the builder meant, for reports."""

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
    extra: dict = field(default_factory=dict, compare=False)

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
        if len(t.waits) > 2 or len(t.operands) > 4:
            raise AbiError(f"task {i}: {len(t.waits)} waits / {len(t.operands)} operands; the "
                           f"ABI holds at most 2 waits and 4 operands")
        waits = list(t.waits) + [(NO_COUNTER, 0)] * (2 - len(t.waits))
        ops = [t.operand(k) for k in range(4)]
        try:
            arr[i] = (t.opcode, t.flags, t.signal, [w[0] for w in waits], [w[1] for w in waits],
                      [o.buffer for o in ops], [o.offset for o in ops], list(t.tile))
        except (OverflowError, ValueError) as exc:
            raise AbiError(f"task {i} ({t.label or t.opcode}): a field does not fit its "
                           f"ABI width: {exc}") from exc
    return arr.tobytes()


def unpack(data: bytes) -> list[Task]:
    """Inverse of `pack` (labels are not stored)."""
    if len(data) % TASK_BYTES:
        raise AbiError(f"task list: {len(data)} bytes is not a multiple of {TASK_BYTES}")
    out = []
    for rec in np.frombuffer(data, dtype=TASK_DTYPE):
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


def to_json(t: Task) -> dict:
    """One task as the gate's artifact records it."""
    return {"op": Opcode(t.opcode).name if t.opcode in Opcode._value2member_map_ else t.opcode,
            "label": t.label, "tile": list(t.tile), "flags": t.flags,
            "operands": [[o.buffer, o.offset] for o in t.operands],
            "waits": [list(w) for w in t.waits],
            "signal": None if t.signal == NO_COUNTER else t.signal}
