"""The task ABI's semantics in torch: run a task list, in list order, on bound buffers.

An executable statement of what each opcode does (docs/task-abi.md), with the
kernel's rounding points (bf16 where the reference engine rounds, fp32 inside)
and its attention-split format (base-2 online-softmax state per split). The
CPU tests run the builder's lists through it against the reference engine's
decode step: operands, tiles, layouts and the order of a step are checked
here without a GPU; the kernel is then held to the same outputs on the GPU.
"""

from __future__ import annotations

import math

import torch

from pipeline.megakernel.abi import GRANULE, Flag, Opcode, StepShape, Task

LOG2E = 1.4426950408889634


class _Mem:
    def __init__(self, tensors: list[torch.Tensor]):
        self.bytes = [t.view(-1).view(torch.uint8) for t in tensors]

    def at(self, t: Task, i: int, dtype: torch.dtype, count: int | None = None) -> torch.Tensor:
        op = t.operand(i)
        raw = self.bytes[op.buffer][op.offset * GRANULE:]
        size = torch.empty((), dtype=dtype).element_size()
        if count is None:
            count = raw.numel() // size
        return raw[:count * size].view(dtype)


def _r(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 to bf16 and back (the kernel's round_bf16)."""
    return x.to(torch.bfloat16).float()


def run(tasks: list[Task], shape: StepShape, tensors: list[torch.Tensor]) -> None:
    mem = _Mem(tensors)
    meta = mem.bytes[shape.meta_buffer].view(torch.int32)
    for t in tasks:
        OPS[Opcode(t.opcode)](t, shape, mem, meta)


def _embed(t, s, mem, meta):
    row0, rows, hidden, vocab = t.tile
    table = mem.at(t, 0, torch.bfloat16, vocab * hidden).view(vocab, hidden)
    out = mem.at(t, 1, torch.bfloat16).view(-1)
    for b in range(row0, row0 + rows):
        out[b * hidden:(b + 1) * hidden] = table[int(meta[s.ids_at + b])]


def _rms_norm(t, s, mem, meta):
    row0, rows, n, _ = t.tile
    x = mem.at(t, 0, torch.bfloat16, (row0 + rows) * n).view(-1, n)[row0:]
    w = mem.at(t, 1, torch.bfloat16, n).float()
    out = mem.at(t, 2, torch.bfloat16, (row0 + rows) * n).view(-1, n)[row0:]
    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + s.rms_eps)
    out.copy_(((xf * inv) * w).to(torch.bfloat16))


def _gemv(t, s, mem, meta, f32: bool = False):
    row0, rows, k, n = t.tile
    w = mem.at(t, 0, torch.bfloat16, (row0 + rows) * k).view(-1, k)[row0:]
    x = mem.at(t, 1, torch.bfloat16, s.batch * k).view(s.batch, k)
    y = _r(x.float() @ w.float().T)
    out = mem.at(t, 2, torch.float32 if f32 else torch.bfloat16, s.batch * n).view(s.batch, n)
    out[:, row0:row0 + rows] = y.to(out.dtype)


def _rope(t, s, mem, meta):
    row0, rows, nheads, d = t.tile
    half = d // 2
    x = mem.at(t, 0, torch.bfloat16, (row0 + rows) * d).view(-1, d)
    table = mem.at(t, 1, torch.bfloat16).view(-1, d)
    w = mem.at(t, 2, torch.bfloat16, d).float()
    cache = mem.at(t, 3, torch.bfloat16) if t.flags & Flag.APPEND_KV else None
    for r in range(row0, row0 + rows):
        b, head = divmod(r, nheads)
        xf = x[r].float()
        y = _r(xf * torch.rsqrt(xf.pow(2).mean() + s.rms_eps) * w)
        cs = table[int(meta[s.positions_at + b])].float()
        cos, sin = cs[:half], cs[half:]
        x1, x2 = y[:half], y[half:]
        row = torch.cat([_r(x1 * cos) - _r(x2 * sin), _r(x2 * cos) + _r(x1 * sin)])
        x[r] = row.to(torch.bfloat16)
        if cache is not None:
            at = (int(meta[s.slots_at + b]) * nheads + head) * d
            cache[at:at + d] = x[r]


def _kv_append(t, s, mem, meta):
    row0, rows, nheads, d = t.tile
    src = mem.at(t, 0, torch.bfloat16, (row0 + rows) * d).view(-1, d)
    cache = mem.at(t, 1, torch.bfloat16)
    for r in range(row0, row0 + rows):
        b, head = divmod(r, nheads)
        at = (int(meta[s.slots_at + b]) * nheads + head) * d
        cache[at:at + d] = src[r]


def _partials(t, s, mem, i: int) -> torch.Tensor:
    g = s.num_heads // s.num_kv_heads
    return mem.at(t, i, torch.float32).view(-1)[
        :s.batch * s.num_kv_heads * s.max_splits * g * (s.head_dim + 2)].view(
        s.batch, s.num_kv_heads, s.max_splits, g, s.head_dim + 2)


def _attn_split(t, s, mem, meta):
    seq, kvh, split, chunk = t.tile
    d, g = s.head_dim, s.num_heads // s.num_kv_heads
    q = mem.at(t, 0, torch.bfloat16, s.batch * s.num_heads * d).view(s.batch, s.num_heads, d)
    k_cache = mem.at(t, 1, torch.bfloat16).view(-1, s.page_size, s.num_kv_heads, d)
    v_cache = mem.at(t, 2, torch.bfloat16).view(-1, s.page_size, s.num_kv_heads, d)
    length = int(meta[s.context_lens_at + seq])
    start, end = split * chunk, min(length, split * chunk + chunk)
    out = _partials(t, s, mem, 3)[seq, kvh, split]
    if end <= start:
        out.zero_()
        out[:, d] = -math.inf
        return
    table = meta[s.block_tables_at + seq * s.table_width:][:s.table_width]
    tok = torch.arange(start, end)
    pages = table[tok // s.page_size].long()
    k = k_cache[pages, tok % s.page_size, kvh].float()
    v = v_cache[pages, tok % s.page_size, kvh].float()
    qg = q[seq, kvh * g:(kvh + 1) * g].float() * (s.softmax_scale * LOG2E)
    scores = qg @ k.T  # [g, tokens], base 2
    m = scores.max(-1).values
    p = torch.exp2(scores - m[:, None])
    out[:, :d] = p @ v
    out[:, d] = m
    out[:, d + 1] = p.sum(-1)


def _attn_merge(t, s, mem, meta):
    seq, kvh, splits, _ = t.tile
    d, g = s.head_dim, s.num_heads // s.num_kv_heads
    parts = _partials(t, s, mem, 0)[seq, kvh, :splits]  # [splits, g, d + 2]
    out = mem.at(t, 1, torch.bfloat16, s.batch * s.num_heads * d).view(s.batch, s.num_heads, d)
    m, ls = parts[..., d], parts[..., d + 1]
    m_all = m.max(0).values
    w = torch.where(ls > 0, torch.exp2(m - m_all), torch.zeros_like(m))
    num = (parts[..., :d] * w[..., None]).sum(0)
    den = (ls * w).sum(0)
    val = torch.where(den[:, None] > 0, num / den[:, None], torch.zeros_like(num))
    out[seq, kvh * g:(kvh + 1) * g] = val.to(torch.bfloat16)


def _cols(t, s, mem, n_ops):
    col0, cols, n, _ = t.tile
    return [mem.at(t, i, torch.bfloat16, s.batch * n).view(s.batch, n)[:, col0:col0 + cols]
            for i in range(n_ops)]


def _silu_mul(t, s, mem, meta):
    gate, up, out = _cols(t, s, mem, 3)
    gf = gate.float()
    out.copy_((_r(gf / (1 + torch.exp(-gf))) * up.float()).to(torch.bfloat16))


def _residual_add(t, s, mem, meta):
    x, y = _cols(t, s, mem, 2)
    x.copy_((x.float() + y.float()).to(torch.bfloat16))


OPS = {Opcode.NOP: lambda *a: None, Opcode.EMBED: _embed, Opcode.RMS_NORM: _rms_norm,
       Opcode.GEMV: _gemv, Opcode.LOGITS: lambda t, s, m, meta: _gemv(t, s, m, meta, True),
       Opcode.ROPE: _rope, Opcode.KV_APPEND: _kv_append, Opcode.ATTN_SPLIT: _attn_split,
       Opcode.ATTN_MERGE: _attn_merge, Opcode.SILU_MUL: _silu_mul,
       Opcode.RESIDUAL_ADD: _residual_add}
