"""GPU timing with CUDA events: warm-up, an L2 flush before each timed launch,
variants interleaved in alternating order (never always the same one first)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

L2_FLUSH_BYTES = 256 << 20   # several times the H200's 60 MB L2


class L2Flush:
    """Writes a buffer larger than L2 so every timed launch starts cold."""

    def __init__(self, device: torch.device):
        self.buf = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.fill_(0x5A5A5A5A)


BUSY_CYCLES = 400_000  # ~0.2 ms at 2 GHz: longer than any host-side launch path


def event_time_us(fn: Callable[[], object], flush: L2Flush | None) -> float:
    """One launch timed with events around it (after an optional flush). The
    stream is kept busy past the start event, so the host's time to launch
    `fn` is not counted as GPU time."""
    if flush is not None:
        flush()
    torch.cuda._sleep(BUSY_CYCLES)  # type: ignore[no-untyped-call, unused-ignore]  # torch: untyped
    start, end = _timing_events()
    start.record()
    fn()
    end.record()
    end.synchronize()
    ms: float = start.elapsed_time(end)
    return ms * 1000.0


def _timing_events() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    # torch.cuda.Event.__new__ is untyped (torch); `unused-ignore` because where torch
    # is not installed (the lint session) it is Any and the ignore has nothing to do.
    return (torch.cuda.Event(enable_timing=True),  # type: ignore[no-untyped-call, unused-ignore]
            torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call, unused-ignore]


def interleaved(fns: dict[str, Callable[[], object]], *, repeats: int, device: torch.device,
                warmup: int = 3, flush: bool = True) -> dict[str, Any]:
    """`repeats` samples per variant; round i runs the variants in rotated order
    (A B, B A, …), so no variant always runs first."""
    l2 = L2Flush(device) if flush else None
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    torch.cuda.synchronize(device)
    samples: dict[str, list[float]] = {n: [] for n in names}
    order: list[list[str]] = []
    for i in range(repeats):
        k = i % len(names)
        round_order = names[k:] + names[:k]
        order.append(round_order)
        for name in round_order:
            samples[name].append(event_time_us(fns[name], l2))
    return {"samples_us": samples, "order": order}


def graph_replay_us(fn: Callable[[], object], *, device: torch.device, launches: int = 50,
                    replays: int = 20) -> list[float]:
    """GPU time per launch from CUDA-graph replays of `launches` back-to-back
    calls (no host launch gaps): one sample per replay."""
    stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call, unused-ignore]  # torch: untyped
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize(device)
    out: list[float] = []
    for _ in range(replays):
        start, end = _timing_events()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        ms: float = start.elapsed_time(end)
        out.append(ms * 1000.0 / launches)
    return out
