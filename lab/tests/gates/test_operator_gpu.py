"""The kernels themselves on a GPU (marker gpu; run through the device tool):
randomized pages, poison, both variants bitwise equal and within the fp64
reference. The full matrix is the operator gate (benchmarks/operator_gate.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.gpu

LAB = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cubin(tmp_path_factory) -> Path:
    import torch

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
    out = tmp_path_factory.mktemp("cubin") / "split_kv.cubin"
    subprocess.run([nvcc, "-cubin", f"-gencode=arch=compute_{arch[3:]},code={arch}", "-O3",
                    "-std=c++17", "-I", str(LAB / "kernels" / "include"), "-o", str(out),
                    str(LAB / "kernels" / "decode_attention" / "split_kv.cu")], check=True)
    return out


def _check(case, cubin, operator_name):
    import torch

    from rowgate.ops import operator_ab
    from rowgate.ops.sandboxed import InProcess
    from rowgate_lab.ops import split_kv as op

    operator = {"split_kv": op.SPLIT_KV, "split_kv_bulk": op.SPLIT_KV_BULK,
                "split_kv_deep": op.SPLIT_KV_DEEP}[operator_name]
    spec = SimpleNamespace(tolerance=SimpleNamespace(rtol=0.02, atol=0.02))
    rec = operator_ab.run_case(case, spec, cubin, torch.device("cuda:0"), order_flip=False,
                               operator=operator, child=InProcess())
    assert rec["bitwise"]["mismatches"] == 0, rec["bitwise"]
    for role, v in rec["variants"].items():
        assert v["unwritten"] == 0 and v["nan"] == 0 and v["failures"] == 0, (role, v)
        assert v["guard_writes"] == 0 and v["counters_nonzero"] == 0, (role, v)
    return rec


@pytest.mark.parametrize("operator_name", ["split_kv", "split_kv_bulk", "split_kv_deep"])
@pytest.mark.parametrize("kv", ["e5m2", "bf16"])
@pytest.mark.parametrize("heads,dim,page", [((32, 8), 128, 64), ((8, 1), 64, 16)])
@pytest.mark.parametrize("layout,context,batch", [("uniform", "1", 4), ("ragged", "page+1", 8),
                                                  ("ragged", "17.8K", 16)])
def test_variants_bitwise_equal_and_within_reference(cubin, operator_name, kv, heads, dim, page,
                                                     layout, context, batch):
    """split_kv (`_pipe`), split_kv_bulk (`_bulk`: 288 threads, `_bulkc` as a cluster of 8
    splits when a call has at most 8) and split_kv_deep (`_deep`, `_deepc` likewise with
    256 threads) against their baseline, one cubin."""
    import torch

    from rowgate.ops.cases import Case, context_tokens, seq_lengths

    if operator_name != "split_kv" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the bulk and deep candidates are sm_90+")
    tokens = context_tokens(context, page)
    case = Case(5, batch, layout, context, page, kv, heads[0], heads[1], dim,
                seq_lengths(layout, tokens, batch, 5))
    rec = _check(case, cubin, operator_name)
    cand = rec["variants"]["candidate"]
    if operator_name != "split_kv":
        assert cand["threads"] == (288 if operator_name == "split_kv_bulk" else 256), cand
        assert cand["launched"] == cand["entry"] + ("c" if cand["splits"] <= 8 else ""), cand
        assert cand["grid_x"] == (8 if cand["splits"] <= 8 else cand["splits"])


@pytest.mark.parametrize("operator_name", ["split_kv", "split_kv_bulk", "split_kv_deep"])
def test_bf16_gqa_groups_of_two(cubin, operator_name):
    """GQA 2 (16 query heads over 8 KV heads: the fused reference engine's shape), bf16
    only (kernels.toml: groups_by_kv_dtype)."""
    import torch

    from rowgate.ops.cases import Case, seq_lengths

    if operator_name != "split_kv" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the bulk and deep candidates are sm_90+")
    for batch, context in ((4, 1000), (1, 70)):
        case = Case(3, batch, "ragged" if batch > 1 else "uniform", str(context), 16, "bf16",
                    16, 8, 128, seq_lengths("ragged" if batch > 1 else "uniform", context,
                                            batch, 3))
        _check(case, cubin, operator_name)
