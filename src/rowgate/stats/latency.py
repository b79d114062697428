"""Per-request serving metrics, as `vllm bench serve` names and computes them.

Each request gives TTFT (time to first token), TPOT (time per output token after
the first: (E2EL - TTFT) / (output tokens - 1), only for requests with more than
one output token), its ITLs (the gaps between successive token arrivals) and E2EL
(end-to-end latency). A set of passes gives, in milliseconds, `mean_`, `median_`,
`std_` (numpy's population std, as vLLM) and `p90_` / `p99_` (numpy's linear
percentiles) of each: `mean_ttft_ms`, `p99_itl_ms`, …; `request_throughput`
(req/s) and `output_throughput` (tok/s) over the passes' summed wall time; and,
when the row sets SLOs, `request_goodput` (req/s of requests meeting every SLO;
TPOT counts as 0 for a one-token request, as vLLM does).

`pass_speed` is the one number per pass and arm the throughput gate pairs across
rounds: higher is faster. For a latency metric it is 1 / the pass's median of
that metric (over every ITL gap of the pass for `itl`: hundreds of per-step
samples, robust to a stray slow step); for `output_throughput` it is output
tokens / wall time. `sample_speed` is one arm's value over its k passes of one round
(the gate's sample length): with the interleaved schedule the mean of the k passes'
speeds; in bundles sealed with the blocked schedule (k consecutive passes per arm) the
metric over all k passes pooled: the median over all their samples, or their summed
tokens over their summed wall time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

LATENCIES = ("ttft", "tpot", "itl", "e2el")
THROUGHPUTS = ("output_throughput", "request_throughput")
METRICS = LATENCIES + ("output_throughput",)
"""What a throughput gate may decide on (`metric` in the row)."""
PERCENTILES = (90, 99)
SLO_METRICS = ("ttft", "tpot", "e2el")
"""The SLOs vLLM's `--goodput` accepts, in ms."""


class LatencyError(ValueError):
    """A request record cannot give the metric asked for."""


def request_values(req: Mapping[str, Any]) -> dict[str, list[float]]:
    """TTFT, TPOT, ITL and E2EL (seconds) of one request record (`output_tokens`,
    `ttft_s`, `latency_s`, `itl_s`); TTFT is absent where the arm did not stream."""
    out: dict[str, list[float]] = {"ttft": [], "tpot": [], "itl": list(req["itl_s"]),
                                   "e2el": [req["latency_s"]]}
    if req["ttft_s"] is not None:
        out["ttft"] = [req["ttft_s"]]
        if req["output_tokens"] > 1:
            out["tpot"] = [(req["latency_s"] - req["ttft_s"]) / (req["output_tokens"] - 1)]
    return out


def samples(requests: Iterable[Mapping[str, Any]], metric: str) -> list[float]:
    """Every sample of a latency metric over `requests` (seconds)."""
    return [v for req in requests for v in request_values(req)[metric]]


def pass_speed(metric: str, requests: Sequence[Mapping[str, Any]], wall_s: float,
               output_tokens: int) -> float:
    """The pass's speed on `metric` (see the module docstring); LatencyError if the
    pass has no sample of it (e.g. TTFT from an arm that did not stream)."""
    if metric == "output_throughput":
        if wall_s <= 0:
            raise LatencyError(f"wall time {wall_s} s is not positive")
        return output_tokens / wall_s
    if metric not in LATENCIES:
        raise LatencyError(f"metric {metric!r}: expected one of {', '.join(METRICS)}")
    values = samples(requests, metric)
    if not values:
        raise LatencyError(f"no {metric} samples in the pass ({len(requests)} requests)")
    mid = float(np.median(values))
    if mid <= 0:
        raise LatencyError(f"median {metric} {mid} s is not positive")
    return 1.0 / mid


SAMPLE_STATISTICS = ("mean", "pooled")


def schedule_statistic(schedule: str) -> str:
    """The sample statistic of a throughput cell's schedule (interleaved: mean; blocked,
    how bundles before the interleaved schedule were sealed: pooled)."""
    return "mean" if schedule == "interleaved" else "pooled"


def sample_speed(metric: str, requests: Sequence[Mapping[str, Any]],
                 walls_s: Sequence[float], output_tokens: Sequence[int],
                 statistic: str = "pooled") -> float:
    """One arm's speed over its k passes of a round (their requests, and walls and token
    counts in pass order; one pass is the case k = 1). `mean`: the mean of the passes'
    `pass_speed`s, requests taken by their `pass` index. Why the mean: a host that
    switches between a fast and a slow state (measured on the H200's host, docs/perf.md)
    makes the passes a two-mode mixture; the mean of k of them has 1/k of a pass's
    variance whatever the mixture, while the median of the pooled samples jumps between
    the modes. `pooled`: `pass_speed` over all k passes together (bundles sealed with
    the blocked schedule)."""
    if statistic == "pooled":
        return pass_speed(metric, requests, float(sum(walls_s)), int(sum(output_tokens)))
    if statistic != "mean":
        raise LatencyError(f"sample statistic {statistic!r}: expected one of "
                           f"{', '.join(SAMPLE_STATISTICS)}")
    by_pass: dict[int, list[Mapping[str, Any]]] = {}
    for r in requests:
        by_pass.setdefault(int(r.get("pass") or 0), []).append(r)
    return float(np.mean([pass_speed(metric, by_pass.get(i, []), float(w), int(t))
                          for i, (w, t) in enumerate(zip(walls_s, output_tokens, strict=True))]))


def _summary(name: str, values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ms = np.asarray(values, dtype=float) * 1000.0
    out = {f"mean_{name}_ms": float(ms.mean()), f"median_{name}_ms": float(np.median(ms)),
           f"std_{name}_ms": float(ms.std())}
    out.update({f"p{p}_{name}_ms": float(np.percentile(ms, p)) for p in PERCENTILES})
    return out


def _good(req: Mapping[str, Any], slo_ms: Mapping[str, float]) -> bool:
    v = request_values(req)
    have = {"ttft": v["ttft"][0] if v["ttft"] else None,
            "tpot": v["tpot"][0] if v["tpot"] else 0.0, "e2el": v["e2el"][0]}
    for key, limit in slo_ms.items():
        value = have[key]
        if value is None or value * 1000.0 > limit:
            return False
    return True


def bench_metrics(requests: Sequence[Mapping[str, Any]], wall_s: float,
                  slo_ms: Mapping[str, float] | None = None) -> dict[str, float | int]:
    """vLLM-bench metrics of one arm over a set of passes (`wall_s`: their summed wall
    time). Streaming metrics appear only when the requests carry them."""
    if wall_s <= 0:
        raise LatencyError(f"wall time {wall_s} s is not positive")
    out: dict[str, float | int] = {
        "completed": len(requests),
        "total_output_tokens": int(sum(r["output_tokens"] for r in requests)),
        "request_throughput": len(requests) / wall_s,
        "output_throughput": sum(r["output_tokens"] for r in requests) / wall_s}
    for name in LATENCIES:
        out.update(_summary(name, samples(requests, name)))
    if slo_ms:
        unknown = sorted(set(slo_ms) - set(SLO_METRICS))
        if unknown:
            raise LatencyError(f"goodput SLOs {unknown}: expected some of {SLO_METRICS}")
        out["request_goodput"] = sum(_good(r, slo_ms) for r in requests) / wall_s
    return out
