"""rowgate's own decode engine for Qwen3-architecture models: torch, paged KV cache.

It reads the same config.json + model.safetensors as vLLM and runs the decode
loop itself: a paged KV cache (block table, page size 16), continuous batching
at the pass's concurrency, greedy or seeded sampling. Attention over the paged
cache is a parameter (`decode_attention`): on a CPU the torch implementation
(`rowgate.engines.qwen3`, with the model); on a GPU the kernels of `src/rowgate/ops`
plug in with the same signature.
Mode `graph` (CUDA only) replays the decode step from a captured CUDA graph;
sampling stays outside the graph.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from rowgate import __version__
from rowgate.engines.interface import Engine, EngineError, PassResult, Request, RequestOutput, WorkloadPass
from rowgate.engines.qwen3 import (
    DTYPES,
    PAGE_SIZE,
    DecodeAttention,
    DecodeGraphs,
    PagedKVCache,
    Qwen3Model,
    torch_paged_decode_attention,
)
from rowgate.models.tiny import model_info

# ----------------------------------------------------------------- sampling


ALTERNATIVES = 4
"""Other tokens kept per generated token (RequestOutput.alternatives)."""


def sample(logits: torch.Tensor, work: WorkloadPass,
           generators: list[torch.Generator | None]
           ) -> tuple[list[int], list[float], list[tuple[tuple[int, float], ...]]]:
    """Next token per row, its log-probability under the raw (unscaled) distribution,
    and the ALTERNATIVES most likely other tokens with their log-probabilities.

    Greedy when temperature is 0 (argmax, first index on ties); otherwise
    temperature, top-k, top-p, then one draw from each request's own seeded
    generator, so a request's tokens do not depend on its batch neighbours.
    """
    logprobs = torch.log_softmax(logits, dim=-1)
    if work.temperature == 0.0:
        ids = logits.argmax(dim=-1)
    else:
        scaled = logits / work.temperature
        if work.top_k > 0:
            kth = scaled.topk(min(work.top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if work.top_p < 1.0:
            sorted_l, order = scaled.sort(dim=-1, descending=True)
            probs = sorted_l.softmax(-1)
            drop = probs.cumsum(-1) - probs > work.top_p  # keep the token that crosses top_p
            sorted_l = sorted_l.masked_fill(drop, float("-inf"))
            scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_l)
        probs = scaled.softmax(-1)
        ids = torch.cat([torch.multinomial(probs[r], 1, generator=g)
                         for r, g in enumerate(generators)])
    chosen = logprobs.gather(-1, ids[:, None])
    k = min(ALTERNATIVES, logits.shape[-1] - 1)
    others = logprobs.scatter(-1, ids[:, None], float("-inf")).topk(k, dim=-1)
    # One device-to-host read a step, not four: each read is a synchronisation and a copy
    # the GPU idles through. float64 holds every token id (< 2**53) and every bf16 / fp32
    # log-probability exactly, so the values are those the four reads returned.
    rows = torch.cat([ids[:, None].double(), chosen.double(), others.indices.double(),
                      others.values.double()], dim=1).tolist()
    return ([int(r[0]) for r in rows], [r[1] for r in rows],
            [tuple(zip(map(int, r[2:2 + k]), r[2 + k:])) for r in rows])


def step_inputs(tokens: list[int], positions: list[int], slots: list[int],
                tables: list[list[int]], device: str | torch.device
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A decode step's inputs on `device` in one host-to-device copy (five before; each a
    synchronous copy the GPU idles through): ids, positions and slots int64, the block
    tables [batch, width] and context lengths (position + 1) int32, each contiguous."""
    b = len(tokens)
    flat = torch.tensor([*tokens, *positions, *slots, *(p + 1 for p in positions),
                         *(x for row in tables for x in row)], dtype=torch.int32)
    dev = flat.to(device)
    longs = dev[:3 * b].view(3, b).long()  # one conversion for the three int64 inputs
    return (longs[0], longs[1], longs[2], dev[4 * b:].view(b, -1), dev[3 * b:4 * b])


# ------------------------------------------------------------------- engine


