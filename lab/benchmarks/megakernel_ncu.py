"""Hardware counters of the persistent decode step (its measured limit): ncu on one
batch's step of the probe model for each given cubin, the same task list, the dynamic
queue, the clocks left alone (`--clock-control none`).

    PYTHONPATH=. python3 benchmarks/megakernel_ncu.py --out DIR --cubin NAME=PATH ... \
        [--batch 1] [--norm-in | --options JSON] [--source FILE]

Each cubin's step is launched LAUNCHES times in the profiled process, in the order given;
ncu profiles every launch (kernel replay restores the counters the step starts from) and
the last launch of each cubin is the one reported. Writes DIR/ncu.csv (ncu's raw page) and
DIR/ncu.json ({cubin: {metric: value}}), and prints a table. Why counters as well as the
traced breakdown: the breakdown says where a block's time goes (counter waits, GEMV,
other ops); the counters say whether DRAM is busy while it does (dram throughput, bytes,
L2 hit rate) and what the warps stall on.

`--options` gives the task list's builder options as JSON (e.g. fat splits,
'{"fuse_norm": true, "kv_splits": 1}'); `--source FILE` (cubins built with -lineinfo) also
takes ncu's source counters of one launch a cubin (DIR/source-NAME.ncu-rep, kept whole) and
writes DIR/source.json: for each line of FILE (and each of its SASS instructions), the
warp stall samples by reason (Nsight Compute's Python report interface maps each sampled
address to its line), the question the fat-split measurements left open: a persistent split
warp pays ~1 us a token however its loads are issued (docs/perf.md).
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
    # the instruction fetch (a 47k-instruction kernel: does a task switch miss the i-cache?),
    # and the memory pipes' queues
    "smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed.sum",
]

def target(cubins: list[tuple[str, Path]], batch: int, options: dict) -> None:
    """What ncu profiles: LAUNCHES steps per cubin from one prefilled state, the task list
    the builder `options` give (main: the A/B's `mk-mma`, norms and merges as stages, or
    with --norm-in its `mk-mma-norm-in`, the norms in the consumers: the b1 default)."""
    import megakernel as mk  # benchmarks/megakernel.py: probe, prefill
    import torch

    from rowgate.engines.qwen3 import Qwen3Model, torch_paged_decode_attention
    from rowgate_lab.megakernel.abi import Schedule
    from rowgate_lab.ops.megakernel import PersistentDecode

    model = Qwen3Model(mk.probe().path, "cuda", torch.bfloat16, torch_paged_decode_attention)
    cache, args = mk.prefilled(model, batch, 2)
    with torch.inference_mode():
        for _, path in cubins:
            pd = PersistentDecode(model, cache, batch, Schedule.DYNAMIC_QUEUE, path,
                                  options=options)
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


STALL = "smsp__pcsamp_warps_issue_stalled_"


def by_key(samples, source: str, key: str) -> dict[str, dict[str, int]]:
    """Warp stall samples [(file, line, reason, count, pc)] summed by `key` ("line", or
    "pc": one SASS instruction, its line kept) of `source` (its file name), by reason, with
    their sum as "all"; samples of other files are left out."""
    out: dict[str, dict[str, int]] = {}
    name = Path(source).name
    for file, line, reason, count, pc in samples:
        if Path(str(file)).name != name or not count:
            continue
        cell = out.setdefault(str(line) if key == "line" else f"{pc:#x}", {"all": 0})
        if key == "pc":
            cell["line"] = int(line)
        cell[reason] = cell.get(reason, 0) + int(count)
        cell["all"] += int(count)
    return out


def by_file(samples) -> dict[str, int]:
    """All stall samples by source file: how much of the step the named file's lines are."""
    out: dict[str, int] = {}
    for file, _, _, count, _ in samples:
        out[Path(str(file)).name] = out.get(Path(str(file)).name, 0) + int(count)
    return out


def report_samples(path: Path):
    """(file, line, reason, count, pc) of every sampled SASS instruction of the report's
    one kernel (pc: the loaded address; its offset in the cubin is pc minus the function's
    base, which the lines recorded beside it pin down), through Nsight Compute's Python
    report interface (ncu_report, in its extras/python): each
    smsp__pcsamp_warps_issue_stalled_* metric is instanced by the instruction's address,
    which source_info maps to its CUDA file and line."""
    import ncu_report  # noqa: PLC0415 -- on the device, from Nsight Compute's install

    action = ncu_report.load_report(str(path))[0][0]
    for metric_name in action.metric_names():
        if not metric_name.startswith(STALL) or metric_name.endswith("_not_issued"):
            continue
        metric = action[metric_name]
        pcs = metric.correlation_ids()
        for i in range(metric.num_instances()):
            count = metric.as_uint64(i)
            info = action.source_info(pcs.as_uint64(i))
            if info is not None and count:
                yield (info.file_name(), info.line(), metric_name[len(STALL):], count,
                       pcs.as_uint64(i))


