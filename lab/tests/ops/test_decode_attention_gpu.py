"""The launcher on a GPU (marker gpu; run through the device tool): shared memory at
exactly 48 KiB launches, lengths beyond what was planned are refused before any
launch, graph capture refuses contents it cannot check."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
SPEC = SimpleNamespace(tolerance=SimpleNamespace(rtol=0.02, atol=0.02))


@pytest.fixture(scope="module")
def cubin() -> Path:
    """split_kv for this GPU, built by rowgate's recipe (the device's nvcc)."""
    import torch

    from rowgate.cuda import cudabuild

    arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
    return cudabuild.cubin(REPO, "split_kv", arch,
                           os.environ.get("ROWGATE_NVCC") or shutil.which("nvcc"))


@pytest.mark.parametrize("page,dim,hq,hkv", [(512, 128, 32, 4), (1024, 64, 16, 2)])
def test_pipelined_e5m2_launches_with_exactly_48_kib_of_dynamic_shared_memory(
        cubin, page, dim, hq, hkv):
    import torch

    from rowgate.ops import operator_ab
    from rowgate.ops.cases import Case, seq_lengths
    from rowgate.ops.sandboxed import InProcess
    from rowgate_lab.ops.split_kv import SPLIT_KV

    case = Case(3, 4, "ragged", "page+1", page, "e5m2", hq, hkv, dim,
                seq_lengths("ragged", page + 1, 4, 3))
    rec = operator_ab.run_case(case, SPEC, cubin, torch.device("cuda:0"), order_flip=False,
                               operator=SPLIT_KV, child=InProcess())
    cand = rec["variants"]["candidate"]
    assert cand["entry"].endswith("_pipe") and cand["chunk"] == page and cand["splits"] == 2
    assert rec["bitwise"]["mismatches"] == 0, rec["bitwise"]
    for role, v in rec["variants"].items():
        assert (v["failures"], v["nan"], v["unwritten"], v["guard_writes"],
                v["counters_nonzero"]) == (0, 0, 0, 0, 0), (role, v)


def _inputs(lens):
    import torch

    from rowgate.ops.cases import Case
    from rowgate.ops.paged_inputs import make_inputs

    return make_inputs(Case(1, len(lens), "ragged", str(max(lens)), 16, "e5m2", 32, 8, 128,
                            list(lens)), torch.device("cuda:0"))


def test_a_length_beyond_the_plan_is_refused_before_launching(cubin):
    import torch

    from rowgate.ops.paged_inputs import poisoned_output, unwritten
    from rowgate_lab.ops import split_kv as op

    inp = _inputs([100, 37, 64, 1])
    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    with pytest.raises(ValueError, match=r"^seq_lens: expected every length in 1\.\.99"):
        op.DecodeAttention(*args, max_seq_len=99, cubin=cubin)
    planned = op.DecodeAttention(*args, max_seq_len=100, cubin=cubin, k_scale=inp.k_scale,
                                 v_scale=inp.v_scale)
    out = poisoned_output(inp.q)
    inp.seq_lens[1] = 101                 # in place, after planning
    with pytest.raises(ValueError, match="got 101 at index 1"):
        planned.run(*args, out=out)
    torch.cuda.synchronize()
    assert unwritten(out) == out.numel()  # nothing was launched
    inp.seq_lens[1] = 37
    planned.run(*args, out=out)
    torch.cuda.synchronize()
    assert unwritten(out) == 0


# the refused run records nothing, so torch warns on leaving the capture that the graph
# is empty: expected here, and an error under the suite's warnings-as-errors otherwise
@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty:UserWarning")
def test_graph_capture_refuses_tensors_the_plan_has_not_validated(cubin):
    import torch

    from rowgate_lab.ops import split_kv as op

    inp = _inputs([40, 17])
    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    planned = op.DecodeAttention(*args, max_seq_len=40, cubin=cubin)
    other = inp.seq_lens.clone()
    out = torch.empty_like(inp.q)
    planned.run(*args, out=out)           # warm up outside the capture
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="cannot be read during CUDA-graph capture"):
        with torch.cuda.graph(graph, stream=stream):
            planned.run(inp.q, inp.k_cache, inp.v_cache, inp.block_table, other, out=out)
    planned.admit(inp.block_table, other)
    with torch.cuda.graph(torch.cuda.CUDAGraph(), stream=stream):
        planned.run(inp.q, inp.k_cache, inp.v_cache, inp.block_table, other, out=out)


def test_plans_of_one_cubin_with_other_chunks_each_launch(cubin):
    """Plans of one cubin share its functions, and the dynamic shared memory attribute is
    the function's: a later plan with a smaller chunk must not lower it under an earlier
    plan's bytes (that launch failed with CUDA_ERROR_INVALID_VALUE on the device,
    2026-12-05). The earlier plan's output is bitwise what it was before."""
    import torch

    from rowgate_lab.ops import split_kv as op

    inp = _inputs([4096, 3000])
    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    # the pipelined candidate: its shared memory grows with the chunk
    scales = {"k_scale": inp.k_scale, "v_scale": inp.v_scale, "variant": "candidate"}
    wide = op.DecodeAttention(*args, max_seq_len=4096, cubin=cubin, chunk=512, **scales)
    before = wide.run(*args).clone()
    narrow = op.DecodeAttention(*args, max_seq_len=4096, cubin=cubin, chunk=128, **scales)
    assert narrow.kernel == wide.kernel and narrow.launcher.smem < wide.launcher.smem
    small = narrow.run(*args)
    after = wide.run(*args)
    torch.cuda.synchronize()
    assert torch.equal(before, after)
    torch.testing.assert_close(small.float(), after.float(), rtol=0.02, atol=0.02)
