"""Persistent decode megakernel on one GPU, in one call: build, check, time.

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/megakernel.py --out DIR \
        [--nvcc /usr/local/cuda/bin/nvcc] [--batches 1 4 8] [--repeats 9]

(docs/task-abi.md gives the whole device command, with the wheels it carries.)

Sections (each one's failure is recorded and the next still runs):
  build     kernels/persistent/megakernel.cu -> cubin for the GPU's arch, exactly as
            the build gate builds it (rowgate.cuda.cudabuild), build record kept
  ceiling   device-to-device copy bandwidth (bytes read + written), this run
  steps     the probe model (Qwen3, 16 layers, hidden 2048, bf16, fixed seed) at each
            batch: one decode step after a 128-token prefill, in four modes -- eager
            torch, CUDA graph replay, persistent static round-robin, persistent dynamic
            queue -- interleaved A B C D D C B A for --repeats rounds of --steps steps,
            CUDA events; per mode the median step time, the weight bytes per step over
            that time against the copy ceiling, and whether the step's greedy tokens
            equal eager's; then one traced launch per schedule: the per-task timing
            breakdown (counter waits, GEMV, other ops, idle tail; lab/rowgate_lab/megakernel/timeline.py)
  fidelity  teacher-forced numerics, per batch over --fidelity-steps steps: every path
            fed eager's greedy token each step, each on its own copy of the prefilled
            cache; per step the logits of persistent static / dynamic, eager bf16 and
            an fp32 evaluation of the same weights: static == dynamic bitwise, max |d|
            of each pair, argmax agreement, eager's top-2 margin; and the first step
            through the ABI's torch semantics (lab/rowgate_lab/megakernel/interpret.py) on the GPU
            against the kernel. It tells a wiring bug (large |d|, schedule-dependent
            results) from bf16 rounding-order noise (|d| no larger than bf16 vs fp32).
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

MODES = ["eager", "graph", "persistent-static", "persistent-dynamic"]
PROMPT_LEN = 128
DEV = "cuda"
"""Where every tensor lives (the CPU smoke test of this script sets "cpu")."""


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
    """The build gate's cubin (rowgate.cuda.cudabuild: its recipe, warnings as errors, cached),
    with the device's own nvcc; its build record and ptxas report are kept in `out`."""
    from rowgate.cuda.cudabuild import BUILD_RECORD
    from rowgate_lab.ops.megakernel import build_cubin

    cubin = build_cubin(arch, nvcc)
    shutil.copy(cubin, out / cubin.name)
    shutil.copy(cubin.parent / BUILD_RECORD, out / BUILD_RECORD)
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    return {"nvcc": version.strip().splitlines()[-1], "cubin": str(cubin),
            "build_dir": str(cubin.parent)}


def copy_ceiling(dev) -> dict:
    from rowgate.ops import timing

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
    from rowgate_lab.megakernel import models

    return models.build(models.NAMED["probe-qwen3-h2048-l16"])


