"""The Qwen3 architecture in torch over a paged KV cache: what rowgate's reference
engine runs (`rowgate.engines.reference`) and the megakernel work mirrors.

The config and weights are the same config.json + model.safetensors vLLM reads. The
cache is paged (block table, page size 16); attention over it is a parameter
(`DecodeAttention`): the torch implementation here on a CPU, the kernels of
`src/rowgate/ops` with the same signature on a GPU. `DecodeGraphs` captures the decode
step as CUDA graphs, one per batch size.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from rowgate.engines.interface import EngineError

PAGE_SIZE = 16

DecodeAttention = Callable[..., torch.Tensor]
"""`(q[B,H,D], k_cache[N,P,KV,D], v_cache[N,P,KV,D], block_tables[B,M] int32,
context_lens[B] int32, scale) -> out[B,H,D]`: one query token per sequence,
attending to the first `context_lens[b]` cached tokens of its block table."""

Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""`attend(layer, q, k, v) -> out`: one layer's attention in `Qwen3Model.forward`."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                 block_tables: torch.Tensor, context_lens: torch.Tensor,
                                 scale: float) -> torch.Tensor:
    """Paged decode attention in torch ops (static shapes, so CUDA-graph capturable)."""
    b, h, d = q.shape
    kv = k_cache.shape[2]
    tokens = block_tables.shape[1] * k_cache.shape[1]
    k = k_cache[block_tables].reshape(b, tokens, kv, d)
    v = v_cache[block_tables].reshape(b, tokens, kv, d)
    qg = q.view(b, kv, h // kv, d)
    scores = torch.einsum("bkgd,btkd->bkgt", qg.float(), k.float()) * scale
    pad = torch.arange(tokens, device=q.device)[None, :] >= context_lens[:, None]
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    out = torch.einsum("bkgt,btkd->bkgd", scores.softmax(-1), v.float())
    return out.reshape(b, h, d).to(q.dtype)


# -------------------------------------------------------------------- model


@dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int
    eos_token_id: int

    @classmethod
    def load(cls, path: Path) -> "Qwen3Config":
        try:
            c = json.loads((path / "config.json").read_text())
            rope = c.get("rope_parameters") or {}
            eos = c.get("eos_token_id", 0)
            return cls(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                       num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                       num_kv_heads=c["num_key_value_heads"],
                       head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                       rms_norm_eps=c["rms_norm_eps"],
                       rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
                       max_position=c["max_position_embeddings"],
                       eos_token_id=eos[0] if isinstance(eos, list) else eos)
        except (OSError, ValueError, KeyError) as exc:
            raise EngineError(f"{path}/config.json: not a readable Qwen3 config") from exc


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary embedding (rotate halves), as Qwen3 uses. cos/sin: [T, D/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Qwen3Model:
    """Weights + forward passes over a paged KV cache."""

    def __init__(self, path: Path, device: str, dtype: torch.dtype,
                 decode_attention: DecodeAttention):
        from safetensors.torch import load_file

        self.cfg = Qwen3Config.load(path)
        raw: dict[str, torch.Tensor] = {}
        try:
            for shard in sorted(path.glob("*.safetensors")):
                raw.update(load_file(str(shard), device="cpu"))
        except (OSError, ValueError) as exc:
            raise EngineError(f"{path}: cannot load its safetensors") from exc
        if not raw:
            raise EngineError(f"{path}: no *.safetensors weights")
        raw.setdefault("lm_head.weight", raw["model.embed_tokens.weight"])  # tied embeddings
        self.w = {k: v.to(device=device, dtype=dtype) for k, v in raw.items()}
        self.device, self.dtype = device, dtype
        self.decode_attention = decode_attention
        self.scale = self.cfg.head_dim ** -0.5
        # Same float32 derivation as HF / vLLM's rotary cache.
        inv_freq = 1.0 / (self.cfg.rope_theta ** (
            torch.arange(0, self.cfg.head_dim, 2, dtype=torch.int64).float() / self.cfg.head_dim))
        freqs = torch.outer(torch.arange(self.cfg.max_position, dtype=torch.float32), inv_freq)
        self.cos = freqs.cos().to(device=device, dtype=dtype)
        self.sin = freqs.sin().to(device=device, dtype=dtype)

    def _qkv(self, i: int, x: torch.Tensor,
             positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c, p = self.cfg, f"model.layers.{i}.self_attn."
        t = x.shape[0]
        q = (x @ self.w[p + "q_proj.weight"].T).view(t, c.num_heads, c.head_dim)
        k = (x @ self.w[p + "k_proj.weight"].T).view(t, c.num_kv_heads, c.head_dim)
        v = (x @ self.w[p + "v_proj.weight"].T).view(t, c.num_kv_heads, c.head_dim)
        q = rms_norm(q, self.w[p + "q_norm.weight"], c.rms_norm_eps)
        k = rms_norm(k, self.w[p + "k_norm.weight"], c.rms_norm_eps)
        cos, sin = self.cos[positions], self.sin[positions]
        return rope(q, cos, sin), rope(k, cos, sin), v

    def _mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        p = f"model.layers.{i}.mlp."
        gate = x @ self.w[p + "gate_proj.weight"].T
        up = x @ self.w[p + "up_proj.weight"].T
        return (F.silu(gate) * up) @ self.w[p + "down_proj.weight"].T

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                cache: "PagedKVCache", attend: Attend) -> torch.Tensor:
        """Logits of each token; K/V written to `slots`; `attend(layer, q, k, v)` -> out."""
        c = self.cfg
        x = self.w["model.embed_tokens.weight"][ids]
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], c.rms_norm_eps)
            q, k, v = self._qkv(i, h, positions)
            cache.write(i, slots, k, v)
            a = attend(i, q, k, v).reshape(x.shape[0], c.num_heads * c.head_dim)
            x = x + a @ self.w[p + "self_attn.o_proj.weight"].T
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            x = x + self._mlp(i, h)
        x = rms_norm(x, self.w["model.norm.weight"], c.rms_norm_eps)
        return (x @ self.w["lm_head.weight"].T).float()

    def prefill(self, ids: torch.Tensor, slots: torch.Tensor,
                cache: "PagedKVCache") -> torch.Tensor:
        """One sequence's prompt, causal attention over itself; returns last-token logits."""
        positions = torch.arange(ids.shape[0], device=self.device)
        group = self.cfg.num_heads // self.cfg.num_kv_heads

        def attend(_i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1),
                v.repeat_interleave(group, 1).transpose(0, 1), is_causal=True, scale=self.scale)
            return out.transpose(0, 1)

        return self.forward(ids, positions, slots, cache, attend)[-1]

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               block_tables: torch.Tensor, context_lens: torch.Tensor,
               cache: "PagedKVCache") -> torch.Tensor:
        """One new token per sequence, attending to its paged cache; returns logits [B, V]."""

        def attend(i: int, q: torch.Tensor, _k: torch.Tensor, _v: torch.Tensor) -> torch.Tensor:
            return self.decode_attention(q, cache.k[i], cache.v[i], block_tables, context_lens,
                                         self.scale)

        return self.forward(ids, positions, slots, cache, attend)


