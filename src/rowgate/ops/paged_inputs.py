"""Operator-gate inputs for one case (rowgate.ops.cases): randomized page tables,
poisoned caches and outputs, and the comparators. Torch only (CPU or CUDA), so CI
exercises all of it on the fp64 reference."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from rowgate.ops.cases import Case
from rowgate.ops.reference import E5M2

POISON_E5M2 = 0x7F       # an E5M2 NaN byte
POISON_BF16 = 0x7FC1     # a bf16 NaN with a payload no arithmetic produces
UNWRITTEN_BF16 = 0x7FBF  # the output sentinel: a NaN payload no kernel writes


@dataclass
class Inputs:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    k_scale: float
    v_scale: float
    used_pages: int
    poison_pages: int


def _random_cache(shape: tuple[int, ...], kv: str, gen: torch.Generator,
                  dev: torch.device) -> torch.Tensor:
    values = torch.randn(shape, generator=gen, dtype=torch.float32, device=dev)
    if kv == E5M2:
        return values.to(torch.float8_e5m2).view(torch.uint8)
    return values.to(torch.bfloat16)


def _poison_value(kv: str) -> torch.Tensor:
    if kv == E5M2:
        return torch.tensor(POISON_E5M2, dtype=torch.uint8)
    return torch.tensor(POISON_BF16, dtype=torch.int16).view(torch.bfloat16)


def make_inputs(case: Case, device: torch.device | str = "cpu") -> Inputs:
    """Random q and caches, drawn on `device` from the case's seed; physical
    pages shuffled; every byte no sequence owns (unused pages, the tail of each
    last page) is poison, and block-table padding points at a poison page."""
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(hash_seed(case))
    page = case.page
    pages_per_seq = [math.ceil(n / page) for n in case.lens]
    used = sum(pages_per_seq)
    spare = max(2, used // 4)                  # pages nobody owns, all poison
    total = used + spare
    perm = torch.randperm(total, generator=gen, device=dev)
    shape = (total, case.hkv, page, case.dim)
    k_cache = _random_cache(shape, case.kv, gen, dev)
    v_cache = _random_cache(shape, case.kv, gen, dev)
    poison = _poison_value(case.kv).to(dev)
    width = max(pages_per_seq)
    table = torch.empty((case.batch, width), dtype=torch.int32, device=dev)
    table.fill_(int(perm[used]))               # padding points at a poison page
    cursor = 0
    for b, (n, length) in enumerate(zip(pages_per_seq, case.lens)):
        table[b, :n] = perm[cursor:cursor + n].to(torch.int32)
        cursor += n
        tail = length - (n - 1) * page        # rows of the last page in use
        last = int(table[b, n - 1])
        k_cache[last, :, tail:] = poison
        v_cache[last, :, tail:] = poison
    unowned = perm[used:]
    k_cache[unowned] = poison
    v_cache[unowned] = poison
    q = torch.randn((case.batch, case.hq, case.dim), generator=gen, device=dev)
    scales = torch.rand(2, generator=gen, dtype=torch.float64, device=dev) * 1.5 + 0.25
    return Inputs(q.to(torch.bfloat16), k_cache, v_cache, table,
                  torch.tensor(case.lens, dtype=torch.int32, device=dev),
                  float(scales[0]), float(scales[1]), used, spare)


def fingerprint(inp: Inputs) -> list[int]:
    """Per input tensor, the sum of its bytes read as int32 (int64 accumulation, on the
    tensor's device): cheap on gigabytes, and any difference in how they were drawn
    changes it. An agreement check between two copies of rowgate's own inputs, not a
    defence (nothing hostile computes it)."""
    tensors = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    return [int(t.contiguous().view(torch.int32).sum(dtype=torch.int64)) for t in tensors]


def hash_seed(case: Case) -> int:
    """A stable 63-bit seed from the case (Python's hash() is salted per process)."""
    text = case.name.encode()
    value = 0
    for byte in text:
        value = (value * 1_099_511_628_211 + byte) % (1 << 63)
    return value


def poisoned_output(like: torch.Tensor) -> torch.Tensor:
    """An output buffer whose every element is the unwritten sentinel."""
    return torch.full(like.shape, UNWRITTEN_BF16, dtype=torch.int16,
                      device=like.device).view(torch.bfloat16)


GUARD = 256
"""Sentinel elements before and after an output: a write there is out of bounds."""


def guarded(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, out): out is the middle of a sentinel-filled int16 buffer with GUARD
    elements on each side."""
    n = like.numel()
    buf = torch.full((n + 2 * GUARD,), UNWRITTEN_BF16, dtype=torch.int16, device=like.device)
    out = buf[GUARD:GUARD + n].view(torch.bfloat16).view(like.shape)
    return buf, out


def guard_writes(buf: torch.Tensor) -> int:
    """Guard elements of a `guarded` buffer no longer holding the sentinel."""
    edges = torch.cat([buf[:GUARD], buf[-GUARD:]])
    return int((edges != UNWRITTEN_BF16).sum())


def unwritten(out: torch.Tensor) -> int:
    """Elements still holding the sentinel after a launch."""
    return int((out.view(torch.int16) == UNWRITTEN_BF16).sum())


def _value(t: torch.Tensor, i: int) -> dict[str, str | None]:
    x = t.reshape(-1)[i]
    bits = int(x.view(torch.int16)) & 0xFFFF if x.dtype == torch.bfloat16 else None
    return {"value": repr(float(x)), "bits": f"0x{bits:04x}" if bits is not None else None}


def bitwise(a: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
    """Compare two bf16 outputs bit for bit: count and the first mismatch."""
    diff = (a.view(torch.int16) != b.view(torch.int16)).reshape(-1)
    count = int(diff.sum())
    rec: dict[str, Any] = {"mismatches": count, "first_index": None, "a": None, "b": None}
    if count:
        i = int(diff.nonzero()[0])
        rec.update(first_index=i, a=_value(a, i), b=_value(b, i))
    return rec


def against_reference(out: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> dict[str, Any]:
    """Errors of a bf16 output against the fp64 reference; NaN never passes."""
    o = out.to(torch.float64).reshape(-1)
    r = ref.to(torch.float64).reshape(-1).to(o.device)
    err = (o - r).abs()
    bad = ~(err <= atol + rtol * r.abs())      # NaN compares false: it fails
    finite = err[torch.isfinite(err)]
    rel = finite / r.abs()[torch.isfinite(err)].clamp_min(1e-30)
    count = int(bad.sum())
    whole = finite.numel() == err.numel()  # a NaN or inf output has no error to maximise
    rec: dict[str, Any] = {"max_abs_err": float(finite.max()) if finite.numel() and whole else None,
           "max_rel_err": float(rel.max()) if rel.numel() else None,
           "failures": count, "nan": int(torch.isnan(o).sum()), "inf": int(torch.isinf(o).sum()),
           "first_index": None,
           "out": None, "ref": None}
    if count:
        i = int(bad.nonzero()[0])
        rec.update(first_index=i, out=_value(out, i), ref={"value": repr(float(r[i]))})
    return rec
