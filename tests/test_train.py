"""The trained tiny model: its data, its vocabulary, and the same bytes on every build."""

from __future__ import annotations

import json

import pytest

from rowgate.models.tiny import EOS_TOKEN, TRAINED_MODELS, UNK_TOKEN, build_trained_model
from rowgate.models.train import PROMPT_FORMAT, read_examples, sequences, vocabulary
from rowgate.rows.row import load_row
from tests.support import DEMOS

SPEC = TRAINED_MODELS["tiny-qwen3-gsm8k"]
DIGEST = "sha256:649dd2a141f5ec628a2354dd7d7ec32a5b81ce86168faab5a8f8f8408dadfff6"
"""Built here (torch 2.13.0+cpu) twice and under a hostile ambient environment;
docs/engines.md. A different digest means the trained bytes changed: find out why
before updating this (a torch upgrade may; the demo's evidence names the digest)."""


def test_every_word_of_the_data_has_its_own_id_and_the_shape_is_the_tiny_models():
    examples = read_examples(SPEC.dataset_path())
    vocab = vocabulary(examples, SPEC.init.vocab_size)
    assert len(vocab) == SPEC.init.vocab_size == 1024
    assert (vocab[EOS_TOKEN], vocab[UNK_TOKEN]) == (0, 1)
    assert sorted(vocab.values()) == list(range(1024))
    words = {w for p, a in examples for w in (p + " " + a).split()}
    assert words <= set(vocab) and vocab["####"] > 1
    assert examples[0][0] == PROMPT_FORMAT.format(question=json.loads(
        SPEC.dataset_path().read_text().splitlines()[0])["question"])


def test_the_demo_rows_max_tokens_leaves_room_for_every_answer_and_its_eos():
    row = load_row(DEMOS / "DEMO-CPU-DECODE.toml").row
    health = row.gate("gsm8k-health")
    assert row.models[0].name == "tiny-qwen3-gsm8k" and health.health_only
    examples = read_examples(SPEC.dataset_path())
    answers = [len(s) - plen for s, plen in sequences(examples, vocabulary(examples, 1024))]
    assert max(answers) < health.max_tokens  # answer + EOS fit: a runaway is a real one


@pytest.mark.slow
def test_two_builds_give_the_pinned_digest_whatever_the_ambient_environment(tmp_path,
                                                                             monkeypatch):
    first = build_trained_model("tiny-qwen3-gsm8k", root=tmp_path / "a")
    # What a different machine could bring: vectorised kernels, another MKL path, more
    # threads. The training interpreter pins all of them, so the bytes do not move.
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    second = build_trained_model("tiny-qwen3-gsm8k", root=tmp_path / "b")
    assert first.digest == second.digest == DIGEST
    assert (first.path / "model.safetensors").read_bytes() == (
        second.path / "model.safetensors").read_bytes()
    record = json.loads((first.path / "rowgate-model.json").read_text())
    assert record["min_target_probability"] >= 0.99 and record["digest"] == DIGEST


def test_missing_training_data_is_one_clear_line(tmp_path, monkeypatch):
    from rowgate.models import tiny as model

    monkeypatch.setitem(model.TRAINED_MODELS, "t", model.TrainSpec(dataset=str(tmp_path / "x")))
    with pytest.raises(model.ModelError, match="training data .*x is not here"):
        build_trained_model("t", root=tmp_path)
