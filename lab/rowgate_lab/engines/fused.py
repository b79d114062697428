"""The reference engine in mode `graph-fused`: the strongest conventional decode step
the device runs, the baseline a persistent kernel must beat.

Same weights, same tokens, a faster path: q/k/v and gate/up are one projection each
(the weights concatenated once at load, cuBLAS GEMMs), the K/V cache is paged bf16 in
the layout of rowgate's split-KV decode-attention kernel (`[pages, kv heads, page,
head dim]`, `kernels/decode_attention/split_kv.cu`, its bf16 baseline variant), each
layer's norms, head norms, RoPE, SiLU·mul and residual adds are
`torch.compile`d around the GEMMs (`mode="max-autotune-no-cudagraphs"` by default:
inductor fuses the small ops into few kernels and may fuse epilogues into its own
GEMMs), and the whole decode step is captured in one CUDA graph per batch size.

On a CPU (the tests) the same fused step runs eagerly with attention in torch on the
same cache layout; the route each part took, and why a faster one was not, is in
`describe()` (`fused_route`, `fused_attention`, `fused_compile`, `fused_compile_cache`),
which the gates seal.
Prefill is the reference engine's (it reads the same weights, views of the fused
ones, and writes the same cache through `FusedKVCache.write`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from rowgate.engines import compile_cache_dir, use_compile_cache
from rowgate.engines.interface import EngineError, WorkloadPass
from rowgate.engines.qwen3 import (
    DTYPES,
    PAGE_SIZE,
    DecodeGraphs,
    PagedKVCache,
    Qwen3Config,
    Qwen3Model,
    rms_norm,
    rope,
)
from rowgate.engines.reference import ReferenceEngine

MODE = "graph-fused"
COMPILE_MODES = ("max-autotune-no-cudagraphs", "max-autotune", "default", "reduce-overhead",
                 "none")
"""`fused_compile` values; `none` runs the fused step uncompiled (still one graph)."""
WARM_MARKER = "fused-warm.json"
"""Written into a compile cache by lab/benchmarks/fused_warm.py when it installs the fastest
of N compiles: which compile, of how many, and each one's times."""
Stage = Callable[..., Any]
"""A fused stage: the plain function, or torch.compile's wrapper of it (untyped)."""
Attend = Callable[..., torch.Tensor]
"""(q, k_cache, v_cache, block_tables, context_lens, scale) -> attention output."""


