"""Accuracy gate: health on the tiny model, PENDING without weights or data,
answer extraction, and exact match on a run with a weights directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rowgate.gates.accuracy import Accuracy, gold_number, load_questions, predicted_number
from rowgate.gates.interface import GateError
from rowgate.models.tiny import build_tiny_model
from rowgate.records.status import Status
from rowgate.rows.row import load_row
from tests.gates.engine_rows import ROOT, Lines, run_one, tiny_row
from tests.support import DEMOS

DATASET = str(DEMOS / "data" / "gsm8k-tiny.jsonl")


def accuracy_gate(**fields) -> str:
    values = {"dataset_path": DATASET, "num_questions": 4, "max_tokens": 24, **fields}
    lines = "\n".join(f"    {k} = {json.dumps(v)}" for k, v in values.items())
    return f'''
    [[gates]]
    id = "gsm8k"
    kind = "accuracy"
    dataset = "gsm8k"
{lines}

    [gates.sampling]
    temperature = 1.0
    top_k = 20
    top_p = 0.95
    ignore_eos = false
'''


def _outputs(stage: Path) -> list[dict]:
    path = stage / "artifacts/gsm8k/outputs.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize(("answer", "gold"), [
    ("so 3 + 4 = 7\n#### 7", "7"), ("#### 1,200", "1200"), ("#### -3.50", "-3.5"),
    ("no marker 12", None)])
def test_gold_number_is_the_number_after_the_marker(answer, gold):
    assert gold_number(answer) == gold


def test_predicted_number_is_the_last_number():
    assert predicted_number("first 3 then 1,200.0 dollars.") == "1200"
    assert predicted_number("t5 t17") == "17"  # the tiny vocabulary's words end in digits
    assert predicted_number("no digits") is None


def test_the_shipped_dataset_parses(tmp_path):
    questions = load_questions(Path(DATASET), 100)
    assert len(questions) == 8 and all(gold_number(q["answer"]) for q in questions)


def test_bad_dataset_line_is_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{"question": "q"}\n')
    with pytest.raises(GateError, match=r"bad.jsonl:2: expected a JSON object"):
        load_questions(bad, 10)


def test_tiny_model_health_runs_and_the_verdict_is_honest(tmp_path):
    """A random-weight model has never learned to stop: health reports runaways,
    and with thresholds that tolerate them, accuracy is PENDING without weights."""
    strict = tiny_row(tmp_path, "ACC-STRICT", accuracy_gate(), oracle="reference")
    result = run_one(Accuracy(), strict, "gsm8k", tmp_path / "strict")
    outputs = _outputs(tmp_path / "strict")
    runaway = sum(len(o["token_ids"]) == 24 and o["token_ids"][-1] != 0 for o in outputs)
    assert result.metrics["runaway"] == runaway and result.metrics["questions"] == 4
    if runaway:
        assert result.status is Status.FAIL and "runaway rate" in result.reason
    # derive is pure: the same outputs against thresholds that tolerate them
    lenient = load_row(tiny_row(tmp_path, "ACC-LENIENT", accuracy_gate(max_runaway_rate=1.0),
                                oracle="reference")).row
    derived = Accuracy().derive(lenient, lenient.gate("gsm8k"), tmp_path / "strict/artifacts/gsm8k")
    assert derived.status is Status.PENDING
    assert "accuracy PENDING: weights: the row names no local weights path" in derived.reason
    assert not derived.metrics  # a PENDING result carries no numbers


def test_missing_dataset_is_pending_naming_the_path(tmp_path):
    row = tiny_row(tmp_path, "ACC-NODATA", accuracy_gate(dataset_path="data/none.jsonl"),
                   oracle="reference")
    result = run_one(Accuracy(), row, "gsm8k", tmp_path / "stage")
    assert result.status is Status.PENDING
    assert "data/none.jsonl is not on this machine" in result.reason


def test_missing_model_and_dataset_are_both_named(tmp_path):
    row = tiny_row(tmp_path, "ACC-NOTHING", accuracy_gate(dataset_path=""), oracle="reference")
    row.write_text(row.read_text().replace('name = "tiny-qwen3"',
                                           'name = "Qwen/Qwen3-4B"\nweights = "/nonexistent/q"'))
    loaded = load_row(row).row
    why = Accuracy().requirements(loaded, loaded.gate("gsm8k"), _ctx(tmp_path))
    assert "names no local dataset_path" in why and "/nonexistent/q" in why


def _ctx(tmp_path):
    from rowgate.gates.interface import GateContext
    from rowgate.run import provenance

    return GateContext(repo=ROOT, artifact_dir=tmp_path / "a", subject=provenance.subject(ROOT),
                       provenance=provenance.collect(), progress=Lines())


def test_with_weights_on_the_machine_accuracy_is_exact_match(tmp_path):
    weights = build_tiny_model().path
    row = tiny_row(tmp_path, "ACC-WEIGHTS", accuracy_gate(weights=str(weights),
                                                           max_runaway_rate=1.0),
                   oracle="reference")
    result = run_one(Accuracy(), row, "gsm8k", tmp_path / "stage")
    assert result.status is Status.PASS, result.reason
    outputs = _outputs(tmp_path / "stage")
    correct = sum(predicted_number(o["text"]) == gold_number(o["gold"]) for o in outputs)
    assert result.metrics["correct"] == correct
    assert result.metrics["accuracy"] == correct / 4
    meta = json.loads((tmp_path / "stage/artifacts/gsm8k/meta.json").read_text())
    assert meta["sampling"] == {"temperature": 1.0, "top_k": 20, "top_p": 0.95,
                                "ignore_eos": False}
    assert meta["accuracy_pending"] == ""


def test_the_trained_tiny_model_answers_and_stops(tmp_path):
    """The demo's model (trained on the shipped questions) answers every question and
    stops by itself under temperature 1.0 / top-k 20 / top-p 0.95: health-only PASS,
    its reason saying accuracy was not judged; the same outputs without health_only
    are PENDING for want of real weights."""
    body = accuracy_gate(num_questions=8, max_tokens=32, health_only=True,
                         max_runaway_rate=0.0)
    row = tiny_row(tmp_path, "ACC-TRAINED", body, oracle="reference")
    row.write_text(row.read_text().replace('name = "tiny-qwen3"', 'name = "tiny-qwen3-gsm8k"'))
    result = run_one(Accuracy(), row, "gsm8k", tmp_path / "stage")
    assert result.status is Status.PASS, result.reason
    assert (result.metrics["runaway"], result.metrics["empty"], result.metrics["eos_rate"]) == (
        0, 0, 1.0)
    assert result.metrics["matches_reference"] == 8
    assert "accuracy not judged (health_only): 8/8 final numbers equal the reference's" in (
        result.reason)
    outputs = _outputs(tmp_path / "stage")
    assert all(o["text"].endswith(o["gold"].rpartition("####")[2].strip()) for o in outputs)
    plain = load_row(tiny_row(tmp_path, "ACC-TRAINED2", accuracy_gate(num_questions=8),
                              oracle="reference")).row
    derived = Accuracy().derive(plain, plain.gate("gsm8k"), tmp_path / "stage/artifacts/gsm8k")
    assert derived.status is Status.PENDING and "accuracy PENDING: weights" in derived.reason
