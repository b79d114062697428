"""The trace gate's measures: pure functions over a saved, valid trace.

Everything here reads a `Trace` (plus the copy ceiling measured in the same
run), through the per-step work items of `rowgate.trace.work`, and returns plain
data, so a review can redo it from the sealed bundle:

* executing path — per timed decode step, the ordered device work (kernel name,
  grid, block) or, on a CPU trace, the ordered top-level ops;
* temporal breakdown — busy vs idle inside each step, idle split into host wait
  (the device had nothing queued), kernel wait (queued, short gap between
  back-to-back kernels) and other; launch delays (kernel start − launch call);
* wave tails — waves = blocks ÷ (SMs × blocks per SM), the unused fraction of
  the last wave, time-weighted over the step;
* bandwidth — bytes per kernel where the launching op's shapes give them,
  against the copy ceiling;
* recoverable idle capacity — the share of step time an ideal schedule would
  remove: gaps + tail waste + bandwidth shortfall, each shown separately.

A CPU trace has no kernels, grids or launch queue: its "work" is the top-level
CPU ops, its idle time is host time between them, and wave tails and launch
delays are reported as not supported (with why), never as zero.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from rowgate.trace import events
from rowgate.trace.events import Trace
from rowgate.trace.work import Step, Work, timed_steps, work_items

KERNEL_WAIT_US = 5.0
"""A gap shorter than this with the next launch already issued is launch latency
between back-to-back kernels (HTA's "kernel wait"); longer queued gaps are "other"."""

MAX_BLOCKS_PER_SM = {(7, 0): 32, (7, 2): 32, (7, 5): 16, (8, 0): 32, (8, 6): 16, (8, 7): 16,
                     (8, 9): 24, (9, 0): 32, (10, 0): 32, (10, 1): 32, (11, 0): 32, (12, 0): 32}
"""Resident-block limit per SM by compute capability (CUDA C Programming Guide,
"Technical Specifications per Compute Capability"); 32 where not listed."""
REG_ALLOC_UNIT = 256
"""Registers are allocated per warp in units of 256 (every arch from sm_70 on)."""
SMEM_RESERVED_PER_BLOCK = 1024
"""sm_80+ reserve 1 KiB of shared memory per resident block for the system."""


# ---------------------------------------------------------- executing path


def executing_path(items: list[Work], steps: list[Step]) -> dict[str, Any]:
    """Per step the ordered work; whether every step ran the same path."""
    per_step = [[{"name": w.name, "kind": w.kind, "grid": list(w.grid) if w.grid else None,
                  "block": list(w.block) if w.block else None}
                 for w in items if w.step == j] for j in range(len(steps))]
    signatures = {tuple((p["name"], str(p["grid"]), str(p["block"])) for p in s) for s in per_step}
    return {"steps": per_step, "distinct_paths": len(signatures),
            "work_per_step": [len(s) for s in per_step]}


# ---------------------------------------------------------------- temporal


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _classify_gap(nxt: Work | None, gap_start: float, gap: float, gpu: bool) -> str:
    if not gpu:
        return "host"  # CPU: time between ops is the interpreter / framework on the host
    if nxt is None or nxt.launch_end is None or nxt.launch_end >= gap_start:
        return "host_wait"  # nothing was queued: the device waited for the host
    return "kernel_wait" if gap < KERNEL_WAIT_US else "other"


def temporal(items: list[Work], steps: list[Step], gpu: bool) -> dict[str, Any]:
    """Busy vs idle per step (the step's CPU window brackets its device work: every
    step ends in a device→host sync), idle split by cause."""
    kinds = ("host_wait", "kernel_wait", "other") if gpu else ("host",)
    per_step: list[dict[str, float]] = []
    for j, s in enumerate(steps):
        lo, hi = s.ts, s.ts + s.dur
        mine = sorted((w for w in items if w.step == j), key=lambda w: w.ts)
        busy = union([(max(w.ts, lo), min(w.end, hi)) for w in mine if w.end > lo and w.ts < hi])
        idle = dict.fromkeys(kinds, 0.0)
        cursor, k = lo, 0
        for a, b in busy + [(hi, hi)]:
            if a > cursor:
                while k < len(mine) and mine[k].ts < a:  # both sorted: one pass per step
                    k += 1
                nxt = mine[k] if a < hi and k < len(mine) else None
                idle[_classify_gap(nxt, cursor, a - cursor, gpu)] += a - cursor
            cursor = max(cursor, b)
        busy_us = sum(b - a for a, b in busy)
        per_step.append({"step": j, "step_us": s.dur, "busy_us": busy_us,
                         "idle_us": s.dur - busy_us, **{f"{k}_us": v for k, v in idle.items()}})
    total = sum(p["step_us"] for p in per_step) or 1.0
    summary: dict[str, float | None] = {
        "step_us_median": _median([p["step_us"] for p in per_step]),
        "busy_fraction": sum(p["busy_us"] for p in per_step) / total,
        "idle_fraction": sum(p["idle_us"] for p in per_step) / total}
    for kind in kinds:
        summary[f"{kind}_fraction"] = sum(p[f"{kind}_us"] for p in per_step) / total
    return {"per_step": per_step, "summary": summary}


def launch_delays(items: list[Work], gpu: bool) -> dict[str, Any]:
    if not gpu:
        return {"supported": False, "why": "CPU trace: ops run synchronously on the host, "
                                           "there is no launch queue to delay"}
    delays = [w.ts - w.launch_ts for w in items if w.kind == "kernel" and w.launch_ts is not None]
    calls: dict[str, int] = {}
    for w in items:
        if w.launch:
            calls[w.launch] = calls.get(w.launch, 0) + 1
    return {"supported": True, "kernels": len(delays),
            "launch_delay_us_median": _median(delays),
            "launch_delay_us_p90": _quantile(delays, 0.9), "launch_calls": calls}


# -------------------------------------------------------------- wave tails


def blocks_per_sm(props: dict[str, Any], threads: int, registers: int, shared_memory: int) -> int:
    """Resident blocks per SM from the kernel's recorded resources (occupancy calculator:
    thread, register, shared-memory and block-count limits, allocation granularity)."""
    warp = int(props.get("warpSize", 32))
    warps = max(1, math.ceil(threads / warp))
    cc = (int(props.get("computeMajor", 9)), int(props.get("computeMinor", 0)))
    limits = [MAX_BLOCKS_PER_SM.get(cc, 32),
              int(props["maxThreadsPerMultiprocessor"]) // (warps * warp)]
    if registers:
        per_warp = math.ceil(registers * warp / REG_ALLOC_UNIT) * REG_ALLOC_UNIT
        limits.append((int(props["regsPerMultiprocessor"]) // per_warp) // warps)
    if shared_memory:
        reserved = SMEM_RESERVED_PER_BLOCK if cc[0] >= 8 else 0
        per_block = math.ceil((shared_memory + reserved) / 128) * 128
        limits.append(int(props["sharedMemPerMultiprocessor"]) // per_block)
    return max(1, min(limits))


def wave_tails(items: list[Work], props: dict[str, Any] | None) -> dict[str, Any]:
    """Per kernel waves and the unused share of its last wave; the time that share
    costs (duration ÷ waves × unused share, waves taken as equally long)."""
    if props is None:
        return {"supported": False, "why": "no kernels with grids: a CPU trace has no waves"}
    sms = int(props["numSms"])
    for w in items:
        if w.kind != "kernel" or not w.grid or not w.block:
            continue
        w.blocks_per_sm = blocks_per_sm(props, math.prod(w.block), w.registers or 0,
                                        w.shared_memory or 0)
        slots = sms * w.blocks_per_sm
        w.waves = math.prod(w.grid) / slots
        full = math.ceil(w.waves)
        w.last_wave_unused = 1.0 - (w.waves - (full - 1))
        w.tail_us = w.dur * w.last_wave_unused / full
    # (duration, waves, last-wave unused share) of every kernel given waves above
    kernels = [(w.dur, w.waves, w.last_wave_unused) for w in items
               if w.waves is not None and w.last_wave_unused is not None]
    busy = sum(dur for dur, _, _ in kernels) or 1.0
    return {"supported": True, "sms": sms, "kernels": len(kernels),
            "time_weighted_last_wave_unused": sum(dur * unused
                                                  for dur, _, unused in kernels) / busy,
            "single_partial_wave_kernels": sum(1 for _, waves, _ in kernels if waves < 1.0)}


# --------------------------------------------------------------- bandwidth


def bandwidth(items: list[Work], ceiling_bytes_per_s: float,
              step_bytes: int | None = None) -> dict[str, Any]:
    """Achieved bytes/s where bytes are known; the time above bytes ÷ ceiling that the
    tail share does not already explain is the bandwidth shortfall.

    Per kernel where its bytes are known. Where none are (a graph replay whose
    kernels could not be matched to the eager path), per step: the eager forward's
    bytes against the replayed forward's busy time (`step_bytes`), so capacity lost
    inside kernels still shows after graph replay.
    """
    known = [(w, w.bytes) for w in items if w.bytes and w.dur > 0]
    for w, nbytes in known:
        w.achieved_bytes_per_s = nbytes / (w.dur * 1e-6)
        ideal_us = nbytes / ceiling_bytes_per_s * 1e6
        above = max(0.0, w.dur - ideal_us)
        if w.tail_us is not None:
            # A kernel cannot give back more than its time above the bytes floor:
            # the tail share is capped there, the rest of that time is bandwidth shortfall.
            w.tail_us = min(w.tail_us, above)
        w.bandwidth_us = above - (w.tail_us or 0.0)
    busy = sum(w.dur for w in items) or 1.0
    steps = sorted({w.step for w in items})
    doc: dict[str, Any] = {"ceiling_bytes_per_s": ceiling_bytes_per_s,
                           "work_with_bytes": len(known),
                           "busy_time_with_bytes_fraction": sum(w.dur for w, _ in known) / busy,
                           "method": "per kernel" if known else "none",
                           "step_shortfall_us": 0.0}
    if not known and step_bytes:
        floor_us = step_bytes / ceiling_bytes_per_s * 1e6
        short = 0.0
        for j in steps:
            model = _model_kernels(items, j)
            spent = sum(w.dur - (w.tail_us or 0.0) for w in model)
            short += max(0.0, spent - floor_us)
        doc.update(method="per step, bytes of the eager forward", step_shortfall_us=short,
                   bytes_per_step=step_bytes, bandwidth_floor_us_per_step=floor_us)
        return doc
    moved = sum(nbytes for _, nbytes in known)
    spent = sum(w.dur for w, _ in known) * 1e-6
    per_step = moved / max(1, len({w.step for w, _ in known}))
    doc.update(achieved_bytes_per_s=moved / spent if spent else None,
               achieved_of_ceiling=(moved / spent / ceiling_bytes_per_s) if spent else None,
               bytes_per_step=per_step,
               bandwidth_floor_us_per_step=per_step / ceiling_bytes_per_s * 1e6)
    return doc


def _model_kernels(items: list[Work], step: int) -> list[Work]:
    """The decode forward's kernels of one step: eager forward, graph replay or the
    persistent step."""
    return [w for w in items if w.step == step and w.kind == "kernel"
            and w.origin in ("forward", "graph", "persistent")]


def transfer_bytes(items: list[Work], reference: list[tuple[str, int | None]] | None) -> int:
    """Give graph-replayed kernels (no launching op, so no shapes) the bytes of the same
    position in an eager step whose forward ran the same kernels. Returns how many."""
    if not reference:
        return 0
    n = 0
    for j in sorted({w.step for w in items}):
        mine = _model_kernels(items, j)
        if [w.name for w in mine] != [name for name, _ in reference]:
            continue  # another path: positions would not mean the same op
        for w, (_, b) in zip(mine, reference):
            if w.bytes is None and b is not None:
                w.bytes, n = b, n + 1
    return n


def bytes_reference(items: list[Work]) -> list[tuple[str, int | None]]:
    """(kernel name, bytes) of the first step's forward: the eager path for a graph trace."""
    return [(w.name, w.bytes) for w in _model_kernels(items, 0)]


# ------------------------------------------------------------ capacity


def capacity(items: list[Work], temporal_doc: dict[str, Any], material: float,
             waves: dict[str, Any], bandwidth_doc: dict[str, Any]) -> dict[str, Any]:
    """Recoverable share of step time, each part separately: idle gaps between work,
    last-wave tail waste inside kernels, and bandwidth shortfall inside kernels.
    A part the trace cannot support (tails on a CPU trace) is None, not zero."""
    total = sum(p["step_us"] for p in temporal_doc["per_step"]) or 1.0
    gaps = sum(p["idle_us"] for p in temporal_doc["per_step"]) / total
    tails = sum(w.tail_us or 0.0 for w in items) / total if waves.get("supported") else None
    bw = (sum(w.bandwidth_us or 0.0 for w in items) + bandwidth_doc["step_shortfall_us"]) / total
    recoverable = min(1.0, gaps + (tails or 0.0) + bw)
    return {"gap_fraction": gaps, "tail_fraction": tails, "bandwidth_fraction": bw,
            "inside_kernels_fraction": (tails or 0.0) + bw,
            "recoverable_idle_fraction": recoverable,
            "material_idle_fraction": material,
            "verdict": "material" if recoverable >= material else "not material"}


# ------------------------------------------------------------- graph route


def graph_route(trace: Trace, items: list[Work]) -> dict[str, Any]:
    """Did every step's decode forward run from CUDA-graph replay, none of it eagerly?

    Proof: each timed step has kernels correlated to a graph launch, and no kernel
    was launched from the eager forward (`rowgate.forward`) inside the range.
    Input staging around the replay and sampling stay outside the graph by
    design: they are counted and named, not held against the route.
    """
    if not trace.has_gpu:
        return {"supported": False, "why": "CPU trace: there are no CUDA graphs on a CPU",
                "proved": None}
    kernels = [w for w in items if w.kind == "kernel"]
    graph = [w for w in kernels if w.origin == "graph"]
    eager = [w for w in kernels if w.origin == "forward"]
    steps = {w.step for w in items}
    replayed = {w.step for w in graph}
    proved = bool(graph) and not eager and replayed == steps
    return {"supported": True, "proved": proved, "graph_kernels": len(graph),
            "eager_forward_kernels": len(eager), "steps": len(steps),
            "steps_replayed": len(replayed),
            "first_eager": eager[0].name if eager else None,
            "persistent_kernels": sum(1 for w in kernels if w.origin == "persistent"),
            "staging_kernels": sum(1 for w in kernels if w.origin == "staging"),
            "other_kernels": sum(1 for w in kernels if w.origin == "other")}


# ------------------------------------------------------------------ all


@dataclass
class Analysis:
    mode: str
    steps: list[Step]
    items: list[Work]
    path: dict[str, Any]
    temporal: dict[str, Any]
    launches: dict[str, Any]
    waves: dict[str, Any]
    bandwidth: dict[str, Any]
    capacity: dict[str, Any]
    graph: dict[str, Any]
    hta: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"mode": self.mode, "steps": len(self.steps), "path": {
            k: v for k, v in self.path.items() if k != "steps"},
            "temporal": self.temporal["summary"], "launches": self.launches,
            "waves": self.waves, "bandwidth": self.bandwidth, "capacity": self.capacity,
            "graph_route": self.graph, "hta": self.hta}

    def rows(self) -> list[dict[str, Any]]:
        """Per-kernel (per-op) records for the CSV."""
        return [{k: v for k, v in asdict(w).items()} for w in self.items]


def analyze(trace: Trace, mode: str, ceiling_bytes_per_s: float, material: float,
            reference: list[tuple[str, int | None]] | None = None) -> Analysis:
    from rowgate.trace.validity import the_range

    rng = the_range(trace)
    if rng is None:
        raise events.TraceError(f"{trace.path}: no range to analyse")
    steps = timed_steps(trace, rng)
    items = work_items(trace, steps)
    step_bytes = None
    if trace.has_gpu and reference:
        transfer_bytes(items, reference)
        step_bytes = sum(b for _, b in reference if b) or None
    props = trace.device_properties[0] if trace.has_gpu and trace.device_properties else None
    waves = wave_tails(items, props)
    bw = bandwidth(items, ceiling_bytes_per_s, step_bytes)
    tmp = temporal(items, steps, trace.has_gpu)
    return Analysis(mode=mode, steps=steps, items=items, path=executing_path(items, steps),
                    temporal=tmp, launches=launch_delays(items, trace.has_gpu), waves=waves,
                    bandwidth=bw, capacity=capacity(items, tmp, material, waves, bw),
                    graph=graph_route(trace, items))


def _median(xs: list[float]) -> float | None:
    return _quantile(xs, 0.5)


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
