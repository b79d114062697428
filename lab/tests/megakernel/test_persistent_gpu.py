"""The persistent megakernel on a GPU (marker gpu): one decode step against the eager
torch step, and whole greedy generations equal across eager, CUDA graph and persistent
(both schedules), with the fallback taken (and recorded) for a batch it does not support.

The cubin is the build gate's (rowgate.cuda.cudabuild, the GPU's arch; with the nvcc
ROWGATE_NVCC names on a device machine without the wheels) unless
ROWGATE_PERSISTENT_CUBIN names one built elsewhere (docs/task-abi.md gives the
device command).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

SCHEDULES = ["static-round-robin", "dynamic-queue"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from rowgate.models.tiny import TinyModelSpec, build_tiny_model

    return build_tiny_model(TinyModelSpec(), root=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def cubin() -> Path:
    path = os.environ.get("ROWGATE_PERSISTENT_CUBIN")
    if path:
        return Path(path)
    from rowgate_lab.ops.megakernel import build_cubin

    major, minor = torch.cuda.get_device_capability()
    return build_cubin(f"sm_{major}{minor}", os.environ.get("ROWGATE_NVCC"))


def _prefilled(tiny, batch: int, prompt_len: int):
    """A bf16 model and cache holding `batch` prefilled random prompts; the next step's args."""
    from rowgate.engines.qwen3 import PAGE_SIZE, PagedKVCache, Qwen3Model, torch_paged_decode_attention

    model = Qwen3Model(tiny.path, "cuda", torch.bfloat16, torch_paged_decode_attention)
    pages = (prompt_len + PAGE_SIZE) // PAGE_SIZE + 1
    cache = PagedKVCache(model.cfg, batch * pages, "cuda", torch.bfloat16)
    gen = torch.Generator().manual_seed(batch)
    tables, last = [], []
    with torch.inference_mode():
        for b in range(batch):
            blocks = [cache.allocate() for _ in range(pages)]
            ids = torch.randint(1, model.cfg.vocab_size, (prompt_len + b,), generator=gen)
            slots = torch.tensor([blocks[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE
                                  for p in range(len(ids))])
            logits = model.prefill(ids.cuda(), slots.cuda(), cache)
            tables.append(blocks)
            last.append((int(logits.argmax()), len(ids), blocks))
    positions = [n for _, n, _ in last]
    args = (torch.tensor([t for t, _, _ in last], device="cuda"),
            torch.tensor(positions, device="cuda"),
            torch.tensor([bl[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE
                          for (_, p, bl) in last], device="cuda"),
            torch.tensor(tables, device="cuda", dtype=torch.int32),
            torch.tensor([p + 1 for p in positions], device="cuda", dtype=torch.int32))
    return model, cache, args


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("batch", [1, 4, 8])
def test_one_step_equals_the_eager_step(tiny, cubin, batch, schedule):
    from rowgate_lab.megakernel.abi import Schedule
    from rowgate_lab.ops.megakernel import PersistentDecode

    model, cache, args = _prefilled(tiny, batch, 37)
    k_before = [k.clone() for k in cache.k]
    with torch.inference_mode():
        step = PersistentDecode(model, cache, batch, Schedule.from_row(schedule), cubin)
        got = step(*args)
        torch.cuda.synchronize()
        k_persistent = [k.clone() for k in cache.k]
        for k, k0 in zip(cache.k, k_before):
            k.copy_(k0)
        want = model.decode(*args, cache)
    for kp, ke in zip(k_persistent, cache.k):
        torch.testing.assert_close(kp, ke, rtol=0.02, atol=0.02)  # same K appended
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.25)
    assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
    # Counters and the queue head are reset per launch; which block runs a task does
    # not change its arithmetic, so a second launch is bitwise the first.
    with torch.inference_mode():
        again = step(*args)
    assert torch.equal(again, got)


def _generate(tiny, mode: str, options: dict, work):
    from rowgate import engines
    from rowgate.rows.spec import Arm
    from rowgate_lab.megakernel.proof import Out

    name = "lab-persistent" if mode == "persistent" else "reference"  # eager, graph
    arm = Arm(engine=name, mode=mode, dtype="bfloat16")
    with engines.create(arm, tiny.path, device="cuda:0", options=options) as engine:
        result = engine.generate(work)
        return [Out.of(o) for o in result.outputs], engine.describe()


TIE_MARGIN = 0.5
"""The megakernel row's: a top-2 swap within it is a tie, not a mismatch (proof.py)."""


@pytest.fixture(scope="module")
def passes(tiny):
    from rowgate.rows.spec import Workload
    from rowgate.rows.workload import build_passes

    work = Workload(input_lens=[16], concurrency=[1, 4, 8, 12], output_len=24,
                    requests_per_cell=12)
    return {p.cell: p for p in build_passes(work, tiny.vocab_size, tiny.special_ids)}


@pytest.mark.parametrize("cell", ["i16-c1", "i16-c4", "i16-c8"])
def test_tokens_equal_across_eager_graph_and_persistent(tiny, cubin, passes, cell):
    work = passes[cell]
    from rowgate_lab.megakernel.proof import compare

    eager, _ = _generate(tiny, "eager", {}, work)
    graph, _ = _generate(tiny, "graph", {}, work)
    assert [o.tokens for o in graph] == [o.tokens for o in eager]  # the same kernels, replayed
    runs = []
    for schedule in SCHEDULES:
        outs, described = _generate(tiny, "persistent", {"persistent_schedule": schedule,
                                                         "persistent_cubin": str(cubin)}, work)
        doc = compare(eager, outs, TIE_MARGIN)
        assert doc["mismatched_requests"] == 0, f"{schedule}: {doc['first_divergence']}"
        routes = json.loads(described["persistent_routes"])
        assert routes and all(r["mode"] == "persistent" for r in routes.values())
        runs.append(outs)
    assert runs[0] == runs[1]  # tokens and logprobs: the schedule never changes arithmetic


def test_an_unsupported_batch_falls_back_to_the_graph_and_says_so(tiny, cubin, passes):
    work = passes["i16-c12"]
    eager, _ = _generate(tiny, "eager", {}, work)
    outs, described = _generate(tiny, "persistent", {"persistent_cubin": str(cubin)}, work)
    assert [o.tokens for o in outs] == [o.tokens for o in eager]  # graph replay: same kernels
    routes = json.loads(described["persistent_routes"])
    assert routes["12"] == {"requested": "persistent", "mode": "graph", "fell_back": True,
                            "reasons": ["persistent: batch 12 (persistent kernel: 1..8)"]}


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_traced_launch_stamps_every_task_and_computes_the_same(tiny, cubin, schedule):
    from rowgate_lab.megakernel import timeline
    from rowgate_lab.megakernel.abi import Schedule
    from rowgate_lab.ops.megakernel import PersistentDecode

    model, cache, args = _prefilled(tiny, 4, 37)
    with torch.inference_mode():
        step = PersistentDecode(model, cache, 4, Schedule.from_row(schedule), cubin)
        plain = step(*args)
        trace = step.traced(*args)
        traced = step.step.logits.clone()
    assert torch.equal(traced, plain)
    b = timeline.breakdown(trace, step.plan.tasks, 1.98e9, step.sm_count)
    assert sum(b["tasks_per_block"]) == len(step.plan.tasks)
    assert 0 < b["run_fraction"] <= 1 and 0 <= b["wait_fraction"] < 1


PLAIN = {
    # the tensor-core build without RG_MK_STREAM: the ring within a task, 3 groups (these
    # defines replace the default's)
    "plain_ring": ["RG_MK_MMA=1"],
}


@pytest.fixture(scope="module")
def variant_cubins(tmp_path_factory):
    """A PLAIN entry's build (its defines in place of the tree's kernel's), built by the
    build gate's toolchain from a kernels.toml entry added to a copy of kernels/, when a
    test first asks for it."""
    import shutil
    import tomllib

    from rowgate.cuda import cudabuild
    from rowgate_lab.ops.megakernel import REPO, kernel_for

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    root = tmp_path_factory.mktemp("variants")
    shutil.copytree(REPO / "kernels", root / "kernels")
    manifest = root / "kernels" / "kernels.toml"
    base = tomllib.loads(manifest.read_text())["kernels"][kernel_for(arch)]
    with manifest.open("a") as f:
        for name, defines in PLAIN.items():
            f.write(f'\n[kernels.variant_{name}]\nsource = "{base["source"]}"\n'
                    f'entry_points = {json.dumps(base["entry_points"])}\narches = ["{arch}"]\n'
                    f"defines = {json.dumps(defines)}\n")
    built: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in built:
            built[name] = cudabuild.cubin(root, f"variant_{name}", arch,
                                          os.environ.get("ROWGATE_NVCC"))
        return built[name]

    return build


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A tiny model whose GEMVs take the tensor-core path (every K a multiple of 1024),
    with an intermediate size that puts batch 8 past the stream build's 48 KB staging
    buffer (its 3-group ring) and batch 1 and 4 within it (its 5-group ring)."""
    from rowgate.models.tiny import TinyModelSpec, build_tiny_model

    spec = TinyModelSpec(hidden_size=1024, intermediate_size=4096, num_heads=8,
                         num_kv_heads=4, head_dim=128)
    return build_tiny_model(spec, root=tmp_path_factory.mktemp("wide"))


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_the_stream_ring_is_the_plain_ring_bit_for_bit(wide, cubin, variant_cubins, batch):
    # the tensor-core build before RG_MK_STREAM on the default list (dynamic queue) against
    # the tree's kernel (the ring one stream across a block's tasks) on the same list, and
    # on it padded to whole waves (static schedule)
    from rowgate_lab.megakernel.abi import Schedule
    from rowgate_lab.ops.megakernel import PersistentDecode

    model, cache, args = _prefilled(wide, batch, 300)
    runs = ((variant_cubins("plain_ring"), Schedule.DYNAMIC_QUEUE, {}),
            (cubin, Schedule.DYNAMIC_QUEUE, {}),
            (cubin, Schedule.STATIC_ROUND_ROBIN, {"pad_levels": True}))
    with torch.inference_mode():
        out = []
        for path, schedule, options in runs:
            k0 = [k.clone() for k in cache.k]
            step = PersistentDecode(model, cache, batch, schedule, path, options=options)
            assert step.plan.options.get("pad_levels", False) == bool(options)
            out.append(step(*args).clone())
            for k, k_before in zip(cache.k, k0):
                k.copy_(k_before)
    assert torch.isfinite(out[0]).all()
    for i, o in enumerate(out[1:], 1):
        assert torch.equal(out[0], o), f"run {i} differs from the plain ring"


@pytest.fixture(scope="module")
def fma_cubin() -> Path:
    """The FMA GEMV build (kernels.toml persistent_decode), built by the build gate."""
    from rowgate.cuda import cudabuild
    from rowgate_lab.ops.megakernel import KERNEL, REPO

    major, minor = torch.cuda.get_device_capability()
    return cudabuild.cubin(REPO, KERNEL, f"sm_{major}{minor}", os.environ.get("ROWGATE_NVCC"))


@pytest.mark.parametrize("kernel", ["default", "fma"])
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("batch", [1, 4, 8])
def test_silu_out_is_the_default_list_bit_for_bit(tiny, cubin, fma_cubin, kernel, schedule,
                                                  batch):
    # SILU_OUT: SiLU(gate) * up in the gate|up epilogue instead of every down tile's
    # prologue: the same dot products, the same roundings, so the same logits (and the
    # norms fused or staged alike); on the tensor-core build (the default here) and the FMA
    # (silu_out is the builder's default: False is the SILU_IN list)
    from rowgate_lab.megakernel.abi import Flag, Schedule
    from rowgate_lab.ops.megakernel import PersistentDecode

    path = cubin if kernel == "default" else fma_cubin
    model, cache, args = _prefilled(tiny, batch, 300)
    with torch.inference_mode():
        out = []
        for options in ({"silu_out": False}, {"silu_out": True},
                        {"silu_out": True, "fuse_norm": True}):
            k0 = [k.clone() for k in cache.k]
            step = PersistentDecode(model, cache, batch, Schedule.from_row(schedule), path,
                                    options=options)
            assert any(t.flags & Flag.SILU_OUT for t in step.plan.tasks) == options["silu_out"]
            out.append(step(*args).clone())
            for k, k_before in zip(cache.k, k0):
                k.copy_(k_before)
    assert torch.equal(out[0], out[1]) and torch.equal(out[0], out[2])


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("batch", [1, 4, 8])
def test_even_splits_are_their_unfused_list_bit_for_bit_and_the_eager_step(tiny, cubin,
                                                                            schedule, batch):
    # EVEN_SPLITS chunks the attention by the context, not the plan: another summation
    # order than the planned chunks, so its own family, whose fused lists (ROPE_IN, norms
    # fused or staged) must give its unfused list's logits bit for bit, append the same K,
    # and track the eager step like every list does
    from rowgate_lab.megakernel.abi import Flag, Schedule
    from rowgate_lab.ops.megakernel import PersistentDecode

    model, cache, args = _prefilled(tiny, batch, 37)
    k_before = [k.clone() for k in cache.k]
    with torch.inference_mode():
        out, appended = [], []
        for options in ({"fuse": False}, {}, {"fuse_norm": True}):
            step = PersistentDecode(model, cache, batch, Schedule.from_row(schedule), cubin,
                                    options={**options, "even_splits": True})
            assert all(t.flags & Flag.EVEN_SPLITS for t in step.plan.tasks
                       if t.label.startswith("L0.split"))
            out.append(step(*args).clone())
            appended.append([k.clone() for k in cache.k])
            for k, k0 in zip(cache.k, k_before):
                k.copy_(k0)
        want = model.decode(*args, cache)
    assert torch.equal(out[0], out[1]) and torch.equal(out[0], out[2])
    for ka, kb in zip(appended[0], appended[1]):
        assert torch.equal(ka, kb)
    for kp, ke in zip(appended[1], cache.k):
        torch.testing.assert_close(kp, ke, rtol=0.02, atol=0.02)
    torch.testing.assert_close(out[1], want, rtol=0.05, atol=0.25)
    assert out[1].argmax(-1).tolist() == want.argmax(-1).tolist()


@pytest.mark.parametrize("kv_splits", [1, 2])
@pytest.mark.parametrize("batch", [1, 8])
def test_fat_splits_are_their_unfused_list_bit_for_bit_and_the_eager_step(tiny, cubin, batch,
                                                                          kv_splits):
    # kv_splits caps a (sequence, kv head)'s split tasks: one or two fat tasks of
    # the whole context instead of a wave of thin ones; each cap its own summation order,
    # whose fused lists (merge staged or in o_proj's prologue) give its unfused list's
    # logits bit for bit and track the eager step. 300-token prompts: 38 tokens a warp at 1.
    from rowgate_lab.megakernel.abi import Opcode, Schedule
    from rowgate_lab.ops.megakernel import PersistentDecode

    model, cache, args = _prefilled(tiny, batch, 300)
    k_before = [k.clone() for k in cache.k]
    with torch.inference_mode():
        out = []
        for options in ({"fuse": False}, {"fuse_norm": True},
                        {"fuse_norm": True, "fuse_merge": True}):
            step = PersistentDecode(model, cache, batch, Schedule.DYNAMIC_QUEUE, cubin,
                                    options={**options, "kv_splits": kv_splits})
            splits = [t for t in step.plan.tasks if t.opcode == Opcode.ATTN_SPLIT]
            assert len(splits) == batch * kv_splits * model.cfg.num_layers * \
                model.cfg.num_kv_heads
            out.append(step(*args).clone())
            for k, k0 in zip(cache.k, k_before):
                k.copy_(k0)
        want = model.decode(*args, cache)
    assert torch.equal(out[0], out[1]) and torch.equal(out[0], out[2])
    torch.testing.assert_close(out[1], want, rtol=0.05, atol=0.25)
    assert out[1].argmax(-1).tolist() == want.argmax(-1).tolist()
