"""Paged split-KV decode attention: validate, allocate, launch the cubin.

The device code is `kernels/decode_attention/split_kv.cu`; its cubin for the
device's arch is loaded once per (path, kernel) with cuda.core and launched on
torch's current stream (`pipeline.ops.launch`).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

from pipeline import CHECKOUT
from pipeline.ops import launch
from pipeline.ops.launch import kernel
from pipeline.ops.reference import E5M2, kv_dtype_of

REPO = CHECKOUT
SOURCE = REPO / "kernels" / "decode_attention" / "split_kv.cu"
INCLUDE = REPO / "kernels" / "include"
VARIANTS = {"baseline": "base", "pipelined": "pipe", "bulk": "bulk"}
"""Variant names as rows spell them (`e5m2_baseline`, `e5m2_pipelined`) -> kernel suffix.
`bulk` (sm_90+) runs `_bulkc` (a cluster of 8 splits) when a plan has at most 8 splits."""
WARPS = 8
BULK_THREADS = WARPS * 32 + 32   # the bulk candidate's 8 math warps and producer warp
CLUSTER_SPLITS = 8
SLOT_TOKENS = 64
BARRIER_BYTES = 256
TILE = 16
MAX_CHUNK = 512
STAGES = 2                       # the kernel's kStages (3 measured slower: docs/perf.md)
SMEM_LIMIT = 48 * 1024 - 256     # dynamic shared memory per CTA, static aside
OPT_IN = 48 * 1024               # above this a kernel must raise its dynamic limit
LOG2E = 1.4426950408889634


def cubin_path(arch: str, build_dir: Path | None = None) -> Path:
    """Where benchmarks/decode_attention.py puts its own builds (phase variants beside)."""
    return (build_dir or REPO / "build") / "ops" / arch / "split_kv.cubin"


def build_cubin(repo: Path, arch: str, nvcc: str | None = None) -> Path:
    """split_kv's cubin for `arch`, built (or found in the cache) exactly as the build
    gate builds it. Raises KernelsError, ToolchainError or BuildFailed."""
    from pipeline.build import cudabuild

    return cudabuild.cubin(repo, "split_kv", arch, nvcc)


def variant_suffix(variant: str) -> str:
    """`e5m2_pipelined` / `pipelined` -> `pipe`; ValueError for anything else."""
    name = variant.rsplit("_", 1)[-1]
    if name not in VARIANTS:
        raise ValueError(f"variant: expected one of {sorted(VARIANTS)} (optionally prefixed by "
                         f"the KV dtype, e.g. 'e5m2_pipelined'), got {variant!r}")
    return VARIANTS[name]


def kernel_name(kv: str, dim: int, group: int, variant: str) -> str:
    return f"split_kv_{kv}_d{dim}_g{group}_{variant_suffix(variant)}"


@cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@dataclass(frozen=True)
class Plan:
    """How a call splits the KV: `chunk` tokens per CTA, `splits` CTAs per sequence."""

    chunk: int
    splits: int
    smem_bytes: int
    """The baseline's dynamic shared memory (the candidate adds its ring)."""


