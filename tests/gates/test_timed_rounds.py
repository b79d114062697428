"""The throughput gate's rounds (src/rowgate/gates/throughput/measure.py) and their re-derivation
(_ab.py, _tp_artifacts.py) on synthetic engines: real `Engine` implementations on a
virtual clock (benchmarks/calibrate_throughput.py), so the noise, the drift, the
planted slowdowns and the clock drops are known, and a run takes milliseconds."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from rowgate import compressed
from rowgate.gates.interface import GateError
from rowgate.gates.throughput import artifacts as art
from rowgate.gates.throughput import derive as _ab
from rowgate.gates.throughput import measure as _timed
from rowgate.records.status import Status

ROOT = Path(__file__).resolve().parents[2]


def _calibration():
    name = "calibrate_throughput"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, ROOT / "benchmarks" / "calibrate_throughput.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


cal = _calibration()
PASSES = cal.synthetic_passes((1, 4))
ONE_PASS = cal.default_plans(PASSES, min_sample_s=0.0)
"""k = 1: one pass per arm per round (the tamper tests edit single passes)."""


def _engines(seed: int, slowdown: float = 0.0, **machine):
    m = cal.Machine(np.random.default_rng(seed), **machine)
    return m, {"baseline": cal.SyntheticEngine(m, 0.0006, 0.002),
               "candidate": cal.SyntheticEngine(m, 0.0006, 0.002, slowdown=slowdown)}


def _run(tmp: Path, seed: int, slowdown: float = 0.0, plans=None, clocks: bool = False,
         **machine):
    m, engines = _engines(seed, slowdown, **machine)
    plans = plans or cal.default_plans(PASSES)
    out = tmp / f"run-{seed}-{slowdown}"
    status, cells = cal.gate_run(engines, PASSES, plans, out, m.clock if clocks else None,
                                 now=m.now)
    return status, cells, out, plans


def _derive(out: Path, plans):
    meta, rows, requests, clocks = art.read_raw(out)
    return art.derive_cells(plans, meta, rows, requests, clocks)


def test_aa_runs_are_equivalent_and_rederive_identically(tmp_path):
    for seed in range(8):
        status, cells, out, plans = _run(tmp_path, seed)
        assert status == "PASS", cells
        assert {c["verdict"] for c in cells.values()} == {"equivalent"}
        assert _derive(out, plans) == cells


def test_a_planted_five_percent_slowdown_is_worse_in_every_cell(tmp_path):
    for seed in range(4):
        status, cells, _, _ = _run(tmp_path, seed, slowdown=0.05)
        assert status == "FAIL"
        assert {c["verdict"] for c in cells.values()} == {"worse"}
        for c in cells.values():
            assert c["ratio_ci_high"] < 0.99 and c["ratio"] == pytest.approx(1 / 1.05, abs=0.01)


def test_raw_records_hold_every_pass_request_and_token_digest(tmp_path):
    _, cells, out, _ = _run(tmp_path, 1)
    with open(out / art.PASSES, newline="") as f:
        rows = list(csv.DictReader(f))
    meta = json.loads((out / art.META).read_text())
    for cell, rec in meta["records"].items():
        mine = [r for r in rows if r["cell"] == cell]
        k = rec["passes_per_sample"]
        assert k == cells[cell]["passes_per_sample"] and k > 1  # ~20 ms passes: 100 ms samples
        assert len(mine) == 2 * (rec["warmup_rounds"] + k * rec["rounds"])
        timed = [(r["arm"], int(r["pass"])) for r in mine if r["phase"] == "timed"]
        a, b = _timed.round_order("alternating", 0, 0)
        assert timed[:4] == [(a, 0), (b, 0), (b, 1), (a, 1)]  # interleaved: A B, B A, …
        assert sorted(timed[:2 * k]) == sorted((arm, i) for arm in (a, b) for i in range(k))
        assert cells[cell]["rounds"] == rec["rounds"] and rec["stop"] == "decided"
    requests = [json.loads(line) for line in compressed.read_text(out / f"{art.REQUESTS}.gz").splitlines()]
    timed = [r for r in requests if r["phase"] == "timed"]
    kept = [r for r in timed if "token_ids" in r]
    assert {r["round"] for r in kept} == {0}  # the first timed pass keeps the ids
    assert len(kept) == len({(r["arm"], r["id"]) for r in timed})
    assert all(len(r["itl_s"]) == r["output_tokens"] - 1 for r in requests)
    c1 = cells["i16-c1"]
    for arm in ("baseline", "candidate"):
        assert c1[f"{arm}_median_itl_ms"] > 0 and c1[f"{arm}_p99_itl_ms"] >= \
            c1[f"{arm}_median_itl_ms"]
        assert c1[f"{arm}_output_throughput"] > 0
    assert c1["itl_ratio"] == pytest.approx(1 / c1["ratio"], rel=1e-6)


def test_alternating_order_cancels_a_linear_drift_that_a_fixed_order_would_not(tmp_path,
                                                                                monkeypatch):
    # the machine slows by ~2 % per pass: a fixed order always puts the candidate later
    # (one pass per sample: the drift per round is then the drift of one pass)
    drift = {"slope": 1.0, "drift": 0.0, "pass_noise": 0.001, "plans": ONE_PASS}
    for seed in range(3):
        status, cells, _, _ = _run(tmp_path, seed, **drift)
        assert {c["verdict"] for c in cells.values()} == {"equivalent"}, cells
    fixed = lambda order, k, seed: _timed.ROLES  # noqa: E731
    monkeypatch.setattr(_timed, "round_order", fixed)
    monkeypatch.setattr(_ab, "round_order", fixed)
    _, cells, _, _ = _run(tmp_path / "fixed", 0, **drift)
    assert {c["verdict"] for c in cells.values()} <= {"worse", "underpowered"}


def test_rounds_whose_clocks_moved_are_discarded_said_and_replaced(tmp_path):
    status, cells, out, plans = _run(tmp_path, 3, clocks=True, clock_drop_rate=0.05)
    discarded = sum(c["rounds_discarded"] for c in cells.values())
    assert discarded > 0
    for c in cells.values():
        assert c["verdict"] == "equivalent"
        if c["rounds_discarded"]:
            assert "discarded" in c["warning"] and "SM clock moved 1500-1980" in c["warning"]
            assert c["rounds_run"] == c["rounds"] + c["rounds_discarded"]
        assert c["sm_clock_min_mhz"] == 1980  # only valid rounds feed the clock metrics
    assert _derive(out, plans) == cells


def test_too_many_discards_end_the_cell_underpowered(tmp_path):
    plans = cal.default_plans(PASSES, max_discarded=2)
    status, cells, out, _ = _run(tmp_path, 4, plans=plans, clocks=True, clock_drop_rate=0.9)
    for c in cells.values():
        assert c["stop"] == "discards" and c["rounds_discarded"] == 3
        assert "3 round(s) discarded" in c["warning"]
        # the budget's last look decides only with enough valid rounds for a CI
        assert c["verdict"] == "underpowered" or c["rounds"] >= 3
    assert any(c["verdict"] == "underpowered" for c in cells.values()) and status == "FAIL"


def test_the_time_budget_ends_a_noisy_cell_underpowered_with_what_it_would_need(tmp_path):
    # 2 s: ~10 rounds of 5 passes per arm (~20 ms each)
    plans = cal.default_plans(PASSES, max_seconds=2.0)
    status, cells, out, _ = _run(tmp_path, 5, plans=plans, pass_noise=0.08)
    assert status == "FAIL"
    for c in cells.values():
        assert c["stop"] == "time" and c["verdict"] == "underpowered"
        assert c["rounds"] < 40 and c["rounds_needed"] > c["rounds"]
        assert c["looks"].split(",")[-1] == str(c["rounds"])  # one more look at the end
    assert "would need ~" in art.gate_verdict(cells, "baseline", True, None).reason
    assert art.gate_verdict(cells, "baseline", False, None).status is Status.PASS


def test_warmup_runs_until_the_arms_settle(tmp_path):
    class Cold(cal.SyntheticEngine):
        passes = 0

        def generate(self, work):
            self.passes += 1
            result = super().generate(work)
            extra = {1: 0.05, 2: 0.02}.get(self.passes, 0.0)  # graph capture, allocator growth
            self.machine.t += extra
            result = type(result)(outputs=result.outputs, wall_s=result.wall_s + extra)
            return result

    m = cal.Machine(np.random.default_rng(6))
    engines = {"baseline": Cold(m, 0.0006, 0.002), "candidate": Cold(m, 0.0006, 0.002)}
    plans = cal.default_plans(PASSES, metric="output_throughput")
    status, cells = cal.gate_run(engines, PASSES, plans, tmp_path / "cold", now=m.now)
    assert cells["i16-c1"]["warmup_rounds"] == 4 and cells["i16-c1"]["warmup_settled"]
    assert cells["i16-c4"]["warmup_rounds"] == 2


def _tamper(out: Path, edit) -> None:
    with open(out / art.PASSES, newline="") as f:
        rows = list(csv.DictReader(f))
    rows = edit(rows)
    with open(out / art.PASSES, "w", newline="") as f:
        w = csv.DictWriter(f, _timed.PASS_FIELDS)
        w.writeheader()
        w.writerows(rows)


@pytest.mark.parametrize("edit,match", [
    (lambda rows: rows[:-2], "passes recorded|schedule says"),
    (lambda rows: rows[:-2] + [dict(r, round=str(int(r["round"]))) for r in rows[-2:]][::-1],
     "schedule says"),
    (lambda rows: rows + [dict(r, round=str(int(r["round"]) + 1)) for r in rows[-2:]][::-1],
     "passes recorded|schedule says|yet"),
])
def test_records_that_do_not_follow_the_design_are_an_error(tmp_path, edit, match):
    _, _, out, plans = _run(tmp_path, 7, plans=ONE_PASS)
    _tamper(out, edit)
    with pytest.raises(GateError, match=match):
        _derive(out, plans)


def test_an_extra_round_after_the_deciding_look_is_an_error(tmp_path):
    _, _, out, plans = _run(tmp_path, 8, plans=ONE_PASS)
    meta = json.loads((out / art.META).read_text())
    cell = meta["cells"][-1]
    rec = meta["records"][cell]
    k = rec["rounds"]

    def extra(rows):
        last = [r for r in rows if r["cell"] == cell and r["phase"] == "timed"][-2:]
        order = _timed.round_order("alternating", k, plans[cell].seed)
        new = {r["arm"]: dict(r, round=str(k)) for r in last}
        return rows + [new[a] for a in order]

    _tamper(out, extra)
    requests = [json.loads(line) for line in compressed.read_text(out / f"{art.REQUESTS}.gz").splitlines()]
    requests += [dict(r, round=k) for r in requests
                 if r["cell"] == cell and r["phase"] == "timed" and r["round"] == k - 1]
    compressed.write_text(out / f"{art.REQUESTS}.gz", "".join(json.dumps(r) + "\n" for r in requests))
    rec["rounds"] = k + 1
    (out / art.META).write_text(json.dumps(meta))
    with pytest.raises(GateError, match=r"decide.* at 8 rounds, yet 9"):
        _derive(out, plans)


def test_derive_refuses_a_plan_other_than_the_rows(tmp_path):
    _, _, out, _ = _run(tmp_path, 9)
    with pytest.raises(GateError, match="another plan"):
        _derive(out, cal.default_plans(PASSES, min_effect=0.05))


def test_timed_tokens_must_agree_across_rounds_and_with_the_correctness_pass(tmp_path):
    from rowgate.engines.divergence import Out

    _, _, out, plans = _run(tmp_path, 10)
    requests = [json.loads(line) for line in compressed.read_text(out / f"{art.REQUESTS}.gz").splitlines()]
    kept, bad = _ab.timed_tokens(requests)
    assert not bad
    correct = {"candidate": {rid: Out.from_json(r) for (arm, rid), r in kept.items()
                             if arm == "candidate"}}
    ok = art.timed_window(requests, correct, 0.0, {"baseline": "no pass"})
    assert (ok.state, ok.compared, ok.problems) == ("matched", len(correct["candidate"]), ())
    assert ok.unchecked == ("baseline: no pass",)
    rid = next(iter(correct["candidate"]))
    first = correct["candidate"][rid]
    wrong = {"candidate": {**correct["candidate"],
                           rid: Out((first.tokens[0] + 1,) + first.tokens[1:], first.logprobs, ())}}
    refused = art.timed_window(requests, wrong, 0.0, {})
    assert refused.state == "refused"
    assert refused.problems[0].startswith(f"candidate: 1 request(s) whose timed tokens differ "
                                          f"from the correctness pass; first request {rid} "
                                          f"position 0")
    missing = {"candidate": {k: v for k, v in correct["candidate"].items() if k != rid}}
    assert "has no correctness pass" in art.timed_window(requests, missing, 0.0, {}).problems[0]
    later = next(r for r in requests if r["phase"] == "timed" and r["round"] == 3)
    later.update(tokens_sha256="0" * 64, token_ids=[1, 2, 3])
    _, bad = _ab.timed_tokens(requests)
    assert any("do not match their digest" in b for b in bad)
    assert any("different token sequences" in b for b in bad)
    derived = art.gate_verdict(_derive(out, plans), "baseline", True,
                               art.timed_window(requests, correct, 0.0, {}))
    assert derived.status is Status.FAIL and derived.reason.startswith("timed window refused")
    assert derived.metrics["timed_window"] == "refused"


def test_each_arms_sample_spans_k_passes_fixed_from_the_warmup(tmp_path):
    _, cells, out, plans = _run(tmp_path, 11)
    meta = json.loads((out / art.META).read_text())
    with open(out / art.PASSES, newline="") as f:
        rows = list(csv.DictReader(f))
    for cell, rec in meta["records"].items():
        warm = [r for r in rows if r["cell"] == cell and r["phase"] == "warmup"]
        last = [float(r["wall_s"]) for r in warm[-2:]]
        k = rec["passes_per_sample"]
        assert k == _timed.sample_passes(0.1, last) and k * min(last) >= 0.1
        assert (k - 1) * min(last) < 0.1
        assert meta["plans"][cell]["min_sample_s"] == 0.1
    one = _run(tmp_path, 11, plans=ONE_PASS)[1]
    assert {c["passes_per_sample"] for c in one.values()} == {1}
    # k passes dilute a pass slowed as a whole by the host: a tighter spread per round
    assert np.median([c["sd_log_ratio"] for c in cells.values()]) < \
        np.median([c["sd_log_ratio"] for c in one.values()])


def test_sample_passes_rule():
    assert _timed.sample_passes(0.1, [0.02, 0.021]) == 5
    assert _timed.sample_passes(0.1, [0.2, 0.3]) == 1
    assert _timed.sample_passes(0.1, [1e-5, 1e-5]) == _timed.MAX_SAMPLE_PASSES
    assert _timed.sample_passes(0.0, [0.02, 0.02]) == 1
    assert _timed.sample_passes(0.1, []) == 1  # warmup = 0: nothing to judge by


def test_a_sample_length_other_than_the_warmups_is_an_error(tmp_path):
    _, _, out, plans = _run(tmp_path, 12)
    meta = json.loads((out / art.META).read_text())
    cell = meta["cells"][0]
    meta["records"][cell]["passes_per_sample"] -= 1
    (out / art.META).write_text(json.dumps(meta))
    with pytest.raises(GateError, match="passes per sample: .* recorded, the warm-up's walls"):
        _derive(out, plans)


def test_a_bundle_sealed_before_the_sample_length_derives_as_one_pass(tmp_path):
    """Format 2 without min_sample_s: no `pass` column, no passes_per_sample, plans without
    the key; it re-derives as k = 1 under today's row (min_sample_s 0.1)."""
    status, cells, out, _ = _run(tmp_path, 13, plans=ONE_PASS)
    meta = json.loads((out / art.META).read_text())
    for cell in meta["cells"]:
        del meta["plans"][cell]["min_sample_s"], meta["records"][cell]["passes_per_sample"]
        del meta["plans"][cell]["schedule"]
    (out / art.META).write_text(json.dumps(meta))
    with open(out / art.PASSES, newline="") as f:
        rows = [{k: v for k, v in r.items() if k != "pass"} for r in csv.DictReader(f)]
    with open(out / art.PASSES, "w", newline="") as f:
        w = csv.DictWriter(f, [k for k in _timed.PASS_FIELDS if k != "pass"])
        w.writeheader()
        w.writerows(rows)
    today = cal.default_plans(PASSES)
    assert _derive(out, today) == cells
    meta["plans"][meta["cells"][0]]["min_effect_typo"] = 1
    (out / art.META).write_text(json.dumps(meta))
    with pytest.raises(GateError, match="another plan"):
        _derive(out, today)


