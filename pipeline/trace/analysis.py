"""The trace gate's measures: pure functions over a saved, valid trace.

Everything here reads a `Trace` (plus the copy ceiling measured in the same
run) and returns plain data, so a review can redo it from the sealed bundle:

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
from bisect import bisect_right
from dataclasses import asdict, dataclass, field

from pipeline.trace import events
from pipeline.trace.events import Span, Trace

KERNEL_WAIT_US = 5.0
"""A gap shorter than this with the next launch already issued is launch latency
between back-to-back kernels (HTA's "kernel wait"); longer queued gaps are "other"."""

GRAPH_LAUNCHES = {"cudaGraphLaunch", "cuGraphLaunch", "cudaGraphLaunch_v10000"}
DRIVER_LAUNCHES = {"cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel"}
"""How cuda.core launches rowgate's own cubins (the persistent megakernel); torch's
staging copies and fills go through the runtime API."""

MAX_BLOCKS_PER_SM = {(7, 0): 32, (7, 2): 32, (7, 5): 16, (8, 0): 32, (8, 6): 16, (8, 7): 16,
                     (8, 9): 24, (9, 0): 32, (10, 0): 32, (10, 1): 32, (11, 0): 32, (12, 0): 32}
"""Resident-block limit per SM by compute capability (CUDA C Programming Guide,
"Technical Specifications per Compute Capability"); 32 where not listed."""
REG_ALLOC_UNIT = 256
"""Registers are allocated per warp in units of 256 (every arch from sm_70 on)."""
SMEM_RESERVED_PER_BLOCK = 1024
"""sm_80+ reserve 1 KiB of shared memory per resident block for the system."""

LOOKBACK_OPS = 256

ELEMENT_BYTES = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8,
                 "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1,
                 "c10::Float8_e5m2": 1, "c10::Float8_e4m3fn": 1}
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear",
            "aten::baddbmm"}


# ------------------------------------------------------------------- bytes


def _numel(dims: list) -> int:
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
        out = _numel(a[:-1]) * bmat[-1]
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


def _innermost_op(ops: list[Span], starts: list[float], t: float, tid) -> Span | None:
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
    by_op: dict[tuple, list[Work]] = {}
    for e in trace.device:
        launch = launches.get(e.correlation)
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
    out, open_until = [], {}
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


# ---------------------------------------------------------- executing path


def executing_path(items: list[Work], steps: list[Step]) -> dict:
    """Per step the ordered work; whether every step ran the same path."""
    per_step = [[{"name": w.name, "kind": w.kind, "grid": list(w.grid) if w.grid else None,
                  "block": list(w.block) if w.block else None}
                 for w in items if w.step == j] for j in range(len(steps))]
    signatures = {tuple((p["name"], str(p["grid"]), str(p["block"])) for p in s) for s in per_step}
    return {"steps": per_step, "distinct_paths": len(signatures),
            "work_per_step": [len(s) for s in per_step]}


# ---------------------------------------------------------------- temporal


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
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


def temporal(items: list[Work], steps: list[Step], gpu: bool) -> dict:
    """Busy vs idle per step (the step's CPU window brackets its device work: every
    step ends in a device→host sync), idle split by cause."""
    kinds = ("host_wait", "kernel_wait", "other") if gpu else ("host",)
    per_step = []
    for j, s in enumerate(steps):
        lo, hi = s.ts, s.ts + s.dur
        mine = sorted((w for w in items if w.step == j), key=lambda w: w.ts)
        busy = _union([(max(w.ts, lo), min(w.end, hi)) for w in mine if w.end > lo and w.ts < hi])
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
    summary = {"step_us_median": _median([p["step_us"] for p in per_step]),
               "busy_fraction": sum(p["busy_us"] for p in per_step) / total,
               "idle_fraction": sum(p["idle_us"] for p in per_step) / total}
    for k in kinds:
        summary[f"{k}_fraction"] = sum(p[f"{k}_us"] for p in per_step) / total
    return {"per_step": per_step, "summary": summary}


