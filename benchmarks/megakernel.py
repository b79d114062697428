"""Persistent decode megakernel on one GPU, in one call: build, check, time.

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/megakernel.py --out DIR \
        [--nvcc /usr/local/cuda/bin/nvcc] [--batches 1 4 8] [--repeats 9]

(docs/task-abi.md gives the whole device command, with the wheels it carries.)

Sections (each one's failure is recorded and the next still runs):
  build     kernels/persistent/megakernel.cu -> cubin for the GPU's arch with the
            build gate's warning flags (warnings are errors), ptxas report kept
  ceiling   device-to-device copy bandwidth (bytes read + written), this run
  steps     the probe model (Qwen3, 16 layers, hidden 2048, bf16, fixed seed) at each
            batch: one decode step after a 128-token prefill, in four modes -- eager
            torch, CUDA graph replay, persistent static round-robin, persistent dynamic
            queue -- interleaved A B C D D C B A for --repeats rounds of --steps steps,
            CUDA events; per mode the median step time, the weight bytes per step over
            that time against the copy ceiling, and whether the step's greedy tokens
            equal eager's; then one traced launch per schedule: the per-task timing
            breakdown (counter waits, GEMV, other ops, idle tail; pipeline/megakernel/timeline.py)
Everything lands in DIR/results.json; a short table is printed last.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SOURCE = REPO / "kernels" / "persistent" / "megakernel.cu"
MODES = ["eager", "graph", "persistent-static", "persistent-dynamic"]
PROMPT_LEN = 128


def log(*parts) -> None:
    print(*parts, flush=True)


def section(results: dict, name: str, fn):
    log(f"== {name}")
    try:
        results[name] = fn()
    except Exception as exc:  # a benchmark records a broken section and goes on
        results[name] = {"error": f"{type(exc).__name__}: {exc}",
                         "traceback": traceback.format_exc()}
        log(results[name]["traceback"])
    return results[name]


def build(nvcc: str, arch: str, out: Path) -> dict:
    """The build gate's nvcc flags (pipeline/cudabuild.py), cubin only."""
    cubin = out / f"persistent_decode.{arch}.cubin"
    sm = arch.removeprefix("sm_")
    argv = [nvcc, "-cubin", "-o", str(cubin), str(SOURCE), "-std=c++17",
            f"-I{REPO / 'kernels' / 'include'}", f"-gencode=arch=compute_{sm},code=sm_{sm}",
            "-Werror", "all-warnings", "-Xptxas", "-v,-warn-spills,-warn-lmem-usage",
            "-Xcompiler", "-Wall,-Wextra,-Werror"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    (out / "build.log").write_text(proc.stdout + proc.stderr)
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    if proc.returncode != 0:
        raise RuntimeError(f"nvcc exited {proc.returncode}: {proc.stderr.strip()[:400]}")
    return {"argv": argv, "nvcc": version.strip().splitlines()[-1], "cubin": str(cubin),
            "ptxas": [line for line in proc.stderr.splitlines() if "ptxas info" in line]}


def copy_ceiling(dev) -> dict:
    from pipeline.ops import timing

    n = 1 << 29
    src = torch.randint(0, 1 << 30, (n,), dtype=torch.int32, device=dev)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    samples = [timing.event_time_us(lambda: dst.copy_(src), None) for _ in range(15)]
    med = statistics.median(samples)
    return {"bytes": 2 * n * 4, "samples_us": samples, "median_us": med,
            "bytes_per_s": 2 * n * 4 / med * 1e6}


def probe():
    from pipeline.megakernel import models

    return models.build(models.NAMED["probe-qwen3-h2048-l16"])


def prefilled(model, batch: int):
    from pipeline.engines.reference import PAGE_SIZE, PagedKVCache

    pages = (PROMPT_LEN + PAGE_SIZE) // PAGE_SIZE + 1
    cache = PagedKVCache(model.cfg, batch * pages, "cuda", model.dtype)
    gen = torch.Generator().manual_seed(batch)
    rows, first = [], []
    with torch.inference_mode():
        for _ in range(batch):
            blocks = [cache.allocate() for _ in range(pages)]
            ids = torch.randint(1, model.cfg.vocab_size, (PROMPT_LEN,), generator=gen)
            slots = [blocks[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE for p in range(PROMPT_LEN)]
            logits = model.prefill(ids.cuda(), torch.tensor(slots, device="cuda"), cache)
            rows.append(blocks)
            first.append(int(logits.argmax()))
    p = PROMPT_LEN
    args = (torch.tensor(first, device="cuda"), torch.full((batch,), p, device="cuda"),
            torch.tensor([bl[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE for bl in rows],
                         device="cuda"),
            torch.tensor(rows, device="cuda", dtype=torch.int32),
            torch.full((batch,), p + 1, device="cuda", dtype=torch.int32))
    return cache, args


def step_fns(model, cache, args, cubin: Path) -> dict:
    from pipeline.engines.reference import _DecodeGraphs
    from pipeline.megakernel.abi import Schedule
    from pipeline.ops.megakernel import PersistentDecode

    graphs = _DecodeGraphs(model)
    graphs.reset(cache)
    batch = args[0].shape[0]
    static = PersistentDecode(model, cache, batch, Schedule.STATIC_ROUND_ROBIN, cubin)
    dynamic = PersistentDecode(model, cache, batch, Schedule.DYNAMIC_QUEUE, cubin)
    return {"eager": lambda: model.decode(*args, cache), "graph": lambda: graphs.run(*args),
            "persistent-static": lambda: static(*args),
            "persistent-dynamic": lambda: dynamic(*args)}, (static, dynamic)


def sm_clock_hz(index: int) -> float:
    """The SM clock now (NVML), for turning the trace's cycles into time."""
    from pipeline import device

    return device.sample_clocks(index, 0.0).sm_clock_mhz * 1e6


def traced_breakdown(step, args) -> dict:
    """One launch with per-task timing: waits (sync), GEMV, other ops, idle tail."""
    from pipeline.megakernel import timeline

    trace = step.traced(*args)
    torch.cuda.synchronize()
    hz = sm_clock_hz(step.device.index or 0)
    return {"sm_clock_hz": hz, **timeline.breakdown(trace, step.plan.tasks, hz, step.sm_count)}


def time_steps(fns: dict, steps: int, repeats: int) -> dict[str, list[float]]:
    """Per mode, `repeats` samples of the mean step time (us) over `steps` steps, modes
    interleaved A B C D D C B A so drift lands on every mode alike."""
    samples: dict[str, list[float]] = {m: [] for m in fns}
    for r in range(repeats):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                fns[mode]()
            end.record()
            end.synchronize()
            samples[mode].append(start.elapsed_time(end) * 1e3 / steps)
    return samples


def steps_section(cubin: Path, batches: list[int], steps: int, repeats: int,
                  ceiling: float) -> dict:
    from pipeline.engines.reference import Qwen3Model, torch_paged_decode_attention

    info = probe()
    model = Qwen3Model(info.path, "cuda", torch.bfloat16, torch_paged_decode_attention)
    weight_bytes = sum(t.numel() * t.element_size() for k, t in model.w.items()
                       if k != "model.embed_tokens.weight")  # one embedding row per token
    out = {"model": str(info.path), "digest": info.digest, "weight_bytes": weight_bytes}
    for batch in batches:
        log(f"batch {batch}")
        cache, args = prefilled(model, batch)
        with torch.inference_mode():
            fns, (static, dynamic) = step_fns(model, cache, args, cubin)
            plan = static.plan.summary()
            want = fns["eager"]().argmax(-1).tolist()
            tokens = {m: fns[m]().argmax(-1).tolist() for m in MODES}
            for fn in fns.values():  # warm-up
                fn()
            torch.cuda.synchronize()
            samples = time_steps(fns, steps, repeats)
            breakdown = {}
            for name, step in (("persistent-static", static), ("persistent-dynamic", dynamic)):
                try:
                    breakdown[name] = traced_breakdown(step, args)
                except Exception as exc:  # recorded; the timings above stand
                    breakdown[name] = {"error": f"{type(exc).__name__}: {exc}"}
        rec = {"plan": plan, "tokens_equal_eager": {m: tokens[m] == want for m in MODES},
               "breakdown": breakdown, "modes": {}}
        for m in MODES:
            med = statistics.median(samples[m])
            rec["modes"][m] = {"samples_us": samples[m], "median_us": med,
                               "bandwidth_fraction": weight_bytes / (med * 1e-6) / ceiling
                               if ceiling else None}
        g, p = rec["modes"]["graph"]["median_us"], rec["modes"]["persistent-dynamic"]["median_us"]
        rec["persistent_dynamic_vs_graph"] = g / p
        out[f"b{batch}"] = rec
    return out


def table(results: dict) -> None:
    steps = results.get("steps", {})
    for key, rec in steps.items():
        if not key.startswith("b"):
            continue
        log(f"{key}: " + "  ".join(
            f"{m} {v['median_us']:.0f} us ({v['bandwidth_fraction'] or 0:.0%} of copy ceiling, "
            f"tokens {'=' if rec['tokens_equal_eager'][m] else '!='} eager)"
            for m, v in rec["modes"].items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "megakernel")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=9)
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    major, minor = torch.cuda.get_device_capability(dev)
    arch = f"sm_{major}{minor}"
    results: dict = {"device": torch.cuda.get_device_name(dev), "arch": arch,
                     "torch": torch.__version__,
                     "commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                              capture_output=True, text=True).stdout.strip()}
    built = section(results, "build", lambda: build(ns.nvcc, arch, ns.out))
    ceiling = section(results, "ceiling", lambda: copy_ceiling(dev)).get("bytes_per_s", 0.0)
    if "cubin" in built:
        section(results, "steps", lambda: steps_section(Path(built["cubin"]), ns.batches,
                                                        ns.steps, ns.repeats, ceiling))
    (ns.out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    table(results)
    return 0 if all("error" not in v for v in results.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