class FusedKVCache(PagedKVCache):
    """Pages `[1 + num_blocks, kv_heads, PAGE_SIZE, head_dim]`: a (page, kv head) is one
    contiguous slab, as split_kv reads it. Block 0 is the padding block (as the
    reference cache's)."""

    def __init__(self, cfg: Qwen3Config, num_blocks: int, device: str,
                 dtype: torch.dtype) -> None:
        super().__init__(cfg, 0, device, dtype)
        shape = (1 + num_blocks, cfg.num_kv_heads, PAGE_SIZE, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.num_blocks = num_blocks
        self.free.extend(range(1, 1 + num_blocks))

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        page, off = slots // PAGE_SIZE, slots % PAGE_SIZE
        self.k[layer][page, :, off] = k
        self.v[layer][page, :, off] = v


def torch_fused_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, context_lens: torch.Tensor,
                          scale: float) -> torch.Tensor:
    """Decode attention in torch over a `[pages, kv, page, D]` cache (the CPU path)."""
    b, h, d = q.shape
    kv, page = k_cache.shape[1], k_cache.shape[2]
    tokens = block_tables.shape[1] * page
    k = k_cache[block_tables].permute(0, 2, 1, 3, 4).reshape(b, kv, tokens, d)
    v = v_cache[block_tables].permute(0, 2, 1, 3, 4).reshape(b, kv, tokens, d)
    qg = q.view(b, kv, h // kv, d)
    scores = torch.einsum("bkgd,bktd->bkgt", qg.float(), k.float()) * scale
    pad = torch.arange(tokens, device=q.device)[None, :] >= context_lens[:, None]
    scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
    out = torch.einsum("bkgt,bktd->bkgd", scores.softmax(-1), v.float())
    return out.reshape(b, h, d).to(q.dtype)


def _pre(x: torch.Tensor, w_qkv: torch.Tensor, ln: torch.Tensor, q_norm: torch.Tensor,
         k_norm: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, heads: int,
         kv_heads: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input norm, one q|k|v projection, head norms and RoPE."""
    t = x.shape[0]
    qkv = rms_norm(x, ln, eps) @ w_qkv.T
    q, k, v = torch.split(qkv, [heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q = rms_norm(q.reshape(t, heads, dim), q_norm, eps)
    k = rms_norm(k.reshape(t, kv_heads, dim), k_norm, eps)
    return rope(q, cos, sin), rope(k, cos, sin), v.reshape(t, kv_heads, dim)


def _post(x: torch.Tensor, a: torch.Tensor, w_o: torch.Tensor, ln: torch.Tensor,
          w_gu: torch.Tensor, w_down: torch.Tensor, eps: float, inter: int) -> torch.Tensor:
    """o projection and residual, post-attention norm, one gate|up projection,
    SiLU·mul, down projection and residual."""
    x = x + a @ w_o.T
    gate, up = torch.split(rms_norm(x, ln, eps) @ w_gu.T, [inter, inter], dim=-1)
    return x + (F.silu(gate) * up) @ w_down.T


def _final(x: torch.Tensor, norm: torch.Tensor, lm_head: torch.Tensor,
           eps: float) -> torch.Tensor:
    return (rms_norm(x, norm, eps) @ lm_head.T).float()


class FusedModel(Qwen3Model):
    """Qwen3Model with q|k|v and gate|up concatenated (the per-projection weights stay
    as row views of them: prefill and every other reader see the same tensors)."""

    def __init__(self, path: Path, device: str, dtype: torch.dtype, compile_mode: str):
        super().__init__(path, device, dtype, torch_fused_attention)
        self.qkv, self.gate_up = [], []
        for i in range(self.cfg.num_layers):
            self.qkv.append(self._concat(f"model.layers.{i}.self_attn.",
                                         ("q_proj", "k_proj", "v_proj")))
            self.gate_up.append(self._concat(f"model.layers.{i}.mlp.", ("gate_proj", "up_proj")))
        self.inter = self.gate_up[0].shape[0] // 2
        self.scale = self.cfg.head_dim ** -0.5
        self.stages: tuple[Stage, Stage, Stage] = (_pre, _post, _final)
        self.compiled = "no (CPU: eager)" if not str(device).startswith("cuda") else "no"
        self.attention_of: Callable[[int], Attend] | None = None
        """Set by the engine on CUDA: batch -> an attention callable (split_kv)."""
        if compile_mode != "none" and str(device).startswith("cuda"):
            # In this process as in an engine subprocess: the compile cache rowgate
            # chooses (its cache dir), so a gate run after another on the same machine
            # (the trace gate's compile, then the throughput gate's; one run, then the
            # next on a kept cache) reuses max-autotune's choices instead of
            # re-benchmarking every GEMM shape (~6 s each), and runs the same kernels.
            use_compile_cache()
            self.stages = (self._compiled(_pre, compile_mode),
                           self._compiled(_post, compile_mode),
                           self._compiled(_final, compile_mode))
            self.compiled = compile_mode

    @staticmethod
    def _compiled(stage: Stage, mode: str) -> Stage:
        compiled: Stage = torch.compile(stage, mode=mode, dynamic=False, fullgraph=True)
        return compiled

    def _concat(self, prefix: str, names: tuple[str, ...]) -> torch.Tensor:
        parts = [self.w[prefix + n + ".weight"] for n in names]
        fused = torch.cat(parts)
        # the per-projection names become row views of the fused weight: the separate
        # copies are freed, and prefill reads the very same values
        for n, view in zip(names, torch.split(fused, [t.shape[0] for t in parts])):
            self.w[prefix + n + ".weight"] = view
        return fused

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               block_tables: torch.Tensor, context_lens: torch.Tensor,
               cache: PagedKVCache) -> torch.Tensor:
        """The fused decode step: logits [B, V] (fp32 of the bf16 lm_head output)."""
        c = self.cfg
        pre, post, final = self.stages
        attend = (self.attention_of(ids.shape[0]) if self.attention_of is not None
                  else torch_fused_attention)
        cos, sin = self.cos[positions], self.sin[positions]
        x = self.w["model.embed_tokens.weight"][ids]
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            q, k, v = pre(x, self.qkv[i], self.w[p + "input_layernorm.weight"],
                          self.w[p + "self_attn.q_norm.weight"],
                          self.w[p + "self_attn.k_norm.weight"], cos, sin, c.rms_norm_eps,
                          c.num_heads, c.num_kv_heads, c.head_dim)
            cache.write(i, slots, k, v)
            a = attend(q.contiguous(), cache.k[i], cache.v[i], block_tables, context_lens,
                       self.scale)
            x = post(x, a.reshape(x.shape[0], -1), self.w[p + "self_attn.o_proj.weight"],
                     self.w[p + "post_attention_layernorm.weight"], self.gate_up[i],
                     self.w[p + "mlp.down_proj.weight"], c.rms_norm_eps, self.inter)
        logits: torch.Tensor = final(x, self.w["model.norm.weight"], self.w["lm_head.weight"],
                                     c.rms_norm_eps)
        return logits


def compile_cache_note(compiled: bool) -> str:
    """Where torch.compile's cache is and what it held, for the sealed description: a
    baseline compiled from lab/benchmarks/fused_warm.py's best of N says so (with its
    scores), one compiled fresh says it was one draw; and how many of this process's
    compiled graphs came from the cache (inductor's counters)."""
    if not compiled:
        return "none (not compiled)"
    from torch._dynamo.utils import counters

    cache = compile_cache_dir()  # where use_compile_cache pointed the compile
    hits, misses = (counters["inductor"].get(k, 0)
                    for k in ("fxgraph_cache_hit", "fxgraph_cache_miss"))
    note = f"{cache}: {hits} graph(s) from the cache, {misses} compiled here"
    try:
        warm = json.loads((cache / WARM_MARKER).read_text())
        scores = ", ".join(f"{c['score']:.3f}" for c in warm["compiles"])
        return (f"{note}; the cache of compile {warm['chosen']}, the fastest of "
                f"{len(warm['compiles'])} (lab/benchmarks/fused_warm.py; scores {scores})")
    except (OSError, ValueError, KeyError, TypeError):
        return f"{note}; no best-of-N record (one compile, as drawn)"


class FusedEngine(ReferenceEngine):
    """rowgate's reference engine, mode `graph-fused` (see the module docstring)."""

    name = "reference"

    def __init__(self, model_dir: Path, *, device: str = "cpu", dtype: str = "bfloat16",
                 compile_mode: str = COMPILE_MODES[0], cubin: str | None = None,
                 nvcc: str | None = None, max_blocks: int = 0, chunk: int | None = None):
        if compile_mode not in COMPILE_MODES:
            raise EngineError(f"graph-fused engine: fused_compile {compile_mode!r} is not one "
                              f"of {', '.join(COMPILE_MODES)}")
        super().__init__(model_dir, device=device, mode="eager", dtype=dtype,
                         max_blocks=max_blocks)
        self.mode = MODE
        self.compile_mode, self.cubin, self.nvcc = compile_mode, cubin, nvcc
        self.chunk = chunk
        """split_kv's tokens per split (None: the contract's plan, sized for max_position
        and the batch; at batch 1 that is 128-token splits, 8 per kv head)."""
        self.attention = "torch (fused cache layout)"
        self.route = "graph" if device.startswith("cuda") else "eager: no CUDA device, " \
            "so no CUDA graph and no torch.compile"
        self.fused: FusedModel | None = None
        """`self.model` as the fused model it is (None before start())."""

    def start(self) -> None:
        from rowgate.models.tiny import model_info

        self._digest = model_info(self.model_dir).digest
        self.model = self.fused = FusedModel(self.model_dir, self.device, DTYPES[self.dtype],
                                             self.compile_mode)
        if self.device.startswith("cuda"):
            self.fused.attention_of = self._attention(self.fused.cfg)
            self._graphs = DecodeGraphs(self.fused)

    def describe(self) -> dict[str, str]:
        d = super().describe()
        d.update(mode=MODE, decode_attention=self.attention, fused_route=self.route,
                 fused_compile=self.fused.compiled if self.fused is not None else "",
                 fused_compile_cache=compile_cache_note(
                     self.fused is not None and self.fused.compiled in COMPILE_MODES),
                 fused_projections=json.dumps(["q|k|v", "gate|up"]))
        return d

    def _ensure_cache(self, work: WorkloadPass) -> None:
        # The reference engine's sizing, with the fused cache layout.
        if self.fused is None:
            raise EngineError("graph-fused engine: a pass before start()")
        cfg = self.fused.cfg
        longest = max(len(r.prompt_ids) + r.max_tokens for r in work.requests)
        if longest > cfg.max_position:
            raise EngineError(f"{work.cell}: {longest} tokens exceed the model's "
                              f"max_position_embeddings {cfg.max_position}")
        need = max(self.max_blocks, work.concurrency * math.ceil(longest / PAGE_SIZE))
        if self.cache is None or self.cache.num_blocks < need:
            self.cache = FusedKVCache(cfg, need, self.device, DTYPES[self.dtype])
            if self._graphs is not None:
                self._graphs.reset(self.cache)

    def _attention(self, c: Qwen3Config) -> Callable[[int], Attend]:
        """batch -> attention callable: split_kv's bf16 baseline where it applies (one plan
        per batch size, planned for max_position so a CUDA graph serves every length),
        else torch; the choice and its reason go to describe()."""
        why = []
        if self.dtype != "bfloat16":
            why.append(f"dtype {self.dtype} (split_kv: bfloat16 or E5M2 caches)")
        if c.head_dim not in (64, 128) or c.num_heads % c.num_kv_heads or \
                c.num_heads // c.num_kv_heads not in (2, 4, 8):
            why.append(f"head_dim {c.head_dim}, GQA group {c.num_heads / c.num_kv_heads:g} "
                       f"(split_kv: 64/128, 2/4/8)")
        if not why:
            try:
                cubin = self._split_kv_cubin()
            except Exception as exc:  # no toolchain / cuda-core here: torch attention
                why.append(f"split_kv unavailable: {type(exc).__name__}: {exc}"[:300])
        if why:
            self.attention = "torch (fused cache layout): " + "; ".join(why)
            return lambda batch: torch_fused_attention
        from rowgate_lab.ops.split_kv import DecodeAttention

        plans: dict[tuple[int, ...], DecodeAttention] = {}
        self.attention = f"split_kv bf16 baseline ({Path(cubin).name}" + (
            f", {self.chunk}-token splits)" if self.chunk else ")")

        def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   block_tables: torch.Tensor, context_lens: torch.Tensor,
                   scale: float) -> torch.Tensor:
            # one plan per batch and cache (a grown cache is a new shape: a plan refuses
            # shapes it was not made for); made in DecodeGraphs' warm-up, outside capture,
            # which validates and admits the graph's static block tables and lengths
            key = (q.shape[0], *k_cache.shape)
            if key not in plans:
                try:
                    plans[key] = DecodeAttention(q, k_cache, v_cache, block_tables,
                                                 context_lens, max_seq_len=c.max_position,
                                                 cubin=Path(cubin), softmax_scale=scale,
                                                 chunk=self.chunk)
                except ValueError as exc:  # a fused_chunk the contract refuses
                    raise EngineError(f"graph-fused engine: fused_chunk {self.chunk}: "
                                      f"{exc}") from None
            return plans[key].run(q, k_cache, v_cache, block_tables, context_lens)

        return lambda batch: attend

    def _split_kv_cubin(self) -> str:
        if self.cubin:
            return self.cubin
        from rowgate_lab.ops.split_kv import LAB, build_cubin

        major, minor = torch.cuda.get_device_capability(torch.device(self.device))
        return str(build_cubin(LAB, f"sm_{major}{minor}", self.nvcc))
