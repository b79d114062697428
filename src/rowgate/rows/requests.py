"""What a workload sends an engine and what comes back: plain data, below the engines so
that the workload, the oracle records and the gates share one definition
(`rowgate.engines.interface` re-exports them beside the engine interface)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Request:
    """One request of a workload: token-id prompt, fixed output length."""

    id: str
    cell: str
    """Matrix cell it belongs to (`i16-c4`)."""
    prompt_ids: tuple[int, ...]
    max_tokens: int
    seed: int


@dataclass(frozen=True)
class WorkloadPass:
    """Requests of one cell and the concurrency they are sent at."""

    cell: str
    concurrency: int
    requests: tuple[Request, ...]
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    ignore_eos: bool = True
    prefix_caching: bool = False
    """Rows keep it off so every repeat does the full prefill."""
    dataset: tuple[tuple[str, str], ...] = ()
    """The prompt file the prompts came from (sha256, format, selection); empty for
    random token ids. Part of the workload digest."""


@dataclass(frozen=True)
class RequestOutput:
    id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    """Log-probability of each generated token under the engine's own distribution."""
    ttft_s: float | None = None
    """Time to first token, where streamed."""
    latency_s: float = 0.0
    itl_s: tuple[float, ...] = field(default_factory=tuple)
    """Inter-token latencies, where streamed."""
    alternatives: "Alternatives" = ()
    """Per generated token, the most likely other tokens with their log-probabilities,
    best first, where the engine exposes them (rowgate's reference engine keeps
    ALTERNATIVES of them): what tells a near-tie kept the other way from a real
    divergence when two bf16 paths part (bf16 logits tie three ways, too)."""


Alternatives = tuple[tuple[tuple[int, float], ...], ...]
"""Per generated token, (token id, log-probability) of the most likely other tokens."""


def alternatives_from_json(raw: Iterable[Iterable[Sequence[int | float]]]) -> Alternatives:
    """`RequestOutput.alternatives` from its JSON form (lists of [id, logprob] pairs), as a
    worker reply, a tokens artifact or an oracle record holds it."""
    return tuple(tuple((int(i), float(lp)) for i, lp in alt) for alt in raw)


@dataclass(frozen=True)
class PassResult:
    outputs: tuple[RequestOutput, ...]
    wall_s: float
    """Wall time of the whole pass (first request sent to last token received)."""

    @property
    def output_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)
