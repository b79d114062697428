"""OpenAI-compatible servers started by a command, on loopback, stopped by their PID."""

from __future__ import annotations

import sys

import pytest

from rowgate.engines import create
from rowgate.engines._process import live_group_members
from rowgate.engines.interface import EngineError
from rowgate.engines.openai import OpenAIEngine, _chunk_tokens
from rowgate.engines.reference import ReferenceEngine
from rowgate.engines.vllm import VllmServerEngine, installed_version
from rowgate.rows.spec import Arm, Arms, EngineKind


def _group_gone(pid: int) -> bool:
    """No live process left in the group the server led (zombies awaiting reaping are dead)."""
    return live_group_members(pid) == []


def test_server_that_exits_is_reported_with_its_log(tiny_model):
    engine = OpenAIEngine([sys.executable, "-c", "import sys; print('boom', file=sys.stderr); "
                           "sys.exit(3)"], tiny_model.path)
    with pytest.raises(EngineError, match="exited with 3 before serving.*boom"):
        engine.start()
    assert _group_gone(engine.pid)


def test_server_that_never_serves_is_stopped_by_pid_with_its_children(tiny_model):
    # The command forks a child: stopping by the leader's PID must take the group.
    engine = OpenAIEngine(["sh", "-c", "sleep 600 & sleep 600"], tiny_model.path,
                          start_timeout_s=2)
    with pytest.raises(EngineError, match="not ready on 127.0.0.1:[0-9]+ after 2 s"):
        engine.start()
    assert _group_gone(engine.pid)


def test_placeholders_and_factory(tiny_model, tmp_path):
    arm = Arm(engine=EngineKind.OPENAI, command=["srv", "--port", "{port}", "-m", "{model}",
                                                 "--root", "{subject}"])
    engine = create(arm, tiny_model.path, subject=tmp_path)
    assert isinstance(engine, OpenAIEngine)
    engine.port = 8123
    assert engine.argv() == ["srv", "--port", "8123", "-m", str(tiny_model.path),
                             "--root", str(tmp_path)]
    on_socket = create(Arm(engine=EngineKind.OPENAI, command=["srv", "--uds", "{socket}"]),
                       tiny_model.path)
    assert on_socket.listens_on_socket() and not engine.listens_on_socket()
    with pytest.raises(ValueError, match=r"no \{port\} or \{socket\}"):
        Arms(oracle=Arm(engine=EngineKind.REFERENCE, version="rowgate"),
             candidate=Arm(engine=EngineKind.OPENAI, command=["srv", "--port", "8000"]))
    with pytest.raises(EngineError, match="unknown placeholder 'gpu'"):
        create(Arm(engine=EngineKind.OPENAI, command=["srv", "{gpu}"]), tiny_model.path).argv()
    with pytest.raises(EngineError, match="declares no command"):
        create(Arm(engine=EngineKind.OPENAI), tiny_model.path)


def test_a_subject_server_runs_in_its_checkout_and_its_binary_is_hashed(tiny_model, tmp_path):
    # The subject's own server script, started by a relative path in its checkout: it
    # says where it runs and tries to write there (the sandbox holds the subject
    # read-only), then exits (so start fails, after the record is made).
    (tmp_path / "serve.sh").write_text("#!/bin/sh\npwd\ntouch written 2>/dev/null || "
                                       "echo subject-read-only\nexit 4\n")
    (tmp_path / "serve.sh").chmod(0o755)
    engine = OpenAIEngine(["./serve.sh", "{port}"], tiny_model.path, subject=tmp_path)
    with pytest.raises(EngineError, match="exited with 4"):
        engine.start()
    said = engine.log.read_text()
    assert str(tmp_path) in said and "subject-read-only" in said
    assert not (tmp_path / "written").exists()
    import hashlib
    info = engine.describe()
    assert info["binary"] == str(tmp_path / "serve.sh") and info["cwd"] == str(tmp_path)
    assert info["binary_sha256"] == "sha256:" + hashlib.sha256(
        (tmp_path / "serve.sh").read_bytes()).hexdigest()


def test_chunks_must_carry_token_ids():
    chunk = {"choices": [{"logprobs": {"tokens": ["token_id:7", "token_id:9"],
                                       "token_logprobs": [-0.5, -1.25],
                                       "top_logprobs": [{"token_id:7": -0.5, "token_id:3": -2.0,
                                                         "token_id:4": -1.0}, {}]}}]}
    assert _chunk_tokens(chunk, "r") == [(7, -0.5, ((4, -1.0), (3, -2.0))), (9, -1.25, ())]
    assert _chunk_tokens({"choices": [], "usage": {}}, "r") == []
    with pytest.raises(EngineError, match="not a token id"):
        _chunk_tokens({"choices": [{"logprobs": {"tokens": ["hello"],
                                                 "token_logprobs": [-1.0]}}]}, "r")
    with pytest.raises(EngineError, match="text without token ids"):
        _chunk_tokens({"choices": [{"text": "hello", "logprobs": None}]}, "r")


def test_llama_cpp_chunks_carry_ids_in_content():
    chunk = {"choices": [{"text": "t784", "logprobs": {"content": [
        {"id": 784, "token": "t784", "logprob": -0.59, "top_logprobs": [
            {"id": 784, "logprob": -0.59}, {"id": 13, "logprob": -0.86}]}]}}]}
    assert _chunk_tokens(chunk, "r") == [(784, -0.59, ((13, -0.86),))]


@pytest.mark.slow
@pytest.mark.skipif(installed_version() is None, reason="vLLM not installed")
def test_vllm_server_streams_the_reference_tokens_and_stops(tiny_model, demo_passes):
    # mode eager: vLLM's enforce_eager, no torch.compile (saves ~50 s of start-up on 2 cores)
    arm = Arm(engine=EngineKind.VLLM, version="0.32.0", dtype="float32", mode="eager")
    server = create(arm, tiny_model.path, options={"endpoint": "true", "vllm_max_num_seqs": "4"})
    assert isinstance(server, VllmServerEngine)
    work = demo_passes[1:3]  # i16-c4 and i64-c1
    with server:
        pid = server.pid
        assert server.describe()["endpoint"].startswith("http://127.0.0.1:")
        results = [server.generate(p) for p in work]
    assert _group_gone(pid)
    with ReferenceEngine(tiny_model.path) as ref:
        expected = [ref.generate(p) for p in work]
    for got, want in zip(results, expected):
        for g, w in zip(got.outputs, want.outputs):
            assert g.token_ids == w.token_ids
            assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) < 1e-3
            assert g.ttft_s is not None and 0 < g.ttft_s <= g.latency_s
            # As in vLLM's bench: one ITL per streamed chunk after the first; a
            # chunk may carry several tokens when the server coalesces them.
            assert 0 <= len(g.itl_s) <= len(g.token_ids) - 1
            assert sum(g.itl_s) <= g.latency_s - g.ttft_s + 1e-6
