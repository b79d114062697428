"""The sandbox's cost on GPU work: one CUDA workload timed inside bubblewrap (rowgate's
subject-step profile with the GPU nodes bound) and outside it, in alternating rounds.

    python3 benchmarks/sandbox_overhead.py --out DIR [--rounds 20] [--size 8192]

Each round starts a fresh process (as a sandboxed step does) that times `--iters`
bf16 matmuls with CUDA events after a warm-up; the figure is the paired ratio
inside / outside per round, its median and a 95 % bootstrap interval (scipy). Writes
DIR/sandbox-overhead.json; docs/perf.md cites it with the device and the commit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy import stats

from rowgate import sandbox

WORKLOAD = """
import sys, torch
n, iters = int(sys.argv[1]), int(sys.argv[2])
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    a @ b
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(iters):
    a @ b
end.record()
torch.cuda.synchronize()
print(start.elapsed_time(end) / iters)
"""


def _time(script: Path, confined: bool, size: int, iters: int) -> float:
    step = sandbox.Step([sys.executable, str(script), str(size), str(iters)], cwd=script.parent,
                        gpu=True, limits=sandbox.Limits(wall_s=300, memory_bytes=None))
    done = sandbox.run(step, confined=confined)
    if done.returncode != 0:
        raise SystemExit(f"workload ({'inside' if confined else 'outside'}) exited "
                         f"{done.returncode}: {done.stderr.decode(errors='replace')[-500:]}")
    return float(done.stdout.decode().strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=50)
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "workload.py"
        script.write_text(WORKLOAD)
        pairs = []
        for r in range(ns.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            ms = {confined: _time(script, confined, ns.size, ns.iters) for confined in order}
            pairs.append((ms[True], ms[False]))
            print(f"round {r}: inside {ms[True]:.4f} ms, outside {ms[False]:.4f} ms", flush=True)
    ratios = np.array([i / o for i, o in pairs])
    ci = stats.bootstrap((ratios,), np.median, confidence_level=0.95, random_state=0,
                         method="percentile").confidence_interval
    doc = {"workload": f"bf16 matmul {ns.size}x{ns.size}, {ns.iters} iterations, CUDA events",
           "rounds": ns.rounds, "sandbox": sandbox.describe(gpu=True),
           "inside_ms_median": statistics.median(p[0] for p in pairs),
           "outside_ms_median": statistics.median(p[1] for p in pairs),
           "ratio_median": float(np.median(ratios)), "ratio_ci95": [ci.low, ci.high],
           "pairs_ms": pairs}
    (ns.out / "sandbox-overhead.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "pairs_ms"}, indent=1))


if __name__ == "__main__":
    main()
