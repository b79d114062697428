"""Unsupported shapes leave the persistent path for CUDA graph, then eager, saying why."""

from __future__ import annotations

import dataclasses

import pytest

from rowgate_lab.megakernel import fallback
from rowgate_lab.megakernel.builder import ModelDims

PROBE = ModelDims(vocab=32768, hidden=2048, intermediate=6144, layers=16, heads=16, kv_heads=8,
                  head_dim=128, rms_eps=1e-6, max_position=4096)


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_the_probe_shape_runs_persistent_on_sm90(batch):
    r = fallback.route(PROBE, batch, "bfloat16", "cuda:0", "sm_90")
    assert r.mode == "persistent" and not r.fell_back and r.reasons == ()


def test_an_unsupported_batch_falls_back_to_graph_with_the_reason():
    r = fallback.route(PROBE, 12, "bfloat16", "cuda:0", "sm_90")
    assert r.mode == "graph" and r.fell_back
    assert r.to_json() == {"requested": "persistent", "mode": "graph", "fell_back": True,
                           "reasons": ["persistent: batch 12 (persistent kernel: 1..8)"]}


def test_without_cuda_the_route_ends_eager_with_every_reason():
    dims = dataclasses.replace(PROBE, head_dim=96, heads=32, kv_heads=2)
    r = fallback.route(dims, 1, "float32", "cpu", "")
    assert r.mode == "eager"
    assert r.reasons == (
        "persistent: dtype float32 (persistent kernel: bfloat16); arch none (persistent kernel "
        "built for sm_90); head_dim 96 (persistent kernel: (64, 128)); GQA group 16 "
        "(persistent kernel: <= 8)",
        "graph: needs a CUDA device, not 'cpu'")


def test_a_requested_graph_or_eager_mode_is_kept():
    assert fallback.route(PROBE, 1, "bfloat16", "cuda:0", "sm_90", "graph").mode == "graph"
    assert fallback.route(PROBE, 1, "bfloat16", "cuda:0", "sm_90", "eager").mode == "eager"


def test_unaligned_widths_are_unsupported():
    dims = dataclasses.replace(PROBE, intermediate=6148)
    assert fallback.persistent_unsupported(dims, 1, "bfloat16", "sm_90") == [
        "intermediate 6148 not a multiple of 8 (16-byte weight loads)"]


def test_fallback_arches_are_the_arches_kernels_toml_builds():
    """fallback.ARCHES is kept light (no kernels.toml parse at import); it must not drift."""
    from pathlib import Path

    from rowgate.cuda import kernels

    repo = Path(fallback.__file__).resolve().parents[2]
    assert set(fallback.ARCHES) == set(kernels.load(repo).kernels["persistent_decode"].arches)
