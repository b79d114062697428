"""`rowgate compare A B` on real sealed, signed bundles with a planted change: a
speedup, a slowdown, a moved baseline, and bundles that cannot be compared.

Format-2 bundles (what every new bundle is) come from the throughput gate's own
`measure_on` and `derive`, run on synthetic engines (tests/report/format2.py), so
the planted change is known. One format-1 bundle pair is written in the old gate's layout (the format an
older rowgate sealed, which compare still reads). The changes come from
`rowgate.stats.unpaired`, the unpaired statistics two independent runs call for."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from rowgate import compressed
from rowgate.cli.main import main
from rowgate.rows import row as rows
from rowgate.run import provenance
from rowgate.seal import signing
from rowgate.seal.bundle import Stage
from tests.gates.test_timed_rounds import cal
from tests.report import format2
from tests.support import write_row

pytestmark = pytest.mark.serial  # timings decide: never beside another worker

CELLS = ("i16-c1", "i16-c4")
REPEATS = 9
TOKENS = 16
WORKLOAD = "sha256:" + "ab" * 32
FALLBACK = '''
    [[arms.fallbacks]]
    engine = "reference"
    mode = "eager"
'''
ROW_BODY = '''
    [[gates]]
    id = "throughput"
    kind = "throughput"
    min_effect = 0.05
'''


def _artifacts(out: Path, rng: np.random.Generator, step_ms: dict[str, float],
               workload: str) -> None:
    """samples.csv, requests.jsonl and meta.json as the throughput gate writes them: each
    arm decodes TOKENS tokens per request at `step_ms[arm]` per token, 1 % noise."""
    out.mkdir(parents=True)
    samples, requests = [], []
    for cell in CELLS:
        seq = 0
        for repeat in range(REPEATS):
            for arm in (("oracle", "candidate") if repeat % 2 == 0 else ("candidate", "oracle")):
                pass_scale = rng.normal(1.0, 0.01)
                wall = 0.0
                for r in range(4):
                    itl = [step_ms[arm] / 1e3 * pass_scale * rng.normal(1.0, 0.01)
                           for _ in range(TOKENS - 1)]
                    ttft = 2 * step_ms[arm] / 1e3 * pass_scale
                    latency = ttft + sum(itl)
                    wall = max(wall, latency)
                    requests.append({"cell": cell, "repeat": repeat, "arm": arm,
                                     "id": f"{cell}-r{r}", "output_tokens": TOKENS,
                                     "ttft_s": ttft, "latency_s": latency, "itl_s": itl})
                samples.append({"cell": cell, "seq": seq, "repeat": repeat, "arm": arm,
                                "wall_s": repr(wall), "output_tokens": 4 * TOKENS, "requests": 4})
                seq += 1
    with open(out / "samples.csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(samples[0]))
        w.writeheader()
        w.writerows(samples)
    (out / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in requests))
    (out / "meta.json").write_text(json.dumps({
        "cells": list(CELLS), "baseline": "oracle", "clocks_sampled": False, "repeats": REPEATS,
        "oracle": {"workload_digest": workload}, "candidate": {"workload_digest": workload}}))


def _seal(tmp: Path, repo: Path, key: Path, name: str, step_ms: dict[str, float], seed: int,
          workload: str = WORKLOAD, cpu: str | None = None, fmt: int = 2) -> Path:
    row_path = tmp / "COMPARE-ROW.toml"
    if not row_path.exists():
        write_row(tmp, "COMPARE-ROW", ROW_BODY)
    if fmt == 2:  # another workload: another output length
        passes = cal.synthetic_passes((1, 4), output_len=32 if workload == WORKLOAD else 24)
        return format2.seal(tmp / name, row_path, repo, key, step_ms, seed, passes, cpu=cpu)
    loaded = rows.load_row(row_path)
    stage = Stage(tmp / name, loaded.row.id)
    out = stage.artifact_dir("throughput")
    _artifacts(out, np.random.default_rng(seed), step_ms, workload)
    stage.add_result(format2.result_of(loaded.row, "throughput", out, stage.root))
    return stage.seal(row=loaded, row_file=str(row_path), subject=provenance.subject(repo),
                      provenance=provenance.collect(), signer=signing.KeySigner(key),
                      order=["throughput"])


@pytest.fixture
def world(tmp_path, git_repo, make_key):
    key = make_key()
    pub = signing.KeySigner(key).public_key_file()

    def seal(name: str, cand_ms: float, base_ms: float = 0.6, **kw) -> Path:
        return _seal(tmp_path, Path(git_repo.working_dir), key, name,
                     {"oracle": base_ms, "candidate": cand_ms}, seed=len(name), **kw)
    return seal, pub


def _compare(a: Path, b: Path, pub: Path, capsys, *extra: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(["compare", str(a), str(b), "--key", str(pub), *extra])
    out, err = capsys.readouterr()
    return done.value.code, out, err


def _rounds(bundle: Path) -> dict[str, int]:
    doc = json.loads((bundle / "gates/throughput.json").read_text())
    return {cell: m["rounds"] for cell, m in doc["cells"].items()}


def test_a_planted_speedup_is_found_with_its_ci(world, capsys):
    seal, pub = world
    a, b = seal("before", cand_ms=0.6), seal("after", cand_ms=0.6 / 1.3)
    code, out, _ = _compare(a, b, pub, capsys, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["outcome"] == "no regression"
    cand = {(c["cell"], c["metric"]): c for c in doc["changes"] if c["arm"] == "candidate"}
    rounds_a, rounds_b = _rounds(a), _rounds(b)
    for cell in CELLS:
        for metric in ("tok_s", "tpot", "itl", "e2el", "ttft"):
            c = cand[(cell, metric)]
            assert c["outcome"] == "faster", c
            assert c["ci_low"] <= c["speedup"] <= c["ci_high"]
            assert 1.2 < c["speedup"] < 1.4
            assert (c["n_a"], c["n_b"]) == (rounds_a[cell], rounds_b[cell])  # one per round
            assert c["says"].startswith(f"{c['speedup']:.3g}× faster [")
            assert c["decides"] is (metric == "itl")  # the gate's metric, listed first
    assert doc["changes"][0]["metric"] == "itl"
    base = [c for c in doc["changes"] if c["arm"] == "baseline"]
    assert base and all(c["outcome"] == "no significant change" for c in base)
    assert doc["gates"] == [{"gate": "throughput", "kind": "throughput", "status_a": "PASS",
                             "status_b": "PASS", "regressed": False}]

    code, out, _ = _compare(a, b, pub, capsys)  # the human table
    assert code == 0 and "× faster [" in out and "outcome: no regression" in out


def test_the_changes_are_the_sealed_passes_compared_unpaired(world, capsys):
    from rowgate.gates.throughput.measure import sealed_schedule
    from rowgate.stats import latency, unpaired

    seal, pub = world
    a, b = seal("before", 0.6), seal("after", 0.66)
    _, out, _ = _compare(a, b, pub, capsys, "--json")
    itl = next(c for c in json.loads(out)["changes"]
               if (c["cell"], c["metric"], c["arm"]) == ("i16-c4", "itl", "candidate"))

    def speeds(bundle: Path) -> list[float]:  # per sample (round), from the raw files
        art = bundle / "artifacts/throughput"
        with open(art / "passes.csv", newline="") as f:
            passes = sorted((p for p in csv.DictReader(f) if p["phase"] == "timed"
                             and p["cell"] == "i16-c4" and p["arm"] == "candidate"),
                            key=lambda p: (int(p["round"]), int(p.get("pass") or 0)))
        reqs = [json.loads(x) for x in compressed.read_text(art / "requests.jsonl.gz").splitlines()]
        plan = json.loads((art / "meta.json").read_text())["plans"]["i16-c4"]
        statistic = latency.schedule_statistic(sealed_schedule(plan))
        rounds = sorted({int(p["round"]) for p in passes})
        return [latency.sample_speed(
            "itl", [r for r in reqs if r["phase"] == "timed" and r["cell"] == "i16-c4"
                    and r["arm"] == "candidate" and r["round"] == k],
            [float(p["wall_s"]) for p in passes if int(p["round"]) == k],
            [int(p["output_tokens"]) for p in passes if int(p["round"]) == k], statistic)
            for k in rounds]
    # one value per sample (an arm's k passes of a round): 1 / the speed the gate paired,
    # in ms, under the schedule the bundle sealed (interleaved: the mean of the passes)
    u = unpaired.compare([1e3 / v for v in speeds(b)], [1e3 / v for v in speeds(a)],
                         seed=20240917, names=("B", "A"))
    assert itl["median_b"] == pytest.approx(u.median_x, rel=1e-12)
    assert itl["speedup"] == pytest.approx(1 / u.ratio, rel=1e-12)  # a latency: inverted
    assert (itl["ci_low"], itl["ci_high"]) == pytest.approx((1 / u.ci_high, 1 / u.ci_low),
                                                            rel=1e-9)
    assert itl["p_value"] == u.p_value and itl["outcome"] == "slower"
    assert itl["says"].startswith("1.1× slower [")


def test_a_planted_slowdown_is_a_regression_exit_1(world, capsys):
    seal, pub = world
    code, out, _ = _compare(seal("before", 0.6), seal("after", 0.72), pub, capsys, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["outcome"] == "regression"
    tpot = next(c for c in doc["changes"] if c["metric"] == "tpot" and c["arm"] == "candidate")
    assert tpot["outcome"] == "slower" and tpot["says"].startswith("1.2× slower [")


def test_no_change_is_said_with_the_power_it_had(world, capsys):
    seal, pub = world
    code, out, _ = _compare(seal("before", 0.6), seal("again", 0.6), pub, capsys, "--json")
    doc = json.loads(out)
    assert code == 0, doc["outcome"]
    assert {c["outcome"] for c in doc["changes"]} == {"no significant change"}
    for c in doc["changes"]:
        # the smallest slowdown it would have found: past the 5 % band, and said
        assert 0.05 < c["detectable"] < 0.5
        assert f"would find a slowdown of {c['detectable']:.1%}" in c["says"]


def test_a_moved_baseline_confounds_the_candidate_exit_3(world, capsys):
    seal, pub = world
    a, b = seal("before", 0.6), seal("loaded", 0.42, base_ms=0.42)  # the machine sped up
    code, out, _ = _compare(a, b, pub, capsys, "--json")
    doc = json.loads(out)
    assert code == 3 and doc["outcome"] == "inconclusive"
    cand = [c for c in doc["changes"] if c["arm"] == "candidate"]
    assert {c["outcome"] for c in cand} == {"confounded"}
    assert any("the baseline arm moved" in n for n in doc["notes"])


def test_bundles_that_cannot_be_compared_are_refused(world, capsys):
    seal, pub = world
    a = seal("before", 0.6)
    code, _, err = _compare(a, seal("other-load", 0.6, workload="sha256:" + "cd" * 32), pub,
                            capsys)
    assert code == 2 and err.startswith("compare: gate throughput ran different workloads")
    code, _, err = _compare(a, seal("elsewhere", 0.6, cpu="AMD EPYC 9654"), pub, capsys)
    assert code == 2 and err.startswith("compare: measured on different devices: A ")
    code, _, err = _compare(a, a, pub.with_name("nope.pem"), capsys)
    assert code == 2 and "--key" in err


def test_bundles_measured_against_different_baseline_arms_are_refused(tmp_path, git_repo,
                                                                     make_key, capsys):
    key = make_key()
    pub = signing.KeySigner(key).public_key_file()
    repo = Path(git_repo.working_dir)
    eager = ROW_BODY.replace('kind = "throughput"', 'kind = "throughput"\nbaseline = "eager"')
    bundles = []
    for name, body in (("oracle", ROW_BODY), ("eager", FALLBACK + eager)):
        row = write_row(tmp_path / name, "COMPARE-ROW", body)
        bundles.append(format2.seal(tmp_path / name / "evidence", row, repo, key,
                                    {"oracle": 0.6, "candidate": 0.6}, 1,
                                    cal.synthetic_passes((1, 4))))
    code, _, err = _compare(*bundles, pub, capsys)
    assert code == 2 and err.strip() == ("compare: gate throughput measured against different "
                                         "baseline arms: A oracle; B eager (the baseline is "
                                         "the control of the change)")


def test_a_bundle_that_does_not_verify_is_exit_1(world, capsys, make_key):
    seal, pub = world
    other = signing.KeySigner(make_key("other")).public_key_file()
    a, b = seal("before", 0.6), seal("after", 0.54)
    code, out, err = _compare(a, b, pub, capsys, "--key", str(other))
    assert code == 1 and out == "" and "not by the expected key" in err


def test_format_one_bundles_still_compare(world, capsys):
    """Bundles sealed by an older rowgate (samples.csv, arms oracle / candidate)."""
    from rowgate.rows.workload import workload_digest

    seal, pub = world
    same = workload_digest(cal.synthetic_passes((1, 4)))  # the format-2 runs' workload
    a = seal("before", 10.0, base_ms=10.0, fmt=1, workload=same)
    b = seal("after", 10.0 / 1.3, base_ms=10.0, fmt=1, workload=same)
    code, out, _ = _compare(a, b, pub, capsys, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["outcome"] == "no regression"
    cand = [c for c in doc["changes"] if c["arm"] == "candidate"]
    assert {c["metric"] for c in cand} == {"tok_s", "ttft", "tpot", "itl", "e2el"}
    assert all(c["outcome"] == "faster" and c["n_a"] == c["n_b"] == REPEATS and
               1.2 < c["speedup"] < 1.4 and not c["decides"] for c in cand)
    base = [c for c in doc["changes"] if c["arm"] == "oracle"]
    assert base and {c["outcome"] for c in base} == {"no significant change"}
    # a format-2 bundle after a format-1 one: the same metrics per pass, compared
    code, out, _ = _compare(a, seal("now", 10.0 / 1.3, base_ms=10.0), pub, capsys, "--json")
    doc = json.loads(out)
    assert any("A is a format-1 bundle, B format-2" in n for n in doc["notes"])
    cand = [c for c in doc["changes"] if c["arm"] == "candidate"]
    assert {c["metric"] for c in cand} == {"tok_s", "ttft", "tpot", "itl", "e2el"}
    assert {c["arm"] for c in doc["changes"]} == {"candidate", "baseline"}  # B's names