def prefilled(model, batch: int, decode_steps: int = 1, cache_cls=None):
    """A cache (`cache_cls`, default the reference engine's) holding `batch` seeded
    128-token prompts, and the next step's arguments."""
    from rowgate.engines.qwen3 import PAGE_SIZE, PagedKVCache

    pages = (PROMPT_LEN + decode_steps + PAGE_SIZE) // PAGE_SIZE + 1
    cache = (cache_cls or PagedKVCache)(model.cfg, batch * pages, DEV, model.dtype)
    gen = torch.Generator().manual_seed(batch)
    rows, first = [], []
    with torch.inference_mode():
        for _ in range(batch):
            blocks = [cache.allocate() for _ in range(pages)]
            ids = torch.randint(1, model.cfg.vocab_size, (PROMPT_LEN,), generator=gen)
            slots = [blocks[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE for p in range(PROMPT_LEN)]
            logits = model.prefill(ids.to(DEV), torch.tensor(slots, device=DEV), cache)
            rows.append(blocks)
            first.append(int(logits.argmax()))
    p = PROMPT_LEN
    args = (torch.tensor(first, device=DEV), torch.full((batch,), p, device=DEV),
            torch.tensor([bl[p // PAGE_SIZE] * PAGE_SIZE + p % PAGE_SIZE for bl in rows],
                         device=DEV),
            torch.tensor(rows, device=DEV, dtype=torch.int32),
            torch.full((batch,), p + 1, device=DEV, dtype=torch.int32))
    return cache, args


def step_fns(model, cache, args, cubin: Path) -> dict:
    from rowgate.engines.qwen3 import DecodeGraphs
    from rowgate_lab.megakernel.abi import Schedule
    from rowgate_lab.ops.megakernel import PersistentDecode

    graphs = DecodeGraphs(model)
    graphs.reset(cache)
    batch = args[0].shape[0]
    static = PersistentDecode(model, cache, batch, Schedule.STATIC_ROUND_ROBIN, cubin)
    dynamic = PersistentDecode(model, cache, batch, Schedule.DYNAMIC_QUEUE, cubin)
    return {"eager": lambda: model.decode(*args, cache), "graph": lambda: graphs.run(*args),
            "persistent-static": lambda: static(*args),
            "persistent-dynamic": lambda: dynamic(*args)}, (static, dynamic)


def sm_clock_hz(index: int) -> float:
    """The SM clock now (NVML), for turning the trace's cycles into time."""
    from rowgate.seal import device

    return device.sample_clocks(index, 0.0).sm_clock_mhz * 1e6


def traced_breakdown(step, args) -> dict:
    """One launch with per-task timing: waits (sync), GEMV, other ops, idle tail."""
    from rowgate_lab.megakernel import timeline

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
    from rowgate.engines.qwen3 import Qwen3Model, torch_paged_decode_attention

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


def _clone_cache(cache):
    import copy

    twin = copy.copy(cache)
    twin.k = [k.clone() for k in cache.k]
    twin.v = [v.clone() for v in cache.v]
    return twin


def fidelity_section(cubin: Path, batches: list[int], steps: int) -> dict:
    from rowgate.engines.qwen3 import PAGE_SIZE, Qwen3Model, torch_paged_decode_attention
    from rowgate_lab.megakernel import interpret
    from rowgate_lab.megakernel.abi import Schedule
    from rowgate_lab.ops.megakernel import PersistentDecode, StepBuffers

    info = probe()
    model = Qwen3Model(info.path, DEV, torch.bfloat16, torch_paged_decode_attention)
    model32 = Qwen3Model(info.path, DEV, torch.float32, torch_paged_decode_attention)
    out = {}
    for batch in batches:
        log(f"fidelity batch {batch}")
        cache_e, args = prefilled(model, batch, steps)
        cache_s, cache_d, cache_i = (_clone_cache(cache_e) for _ in range(3))
        # the same prompts in the same pages (prefilled() is seeded by batch and
        # allocates in order), prefilled in fp32; its own first tokens are not used
        cache_f, _ = prefilled(model32, batch, steps)
        static = PersistentDecode(model, cache_s, batch, Schedule.STATIC_ROUND_ROBIN, cubin)
        dynamic = PersistentDecode(model, cache_d, batch, Schedule.DYNAMIC_QUEUE, cubin)
        ids, pos, slots, tables, lens = args
        rows = []
        with torch.inference_mode():
            interp = StepBuffers(model, cache_i, batch, static.sm_count)
            interp.stage(*args)
            interpret.run(interp.plan.tasks, interp.plan.shape, interp.tensors)
            first_interp = interp.logits.clone()
            for step in range(steps):
                a = (ids, pos, slots, tables, lens)
                le = model.decode(*a, cache_e)
                ls, ld = static(*a), dynamic(*a)
                lf = model32.decode(*a, cache_f)
                top = le.topk(2, -1).values
                rows.append({
                    "static_eq_dynamic": bool(torch.equal(ls, ld)),
                    "d_static_eager": float((ls - le).abs().max()),
                    "d_eager_f32": float((le - lf).abs().max()),
                    "d_static_f32": float((ls - lf).abs().max()),
                    "argmax_static_eager": int((ls.argmax(-1) == le.argmax(-1)).sum()),
                    "argmax_eager_f32": int((le.argmax(-1) == lf.argmax(-1)).sum()),
                    "argmax_static_f32": int((ls.argmax(-1) == lf.argmax(-1)).sum()),
                    "eager_margin_min": float((top[:, 0] - top[:, 1]).min()),
                    **({"d_kernel_interp": float((ls - first_interp).abs().max()),
                        "d_interp_eager": float((first_interp - le).abs().max())}
                       if step == 0 else {})})
                ids = le.argmax(-1)  # teacher forcing: everyone gets eager's token
                pos = pos + 1
                lens = lens + 1
                slots = torch.tensor([t[int(p) // PAGE_SIZE] * PAGE_SIZE + int(p) % PAGE_SIZE
                                      for t, p in zip(tables.tolist(), pos.tolist())],
                                     device=DEV)
        n = len(rows) * batch
        out[f"b{batch}"] = {
            "steps": rows,
            "static_eq_dynamic_all": all(r["static_eq_dynamic"] for r in rows),
            "max_d_static_eager": max(r["d_static_eager"] for r in rows),
            "max_d_eager_f32": max(r["d_eager_f32"] for r in rows),
            "max_d_static_f32": max(r["d_static_f32"] for r in rows),
            "argmax_agree_static_eager": sum(r["argmax_static_eager"] for r in rows) / n,
            "argmax_agree_eager_f32": sum(r["argmax_eager_f32"] for r in rows) / n,
            "argmax_agree_static_f32": sum(r["argmax_static_f32"] for r in rows) / n,
            "d_kernel_interp_step0": rows[0]["d_kernel_interp"],
            "d_interp_eager_step0": rows[0]["d_interp_eager"]}
        log(json.dumps({k: v for k, v in out[f"b{batch}"].items() if k != "steps"}))
        del cache_e, cache_s, cache_d, cache_i, cache_f, static, dynamic, interp
        if DEV == "cuda":
            torch.cuda.empty_cache()
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
    ap.add_argument("--out", type=Path, required=True,
                    help="results directory (outside the tree: raw results are never checked in)")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--fidelity-steps", type=int, default=128)
    ap.add_argument("--sections", nargs="+", default=["steps", "fidelity"],
                    choices=["steps", "fidelity"])
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
    if "cubin" in built and "fidelity" in ns.sections:
        section(results, "fidelity", lambda: fidelity_section(Path(built["cubin"]), ns.batches,
                                                              ns.fidelity_steps))
    if "cubin" in built and "steps" in ns.sections:
        section(results, "steps", lambda: steps_section(Path(built["cubin"]), ns.batches,
                                                        ns.steps, ns.repeats, ceiling))
    (ns.out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    table(results)
    return 0 if all("error" not in v for v in results.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