def test_pass_order_interleaves_in_abba_pairs_or_blocks():
    a, b = _timed.ROLES
    assert _timed.pass_order((a, b), 3, "interleaved") == [
        (a, 0), (b, 0), (b, 1), (a, 1), (a, 2), (b, 2)]
    assert _timed.pass_order((b, a), 2, "blocked") == [(b, 0), (b, 1), (a, 0), (a, 1)]
    assert _timed.pass_order((a, b), 1, "interleaved") == _timed.pass_order((a, b), 1, "blocked")
    with pytest.raises(ValueError, match="schedule 'zigzag'"):
        _timed.pass_order((a, b), 2, "zigzag")


HOST_STATES = {"slow_state": 0.25, "enter_slow": 0.03, "leave_slow": 0.1}
"""The H200 host as benchmarks/host_noise.py measured it: 25 % slower stretches."""


def test_interleaving_cancels_a_two_state_host_that_blocked_samples_do_not(tmp_path):
    blocked = cal.default_plans(PASSES, schedule="blocked")
    sd = {"interleaved": [], "blocked": []}
    for seed in range(4):
        for name, plans in (("interleaved", None), ("blocked", blocked)):
            _, cells, out, used = _run(tmp_path / name, seed, plans=plans, **HOST_STATES)
            assert {c["verdict"] for c in cells.values()} <= {"equivalent", "underpowered"}
            assert _derive(out, used) == cells
            sd[name] += [c["sd_log_ratio"] for c in cells.values()]
    assert np.median(sd["interleaved"]) < 0.5 * np.median(sd["blocked"]), sd