class DecodeSteps(Protocol):
    """What runs the decode step where the engine keeps it: its CUDA graphs
    (`DecodeGraphs`) or the persistent engine's step router."""

    def reset(self, cache: PagedKVCache) -> None: ...

    def run(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
            tables: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor: ...


@dataclass
class _Seq:
    request: Request
    admitted: float
    blocks: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    alternatives: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    generator: torch.Generator | None = None

    @property
    def length(self) -> int:
        return len(self.request.prompt_ids) + len(self.tokens)

    def output(self) -> RequestOutput:
        itl = tuple(b - a for a, b in zip(self.times, self.times[1:]))
        return RequestOutput(id=self.request.id, token_ids=tuple(self.tokens),
                             logprobs=tuple(self.logprobs),
                             alternatives=tuple(self.alternatives),
                             ttft_s=self.times[0] - self.admitted if self.times else None,
                             latency_s=(self.times[-1] if self.times else self.admitted)
                             - self.admitted, itl_s=itl)


class ReferenceEngine(Engine):
    """rowgate's decode engine; `mode` eager (any device) or graph (CUDA)."""

    name = "reference"

    def __init__(self, model_dir: Path, *, device: str = "cpu", mode: str = "eager",
                 dtype: str = "float32", decode_attention: DecodeAttention | None = None,
                 max_blocks: int = 0):
        if mode not in ("eager", "graph", "default"):
            raise EngineError(f"reference engine: mode {mode!r} is not eager or graph")
        if mode == "graph" and not device.startswith("cuda"):
            raise EngineError(f"reference engine: mode graph needs a CUDA device, not {device!r}")
        if dtype not in DTYPES:
            raise EngineError(f"reference engine: dtype {dtype!r} is not one of {sorted(DTYPES)}")
        self.model_dir = Path(model_dir)
        self.device, self.mode, self.dtype = device, "eager" if mode == "default" else mode, dtype
        self.decode_attention = decode_attention or torch_paged_decode_attention
        self.max_blocks = max_blocks
        self.model: Qwen3Model | None = None
        self.cache: PagedKVCache | None = None
        self._graphs: DecodeSteps | None = None
        self._digest = ""

    # -- lifecycle

    def start(self) -> None:
        self._digest = model_info(self.model_dir).digest
        self.model = Qwen3Model(self.model_dir, self.device, DTYPES[self.dtype],
                                self.decode_attention)
        if self.mode == "graph":
            self._graphs = DecodeGraphs(self.model)

    def stop(self) -> None:
        self.model = self.cache = self._graphs = None

    def describe(self) -> dict[str, str]:
        return {"engine": "reference", "version": f"rowgate {__version__}",
                "torch": torch.__version__, "device": self.device, "mode": self.mode,
                "dtype": self.dtype, "page_size": str(PAGE_SIZE),
                "decode_attention": getattr(self.decode_attention, "__qualname__",
                                            repr(self.decode_attention)),
                "model_path": str(self.model_dir), "model_digest": self._digest}

    @property
    def _live_model(self) -> Qwen3Model:
        if self.model is None:
            raise EngineError("reference engine: used before start()")
        return self.model

    @property
    def _live_cache(self) -> PagedKVCache:
        if self.cache is None:
            raise EngineError("reference engine: no KV cache outside generate()")
        return self.cache

    # -- one pass

    def _ensure_cache(self, work: WorkloadPass) -> None:
        longest = max(len(r.prompt_ids) + r.max_tokens for r in work.requests)
        model = self._live_model
        if longest > model.cfg.max_position:
            raise EngineError(f"{work.cell}: {longest} tokens exceed the model's "
                              f"max_position_embeddings {model.cfg.max_position}")
        need = max(self.max_blocks, work.concurrency * math.ceil(longest / PAGE_SIZE))
        if self.cache is None or self.cache.num_blocks < need:
            self.cache = PagedKVCache(model.cfg, need, self.device, DTYPES[self.dtype])
            if self._graphs is not None:
                self._graphs.reset(self.cache)

    def _slots(self, seq: _Seq, start: int, stop: int) -> list[int]:
        while len(seq.blocks) * PAGE_SIZE < stop:
            seq.blocks.append(self._live_cache.allocate())
        return [seq.blocks[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE for p in range(start, stop)]

    def _admit(self, request: Request, work: WorkloadPass) -> _Seq:
        seq = _Seq(request=request, admitted=time.perf_counter())
        if work.temperature > 0.0:
            seq.generator = torch.Generator(device=self.device).manual_seed(request.seed)
        n = len(request.prompt_ids)
        ids = torch.tensor(request.prompt_ids, device=self.device)
        slots = torch.tensor(self._slots(seq, 0, n), device=self.device)
        logits = self._live_model.prefill(ids, slots, self._live_cache)[None]
        self._append([seq], logits, work)
        return seq

    def _append(self, seqs: list[_Seq], logits: torch.Tensor, work: WorkloadPass) -> None:
        ids, lps, alternatives = sample(logits, work, [s.generator for s in seqs])
        now = time.perf_counter()
        for seq, tok, lp, alt in zip(seqs, ids, lps, alternatives):
            seq.tokens.append(tok)
            seq.logprobs.append(lp)
            seq.alternatives.append(alt)
            seq.times.append(now)

    def _decode_step(self, seqs: list[_Seq], work: WorkloadPass) -> None:
        # The newest token is not in the cache yet: it is this step's input.
        positions = [s.length - 1 for s in seqs]
        slots = [self._slots(s, p, p + 1)[0] for s, p in zip(seqs, positions)]
        width = max(len(s.blocks) for s in seqs)
        tables = [s.blocks + [0] * (width - len(s.blocks)) for s in seqs]
        args = step_inputs([s.tokens[-1] for s in seqs], positions, slots, tables, self.device)
        if self._graphs is not None:
            logits = self._graphs.run(*args)
        else:
            logits = self._live_model.decode(*args, self._live_cache)
        self._append(seqs, logits, work)

    def _done(self, seq: _Seq, work: WorkloadPass) -> bool:
        if len(seq.tokens) >= seq.request.max_tokens:
            return True
        return not work.ignore_eos and seq.tokens[-1] == self._live_model.cfg.eos_token_id

    def generate(self, work: WorkloadPass) -> PassResult:
        if self.model is None:
            raise EngineError("reference engine: generate() before start()")
        self._ensure_cache(work)
        waiting = deque(work.requests)
        running: list[_Seq] = []
        finished: dict[str, RequestOutput] = {}
        start = time.perf_counter()
        with torch.inference_mode():
            while waiting or running:
                while waiting and len(running) < work.concurrency:
                    running.append(self._admit(waiting.popleft(), work))
                for seq in [s for s in running if self._done(s, work)]:
                    running.remove(seq)
                    self._live_cache.release(seq.blocks)
                    finished[seq.request.id] = seq.output()
                if waiting and len(running) < work.concurrency:
                    continue  # refill freed slots before the next decode step
                if running:
                    self._decode_step(running, work)
        wall = time.perf_counter() - start
        return PassResult(outputs=tuple(finished[r.id] for r in work.requests), wall_s=wall)
