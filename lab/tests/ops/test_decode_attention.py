"""The op's host side: roles and entry points, the contract's split plan, and every
argument checked before a launch (CPU tensors: the checks are device-agnostic)."""

from __future__ import annotations

import pytest
import torch

from rowgate.ops import contract
from rowgate.ops import launch_args as arguments
from rowgate.ops.cases import Case, cases, seq_lengths
from rowgate.ops.contract import PORTABLE_DYNAMIC_SMEM, ContractError
from rowgate.ops.paged_inputs import make_inputs
from rowgate_lab.ops import split_kv as op

SPLIT_KV = op.SPLIT_KV


def test_roles_map_to_the_operators_entry_points():
    assert SPLIT_KV.entries("e5m2", 128, 4) == {"baseline": "split_kv_e5m2_d128_g4_base",
                                                "candidate": "split_kv_e5m2_d128_g4_pipe"}
    assert op.role_of("e5m2_pipelined") == "candidate" and op.role_of("baseline") == "baseline"
    with pytest.raises(ValueError, match="variant: expected one of"):
        op.role_of("e5m2_fast")
    # e5m2 and bf16 x D64/128 x G4/8, and bf16 GQA 2 (groups_by_kv_dtype)
    assert len(SPLIT_KV.all_entries()) == 20
    assert "split_kv_bf16_d64_g2_pipe" in SPLIT_KV.all_entries()
    assert "split_kv_e5m2_d64_g2_base" not in SPLIT_KV.all_entries()


