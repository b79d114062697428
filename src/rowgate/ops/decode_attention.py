"""Launch a `paged-decode-attention/1` kernel: validate, plan, allocate, launch.

Any subject's operator (src/rowgate/ops/contract.py, docs/contracts.md) goes through
here: the entry point of a role comes from the operator's declaration, the grid,
block, cluster and dynamic shared memory from the contract's plan and launch rules,
and every argument is checked before the first launch (src/rowgate/ops/launch_args.py).
A cubin is loaded once per path with cuda.core and launched on torch's current
stream with cuLaunchKernel (cuda.core's `launch` when cuda-bindings is absent; both
through `rowgate.ops.launch`).
"""

from __future__ import annotations

import ctypes
from collections import deque
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rowgate.ops import contract, launch
from rowgate.ops import launch_args as args_check
from rowgate.ops.contract import DEFAULT_SMEM_LIMIT, Operator, Plan
from rowgate.ops.launch import kernel

LEGACY_VARIANTS = {"baseline": "baseline", "pipelined": "candidate", "candidate": "candidate",
                   "bulk": "candidate", "deep": "candidate"}
"""Role names as rows and benchmarks spell them (`e5m2_pipelined`, `baseline`) -> role."""
ADMITTED = 64
"""(block_table, seq_lens) pairs a plan remembers as validated."""

def role_of(variant: str) -> str:
    """`baseline`, `candidate`, or a legacy name (`e5m2_pipelined`) -> the role."""
    name = variant.rsplit("_", 1)[-1]
    if name not in LEGACY_VARIANTS:
        raise ValueError(f"variant: expected one of {sorted(LEGACY_VARIANTS)} (optionally "
                         f"prefixed by the KV dtype, e.g. 'e5m2_pipelined'), got {variant!r}")
    return LEGACY_VARIANTS[name]


@cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def check_shared_memory(entry: str, dynamic: int, static: int, optin: int) -> None:
    """Refuse a launch whose shared memory the device cannot give one block."""
    if dynamic + static > optin:
        raise ValueError(f"{entry}: dynamic shared memory {dynamic} B + static {static} B "
                         f"exceeds the device's {optin} B per block")


def check_cluster(entry: str, declared: int, compiled: int) -> None:
    """Refuse a cluster entry point compiled without the declared static cluster width:
    launched without a cluster, its distributed shared memory would not exist."""
    if compiled != declared:
        raise ValueError(f"{entry}: declared as a cluster of {declared} splits, compiled with "
                         f"a required cluster width of {compiled} (__cluster_dims__)")


