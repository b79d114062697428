"""The lab-graph-fused engine on a CPU: the fused step (q|k|v and gate|up projections,
the split-KV cache layout) runs eagerly, records why (no CUDA: no graph, no
torch.compile), and gives the reference engine's tokens: identical in float32, exact or
a near-tie under the divergence rule in bfloat16. (On a GPU: lab/benchmarks/megakernel.py's
`baseline` section and lab/tests/engines/test_fused_gpu.py.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rowgate import engines  # noqa: E402
from rowgate.engines.divergence import Out, compare  # noqa: E402
from rowgate.engines.interface import EngineError  # noqa: E402
from rowgate.engines.qwen3 import PAGE_SIZE, PagedKVCache, Qwen3Config, torch_paged_decode_attention  # noqa: E402
from rowgate.rows.spec import Arm  # noqa: E402
from rowgate_lab.engines.fused import FusedKVCache, FusedModel, torch_fused_attention  # noqa: E402

ENGINE = {"eager": "reference", "graph-fused": "lab-graph-fused"}


def _generate(tiny_model, passes, mode: str, dtype: str, options: dict | None = None):
    arm = Arm(engine=ENGINE[mode], mode=mode, dtype=dtype)
    with engines.create(arm, tiny_model.path, device="cpu", options=options) as engine:
        return [engine.generate(p) for p in passes], engine.describe()


@pytest.fixture(scope="module")
def float32_runs(tiny_model, demo_passes):
    return (_generate(tiny_model, demo_passes, "eager", "float32"),
            _generate(tiny_model, demo_passes, "graph-fused", "float32"))


def test_float32_tokens_equal_the_reference_engine(float32_runs):
    (eager, _), (fused, _) = float32_runs
    for a, b in zip(eager, fused):
        for x, y in zip(a.outputs, b.outputs):
            assert x.token_ids == y.token_ids
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-4


def test_the_cpu_route_is_eager_and_recorded(float32_runs):
    _, (_, described) = float32_runs
    assert described["mode"] == "graph-fused"
    assert described["fused_route"] == ("eager: no CUDA device, so no CUDA graph and no "
                                        "torch.compile")
    assert described["fused_compile"] == "no (CPU: eager)"
    assert described["fused_compile_cache"] == "none (not compiled)"
    assert described["decode_attention"] == "torch (fused cache layout)"


def test_bfloat16_tokens_are_the_reference_engines_or_near_ties(tiny_model, demo_passes):
    eager, _ = _generate(tiny_model, demo_passes, "eager", "bfloat16")
    fused, _ = _generate(tiny_model, demo_passes, "graph-fused", "bfloat16")
    for a, b in zip(eager, fused):
        result = compare([Out.of(o) for o in a.outputs], [Out.of(o) for o in b.outputs], 0.5)
        assert result["mismatched_requests"] == 0, result["first_divergence"]


def test_projection_weights_are_views_of_the_fused_ones(tiny_model):
    model = FusedModel(tiny_model.path, "cpu", torch.float32, "max-autotune-no-cudagraphs")
    assert model.compiled == "no (CPU: eager)"
    p = "model.layers.1."
    q, k, v = (model.w[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
    assert q.data_ptr() == model.qkv[1].data_ptr()
    assert v.data_ptr() + v.numel() * v.element_size() == \
        model.qkv[1].data_ptr() + model.qkv[1].numel() * model.qkv[1].element_size()
    assert torch.equal(model.qkv[1], torch.cat([q, k, v]))
    up = model.w[p + "mlp.up_proj.weight"]
    assert up.data_ptr() == model.gate_up[1][model.inter:].data_ptr()


def test_fused_cache_layout_and_attention_equal_the_reference(tiny_model):
    cfg = Qwen3Config.load(tiny_model.path)
    gen = torch.Generator().manual_seed(0)
    fused, ref = FusedKVCache(cfg, 6, "cpu", torch.float32), PagedKVCache(cfg, 6, "cpu",
                                                                       torch.float32)
    slots = torch.randperm(6 * PAGE_SIZE, generator=gen)[:40] + PAGE_SIZE  # never block 0
    k = torch.randn(40, cfg.num_kv_heads, cfg.head_dim, generator=gen)
    v = torch.randn(40, cfg.num_kv_heads, cfg.head_dim, generator=gen)
    for cache in (fused, ref):
        cache.write(0, slots, k, v)
    assert fused.k[0].shape == (7, cfg.num_kv_heads, PAGE_SIZE, cfg.head_dim)
    page, off = int(slots[3]) // PAGE_SIZE, int(slots[3]) % PAGE_SIZE
    assert torch.equal(fused.k[0][page, :, off], k[3])
    assert torch.equal(fused.k[0].transpose(1, 2), ref.k[0])
    tables = torch.tensor([[1, 2, 3, 0], [4, 5, 6, 1]], dtype=torch.int32)
    lens = torch.tensor([37, 64], dtype=torch.int32)
    q = torch.randn(2, cfg.num_heads, cfg.head_dim, generator=gen)
    scale = cfg.head_dim ** -0.5
    torch.testing.assert_close(
        torch_fused_attention(q, fused.k[0], fused.v[0], tables, lens, scale),
        torch_paged_decode_attention(q, ref.k[0], ref.v[0], tables, lens, scale))


def test_an_unknown_compile_mode_is_refused(tiny_model):
    arm = Arm(engine="lab-graph-fused", mode="graph-fused", dtype="bfloat16")
    with pytest.raises(EngineError, match="fused_compile 'fast' is not one of "
                                          "max-autotune-no-cudagraphs, "):
        engines.create(arm, tiny_model.path, options={"fused_compile": "fast"})


def test_a_split_chunk_is_an_engine_option(tiny_model):
    arm = Arm(engine="lab-graph-fused", mode="graph-fused", dtype="bfloat16")
    eng = engines.create(arm, tiny_model.path, options={"fused_chunk": "64"})
    assert eng.chunk == 64
    assert engines.create(arm, tiny_model.path, options={}).chunk is None
    with pytest.raises(EngineError, match="--option fused_chunk=many: not an integer"):
        engines.create(arm, tiny_model.path, options={"fused_chunk": "many"})
