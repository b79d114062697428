"""rowgate's harness/1 entry point for vLLM's own paged attention (csrc/attention,
built unmodified by kernels/kernels.toml): rowgate's canonical inputs, a
[pages, kv_heads, page, head_dim] cache, converted to vLLM's layout, and vLLM's
`paged_attention_v1_kernel` launched as its launcher (paged_attention_v1.cu) would.
Baseline and candidate are the same kernel: the gate's bitwise check is then one of
determinism, and the fp64 comparison judges vLLM's arithmetic."""

from __future__ import annotations

import weakref
from typing import Any

import cupy
import numpy as np
import torch

NUM_THREADS = 128
"""paged_attention_v1_launcher's default, which its switch instantiates."""
KV = {"bf16": ("S1_", 0, 8), "e5m2": ("h", 2, 16)}
"""kv dtype -> (the cache type's mangled name after __nv_bfloat16, vllm::Fp8KVCacheDataType,
elements per 16-byte key vector x)."""

_functions: dict[tuple[str, str], Any] = {}
_scales: dict[tuple[float, float], torch.Tensor] = {}
"""The launcher passes k_scale and v_scale as device pointers: one tensor per pair."""
_layout: list[Any] = [None, None, None]
"""(a weak reference to the K cache converted, its key, its value): the last one only."""


def symbol(kv_dtype: str, head_dim: int, page: int) -> str:
    """The mangled name of vllm::paged_attention_v1_kernel<__nv_bfloat16, CACHE_T,
    head_dim, page, 128, KV_DTYPE, false> (the audit lists each under its demangled name)."""
    cache, kind, _ = KV[kv_dtype]
    return (f"_ZN4vllm25paged_attention_v1_kernelI13__nv_bfloat16{cache}Li{head_dim}ELi{page}E"
            f"Li{NUM_THREADS}ELNS_18Fp8KVCacheDataTypeE{kind}ELb0EEEvPT_PKS3_PKT0_S9_ifPKiSB_"
            f"iPKfiiiSD_SD_iiiii")


def to_vllm_layout(k_cache: torch.Tensor, v_cache: torch.Tensor, x: int,
                   v_scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """[pages, heads, page, dim] -> key [pages, heads, dim/x, page, x], value
    [pages, heads, dim, page], the value scaled by `v_scale` when given (a bf16 cache);
    converted once per input tensor (timed calls reuse it)."""
    ref, key, value = _layout
    if ref is None or ref() is not k_cache:
        pages, heads, page, dim = k_cache.shape
        key = k_cache.view(pages, heads, page, dim // x, x).permute(0, 1, 3, 2, 4).contiguous()
        value = v_cache.permute(0, 1, 3, 2)
        if v_scale is not None:
            value = (value.float() * v_scale).to(v_cache.dtype)
        value = value.contiguous()
        _layout[:] = [weakref.ref(k_cache), key, value]
    return key, value


def _function(cubin: str, name: str, shared: int) -> Any:
    if (cubin, name) not in _functions:
        _functions[cubin, name] = cupy.RawModule(path=cubin).get_function(name)
    fn = _functions[cubin, name]
    if shared > 48 * 1024:  # the launcher's VLLM_DevFuncAttribute_SET_MaxDynamicSharedMemorySize
        fn.max_dynamic_shared_size_bytes = shared
    return fn


def run(role: str, inputs: dict[str, Any], out: torch.Tensor, cubins: dict[str, str]) -> None:
    del role  # both roles launch vLLM's kernel
    q = inputs["q"]
    batch, heads, dim = q.shape
    kv_dtype = inputs["kv_dtype"]
    if kv_dtype not in KV:
        raise ValueError(f"this harness launches bf16 and e5m2 caches, got {kv_dtype}")
    page = inputs["k_cache"].shape[2]
    folded = kv_dtype == "bf16"  # vLLM reads a bf16 cache unscaled: fold the scales in
    key, value = to_vllm_layout(inputs["k_cache"], inputs["v_cache"], KV[kv_dtype][2],
                                inputs["v_scale"] if folded else None)
    softmax_scale = inputs["softmax_scale"] * (inputs["k_scale"] if folded else 1.0)
    table = inputs["block_table"]
    pair = (float(inputs["k_scale"]), float(inputs["v_scale"]))
    if pair not in _scales:
        _scales[pair] = torch.tensor(pair, dtype=torch.float32, device=q.device)
    scales = _scales[pair]
    padded = -(-int(inputs["max_seq_len"]) // page) * page
    shared = max(padded * 4, (NUM_THREADS // 32 // 2) * dim * 4)
    fn = _function(cubins["paged_attention"], symbol(kv_dtype, dim, page), shared)
    args = (np.uint64(out.data_ptr()), np.uint64(q.data_ptr()), np.uint64(key.data_ptr()),
            np.uint64(value.data_ptr()), np.int32(key.shape[1]),
            np.float32(softmax_scale), np.uint64(table.data_ptr()),
            np.uint64(inputs["seq_lens"].data_ptr()), np.int32(table.shape[1]),
            np.uint64(0),                                      # alibi_slopes: none
            np.int32(q.stride(0)), np.int32(key.stride(0)), np.int32(key.stride(1)),
            np.uint64(scales.data_ptr()), np.uint64(scales.data_ptr() + 4),
            np.int32(0), np.int32(0), np.int32(0), np.int32(64), np.int32(0))  # not sparse
    with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        fn((heads, batch, 1), (NUM_THREADS,), args, shared_mem=shared)
