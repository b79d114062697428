"""kernels/decode_attention/decode_attention.cu on a GPU against an fp64 reference:
GQA, bf16 and FP8-E5M2 KV with scales, randomized page tables, ragged lengths with
the page boundaries (page-1, page, page+1) and an empty sequence.

The cubin is the build gate's own (rowgate.cuda.cudabuild, wheel toolchain, the GPU's
arch, or the nvcc ROWGATE_NVCC names on a device machine without the wheels);
ROWGATE_DECODE_CUBIN=path uses a cubin built elsewhere instead (a device
machine without this package's dependencies runs this file alone, --noconftest).
Launch goes through cuda.core on torch's current stream.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
WARPS = 4
PAGE = 16


def _cuda_core():
    try:
        import cuda.core as cc
        cc.launch  # noqa: B018 - older releases expose the API only under .experimental
    except (ImportError, AttributeError):
        import cuda.core.experimental as cc
    return cc


@pytest.fixture(scope="module")
def module():
    cc = _cuda_core()
    dev = cc.Device()
    dev.set_current()
    path = os.environ.get("ROWGATE_DECODE_CUBIN")
    if not path:
        from rowgate.cuda import cudabuild

        major, minor = torch.cuda.get_device_capability()
        path = str(cudabuild.cubin(REPO, "decode_attention", f"sm_{major}{minor}",
                                   os.environ.get("ROWGATE_NVCC")))
    data = Path(path).read_bytes()
    code = cc.ObjectCode.from_cubin(data) if hasattr(cc.ObjectCode, "from_cubin") \
        else cc.ObjectCode(data, "cubin")
    return cc, dev, code


def _bf16_bits(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).view(torch.int16)


def _e5m2_bytes(gen: torch.Generator, shape) -> torch.Tensor:
    """Random E5M2 bytes, finite (exponent < 31), magnitudes up to 2^3."""
    sign = torch.randint(0, 2, shape, generator=gen) << 7
    exp = torch.randint(10, 19, shape, generator=gen) << 2
    man = torch.randint(0, 4, shape, generator=gen)
    return (sign | exp | man).to(torch.uint8)


def _e5m2_value(b: torch.Tensor) -> torch.Tensor:
    # E5M2 is the high byte of an fp16: exact.
    half = (b.numpy().astype(np.uint16) << 8).view(np.float16)
    return torch.from_numpy(half.astype(np.float64))


def _reference(q, k, v, table, lens, kv_heads, scale):
    """fp64 attention of each sequence's query over its pages."""
    batch, heads, dim = q.shape
    out = torch.zeros(batch, heads, dim, dtype=torch.float64)
    group = heads // kv_heads
    for b in range(batch):
        n = int(lens[b])
        if n == 0:
            continue
        tok = torch.arange(n)
        pages = table[b, tok // PAGE].long()
        keys = k[pages, tok % PAGE]  # [n, kv_heads, dim]
        vals = v[pages, tok % PAGE]
        for h in range(heads):
            s = keys[:, h // group] @ q[b, h] * scale
            p = torch.softmax(s, dim=0)
            out[b, h] = p @ vals[:, h // group]
    return out


@pytest.mark.parametrize("kv", ["bf16", "e5m2"])
@pytest.mark.parametrize("dim", [64, 128])
def test_matches_fp64_reference(module, kv, dim):
    cc, dev, code = module
    gen = torch.Generator().manual_seed(dim * 7 + (kv == "e5m2"))
    heads, kv_heads = 8, 2
    lens = torch.tensor([1, PAGE - 1, PAGE, PAGE + 1, 0, 300, 1037], dtype=torch.int32)
    batch = len(lens)
    max_pages = int((lens.max() + PAGE - 1) // PAGE)
    num_pages = batch * max_pages + 5
    # Every sequence gets distinct pages, scattered over the pool.
    table = torch.randperm(num_pages, generator=gen)[: batch * max_pages].view(batch, max_pages)
    table = table.to(torch.int32)
    q64 = torch.randn(batch, heads, dim, generator=gen, dtype=torch.float64)
    q_bits = _bf16_bits(q64)
    q_ref = q_bits.view(torch.bfloat16).to(torch.float64)
    shape = (num_pages, PAGE, kv_heads, dim)
    if kv == "bf16":
        k_store = _bf16_bits(torch.randn(shape, generator=gen, dtype=torch.float64))
        v_store = _bf16_bits(torch.randn(shape, generator=gen, dtype=torch.float64))
        k_ref = k_store.view(torch.bfloat16).to(torch.float64)
        v_ref = v_store.view(torch.bfloat16).to(torch.float64)
        k_scale = v_scale = 1.0
    else:
        k_store, v_store = _e5m2_bytes(gen, shape), _e5m2_bytes(gen, shape)
        k_scale, v_scale = 0.125, 0.5
        k_ref, v_ref = _e5m2_value(k_store) * k_scale, _e5m2_value(v_store) * v_scale
    scale = dim ** -0.5
    want = _reference(q_ref, k_ref, v_ref, table, lens, kv_heads, scale)

    cuda = torch.device("cuda")
    q_d, k_d, v_d = q_bits.to(cuda), k_store.to(cuda), v_store.to(cuda)
    table_d, lens_d = table.to(cuda), lens.to(cuda)
    out_d = torch.full((batch, heads, dim), -1, dtype=torch.int16, device=cuda)  # poisoned
    fn = code.get_kernel(f"decode_attention_{kv}_hd{dim}")
    stream = dev.create_stream()
    cc.launch(stream, cc.LaunchConfig(grid=(heads, batch), block=WARPS * 32), fn,
              out_d.data_ptr(), q_d.data_ptr(), k_d.data_ptr(), v_d.data_ptr(),
              table_d.data_ptr(), lens_d.data_ptr(), np.int32(heads), np.int32(kv_heads),
              np.int32(PAGE), np.int32(max_pages), np.float32(scale), np.float32(k_scale),
              np.float32(v_scale))
    stream.sync()
    got = out_d.cpu().view(torch.bfloat16).to(torch.float64)
    assert torch.equal(got[4], torch.zeros_like(got[4]))  # the empty sequence
    # bf16 output (8 bits of mantissa) over fp32 accumulation with exp2 approximations.
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
