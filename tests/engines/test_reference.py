"""The reference engine: paged attention, batching and sampling, against HF transformers."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rowgate.engines import create
from rowgate.engines.interface import EngineError
from rowgate.engines.qwen3 import PAGE_SIZE, torch_paged_decode_attention
from rowgate.engines.reference import ALTERNATIVES, ReferenceEngine, sample, step_inputs
from rowgate.rows.spec import Arm, EngineKind


@pytest.fixture(scope="module")
def engine(tiny_model):
    with ReferenceEngine(tiny_model.path) as eng:
        yield eng


@pytest.fixture(scope="module")
def greedy(engine, demo_passes):
    return [engine.generate(p) for p in demo_passes]


def test_paged_attention_equals_dense_attention():
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, blocks = 4, 2, 32, 12
    lens = [1, PAGE_SIZE - 1, PAGE_SIZE, PAGE_SIZE + 1, 40]
    k_cache = torch.randn(blocks, PAGE_SIZE, kv_heads, dim, generator=gen)
    v_cache = torch.randn(blocks, PAGE_SIZE, kv_heads, dim, generator=gen)
    order = torch.randperm(blocks, generator=gen).tolist()  # scattered pages
    tables, q = [], torch.randn(len(lens), heads, dim, generator=gen)
    for n in lens:
        need = -(-n // PAGE_SIZE)
        tables.append([order.pop() for _ in range(need)] + [0] * (3 - need))
    out = torch_paged_decode_attention(q, k_cache, v_cache, torch.tensor(tables, dtype=torch.int32),
                                       torch.tensor(lens, dtype=torch.int32), dim ** -0.5)
    for b, n in enumerate(lens):
        k = k_cache[tables[b]].reshape(-1, kv_heads, dim)[:n].repeat_interleave(2, 1)
        v = v_cache[tables[b]].reshape(-1, kv_heads, dim)[:n].repeat_interleave(2, 1)
        want = torch.softmax(torch.einsum("hd,thd->ht", q[b], k) * dim ** -0.5, -1)
        torch.testing.assert_close(out[b], torch.einsum("ht,thd->hd", want, v))


def test_greedy_equals_transformers(tiny_model, demo_passes, greedy):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_model.path, dtype=torch.float32)
    for work, result in zip(demo_passes[::2], greedy[::2]):  # c1 cells; c4 are checked below
        for req, out in zip(work.requests, result.outputs):
            seq = hf.generate(torch.tensor([req.prompt_ids]), max_new_tokens=req.max_tokens,
                              min_new_tokens=req.max_tokens, do_sample=False,
                              output_logits=True, return_dict_in_generate=True)
            assert tuple(seq.sequences[0, len(req.prompt_ids):].tolist()) == out.token_ids
            want = [torch.log_softmax(s[0], -1)[t].item() for s, t in zip(seq.logits, out.token_ids)]
            torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(want),
                                       rtol=0, atol=1e-4)


def test_outputs_do_not_depend_on_concurrency(greedy):
    by_cell = {r.outputs[0].id.split("-r")[0]: r for r in greedy}
    for length in (16, 64):
        c1, c4 = by_cell[f"i{length}-c1"], by_cell[f"i{length}-c4"]
        assert [o.token_ids for o in c1.outputs] == [o.token_ids for o in c4.outputs]


def test_timings_and_lengths(greedy, demo_passes):
    for work, result in zip(demo_passes, greedy):
        assert [o.id for o in result.outputs] == [r.id for r in work.requests]
        for out in result.outputs:
            assert len(out.token_ids) == len(out.logprobs) == 16
            assert len(out.itl_s) == 15
            assert 0 <= out.ttft_s <= out.latency_s <= result.wall_s
            assert all(lp <= 0 for lp in out.logprobs)
        assert result.output_tokens == 64


def test_more_requests_than_concurrency_and_odd_lengths(engine, demo_passes):
    work = demo_passes[1]
    reqs = tuple(dataclasses.replace(r, id=f"x{i}", max_tokens=3 + 7 * i)
                 for i, r in enumerate(work.requests * 2))
    result = engine.generate(dataclasses.replace(work, concurrency=3, requests=reqs))
    assert [len(o.token_ids) for o in result.outputs] == [3 + 7 * i for i in range(8)]
    # A request's tokens are the same whoever shares its batch.
    assert result.outputs[4].token_ids[:3] == result.outputs[0].token_ids


def test_seeded_sampling(engine, demo_passes):
    work = dataclasses.replace(demo_passes[1], temperature=1.0, top_k=20, top_p=0.95)
    a, b = engine.generate(work), engine.generate(work)
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    reseeded = dataclasses.replace(work, requests=tuple(
        dataclasses.replace(r, seed=r.seed + 1) for r in work.requests))
    c = engine.generate(reseeded)
    assert [o.token_ids for o in a.outputs] != [o.token_ids for o in c.outputs]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_read_a_step_returns_exactly_what_each_value_reads(demo_passes, dtype):
    """sample() packs ids, log-probabilities and alternatives into one float64 read; each
    must come back as the value its own tensor holds (ids as ints, bf16 values exact)."""
    logits = (torch.randn(3, 151_936, generator=torch.Generator().manual_seed(0)) * 8
              ).to(dtype)
    logits[:, 151_000] = 1e3  # a known argmax, far into the vocabulary
    ids, chosen, alternatives = sample(logits, demo_passes[0], [None] * 3)
    logprobs = torch.log_softmax(logits, dim=-1)
    assert ids == [151_000] * 3 and all(type(i) is int for i in ids)
    assert chosen == logprobs[:, 151_000].tolist()
    # the same top-k of the others as sample() takes (bf16 ties break the same way)
    top = logprobs.scatter(-1, torch.tensor(ids)[:, None], float("-inf")).topk(ALTERNATIVES)
    assert alternatives == [tuple(zip(i, v)) for i, v in
                            zip(top.indices.tolist(), top.values.tolist())]
    assert all(type(t) is int for alt in alternatives for t, _ in alt)


def test_step_inputs_are_one_copy_of_the_values_and_dtypes_the_step_reads():
    tokens, positions, slots = [7, 151_935], [128, 3], [70_000, 1]
    tables = [[5, 9, 1093], [2, 0, 0]]
    ids, pos, sl, tab, lens = step_inputs(tokens, positions, slots, tables, "cpu")
    assert [t.dtype for t in (ids, pos, sl, tab, lens)] == [torch.int64] * 3 + [torch.int32] * 2
    assert (ids.tolist(), pos.tolist(), sl.tolist(), tab.tolist(), lens.tolist()) == \
        (tokens, positions, slots, tables, [129, 4])
    assert all(t.is_contiguous() for t in (ids, pos, sl, tab, lens))
    # the int32 inputs are views of the one copied buffer, not copies of their own
    assert tab.untyped_storage().data_ptr() == lens.untyped_storage().data_ptr()


def test_top_k_one_is_greedy(engine, demo_passes, greedy):
    work = dataclasses.replace(demo_passes[1], temperature=0.7, top_k=1)
    assert [o.token_ids for o in engine.generate(work).outputs] == \
        [o.token_ids for o in greedy[1].outputs]


def test_natural_eos_stops_early(tiny_model, demo_passes, greedy):
    # Make the first greedy token of request 0 the model's EOS: it must stop there.
    import json
    import shutil

    eos = greedy[0].outputs[0].token_ids[0]
    path = tiny_model.path.parent / "eos-variant"
    shutil.copytree(tiny_model.path, path, dirs_exist_ok=True)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    with ReferenceEngine(path) as eng:
        out = eng.generate(dataclasses.replace(demo_passes[0], ignore_eos=False)).outputs
    assert out[0].token_ids == (eos,)
    assert all(eos not in o.token_ids[:-1] for o in out)


def test_factory_and_refusals(tiny_model):
    eng = create(Arm(engine=EngineKind.REFERENCE, mode="eager"), tiny_model.path)
    assert isinstance(eng, ReferenceEngine)
    with pytest.raises(EngineError, match="needs a CUDA device"):
        ReferenceEngine(tiny_model.path, mode="graph")
    with pytest.raises(EngineError, match="generate\\(\\) before start"):
        eng.generate(None)
    from rowgate.engines.llamacpp import LlamaCppEngine

    assert isinstance(create(Arm(engine=EngineKind.LLAMA_CPP), tiny_model.path), LlamaCppEngine)


def test_decode_attention_is_a_seam(tiny_model, demo_passes, greedy):
    calls = []

    def counted(*args):
        calls.append(args[0].shape[0])  # batch of the decode step
        return torch_paged_decode_attention(*args)

    with ReferenceEngine(tiny_model.path, decode_attention=counted) as eng:
        out = eng.generate(demo_passes[1])
        assert eng.describe()["decode_attention"].endswith("counted")
    assert [o.token_ids for o in out.outputs] == [o.token_ids for o in greedy[1].outputs]
    assert max(calls) == 4 and len(calls) == 2 * 15  # 2 layers x 15 decode steps


def test_describe_records_model_digest(engine, tiny_model):
    info = engine.describe()
    assert info["model_digest"] == tiny_model.digest
    assert info["engine"] == "reference" and info["dtype"] == "float32"
    assert info["decode_attention"] == "torch_paged_decode_attention"


def test_context_longer_than_the_model_is_refused(engine, demo_passes):
    work = demo_passes[0]
    req = dataclasses.replace(work.requests[0], max_tokens=5000)
    with pytest.raises(EngineError, match="max_position_embeddings"):
        engine.generate(dataclasses.replace(work, requests=(req,)))
