"""The reference release's synthetic decode, timed by rowgate on one GPU: the release
(cohere-ai/cohere-megakernel) built as it builds itself, its standalone runner's
synthetic mode (`src/runner.py --mk --fast`) at each batch, a CUPTI trace rowgate
captures around it, and rowgate's own reading of that trace.

    PYTHONPATH=. python benchmarks/reference_decode.py --subject SUBJECT --out OUT \
        [--batches 1 8] [--context 128] [--tokens 48] [--nvcc PATH] [--ncu PATH]

The release is untrusted code: everything of it (its CMake + Ninja build, its JIT's nvcc
calls, its runner, Nsight Compute over its kernel) runs in rowgate's sandbox, GPU nodes
bound, in a private scratch directory holding a writable copy of the subject. This
process measures the copy ceiling itself and reads the traces the sandboxed runs leave.

Per batch, in the sandbox: a probe imports the release's runner and calls its `main`
with `--mk --fast --batch-size B --fake-prompt-len CONTEXT --max-new-tokens TOKENS`
inside `torch.profiler` (CPU + CUDA activities), then exports the trace. The runner's
own summary (its tok/s line) is kept as the release's *claim*; every figure rowgate
reports comes from the trace:

* the megakernel is the kernel with the largest total GPU time; each of its launches
  begins one decode step, the first WARM steps (JIT-loaded, cold caches) are dropped;
* **launches per step**: kernels that start between two megakernel starts;
* **time per token**: the median step (megakernel start to the next one's start) ÷ B
  tokens, beside the median megakernel duration;
* **GPU busy / idle per step**: the union of kernel time inside each step window;
* **waves**: the megakernel's grid over what its registers and shared memory let stay
  resident (`rowgate.trace.analysis.blocks_per_sm`, the trace's device properties);
* **achieved bandwidth**: DRAM bytes of one steady-state megakernel launch (Nsight
  Compute, `--ncu`, `--clock-control none`: the clocks are left alone) over its time,
  against the copy ceiling measured here; per-SM busy from the same launch's
  `sm__cycles_active` min / mean / max. Without ncu (or where it cannot read counters)
  these two say why they are missing.

Writes OUT/reference-decode.json (and the per-batch traces, gzipped, and logs).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from rowgate import sandbox

WARM = 3
"""Decode steps dropped from the start of each run."""
BUILD = [["cmake", "-S", ".", "-B", "build", "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
          "-DPython_FIND_STRATEGY=VERSION"], ["cmake", "--build", "build"]]
"""The release's own build (its BUILD_AND_RUN.md), as the row's declarations run it."""
HEADERS = ("nvtx", "nlohmann-json")
NCU_METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
               "sm__cycles_active.min", "sm__cycles_active.avg", "sm__cycles_active.max",
               "sm__cycles_elapsed.max", "launch__grid_size", "launch__block_size",
               "launch__registers_per_thread", "launch__waves_per_multiprocessor")

PROBE = r'''
"""Runs inside rowgate's sandbox: the release's runner under torch.profiler."""
import contextlib, json, sys
req = json.loads(sys.argv[1])
sys.path.insert(0, req["src"])
import torch
import runner
argv = ["--mk", "--fast", "--batch-size", str(req["batch"]), "--fake-prompt-len",
        str(req["context"]), "--max-new-tokens", str(req["tokens"]), "--lib-path", req["lib"]]
if req["trace"] is None:
    runner.main(argv)
else:
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        runner.main(argv)
    prof.export_chrome_trace(req["trace"])
'''


def _step(argv: list[str], cwd: Path, scratch: Path, env: dict[str, str],
          wall_s: float) -> sandbox.Result:
    step = sandbox.Step(argv, cwd=cwd, writable=[scratch], env=env, gpu=True,
                        path_dirs=[str(Path(env["NVCC"]).parent)],
                        limits=sandbox.Limits(wall_s=wall_s, memory_bytes=None))
    return sandbox.run(step, confined=True)


def _env(nvcc: str, scratch: Path) -> dict[str, str]:
    from rowgate.cuda import library_headers, toolchains

    tc = toolchains.for_arch("sm_90a", nvcc)
    dirs = [h.include_dir for h in library_headers.resolve(list(HEADERS), tc)]
    return {"NVCC": nvcc, "CUDACXX": nvcc, "CPATH": os.pathsep.join(dirs),
            "LITTLE_JIT_CACHE_DIR": str(scratch / "jit"), "HOME": str(scratch / "home"),
            "TMPDIR": str(scratch / "tmp")}


def build(subject: Path, scratch: Path, env: dict[str, str], out: Path) -> Path:
    """The release's own build in a writable copy; returns the copy."""
    work = scratch / "subject"
    shutil.copytree(subject, work, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    for d in ("jit", "home", "tmp"):
        (scratch / d).mkdir()
    log = io.BytesIO()
    for argv in BUILD:
        done = _step(argv, work, scratch, env, 900.0)
        log.write(b"$ " + " ".join(argv).encode() + b"\n" + done.stdout + done.stderr)
        if done.returncode != 0:
            (out / "build-log.txt").write_bytes(log.getvalue())
            raise SystemExit(f"the release's build failed ({' '.join(argv)}: exit "
                             f"{done.returncode} {done.limit}); see {out / 'build-log.txt'}")
    (out / "build-log.txt").write_bytes(log.getvalue())
    return work


def probe_argv(work: Path, scratch: Path, batch: int, ns: argparse.Namespace,
               trace: Path | None) -> list[str]:
    """The probe's command line: the release's runner at `batch`, traced into `trace`
    (or untraced, for Nsight Compute)."""
    probe = scratch / "reference_decode_probe.py"
    probe.write_text(PROBE)
    req = {"src": str(work / "src"), "lib": str(work / "build" / "libmk_release.so"),
           "batch": batch, "context": ns.context, "tokens": ns.tokens,
           "trace": None if trace is None else str(trace)}
    return [sys.executable, str(probe), json.dumps(req)]


def run_batch(work: Path, scratch: Path, env: dict[str, str], batch: int, ns: argparse.Namespace,
              trace: Path) -> sandbox.Result:
    return _step(probe_argv(work, scratch, batch, ns, trace), work, scratch, env, 900.0)


# ------------------------------------------------------------------ reading


def kernels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted((e for e in doc.get("traceEvents", [])
                   if e.get("cat") == "kernel" and e.get("ph") == "X"),
                  key=lambda e: float(e["ts"]))


def read_trace(doc: dict[str, Any], batch: int) -> dict[str, Any]:
    """rowgate's figures from one decode run's trace (see the module's docstring)."""
    from rowgate.trace.analysis import blocks_per_sm, union

    ks = kernels(doc)
    if not ks:
        raise ValueError("no GPU kernels in the trace")
    totals: dict[str, float] = {}
    for k in ks:
        totals[k["name"]] = totals.get(k["name"], 0.0) + float(k.get("dur", 0.0))
    mk_name = max(totals, key=lambda n: totals[n])
    mk = [k for k in ks if k["name"] == mk_name]
    if len(mk) < WARM + 3:
        raise ValueError(f"{len(mk)} megakernel launches: too few decode steps to read")
    steps = []
    for a, b in zip(mk[WARM:], mk[WARM + 1:]):
        t0, t1 = float(a["ts"]), float(b["ts"])
        inside = [(max(float(k["ts"]), t0), min(float(k["ts"]) + float(k["dur"]), t1))
                  for k in ks if t0 <= float(k["ts"]) < t1]
        busy = sum(b - a for a, b in union(inside))
        steps.append({"step_us": t1 - t0, "megakernel_us": float(a["dur"]),
                      "launches": len(inside), "busy_us": busy, "idle_us": t1 - t0 - busy})
    med = {key: statistics.median(s[key] for s in steps) for key in steps[0]}
    args = mk[WARM].get("args", {})
    props = (doc.get("deviceProperties") or [None])[0]
    waves = None
    if props and args.get("grid") and args.get("block"):
        resident = blocks_per_sm(props, math.prod(args["block"]),
                                 int(args.get("registers per thread", 0)),
                                 int(args.get("shared memory", 0)))
        waves = {"grid": args["grid"], "block": args["block"],
                 "registers_per_thread": args.get("registers per thread"),
                 "shared_memory": args.get("shared memory"), "sms": props.get("numSms"),
                 "resident_blocks_per_sm": resident,
                 "waves": math.prod(args["grid"]) / (int(props["numSms"]) * resident)}
    return {"batch": batch, "megakernel": mk_name, "megakernel_launches": len(mk),
            "steps_read": len(steps), "warm_steps_dropped": WARM,
            "median": med, "time_per_token_us": med["step_us"] / batch,
            "tokens_per_s": batch * 1e6 / med["step_us"],
            "gpu_busy_fraction": med["busy_us"] / med["step_us"], "waves": waves,
            "per_step": steps}


def read_ncu(text: str) -> dict[str, float]:
    """Nsight Compute's `--csv --page raw` output (the phase gate's parser): metric ->
    value of the one profiled launch."""
    from rowgate.ops import ncu

    launches = ncu.parse(text)
    if not launches:
        raise ValueError("no profiled launch in ncu's output")
    return {k: float(v) for k, v in launches[0]["metrics"].items() if k in NCU_METRICS}


def ncu_figures(m: dict[str, float], ceiling: float) -> dict[str, Any]:
    seconds = m["gpu__time_duration.sum"] * 1e-9
    moved = m["dram__bytes_read.sum"] + m["dram__bytes_write.sum"]
    elapsed = m["sm__cycles_elapsed.max"]
    return {"dram_bytes": moved, "kernel_us": seconds * 1e6,
            "achieved_bytes_per_s": moved / seconds,
            "achieved_of_ceiling": moved / seconds / ceiling,
            "sm_busy": {k: m[f"sm__cycles_active.{k}"] / elapsed for k in ("min", "avg", "max")},
            "waves_per_sm": m.get("launch__waves_per_multiprocessor"), "metrics": m}


def run_ncu(ncu: str, work: Path, scratch: Path, env: dict[str, str], batch: int,
            name: str, ns: argparse.Namespace) -> dict[str, Any]:
    # the clocks left alone (ncu's default locks them), and the name as a substring: the
    # megakernel is a template instance whose full name changes with each batch size
    argv = [ncu, "--clock-control", "none", "--target-processes", "all", "--csv",
            "--page", "raw", "--kernel-name", name, "--launch-skip", str(WARM + 2),
            "--launch-count", "1", "--metrics", ",".join(NCU_METRICS),
            *probe_argv(work, scratch, batch, ns, None)]
    done = _step(argv, work, scratch, env, 900.0)
    text = done.stdout.decode(errors="replace")
    try:
        return {"ok": True, **ncu_figures(read_ncu(text), ns.ceiling)}
    except (ValueError, KeyError, ZeroDivisionError) as exc:
        tail = (text + done.stderr.decode(errors="replace"))[-1500:]
        return {"ok": False, "why": f"{exc} (ncu exit {done.returncode} {done.limit})",
                "tail": tail}


def audit_jit(so: Path, scratch: Path, env: dict[str, str], out: Path) -> dict[str, Any]:
    """The megakernel the release's JIT compiled (it is in no build output): cuobjdump's
    resource usage and SASS, in the sandbox, read with the audit gate's parsers."""
    from rowgate.cuda.resources import parse_resource_usage

    cuobjdump = str(Path(env["NVCC"]).with_name("cuobjdump"))
    usage = _step([cuobjdump, "--dump-resource-usage", str(so)], scratch, scratch, env, 300.0)
    sass = _step([cuobjdump, "-sass", str(so)], scratch, scratch, env, 300.0)
    text = sass.stdout.decode(errors="replace")
    (out / f"{so.stem}.resource-usage.txt").write_bytes(usage.stdout)
    with gzip.open(out / f"{so.stem}.sass.txt.gz", "wb") as f:
        f.write(sass.stdout)
    return {"object": so.name, "bytes": so.stat().st_size,
            "resource_usage": parse_resource_usage(usage.stdout.decode(errors="replace")),
            "sass_lines": text.count("\n"), "wgmma_instructions": text.count("HGMMA"),
            "local_memory_instructions": text.count("LDL") + text.count("STL"),
            "cuobjdump_exit": [usage.returncode, sass.returncode]}


def claim(stdout: bytes) -> list[str]:
    """The runner's own summary lines (its tok/s): recorded as the release's claim."""
    return [ln for ln in stdout.decode(errors="replace").splitlines()
            if "tok/s" in ln or "decode" in ln.lower()][-8:]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--subject", type=Path, required=True, help="the release's checkout")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--context", type=int, default=128,
                   help="KV position before decoding (the lab benchmark's prompt length)")
    p.add_argument("--tokens", type=int, default=48, help="tokens generated per run")
    p.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    p.add_argument("--ncu", default=shutil.which("ncu"), help="Nsight Compute (optional)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from rowgate.trace.capture import copy_ceiling

    ns = parse_args(argv)
    subject = ns.subject.resolve()
    ns.out.mkdir(parents=True, exist_ok=True)
    sandbox.check_available()
    ceiling = copy_ceiling("cuda")
    ns.ceiling = ceiling["bytes_per_s"]
    scratch = Path(tempfile.mkdtemp(prefix="refdecode-"))
    doc: dict[str, Any] = {"subject": str(subject), "context": ns.context,
                           "tokens": ns.tokens, "copy_ceiling": ceiling,
                           "sandbox": sandbox.describe(gpu=True), "batches": []}
    try:
        env = _env(ns.nvcc, scratch)
        work = build(subject, scratch, env, ns.out)
        for batch in ns.batches:
            trace = scratch / f"trace-b{batch}.json"
            done = run_batch(work, scratch, env, batch, ns, trace)
            (ns.out / f"run-b{batch}.log").write_bytes(done.stdout + b"\n--\n" + done.stderr)
            entry: dict[str, Any] = {"batch": batch, "seconds": round(done.duration_s, 1),
                                     "claim": claim(done.stdout)}
            if done.returncode != 0 or not trace.is_file():
                entry["error"] = f"the runner exited {done.returncode} {done.limit}"
            else:
                raw = json.loads(trace.read_text())
                with gzip.open(ns.out / f"trace-b{batch}.json.gz", "wt") as f:
                    json.dump(raw, f)
                entry.update(read_trace(raw, batch))
                entry.pop("per_step", None)
                if ns.ncu:
                    entry["ncu"] = run_ncu(ns.ncu, work, scratch, env, batch,
                                           f"regex:{_short(entry['megakernel'])}", ns)
            doc["batches"].append(entry)
            print(json.dumps({k: v for k, v in entry.items() if k != "ncu"}, indent=1),
                  flush=True)
        doc["jit_objects"] = [audit_jit(so, scratch, env, ns.out)
                              for so in sorted((scratch / "jit").glob("lib*.so"))]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    (ns.out / "reference-decode.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {ns.out / 'reference-decode.json'}")
    return 0


def _short(name: str) -> str:
    """A regex-safe piece of a (demangled, templated) kernel name for ncu's filter."""
    base = name.split("(")[0].split("<")[0].split("::")[-1].strip()
    return "".join(c for c in base if c.isalnum() or c == "_") or "."


if __name__ == "__main__":
    sys.exit(main())