def test_a_bundle_sealed_with_blocked_samples_derives_as_blocked(tmp_path):
    """Sealed before the interleaved schedule: no `schedule` in its plans; it re-derives
    under today's row as blocked (k consecutive passes per arm, pooled)."""
    blocked = cal.default_plans(PASSES, schedule="blocked")
    _, cells, out, _ = _run(tmp_path, 14, plans=blocked, **HOST_STATES)
    meta = json.loads((out / art.META).read_text())
    for cell in meta["cells"]:
        del meta["plans"][cell]["schedule"]
    (out / art.META).write_text(json.dumps(meta))
    assert _derive(out, cal.default_plans(PASSES)) == cells
    with pytest.raises(GateError, match="another plan"):  # a sealed schedule is compared
        meta["plans"][meta["cells"][0]]["schedule"] = "blocked"
        (out / art.META).write_text(json.dumps(meta))
        _derive(out, cal.default_plans(PASSES))


NOISY_SPEEDUP = {"slowdown": -0.2, "step_noise": 0.25, "pass_noise": 0.06}
"""A candidate 1.25x as fast on a machine as noisy as the megakernel row's sealed c4 cell."""


def test_a_clear_speedup_on_a_noisy_machine_stops_at_the_first_look(tmp_path):
    """narrow (sealed before claim_rule) runs such a cell to the budget and calls it
    underpowered; narrow-or-clear (the default) calls it better at 8 rounds."""
    narrow = cal.default_plans(PASSES, min_effect=0.02, claim_rule="narrow")
    status, cells, _, _ = _run(tmp_path / "narrow", 0, plans=narrow, **NOISY_SPEEDUP)
    assert status == "FAIL" and cells["i16-c4"]["verdict"] == "underpowered"
    assert cells["i16-c4"]["rounds"] == 40 and cells["i16-c4"]["ratio_ci_low"] > 1.02
    status, cells, out, plans = _run(tmp_path / "clear", 0, **NOISY_SPEEDUP)
    assert status == "PASS"
    assert {(c["verdict"], c["rounds"]) for c in cells.values()} == {("better", 8)}
    assert _derive(out, plans) == cells