def ring_bytes(kv: str, dim: int) -> int:
    """Shared memory of the E5M2 candidate's cp.async ring (kernel: `Ring`)."""
    return WARPS * STAGES * 4 * 32 * (dim // 8) if kv == E5M2 else 0


def bulk_rings(kv: str, dim: int, group: int) -> tuple[int, int, int, int]:
    """(slot bytes, K slots, V slots, CTAs per SM) of the bulk candidate: the
    kernel's `BulkCfg`, which these lines mirror (three CTAs in 72 KB where four
    slots fit beside MAX_CHUNK tokens of scores and 72 registers hold the math; both
    rings even, so one warp set consumes every use of a ring slot)."""
    slot = SLOT_TOKENS * dim * (1 if kv == E5M2 else 2)
    scores = MAX_CHUNK * group * 4
    regs3 = not (dim == 128 and (kv != E5M2 or group == 8))
    three = regs3 and (72 * 1024 - scores) // slot >= 4
    slots = ((72 if three else 110) * 1024 - scores) // slot // 2 * 2  # even rings
    nk = min(8, (slots + 2) // 4 * 2)
    return slot, nk, min(8, slots - nk), 3 if three else 2


def smem_bytes(chunk: int, group: int, dim: int, kv: str, variant: str) -> int:
    """Dynamic shared memory: scores (+ the candidate's ring), or the cross-warp
    reduction that reuses the same space, whichever is larger; for the bulk
    candidate its mbarriers, K and V rings (the reduction reuses the K ring) and
    the scores."""
    suffix = variant_suffix(variant)
    if suffix == "bulk":
        slot, nk, nv, _ = bulk_rings(kv, dim, group)
        return BARRIER_BYTES + (nk + nv) * slot + chunk * group * 4
    ring = ring_bytes(kv, dim) if suffix == "pipe" else 0
    return max(chunk * group * 4 + ring, WARPS * group * dim * 4)


def plan(batch: int, kv_heads: int, group: int, dim: int, page: int, max_seq_len: int,
         sm_count: int, kv: str = E5M2) -> Plan:
    """Enough CTAs for two per SM, chunks a multiple of 64 tokens and of the page.

    The chunk fixes the merge order, so it never depends on the variant: it is
    capped so that every variant's shared memory fits SMEM_LIMIT."""
    unit = max(64, page)
    floor = max(unit, min(WARPS * TILE, math.ceil(max_seq_len / unit) * unit))
    per_cta = math.ceil(max_seq_len * batch * kv_heads / (2 * sm_count))
    chunk = min(max(floor, math.ceil(per_cta / unit) * unit), max(MAX_CHUNK, unit))
    while chunk > unit and chunk * group * 4 + ring_bytes(kv, dim) > SMEM_LIMIT:
        chunk -= unit
    return Plan(chunk, math.ceil(max_seq_len / chunk),
                smem_bytes(chunk, group, dim, kv, "baseline"))


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
    groups = (4, 8) if k_cache.dtype != torch.bfloat16 else (2, 4, 8)
    if hq % hkv or hq // hkv not in groups:
        raise ValueError(f"q: expected query heads {' or '.join(map(str, groups))} times "
                         f"k_cache's {hkv} KV heads ({k_cache.dtype}), got {hq}")
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


class _Launcher:
    """Launches one kernel with a fixed configuration as cheaply as Python can:
    cuLaunchKernel (cuda.bindings) with a pre-built argument array whose slots
    are overwritten per call; cuda.core's `launch` when the driver binding is
    not usable."""

    TYPES = (ctypes.c_void_p,) * 9 + (ctypes.c_int32,) * 4 + (ctypes.c_float,) * 2

    def __init__(self, fn, grid: tuple[int, int, int], block: int, smem: int):
        self.fn, self.grid, self.block, self.smem = fn, grid, block, smem
        self.slots = [t() for t in self.TYPES]
        self.array = (ctypes.c_void_p * len(self.slots))(
            *[ctypes.addressof(v) for v in self.slots])
        self.raw = None
        try:
            from cuda.bindings import driver

            self.driver = driver
            self.raw = self._function(driver, fn)
        except (ImportError, AttributeError, TypeError, ValueError):
            if smem > OPT_IN:
                raise
            cc = launch.cuda_core()
            self.config = cc.LaunchConfig(grid=grid, block=block, shmem_size=smem)
        if self.raw is not None and smem > OPT_IN:
            (err,) = driver.cuFuncSetAttribute(
                self.raw, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem)
            if err != driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuFuncSetAttribute(max dynamic smem {smem}) failed: {err!r}")

    @staticmethod
    def _function(driver, fn):
        """The context's CUfunction of a cuda.core kernel (a CUkernel of a library
        in cuda.core >= 0.3; older releases hand out a CUfunction already)."""
        err, func = driver.cuKernelGetFunction(driver.CUkernel(int(fn.handle)))
        if err == driver.CUresult.CUDA_SUCCESS:
            return func
        return driver.CUfunction(int(fn.handle))

    def set_scalars(self, scalars: tuple) -> None:
        """The trailing scalar arguments, fixed for the plan's lifetime."""
        self.scalars = scalars
        for slot, value in zip(self.slots[9:], scalars):
            slot.value = value

    def __call__(self, stream: int, pointers: tuple) -> None:
        if self.raw is not None:
            for slot, value in zip(self.slots, pointers):
                slot.value = value
            (err,) = self.driver.cuLaunchKernel(
                self.raw, *self.grid, self.block, 1, 1, self.smem, stream,
                ctypes.addressof(self.array), 0)
            if err != self.driver.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuLaunchKernel failed: {err!r}")
            return
        cc = launch.cuda_core()
        cc.launch(launch.stream(stream), self.config, self.fn, *pointers,
                  *[np.int32(a) for a in self.scalars[:4]],
                  *[np.float32(a) for a in self.scalars[4:]])


class DecodeAttention:
    """A planned decode-attention launch: validates once, then `run` launches
    with only the checks that keep it memory-safe (shapes and dtypes as planned).

    q [B, Hq, D] bf16; k_cache/v_cache [pages, Hkv, page, D] bf16 or E5M2 bytes
    (uint8 / float8_e5m2) with per-tensor scales; block_table [B, n] int32;
    seq_lens [B] int32, each in 1..max_seq_len.
    """

    def __init__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_table: torch.Tensor, seq_lens: torch.Tensor, *, max_seq_len: int,
                 cubin: Path, k_scale: float = 1.0, v_scale: float = 1.0,
                 softmax_scale: float | None = None, variant: str = "baseline",
                 chunk: int | None = None):
        group, page = validate(q, k_cache, v_cache, block_table, seq_lens, max_seq_len)
        batch, hq, dim = q.shape
        hkv = k_cache.shape[1]
        self.device = q.device
        index = q.device.index if q.device.index is not None else torch.cuda.current_device()
        self.index = index
        kv = kv_dtype_of(k_cache)
        p = plan(batch, hkv, group, dim, page, max_seq_len, _sm_count(index), kv)
        if chunk is not None:
            fits = chunk * group * 4 + ring_bytes(kv, dim) <= SMEM_LIMIT
            if chunk % max(64, page) or not 0 < chunk <= MAX_CHUNK or not fits:
                raise ValueError(f"chunk: expected a multiple of {max(64, page)} up to "
                                 f"{MAX_CHUNK} whose scores fit in shared memory, got {chunk}")
            p = Plan(chunk, math.ceil(max_seq_len / chunk), 0)
        self.plan = p
        self.shapes = (q.shape, k_cache.shape, block_table.shape, seq_lens.shape)
        self.dtypes = (q.dtype, k_cache.dtype, v_cache.dtype, block_table.dtype, seq_lens.dtype)
        # the workspace belongs to the plan: launches of one plan are stream-ordered
        self.ws_acc = torch.empty(batch * hkv * p.splits * group * dim, dtype=torch.float32,
                                  device=q.device)
        self.ws_ml = torch.empty(batch * hkv * p.splits * 2 * group, dtype=torch.float32,
                                 device=q.device)
        self.counters = torch.zeros(batch * hkv, dtype=torch.int32, device=q.device)
        scale = softmax_scale if softmax_scale is not None else dim ** -0.5
        scalars = (block_table.shape[1], hkv, page.bit_length() - 1, p.chunk,
                   scale * k_scale * LOG2E, v_scale)
        name, grid_x, threads = kernel_name(kv, dim, group, variant), p.splits, WARPS * 32
        if variant_suffix(variant) == "bulk":
            threads = BULK_THREADS
            if p.splits <= CLUSTER_SPLITS:  # one cluster per (sequence, head)
                name, grid_x = name + "c", CLUSTER_SPLITS
        self.kernel = name
        self.launcher = _Launcher(kernel(str(cubin), name), (grid_x, hkv, batch), threads,
                                  smem_bytes(p.chunk, group, dim, kv, variant))
        self.launcher.set_scalars(scalars)

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            block_table: torch.Tensor, seq_lens: torch.Tensor,
            out: torch.Tensor | None = None) -> torch.Tensor:
        if (q.shape, k_cache.shape, block_table.shape, seq_lens.shape) != self.shapes or (
                q.dtype, k_cache.dtype, v_cache.dtype, block_table.dtype,
                seq_lens.dtype) != self.dtypes or v_cache.shape != k_cache.shape:
            raise ValueError(f"inputs: expected shapes {self.shapes} and dtypes {self.dtypes} "
                             f"as planned, got {(q.shape, k_cache.shape, block_table.shape)} "
                             f"and {(q.dtype, k_cache.dtype, v_cache.dtype)}")
        if out is None:
            out = torch.empty_like(q)
        elif out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous():
            raise ValueError(f"out: expected a contiguous {q.dtype} tensor of shape "
                             f"{tuple(q.shape)}, got {out.dtype} {tuple(out.shape)}")
        self.launcher(launch.current_stream(self.index), (
            q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_table.data_ptr(),
            seq_lens.data_ptr(), out.data_ptr(), self.ws_acc.data_ptr(), self.ws_ml.data_ptr(),
            self.counters.data_ptr()))
        return out


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_table: torch.Tensor, seq_lens: torch.Tensor, *, max_seq_len: int,
                     cubin: Path, k_scale: float = 1.0, v_scale: float = 1.0,
                     softmax_scale: float | None = None, variant: str = "baseline",
                     out: torch.Tensor | None = None, chunk: int | None = None) -> torch.Tensor:
    """Decode attention of one query token per sequence over a paged KV cache
    (see `DecodeAttention`); validates every argument on every call. Returns
    [B, Hq, D] bf16."""
    if out is not None:
        _check(out, "out", 3, (torch.bfloat16,), q.device)
    return DecodeAttention(q, k_cache, v_cache, block_table, seq_lens, max_seq_len=max_seq_len,
                           cubin=cubin, k_scale=k_scale, v_scale=v_scale,
                           softmax_scale=softmax_scale, variant=variant, chunk=chunk).run(
        q, k_cache, v_cache, block_table, seq_lens, out)


__all__ = ["DecodeAttention", "E5M2", "Plan", "build_cubin", "cubin_path", "decode_attention", "kernel",
           "kernel_name", "plan", "validate", "variant_suffix"]
