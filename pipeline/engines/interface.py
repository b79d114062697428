"""The one engine interface: `generate(workload) -> outputs`.

An engine is started once per arm and kept alive across repeats (vLLM start-up
is 25-80 s on a CPU); `generate` runs one pass of the workload.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import Error


class EngineError(Error):
    """The engine could not start or a request failed."""


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


class Engine(abc.ABC):
    """An arm. Use as a context manager: start on enter, stop on exit."""

    name: str

    @abc.abstractmethod
    def start(self) -> None:
        """Load the model / start the server. Raises EngineError."""

    @abc.abstractmethod
    def generate(self, work: WorkloadPass) -> PassResult:
        """Run one pass of one cell at its concurrency. Raises EngineError."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Release everything (stop the server by its PID). Must not raise."""

    @abc.abstractmethod
    def describe(self) -> dict[str, str]:
        """Engine, exact version, dtype, mode, model digest: recorded in the bundle."""

    # -- the engine's own profiler (vLLM's convention), for the trace gate

    def untraceable(self) -> str | None:
        """Why this engine's own profiler cannot trace it, or None when it can."""
        return f"engine {self.name!r} has no profiler rowgate can drive"

    def enable_profiling(self, out_dir: Path) -> None:
        """Before `start()`: have the engine write its profiler traces to `out_dir`."""
        raise EngineError(self.untraceable() or f"{self.name}: profiling not wired")

    def start_profile(self, delay_iterations: int, max_iterations: int) -> None:
        """Arm the engine's profiler: it records from its `delay_iterations`-th
        iteration on (0: at once) for at most `max_iterations` (vLLM's semantics)."""
        raise EngineError(self.untraceable() or f"{self.name}: profiling not wired")

    def stop_profile(self) -> None:
        """Stop the profiler; the engine writes its trace file before this returns."""
        raise EngineError(self.untraceable() or f"{self.name}: profiling not wired")

    def __enter__(self) -> "Engine":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
