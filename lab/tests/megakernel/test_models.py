"""The abi gate sizes task lists from a model's spec without building its weights."""

from __future__ import annotations

from rowgate.rows.spec import ModelRef
from rowgate_lab.megakernel import models


def test_the_probe_is_known_by_name_and_sized_like_the_issue_says():
    spec = models.spec_of(ModelRef(id="probe", name="probe-qwen3-h2048-l16"))
    d = models.dims(spec)
    assert (d.layers, d.hidden, d.heads, d.kv_heads, d.head_dim) == (16, 2048, 16, 8, 128)
    weights = sum(2 * (d.heads * d.head_dim * d.hidden * 2 + d.kv_heads * d.head_dim * d.hidden * 2
                       + 3 * d.intermediate * d.hidden) for _ in range(d.layers))
    assert 1.55e9 < weights < 1.65e9  # "~1.6 GB of bf16 weights"


def test_a_synthetic_table_wins_over_the_name():
    class Synthetic:  # the shape of a row's [models.synthetic] table, as a mapping
        def model_dump(self):
            return {"hidden_size": 256, "num_layers": 3, "unknown_key": 1}

    class Ref:
        name = "probe-qwen3-h2048-l16"
        synthetic = Synthetic()

    d = models.dims(models.spec_of(Ref()))
    assert (d.hidden, d.layers) == (256, 3)


def test_real_weights_have_no_spec():
    assert models.spec_of(ModelRef(id="m", name="Qwen/Qwen3-4B", weights="/x")) is None
