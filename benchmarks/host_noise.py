"""Where a host-bound decode step's noise comes from: one engine's c1 pass, timed over and
over while the host is watched, under four conditions taken in turn.

    python benchmarks/host_noise.py cuda --seconds 90 --out DIR [--also-load probe-qwen3-h2048-l16]
    python benchmarks/host_noise.py cpu --seconds 20 --out DIR        (smoke)

The throughput gate's tiny-model A/A on the H200 had stretches minutes long in which
the per-round spread of the paired ratio rose from ~1 % to 4-8 % (docs/perf.md): whole
ITL distributions shifted by ~40 %, one arm's sample at a time. This
tells the candidate causes apart, per pass:

* CPU contention (another task on our core): involuntary context switches (`ru_nivcsw`);
* page faults (NUMA balancing, transparent huge page compaction after a large load):
  minor/major faults (`ru_minflt`, `ru_majflt`), system time;
* garbage collection: the collections `gc.callbacks` saw during the pass;
* migration between cores: the CPU the pass started and ended on;
* everything else (frequency steps, an SMT sibling's load, memory bandwidth): a slow pass
  with none of the above.

Conditions, in blocks of `--block-s` seconds, round robin: `plain`; `gc-off` (collection
disabled during the pass, as `timeit` does); `pinned` (the process bound to the one CPU
it was on, as pyperf binds its workers to isolated CPUs); `pinned+gc-off`. The host's
load average, CPU pressure (PSI) and its busiest other processes are sampled every block.
Everything lands in OUT/host_noise.json; a table per condition is printed last.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import calibrate_throughput as cal

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

CONDITIONS = ("plain", "gc-off", "pinned", "pinned+gc-off")


def cpu_now() -> int:
    """The CPU this thread runs on (/proc/self/stat field 39)."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[36])


class GcWatch:
    """Counts collections (and their time) through gc.callbacks."""

    def __init__(self) -> None:
        self.count, self.seconds, self._t = 0, 0.0, 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            self.count += 1
            self.seconds += time.perf_counter() - self._t


