"""The task ABI's semantics in torch: run a task list, in list order, on bound buffers.

An executable statement of what each opcode does (docs/task-abi.md), with the
kernel's rounding points (bf16 where the reference engine rounds, fp32 inside)
and its attention-split format (base-2 online-softmax state per split). The
CPU tests run the builder's lists (unfused and fused) through it against the
reference engine's decode step: operands, tiles, layouts, flags and the order
of a step are checked here without a GPU; the kernel is then held to the same
outputs on the GPU. A fused flag is the unfused op it replaces, applied where
the flag says (the same helpers below compute both).
"""

from __future__ import annotations

import math

import torch

from rowgate_lab.megakernel.abi import GRANULE, Flag, Opcode, StepShape, Task, split_chunk

LOG2E = 1.4426950408889634


class _Mem:
    def __init__(self, tensors: list[torch.Tensor]) -> None:
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


def _embed(t: Task, s: StepShape, mem: _Mem, meta: torch.Tensor) -> None:
    row0, rows, hidden, vocab = t.tile[:4]
    table = mem.at(t, 0, torch.bfloat16, vocab * hidden).view(vocab, hidden)
    out = mem.at(t, 1, torch.bfloat16).view(-1)
    for b in range(row0, row0 + rows):
        out[b * hidden:(b + 1) * hidden] = table[int(meta[s.ids_at + b])]


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """bf16(x * rsqrt(mean(x^2) + eps) * w) per row: RMS_NORM, and GEMV's NORM_IN."""
    xf = x.float()
    inv = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return ((xf * inv) * w.float()).to(torch.bfloat16)


def _rms_norm(t: Task, s: StepShape, mem: _Mem, meta: torch.Tensor) -> None:
    row0, rows, n = t.tile[:3]
    x = mem.at(t, 0, torch.bfloat16, (row0 + rows) * n).view(-1, n)[row0:]
    w = mem.at(t, 1, torch.bfloat16, n)
    out = mem.at(t, 2, torch.bfloat16, (row0 + rows) * n).view(-1, n)[row0:]
    out.copy_(_norm(x, w, s.rms_eps))


def _rows_of(t: Task, s: StepShape, mem: _Mem, i: int, k: int, stride: int) -> torch.Tensor:
    """batch rows of k bf16 at a row stride, from operand i."""
    raw = mem.at(t, i, torch.bfloat16, (s.batch - 1) * stride + k)
    return torch.stack([raw[b * stride:b * stride + k] for b in range(s.batch)])


