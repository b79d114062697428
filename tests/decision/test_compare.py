"""`rowgate compare A B` on real sealed, signed bundles whose throughput samples are
written in the gate's own format (and summarised by the gate's own derive) with a
planted change: a speedup, a slowdown, a moved baseline, and bundles that cannot be
compared. The changes come from `pipeline.stats`, the gate's statistics."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from pipeline import provenance, rows, signing
from pipeline.cli import main
from pipeline.evidence import Stage
from pipeline.gates.throughput import Throughput
from pipeline.records.gate_result import GateResult
from tests.support import write_row

CELLS = ("i16-c1", "i16-c4")
REPEATS = 9
TOKENS = 16
WORKLOAD = "sha256:" + "ab" * 32
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
          workload: str = WORKLOAD, cpu: str | None = None) -> Path:
    row_path = tmp / "COMPARE-ROW.toml"
    if not row_path.exists():
        write_row(tmp, "COMPARE-ROW", ROW_BODY)
    loaded = rows.load_row(row_path)
    stage = Stage(tmp / name, loaded.row.id)
    out = stage.artifact_dir("throughput")
    _artifacts(out, np.random.default_rng(seed), step_ms, workload)
    spec = loaded.row.gate("throughput")
    derived = Throughput().derive(loaded.row, spec, out)
    stage.add_result(GateResult(gate_id="throughput", kind="throughput", status=derived.status,
                                reason=derived.reason, metrics=derived.metrics,
                                cells=derived.cells, arch="cpu",
                                artifacts=sorted(f"artifacts/throughput/{p.name}"
                                                 for p in out.iterdir())))
    prov = provenance.collect()
    if cpu is not None:
        prov = prov.model_copy(update={"host": prov.host.model_copy(update={"cpu": cpu})})
    return stage.seal(row=loaded, row_file=str(row_path), subject=provenance.subject(repo),
                      provenance=prov, signer=signing.KeySigner(key), order=["throughput"])


@pytest.fixture
def world(tmp_path, git_repo, make_key):
    key = make_key()
    pub = signing.KeySigner(key).public_key_file()

    def seal(name: str, cand_ms: float, base_ms: float = 10.0, **kw) -> Path:
        return _seal(tmp_path, Path(git_repo.working_dir), key, name,
                     {"oracle": base_ms, "candidate": cand_ms}, seed=len(name), **kw)
    return seal, pub


def _compare(a: Path, b: Path, pub: Path, capsys, *extra: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(["compare", str(a), str(b), "--key", str(pub), *extra])
    out, err = capsys.readouterr()
    return done.value.code, out, err


def test_a_planted_speedup_is_found_with_its_ci(world, capsys):
    seal, pub = world
    a, b = seal("before", cand_ms=10.0), seal("after", cand_ms=10.0 / 1.3)
    code, out, _ = _compare(a, b, pub, capsys, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["outcome"] == "no regression"
    cand = {(c["cell"], c["metric"]): c for c in doc["changes"] if c["arm"] == "candidate"}
    for cell in CELLS:
        for metric in ("tok_s", "tpot", "itl", "e2el", "ttft"):
            c = cand[(cell, metric)]
            assert c["outcome"] == "faster", c
            assert c["ci_low"] <= c["speedup"] <= c["ci_high"]
            assert 1.2 < c["speedup"] < 1.4 and c["n_a"] == c["n_b"] == REPEATS
            assert c["says"].startswith(f"{c['speedup']:.3g}× faster [")
    base = [c for c in doc["changes"] if c["arm"] == "oracle"]
    assert base and all(c["outcome"] == "no significant change" for c in base)
    assert doc["gates"] == [{"gate": "throughput", "kind": "throughput", "status_a": "PASS",
                             "status_b": "PASS", "regressed": False}]

    code, out, _ = _compare(a, b, pub, capsys)  # the human table
    assert code == 0 and "× faster [" in out and "outcome: no regression" in out


def test_a_planted_slowdown_is_a_regression_exit_1(world, capsys):
    seal, pub = world
    code, out, _ = _compare(seal("before", 10.0), seal("after", 12.0), pub, capsys, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["outcome"] == "regression"
    tpot = next(c for c in doc["changes"] if c["metric"] == "tpot" and c["arm"] == "candidate")
    assert tpot["outcome"] == "slower" and tpot["says"].startswith("1.2× slower [")


def test_no_change_is_said_as_such(world, capsys):
    seal, pub = world
    code, out, _ = _compare(seal("before", 10.0), seal("again", 10.0), pub, capsys, "--json")
    doc = json.loads(out)
    assert code == 0, doc["outcome"]
    assert {c["outcome"] for c in doc["changes"]} == {"no significant change"}


def test_a_moved_baseline_confounds_the_candidate_exit_3(world, capsys):
    seal, pub = world
    a, b = seal("before", 10.0), seal("loaded", 7.0, base_ms=7.0)  # the whole machine sped up
    code, out, _ = _compare(a, b, pub, capsys, "--json")
    doc = json.loads(out)
    assert code == 3 and doc["outcome"] == "inconclusive"
    cand = [c for c in doc["changes"] if c["arm"] == "candidate"]
    assert {c["outcome"] for c in cand} == {"confounded"}
    assert any("the baseline arm moved" in n for n in doc["notes"])


def test_bundles_that_cannot_be_compared_are_refused(world, capsys):
    seal, pub = world
    a = seal("before", 10.0)
    code, _, err = _compare(a, seal("other-load", 10.0, workload="sha256:" + "cd" * 32), pub,
                            capsys)
    assert code == 2 and err.startswith("compare: gate throughput ran different workloads")
    code, _, err = _compare(a, seal("elsewhere", 10.0, cpu="AMD EPYC 9654"), pub, capsys)
    assert code == 2 and err.startswith("compare: measured on different devices: A ")
    code, _, err = _compare(a, a, pub.with_name("nope.pem"), capsys)
    assert code == 2 and "--key" in err


def test_a_bundle_that_does_not_verify_is_exit_1(world, capsys, make_key):
    seal, pub = world
    other = signing.KeySigner(make_key("other")).public_key_file()
    a, b = seal("before", 10.0), seal("after", 9.0)
    code, out, err = _compare(a, b, pub, capsys, "--key", str(other))
    assert code == 1 and out == "" and "not by the expected key" in err

