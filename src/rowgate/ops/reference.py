"""Reference implementations of paged decode attention (torch, any device).

`decode_attention_fp64` is the correctness source the operator gate compares
both kernel variants with: it dequantises the cache exactly (E5M2 and bf16 are
exact in float64), computes in float64 and never rounds to bf16.
`naive_dequant_sdpa` and `dense_sdpa` are the baselines the benchmark times.
"""

from __future__ import annotations

import torch

E5M2 = "e5m2"
BF16 = "bf16"


def kv_dtype_of(cache: torch.Tensor) -> str:
    """`e5m2` for byte caches (uint8 or float8_e5m2), `bf16` for bfloat16."""
    if cache.dtype in (torch.uint8, torch.float8_e5m2):
        return E5M2
    if cache.dtype == torch.bfloat16:
        return BF16
    raise ValueError(f"k_cache: expected dtype uint8, float8_e5m2 or bfloat16, got {cache.dtype}")


def dequantize(cache: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """E5M2 bytes (or bf16) times `scale`, as `dtype`; exact in float64."""
    if kv_dtype_of(cache) == E5M2:
        values = cache.view(torch.float8_e5m2).to(dtype)
    else:
        values = cache.to(dtype)
    return values * scale if scale != 1.0 else values


def gather_pages(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """One sequence's rows from a [pages, Hkv, page, D] cache: [Hkv, length, D]."""
    page = cache.shape[2]
    n_pages = -(-length // page)
    pages = cache[block_table[:n_pages].long()]           # [n, Hkv, page, D]
    rows = pages.permute(1, 0, 2, 3).reshape(cache.shape[1], n_pages * page, cache.shape[3])
    return rows[:, :length]


def decode_attention_fp64(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_table: torch.Tensor, seq_lens: torch.Tensor, *,
                          k_scale: float = 1.0, v_scale: float = 1.0,
                          softmax_scale: float | None = None) -> torch.Tensor:
    """[B, Hq, D] float64: softmax(q·Kᵀ·scale)·V per sequence, over its pages only."""
    batch, hq, dim = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    scale = softmax_scale if softmax_scale is not None else dim ** -0.5
    out = torch.empty(batch, hq, dim, dtype=torch.float64, device=q.device)
    for b, length in enumerate(seq_lens.tolist()):
        k = dequantize(gather_pages(k_cache, block_table[b], length), k_scale, torch.float64)
        v = dequantize(gather_pages(v_cache, block_table[b], length), v_scale, torch.float64)
        qb = q[b].to(torch.float64).view(hkv, group, dim)
        scores = torch.einsum("hgd,htd->hgt", qb, k) * scale
        probs = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("hgt,htd->hgd", probs, v).reshape(hq, dim)
    return out


def naive_dequant_sdpa(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       block_table: torch.Tensor, seq_len: int, *, k_scale: float = 1.0,
                       v_scale: float = 1.0) -> torch.Tensor:
    """The naive path for uniform batches: gather pages, dequantise to bf16, SDPA."""
    batch, hq, dim = q.shape
    hkv, page = k_cache.shape[1], k_cache.shape[2]
    n_pages = -(-seq_len // page)
    table = block_table[:, :n_pages].long()

    def dense(cache: torch.Tensor, scale: float) -> torch.Tensor:
        rows = cache[table]                                # [B, n, Hkv, page, D]
        rows = rows.permute(0, 2, 1, 3, 4).reshape(batch, hkv, n_pages * page, dim)
        return dequantize(rows[:, :, :seq_len], scale, torch.bfloat16)

    return dense_sdpa(q, dense(k_cache, k_scale), dense(v_cache, v_scale))


def dense_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """torch SDPA on dense [B, Hkv, L, D] K/V with GQA: the bf16 comparison point."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.unsqueeze(2), k, v, enable_gqa=True)
    return out.squeeze(2)
