"""The reference engine on a GPU: CUDA eager and CUDA graph equal the CPU, token for token.

Self-contained fixtures (no conftest): it runs on a GPU host with `--noconftest`.
"""

from __future__ import annotations

import pytest

from rowgate.models.tiny import TinyModelSpec, build_tiny_model
from rowgate.rows.spec import Workload
from rowgate.rows.workload import build_passes

pytestmark = pytest.mark.gpu

WORKLOAD = Workload(input_lens=[16, 64], concurrency=[1, 4, 8], output_len=24,
                    requests_per_cell=8)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from rowgate.engines.reference import ReferenceEngine

    model = build_tiny_model(TinyModelSpec(), root=tmp_path_factory.mktemp("models"))
    passes = build_passes(WORKLOAD, model.vocab_size, model.special_ids)
    with ReferenceEngine(model.path) as cpu:
        expected = [cpu.generate(p) for p in passes]
    return model, passes, expected


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_cuda_equals_cpu(setup, mode):
    import torch

    from rowgate.engines.reference import ReferenceEngine

    model, passes, expected = setup
    with ReferenceEngine(model.path, device="cuda:0", mode=mode) as gpu:
        for _ in range(2):  # the second round replays captured graphs
            got = [gpu.generate(p) for p in passes]
            for g, e in zip(got, expected):
                assert [o.token_ids for o in g.outputs] == [o.token_ids for o in e.outputs]
                torch.testing.assert_close(
                    torch.tensor([o.logprobs for o in g.outputs]),
                    torch.tensor([o.logprobs for o in e.outputs]), rtol=0, atol=1e-3)
        assert gpu.describe()["mode"] == mode


def test_decode_attention_seam_on_cuda(setup):
    from rowgate.engines.qwen3 import torch_paged_decode_attention
    from rowgate.engines.reference import ReferenceEngine

    model, passes, expected = setup
    calls = []

    def counted(*args):
        calls.append(args[0].shape[0])
        return torch_paged_decode_attention(*args)

    with ReferenceEngine(model.path, device="cuda:0", decode_attention=counted) as gpu:
        got = gpu.generate(passes[2])
    assert [o.token_ids for o in got.outputs] == [o.token_ids for o in expected[2].outputs]
    assert max(calls) == 8  # batched decode at the pass's concurrency
