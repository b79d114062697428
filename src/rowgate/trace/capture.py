"""Capture one delayed profiler range around a decode engine's timed steps.

The procedure the Thor row's first (invalid) trace taught: warm the matching
concurrency, arm the profiler at a declared step delay, run an exact primer,
and let the profiler become active immediately before the timed decode steps.
A `torch.profiler.schedule(wait, warmup, active=steps, repeat=1)` does the
arming: `wait + warmup = arm_delay - 1` decode steps (the primer) pass before
the first recorded step, so recording starts at decode step `arm_delay`
(1-based) and exactly one range is written. A synchronous `prof.start()` is
what the Thor trace did wrong: it records the idle GPU and its clock ramp; the
`synchronous` plan exists only to produce that refusal on real hardware.

The engine is instrumented, not modified: every decode step is wrapped in a
`rowgate.step#<phase>:<i>` marker (and counted for the schedule), the model's
eager decode forward in `rowgate.forward`, a graph replay call in
`rowgate.graph_run`. NVML samples SM / memory clocks and
temperature in a side thread for the whole run; a copy ceiling (device-to-device
bandwidth on GPU, memory copy on CPU) is measured in the same process after
the range.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rowgate.errors import Error
from rowgate.trace import events

if TYPE_CHECKING:
    from torch.profiler import profile, record_function

    from rowgate.engines.interface import Engine, PassResult, WorkloadPass

TRACE_FILE = "trace.json.gz"
CLOCKS_FILE = "clocks.json"
CAPTURE_FILE = "capture.json"
CLOCK_PERIOD_S = 0.005
CAPTURE_FORMAT = 2
"""capture.json's format: 2 added the timed pass's outputs and their workload requests
(matched windows); a gate reports what a format-1 capture cannot support as before."""


class CaptureError(Error):
    """The capture could not run (engine, profiler or device problem)."""


@dataclass(frozen=True)
class CapturePlan:
    """What one capture runs, from the row's trace gate spec."""

    concurrency: int
    """Timed (and warm) concurrency."""
    primer_steps: int
    primer_concurrency: int
    arm_delay: int
    """1-based decode step (counted from the primer's first) at which recording starts."""
    steps: int
    """Timed decode steps recorded in the range."""
    warm_steps: int = 8
    synchronous: bool = False
    """Start recording at once, no warm-up/primer: the invalid procedure, kept to prove
    that validity refuses it."""
    idle_before_s: float = 0.0
    """Sleep before a synchronous start, so the device idles (and downclocks) first."""

    def schedule(self) -> tuple[int, int, int]:
        """(wait, warmup, active) for `torch.profiler.schedule`; warmup ≥ 1 when possible
        so Kineto's start-up cost falls outside the range."""
        before = max(self.arm_delay - 1, 0)
        warmup = 1 if before >= 1 else 0
        return before - warmup, warmup, self.steps

    def timed_steps(self) -> int:
        """Decode steps the timed pass runs: the recorded ones plus any the delay
        places after the primer."""
        extra = 0 if self.synchronous else max(self.arm_delay - 1 - self.primer_steps, 0)
        return self.steps + extra


# ------------------------------------------------------------------ clocks


