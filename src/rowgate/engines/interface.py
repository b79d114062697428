"""The one engine interface: `generate(workload) -> outputs`.

An engine is started once per arm and kept alive across repeats (vLLM start-up
is 25-80 s on a CPU); `generate` runs one pass of the workload.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rowgate.errors import Error
from rowgate.rows.requests import (
    Alternatives,
    PassResult,
    Request,
    RequestOutput,
    WorkloadPass,
    alternatives_from_json,
)

if TYPE_CHECKING:
    from rowgate.rows.spec import Arm


__all__ = ["Alternatives", "Engine", "EngineError", "EnginePlugin", "PassResult", "Request",
           "RequestOutput", "WorkloadPass", "alternatives_from_json"]


class EngineError(Error):
    """The engine could not start or a request failed."""


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


def _nothing(arm: Arm) -> str | None:
    return None


@dataclass(frozen=True)
class EnginePlugin:
    """What an entry point of group `rowgate.engines` names: one engine family."""

    create: Callable[[Arm, Path, str, dict[str, str], Path | None], Engine]
    """(arm, model_dir, device, options, subject) -> the engine, not started."""
    why_unavailable: Callable[[Arm], str | None] = _nothing
    """Why the arm cannot run on this machine at all (PENDING), or None."""
    why_untraceable: Callable[[Arm], str | None] = _nothing
    """Why the trace gate cannot trace the arm, or None."""
    in_process: bool = False
    """Steps in rowgate's process (the trace gate profiles it directly)."""
    options: Mapping[str, str] = field(default_factory=dict)
    """`--option` keys its engines read, and what each does (`rowgate gate --option`)."""
    modes: tuple[str, ...] = ()
    """The modes its engines run (an arm's `mode`, or the one a trace gate asks for);
    empty: the engine reads the mode itself and refuses what it cannot run."""