def _bulk_cfg(kv, dim, group):
    """The kernel's BulkCfg (kernels/decode_attention/split_kv.cu), line for line:
    (slot bytes, K slots, V slots). kernels.toml's split_kv_bulk shared-memory rules
    must give 256 B of mbarriers + both rings + the chunk's scores."""
    slot = 64 * dim * (1 if kv == "e5m2" else 2)
    scores = 512 * group * 4
    regs3 = not (dim == 128 and (kv == "bf16" or group == 8))
    three = regs3 and (72 * 1024 - scores) // slot >= 4
    slots = ((72 if three else 110) * 1024 - scores) // slot // 2 * 2
    nk = min(8, (slots + 2) // 4 * 2)
    return slot, nk, min(8, slots - nk)


def test_bulk_operator_launch_rules_and_shared_memory():
    """split_kv_bulk: `_bulk` against `_base`, 288 threads, `_bulkc` as one cluster of 8
    splits when a call has at most 8; its rings (opt-in, past 48 KiB) never shrink
    the chunk, so the plan is the baseline's."""
    bulk = op.SPLIT_KV_BULK
    for kv, dim, group, roles in _shapes(bulk, "bulk"):
        slot, nk, nv = _bulk_cfg(kv, dim, group)
        for entry in (roles["candidate"], roles["candidate"] + "c"):
            assert bulk.smem(entry, 448, group, dim) == 256 + (nk + nv) * slot + 448 * group * 4
            assert not bulk.bounds_chunk(entry)
        assert bulk.bounds_chunk(roles["baseline"])
        assert bulk.geometry(roles["baseline"], 3) == contract.Geometry(roles["baseline"], 3, 256, 0)
        assert bulk.geometry(roles["candidate"], 8) == contract.Geometry(
            roles["candidate"] + "c", 8, 288, 8)
        assert bulk.geometry(roles["candidate"], 9) == contract.Geometry(
            roles["candidate"], 9, 288, 0)
    entries = list(bulk.entries("e5m2", 128, 8).values())
    p = _plan_is_the_baselines(bulk, entries, 8, ((16384, 16, 1), (1024, 1, 8)))
    assert (p.chunk, p.splits) == (128, 8)           # B1 x 1K: the cluster entry point
    assert bulk.geometry(entries[1], p.splits).entry == "split_kv_e5m2_d128_g8_bulkc"


def _shapes(operator, suffix):
    """An sm_90+ operator's 10 shapes (E5M2 and bf16 x D64/D128 x its groups) with their
    roles: `_{suffix}` against `_base`, 30 entry points with the cluster ones."""
    assert operator.kernel == f"split_kv_{suffix}" and len(operator.all_entries()) == 30
    shapes = [(kv, d, g) for kv in operator.kv_dtypes for d in operator.head_dims
              for g in operator.groups_for(kv)]
    assert len(shapes) == 10
    for kv, dim, group in shapes:
        roles = operator.entries(kv, dim, group)
        assert roles["candidate"].endswith(f"_{suffix}") and roles["baseline"].endswith("_base")
        yield kv, dim, group, roles


def _plan_is_the_baselines(operator, entries, group, calls):
    """The plan of both roles of each (length, batch, KV heads) call (D128, page 64) is the
    baseline's own (the candidate's opt-in shared memory never shrinks the chunk): the
    last call's."""
    for length, batch, hkv in calls:
        p = contract.plan(operator, entries, batch=batch, kv_heads=hkv, group=group, dim=128,
                          page=64, max_seq_len=length, sm_count=132)
        base = contract.plan(operator, entries[:1], batch=batch, kv_heads=hkv, group=group,
                             dim=128, page=64, max_seq_len=length, sm_count=132)
        assert (p.chunk, p.splits) == (base.chunk, base.splits)
    return p


def test_deep_operator_launch_rules_and_shared_memory():
    """split_kv_deep: `_deep` against `_base` with the baseline's 256 threads, `_deepc` as
    one cluster of 8 splits when a call has at most 8; its shared memory (opt-in) never
    shrinks the chunk, which goes up to 1024 (split_kv's: 512), so a large call's plan is
    its own and a small call's split_kv's. lab/benchmarks/decode_attention.py's mirror of the
    kernel's DeepCfg gives kernels.toml's sizes."""
    bench = _benchmark()
    deep = op.SPLIT_KV_DEEP
    for kv, dim, group, roles in _shapes(deep, "deep"):
        ring = bench.deep_ring_bytes(kv, dim, group=group)
        assert ring >= 32 * group * dim  # the cross-warp reduction reuses the ring
        for chunk in (64, 128, 448, 512, 1024):
            assert deep.smem(roles["candidate"], chunk, group, dim) == ring + chunk * group * 4
            assert deep.smem(roles["candidate"] + "c", chunk, group, dim) == \
                ring + chunk * group * 4 + bench.deep_landing_bytes(dim, group)
        for entry in (roles["candidate"], roles["candidate"] + "c"):
            assert not deep.bounds_chunk(entry)
        # three CTAs of the E5M2 D128 G4 shape fit an SM's 228 KiB (1 KiB reserved each)
        if (kv, dim, group) == ("e5m2", 128, 4):
            assert 3 * (deep.smem(roles["candidate"], 1024, group, dim) + 1024) <= 228 * 1024
        assert deep.geometry(roles["candidate"], 8) == contract.Geometry(
            roles["candidate"] + "c", 8, 256, 8)
        assert deep.geometry(roles["candidate"], 9) == contract.Geometry(
            roles["candidate"], 9, 256, 0)
    entries = list(deep.entries("e5m2", 128, 4).values())
    assert deep.max_chunk == 1024 and op.SPLIT_KV.max_chunk == 512
    for call, want in (((16384, 16, 8), (1024, 16)), ((1024, 1, 8), (128, 8))):
        p = _plan_is_the_baselines(deep, entries, 4, (call,))
        assert (p.chunk, p.splits) == want
    assert bench.deep_stages("e5m2", 128, 4) == 3 and bench.deep_stages("e5m2", 128, 8) == 2
    assert bench.deep_stages("bf16", 128, 4) == 2 and bench.deep_stages("e5m2", 64, 4) == 2


def _benchmark(name: str = "decode_attention"):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_variant_names_pick_rowgates_operator():
    assert op.operator_of("bulk", SPLIT_KV) is op.SPLIT_KV_BULK
    assert op.operator_of("e5m2_deep", SPLIT_KV) is op.SPLIT_KV_DEEP
    assert op.role_of("bf16_deep") == "candidate"
    assert op.operator_of("bf16_bulk", SPLIT_KV) is op.SPLIT_KV_BULK
    assert op.operator_of("e5m2_pipelined", SPLIT_KV) is SPLIT_KV
    other = contract.Operator.from_table("x", {
        "kernel": "k", "baseline": "b", "candidates": ["c"], "kv_dtypes": ["bf16"],
        "head_dims": [64], "groups": [1], "page_sizes": [16]})
    assert op.operator_of("bulk", other) is other and op.role_of("e5m2_bulk") == "candidate"


def test_a_cluster_entry_point_compiled_without_its_cluster_is_refused():
    op.check_cluster("k_bulkc", 8, 8)
    with pytest.raises(ValueError, match=r"^k_bulkc: declared as a cluster of 8 splits, "
                                         r"compiled with a required cluster width of 0"):
        op.check_cluster("k_bulkc", 8, 0)


def _plan(batch, length, page, group, dim, kv="e5m2", hkv=8):
    entries = list(SPLIT_KV.entries(kv, dim, group).values())
    return contract.plan(SPLIT_KV, entries, batch=batch, kv_heads=hkv, group=group, dim=dim,
                         page=page, max_seq_len=length, sm_count=132), entries


@pytest.mark.parametrize("batch,length,page", [(1, 1, 16), (1, 1024, 64), (4, 17, 16),
                                               (16, 16384, 64), (16, 18227, 16)])
@pytest.mark.parametrize("group,dim", [(4, 128), (8, 128), (4, 64), (8, 64)])
def test_plan_covers_every_token_and_fits_shared_memory(batch, length, page, group, dim):
    p, entries = _plan(batch, length, page, group, dim, hkv=8 // (group // 4))
    assert p.chunk % 64 == 0 and p.chunk % page == 0
    assert p.splits * p.chunk >= length > (p.splits - 1) * p.chunk
    assert all(p.smem[e] <= PORTABLE_DYNAMIC_SMEM for e in entries)
    # the chunk fixes the merge order: both roles share it (one plan for both)
    assert set(p.smem) == set(entries)


def test_plan_of_the_old_formula():
    """The contract's rule reproduces the plan split_kv was tuned with: B16 x 16K,
    GQA 32/8, D128, page 64 on 132 SMs -> 512-token chunks, 32 splits."""
    p, entries = _plan(16, 16384, 64, 4, 128)
    assert (p.chunk, p.splits) == (512, 32)
    assert p.smem == {entries[0]: 16384, entries[1]: 512 * 4 * 4 + 256 * 128}


@pytest.mark.parametrize("page,dim,hq,hkv", [(512, 128, 32, 4), (1024, 64, 16, 2)])
def test_shapes_whose_pipelined_e5m2_kernel_needs_exactly_48_kib(page, dim, hq, hkv):
    """One unit is the smallest chunk: the candidate's ring puts it at exactly 48 KiB of
    dynamic shared memory, over the default limit once static memory is added. The
    launcher sets the attribute for every planned size (the launch: test_operator_gpu)."""
    p, entries = _plan(4, page, page, hq // hkv, dim, hkv=hkv)
    assert p.chunk == page and p.smem[entries[1]] == 48 * 1024
    op.check_shared_memory(entries[1], p.smem[entries[1]], 80, 227 * 1024)  # H200 opt-in
    with pytest.raises(ValueError, match=r"dynamic shared memory 49152 B \+ static 80 B "
                                         r"exceeds the device's 49152 B per block"):
        op.check_shared_memory(entries[1], p.smem[entries[1]], 80, 48 * 1024)


def test_one_split_plan_covers_the_sequence():
    one = contract.Operator.from_table("x", {
        "kernel": "k", "baseline": "b_{kv_dtype}_{head_dim}_{group}", "candidates": ["c"],
        "kv_dtypes": ["bf16"], "head_dims": [64], "groups": [1], "page_sizes": [16],
        "threads": 128, "split_kv": False})
    p = contract.plan(one, ["b"], batch=4, kv_heads=2, group=1, dim=64, page=16,
                      max_seq_len=1000, sm_count=132)
    assert (p.chunk, p.splits, p.smem) == (1024, 1, {"b": 0})


def test_declarations_outside_the_contract_are_refused_with_one_line():
    base = {"kernel": "k", "baseline": "b", "candidates": ["c"], "kv_dtypes": ["e5m2"],
            "head_dims": [64], "groups": [4], "page_sizes": [16]}
    for key, value, message in (("head_dims", [96, 72], "head_dims: expected multiples of 16"),
                                ("page_sizes", [24], "page_sizes: expected powers of two"),
                                ("kv_dtypes", ["fp8"], "kv_dtypes: expected some of"),
                                ("threads", 100, "threads: expected a multiple of 32"),
                                ("contract", "paged-decode-attention/2", "this rowgate implements"),
                                ("groups_by_kv_dtype", {"bf16": [2]}, "bf16 not in kv_dtypes"),
                                ("groups_by_kv_dtype", {"e5m2": [0]}, "groups_by_kv_dtype.e5m2: "
                                                                     "expected values in 1..16"),
                                ("launch", [{"cluster_splits": 16, "cluster_entry": "{entry}c"}],
                                 "launch.cluster_splits: expected 0..8"),
                                ("launch", [{"cluster_splits": 8}], "expected both or neither"),
                                ("launch", [{"threads": 300}], "launch.threads: expected a multiple"),
                                ("colour", "red", "unexpected keyword argument 'colour'")):
        with pytest.raises(ContractError, match=f"^operators.x: .*{message}"):
            contract.Operator.from_table("x", {**base, key: value})
    with pytest.raises(ContractError, match="declares 2 candidates .* the row must name one"):
        contract.Operator.from_table("x", {**base, "candidates": ["c", "d"]}).entries("e5m2", 64, 4)


def _inputs(lens, page=16, kv="e5m2", hq=8, hkv=2, dim=64):
    return make_inputs(Case(0, len(lens), "ragged", str(max(lens)), page, kv, hq, hkv, dim,
                            list(lens)))


def _validate(inp, max_seq_len, **kw):
    scales = {"k_scale": inp.k_scale, "v_scale": inp.v_scale, **kw}
    return arguments.validate(SPLIT_KV, inp.q, inp.k_cache, inp.v_cache, inp.block_table,
                              inp.seq_lens, max_seq_len=max_seq_len, **scales)


def test_valid_arguments_give_the_shape():
    inp = _inputs([5, 40, 33, 17])
    shape = _validate(inp, 40)
    assert (shape.batch, shape.hq, shape.hkv, shape.group, shape.dim, shape.page) == (
        4, 8, 2, 4, 64, 16)
    assert shape.capacity == inp.block_table.shape[1] * 16 == 48


def test_a_length_beyond_max_seq_len_is_refused_not_truncated():
    inp = _inputs([5, 40, 33, 17])
    with pytest.raises(ValueError, match=r"^seq_lens: expected every length in 1\.\.33 "
                                         r"\(max_seq_len\), got 40 at index 1 \(1 out of range\)"):
        _validate(inp, 33)
    inp.seq_lens[2] = 0
    with pytest.raises(ValueError, match="got 0 at index 2"):
        _validate(inp, 40)


def test_max_seq_len_beyond_the_block_tables_capacity_is_refused():
    inp = _inputs([5, 40, 33, 17])       # 3 columns of 16-token pages: 48 tokens
    with pytest.raises(ValueError, match=r"^max_seq_len: expected 1\.\.48 \(block_table "
                                         r"columns 3 x page size 16\), got 49"):
        _validate(inp, 49)
    inp.seq_lens[0] = 48                  # a full table is fine, one more token is not
    _validate(inp, 48)


def test_a_page_outside_the_cache_is_refused_only_where_a_sequence_uses_it():
    inp = _inputs([5, 40, 33, 17])
    pages = inp.k_cache.shape[0]
    inp.block_table[0, 2] = pages + 7     # sequence 0 uses one page: column 2 is padding
    _validate(inp, 40)
    inp.block_table[3, 1] = pages         # sequence 3 (17 tokens) uses two
    with pytest.raises(ValueError, match=rf"^block_table: expected pages in 0\.\.{pages - 1} "
                                         rf"for the 2 page\(s\) sequence 3 uses, got {pages} "
                                         rf"at \[3, 1\]"):
        _validate(inp, 40)
    inp.block_table[3, 1] = -1
    with pytest.raises(ValueError, match="got -1 at"):
        _validate(inp, 40)


def test_tensor_and_shape_checks_name_the_argument():
    inp = _inputs([5, 9])
    with pytest.raises(ValueError, match="^q: expected a torch.Tensor, got list"):
        arguments.check_shapes([], inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    with pytest.raises(ValueError, match="^seq_lens: expected dtype torch.int32, got torch.int64"):
        arguments.check_shapes(inp.q, inp.k_cache, inp.v_cache, inp.block_table,
                               inp.seq_lens.long())
    with pytest.raises(ValueError, match="^v_cache: expected shape"):
        arguments.check_shapes(inp.q, inp.k_cache, inp.v_cache[:1], inp.block_table, inp.seq_lens)
    with pytest.raises(ValueError, match="^block_table: expected a contiguous tensor"):
        arguments.check_shapes(inp.q, inp.k_cache, inp.v_cache,
                               inp.block_table.repeat(1, 2)[:, ::2], inp.seq_lens)
    with pytest.raises(ValueError, match="^k_scale: expected a finite number > 0, got nan"):
        _validate(inp, 9, k_scale=float("nan"))
    with pytest.raises(ValueError, match="^v_scale: expected a finite number > 0, got -1.0"):
        _validate(inp, 9, v_scale=-1.0)


def test_a_shape_the_operator_does_not_declare_is_refused():
    inp = _inputs([5, 9], hq=2, hkv=2)   # group 1: split_kv declares 4 and 8
    with pytest.raises(ContractError, match="^k_cache/q: operator split_kv declares no group 1 "
                                            r"\(groups: 4, 8\)"):
        _validate(inp, 9)
    inp = _inputs([5, 9], hq=4, hkv=2)   # GQA 2: bf16 only
    with pytest.raises(ContractError, match=r"declares no group 2 \(groups: 4, 8\)"):
        _validate(inp, 9)
    assert _validate(_inputs([5, 9], kv="bf16", hq=4, hkv=2), 9).group == 2
    inp = _inputs([5, 9], kv="bf16", hq=2, hkv=2)
    with pytest.raises(ContractError, match=r"declares no group 1 for bf16 \(groups: 2, 4, 8\)"):
        _validate(inp, 9)


def test_a_plan_rechecks_contents_it_has_not_validated():
    inp = _inputs([5, 9])
    checked = arguments.Checked(inp.block_table, inp.seq_lens)
    assert checked.same(inp.block_table, inp.seq_lens)
    inp.seq_lens[1] = 70                  # in place: the version counter moves
    assert not checked.same(inp.block_table, inp.seq_lens)
    assert not arguments.Checked(inp.block_table, inp.seq_lens.clone()).same(
        inp.block_table, inp.seq_lens)


def test_inference_tensors_are_rechecked_outside_capture():
    # made under inference_mode they keep no version counter (reading it raises): a plan
    # made there must not fail, and must not trust them again unseen (the graph-fused
    # engine's plans are made under inference_mode on the H200: docs/perf.md)
    with torch.inference_mode():
        inp = _inputs([5, 9])
        checked = arguments.Checked(inp.block_table, inp.seq_lens)
        assert not checked.same(inp.block_table, inp.seq_lens)
    plain = _inputs([5, 9])
    assert arguments.Checked(plain.block_table, plain.seq_lens).same(plain.block_table,
                                                                     plain.seq_lens)


def test_gpu_launcher_refuses_cpu_tensors():
    inp = _inputs(seq_lengths("uniform", 9, 2, 0))
    with pytest.raises(ValueError, match="^q: expected a CUDA tensor, got cpu"):
        op.DecodeAttention(inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens,
                           max_seq_len=9, cubin=None)
    assert torch.equal(inp.seq_lens, torch.tensor([9, 9], dtype=torch.int32))


def test_the_benchmarks_operator_sections_are_expressible():
    """lab/benchmarks/decode_attention.py's operator sections as a device call runs them
    (`--candidate e5m2_bulk` or `e5m2_deep`: split_kv_bulk or split_kv_deep on
    e5m2, bf16 and bf16 GQA 2) and as they run by default (split_kv): every case declared
    by the operator picked."""
    from pathlib import Path

    from rowgate.ops import operator_ab

    bench = _benchmark()
    row = Path(__file__).resolve().parents[3] / "rows" / "SM70-XQA-E5M2-DECODE.toml"
    for cand, want in (("e5m2_bulk", "split_kv_bulk"), ("e5m2_deep", "split_kv_deep"),
                       ("", "split_kv")):
        c = {"candidate": cand} if cand else {}
        c16 = {"candidate": "bf16_" + cand.rsplit("_", 1)[-1]} if cand else {}
        specs = [bench.operator_spec(row, **c),
                 bench.operator_spec(row, kv_dtypes=["bf16"], batches=[1, 4, 16], **c16),
                 bench.operator_spec(row, kv_dtypes=["bf16"], heads=[[16, 8]], page_sizes=[16],
                                     **(c16 or {"candidate": "bf16_pipelined"}))]
        for s in specs:
            operator = op.operator_of(getattr(s, "candidate", "") or "candidate", SPLIT_KV)
            assert operator.name == want
            operator_ab.check_expressible(operator, cases(s))
            assert operator_ab.timing_cases(s, operator)