def test_a_bundle_sealed_before_the_claim_rule_derives_under_the_narrow_rule(tmp_path):
    """No claim_rule in its plans' design: it re-derives under today's row with the
    rule its looks stopped by (else its 40 rounds would not follow the plan)."""
    narrow = cal.default_plans(PASSES, min_effect=0.02, claim_rule="narrow")
    _, cells, out, _ = _run(tmp_path, 0, plans=narrow, **NOISY_SPEEDUP)
    meta = json.loads((out / art.META).read_text())
    for cell in meta["cells"]:
        del meta["plans"][cell]["design"]["claim_rule"]
    (out / art.META).write_text(json.dumps(meta))
    today = cal.default_plans(PASSES)
    assert _derive(out, today) == cells
    for cell in meta["cells"]:  # a sealed rule is compared, not trusted
        meta["plans"][cell]["design"]["claim_rule"] = "narrow"
    (out / art.META).write_text(json.dumps(meta))
    with pytest.raises(GateError, match="another plan"):
        _derive(out, today)
    meta["plans"][meta["cells"][0]]["design"] = None  # a tampered plan: one clear error
    (out / art.META).write_text(json.dumps(meta))
    with pytest.raises(GateError, match="another plan"):
        _derive(out, today)


def test_a_row_wall_budget_shares_the_time_left_and_rederives_only_under_a_budget(tmp_path):
    m, engines = _engines(3)
    plans = cal.default_plans(PASSES)
    start = m.now()
    deadline = start + 2.0  # seconds on the machine's virtual clock: too few for 8 rounds
    out = tmp_path / "budget"
    out.mkdir()
    with art.open_sink(out, False) as sink:
        records = art.measure_cells(engines, PASSES, plans, sink, cal._Quiet(), now=m.now,
                                    time_left=lambda: max(deadline - m.now(), 0.0))
    art.write_meta(out, records, plans, False)
    first, second = (plans[p.cell].max_seconds for p in PASSES)
    assert first == 1.0  # half of the 2 s for the first of two cells
    assert 0 < second <= 1.0
    assert {r["stop"] for r in records.values()} == {"time"}
    meta, rows, requests, clocks = art.read_raw(out)
    row_plans = cal.default_plans(PASSES)  # what the row asks for: the 600 s default
    cells = art.derive_cells(row_plans, meta, rows, requests, clocks, row_budget=True)
    assert all(c["stop"] == "time" and c["rounds"] < 8 for c in cells.values()), cells
    short = [c for c in cells.values() if c["verdict"] == "underpowered"]
    assert short and all(c["rounds_needed"] > c["rounds"] for c in short), cells  # what it lacked
    with pytest.raises(GateError, match="another plan than the row's"):
        art.derive_cells(row_plans, meta, rows, requests, clocks)  # no [budget]: refused


