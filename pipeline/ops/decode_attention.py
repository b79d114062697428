"""Paged split-KV decode attention: validate, allocate, launch the cubin.

The device code is `kernels/decode_attention/split_kv.cu`; its cubin for the
device's arch is loaded once per (path, kernel) with cuda.core and launched on
torch's current stream. cuda.core moved from `cuda.core.experimental` to
`cuda.core`; both import paths are accepted (the H200 image pins the version
recorded in docs/kernels.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

from pipeline.ops.reference import E5M2, kv_dtype_of

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "kernels" / "decode_attention" / "split_kv.cu"
VARIANTS = {"baseline": "base", "pipelined": "pipe"}
"""Variant names as rows spell them (`e5m2_baseline`, `e5m2_pipelined`) -> kernel suffix."""
WARPS = 8
TILE = 16
MAX_CHUNK = 512
LOG2E = 1.4426950408889634


def cubin_path(arch: str, build_dir: Path | None = None) -> Path:
    """Where the build puts split_kv's cubin for `arch` (`sm_90`)."""
    return (build_dir or REPO / "build") / "kernels" / arch / "decode_attention" / "split_kv.cubin"


def variant_suffix(variant: str) -> str:
    """`e5m2_pipelined` / `pipelined` -> `pipe`; ValueError for anything else."""
    name = variant.rsplit("_", 1)[-1]
    if name not in VARIANTS:
        raise ValueError(f"variant: expected one of {sorted(VARIANTS)} (optionally prefixed by "
                         f"the KV dtype, e.g. 'e5m2_pipelined'), got {variant!r}")
    return VARIANTS[name]


def kernel_name(kv: str, dim: int, group: int, variant: str) -> str:
    return f"split_kv_{kv}_d{dim}_g{group}_{variant_suffix(variant)}"


def _cuda_core():
    try:
        import cuda.core as cc
        cc.launch  # noqa: B018 - older releases expose the API only under .experimental
    except (ImportError, AttributeError):
        import cuda.core.experimental as cc
    return cc


@cache
def _module(path: str):
    cc = _cuda_core()
    cc.Device().set_current()
    data = Path(path).read_bytes()
    if hasattr(cc.ObjectCode, "from_cubin"):
        return cc.ObjectCode.from_cubin(data)
    return cc.ObjectCode(data, "cubin")


@cache
def kernel(path: str, name: str):
    """The named kernel of a cubin, loaded once."""
    return _module(path).get_kernel(name)


