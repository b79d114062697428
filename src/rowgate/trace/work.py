"""What ran in each timed step of a valid trace: the device work (kernels, copies,
fills) or, on a CPU trace, the top-level ops, each attributed to its step and origin
(the eager forward, a graph replay, a persistent launch, staging), with the bytes it
moved where the launching op's shapes give them. `rowgate.trace.analysis` measures
over these items.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from rowgate.trace import events
from rowgate.trace.events import Span, Trace

GRAPH_LAUNCHES = {"cudaGraphLaunch", "cuGraphLaunch", "cudaGraphLaunch_v10000"}
DRIVER_LAUNCHES = {"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel"}
"""How cuda.core launches rowgate's own cubins (the persistent megakernel); torch's
staging copies and fills go through the runtime API."""

LOOKBACK_OPS = 256

ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8,
                 "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
                 "c10::Float8_e5m2": 1, "c10::Float8_e4m3fn": 1}
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear",
            "aten::baddbmm"}



# ------------------------------------------------------------------- bytes


def _numel(dims: Sequence[int]) -> int:
    return math.prod(int(d) for d in dims) if dims else 1


def op_bytes(op: Span) -> int | None:
    """Bytes an op must move at least (each operand read once, the result written once),
    where its recorded shapes determine them; None where they do not (gathers, views,
    ops whose output shape is not recorded)."""
    dims, types = op.args.get("Input Dims"), op.args.get("Input type")
    if not dims or not types:
        return None
    tensors = [(d, ELEMENT_BYTES[t]) for d, t in zip(dims, types) if t in ELEMENT_BYTES and d]
    if not tensors:
        return None
    read = sum(_numel(d) * b for d, b in tensors)
    if op.name in GEMM_OPS:
        a, bmat = tensors[-2][0], tensors[-1][0]
        if len(a) < 2 or len(bmat) < 2:
            return None
        out = _numel(a[:-1]) * int(bmat[-1])
        return read + out * tensors[-2][1]
    shapes = {tuple(d) for d, _ in tensors}
    if len(shapes) == 1 and not any(k in op.name for k in ("index", "embedding", "gather",
                                                          "view", "reshape", "slice", "select")):
        return read + _numel(tensors[0][0]) * tensors[0][1]  # elementwise: result as large
    return None


# ------------------------------------------------------------------ work


@dataclass
class Work:
    """One unit of device work (kernel, memcpy, memset) or, on CPU, one top-level op."""

    step: int
    index: int
    name: str
    kind: str
    ts: float
    dur: float
    grid: tuple[int, ...] | None = None
    block: tuple[int, ...] | None = None
    registers: int | None = None
    shared_memory: int | None = None
    launch: str | None = None
    launch_ts: float | None = None
    launch_end: float | None = None
    origin: str = "other"
    """`forward` (launched by the eager decode forward), `graph` (by a graph launch),
    `persistent` (a cubin launched through the driver API inside the step call),
    `staging` (the step call's input/output copies), `other` (sampling, inputs)."""
    bytes: int | None = None
    # filled by the analysis
    blocks_per_sm: int | None = None
    waves: float | None = None
    last_wave_unused: float | None = None
    tail_us: float | None = None
    bandwidth_us: float | None = None
    achieved_bytes_per_s: float | None = None

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass(frozen=True)
class Step:
    index: int
    ts: float
    dur: float


def timed_steps(trace: Trace, rng: Span) -> list[Step]:
    return sorted((Step(i, s.ts, s.dur) for _, i, s in trace.steps("timed") if rng.contains(s.ts)),
                  key=lambda s: s.ts)


def _step_of(steps: list[Step], t: float) -> int | None:
    starts = [s.ts for s in steps]
    j = bisect_right(starts, t) - 1
    if j >= 0 and t <= steps[j].ts + steps[j].dur:
        return j
    return None


def _innermost_op(ops: list[Span], starts: list[float], t: float, tid: object) -> Span | None:
    """The deepest CPU op on thread `tid` that encloses time `t` (its launching op)."""
    best = None
    hi = bisect_right(starts, t)
    # The launching op started just before its launch call; between them lie at most
    # the op's own (already finished) children: a short look-back finds it.
    for k in range(hi - 1, max(hi - LOOKBACK_OPS, 0) - 1, -1):
        op = ops[k]
        if op.tid == tid and op.contains(t) and (best is None or op.dur < best.dur):
            best = op
    return best


def _origin(launch: Span | None, anchor: float, forwards: list[Span], runs: list[Span]) -> str:
    if launch is not None and launch.name in GRAPH_LAUNCHES:
        return "graph"
    if any(f.contains(anchor) for f in forwards):
        return "forward"
    if any(r.contains(anchor) for r in runs):
        # Inside the engine's step call (graph replay / persistent router): a cubin
        # launched through the driver API is the persistent step; the rest is staging.
        return "persistent" if launch is not None and launch.name in DRIVER_LAUNCHES \
            else "staging"
    return "other"


def _gpu_work(trace: Trace, steps: list[Step]) -> list[Work]:
    launches = trace.runtime_by_correlation()
    forwards = trace.named(events.FORWARD_MARKER)
    runs = trace.named(events.GRAPH_RUN_MARKER)
    ops = list(trace.cpu_ops)
    starts = [o.ts for o in ops]
    out: list[Work] = []
    by_op: dict[tuple[float, object, str], list[Work]] = {}
    for e in trace.device:
        launch = launches.get(e.correlation) if e.correlation is not None else None
        anchor = launch.ts if launch else e.ts
        j = _step_of(steps, anchor)
        if j is None:
            continue
        kind = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}[e.cat]
        op = _innermost_op(ops, starts, launch.ts, launch.tid) if launch else None
        a = e.args
        w = Work(
            step=j, index=0, name=e.name, kind=kind, ts=e.ts, dur=e.dur,
            grid=tuple(a["grid"]) if "grid" in a else None,
            block=tuple(a["block"]) if "block" in a else None,
            registers=a.get("registers per thread"), shared_memory=a.get("shared memory"),
            launch=launch.name if launch else None, launch_ts=launch.ts if launch else None,
            launch_end=launch.end if launch else None,
            origin=_origin(launch, anchor, forwards, runs),
            bytes=(a.get("bytes") if kind != "kernel" else (op_bytes(op) if op else None)))
        out.append(w)
        if op is not None and kind == "kernel":
            by_op.setdefault((op.ts, op.tid, op.name), []).append(w)
    for group in by_op.values():
        # One op, several kernels (split-K GEMM + reduce): the op's bytes once, on its
        # longest kernel; the others count as time with unknown bytes (conservative).
        for w in sorted(group, key=lambda w: -w.dur)[1:]:
            w.bytes = None
    return out


def _top_level(ops: list[Span]) -> list[Span]:
    """CPU ops not nested in another op of the same thread."""
    out: list[Span] = []
    open_until: dict[object, float] = {}
    for op in ops:
        if op.ts >= open_until.get(op.tid, -math.inf):
            out.append(op)
            open_until[op.tid] = op.end
    return out


def _cpu_work(trace: Trace, steps: list[Step]) -> list[Work]:
    forwards = trace.named(events.FORWARD_MARKER)
    out = []
    for op in _top_level(list(trace.cpu_ops)):
        j = _step_of(steps, op.ts)
        if j is None:
            continue
        out.append(Work(step=j, index=0, name=op.name, kind="cpu_op", ts=op.ts, dur=op.dur,
                        origin="forward" if any(f.contains(op.ts) for f in forwards)
                        else "other",
                        bytes=op_bytes(op)))
    return out


def work_items(trace: Trace, steps: list[Step]) -> list[Work]:
    items = _gpu_work(trace, steps) if trace.has_gpu else _cpu_work(trace, steps)
    items.sort(key=lambda w: (w.step, w.ts))
    counters: dict[int, int] = {}
    for w in items:
        w.index = counters.get(w.step, 0)
        counters[w.step] = w.index + 1
    return items
