"""The engine gates over any arm and every model: an OpenAI server that is not rowgate's
engine traced through the trace gate with its seams and its traced tokens matched to the
tokens gate's (and a planted divergence refused), an untraceable arm refused before it
starts, two models in one row, a row whose prompts come from a pinned dataset."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from rowgate.decision.criteria import evaluate_criterion
from rowgate.gates import arms as _arms
from rowgate.gates.tokens import Tokens
from rowgate.gates.trace import Trace
from rowgate.records.status import Status
from rowgate.rows.row import load_row
from tests.gates.engine_rows import run_one
from tests.support import DEMOS

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "fixtures" / "openai_server.py"
SHAREGPT = DEMOS / "data" / "sharegpt-tiny.jsonl"

TOKENS = '''
    [[gates]]
    id = "tokens"
    kind = "tokens"
'''
TRACE = TOKENS + '''
    [[gates]]
    id = "trace"
    kind = "trace"
    modes = ["eager"]
    arms = ["candidate"]
    warm_concurrency = 2
    primer_steps = 6
    primer_concurrency = 1
    arm_delay = 7
    steps = 3
'''


def row(directory: Path, row_id: str, *, candidate: str, body: str = TRACE,
        models: str = '[[models]]\nid = "tiny"\nname = "tiny-qwen3"', workload: str = "",
        tail: str = "") -> Path:
    text = textwrap.dedent(f'''
        id = "{row_id}"
        title = "engine arm test row"
        kind = "demo"

        [target]
        arch = "cpu"

    ''') + models + textwrap.dedent(f'''

        [arms.oracle]
        engine = "reference"
        version = "rowgate"
        mode = "eager"

        [arms.candidate]
        {candidate}

        [workload]
        input_lens = [16]
        concurrency = [1, 2]
        output_len = 6
        requests_per_cell = 2
        seeds = [0]
    ''') + textwrap.dedent(workload) + textwrap.dedent(body) + textwrap.dedent(tail)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{row_id}.toml"
    path.write_text(text)
    return path


# The server listens on its own Unix socket ({socket}), as vLLM does with --uds.
SERVER_COMMAND = [sys.executable, str(SERVER), "--model", "{model}", "--uds", "{socket}"]
FIXTURE = f'engine = "openai"\ncommand = {json.dumps(SERVER_COMMAND)}'
SEAM = '''
    [[gates.seams]]
    arm = "candidate"
    name = "gpu_model_runner: forward"

    [[gates.seams]]
    arm = "candidate"
    name = "never-there"
    kind = "kernel"
'''


@pytest.fixture(scope="module")
def fixture_stage(tmp_path_factory):
    """Tokens then trace, one stage, the candidate the fixture server."""
    tmp = tmp_path_factory.mktemp("fixture-arm")
    path = row(tmp, "FIXTURE-ARM", candidate=FIXTURE, body=TRACE + SEAM)
    stage = tmp / "stage"
    tokens = run_one(Tokens(), path, "tokens", stage)
    trace = run_one(Trace(), path, "trace", stage)
    return path, stage, tokens, trace


@pytest.mark.slow
def test_an_openai_server_arm_is_traced_with_seams_and_matched_windows(fixture_stage):
    _, _, tokens, trace = fixture_stage
    assert tokens.status is Status.PASS, tokens.reason  # its own model, rowgate's tokens
    assert trace.metrics["candidate.eager.valid"] == 1
    assert (trace.metrics["windows_checked"], trace.metrics["windows_mismatched"]) == (1, 0)
    assert trace.metrics["candidate.eager.seam.gpu_model_runner: forward.step_share"] > 0.5
    # a required seam the trace does not show fails the gate, named
    assert trace.status is Status.FAIL
    assert "required seam(s) not in the range: never-there" in trace.reason


@pytest.mark.slow
def test_a_planted_traced_window_divergence_is_refused(fixture_stage, tmp_path):
    path, stage, _, _ = fixture_stage
    copy = tmp_path / "stage"
    shutil.copytree(stage, copy)
    record = json.loads((copy / "artifacts/trace/candidate-eager/capture.json").read_text())
    source = record["prompt_sources"][1]
    lines = (copy / "artifacts/tokens/candidate.jsonl").read_text().splitlines()
    planted = []
    for line in lines:
        doc = json.loads(line)
        if doc["id"] == source:
            doc["token_ids"][2] = (doc["token_ids"][2] + 1) % 1000 + 2
        planted.append(json.dumps(doc))
    (copy / "artifacts/tokens/candidate.jsonl").write_text("\n".join(planted) + "\n")
    loaded = load_row(path).row
    d = Trace().derive(loaded, loaded.gate("trace"), copy / "artifacts" / "trace")
    assert d.status is Status.FAIL and d.metrics["windows_mismatched"] == 1
    assert f"traced tokens differ from the correctness pass (1 request(s); first at request " \
           f"{source} position 2" in d.reason


@pytest.mark.slow
def test_a_trace_gate_before_the_tokens_gate_re_derives_what_it_saw(fixture_stage, tmp_path):
    """With the trace gate first, the tokens gate's outputs were not there when it ran:
    its derive must not match them at review either, or a sealed bundle (which holds
    them) re-derives another reason than it was sealed with."""
    path, stage, _, _ = fixture_stage
    reordered = row(tmp_path, "FIXTURE-ARM", candidate=FIXTURE, body=TRACE.replace(TOKENS, "")
                    + SEAM + TOKENS)
    loaded = load_row(reordered).row
    assert [g.id for g in loaded.gates] == ["trace", "tokens"]
    d = Trace().derive(loaded, loaded.gate("trace"), stage / "artifacts" / "trace")
    assert d.metrics["windows_checked"] == 0
    assert "traced tokens not matched: no candidate outputs of gate tokens in this bundle" \
           in d.reason
    first = load_row(path).row  # tokens first: the same artifacts are matched
    assert Trace().derive(first, first.gate("trace"), stage / "artifacts" / "trace"
                          ).metrics["windows_checked"] == 1


def test_an_untraceable_arm_is_refused_before_anything_starts(tmp_path):
    path = row(tmp_path, "LLAMA-TRACE", candidate='engine = "llama.cpp"\nversion = "0.0.1"')
    result = run_one(Trace(), path, "trace", tmp_path / "stage")
    assert result.status is Status.ERROR
    assert "arm candidate cannot be traced: llama.cpp's server has no profiling " \
           "endpoints" in result.reason


TWO_MODELS = '''
[[models]]
id = "tiny-a"
name = "tiny-qwen3"

[[models]]
id = "tiny-b"
name = "tiny-qwen3-seed1"

[models.synthetic]
seed = 1
'''
CRITERIA = '''
    [[criteria]]
    id = "b-exact"
    gate = "tokens"
    metric = "mismatched_requests"
    comparison = "eq"
    threshold = 0
    cells = ["*"]
    models = ["tiny-b"]
'''


def test_two_models_in_one_row_are_both_gated(tmp_path):
    path = row(tmp_path, "TWO-MODELS", candidate='engine = "reference"\nmode = "eager"',
               models=TWO_MODELS, tail=CRITERIA)
    loaded = load_row(path).row
    assert loaded.cells() == ["tiny-a/i16-c1", "tiny-a/i16-c2", "tiny-b/i16-c1",
                              "tiny-b/i16-c2"]
    stage = tmp_path / "stage"
    tokens = run_one(Tokens(), path, "tokens", stage)
    assert tokens.status is Status.PASS, tokens.reason
    assert sorted(tokens.cells) == loaded.cells() and tokens.metrics["requests"] == 8
    meta = json.loads((stage / "artifacts/tokens/meta.json").read_text())
    assert meta["models"]["tiny-a"] != meta["models"]["tiny-b"]
    trace = run_one(Trace(), path, "trace", stage)
    assert trace.status is Status.PASS, trace.reason
    assert set(trace.cells) == {"tiny-a/i16-c2", "tiny-b/i16-c2"}
    assert trace.metrics["windows_checked"] == 2 and trace.metrics["windows_mismatched"] == 0
    assert (stage / "artifacts/trace/tiny-b/candidate-eager/trace.json.gz").is_file()
    c = evaluate_criterion(loaded.criteria[0], loaded, tokens)
    assert c.outcome.value == "pass" and sorted(c.measured) == ["tiny-b/i16-c1",
                                                               "tiny-b/i16-c2"]


def dataset_table(path: Path) -> str:
    return f'''
    [workload.dataset]
    path = "{path.name}"
    sha256 = "{hashlib.sha256(path.read_bytes()).hexdigest()}"
    format = "sharegpt"
'''


def test_a_dataset_row_sends_the_file_prompts(tmp_path):
    shutil.copy(SHAREGPT, tmp_path / SHAREGPT.name)
    path = row(tmp_path, "DATASET-ROW", candidate='engine = "reference"\nmode = "eager"',
               workload=dataset_table(tmp_path / SHAREGPT.name), body=TOKENS)
    loaded = load_row(path).row
    runs = _arms.model_runs(loaded)
    first = json.loads(SHAREGPT.read_text().splitlines()[0])["conversations"][0]["value"]
    assert list(runs[0].passes[0].requests[0].prompt_ids) == [int(w[1:])
                                                              for w in first.split()][:16]
    result = run_one(Tokens(), path, "tokens", tmp_path / "stage")
    assert result.status is Status.PASS, result.reason
    (tmp_path / SHAREGPT.name).unlink()
    gone = run_one(Tokens(), path, "tokens", tmp_path / "stage2")
    assert gone.status is Status.PENDING
    assert f"dataset {tmp_path / SHAREGPT.name} (sharegpt) is not on this machine" in gone.reason
