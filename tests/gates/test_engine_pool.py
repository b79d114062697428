"""One engine per arm per row run (rowgate.gates.engine_pool): the tokens gate starts the
oracle and the candidate, the throughput gate after it measures on the same engines, and
each gate's sealed artifacts say which gate started each engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rowgate.cli.progress import PlainProgress
from rowgate.rows import row as rows
from rowgate.run import runner
from rowgate.seal import signing
from rowgate.seal.bundle import Bundle
from tests.gates.engine_rows import tiny_row

pytestmark = pytest.mark.slow

GATES = '''
    [[gates]]
    id = "tokens"
    kind = "tokens"

    [[gates]]
    id = "tp"
    kind = "throughput"
    min_rounds = 3
    max_rounds = 3
    max_warmup = 2
    cells = ["i16-c1"]
'''


def _sealed(tmp: Path, row_id: str, gates: str) -> Bundle:
    """`gates` run as one row over the tiny model on a fresh subject repository."""
    import git

    from tests.support import commit_file

    repo = git.Repo.init(tmp / "subject", initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Test Author")
        cw.set_value("user", "email", "author@example.com")
    commit_file(repo, "README.md", "subject\n", "initial")
    row = tiny_row(tmp, row_id, gates, oracle="reference", requests=2)
    signer = signing.default_signer(announce=lambda msg: None)
    run = runner.run_row(rows.load_row(row), tmp / "subject", tmp / "evidence", signer,
                         PlainProgress(quiet=True))
    return Bundle.open(run.bundle)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Bundle:
    return _sealed(tmp_path_factory.mktemp("pool"), "POOL", GATES)


def _sharing(bundle: Bundle, gate: str) -> dict:
    return json.loads((Path(bundle.path) / "artifacts" / gate / "engine-sharing.json").read_text())


def test_the_throughput_gate_measures_on_the_engines_the_tokens_gate_started(bundle):
    assert _sharing(bundle, "tokens") == {
        "oracle": {"started_by": "tokens", "reused": False},
        "candidate": {"started_by": "tokens", "reused": False}}
    assert _sharing(bundle, "tp") == {
        "baseline": {"started_by": "tokens", "reused": True},
        "candidate": {"started_by": "tokens", "reused": True}}
    phases = {r.gate_id: set(r.phases) for r in bundle.results()}
    assert "engine start" in phases["tokens"] and "engine start" not in phases["tp"]
    assert {r.gate_id: r.status.value for r in bundle.results()}["tokens"] == "PASS"


def test_the_tokens_gates_passes_are_the_throughput_warmups_round_0(bundle):
    """The same engines ran the cell's requests in the tokens gate: that pass is the
    warm-up's first round, sealed with the gate that ran it and on that gate's clock;
    one own round then settles or ends the warm-up (max_warmup 2)."""
    import csv

    with open(Path(bundle.path) / "artifacts" / "tp" / "passes.csv", newline="") as f:
        warm = [r for r in csv.DictReader(f) if r["phase"] == "warmup"]
    assert [(r["round"], r["arm"], r["carried_from"]) for r in warm] == [
        ("0", "baseline", "tokens"), ("0", "candidate", "tokens"),
        ("1", "candidate", ""), ("1", "baseline", "")]
    tp = bundle.gate_result("tp")
    assert tp.status.value != "ERROR", tp.reason  # sealing re-derived the carried round
    own = sum(float(r["wall_s"]) for r in warm if not r["carried_from"])
    assert tp.phases["warm-up"] == pytest.approx(own, abs=1e-3)  # sealed in ms


def _trace(gate_id: str, arm: str) -> str:
    """A short trace gate of one arm, in the arm's own mode."""
    return f'''
    [[gates]]
    id = "{gate_id}"
    kind = "trace"
    modes = []
    arms = ["{arm}"]
    warm_concurrency = 2
    primer_steps = 4
    arm_delay = 5
    steps = 2
'''


TRACED = _trace("t-oracle", "oracle") + _trace("t-cand", "candidate") + GATES + \
    _trace("t-last", "candidate")


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> Bundle:
    return _sealed(tmp_path_factory.mktemp("pool-trace"), "POOL-TRACE", TRACED)


def test_traced_engines_serve_the_later_gates_and_outlive_a_gate_that_does_not_use_them(
        traced):
    # t-cand does not use the oracle's engine; tokens after it does, so it stays up.
    assert _sharing(traced, "t-oracle") == {
        "oracle-default": {"started_by": "t-oracle", "reused": False}}
    assert _sharing(traced, "t-cand") == {
        "candidate-eager": {"started_by": "t-cand", "reused": False}}
    assert _sharing(traced, "tokens") == {
        "oracle": {"started_by": "t-oracle", "reused": True},
        "candidate": {"started_by": "t-cand", "reused": True}}
    assert _sharing(traced, "tp") == {
        "baseline": {"started_by": "t-oracle", "reused": True},
        "candidate": {"started_by": "t-cand", "reused": True}}
    status = {r.gate_id: r.status.value for r in traced.results()}
    assert status["t-oracle"] == status["t-cand"] == status["tokens"] == "PASS", status
    phases = {r.gate_id: set(r.phases) for r in traced.results()}
    assert "engine start" not in phases["tokens"] | phases["tp"] | phases["t-last"]
    # the oracle's engine, no longer asked for, was stopped between tp and t-last: on no
    # gate's clock
    assert _sharing(traced, "t-last") == {
        "candidate-eager": {"started_by": "t-cand", "reused": True}}
    assert not [r.gate_id for r in traced.results() if "engine stop" in r.phases]