def test_budgeted_never_raises_a_cells_own_budget():
    plan = cal.default_plans(PASSES)[PASSES[0].cell]
    assert art.budgeted(plan, None, 2) is plan
    assert art.budgeted(plan, 10_000.0, 2) is plan  # its own 600 s is the smaller
    assert art.budgeted(plan, 95.0, 2).max_seconds == 47.5
    assert art.budgeted(plan, 0.0, 3).max_seconds == 0.1


def _carried_run(tmp: Path, seed: int, plans=None, gate: str = "tokens"):
    """A throughput run whose engines ran every cell once before, for gate `gate`: the
    engine pool's journal carries those passes into each cell's warm-up."""
    from rowgate.gates.engine_pool import EnginePool

    m, engines = _engines(seed)
    pool = EnginePool()
    for role, engine in engines.items():
        pool.add(role, engine, gate, {"engine": "synthetic", "role": role})
    earlier = pool.journal(gate)
    for role in ("baseline", "candidate"):
        for work in PASSES:
            start = m.now()
            result = engines[role].generate(work)
            earlier.note(engines[role], work, start, m.now(), result)
    plans = plans or cal.default_plans(PASSES)
    out = tmp / f"carried-{seed}"
    out.mkdir(parents=True)
    with art.open_sink(out, False) as sink:
        records = art.measure_cells(engines, PASSES, plans, sink, cal._Quiet(), now=m.now,
                                    journal=pool.journal("tp"))
    art.write_meta(out, records, plans, False)
    return records, out, plans, pool