class ClockSampler:
    """NVML clock/temperature samples in a side thread (Unix time `t`)."""

    def __init__(self, gpu_index: int | None, period_s: float = CLOCK_PERIOD_S):
        self.gpu_index, self.period_s = gpu_index, period_s
        self.samples: list[dict[str, Any]] = []
        self.error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "ClockSampler":
        if self.gpu_index is not None:
            self._thread = threading.Thread(target=self._run, name="rowgate-clocks", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        from rowgate.seal import device

        index = self.gpu_index
        if index is None:  # __enter__ starts this thread only for a GPU
            return
        while not self._stop.is_set():
            try:
                self.samples.append(device.sample_clocks(index, time.time()).model_dump())
            except Exception as exc:  # NVML errors are per cause; any one ends sampling
                self.error = f"NVML sampling stopped: {exc}"
                return
            self._stop.wait(self.period_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def record(self) -> dict[str, Any]:
        if self.gpu_index is None:
            return {"skipped": "cpu: no NVML clocks on a CPU capture", "samples": []}
        from rowgate.seal import device

        gpu = next((g for g in device.gpus() if g.index == self.gpu_index), None)
        return {"gpu_index": self.gpu_index, "period_s": self.period_s, "error": self.error,
                "max_sm_clock_mhz": gpu.max_sm_clock_mhz if gpu else None,
                "gpu": gpu.model_dump() if gpu else None, "samples": self.samples}


# ------------------------------------------------------------ instrumenting


class _Stepper:
    """Counts decode steps, tags them, and drives the profiler's schedule."""

    def __init__(self, sync: Callable[[], None]):
        self.phase = "warm"
        self.index = 0
        self.prof: profile | None = None
        self.started = 0
        """Decode steps since the profiler started (the schedule's step count)."""
        self.sync = sync
        self.range_fn: record_function | None = None
        self.range_opened_at: float | None = None
        self.range_closed = False
        self.timed_left = 0

    def _recording(self) -> bool:
        from torch.profiler import ProfilerAction

        return self.prof is not None and self.prof.current_action in (
            ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)

    def before(self) -> None:
        if self.prof is not None and self.started > 0 and not self.range_closed:
            if self.range_fn is None:
                # Nothing of the previous steps may still run on the device when
                # recording starts: their kernels would land inside the range.
                self.sync()
            self.prof.step()
        if self._recording() and self.range_fn is None and not self.range_closed:
            self._open_range()

    def _open_range(self) -> None:
        from torch.profiler import record_function

        self.range_fn = record_function(events.RANGE_MARKER)
        # torch's record_function.__enter__ carries no annotations
        self.range_fn.__enter__()  # type: ignore[no-untyped-call]
        self.range_opened_at = time.time()

    def after(self) -> None:
        if self.prof is not None:
            self.started += 1
        if self.phase == "timed":
            self.timed_left -= 1
        prof = self.prof  # never None once a range is open: it opens only while recording
        if self.range_fn is None or self.range_closed or prof is None:
            self.index += 1
            return
        from torch.profiler import ProfilerAction

        window_done = prof.record_steps and \
            prof.current_action == ProfilerAction.RECORD_AND_SAVE
        if window_done or (self.phase == "timed" and self.timed_left == 0):
            self.range_fn.__exit__(None, None, None)
            self.range_closed = True
            self.sync()
            if window_done:
                prof.step()  # ends the active window: the trace is written now
        self.index += 1


def instrument(engine: Any, stepper: _Stepper) -> Callable[[], None]:
    """Wrap the reference engine's decode step and forward with markers; returns what
    takes them off again.

    These are the engine's own attributes (`_decode_step`, `model.decode`,
    `_graphs.run`), wrapped on this instance only: the engine module stays
    untouched, and a renamed attribute fails here loudly, not silently. (`Any`: these
    are the reference engine's private attributes, checked just below at run time.)
    The undo matters: a traced engine serves the row's later gates (engine_pool), and
    the stepper synchronizes the device around every step.
    """
    from torch.profiler import record_function

    for attr in ("_decode_step", "model"):
        if not hasattr(engine, attr) or getattr(engine, attr) is None:
            raise CaptureError(f"engine {type(engine).__name__}: no {attr!r} to instrument "
                               f"(started? reference engine API changed?)")
    step = engine._decode_step

    def decode_step(*args: Any, **kwargs: Any) -> Any:
        stepper.before()
        with record_function(f"{events.STEP_MARKER}#{stepper.phase}:{stepper.index}"):
            out = step(*args, **kwargs)
        stepper.after()
        return out

    targets = [(engine.model, "decode", events.FORWARD_MARKER)]
    if getattr(engine, "_graphs", None) is not None:
        targets.append((engine._graphs, "run", events.GRAPH_RUN_MARKER))
    # Instance attributes shadow the class's methods; undoing deletes them again (or puts
    # back an instance attribute that was there before).
    saved = [(obj, name, obj.__dict__.get(name)) for obj, name, _ in targets]
    saved.append((engine, "_decode_step", engine.__dict__.get("_decode_step")))
    engine._decode_step = decode_step
    for obj, name, marker in targets:
        inner = getattr(obj, name)

        def wrapped(*args: Any, _inner: Callable[..., Any] = inner, _marker: str = marker,
                    **kwargs: Any) -> Any:
            with record_function(_marker):
                return _inner(*args, **kwargs)

        setattr(obj, name, wrapped)

    def undo() -> None:
        for obj, name, before in saved:
            if before is None:
                obj.__dict__.pop(name, None)
            else:
                setattr(obj, name, before)

    return undo


# ------------------------------------------------------------------ passes


def _pass(prompts: Sequence[tuple[int, ...]], concurrency: int, decode_steps: int,
          tag: str) -> WorkloadPass:
    from rowgate.engines.interface import Request, WorkloadPass

    if len(prompts) < concurrency:
        raise CaptureError(f"capture: {len(prompts)} prompt(s) for concurrency {concurrency}")
    # max_tokens counts the prefill's token too: n + 1 tokens are n decode steps.
    reqs = tuple(Request(id=f"{tag}-r{i}", cell=tag, prompt_ids=tuple(prompts[i]),
                         max_tokens=decode_steps + 1, seed=0) for i in range(concurrency))
    return WorkloadPass(cell=tag, concurrency=concurrency, requests=reqs)


def _run_phase(engine: Engine, stepper: _Stepper, phase: str, work: WorkloadPass
               ) -> list[dict[str, Any]]:
    stepper.phase, stepper.index = phase, 0
    try:
        result = engine.generate(work)
    except Error as exc:
        raise CaptureError(f"capture: {phase} pass failed: {exc.diagnostics()}") from exc
    return outputs_record(result)


def outputs_record(result: PassResult) -> list[dict[str, Any]]:
    """A pass's outputs as the capture record keeps them (the traced tokens are matched
    to the correctness pass: src/rowgate/trace/windows.py)."""
    return [{"id": o.id, "token_ids": list(o.token_ids), "logprobs": list(o.logprobs),
             "alternatives": [list(map(list, a)) for a in o.alternatives]}
            for o in result.outputs]


# ----------------------------------------------------------------- ceiling


def copy_ceiling(device: str) -> dict[str, Any]:
    """Best device-to-device (or host memory) copy bandwidth, bytes read + written per s."""
    import torch

    if device.startswith("cuda"):
        n = 1 << 30  # 1 GiB: far beyond L2, so this is HBM bandwidth
        src = torch.empty(n, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        best = float("inf")
        for _ in range(10):
            # torch.cuda.Event.__init__ carries no annotations
            a = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            b = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            best = min(best, a.elapsed_time(b) / 1e3)
        method = "torch copy_ of 1 GiB on the device, best of 10, CUDA events"
    else:
        n = 64 << 20
        src = torch.empty(n, dtype=torch.uint8)
        dst = torch.empty_like(src)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
        method = "torch copy_ of 64 MiB in host memory, best of 5, perf_counter"
    return {"bytes_per_s": 2 * n / best, "bytes": 2 * n, "seconds": best, "method": method}


# ----------------------------------------------------------------- capture


def _profiler(plan: CapturePlan, device: str, export_to: Path
              ) -> tuple[profile, list[Path]]:
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    written: list[Path] = []

    def ready(prof: profile) -> None:
        path = export_to / f"range-{len(written)}.json"
        prof.export_chrome_trace(str(path))
        written.append(path)

    sched = None
    if not plan.synchronous:
        wait, warmup, active = plan.schedule()
        sched = schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    # acc_events: the schedule has one cycle (repeat=1), so keeping events across
    # cycles changes nothing; without it torch 2.11 warns that it clears them.
    prof = profile(activities=activities, schedule=sched, on_trace_ready=ready,
                   record_shapes=True, acc_events=True)
    return prof, written


def capture(engine: Engine, prompts: Sequence[tuple[int, ...]], plan: CapturePlan, out_dir: Path,
            device: str, gpu_index: int | None = None,
            sources: Sequence[str] = ()) -> dict[str, Any]:
    """Run warm → primer → timed steps with one delayed range; write the artifacts.

    `engine` is a started reference engine. Writes `trace.json.gz` (every range
    the profiler produced, merged: validity counts them), `clocks.json` and
    `capture.json` (with the timed pass's outputs and `sources`, the workload request
    each prompt came from) under `out_dir`; returns the capture record.
    """
    import torch

    cuda = device.startswith("cuda")
    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(device)) if cuda else (
        lambda: None)
    stepper = _Stepper(sync)
    undo = instrument(engine, stepper)
    out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        stack.callback(undo)
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="rowgate-trace-"))
        clocks = stack.enter_context(ClockSampler(gpu_index))
        prof, written = _profiler(plan, device, Path(tmp))
        if not plan.synchronous:
            _run_phase(engine, stepper, "warm", _pass(prompts, plan.concurrency,
                                                      plan.warm_steps, "warm"))
            sync()
            stepper.prof = prof
            prof.start()
            if plan.primer_steps:
                _run_phase(engine, stepper, "primer", _pass(
                    prompts, plan.primer_concurrency, plan.primer_steps, "primer"))
        else:
            time.sleep(plan.idle_before_s)
            stepper.prof = prof
            prof.start()
        stepper.timed_left = plan.timed_steps()
        timed = _run_phase(engine, stepper, "timed", _pass(prompts, plan.concurrency,
                                                           plan.timed_steps(), "timed"))
        # Writes what a synchronous start recorded, or a range a too-short run
        # left open; after a completed schedule it does nothing.
        prof.stop()
        ranges = [events.read_doc(p) for p in written]
    ceiling = copy_ceiling(device)
    doc = merge_ranges(ranges)
    events.write_doc(doc, out_dir / TRACE_FILE)
    (out_dir / CLOCKS_FILE).write_text(json.dumps(clocks.record(), indent=1) + "\n")
    record = {"format": CAPTURE_FORMAT, "plan": dataclasses.asdict(plan),
              "schedule": list(plan.schedule()),
              "ranges_written": len(ranges), "device": device, "torch": torch.__version__,
              "engine": engine.describe(), "range_opened_unix_s": stepper.range_opened_at,
              "copy_ceiling": ceiling, "timed_outputs": timed,
              "prompt_sources": list(sources)[:len(timed)]}
    (out_dir / CAPTURE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def merge_ranges(ranges: list[dict[str, Any]]) -> dict[str, Any]:
    """One document from every range the profiler wrote (normally exactly one).

    Two ranges are kept, not dropped: validity must see them to refuse them.
    """
    if not ranges:
        raise CaptureError("capture: the profiler wrote no trace (no step reached the range)")
    doc = dict(ranges[0])
    doc["traceEvents"] = [e for r in ranges for e in r.get("traceEvents", [])]
    doc["rowgateRanges"] = len(ranges)
    return doc
