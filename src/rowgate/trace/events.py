"""A saved Kineto (torch.profiler) trace, parsed into typed events.

Only what validity and analysis read: user annotations (the profiler's
`ProfilerStep#N` and rowgate's own `rowgate.*` markers), CPU ops with their
input shapes, CUDA runtime calls, and device activities (kernels, memcpy,
memset) with their launch arguments. Timestamps stay in the trace's own unit
(microseconds); `base_ns` converts them to Unix time (`ts * 1000 + base_ns`),
which is the clock the NVML sampler records.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rowgate import compressed
from rowgate.errors import Error

RANGE_MARKER = "rowgate.range"
"""The one record_function the capture opens around the timed steps."""
STEP_MARKER = "rowgate.step"
"""`rowgate.step#<phase>:<i>`: one decode step of a phase (warm, primer, timed); in an
engine-written trace also the timed pass's `prefill` iterations and `other` ones."""
FORWARD_MARKER = "rowgate.forward"
"""The model's eager decode forward inside a step (never inside a graph replay)."""
GRAPH_RUN_MARKER = "rowgate.graph_run"
"""The engine's graph-replay call: input staging, the replay, the output copy."""
PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
STEP_NAME = re.compile(r"^rowgate\.step#(warm|primer|timed|prefill|other):(\d+)$")
OWN_PHASES = ("timed", "prefill")
"""Steps of the timed execution itself; any other step's work inside the range is primer
work."""

DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver"}


class TraceError(Error):
    """A trace file is missing or not a Kineto trace."""


@dataclass(frozen=True)
class Span:
    """One complete (`ph: X`) event."""

    name: str
    cat: str
    ts: float
    dur: float
    pid: Any
    tid: Any
    args: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def end(self) -> float:
        return self.ts + self.dur

    def contains(self, t: float) -> bool:
        return self.ts <= t <= self.end

    @property
    def correlation(self) -> int | None:
        c = self.args.get("correlation")
        return int(c) if c is not None else None


@dataclass(frozen=True)
class Trace:
    """The parsed trace: events by kind, sorted by start time."""

    path: str
    base_ns: int
    device_properties: tuple[dict[str, Any], ...]
    annotations: tuple[Span, ...]
    cpu_ops: tuple[Span, ...]
    runtime: tuple[Span, ...]
    device: tuple[Span, ...]
    """Kernels, memcpy and memset on the GPU."""
    raw: dict[str, Any] = field(compare=False, hash=False, repr=False)

    @property
    def kernels(self) -> tuple[Span, ...]:
        return tuple(e for e in self.device if e.cat == "kernel")

    @property
    def has_gpu(self) -> bool:
        return bool(self.device)

    def named(self, prefix: str) -> list[Span]:
        return [a for a in self.annotations if a.name.startswith(prefix)]

    def profiler_steps(self) -> list[tuple[int, Span]]:
        out = []
        for a in self.annotations:
            m = PROFILER_STEP.match(a.name)
            if m:
                out.append((int(m.group(1)), a))
        return sorted(out, key=lambda x: x[0])

    def steps(self, phase: str | None = None) -> list[tuple[str, int, Span]]:
        """(phase, index, span) of every `rowgate.step#…` marker (CPU side)."""
        out = []
        for a in self.annotations:
            m = STEP_NAME.match(a.name)
            if m and a.cat == "user_annotation" and (phase is None or m.group(1) == phase):
                out.append((m.group(1), int(m.group(2)), a))
        return out

    def runtime_by_correlation(self) -> dict[int, Span]:
        return {r.correlation: r for r in self.runtime if r.correlation is not None}

    def unix_s(self, ts_us: float) -> float:
        """A trace timestamp as Unix seconds (the clock sampler's clock)."""
        return (ts_us * 1000.0 + self.base_ns) / 1e9


def span(e: dict[str, Any]) -> Span:
    """One complete event as a Span."""
    return Span(name=str(e.get("name", "")), cat=str(e.get("cat", "")), ts=float(e["ts"]),
                dur=float(e.get("dur", 0.0)), pid=e.get("pid"), tid=e.get("tid"),
                args=dict(e.get("args") or {}))


def from_dict(doc: dict[str, Any], path: str = "<memory>") -> Trace:
    """Parse an already loaded trace document (the planted-trace tests edit these)."""
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        raise TraceError(f"{path}: not a Kineto trace (no traceEvents list)")
    spans = sorted((span(e) for e in events if e.get("ph") == "X" and "ts" in e),
                   key=lambda s: (s.ts, -s.dur))
    return Trace(
        path=path, base_ns=int(doc.get("baseTimeNanoseconds", 0)),
        device_properties=tuple(doc.get("deviceProperties") or ()),
        # Host-side markers only: Kineto mirrors each record_function onto the GPU
        # timeline as `gpu_user_annotation`, which would count every range twice.
        annotations=tuple(s for s in spans if s.cat == "user_annotation"),
        cpu_ops=tuple(s for s in spans if s.cat == "cpu_op"),
        runtime=tuple(s for s in spans if s.cat in RUNTIME_CATS),
        device=tuple(s for s in spans if s.cat in DEVICE_CATS),
        raw=doc)


def read_doc(path: Path) -> dict[str, Any]:
    """The JSON document of a `.json` or `.json.gz` trace."""
    try:
        doc: dict[str, Any] = json.loads(compressed.read_bytes(path))
    except (OSError, ValueError, EOFError) as exc:
        raise TraceError(f"{path}: cannot read the trace") from exc
    return doc


def load(path: Path) -> Trace:
    return from_dict(read_doc(path), str(path))


def write_doc(doc: dict[str, Any], path: Path) -> None:
    """Write a trace document gzip-compressed, byte-stable (mtime 0) for sealing."""
    raw = json.dumps(doc, separators=(",", ":")).encode()
    path.write_bytes(compressed.pack(raw))