class _TorchStream:
    """Hands torch's stream to cuda.core through the `__cuda_stream__` protocol."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


@cache
def _stream(handle: int):
    dev = _cuda_core().Device()
    if handle == 0:  # torch's legacy default stream
        return dev.default_stream
    return dev.create_stream(_TorchStream(handle))


@cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@dataclass(frozen=True)
class Plan:
    """How a call splits the KV: `chunk` tokens per CTA, `splits` CTAs per sequence."""

    chunk: int
    splits: int
    smem_bytes: int


def plan(batch: int, kv_heads: int, group: int, dim: int, page: int, max_seq_len: int,
         sm_count: int) -> Plan:
    """Enough CTAs for two per SM, chunks a multiple of 64 tokens and of the page."""
    unit = max(64, page)
    per_cta = math.ceil(max_seq_len * batch * kv_heads / (2 * sm_count))
    chunk = min(max(unit, math.ceil(per_cta / unit) * unit), max(MAX_CHUNK, unit))
    splits = math.ceil(max_seq_len / chunk)
    smem = max(chunk * group * 4, WARPS * group * dim * 4)
    return Plan(chunk, splits, smem)


class _Workspace:
    """Per (device, stream) scratch: partial outputs and the split counters.

    The counters are zero between launches (the merging CTA resets them), so
    they are allocated zeroed once and reused; launches on one stream are
    ordered, so one workspace per stream is never shared by two in flight.
    """

    def __init__(self) -> None:
        self.acc = torch.empty(0)
        self.ml = torch.empty(0)
        self.counters = torch.empty(0)

    def ensure(self, device: torch.device, n_acc: int, n_ml: int, n_counters: int) -> None:
        if self.acc.numel() < n_acc or self.acc.device != device:
            self.acc = torch.empty(n_acc, dtype=torch.float32, device=device)
        if self.ml.numel() < n_ml or self.ml.device != device:
            self.ml = torch.empty(n_ml, dtype=torch.float32, device=device)
        if self.counters.numel() < n_counters or self.counters.device != device:
            self.counters = torch.zeros(n_counters, dtype=torch.int32, device=device)


@cache
def _workspace(device_index: int, stream: int) -> _Workspace:
    return _Workspace()


def _check(t: torch.Tensor, name: str, ndim: int, dtypes: tuple[torch.dtype, ...],
           device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name}: expected dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()}")


def validate(q, k_cache, v_cache, block_table, seq_lens, max_seq_len: int) -> tuple[int, int]:
    """Raise ValueError naming the argument, the expected and the actual value.
    Returns (group size, page size)."""
    if not isinstance(q, torch.Tensor) or q.device.type != "cuda":
        raise ValueError(f"q: expected a CUDA tensor, got "
                         f"{q.device if isinstance(q, torch.Tensor) else type(q).__name__}")
    dev = q.device
    _check(q, "q", 3, (torch.bfloat16,), dev)
    _check(k_cache, "k_cache", 4, (torch.uint8, torch.float8_e5m2, torch.bfloat16), dev)
    _check(v_cache, "v_cache", 4, (k_cache.dtype,), dev)
    _check(block_table, "block_table", 2, (torch.int32,), dev)
    _check(seq_lens, "seq_lens", 1, (torch.int32,), dev)
    batch, hq, dim = q.shape
    pages, hkv, page, kdim = k_cache.shape
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"v_cache: expected shape {tuple(k_cache.shape)} (as k_cache), "
                         f"got {tuple(v_cache.shape)}")
    if kdim != dim or dim not in (64, 128):
        raise ValueError(f"q/k_cache: expected head dim 64 or 128 on both, got {dim} and {kdim}")
    if hq % hkv or hq // hkv not in (4, 8):
        raise ValueError(f"q: expected query heads 4 or 8 times k_cache's {hkv} KV heads, got {hq}")
    if page < TILE or page & (page - 1):
        raise ValueError(f"k_cache: expected a page size that is a power of two >= {TILE}, "
                         f"got {page}")
    if block_table.shape[0] != batch or seq_lens.shape[0] != batch:
        raise ValueError(f"block_table/seq_lens: expected {batch} rows (q's batch), got "
                         f"{block_table.shape[0]} and {seq_lens.shape[0]}")
    if max_seq_len < 1 or block_table.shape[1] * page < max_seq_len:
        raise ValueError(f"max_seq_len: expected 1..{block_table.shape[1] * page} (block_table "
                         f"columns x page size), got {max_seq_len}")
    return hq // hkv, page


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_table: torch.Tensor, seq_lens: torch.Tensor, *, max_seq_len: int,
                     cubin: Path, k_scale: float = 1.0, v_scale: float = 1.0,
                     softmax_scale: float | None = None, variant: str = "baseline",
                     out: torch.Tensor | None = None, chunk: int | None = None) -> torch.Tensor:
    """Decode attention of one query token per sequence over a paged KV cache.

    q [B, Hq, D] bf16; k_cache/v_cache [pages, Hkv, page, D] bf16 or E5M2 bytes
    (uint8 / float8_e5m2) with per-tensor scales; block_table [B, n] int32;
    seq_lens [B] int32, each in 1..max_seq_len. Returns [B, Hq, D] bf16.
    """
    group, page = validate(q, k_cache, v_cache, block_table, seq_lens, max_seq_len)
    batch, hq, dim = q.shape
    hkv = k_cache.shape[1]
    if out is None:
        out = torch.empty_like(q)
    else:
        _check(out, "out", 3, (torch.bfloat16,), q.device)
        if out.shape != q.shape:
            raise ValueError(f"out: expected shape {tuple(q.shape)}, got {tuple(out.shape)}")
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    p = plan(batch, hkv, group, dim, page, max_seq_len, _sm_count(index))
    if chunk is not None:
        if chunk % max(64, page) or not 0 < chunk <= MAX_CHUNK:
            raise ValueError(f"chunk: expected a multiple of {max(64, page)} up to {MAX_CHUNK}, "
                             f"got {chunk}")
        p = Plan(chunk, math.ceil(max_seq_len / chunk),
                 max(chunk * group * 4, WARPS * group * dim * 4))
    handle = torch.cuda.current_stream(q.device).cuda_stream
    ws = _workspace(index, handle)
    ws.ensure(q.device, batch * hkv * p.splits * group * dim, batch * hkv * p.splits * 2 * group,
              batch * hkv)
    scale = softmax_scale if softmax_scale is not None else dim ** -0.5
    cc = _cuda_core()
    kv = kv_dtype_of(k_cache)
    fn = kernel(str(cubin), kernel_name(kv, dim, group, variant))
    config = cc.LaunchConfig(grid=(p.splits, hkv, batch), block=WARPS * 32,
                             shmem_size=p.smem_bytes)
    cc.launch(_stream(handle), config, fn,
              q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_table.data_ptr(),
              seq_lens.data_ptr(), out.data_ptr(), ws.acc.data_ptr(), ws.ml.data_ptr(),
              ws.counters.data_ptr(), np.int32(block_table.shape[1]), np.int32(hkv),
              np.int32(page.bit_length() - 1), np.int32(p.chunk),
              np.float32(scale * k_scale * LOG2E), np.float32(v_scale))
    return out


__all__ = ["E5M2", "Plan", "cubin_path", "decode_attention", "kernel", "kernel_name", "plan",
           "validate", "variant_suffix"]
