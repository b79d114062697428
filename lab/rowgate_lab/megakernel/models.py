"""Locally built models the megakernel row names, by name: their dims without building
them (the task lists need only shapes), and the build when a GPU proof needs weights.

The probe is the one `benchmarks/trace_capture.py` traces: Qwen3 architecture, 16
layers, hidden 2048 (~1.6 GB of bf16 weights), from a fixed seed.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rowgate.models.tiny import ModelInfo, TinyModelSpec, build_tiny_model
from rowgate_lab.megakernel.builder import ModelDims

if TYPE_CHECKING:
    from rowgate.rows.spec import ModelRef

NAMED: dict[str, TinyModelSpec] = {
    "tiny-qwen3": TinyModelSpec(),
    "probe-qwen3-h2048-l16": TinyModelSpec(vocab_size=1024, hidden_size=2048,
                                           intermediate_size=6144, num_layers=16,
                                           num_heads=16, num_kv_heads=8, head_dim=128,
                                           max_position=1024),
}


def dims(spec: TinyModelSpec) -> ModelDims:
    return ModelDims(vocab=spec.vocab_size, hidden=spec.hidden_size,
                     intermediate=spec.intermediate_size, layers=spec.num_layers,
                     heads=spec.num_heads, kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                     rms_eps=spec.rms_norm_eps, max_position=spec.max_position)


def spec_of(ref: ModelRef) -> TinyModelSpec | None:
    """The spec of a row's model reference: a `synthetic` table when the row carries one
    (keys named as TinyModelSpec's fields), else a name above; None for real weights."""
    synthetic = getattr(ref, "synthetic", None)
    if synthetic is not None:
        known = {f.name for f in dataclasses.fields(TinyModelSpec)}
        given = synthetic.model_dump() if hasattr(synthetic, "model_dump") else dict(synthetic)
        return TinyModelSpec(**{k: v for k, v in given.items() if k in known})
    return NAMED.get(ref.name)


def build(spec: TinyModelSpec) -> ModelInfo:
    return build_tiny_model(spec)
