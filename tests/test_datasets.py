"""Real prompts: a pinned JSONL prompt file tokenized with the model's tokenizer, cut or
filled to each input length, its digest in the workload digest."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from rowgate.models.tiny import build_tiny_model
from rowgate.rows import datasets
from rowgate.rows.datasets import DatasetError, DatasetRef
from rowgate.rows.spec import Workload
from rowgate.rows.workload import DatasetPrompts, build_passes, workload_digest
from tests.support import DEMOS

ROWS_DATA = DEMOS / "data"
SHAREGPT = ROWS_DATA / "sharegpt-tiny.jsonl"


def ref_for(path: Path, fmt: str = "sharegpt", **extra) -> DatasetRef:
    return DatasetRef(path=path.name, sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
                      format=fmt, **extra)


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model()


def prompts_of(ref: DatasetRef, row_dir: Path, tiny) -> DatasetPrompts:
    texts = datasets.load(ref, row_dir)
    ids = datasets.tokenize(texts, tiny.path / "tokenizer.json", set(tiny.special_ids))
    return DatasetPrompts(tuple(ref.describe().items()), tuple(tuple(i) for i in ids))


def test_sharegpt_prompts_are_the_human_turns_tokenized_and_sized(tiny):
    ref = ref_for(SHAREGPT)
    texts = datasets.load(ref, ROWS_DATA)
    first = json.loads(SHAREGPT.read_text().splitlines()[0])["conversations"][0]["value"]
    assert len(texts.texts) == 24 and texts.texts[0] == first
    work = Workload(input_lens=[16, 200], concurrency=[1], output_len=4, requests_per_cell=3)
    passes = build_passes(work, tiny.vocab_size, tiny.special_ids, prompts_of(ref, ROWS_DATA,
                                                                              tiny))
    want = [int(w[1:]) for w in first.split()]  # the tiny vocabulary: "tN" is id N
    short, long = passes[0].requests[0].prompt_ids, passes[1].requests[0].prompt_ids
    assert list(short) == want[:16]  # cut
    assert len(long) == 200 and list(long[:len(want)]) == want  # filled with the next texts
    second = [int(w[1:]) for w in texts.texts[1].split()]
    assert list(long[len(want):len(want) + len(second)]) == second[:200 - len(want)]
    assert passes[0].requests[1].prompt_ids != short  # request r starts at text r + seed


def test_the_dataset_is_in_the_workload_digest(tiny, tmp_path):
    work = Workload(input_lens=[16], concurrency=[1], output_len=4, requests_per_cell=2)
    random = build_passes(work, tiny.vocab_size, tiny.special_ids)
    shutil.copy(SHAREGPT, tmp_path / SHAREGPT.name)
    real = build_passes(work, tiny.vocab_size, tiny.special_ids,
                        prompts_of(ref_for(tmp_path / SHAREGPT.name), tmp_path, tiny))
    lines = SHAREGPT.read_text().splitlines()
    (tmp_path / "other.jsonl").write_text("\n".join([lines[0], lines[0], *lines[2:]]) + "\n")
    other = build_passes(work, tiny.vocab_size, tiny.special_ids,
                         prompts_of(ref_for(tmp_path / "other.jsonl"), tmp_path, tiny))
    # Same first prompt, another file: the digests differ all the same.
    assert other[0].requests[0].prompt_ids == real[0].requests[0].prompt_ids
    assert len({workload_digest(random), workload_digest(real), workload_digest(other)}) == 3


def test_a_file_not_at_its_pinned_bytes_is_refused(tmp_path):
    shutil.copy(SHAREGPT, tmp_path / "p.jsonl")
    ref = ref_for(tmp_path / "p.jsonl")
    with (tmp_path / "p.jsonl").open("a") as f:
        f.write('{"conversations": [{"from": "human", "value": "t5"}]}\n')
    with pytest.raises(DatasetError, match="is not the row's pinned"):
        datasets.load(ref, tmp_path)
    assert "not on this machine" in datasets.why_unavailable(
        ref.model_copy(update={"path": "gone.jsonl"}), tmp_path)


def test_speed_bench_records_by_category(tmp_path):
    path = tmp_path / "speed.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"question_id": "a", "category": "low_entropy", "turns": ["t5 t6 t7"]},
        {"question_id": "b", "category": "high_entropy", "turns": ["t9"]},
        {"question_id": "c", "category": "low_entropy", "turns": ["t8", "t10"]}]) + "\n")
    texts = datasets.load(ref_for(path, "speed-bench", category="low_entropy"), tmp_path)
    assert texts.texts == ("t5 t6 t7", "t8")
    with pytest.raises(DatasetError, match="no speed-bench prompt of category 'mid'"):
        datasets.load(ref_for(path, "speed-bench", category="mid"), tmp_path)


def test_text_the_tokenizer_does_not_know_is_refused(tiny, tmp_path):
    path = tmp_path / "english.jsonl"
    path.write_text(json.dumps({"conversations": [{"from": "human",
                                                   "value": "hello world"}]}) + "\n")
    texts = datasets.load(ref_for(path), tmp_path)
    with pytest.raises(DatasetError, match="no text gives a token"):
        datasets.tokenize(texts, tiny.path / "tokenizer.json", set(tiny.special_ids))