def launch_delays(items: list[Work], gpu: bool) -> dict:
    if not gpu:
        return {"supported": False, "why": "CPU trace: ops run synchronously on the host, "
                                           "there is no launch queue to delay"}
    delays = [w.ts - w.launch_ts for w in items if w.kind == "kernel" and w.launch_ts is not None]
    calls = {}
    for w in items:
        if w.launch:
            calls[w.launch] = calls.get(w.launch, 0) + 1
    return {"supported": True, "kernels": len(delays),
            "launch_delay_us_median": _median(delays),
            "launch_delay_us_p90": _quantile(delays, 0.9), "launch_calls": calls}


# -------------------------------------------------------------- wave tails


def blocks_per_sm(props: dict, threads: int, registers: int, shared_memory: int) -> int:
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


def wave_tails(items: list[Work], props: dict | None) -> dict:
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
    kernels = [w for w in items if w.waves is not None]
    busy = sum(w.dur for w in kernels) or 1.0
    return {"supported": True, "sms": sms, "kernels": len(kernels),
            "time_weighted_last_wave_unused": sum(w.dur * w.last_wave_unused
                                                  for w in kernels) / busy,
            "single_partial_wave_kernels": sum(1 for w in kernels if w.waves < 1.0)}


# --------------------------------------------------------------- bandwidth


def bandwidth(items: list[Work], ceiling_bytes_per_s: float,
              step_bytes: int | None = None) -> dict:
    """Achieved bytes/s where bytes are known; the time above bytes ÷ ceiling that the
    tail share does not already explain is the bandwidth shortfall.

    Per kernel where its bytes are known. Where none are (a graph replay whose
    kernels could not be matched to the eager path), per step: the eager forward's
    bytes against the replayed forward's busy time (`step_bytes`), so capacity lost
    inside kernels still shows after graph replay.
    """
    known = [w for w in items if w.bytes and w.dur > 0]
    for w in known:
        w.achieved_bytes_per_s = w.bytes / (w.dur * 1e-6)
        ideal_us = w.bytes / ceiling_bytes_per_s * 1e6
        above = max(0.0, w.dur - ideal_us)
        if w.tail_us is not None:
            # A kernel cannot give back more than its time above the bytes floor:
            # the tail share is capped there, the rest of that time is bandwidth shortfall.
            w.tail_us = min(w.tail_us, above)
        w.bandwidth_us = above - (w.tail_us or 0.0)
    busy = sum(w.dur for w in items) or 1.0
    steps = sorted({w.step for w in items})
    doc = {"ceiling_bytes_per_s": ceiling_bytes_per_s, "work_with_bytes": len(known),
           "busy_time_with_bytes_fraction": sum(w.dur for w in known) / busy,
           "method": "per kernel" if known else "none", "step_shortfall_us": 0.0}
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
    moved = sum(w.bytes for w in known)
    spent = sum(w.dur for w in known) * 1e-6
    per_step = moved / max(1, len({w.step for w in known}))
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


def capacity(items: list[Work], temporal_doc: dict, material: float, waves: dict,
             bandwidth_doc: dict) -> dict:
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


def graph_route(trace: Trace, items: list[Work]) -> dict:
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
    path: dict
    temporal: dict
    launches: dict
    waves: dict
    bandwidth: dict
    capacity: dict
    graph: dict
    hta: dict = field(default_factory=dict)

    def summary(self) -> dict:
        return {"mode": self.mode, "steps": len(self.steps), "path": {
            k: v for k, v in self.path.items() if k != "steps"},
            "temporal": self.temporal["summary"], "launches": self.launches,
            "waves": self.waves, "bandwidth": self.bandwidth, "capacity": self.capacity,
            "graph_route": self.graph, "hta": self.hta}

    def rows(self) -> list[dict]:
        """Per-kernel (per-op) records for the CSV."""
        return [{k: v for k, v in asdict(w).items()} for w in self.items]


def analyze(trace: Trace, mode: str, ceiling_bytes_per_s: float, material: float,
            reference: list[tuple[str, int | None]] | None = None) -> Analysis:
    from pipeline.trace.validity import the_range

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
