"""The lab-graph-fused engine on a GPU: a second process compiles nothing its cache
already holds, and gives the same tokens (what lab/benchmarks/megakernel_seal.sh relies
on: a warm-up call's compile serves the sealing call), and the description says where the
graphs came from.

Self-contained fixtures (no conftest): it runs on a GPU host with `--noconftest`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rowgate.models.tiny import TinyModelSpec, build_tiny_model

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

RUN = """
import json, sys
from rowgate_lab.engines.fused import FusedEngine
from rowgate.rows.spec import Workload
from rowgate.rows.workload import build_passes
from rowgate.models.tiny import model_info
info = model_info(__import__("pathlib").Path(sys.argv[1]))
work = build_passes(Workload(input_lens=[16], concurrency=[2], output_len=8,
                             requests_per_cell=2), info.vocab_size, info.special_ids)[0]
with FusedEngine(info.path, device="cuda:0", compile_mode="default") as engine:
    out = engine.generate(work)
    print(json.dumps({"tokens": [list(o.token_ids) for o in out.outputs],
                      "cache": engine.describe()["fused_compile_cache"]}))
"""


def _run(model: Path, cache: Path) -> dict[str, object]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", RUN, str(model)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=True)
    doc: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return doc


def test_a_second_process_compiles_from_the_first_ones_cache(tmp_path):
    model = build_tiny_model(TinyModelSpec(), root=tmp_path / "models")
    cache = tmp_path / "inductor"
    first, second = _run(model.path, cache), _run(model.path, cache)
    assert first["tokens"] == second["tokens"]
    assert str(first["cache"]).startswith(f"{cache}: 0 graph(s) from the cache"), first
    assert ", 0 compiled here" in str(second["cache"]), second
    assert str(second["cache"]).endswith("no best-of-N record (one compile, as drawn)")
