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

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cubin(tmp_path_factory) -> Path:
    import torch

    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
    out = tmp_path_factory.mktemp("cubin") / "split_kv.cubin"
    subprocess.run([nvcc, "-cubin", f"-gencode=arch=compute_{arch[3:]},code={arch}", "-O3",
                    "-std=c++17", "-I", str(REPO / "kernels" / "include"), "-o", str(out),
                    str(REPO / "kernels" / "decode_attention" / "split_kv.cu")], check=True)
    return out


@pytest.mark.parametrize("kv", ["e5m2", "bf16"])
@pytest.mark.parametrize("heads,dim,page", [((32, 8), 128, 64), ((8, 1), 64, 16)])
@pytest.mark.parametrize("layout,context,batch", [("uniform", "1", 4), ("ragged", "page+1", 8),
                                                  ("ragged", "17.8K", 16)])
def test_variants_bitwise_equal_and_within_reference(cubin, kv, heads, dim, page, layout,
                                                     context, batch):
    import torch

    from pipeline.ops import operator_ab
    from pipeline.ops.paged_inputs import Case, context_tokens, seq_lengths

    spec = SimpleNamespace(baseline=f"{kv}_baseline", candidate=f"{kv}_pipelined",
                           tolerance=SimpleNamespace(rtol=0.02, atol=0.02))
    tokens = context_tokens(context, page)
    case = Case(5, batch, layout, context, page, kv, heads[0], heads[1], dim,
                seq_lengths(layout, tokens, batch, 5))
    rec = operator_ab.run_case(case, spec, cubin, torch.device("cuda:0"), order_flip=False)
    assert rec["bitwise"]["mismatches"] == 0, rec["bitwise"]
    for role, v in rec["variants"].items():
        assert v["unwritten"] == 0 and v["nan"] == 0 and v["failures"] == 0, (role, v)
        assert v["guard_writes"] == 0 and v["counters_nonzero"] == 0, (role, v)