def one_pass(engine, work, cond: str, watch: GcWatch) -> dict:
    gc_off = cond.endswith("gc-off")
    c0, g0, s0 = cpu_now(), (watch.count, watch.seconds), resource.getrusage(resource.RUSAGE_SELF)
    if gc_off:
        gc.disable()
    t0 = time.perf_counter()
    try:
        result = engine.generate(work)
    finally:
        t1 = time.perf_counter()
        gc.enable()
    s1 = resource.getrusage(resource.RUSAGE_SELF)
    itl = sorted(v for o in result.outputs for v in o.itl_s)
    return {"cond": cond, "t": t0, "wall_s": t1 - t0, "median_itl_us": 1e6 * itl[len(itl) // 2],
            "cpu_start": c0, "cpu_end": cpu_now(),
            "utime_s": s1.ru_utime - s0.ru_utime, "stime_s": s1.ru_stime - s0.ru_stime,
            "minflt": s1.ru_minflt - s0.ru_minflt, "majflt": s1.ru_majflt - s0.ru_majflt,
            "nvcsw": s1.ru_nvcsw - s0.ru_nvcsw, "nivcsw": s1.ru_nivcsw - s0.ru_nivcsw,
            "gc": watch.count - g0[0], "gc_s": watch.seconds - g0[1]}


def host_sample() -> dict:
    out: dict = {"t": time.perf_counter(), "loadavg": Path("/proc/loadavg").read_text().split()[:3]}
    psi = Path("/proc/pressure/cpu")
    if psi.exists():
        out["psi_cpu"] = psi.read_text().splitlines()[0]
    try:
        ps = subprocess.run(["ps", "-eo", "pid,pcpu,psr,comm", "--sort=-pcpu"],
                            capture_output=True, text=True, timeout=5).stdout.splitlines()
        out["top"] = [ln for ln in ps[1:7] if str(os.getpid()) not in ln.split()[:1]]
    except (OSError, subprocess.TimeoutExpired) as exc:
        out["top"] = [f"ps: {exc}"]
    return out


def summarize(passes: list[dict]) -> dict:
    """Per condition: the pass time's median and spread, and how many passes were slow
    (> 1.15 x that condition's median) with each kind of interference."""
    out = {}
    for cond in CONDITIONS:
        ps = [p for p in passes if p["cond"] == cond]
        if len(ps) < 3:
            continue
        med = statistics.median(p["wall_s"] for p in ps)
        slow = [p for p in ps if p["wall_s"] > 1.15 * med]
        logs = [math.log(p["wall_s"]) for p in ps]
        out[cond] = {"passes": len(ps), "median_ms": round(1e3 * med, 3),
                     "sd_log": round(statistics.stdev(logs), 4),
                     "p90_over_median": round(sorted(p["wall_s"] for p in ps)[int(.9 * len(ps))] / med, 3),
                     "slow": len(slow),
                     "slow_with_nivcsw": sum(p["nivcsw"] > 0 for p in slow),
                     "slow_with_faults": sum(p["minflt"] + p["majflt"] > 0 for p in slow),
                     "slow_with_gc": sum(p["gc"] > 0 for p in slow),
                     "slow_migrated": sum(p["cpu_start"] != p["cpu_end"] for p in slow),
                     "all_nivcsw_mean": round(statistics.mean(p["nivcsw"] for p in ps), 2),
                     "all_minflt_mean": round(statistics.mean(p["minflt"] for p in ps), 2),
                     "all_gc_mean": round(statistics.mean(p["gc"] for p in ps), 3),
                     "stime_share": round(sum(p["stime_s"] for p in ps)
                                          / max(1e-9, sum(p["wall_s"] for p in ps)), 4),
                     "cpu_share": round(sum(p["utime_s"] + p["stime_s"] for p in ps)
                                        / max(1e-9, sum(p["wall_s"] for p in ps)), 4)}
    return out


def windows(passes: list[dict], width_s: float) -> list[dict]:
    """The spread over time: per window, each condition's median pass time (ms)."""
    if not passes:
        return []
    t0, out = passes[0]["t"], []
    end = passes[-1]["t"]
    w = 0.0
    while t0 + w <= end:
        ps = [p for p in passes if t0 + w <= p["t"] < t0 + w + width_s]
        row: dict = {"from_s": round(w, 1)}
        for cond in CONDITIONS:
            v = [p["wall_s"] for p in ps if p["cond"] == cond]
            if v:
                row[cond] = round(1e3 * statistics.median(v), 3)
                row[cond + "_p90"] = round(1e3 * sorted(v)[int(.9 * len(v))], 3)
        out.append(row)
        w += width_s
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("cuda", "cpu"))
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--block-s", type=float, default=2.0)
    ap.add_argument("--also-load", default="", help="load this model too first (as the "
                    "calibration does), to reproduce the host's state after its load")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    cuda = args.mode == "cuda"
    model = (cal.CUDA_MODELS if cuda else cal.CPU_MODELS)[0]
    device, mode = ("cuda", "graph") if cuda else ("cpu", "eager")
    scratch = args.out / "scratch"
    t_start = time.monotonic()
    tiny = cal.load(model, device, mode, {}, scratch, (1,))
    extra = None
    if args.also_load:
        other = next(m for m in cal.CUDA_MODELS if m.name == args.also_load)
        extra = cal.load(other, device, mode, {}, scratch, (1,))
    work = tiny.passes[0]
    tiny.base.generate(work)
    cal.log(f"loaded in {time.monotonic() - t_start:.1f} s; {os.cpu_count()} CPUs, "
            f"affinity {sorted(os.sched_getaffinity(0))}")
    watch, allowed = GcWatch(), os.sched_getaffinity(0)
    passes: list[dict] = []
    host: list[dict] = []
    t_end, b = time.perf_counter() + args.seconds, 0
    while time.perf_counter() < t_end:
        cond = CONDITIONS[b % len(CONDITIONS)]
        os.sched_setaffinity(0, {cpu_now()} if cond.startswith("pinned") else allowed)
        host.append({"block": b, "cond": cond, **host_sample()})
        block_end = time.perf_counter() + args.block_s
        while time.perf_counter() < block_end:
            passes.append({"block": b, **one_pass(tiny.base, work, cond, watch)})
        b += 1
    os.sched_setaffinity(0, allowed)
    doc = {"mode": args.mode, "model": model.name, "also_loaded": args.also_load,
           "cpus": os.cpu_count(), "summary": summarize(passes),
           "windows": windows(passes, 10.0), "host": host, "passes": passes}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_noise.json").write_text(json.dumps(doc, indent=1) + "\n")
    for cond, s in doc["summary"].items():
        print(f"{cond:14s} {json.dumps(s)}")
    for w in doc["windows"]:
        print(json.dumps(w))
    for e in (tiny.base, getattr(extra, "base", None)):
        if e is not None:
            e.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