def ncu_python_path(ncu: str) -> str:
    """Nsight Compute's extras/python: beside the ncu binary (the real path, not a link),
    else in Nsight Compute's own install, since the CUDA toolkit's `bin/ncu` is a launcher
    of /opt/nvidia/nsight-compute/VERSION/ncu (the device's, seen in the first call)."""
    root = Path(os.path.realpath(ncu)).parent
    cands = [root / "extras" / "python", root.parent / "extras" / "python",
             *sorted(Path("/opt/nvidia").glob("nsight-compute/*/extras/python"), reverse=True)]
    for cand in cands:
        if cand.is_dir():
            return str(cand)
    return ""


NCU = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"


def profiled(ns: argparse.Namespace, options: dict, how: list[str],
             cubins: list[str]) -> subprocess.CompletedProcess[str]:
    """ncu (`how`: what it collects and writes) on this script's --target run of `cubins`."""
    cmd = [NCU, "--clock-control", "none", "--kernel-name", "regex:persistent_decode", *how,
           sys.executable, __file__, "--target", "--out", str(ns.out), "--batch",
           str(ns.batch), f"--options={json.dumps(options)}", *[f"--cubin={c}" for c in cubins]]
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env,
                          check=False)


def take_source(ns: argparse.Namespace, options: dict) -> dict:
    """One profiled launch a cubin with the source counters; its stall samples by line."""
    got = {}
    for spec in ns.cubin:
        name = spec.partition("=")[0]
        rep = ns.out / f"source-{name}"
        p = profiled(ns, options, ["--launch-skip", str(LAUNCHES - 1), "--launch-count", "1",
                                   "--section", "SourceCounters", "--section", "WarpStateStats",
                                   "--import-source", "yes", "-f", "-o", str(rep)], [spec])
        (ns.out / f"source-{name}.log").write_text((p.stdout + p.stderr)[-4000:])
        try:
            sys.path.insert(0, ncu_python_path(NCU))
            samples = list(report_samples(rep.with_suffix(".ncu-rep")))
            error = ""
        except Exception as exc:  # noqa: BLE001 -- recorded: the report stays for a rerun
            samples, error = [], f"{type(exc).__name__}: {exc}"
        got[name] = {"returncode": p.returncode, "error": error,
                     "lines": by_key(samples, ns.source, "line"),
                     "pcs": by_key(samples, ns.source, "pc"), "files": by_file(samples)}
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cubin", action="append", default=[], metavar="NAME=PATH")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--norm-in", action="store_true",
                    help="the list with the norms in their consumers (the b1 default)")
    ap.add_argument("--options", type=json.loads, default=None,
                    help="the task list's builder options as JSON (instead of --norm-in)")
    ap.add_argument("--source", default=None, metavar="FILE",
                    help="also the source counters, summed by FILE's lines (-lineinfo cubins)")
    ap.add_argument("--target", action="store_true", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    cubins = [(n, Path(p)) for n, _, p in (c.partition("=") for c in ns.cubin)]
    from megakernel_ab import NORM_IN, STAGED

    options = ns.options if ns.options is not None else NORM_IN if ns.norm_in else STAGED
    if ns.target:
        target(cubins, ns.batch, options)
        return 0
    if not Path(NCU).is_file():
        print(f"megakernel_ncu: no ncu at {NCU} (Nsight Compute: the device machine has it)",
              file=sys.stderr)
        return 2
    ns.out.mkdir(parents=True, exist_ok=True)
    p = profiled(ns, options, ["--metrics", ",".join(METRICS), "--csv", "--page", "raw"],
                 ns.cubin)
    (ns.out / "ncu.csv").write_text(p.stdout + "\n# stderr\n" + p.stderr[-4000:])
    got = parse(p.stdout, [n for n, _ in cubins])
    (ns.out / "ncu.json").write_text(json.dumps({"returncode": p.returncode, "command": p.args,
                                                 "batch": ns.batch, "options": options,
                                                 "cubins": got}, indent=1))
    for name, m in got.items():
        print(name, " ".join(f"{k.split('.')[0].split('__')[-1]}={v}" for k, v in m.items()
                             if k != "Kernel Name"))
    print(f"ncu returncode {p.returncode}")
    ok = p.returncode == 0 and len(got) == len(cubins)
    if ns.source:
        lines = take_source(ns, options)
        (ns.out / "source.json").write_text(json.dumps({"source": ns.source,
                                                        "cubins": lines}, indent=1))
        for name, r in lines.items():
            top = sorted(r["lines"].items(), key=lambda kv: -kv[1]["all"])[:12]
            print(f"{name}: ncu {r['returncode']} {r['error']}; stall samples by line of "
                  f"{ns.source}: " +
                  "; ".join(f"{ln} {c['all']} ({max((k for k in c if k != 'all'), key=c.get, default='-')})"
                            for ln, c in top))
            ok = ok and r["returncode"] == 0 and bool(r["lines"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