def _passes(out: Path) -> list[dict]:
    with open(out / art.PASSES, newline="") as f:
        return list(csv.DictReader(f))


def test_an_earlier_gates_pass_of_the_cell_is_its_warmups_round_0(tmp_path):
    records, out, plans, pool = _carried_run(tmp_path, 14)
    rows = _passes(out)
    cells = _derive(out, plans)
    for cell, rec in records.items():
        warm = [r for r in rows if r["cell"] == cell and r["phase"] == "warmup"]
        carried = [r for r in warm if r["carried_from"]]
        assert [(r["round"], r["arm"], r["carried_from"]) for r in carried] == [
            ("0", "baseline", "tokens"), ("0", "candidate", "tokens")]
        assert all(float(r["end_s"]) <= 0 for r in carried)  # they ran before the cell
        own = {r["round"] for r in warm} - {"0"}
        assert rec["warmup_rounds"] == len(own) + 1 and len(own) >= 1  # settling needs two
        assert cells[cell]["warmup_rounds"] == rec["warmup_rounds"]
        assert cells[cell]["verdict"] == "equivalent"
    # on these steady engines one own round settles against the carried one
    assert {rec["warmup_rounds"] for rec in records.values()} == {2}
    # and the throughput gate's own passes are in the journal for a gate after it
    engine = next(h.engine for h in pool._held.values())
    assert pool.journal("later").earlier(engine, PASSES[0]).gate == "tp"


