"""vLLM-bench metrics: the definitions of `vllm bench serve` on hand-made requests."""

from __future__ import annotations

import numpy as np
import pytest

from rowgate.stats import latency

REQS = [
    {"output_tokens": 4, "ttft_s": 0.5, "latency_s": 2.0, "itl_s": [0.4, 0.5, 0.6]},
    {"output_tokens": 1, "ttft_s": 0.3, "latency_s": 0.3, "itl_s": []},
    {"output_tokens": 3, "ttft_s": 0.2, "latency_s": 1.2, "itl_s": [0.5, 0.5]},
]


def test_tpot_itl_and_e2el_follow_vllm():
    v = latency.request_values(REQS[0])
    assert v["ttft"] == [0.5] and v["itl"] == [0.4, 0.5, 0.6] and v["e2el"] == [2.0]
    assert v["tpot"] == [pytest.approx((2.0 - 0.5) / 3)]
    assert latency.request_values(REQS[1])["tpot"] == []  # one token: no TPOT
    no_stream = latency.request_values({**REQS[0], "ttft_s": None})
    assert no_stream["ttft"] == no_stream["tpot"] == []


def test_bench_metrics_use_vllms_names_units_and_numpy_statistics():
    m = latency.bench_metrics(REQS, wall_s=4.0)
    itl_ms = np.array([0.4, 0.5, 0.6, 0.5, 0.5]) * 1000
    assert m["mean_itl_ms"] == pytest.approx(itl_ms.mean())
    assert m["median_itl_ms"] == pytest.approx(np.median(itl_ms))
    assert m["std_itl_ms"] == pytest.approx(itl_ms.std())  # population std, as vLLM
    assert m["p99_itl_ms"] == pytest.approx(np.percentile(itl_ms, 99))
    assert m["p90_ttft_ms"] == pytest.approx(np.percentile([500, 300, 200], 90))
    assert m["mean_tpot_ms"] == pytest.approx(np.mean([1500 / 3, 1000 / 2]))
    assert m["mean_e2el_ms"] == pytest.approx(np.mean([2000, 300, 1200]))
    assert m["request_throughput"] == pytest.approx(3 / 4.0)
    assert m["output_throughput"] == pytest.approx(8 / 4.0)
    assert "request_goodput" not in m


def test_goodput_counts_requests_meeting_every_slo():
    # TTFT <= 400 ms: requests 2 and 3; TPOT <= 500 ms: 1 (500), 2 (0: one token), 3 (500)
    m = latency.bench_metrics(REQS, wall_s=2.0, slo_ms={"ttft": 400, "tpot": 500})
    assert m["request_goodput"] == pytest.approx(2 / 2.0)
    m = latency.bench_metrics(REQS, wall_s=2.0, slo_ms={"e2el": 1000})
    assert m["request_goodput"] == pytest.approx(1 / 2.0)
    with pytest.raises(latency.LatencyError, match="itl"):
        latency.bench_metrics(REQS, wall_s=2.0, slo_ms={"itl": 10})


def test_pass_speed_is_the_inverse_median_or_the_throughput():
    assert latency.pass_speed("itl", REQS, 4.0, 8) == pytest.approx(1 / 0.5)
    assert latency.pass_speed("e2el", REQS, 4.0, 8) == pytest.approx(1 / 1.2)
    assert latency.pass_speed("output_throughput", REQS, 4.0, 8) == pytest.approx(2.0)
    with pytest.raises(latency.LatencyError, match="no ttft samples"):
        latency.pass_speed("ttft", [{**r, "ttft_s": None} for r in REQS], 4.0, 8)
    with pytest.raises(latency.LatencyError, match="expected one of"):
        latency.pass_speed("goodput", REQS, 4.0, 8)