def _silu_mul_values(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """bf16(bf16(silu(gate)) * up): SILU_MUL, and GEMV's SILU_IN."""
    gf = gate.float()
    return (_r(gf / (1 + torch.exp(-gf))) * up.float()).to(torch.bfloat16)


def _gemv_input(t: Task, s: StepShape, mem: _Mem) -> torch.Tensor:
    """What a GEMV stages as its input x [batch, K] (bf16), by its flags."""
    k, stride = t.tile[2], t.tile[5] or t.tile[2]
    if t.flags & Flag.MERGE_IN:
        return _merged(_partials(t, s, mem, 1), s).view(s.batch, k)
    if t.flags & Flag.SILU_IN:
        return _silu_mul_values(_rows_of(t, s, mem, 1, k, stride),
                                _rows_of(t, s, mem, 3, k, stride))
    x = _rows_of(t, s, mem, 1, k, stride)
    if t.flags & Flag.NORM_IN:
        return _norm(x, mem.at(t, 3, torch.bfloat16, k), s.rms_eps)
    return x


def _gemv(t: Task, s: StepShape, mem: _Mem, meta: torch.Tensor, f32: bool = False) -> None:
    row0, rows, k, n, col = t.tile[:5]
    x = _gemv_input(t, s, mem).float()

    def rows_of(i: int) -> torch.Tensor:  # x . W[rows]^T, rounded as a GEMV stores it
        w = mem.at(t, i, torch.bfloat16, (row0 + rows) * k).view(-1, k)[row0:]
        return _r(x @ w.float().T)

    y = rows_of(0)
    if t.flags & Flag.SILU_OUT:  # the gate rows' and the up rows' outputs, then SILU_MUL
        y = _silu_mul_values(y, rows_of(4)).float()
    dtype = torch.float32 if f32 else torch.bfloat16
    raw = mem.at(t, 2, dtype, (s.batch - 1) * n + col + row0 + rows)
    for b in range(s.batch):
        out = raw[b * n + col + row0:b * n + col + row0 + rows]
        if t.flags & Flag.RESIDUAL_OUT:
            out.copy_((out.float() + y[b]).to(dtype))
        else:
            out.copy_(y[b].to(dtype))


def _rope_row(x: torch.Tensor, w: torch.Tensor, cs: torch.Tensor, eps: float) -> torch.Tensor:
    """One head row: RMSNorm with w, then the neox rotation by the position's cos | sin."""
    half = x.shape[-1] // 2
    xf = x.float()
    y = _r(xf * torch.rsqrt(xf.pow(2).mean() + eps) * w.float())
    cos, sin = cs.float()[:half], cs.float()[half:]
    x1, x2 = y[:half], y[half:]
    return torch.cat([_r(x1 * cos) - _r(x2 * sin), _r(x2 * cos) + _r(x1 * sin)]).to(x.dtype)


def _rope(t: Task, s: StepShape, mem: _Mem, meta: torch.Tensor) -> None:
    row0, rows, nheads, d = t.tile[:4]
    x = mem.at(t, 0, torch.bfloat16, (row0 + rows) * d).view(-1, d)
    table = mem.at(t, 1, torch.bfloat16).view(-1, d)
    w = mem.at(t, 2, torch.bfloat16, d)
    cache = mem.at(t, 3, torch.bfloat16) if t.flags & Flag.APPEND_KV else None
    for r in range(row0, row0 + rows):
        b, head = divmod(r, nheads)
        x[r] = _rope_row(x[r], w, table[int(meta[s.positions_at + b])], s.rms_eps)
        if cache is not None:
            at = (int(meta[s.slots_at + b]) * nheads + head) * d
            cache[at:at + d] = x[r]


def _kv_append(t: Task, s: StepShape, mem: _Mem, meta: torch.Tensor) -> None:
    row0, rows, nheads, d = t.tile[:4]
    src = mem.at(t, 0, torch.bfloat16, (row0 + rows) * d).view(-1, d)
    cache = mem.at(t, 1, torch.bfloat16)
    for r in range(row0, row0 + rows):
        b, head = divmod(r, nheads)
        at = (int(meta[s.slots_at + b]) * nheads + head) * d
        cache[at:at + d] = src[r]


def _partials(t: Task, s: StepShape, mem: _Mem, i: int) -> torch.Tensor:
    g = s.num_heads // s.num_kv_heads
    return mem.at(t, i, torch.float32).view(-1)[
        :s.batch * s.num_kv_heads * s.max_splits * g * (s.head_dim + 2)].view(
        s.batch, s.num_kv_heads, s.max_splits, g, s.head_dim + 2)


def _split_q(t: Task, s: StepShape, mem: _Mem, meta: torch.Tensor,
             chunk: int) -> torch.Tensor:
    """The split's query heads [group, D] (bf16): read, or with ROPE_IN normalised and
    rotated from the q/k/v rows; the split holding the sequence's position (its `chunk`
    tokens from split * chunk) then also appends that token's rotated K and its V to the
    caches (operands b, c)."""
    seq, kvh, split, _, stride, k_col, v_col, q_col = t.tile
    d, g = s.head_dim, s.num_heads // s.num_kv_heads
    if not t.flags & Flag.ROPE_IN:
        q = mem.at(t, 0, torch.bfloat16, s.batch * s.num_heads * d).view(s.batch, s.num_heads, d)
        return q[seq, kvh * g:(kvh + 1) * g]
    row = mem.at(t, 0, torch.bfloat16, s.batch * stride)[seq * stride:(seq + 1) * stride]
    pos = int(meta[s.positions_at + seq])
    cs = mem.at(t, 4, torch.bfloat16).view(-1, d)[pos]
    q_w, k_w = mem.at(t, 5, torch.bfloat16, d), mem.at(t, 6, torch.bfloat16, d)
    q = torch.stack([_rope_row(row[q_col + h * d:q_col + (h + 1) * d], q_w, cs, s.rms_eps)
                     for h in range(kvh * g, (kvh + 1) * g)])
    if split * chunk <= pos < (split + 1) * chunk:
        at = (int(meta[s.slots_at + seq]) * s.num_kv_heads + kvh) * d
        mem.at(t, 1, torch.bfloat16)[at:at + d] = _rope_row(
            row[k_col + kvh * d:k_col + (kvh + 1) * d], k_w, cs, s.rms_eps)
        mem.at(t, 2, torch.bfloat16)[at:at + d] = row[v_col + kvh * d:v_col + (kvh + 1) * d]
    return q


def _attn_split(t: Task, s: StepShape, mem: _Mem, meta: torch.Tensor) -> None:
    seq, kvh, split = t.tile[:3]
    d = s.head_dim
    k_cache = mem.at(t, 1, torch.bfloat16).view(-1, s.page_size, s.num_kv_heads, d)
    v_cache = mem.at(t, 2, torch.bfloat16).view(-1, s.page_size, s.num_kv_heads, d)
    length = int(meta[s.context_lens_at + seq])
    chunk = split_chunk(t, s.max_splits, length)
    start, end = split * chunk, min(length, split * chunk + chunk)
    out = _partials(t, s, mem, 3)[seq, kvh, split]
    if end <= start:  # an empty split: no token, weight 0 in the merge
        out.zero_()
        out[:, d] = -math.inf
        return
    q = _split_q(t, s, mem, meta, chunk)
    table = meta[s.block_tables_at + seq * s.table_width:][:s.table_width]
    tok = torch.arange(start, end)
    pages = table[tok // s.page_size].long()
    k = k_cache[pages, tok % s.page_size, kvh].float()
    v = v_cache[pages, tok % s.page_size, kvh].float()
    qg = q.float() * (s.softmax_scale * LOG2E)
    scores = qg @ k.T  # [g, tokens], base 2
    m = scores.max(-1).values
    p = torch.exp2(scores - m[:, None])
    out[:, :d] = p @ v
    out[:, d] = m
    out[:, d + 1] = p.sum(-1)


def _merge(parts: torch.Tensor, d: int) -> torch.Tensor:
    """[splits, g, d + 2] split states -> [g, d] bf16 (0 where no split saw a token)."""
    m, ls = parts[..., d], parts[..., d + 1]
    m_all = m.max(0).values
    w = torch.where(ls > 0, torch.exp2(m - m_all), torch.zeros_like(m))
    num = (parts[..., :d] * w[..., None]).sum(0)
    den = (ls * w).sum(0)
    val = torch.where(den[:, None] > 0, num / den[:, None], torch.zeros_like(num))
    return val.to(torch.bfloat16)


def _merged(parts: torch.Tensor, s: StepShape) -> torch.Tensor:
    """Every (sequence, kv head)'s splits merged: [batch, heads, D] bf16 (MERGE_IN)."""
    return torch.stack([torch.cat([_merge(parts[b, h], s.head_dim)
                                   for h in range(s.num_kv_heads)]) for b in range(s.batch)])


def _attn_merge(t: Task, s: StepShape, mem: _Mem, meta: torch.Tensor) -> None:
    seq, kvh, splits = t.tile[:3]
    d, g = s.head_dim, s.num_heads // s.num_kv_heads
    parts = _partials(t, s, mem, 0)[seq, kvh, :splits]  # [splits, g, d + 2]
    out = mem.at(t, 1, torch.bfloat16, s.batch * s.num_heads * d).view(s.batch, s.num_heads, d)
    out[seq, kvh * g:(kvh + 1) * g] = _merge(parts, d)


def _cols(t: Task, s: StepShape, mem: _Mem, n_ops: int) -> list[torch.Tensor]:
    col0, cols, n = t.tile[:3]
    return [mem.at(t, i, torch.bfloat16, s.batch * n).view(s.batch, n)[:, col0:col0 + cols]
            for i in range(n_ops)]


def _silu_mul(t: Task, s: StepShape, mem: _Mem, meta: torch.Tensor) -> None:
    gate, up, out = _cols(t, s, mem, 3)
    out.copy_(_silu_mul_values(gate, up))


def _residual_add(t: Task, s: StepShape, mem: _Mem, meta: torch.Tensor) -> None:
    x, y = _cols(t, s, mem, 2)
    x.copy_((x.float() + y.float()).to(torch.bfloat16))


OPS = {Opcode.NOP: lambda *a: None, Opcode.EMBED: _embed, Opcode.RMS_NORM: _rms_norm,
       Opcode.GEMV: _gemv, Opcode.LOGITS: lambda t, s, m, meta: _gemv(t, s, m, meta, True),
       Opcode.ROPE: _rope, Opcode.KV_APPEND: _kv_append, Opcode.ATTN_SPLIT: _attn_split,
       Opcode.ATTN_MERGE: _attn_merge, Opcode.SILU_MUL: _silu_mul,
       Opcode.RESIDUAL_ADD: _residual_add,
       Opcode.PREFETCH_L2: lambda *a: None}  # a cache hint: nothing to compute
