"""Where an in-process engine's torch.compile output lands: rowgate's cache dir (kept
across runs with `ROWGATE_CACHE_DIR`), even after torch._dynamo's import has written
torch's /tmp default into the environment; a `TORCHINDUCTOR_CACHE_DIR` rowgate's process
was started with wins. A real compile (inductor's C++ backend on the CPU) in a fresh
interpreter, as a run makes one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PROGRAM = """
import json, os, sys
import torch._dynamo  # torch writes its own default cache dir into the environment
torch_default = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
from rowgate import engines
from rowgate.rows.spec import Arm, EngineKind
engines.create(Arm(engine=EngineKind.REFERENCE), sys.argv[1])  # an in-process engine
import torch
step = torch.compile(lambda x: torch.relu(x) * 2 + 1, dynamic=False)
assert step(torch.arange(-4.0, 4.0)).tolist() == [1.0] * 4 + [1.0, 3.0, 5.0, 7.0]
from rowgate.engines import _process
from torch._inductor.runtime.cache_dir_utils import default_cache_dir
print(json.dumps({"torch_default": torch_default, "restated": _process._torch_default_cache(),
                  "torch_says": default_cache_dir(),
                  "chosen": os.environ["TORCHINDUCTOR_CACHE_DIR"]}))
"""


def _run(tmp_path: Path, **env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path / "model")],
                          env={**base, "ROWGATE_CACHE_DIR": str(tmp_path / "cache"), **env},
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def _compiled_graphs(cache: Path) -> list[Path]:
    return [p for p in (cache / "fxgraph").rglob("*") if p.is_file()]


def test_an_in_process_engine_compiles_into_rowgates_cache(tmp_path):
    found = _run(tmp_path)
    # rowgate's restatement of torch's default is what torch writes and says
    assert found["torch_default"] == found["restated"] == found["torch_says"]
    cache = tmp_path / "cache" / "torchinductor"
    assert found["chosen"] == str(cache)
    assert _compiled_graphs(cache), sorted(p.name for p in cache.rglob("*"))


def test_a_cache_dir_the_process_was_started_with_wins(tmp_path):
    given = tmp_path / "given"
    found = _run(tmp_path, TORCHINDUCTOR_CACHE_DIR=str(given))
    assert found["torch_default"] == found["chosen"] == str(given)
    assert _compiled_graphs(given)
    assert not (tmp_path / "cache" / "torchinductor").exists()
