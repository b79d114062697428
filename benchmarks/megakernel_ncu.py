"""Hardware counters of the persistent decode step (issue 19's measured limit): ncu on one
batch's step of the probe model for each given cubin, the same task list, the dynamic
queue, the clocks left alone (`--clock-control none`).

    PYTHONPATH=. python3 benchmarks/megakernel_ncu.py --out DIR --cubin NAME=PATH ... \
        [--batch 1]

Each cubin's step is launched LAUNCHES times in the profiled process, in the order given;
ncu profiles every launch (kernel replay restores the counters the step starts from) and
the last launch of each cubin is the one reported. Writes DIR/ncu.csv (ncu's raw page) and
DIR/ncu.json ({cubin: {metric: value}}), and prints a table. Why counters as well as the
traced breakdown: the breakdown says where a block's time goes (counter waits, GEMV,
other ops); the counters say whether DRAM is busy while it does (dram throughput, bytes,
L2 hit rate) and what the warps stall on.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

LAUNCHES = 3
METRICS = [
    "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct", "lts__t_sectors_srcunit_tex_op_read.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smsp__warps_eligible.avg.per_cycle_active",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed.sum",
]

def target(cubins: list[tuple[str, Path]], batch: int, norm_in: bool = False) -> None:
    """What ncu profiles: LAUNCHES steps per cubin from one prefilled state, the task list
    of the A/B's `mk-mma` (norms and merges as stages), or with `norm_in` its
    `mk-mma-norm-in` (the norms in the consumers: the b1 default)."""
    import megakernel as mk  # benchmarks/megakernel.py: probe, prefill
    import torch
    from megakernel_ab import NORM_IN, STAGED

    from pipeline.engines.qwen3 import Qwen3Model, torch_paged_decode_attention
    from pipeline.megakernel.abi import Schedule
    from pipeline.ops.megakernel import PersistentDecode

    model = Qwen3Model(mk.probe().path, "cuda", torch.bfloat16, torch_paged_decode_attention)
    cache, args = mk.prefilled(model, batch, 2)
    with torch.inference_mode():
        for _, path in cubins:
            pd = PersistentDecode(model, cache, batch, Schedule.DYNAMIC_QUEUE, path,
                                  options=NORM_IN if norm_in else STAGED)
            for _ in range(LAUNCHES):
                pd(*args)
            torch.cuda.synchronize()


def parse(text: str, names: list[str]) -> dict[str, dict[str, str]]:
    """ncu's raw CSV page: one row per profiled launch (after a units row); the last of each
    cubin's LAUNCHES rows is its report."""
    start = text.find('"ID"')
    if start < 0:
        return {}
    rows = [r for r in csv.DictReader(io.StringIO(text[start:])) if r.get("ID", "").isdigit()]
    out = {}
    for i, name in enumerate(names):
        at = (i + 1) * LAUNCHES - 1
        if at < len(rows):
            out[name] = {m: rows[at].get(m, "") for m in ["Kernel Name", *METRICS]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cubin", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--norm-in", action="store_true",
                    help="the list with the norms in their consumers (the b1 default)")
    ap.add_argument("--target", action="store_true", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    cubins = [(n, Path(p)) for n, _, p in (c.partition("=") for c in ns.cubin)]
    if ns.target:
        target(cubins, ns.batch, ns.norm_in)
        return 0
    ns.out.mkdir(parents=True, exist_ok=True)
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    cmd = [ncu, "--clock-control", "none", "--kernel-name", "regex:persistent_decode",
           "--metrics", ",".join(METRICS), "--csv", "--page", "raw", sys.executable, __file__,
           "--target", "--out", str(ns.out), "--batch", str(ns.batch),
           *(["--norm-in"] if ns.norm_in else []),
           *[f"--cubin={c}" for c in ns.cubin]]
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, check=False)
    (ns.out / "ncu.csv").write_text(p.stdout + "\n# stderr\n" + p.stderr[-4000:])
    got = parse(p.stdout, [n for n, _ in cubins])
    (ns.out / "ncu.json").write_text(json.dumps({"returncode": p.returncode, "command": cmd,
                                                 "batch": ns.batch, "norm_in": ns.norm_in,
                                                 "cubins": got}, indent=1))
    for name, m in got.items():
        print(name, " ".join(f"{k.split('.')[0].split('__')[-1]}={v}" for k, v in m.items()
                             if k != "Kernel Name"))
    print(f"ncu returncode {p.returncode}")
    return 0 if p.returncode == 0 and len(got) == len(cubins) else 1


if __name__ == "__main__":
    sys.exit(main())
