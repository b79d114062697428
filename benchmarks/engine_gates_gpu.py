"""The tokens and throughput gates on a GPU: reference engine eager (oracle arm) vs
CUDA-graph (candidate arm) on the tiny model, i16/i1024 x c1/c4/c8.

Usage: python3 benchmarks/engine_gates_gpu.py OUT_DIR  (from the repo root; needs a
GPU, torch, tokenizers, safetensors, numpy, scipy, nvidia-ml-py, pydantic, GitPython).
Writes OUT_DIR/summary.json (both gate results) and the throughput gate's raw
samples, clocks and meta. docs/perf.md records a run.
"""
import json
import shutil
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, ".")
from rowgate.gates.interface import run_gate
from rowgate.gates.throughput import Throughput
from rowgate.gates.tokens import Tokens
from rowgate.rows.row import load_row
from rowgate.run import runner
from rowgate.seal import device

out = Path(sys.argv[1])
tmp = Path("/tmp/gpucheck")
shutil.rmtree(tmp, ignore_errors=True)
tmp.mkdir()
row_text = textwrap.dedent('''
    id = "GPU-CHECK"
    title = "gpu check"
    kind = "demo"
    [target]
    arch = "sm_90"
    [[models]]
    id = "tiny"
    name = "tiny-qwen3"
    [arms.oracle]
    engine = "reference"
    version = "rowgate"
    mode = "eager"
    [arms.candidate]
    engine = "reference"
    mode = "graph"
    [workload]
    input_lens = [16, 1024]
    concurrency = [1, 4, 8]
    output_len = 32
    requests_per_cell = 8
    [[gates]]
    id = "tokens"
    kind = "tokens"
    [[gates]]
    id = "tp"
    kind = "throughput"
''')
(tmp / "GPU-CHECK.toml").write_text(row_text)
row = load_row(tmp / "GPU-CHECK.toml").row


class P:
    def update(self, m):
        print("..", m, flush=True)

    def advance(self, total=None):
        pass


summary = {}
for gate, gid in ((Tokens(), "tokens"), (Throughput(), "tp")):
    t = time.time()
    devices = device.inventory()
    ctx = runner.gate_context(row, row.gate(gid), repo=Path.cwd(),
                              artifact_dir=tmp / "stage" / "artifacts" / gid, subject=None,
                              provenance=None, devices=devices, progress=P())
    r = run_gate(gate, row, row.gate(gid), ctx, tmp / "stage")
    print(gid, r.status.value, r.arch, r.reason, round(time.time() - t, 1), flush=True)
    summary[gid] = json.loads(r.model_dump_json())
(out / "summary.json").write_text(json.dumps(summary, indent=1))
for f in ("passes.csv", "requests.jsonl", "clocks.csv", "meta.json"):
    p = tmp / "stage/artifacts/tp" / f
    if p.exists():
        shutil.copy(p, out / f"tp-{f}")
