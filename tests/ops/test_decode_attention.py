"""The op's host side: roles and entry points, the contract's split plan, and every
argument checked before a launch (CPU tensors: the checks are device-agnostic)."""

from __future__ import annotations

import pytest
import torch

from pipeline.ops import arguments, contract
from pipeline.ops import decode_attention as op
from pipeline.ops.contract import PORTABLE_DYNAMIC_SMEM, ContractError
from pipeline.ops.paged_inputs import Case, make_inputs, seq_lengths

SPLIT_KV = op.SPLIT_KV


def test_roles_map_to_the_operators_entry_points():
    assert SPLIT_KV.entries("e5m2", 128, 4) == {"baseline": "split_kv_e5m2_d128_g4_base",
                                                "candidate": "split_kv_e5m2_d128_g4_pipe"}
    assert op.role_of("e5m2_pipelined") == "candidate" and op.role_of("baseline") == "baseline"
    with pytest.raises(ValueError, match="variant: expected one of"):
        op.role_of("e5m2_fast")
    assert len(SPLIT_KV.all_entries()) == 16


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


def test_a_plan_rechecks_contents_it_has_not_validated():
    inp = _inputs([5, 9])
    checked = arguments.Checked(inp.block_table, inp.seq_lens)
    assert checked.same(inp.block_table, inp.seq_lens)
    inp.seq_lens[1] = 70                  # in place: the version counter moves
    assert not checked.same(inp.block_table, inp.seq_lens)
    assert not arguments.Checked(inp.block_table, inp.seq_lens.clone()).same(
        inp.block_table, inp.seq_lens)


def test_gpu_launcher_refuses_cpu_tensors():
    inp = _inputs(seq_lengths("uniform", 9, 2, 0))
    with pytest.raises(ValueError, match="^q: expected a CUDA tensor, got cpu"):
        op.DecodeAttention(inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens,
                           max_seq_len=9, cubin=None)
    assert torch.equal(inp.seq_lens, torch.tensor([9, 9], dtype=torch.int32))