class PagedKVCache:
    """Per-layer K/V pages `[1 + num_blocks, PAGE_SIZE, kv_heads, head_dim]` and a free list.

    Block 0 is never handed out: block tables are padded with it and CUDA-graph
    capture writes its scratch K/V there, so no live sequence is touched.
    """

    def __init__(self, cfg: Qwen3Config, num_blocks: int, device: str, dtype: torch.dtype):
        shape = (1 + num_blocks, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.num_blocks = num_blocks
        self.free = deque(range(1, 1 + num_blocks))

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer].view(-1, *k.shape[1:]).index_copy_(0, slots, k)
        self.v[layer].view(-1, *v.shape[1:]).index_copy_(0, slots, v)

    def allocate(self) -> int:
        if not self.free:
            raise EngineError("reference engine: KV cache out of blocks")
        return self.free.popleft()

    def release(self, blocks: list[int]) -> None:
        self.free.extend(blocks)


Static = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""A captured decode step's inputs: ids, positions, slots, block tables, context lengths."""


class DecodeGraphs:
    """CUDA graphs of the decode step, one per batch size, over fixed-width block tables."""

    def __init__(self, model: Qwen3Model):
        self.model = model
        self.width = math.ceil(model.cfg.max_position / PAGE_SIZE)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, Static, torch.Tensor]] = {}
        self.cache: PagedKVCache | None = None

    def reset(self, cache: PagedKVCache) -> None:
        self.cache, self.graphs = cache, {}

    def _capture(self, batch: int) -> tuple[torch.cuda.CUDAGraph, Static, torch.Tensor]:
        dev, cache = self.model.device, self.cache
        if cache is None:
            raise EngineError("decode graphs: reset(cache) before run()")
        static: Static = (torch.zeros(batch, dtype=torch.long, device=dev),
                          torch.zeros(batch, dtype=torch.long, device=dev),
                          torch.zeros(batch, dtype=torch.long, device=dev),
                          torch.zeros(batch, self.width, dtype=torch.int32, device=dev),
                          torch.ones(batch, dtype=torch.int32, device=dev))
        # Warm up on a side stream (allocator, lazy kernels) before capture.
        # Slot 0 is a scratch write: real slots are copied in before each replay.
        # torch's Stream.__new__ is unannotated (and torch is Any where it is not installed).
        stream = torch.cuda.Stream()  # type: ignore[no-untyped-call,unused-ignore]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.model.decode(*static, cache)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self.model.decode(*static, cache)
        return graph, static, out

    def run(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
            tables: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
        batch = ids.shape[0]
        if batch not in self.graphs:
            self.graphs[batch] = self._capture(batch)
        graph, static, out = self.graphs[batch]
        padded = torch.zeros(batch, self.width, dtype=torch.int32, device=tables.device)
        padded[:, :tables.shape[1]] = tables
        for dst, src in zip(static, (ids, positions, slots, padded, context_lens)):
            dst.copy_(src)
        graph.replay()
        return out.clone()
