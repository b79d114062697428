"""Every argument of a `paged-decode-attention/1` launch, checked before it is made.

Tensors (type, rank, dtype, device, contiguity, shapes against each other), the
shape against what the operator declares, the scales, and the contents the kernel
trusts: every sequence length in 1..max_seq_len, max_seq_len within the block
table's capacity, and every page a sequence uses a valid physical page. A length
beyond the table would make a kernel read past its row of the block table (or stop
at the split count and silently attend to a prefix), so it is refused here, not in
the kernel. Each failure is a ValueError naming the argument, the expected and the
actual value. Device-agnostic: CPU tensors are checked the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch

from rowgate.ops.contract import ContractError, Operator

KV_TORCH_DTYPES = (torch.uint8, torch.float8_e5m2, torch.bfloat16)


@dataclass(frozen=True)
class Shape:
    batch: int
    hq: int
    hkv: int
    group: int
    dim: int
    page: int
    pages: int
    """Physical pages in the cache."""
    bt_stride: int
    kv: str

    @property
    def capacity(self) -> int:
        """Tokens the block table can address per sequence."""
        return self.bt_stride * self.page


def kv_dtype_of(cache: torch.Tensor) -> str:
    """`e5m2` for byte caches (uint8 or float8_e5m2), `bf16` for bfloat16."""
    if cache.dtype in (torch.uint8, torch.float8_e5m2):
        return "e5m2"
    if cache.dtype == torch.bfloat16:
        return "bf16"
    raise ValueError(f"k_cache: expected dtype uint8, float8_e5m2 or bfloat16, got {cache.dtype}")


def check_tensor(t: object, name: str, ndim: int, dtypes: tuple[torch.dtype, ...],
                 device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name}: expected dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: expected device {device} (as q), got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()}")
    return t


def check_shapes(q: object, k_cache: object, v_cache: object, block_table: object,
                 seq_lens: object) -> Shape:
    """Types, ranks, dtypes, devices, contiguity and the shapes against each other."""
    if not isinstance(q, torch.Tensor):
        raise ValueError(f"q: expected a torch.Tensor, got {type(q).__name__}")
    dev = q.device
    q = check_tensor(q, "q", 3, (torch.bfloat16,), dev)
    k_cache = check_tensor(k_cache, "k_cache", 4, KV_TORCH_DTYPES, dev)
    v_cache = check_tensor(v_cache, "v_cache", 4, (k_cache.dtype,), dev)
    block_table = check_tensor(block_table, "block_table", 2, (torch.int32,), dev)
    seq_lens = check_tensor(seq_lens, "seq_lens", 1, (torch.int32,), dev)
    batch, hq, dim = q.shape
    pages, hkv, page, kdim = k_cache.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"v_cache: expected shape {tuple(k_cache.shape)} (as k_cache), "
                         f"got {tuple(v_cache.shape)}")
    if kdim != dim:
        raise ValueError(f"k_cache: expected head dim {dim} (as q), got {kdim}")
    if hkv < 1 or hq % hkv:
        raise ValueError(f"q: expected a multiple of k_cache's {hkv} KV heads, got {hq} heads")
    if page < 1 or page & (page - 1):
        raise ValueError(f"k_cache: expected a page size that is a power of two, got {page}")
    if pages < 1:
        raise ValueError("k_cache: expected at least one page, got 0")
    if block_table.shape[0] != batch or seq_lens.shape[0] != batch:
        raise ValueError(f"block_table/seq_lens: expected {batch} rows (q's batch), got "
                         f"{block_table.shape[0]} and {seq_lens.shape[0]}")
    if batch < 1 or block_table.shape[1] < 1:
        raise ValueError(f"block_table: expected at least one row and column, got shape "
                         f"{tuple(block_table.shape)}")
    return Shape(batch, hq, hkv, hq // hkv, dim, page, pages, block_table.shape[1],
                 kv_dtype_of(k_cache))


def check_supported(op: Operator, shape: Shape) -> None:
    """The shape against what the operator declares; ContractError (a ValueError)."""
    why = op.unsupported(shape.kv, shape.dim, shape.group, shape.page)
    if why:
        raise ContractError(f"k_cache/q: {why}")


def check_scales(k_scale: float, v_scale: float, softmax_scale: float) -> None:
    for name, value in (("k_scale", k_scale), ("v_scale", v_scale),
                        ("softmax_scale", softmax_scale)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")


def check_contents(shape: Shape, block_table: torch.Tensor, seq_lens: torch.Tensor,
                   max_seq_len: int) -> None:
    """Lengths in 1..max_seq_len <= the table's capacity; every page a sequence uses
    in 0..pages-1. One device synchronisation (a few reductions read back at once)."""
    if not isinstance(max_seq_len, int) or not 1 <= max_seq_len <= shape.capacity:
        raise ValueError(f"max_seq_len: expected 1..{shape.capacity} (block_table columns "
                         f"{shape.bt_stride} x page size {shape.page}), got {max_seq_len}")
    lens = seq_lens.to(torch.int64)
    used = (lens.clamp(min=0) + shape.page - 1) // shape.page          # pages each row uses
    cols = torch.arange(shape.bt_stride, device=lens.device)
    in_use = cols.unsqueeze(0) < used.unsqueeze(1)
    bad_page = in_use & ((block_table < 0) | (block_table >= shape.pages))
    bad_len = (lens < 1) | (lens > max_seq_len)
    first_len = torch.argmax(bad_len.to(torch.int8))
    flat = torch.argmax(bad_page.reshape(-1).to(torch.int8))
    n_len, i_len, n_page, i_page = torch.stack([
        bad_len.sum(), first_len, bad_page.sum(), flat]).tolist()
    if n_len:
        got = int(seq_lens[int(i_len)])
        raise ValueError(f"seq_lens: expected every length in 1..{max_seq_len} (max_seq_len), "
                         f"got {got} at index {int(i_len)} ({int(n_len)} out of range)")
    if n_page:
        row, col = divmod(int(i_page), shape.bt_stride)
        got = int(block_table[row, col])
        raise ValueError(f"block_table: expected pages in 0..{shape.pages - 1} for the "
                         f"{int(used[row])} page(s) sequence {row} uses, got {got} at "
                         f"[{row}, {col}]")


def validate(op: Operator, q: object, k_cache: object, v_cache: object, block_table: object,
             seq_lens: object, *, max_seq_len: int, k_scale: float = 1.0, v_scale: float = 1.0,
             softmax_scale: float | None = None) -> Shape:
    """Every check above, in order; returns the call's shape."""
    shape = check_shapes(q, k_cache, v_cache, block_table, seq_lens)
    check_supported(op, shape)
    check_scales(k_scale, v_scale, shape.dim ** -0.5 if softmax_scale is None else softmax_scale)
    # check_shapes has established both are int32 tensors on q's device
    check_contents(shape, cast(torch.Tensor, block_table), cast(torch.Tensor, seq_lens),
                   max_seq_len)
    return shape


class Checked:
    """The contents a plan validated: a tensor is trusted again only if it is the
    same object, not modified in place since (torch's version counter). Holding
    the reference keeps its memory from being reused by another tensor.

    A tensor made under `torch.inference_mode()` keeps no version counter, so an
    in-place change cannot be seen: outside CUDA-graph capture it is never trusted
    again (its contents are validated on every call); during capture, where nothing can
    be read, it is trusted as the same object. That is no weaker than the counter
    there: a captured graph replays on whatever its static buffers hold at replay time,
    which no check at capture time covers (the engine that fills them does)."""

    def __init__(self, *tensors: torch.Tensor):
        self.tensors = tensors
        self.versions = tuple(None if t.is_inference() else t._version for t in tensors)

    def same(self, *tensors: torch.Tensor) -> bool:
        if len(tensors) != len(self.tensors):
            return False
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        return all(a is b and (capturing if v is None else a._version == v)
                   for a, b, v in zip(tensors, self.tensors, self.versions))


__all__ = ["Checked", "Shape", "check_contents", "check_scales", "check_shapes",
           "check_supported", "check_tensor", "kv_dtype_of", "validate"]
