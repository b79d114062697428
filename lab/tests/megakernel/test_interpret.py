"""The builder's task list, run through the ABI's torch semantics on the buffers the GPU
path binds (the model's own weights, the paged cache, one workspace), equals the
reference engine's bf16 decode step: every operand, tile, flag and layout of the step
is wired right before any kernel runs it, unfused and fused alike."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rowgate.engines.qwen3 import PAGE_SIZE, PagedKVCache, Qwen3Model, torch_paged_decode_attention  # noqa: E402
from rowgate.models.tiny import TinyModelSpec, build_tiny_model  # noqa: E402
from rowgate_lab.megakernel import interpret  # noqa: E402
from rowgate_lab.megakernel.abi import Flag, Opcode  # noqa: E402
from rowgate_lab.ops.megakernel import StepBuffers  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    info = build_tiny_model(TinyModelSpec(), root=tmp_path_factory.mktemp("models"))
    return Qwen3Model(info.path, "cpu", torch.bfloat16, torch_paged_decode_attention)


def _prefilled(model, lengths: list[int], seed: int):
    pages = max(lengths) // PAGE_SIZE + 2
    cache = PagedKVCache(model.cfg, len(lengths) * pages, "cpu", torch.bfloat16)
    gen = torch.Generator().manual_seed(seed)
    tables, first = [], []
    with torch.inference_mode():
        for n in lengths:
            blocks = [cache.allocate() for _ in range(pages)]
            ids = torch.randint(1, model.cfg.vocab_size, (n,), generator=gen)
            slots = torch.tensor([blocks[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE
                                  for p in range(n)])
            first.append(int(model.prefill(ids, slots, cache).argmax()))
            tables.append(blocks)
    args = (torch.tensor(first), torch.tensor(lengths),
            torch.tensor([bl[n // PAGE_SIZE] * PAGE_SIZE + n % PAGE_SIZE
                          for bl, n in zip(tables, lengths)]),
            torch.tensor(tables, dtype=torch.int32),
            torch.tensor([n + 1 for n in lengths], dtype=torch.int32))
    return cache, args


# SM counts chosen so attention splits are one page (16 tokens): contexts then span
# several splits, empty ones included, and page boundaries fall inside and between them.
FULL = {"fuse_norm": True, "fuse_merge": True, "fine_deps": True}


@pytest.mark.parametrize("options", [{"fuse": False}, {}, FULL, {**FULL, "tile_scale": 2},
                                     {"l2_ahead": 4}, {"one_wave": True}, {"silu_out": False},
                                     {**FULL, "silu_out": False}, {"even_splits": False},
                                     {"fuse": False, "even_splits": False},
                                     {"kv_splits": 1}, {**FULL, "kv_splits": 2},
                                     {"pad_levels": True}],
                         ids=["unfused", "fused (default)", "fully-fused", "fully-fused-x2",
                              "fused-l2-ahead", "fused-one-wave", "fused-silu-in",
                              "fully-fused-silu-in", "fused-planned-splits",
                              "unfused-planned-splits", "fused-one-split",
                              "fully-fused-two-splits", "fused-padded"])
@pytest.mark.parametrize("lengths,sms,splits", [([37], 132, 3), ([5, 16, 33, 70], 1024, 5),
                                                ([1, 2, 15, 16, 17, 31, 32, 100], 132, 1)])
def test_the_task_list_computes_the_reference_decode_step(model, lengths, sms, splits, options):
    cache, args = _prefilled(model, lengths, seed=len(lengths))
    k0, v0 = [k.clone() for k in cache.k], [v.clone() for v in cache.v]
    step = StepBuffers(model, cache, len(lengths), sms, **options)
    assert step.plan.options["fused"] == options.get("fuse", True)
    chunk = next(t.tile[3] for t in step.plan.tasks if t.opcode == Opcode.ATTN_SPLIT)
    if not options.get("one_wave") and options.get("even_splits") is False:  # planned
        assert -(-(max(lengths) + 1) // chunk) == splits  # non-empty splits of the longest
    step.stage(*args)
    with torch.inference_mode():
        interpret.run(step.plan.tasks, step.plan.shape, step.tensors)
        got = step.logits.clone()
        k_task, v_task = [k.clone() for k in cache.k], [v.clone() for v in cache.v]
        for k, v, ka, va in zip(cache.k, cache.v, k0, v0):
            k.copy_(ka)
            v.copy_(va)
        want = model.decode(*args, cache)
    for a, b in zip(k_task + v_task, list(cache.k) + list(cache.v)):
        torch.testing.assert_close(a, b, rtol=0.02, atol=0.02)
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.25)
    assert got.argmax(-1).tolist() == want.argmax(-1).tolist()


def test_staging_writes_the_step_into_meta(model):
    cache, args = _prefilled(model, [3, 40], seed=0)
    step = StepBuffers(model, cache, 2, 8)
    step.stage(*args)
    s = step.plan.shape
    meta = step.meta
    assert meta[s.ids_at:s.ids_at + 2].tolist() == args[0].tolist()
    assert meta[s.positions_at:s.positions_at + 2].tolist() == [3, 40]
    assert meta[s.context_lens_at:s.context_lens_at + 2].tolist() == [4, 41]
    tables = meta[s.block_tables_at:s.block_tables_at + 2 * s.table_width].view(2, -1)
    assert tables[:, :args[3].shape[1]].tolist() == args[3].tolist()
    assert int(tables[:, args[3].shape[1]:].abs().sum()) == 0
    with pytest.raises(ValueError, match="planned for batch 2, got 1"):
        step.stage(*(a[:1] for a in args))


def test_the_fused_list_computes_what_the_unfused_one_computes(model):
    """Each flag is the unfused op it replaces: the same values, the same K/V appended."""
    lengths = [5, 16, 33, 70]
    out = []
    for fuse in (False, True):
        cache, args = _prefilled(model, lengths, seed=3)
        step = StepBuffers(model, cache, len(lengths), 1024, fuse=fuse, **(FULL if fuse else {}))
        step.stage(*args)
        with torch.inference_mode():
            interpret.run(step.plan.tasks, step.plan.shape, step.tensors)
        out.append((step.logits.clone(), [k.clone() for k in cache.k + cache.v]))
    (la, ca), (lb, cb) = out
    for a, b in zip(ca, cb):
        assert torch.equal(a, b)
    torch.testing.assert_close(la, lb, rtol=0, atol=0.25)  # GEMV tiles differ: matmul order
    assert la.argmax(-1).tolist() == lb.argmax(-1).tolist()


def test_silu_out_computes_what_the_down_tiles_silu_in_computes(model):
    """SILU_OUT's epilogue is SILU_MUL of the gate and up rows as the gate|up tiles store
    them: the act a down tile stages is the same bf16 either way, so the logits are too
    (the GEMV rows are the same dot products; only the tile a row is in differs)."""
    lengths = [5, 16, 33, 70]
    out = []
    for silu_out in (False, True):
        cache, args = _prefilled(model, lengths, seed=4)
        step = StepBuffers(model, cache, len(lengths), 1024, silu_out=silu_out)
        assert any(t.flags & Flag.SILU_OUT for t in step.plan.tasks) == silu_out
        step.stage(*args)
        with torch.inference_mode():
            interpret.run(step.plan.tasks, step.plan.shape, step.tensors)
        out.append(step.logits.clone())
    assert torch.equal(out[0], out[1])
