"""Engines shared by the gates of one row run, so no arm is started and loaded twice.

An arm started by an engine-sharing gate (trace for in-process engines, tokens,
throughput, accuracy: `Gate.shares_engines`) stays up after that gate and serves every
later sharing gate of the row that asks for the same arm, model, device and engine
options, in the row's order. What is shared and what is not:

* The key is everything that makes the engine: the arm's declaration, the model
  directory and its digest, the device, the options the gate starts it with, the subject.
  A different model or option is a different engine.
* One gate never gets one engine for two roles (an A/A throughput gate's baseline and
  candidate stay two engines).
* State between gates: an engine keeps no request state between passes (every pass is
  sent fresh; rows keep prefix caching off, so nothing cached by one gate's prompts
  serves the next's). What a later gate inherits is the loaded model and whatever the
  engine compiled or captured (CUDA graphs, torch.compile), which is what a served engine
  has in production; each gate's own warm-up still runs. The trace gate's markers and
  profiler are taken off the engine when its capture ends.
* Device memory: before each gate the runner stops the pooled engines that neither it
  nor a later gate will ask for (`expect`, then `keep_only`), between gates, on no
  gate's clock: stopping an engine is no gate's work. It stops them all before a gate
  that starts engines of its own (the abi gate, a trace of an engine whose profiler is
  set before start). A gate asking for its arms stops whatever is still left over (its
  phase `engine stop`).
* An engine a gate was using when it raised is stopped and forgotten: its state is
  unknown. The pool stops everything when the run ends, however it ends.

Each sharing gate records, per role, which gate started its engine
(`engine-sharing.json`), so a reviewer sees which figures came from one process.

The pool also keeps each engine's latest pass of every workload cell and the gate that
ran it (`journal`): a later throughput gate starts that cell's warm-up from it instead of
paying for the same first round again (`rowgate.gates.throughput.measure`), and seals it
as the round it was, with the gate that ran it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from rowgate.engines.interface import Engine, PassResult, WorkloadPass
from rowgate.rows.workload import workload_digest

SHARING_FILE = "engine-sharing.json"


@dataclass(frozen=True)
class EarlierPass:
    """A pass an engine ran for a gate of this row run."""

    gate: str
    start: float
    end: float
    """`time.monotonic()` when the pass began and ended."""
    result: PassResult


@dataclass(frozen=True)
class _Held:
    engine: Engine
    started_by: str
    arm: str
    """The arm's declaration (`arm_identity`): what a later gate's expectation names."""
    passes: dict[str, EarlierPass] = field(default_factory=dict)
    """The engine's latest pass of each workload cell (by the cell's workload digest)."""


class PassJournal:
    """One gate's view of the pool's passes: what its engines ran before (`earlier`),
    and what they run now (`note`), for a later gate."""

    def __init__(self, pool: EnginePool, gate: str):
        self._pool, self._gate = pool, gate

    def earlier(self, engine: Engine, work: WorkloadPass) -> EarlierPass | None:
        """The engine's latest pass of `work` in an earlier gate, or None."""
        held = self._pool.held(engine)
        found = held.passes.get(workload_digest([work])) if held else None
        return found if found is not None and found.gate != self._gate else None

    def note(self, engine: Engine, work: WorkloadPass, start: float, end: float,
             result: PassResult) -> None:
        held = self._pool.held(engine)
        if held is not None:  # an engine only this gate holds goes with it
            held.passes[workload_digest([work])] = EarlierPass(self._gate, start, end, result)


def arm_identity(arm: dict[str, object]) -> str:
    return json.dumps(arm, sort_keys=True, default=str)


def engine_key(arm: dict[str, object], model_path: Path, model_digest: str, device: str,
               options: dict[str, str], subject: Path) -> str:
    """What makes an engine: two requests with the same key can be served by one."""
    return json.dumps({"arm": arm, "model": str(model_path), "digest": model_digest,
                       "device": device, "options": options, "subject": str(subject)},
                      sort_keys=True, default=str)


class EnginePool:
    """Started engines by key, stopped when the row run ends (`with EnginePool() as pool`)."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}
        self._expected: set[str] = set()

    def __enter__(self) -> EnginePool:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.clear()

    def take(self, key: str, exclude: set[int]) -> tuple[Engine, str] | None:
        """The started engine for `key` and the gate that started it, unless it is one
        of `exclude` (already serving another role of the same gate)."""
        held = self._held.get(key)
        if held is None or id(held.engine) in exclude:
            return None
        return held.engine, held.started_by

    def add(self, key: str, engine: Engine, gate_id: str, arm: dict[str, object]) -> None:
        """Keep a started engine (a key already held keeps its first engine; this one is
        another role's and is stopped with the gate)."""
        self._held.setdefault(key, _Held(engine, gate_id, arm_identity(arm)))

    def expect(self, arms: list[dict[str, object]]) -> None:
        """The arms (declarations) the gates after the current one will ask for: their
        engines outlive a gate that does not use them."""
        self._expected = {arm_identity(a) for a in arms}

    def holds(self, engine: Engine) -> bool:
        return self.held(engine) is not None

    def held(self, engine: Engine) -> _Held | None:
        return next((h for h in self._held.values() if h.engine is engine), None)

    def journal(self, gate: str) -> PassJournal:
        return PassJournal(self, gate)

    def left_over(self, keys: set[str]) -> list[str]:
        """The pooled engines neither under `keys` nor expected by a later gate."""
        return [k for k, h in self._held.items() if k not in keys and h.arm not in self._expected]

    def keep_only(self, keys: set[str]) -> None:
        """Stop every pooled engine neither under `keys` (a gate's arms are about to
        start) nor expected by a later gate: free the device of what no one will use."""
        for key in self.left_over(keys):
            self._held.pop(key).engine.stop()

    def drop(self, engines: list[Engine]) -> None:
        """Stop and forget these engines (the gate using them raised)."""
        for key in [k for k, h in self._held.items() if any(h.engine is e for e in engines)]:
            self._held.pop(key).engine.stop()

    def clear(self) -> None:
        """Stop every engine, latest first."""
        for key in reversed(list(self._held)):
            self._held.pop(key).engine.stop()