class _Launcher:
    """Launches one kernel with a fixed configuration as cheaply as Python can:
    cuLaunchKernel (cuda.bindings) with a pre-built argument array whose slots
    are overwritten per call; cuda.core's `launch` when the driver binding is
    not usable. The function's dynamic shared memory attribute is raised to the
    planned size for every size (at exactly 48 KiB the static shared memory
    already puts the block over the default limit), never lowered: plans of one
    cubin share the function. A cluster entry point must have
    been compiled with the declared cluster width (it is launched without one)."""

    TYPES = tuple({"pointer": ctypes.c_void_p, "int32": ctypes.c_int32,
                   "float32": ctypes.c_float}[p.kind] for p in contract.PARAMETERS)

    def __init__(self, fn: Any, entry: str, grid: tuple[int, int, int], block: int, smem: int,
                 device_index: int, cluster: int = 0):
        self.fn, self.grid, self.block, self.smem = fn, grid, block, smem
        self.slots: list[Any] = [t() for t in self.TYPES]
        self.array = (ctypes.c_void_p * len(self.slots))(
            *[ctypes.addressof(v) for v in self.slots])
        self.raw: Any = None
        try:
            from cuda.bindings import driver

            self.driver = driver
            self.raw = self._function(driver, fn)
        except (ImportError, AttributeError, TypeError, ValueError):
            self._without_driver(entry, smem, device_index, cluster)
            return
        attr = driver.CUfunction_attribute
        if cluster:
            err, width = driver.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH,
                                                   self.raw)
            self._ok(err, "cuFuncGetAttribute(required cluster width)")
            check_cluster(entry, cluster, width)
        err, static = driver.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, self.raw)
        self._ok(err, "cuFuncGetAttribute(static shared memory)")
        check_shared_memory(entry, smem, static, _optin(device_index))
        # The attribute belongs to the function, which every plan of this cubin and entry
        # point shares (launch.kernel loads it once): only ever raise it, or a plan with a
        # smaller chunk would leave an earlier, larger one launching past the limit
        # (CUDA_ERROR_INVALID_VALUE). It is a permission, not a reservation: each launch
        # still asks for its own plan's bytes.
        err, now = driver.cuFuncGetAttribute(
            attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.raw)
        self._ok(err, "cuFuncGetAttribute(max dynamic shared memory)")
        if smem > now:
            (err,) = driver.cuFuncSetAttribute(
                self.raw, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
            self._ok(err, f"cuFuncSetAttribute(max dynamic shared memory {smem})")

    def _without_driver(self, entry: str, smem: int, device_index: int, cluster: int) -> None:
        """cuda.core alone cannot raise a function's shared memory limit."""
        attrs = self.fn.attributes  # methods in older cuda.core releases, properties later
        if cluster:
            width = attrs.required_cluster_width
            check_cluster(entry, cluster, int(width() if callable(width) else width))
        attr = attrs.shared_size_bytes
        static = int(attr() if callable(attr) else attr)
        check_shared_memory(entry, smem, static, min(_optin(device_index), DEFAULT_SMEM_LIMIT))
        self.config = launch.cuda_core().LaunchConfig(grid=self.grid, block=self.block,
                                                      shmem_size=smem)

    def _ok(self, err: Any, what: str) -> None:
        if err != self.driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{what} failed: {err!r}")

    @staticmethod
    def _function(driver: Any, fn: Any) -> Any:
        """The context's CUfunction of a cuda.core kernel (a CUkernel of a library
        in cuda.core >= 0.3; older releases hand out a CUfunction already)."""
        err, func = driver.cuKernelGetFunction(driver.CUkernel(int(fn.handle)))
        if err == driver.CUresult.CUDA_SUCCESS:
            return func
        return driver.CUfunction(int(fn.handle))

    def set_scalars(self, scalars: tuple[int | float, ...]) -> None:
        """The trailing scalar arguments, fixed for the plan's lifetime."""
        self.scalars = scalars
        for slot, value in zip(self.slots[contract.POINTERS:], scalars):
            slot.value = value

    def __call__(self, stream: int, pointers: tuple[int, ...]) -> None:
        if self.raw is not None:
            for slot, value in zip(self.slots, pointers):
                slot.value = value
            (err,) = self.driver.cuLaunchKernel(
                self.raw, *self.grid, self.block, 1, 1, self.smem, stream,
                ctypes.addressof(self.array), 0)
            self._ok(err, "cuLaunchKernel")
            return
        cc = launch.cuda_core()
        kinds = [p.kind for p in contract.PARAMETERS[contract.POINTERS:]]
        cc.launch(launch.stream(stream), self.config, self.fn, *pointers,
                  *[np.int32(a) if k == "int32" else np.float32(a)
                    for k, a in zip(kinds, self.scalars)])


@cache
def _optin(index: int) -> int:
    """The most shared memory one block may have on device `index` (opt-in)."""
    props = torch.cuda.get_device_properties(index)
    return int(getattr(props, "shared_memory_per_block_optin", DEFAULT_SMEM_LIMIT))


class DecodeAttention:
    """A planned launch of one entry point of an operator: validates every argument
    once (src/rowgate/ops/launch_args.py), then `run` launches with the checks that keep
    it memory-safe: shapes and dtypes as planned, and block_table/seq_lens contents
    validated again whenever they are not tensors already validated for this plan
    (unmodified since). Under CUDA-graph capture contents cannot be read: tensors
    not yet validated are refused there; `admit` them first.

    q [B, Hq, D] bf16; k_cache/v_cache [pages, Hkv, page, D] bf16 or E5M2 bytes
    (uint8 / float8_e5m2) with per-tensor scales; block_table [B, n] int32;
    seq_lens [B] int32, each in 1..max_seq_len <= n * page.
    """

    def __init__(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_table: torch.Tensor, seq_lens: torch.Tensor, *, max_seq_len: int,
                 cubin: Path, k_scale: float = 1.0, v_scale: float = 1.0,
                 softmax_scale: float | None = None, variant: str = "baseline",
                 chunk: int | None = None, operator: Operator,
                 candidate: str = "", entry: str | None = None):
        if not isinstance(q, torch.Tensor) or q.device.type != "cuda":
            raise ValueError(f"q: expected a CUDA tensor, got "
                             f"{q.device if isinstance(q, torch.Tensor) else type(q).__name__}")
        shape = args_check.validate(operator, q, k_cache, v_cache, block_table, seq_lens,
                                    max_seq_len=max_seq_len, k_scale=k_scale, v_scale=v_scale,
                                    softmax_scale=softmax_scale)
        self.shape, self.max_seq_len = shape, max_seq_len
        self.index = q.device.index if q.device.index is not None else torch.cuda.current_device()
        roles = operator.entries(shape.kv, shape.dim, shape.group, candidate)
        self.entry = entry or roles[role_of(variant)]
        p = contract.plan(operator, list(roles.values()), batch=shape.batch, kv_heads=shape.hkv,
                          group=shape.group, dim=shape.dim, page=shape.page,
                          max_seq_len=max_seq_len, sm_count=_sm_count(self.index))
        if chunk is not None:
            p = _forced_chunk(operator, p, chunk, shape, max_seq_len, list(roles.values()))
        self.plan = p
        self.shapes = (q.shape, k_cache.shape, block_table.shape, seq_lens.shape)
        self.dtypes = (q.dtype, k_cache.dtype, v_cache.dtype, block_table.dtype, seq_lens.dtype)
        self.admitted: deque[args_check.Checked] = deque(maxlen=ADMITTED)
        self.admitted.append(args_check.Checked(block_table, seq_lens))
        # the workspace belongs to the plan: launches of one plan are stream-ordered
        n_acc, n_ml, n_ctr = contract.workspace_elements(shape.batch, shape.hkv, p.splits,
                                                         shape.group, shape.dim)
        self.ws_acc = torch.empty(n_acc, dtype=torch.float32, device=q.device)
        self.ws_ml = torch.empty(n_ml, dtype=torch.float32, device=q.device)
        self.counters = torch.zeros(n_ctr, dtype=torch.int32, device=q.device)
        scale = softmax_scale if softmax_scale is not None else shape.dim ** -0.5
        geo = operator.geometry(self.entry, p.splits)
        self.kernel = geo.entry
        """The entry point launched: the role's, or its cluster entry point."""
        smem = operator.smem(geo.entry, p.chunk, shape.group, shape.dim)
        self.launcher = _Launcher(kernel(str(cubin), geo.entry), geo.entry,
                                  (geo.grid_x, shape.hkv, shape.batch), geo.threads, smem,
                                  self.index, geo.cluster)
        self.launcher.set_scalars(contract.scalars(
            bt_stride=shape.bt_stride, kv_heads=shape.hkv, page=shape.page, chunk=p.chunk,
            softmax_scale=scale, k_scale=k_scale, v_scale=v_scale))

    def poison_workspace(self, bits: int = contract.WORKSPACE_POISON) -> None:
        """Fill ws_acc and ws_ml with a NaN pattern: a kernel must not read workspace it
        did not write in the same launch (the operator gate's correctness runs)."""
        for ws in (self.ws_acc, self.ws_ml):
            ws.view(torch.int32).fill_(bits - (1 << 32) if bits >= 1 << 31 else bits)

    def admit(self, block_table: torch.Tensor, seq_lens: torch.Tensor) -> None:
        """Validate the contents of another (block_table, seq_lens) pair for this plan."""
        if (block_table.shape, seq_lens.shape) != self.shapes[2:]:
            raise ValueError(f"block_table/seq_lens: expected shapes {self.shapes[2:]} as "
                             f"planned, got {(block_table.shape, seq_lens.shape)}")
        args_check.check_contents(self.shape, block_table, seq_lens, self.max_seq_len)
        self.admitted.append(args_check.Checked(block_table, seq_lens))

    def _check_contents(self, block_table: torch.Tensor, seq_lens: torch.Tensor) -> None:
        if any(c.same(block_table, seq_lens) for c in self.admitted):
            return
        if torch.cuda.is_current_stream_capturing():
            raise ValueError("block_table/seq_lens: not validated for this plan, and their "
                             "contents cannot be read during CUDA-graph capture; admit() them "
                             "before capturing")
        self.admit(block_table, seq_lens)

    def run(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            block_table: torch.Tensor, seq_lens: torch.Tensor,
            out: torch.Tensor | None = None) -> torch.Tensor:
        if (q.shape, k_cache.shape, block_table.shape, seq_lens.shape) != self.shapes or (
                q.dtype, k_cache.dtype, v_cache.dtype, block_table.dtype,
                seq_lens.dtype) != self.dtypes or v_cache.shape != k_cache.shape:
            raise ValueError(f"inputs: expected shapes {self.shapes} and dtypes {self.dtypes} "
                             f"as planned, got {(q.shape, k_cache.shape, block_table.shape)} "
                             f"and {(q.dtype, k_cache.dtype, v_cache.dtype)}")
        if not all(t.is_contiguous() for t in (q, k_cache, v_cache, block_table, seq_lens)):
            raise ValueError("inputs: expected contiguous tensors as planned")
        self._check_contents(block_table, seq_lens)
        if out is None:
            out = torch.empty_like(q)
        elif out.shape != q.shape or out.dtype != q.dtype or not out.is_contiguous() or \
                out.device != q.device:
            raise ValueError(f"out: expected a contiguous {q.dtype} tensor of shape "
                             f"{tuple(q.shape)} on {q.device}, got {out.dtype} "
                             f"{tuple(out.shape)} on {out.device}")
        self.launcher(launch.current_stream(self.index), (
            q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_table.data_ptr(),
            seq_lens.data_ptr(), out.data_ptr(), self.ws_acc.data_ptr(), self.ws_ml.data_ptr(),
            self.counters.data_ptr()))
        return out


def _forced_chunk(op: Operator, p: Plan, chunk: int, shape: args_check.Shape, max_seq_len: int,
                  entries: list[str]) -> Plan:
    """A caller-chosen chunk (benchmarks), checked like the plan's own."""
    unit = max(op.chunk_multiple, shape.page)
    smem = {e: op.smem(e, chunk, shape.group, shape.dim) for e in entries}
    if chunk % unit or not 0 < chunk <= max(op.max_chunk, unit) or max(
            (b for e, b in smem.items() if op.bounds_chunk(e)), default=0) > \
            contract.PORTABLE_DYNAMIC_SMEM:
        raise ValueError(f"chunk: expected a multiple of {unit} up to {max(op.max_chunk, unit)} "
                         f"whose shared memory fits {contract.PORTABLE_DYNAMIC_SMEM} B, got {chunk}")
    return replace(p, chunk=chunk, splits=-(-max_seq_len // chunk), smem=smem)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_table: torch.Tensor, seq_lens: torch.Tensor, *, max_seq_len: int,
                     cubin: Path, k_scale: float = 1.0, v_scale: float = 1.0,
                     softmax_scale: float | None = None, variant: str = "baseline",
                     out: torch.Tensor | None = None, chunk: int | None = None,
                     operator: Operator, candidate: str = "") -> torch.Tensor:
    """Decode attention of one query token per sequence over a paged KV cache
    (see `DecodeAttention`); validates every argument on every call. Returns
    [B, Hq, D] bf16."""
    if out is not None:
        args_check.check_tensor(out, "out", 3, (torch.bfloat16,), q.device)
    return DecodeAttention(q, k_cache, v_cache, block_table, seq_lens, max_seq_len=max_seq_len,
                           cubin=cubin, k_scale=k_scale, v_scale=v_scale,
                           softmax_scale=softmax_scale, variant=variant, chunk=chunk,
                           operator=operator, candidate=candidate).run(
        q, k_cache, v_cache, block_table, seq_lens, out)


__all__ = ["DecodeAttention", "check_cluster", "check_shared_memory", "decode_attention", "kernel",
           "role_of"]