def test_a_plan_that_carries_nothing_runs_every_warmup_round_itself(tmp_path):
    plans = cal.default_plans(PASSES, warmup_carry=False)
    records, out, plans, _ = _carried_run(tmp_path, 15, plans=plans)
    assert not any(r["carried_from"] for r in _passes(out))
    assert {rec["warmup_rounds"] for rec in records.values()} == {2}
    _derive(out, plans)


@pytest.mark.parametrize("edit,match", [
    # a carried pass moved into the cell's own round 1
    (lambda rows: [dict(r, carried_from="tokens") if r["phase"] == "warmup" and r["round"] == "1"
                   else r for r in rows], "not exactly warm-up round 0"),
    # only one arm of round 0 carried
    (lambda rows: [dict(r, carried_from="") if r["phase"] == "warmup" and r["round"] == "0"
                   and r["arm"] == "candidate" else r for r in rows], "not exactly warm-up round 0"),
])
def test_carried_passes_outside_round_0_are_an_error(tmp_path, edit, match):
    _, out, plans, _ = _carried_run(tmp_path, 16)
    _tamper(out, edit)
    with pytest.raises(GateError, match=match):
        _derive(out, plans)


def test_a_carried_round_under_a_plan_that_carries_none_is_an_error(tmp_path):
    _, out, plans, _ = _carried_run(tmp_path, 17)
    meta = json.loads((out / art.META).read_text())
    for cell in meta["cells"]:
        meta["plans"][cell]["warmup_carry"] = False
    (out / art.META).write_text(json.dumps(meta))
    with pytest.raises(GateError, match="warmup_carry = false"):
        _derive(out, cal.default_plans(PASSES, warmup_carry=False))


def test_a_bundle_sealed_before_carried_warmups_derives_with_its_own_rounds(tmp_path):
    """Sealed before the keys: plans without `warmup_carry` and `warmup_until` (its
    warm-up ended on two agreeing rounds), no `carried_from` column; it re-derives under
    today's row."""
    then = cal.default_plans(PASSES, warmup_until="agree", warmup_carry=False)
    status, cells, out, _ = _run(tmp_path, 18, plans=then)
    meta = json.loads((out / art.META).read_text())
    for cell in meta["cells"]:
        del meta["plans"][cell]["warmup_carry"], meta["plans"][cell]["warmup_until"]
    (out / art.META).write_text(json.dumps(meta))
    rows = [{k: v for k, v in r.items() if k != "carried_from"} for r in _passes(out)]
    with open(out / art.PASSES, "w", newline="") as f:
        w = csv.DictWriter(f, [k for k in _timed.PASS_FIELDS if k != "carried_from"])
        w.writeheader()
        w.writerows(rows)
    assert _derive(out, cal.default_plans(PASSES)) == cells


def test_on_a_noisy_host_no_gain_ends_the_warmup_where_agree_runs_on(tmp_path):
    """Passes that swing 8 % by chance: two rarely agree within 5 %, so `agree` runs to
    max_warmup; `no-gain` ends once no arm is still getting faster."""
    rounds = {}
    for rule in ("agree", "no-gain"):
        plans = cal.default_plans(PASSES, warmup_until=rule)
        got = []
        for seed in range(4):
            _, cells, out, _ = _run(tmp_path / rule, seed, plans=plans, pass_noise=0.08)
            assert _derive(out, plans) == cells
            got += [c["warmup_rounds"] for c in cells.values()]
        rounds[rule] = np.mean(got)
    assert rounds["no-gain"] < 3 < rounds["agree"], rounds
