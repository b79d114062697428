"""Capture one delayed range with an engine's own profiler (vLLM's convention).

For an arm rowgate does not run in its own process (vLLM offline, vLLM's server,
any OpenAI server with `/start_profile` and `/stop_profile`), the procedure the
Thor trace taught is carried out through the engine's profiler, counted in the
engine's own iterations:

1. warm the timed concurrency (`warm_steps + 1` tokens per request);
2. arm: `start_profile(delay_iterations = arm_delay, max_iterations = steps +
   concurrency)`; recording begins at the engine's `arm_delay`-th iteration from
   here, i.e. right after a primer of `arm_delay - 1` iterations;
3. the primer: `primer_concurrency` requests of `primer_steps` tokens — one
   prefill iteration and `primer_steps - 1` decode iterations, exactly
   `primer_steps` iterations;
4. the timed pass: `concurrency` requests long enough that the window holds
   `steps` decode iterations after its prefill (the `concurrency` spare
   iterations absorb a prefill the engine splits across arrivals);
5. `stop_profile()`: the engine writes its trace into the directory rowgate
   gave it; every trace file found there is kept (validity refuses two).

The client records when it sent and received each phase (`phases.json`, Unix
time); `engine_trace` reads the engine's iteration annotations against it.
NVML clocks are sampled in this process for the whole run, and the copy ceiling
is measured here afterwards, as for rowgate's own captures.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rowgate.engines.interface import Engine, Request, WorkloadPass
from rowgate.errors import Error
from rowgate.trace import events
from rowgate.trace.capture import (
    CAPTURE_FILE,
    CAPTURE_FORMAT,
    CLOCKS_FILE,
    TRACE_FILE,
    CaptureError,
    CapturePlan,
    ClockSampler,
    copy_ceiling,
    merge_ranges,
    outputs_record,
)
from rowgate.trace.engine_trace import PHASES_FILE

TRACE_GLOBS = ("*.pt.trace.json.gz", "*.pt.trace.json")
WRITE_WAIT_S = 60.0


def _pass(prompts: Sequence[tuple[int, ...]], concurrency: int, tokens: int,
          tag: str) -> WorkloadPass:
    if len(prompts) < concurrency:
        raise CaptureError(f"capture: {len(prompts)} prompt(s) for concurrency {concurrency}")
    reqs = tuple(Request(id=f"{tag}-r{i}", cell=tag, prompt_ids=tuple(prompts[i]),
                         max_tokens=tokens, seed=0) for i in range(concurrency))
    return WorkloadPass(cell=tag, concurrency=concurrency, requests=reqs)


def _run(engine: Engine, phase: str, work: WorkloadPass, phases: list[dict[str, Any]]
         ) -> list[dict[str, Any]]:
    start = time.time()
    try:
        result = engine.generate(work)
    except Error as exc:
        raise CaptureError(f"capture: {phase} pass failed: {exc.diagnostics()}") from exc
    phases.append({"phase": phase, "start_unix": start, "end_unix": time.time(),
                   "requests": len(work.requests), "tokens": work.requests[0].max_tokens})
    return outputs_record(result)


def timed_tokens(plan: CapturePlan) -> int:
    """Tokens per timed request: the delay past the primer, the recorded iterations and
    one more, so the engine is still busy when the window closes."""
    extra = 0 if plan.synchronous else max(plan.arm_delay - 1 - plan.primer_steps, 0)
    return extra + plan.steps + plan.concurrency + 1


def _trace_files(directory: Path) -> list[Path]:
    """The engine's trace files, once it has written them (servers may finish writing
    just after answering /stop_profile)."""
    deadline = time.monotonic() + WRITE_WAIT_S
    while True:
        files = sorted({p for g in TRACE_GLOBS for p in directory.rglob(g)})
        if files or time.monotonic() > deadline:
            return files
        time.sleep(0.2)


def capture_engine(engine: Engine, prompts: Sequence[tuple[int, ...]], plan: CapturePlan,
                   out_dir: Path, device: str, gpu_index: int | None = None,
                   sources: Sequence[str] = ()) -> dict[str, Any]:
    """Start `engine` with its profiler writing to a scratch directory, run the
    procedure, and write trace, phases, clocks and the capture record (with the timed
    pass's outputs and `sources`, the workload request each prompt came from) to
    `out_dir`."""
    why = engine.untraceable()
    if why:
        raise CaptureError(f"capture: {why}")
    out_dir.mkdir(parents=True, exist_ok=True)
    phases: list[dict[str, Any]] = []
    timed: list[dict[str, Any]] = []
    max_iterations = plan.steps + plan.concurrency
    delay = 0 if plan.synchronous else plan.arm_delay
    with tempfile.TemporaryDirectory(prefix="rowgate-engine-trace-") as tmp:
        try:
            engine.enable_profiling(Path(tmp))
            with engine, ClockSampler(gpu_index) as clocks:
                if not plan.synchronous:
                    _run(engine, "warm", _pass(prompts, plan.concurrency, plan.warm_steps + 1,
                                               "warm"), phases)
                else:
                    time.sleep(plan.idle_before_s)
                engine.start_profile(delay, max_iterations)
                if plan.primer_steps and not plan.synchronous:
                    _run(engine, "primer", _pass(prompts, plan.primer_concurrency,
                                                 plan.primer_steps, "primer"), phases)
                timed = _run(engine, "timed", _pass(
                    prompts, plan.concurrency, timed_tokens(plan), "timed"), phases)
                engine.stop_profile()
                described = engine.describe()
        except Error as exc:
            raise CaptureError(f"capture: {exc.diagnostics()}") from exc
        files = _trace_files(Path(tmp))
        ranges = [events.read_doc(p) for p in files]
        names = [p.name for p in files]
    doc = merge_ranges(ranges)
    events.write_doc(doc, out_dir / TRACE_FILE)
    (out_dir / PHASES_FILE).write_text(json.dumps(phases, indent=1) + "\n")
    (out_dir / CLOCKS_FILE).write_text(json.dumps(clocks.record(), indent=1) + "\n")
    record = {"format": CAPTURE_FORMAT, "kind": "engine", "plan": dataclasses.asdict(plan),
              "delay_iterations": delay, "max_iterations": max_iterations,
              "timed_tokens": timed_tokens(plan), "trace_files": names,
              "ranges_written": len(ranges), "device": device, "engine": described,
              "timed_outputs": timed, "prompt_sources": list(sources)[:len(timed)],
              "copy_ceiling": copy_ceiling(device)}
    (out_dir / CAPTURE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record
