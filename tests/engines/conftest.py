"""Engine fixtures: the tiny model (built once per session) and the demo workload."""

from __future__ import annotations

import pytest

from rowgate.models.tiny import TinyModelSpec, build_tiny_model
from rowgate.rows.spec import Workload
from rowgate.rows.workload import build_passes

DEMO_WORKLOAD = Workload(input_lens=[16, 64], concurrency=[1, 4], output_len=16,
                         requests_per_cell=4)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return build_tiny_model(TinyModelSpec(), root=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def demo_passes(tiny_model):
    return build_passes(DEMO_WORKLOAD, tiny_model.vocab_size, tiny_model.special_ids)
