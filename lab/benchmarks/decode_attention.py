"""Paged decode attention on one GPU, in one call: build, prove, attribute, time.

    PYTHONUNBUFFERED=1 PYTHONPATH=. python3 benchmarks/decode_attention.py --out DIR \
        [--nvcc /usr/local/cuda/bin/nvcc] [--row rows/SM70-XQA-E5M2-DECODE.toml]

Sections (each one's failure is recorded and the next still runs):
  build     split_kv.cu for the device's arch, plus the RG_PHASE timing variants and the
            deep candidate's timing-only ablations (ABLATIONS below)
  ceiling   device-to-device copy bandwidth (bytes read + written), this run
  operator  the row's operator gate cases (randomized pages, poison, bitwise A/B,
            fp64 reference) -> DIR/operator/{cases.json.gz,cases.csv.gz,timing.json},
            the same raw artifacts the operator gate writes (--candidate picks the
            operator: e5m2_bulk runs kernels.toml's split_kv_bulk, `_bulk` against
            `_base`, e5m2_deep its split_kv_deep, `_deep` against `_base`; else
            split_kv); operator_bf16 the same matrix on bf16 KV,
            operator_g2 on bf16 GQA groups of 2 (16/8 heads)
  bench     FP8/bf16 B16x16K and FP8 B1x1K: split_kv baseline, ring (pipelined), bulk
            and deep candidates, torch SDPA on
            dense bf16 KV, the naive path (dequantise to bf16, then SDPA), interleaved
            in rotated order, L2 flushed / inputs rotated; at B1x1K also the launch
            floor (a graph of one small zero-fill kernel per call), the deep candidate
            without its cluster and its timing-only ablations
  phase     B16 ragged 17.8K E5M2: leave-one-out / do-twice variants of each phase
  ncu       hardware counters for the target shapes (--clock-control none)
Everything lands in DIR/results.json; a short table is printed last.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

from rowgate.ops import operator_ab, reference, timing
from rowgate.ops.cases import Case, cases
from rowgate.ops.paged_inputs import make_inputs
from rowgate.ops.sandboxed import InProcess
from rowgate_lab.ops import split_kv as op

REPO = Path(__file__).resolve().parents[1]  # the lab
ROWS = REPO.parent / "rows"  # the campaign's rows, at the checkout's root

SOURCE = REPO / "kernels" / "decode_attention" / "split_kv.cu"
PHASES = {0: "full", 1: "no_k_load", 2: "no_v_load", 3: "qk_x2", 4: "pv_x2",
          5: "convert_x2", 6: "no_sync", 7: "no_smem_publish"}
ABLATIONS = {"abl_nomerge": ["RG_DEEP_ABLATE=1"], "abl_nokv": ["RG_DEEP_ABLATE=2"],
             "abl_prologue": ["RG_DEEP_ABLATE=3"]}
"""Timing-only builds of the deep candidate for B1x1K's attribution (split_kv.cu's
RG_DEEP_ABLATE: no cluster merge, no K/V copies, the prologue alone)."""


def deep_stages(kv: str, dim: int, group: int) -> int:
    """split_kv.cu's DeepCfg::S: three stages for E5M2 D128 up to G4, else two."""
    return 3 if kv == "e5m2" and dim == 128 and group <= 4 else 2


def deep_ring_bytes(kv: str, dim: int, stages: int | None = None, group: int = 4) -> int:
    """The deep candidate's warps' rings (split_kv.cu's DeepCfg, line for line): 8 warps x
    `stages` stages (the build's: deep_stages) x one 16-token tile. kernels.toml's
    split_kv_deep rules declare them (tests check they agree)."""
    stages = stages or deep_stages(kv, dim, group)
    return 8 * stages * 4 * 32 * dim // 8 * (1 if kv == "e5m2" else 2)


def deep_landing_bytes(dim: int, group: int) -> int:
    """`_deepc`'s landing area in split 0 (split_kv.cu's push_partial): the cluster's 8
    split states of 2G + G x D floats."""
    return 8 * (2 * group + group * dim) * 4


SM90_CANDIDATES = ("bulk", "deep")
"""Candidates of rowgate's sm_90+ operators (split_kv_bulk, split_kv_deep), each checked
against the baseline of its own operator's plan."""
OPERATOR_DEFAULTS = dict(batches=[1, 4, 8, 12, 16], layouts=["uniform", "ragged"],
                         contexts=["1", "page-1", "page", "page+1", "1024", "16384", "17.8K"],
                         page_sizes=[16, 64], kv_dtypes=["bf16", "e5m2"],
                         heads=[[32, 8], [8, 1]], head_dims=[128, 64], seeds=[0, 1],
                         timing_repeats=9)


def log(*parts) -> None:
    print(*parts, flush=True)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def spread(xs):
    """(min, max, IQR) of samples."""
    if len(xs) < 2:
        return {"min": min(xs, default=None), "max": max(xs, default=None), "iqr": None}
    q = statistics.quantiles(xs, n=4)
    return {"min": min(xs), "max": max(xs), "iqr": q[2] - q[0]}


# --------------------------------------------------------------------- build

def nvcc_cmd(nvcc: str, arch: str, out: Path, defines: list[str]) -> list[str]:
    num = re.sub(r"\D", "", arch)
    return [nvcc, "-cubin", f"-gencode=arch=compute_{num},code={arch}", "-O3", "-std=c++17",
            "-Xptxas", "-v", "-Werror", "all-warnings", "-I", str(op.INCLUDE),
            *[f"-D{d}" for d in defines],
            "-o", str(out), str(SOURCE)]


def build(nvcc: str, arch: str, build_dir: Path, out: Path) -> dict:
    jobs = {"main": (op.cubin_path(arch, build_dir), [])}
    for n in PHASES:
        jobs[f"phase{n}"] = (build_dir / "phase" / f"split_kv.phase{n}.{arch}.cubin",
                             [f"RG_PHASE={n}", "RG_ONLY_E5M2_D128_G4"])
    for name, defines in ABLATIONS.items():
        jobs[name] = (build_dir / "deep" / f"split_kv.{name}.{arch}.cubin", defines)
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    logs, rec = [], {"nvcc": nvcc, "nvcc_version": version.strip().splitlines()[-1], "cubins": {}}

    def one(item):
        name, (path, defines) = item
        path.parent.mkdir(parents=True, exist_ok=True)
        cmd = nvcc_cmd(nvcc, arch, path, defines)
        p = subprocess.run(cmd, capture_output=True, text=True)
        return name, path, cmd, p

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        for name, path, cmd, p in pool.map(one, jobs.items()):
            logs.append(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}")
            if p.returncode != 0:
                raise RuntimeError(f"build {name} failed:\n{p.stderr[-3000:]}")
            rec["cubins"][name] = str(path)
    rec["log"] = "\n".join(logs)
    regs = re.findall(r"Compiling entry function '(\w+)'.*?\n.*?\n.*?Used (\d+) registers",
                      logs[0], re.S)
    rec["registers"] = {k: int(v) for k, v in regs}
    return rec


# ------------------------------------------------------------------- ceiling

def copy_ceiling(dev) -> dict:
    n = 1 << 29  # 2 GiB of int32
    src = torch.randint(0, 1 << 30, (n,), dtype=torch.int32, device=dev)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    samples = [timing.event_time_us(lambda: dst.copy_(src), None) for _ in range(15)]
    bytes_moved = 2 * n * 4
    med = median(samples)
    return {"bytes": bytes_moved, "samples_us": samples, "median_us": med,
            "tb_per_s": bytes_moved / med / 1e6}


# ------------------------------------------------------------------ operator

def operator_spec(row_path: Path, **overrides) -> SimpleNamespace:
    data = tomllib.loads(row_path.read_text())
    gate = next(g for g in data["gates"] if g["kind"] == "operator")
    spec = {**OPERATOR_DEFAULTS, **gate, **overrides}
    tol = spec.get("tolerance", {})
    spec["tolerance"] = SimpleNamespace(rtol=tol.get("rtol", 1e-2), atol=tol.get("atol", 1e-2))
    return SimpleNamespace(**spec)


def run_operator(spec, cubin: Path, dev, out: Path, label: str) -> dict:
    """The operator gate's cases on the lab's operator the spec's candidate names
    (rowgate_lab.ops.split_kv.operator_of: `*_bulk` -> split_kv_bulk)."""
    out.mkdir(parents=True, exist_ok=True)
    operator = op.operator_of(getattr(spec, "candidate", "") or "candidate", op.SPLIT_KV)
    records = []
    all_cases = cases(spec)
    operator_ab.check_expressible(operator, all_cases)
    t0 = time.time()
    child = InProcess()  # the lab's own kernels, measured by the lab: no sandbox needed
    for i, case in enumerate(all_cases):
        records.append(operator_ab.run_case(case, spec, cubin, dev, order_flip=bool(i % 2),
                                            operator=operator, child=child))
    timing_rec = operator_ab.time_variants(spec, cubin, operator, child=child)
    operator_ab.write_records(out, records, timing_rec)
    bad = [r for r in records if r["bitwise"]["mismatches"] or any(
        v["failures"] or v["unwritten"] or v["nan"] for v in r["variants"].values())]
    return {"label": label, "operator": operator.name, "cases": len(records),
            "seconds": round(time.time() - t0, 1),
            "bitwise_mismatches": sum(r["bitwise"]["mismatches"] for r in records),
            "bad_cases": len(bad), "first_bad": bad[0] if bad else None,
            "max_abs_err": max(v["max_abs_err"] or 0 for r in records
                               for v in r["variants"].values()),
            "timing": {k: {v: median(s) for v, s in rec["samples_us"].items()}
                       for k, rec in timing_rec["shapes"].items()}}


# --------------------------------------------------------------------- smoke

def done_within(dev, seconds: float) -> bool:
    """Whether the work queued on the device finishes within `seconds` (a kernel that
    never finishes, e.g. a producer/consumer mbarrier wait that never completes, would
    otherwise hang the whole call)."""
    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(dev))
    t0 = time.time()
    while not ev.query():
        if time.time() - t0 > seconds:
            return False
        time.sleep(0.01)
    return True


def smoke(cubin: Path, dev, out: Path, results: dict) -> dict:
    """One launch of every sm_90+ candidate family before anything is timed, against the
    baseline of the same operator and plan (split_kv_bulk, split_kv_deep); a launch that
    does not finish ends the process (the results so far are written first)."""
    shapes = [("e5m2", 16, 16384, 32, 8, 128, 64), ("e5m2", 1, 1024, 32, 8, 128, 64),
              ("bf16", 16, 16384, 32, 8, 128, 64), ("bf16", 4, 1000, 16, 8, 128, 16),
              ("e5m2", 4, 700, 8, 1, 64, 16), ("bf16", 1, 70, 16, 8, 64, 16)]
    rec = {}
    for kv, batch, ctx, hq, hkv, dim, page in shapes:
        case = Case(3, batch, "uniform", str(ctx), page, kv, hq, hkv, dim, [ctx] * batch)
        inp = make_inputs(case, dev)
        ref = reference.decode_attention_fp64(inp.q, inp.k_cache, inp.v_cache, inp.block_table,
                                              inp.seq_lens, k_scale=inp.k_scale,
                                              v_scale=inp.v_scale)
        for cand in SM90_CANDIDATES:
            outs = {}
            for variant in ("baseline", cand):
                planned = op.DecodeAttention(inp.q, inp.k_cache, inp.v_cache, inp.block_table,
                                             inp.seq_lens, max_seq_len=ctx, cubin=cubin,
                                             k_scale=inp.k_scale, v_scale=inp.v_scale,
                                             variant=variant, operator=op.OWN_VARIANTS[cand])
                outs[variant] = planned.run(inp.q, inp.k_cache, inp.v_cache, inp.block_table,
                                            inp.seq_lens)
                name = f"{kv} B{batch}x{ctx} {hq}/{hkv} d{dim} p{page} {planned.kernel}"
                if not done_within(dev, 10.0):
                    rec[name] = "did not finish in 10 s"
                    results["smoke"] = rec
                    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
                    log(f"[smoke] {name} did not finish: stopping")
                    os._exit(3)
            rec[name] = {"bitwise_equal": bool(torch.equal(outs[cand].view(torch.int16),
                                                           outs["baseline"].view(torch.int16))),
                         "max_abs_err_vs_fp64": float((outs[cand].double() - ref).abs().max())}
    return rec


# --------------------------------------------------------------------- bench

def dense_bf16(batch, hkv, length, dim, dev, gen):
    k = torch.randn((batch, hkv, length, dim), generator=gen, device=dev).to(torch.bfloat16)
    v = torch.randn((batch, hkv, length, dim), generator=gen, device=dev).to(torch.bfloat16)
    return k, v


def bench_large(cubin: Path, dev, repeats: int, ceiling: float) -> dict:
    """B16 x 16K, GQA 32/8, D128, page 64: every path, interleaved in rotated order."""
    batch, length, hq, hkv, dim = 16, 16384, 32, 8, 128
    fp8 = make_inputs(Case(7, batch, "uniform", str(length), 64, "e5m2", hq, hkv, dim,
                           [length] * batch), dev)
    bf = make_inputs(Case(7, batch, "uniform", str(length), 64, "bf16", hq, hkv, dim,
                          [length] * batch), dev)
    gen = torch.Generator(device=dev).manual_seed(11)
    dk, dvv = dense_bf16(batch, hkv, length, dim, dev, gen)
    out = torch.empty_like(fp8.q)

    def split(inp, variant, operator=op.SPLIT_KV, cub=cubin):
        args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
        planned = op.DecodeAttention(*args, max_seq_len=length, cubin=cub,
                                     k_scale=inp.k_scale, v_scale=inp.v_scale, variant=variant,
                                     operator=operator)
        return lambda: planned.run(*args, out=out)

    fns = {"e5m2_baseline": split(fp8, "baseline"), "e5m2_pipelined": split(fp8, "pipelined"),
           "e5m2_bulk": split(fp8, "bulk"), "e5m2_deep": split(fp8, "deep"),
           "bf16_baseline": split(bf, "baseline"), "bf16_pipelined": split(bf, "pipelined"),
           "bf16_bulk": split(bf, "bulk"), "bf16_deep": split(bf, "deep"),
           "sdpa_bf16_dense": lambda: reference.dense_sdpa(bf.q, dk, dvv),
           "naive_dequant_sdpa": lambda: reference.naive_dequant_sdpa(
               fp8.q, fp8.k_cache, fp8.v_cache, fp8.block_table, length,
               k_scale=fp8.k_scale, v_scale=fp8.v_scale)}
    fns.update(sdpa_backends(lambda: reference.dense_sdpa(bf.q, dk, dvv)))
    operators = {"bulk": (op.SPLIT_KV_BULK, cubin), "deep": (op.SPLIT_KV_DEEP, cubin)}
    # accuracy of the timed paths on this shape (SDPA paths against their own inputs)
    ref8 = reference.decode_attention_fp64(fp8.q, fp8.k_cache, fp8.v_cache, fp8.block_table,
                                           fp8.seq_lens, k_scale=fp8.k_scale,
                                           v_scale=fp8.v_scale)
    acc, outs = {}, {}
    for name in [n for n in fns if n.startswith("e5m2_")] + ["naive_dequant_sdpa"]:
        outs[name] = fns[name]().clone()
        acc[name] = float((outs[name].double() - ref8).abs().max())
    # each sm_90+ candidate against the baseline of its own operator's
    # plan, from its own cubin (split_kv_bulk: split_kv's chunk; split_kv_deep: up to 1024)
    bits = {}
    for kv, inp in (("e5m2", fp8), ("bf16", bf)):
        for name in fns:
            variant = name.split("_", 1)[1] if name.startswith(kv + "_") else ""
            if variant in operators:
                oper, cub = operators[variant]
                base = split(inp, "baseline", oper, cub)().view(torch.int16).clone()
                bits[name] = bool(torch.equal(fns[name]().view(torch.int16), base))
    samples = timing.interleaved(fns, repeats=repeats, device=dev, flush=True)
    kv_bytes = {"e5m2": batch * length * hkv * dim * 2, "bf16": batch * length * hkv * dim * 4}
    res = {"shape": "B16x16384 GQA32/8 D128 page64", "max_abs_err_vs_fp64": acc,
           "bitwise_equal_to_baseline": bits, "order": samples["order"], "variants": {}}
    for name, s in samples["samples_us"].items():
        nbytes = kv_bytes["e5m2" if name.startswith(("e5m2", "naive")) else "bf16"]
        med = median(s)
        res["variants"][name] = {"samples_us": s, "median_us": med, **spread(s),
                                 "kv_bytes": nbytes, "tb_per_s": nbytes / med / 1e6,
                                 "pct_of_copy": 100 * nbytes / med / 1e6 / ceiling}
    return res


def sdpa_backends(call) -> dict:
    """`call` (torch SDPA) pinned to each backend that takes it: {"sdpa_bf16_dense_<backend>":
    fn}. The bf16 bar's comparison point is the fastest of them and of SDPA's own dispatch,
    which has run in a slow mode in some processes (docs/perf.md)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fns = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.CUDNN_ATTENTION):
        def fn(backend=backend):
            with sdpa_kernel(backend):
                return call()
        try:
            fn()
        except RuntimeError as exc:  # this backend does not take the shape: not timed
            log(f"sdpa {backend.name}: not available here ({str(exc).splitlines()[0][:120]})")
            continue
        fns[f"sdpa_bf16_dense_{backend.name.lower()}"] = fn
    return fns


def bench_small(cubin: Path, dev, repeats: int, ablations: dict[str, Path] | None = None) -> dict:
    """B1 x 1K FP8: GPU time from graph replay over rotated inputs (several
    times L2 in total), and wall time per call including the launch; the deep candidate
    also without its cluster (the ticket and staged merge) and, with `ablations` ({name:
    cubin}, RG_DEEP_ABLATE builds: timing only), with parts of it left out."""
    length, hq, hkv, dim, n_inputs = 1024, 32, 8, 128, 48
    inputs = [make_inputs(Case(100 + i, 1, "uniform", str(length), 64, "e5m2", hq, hkv, dim,
                               [length]), dev) for i in range(n_inputs)]
    gen = torch.Generator(device=dev).manual_seed(5)
    dense = [dense_bf16(1, hkv, length, dim, dev, gen) for _ in range(n_inputs)]
    outs = [torch.empty_like(x.q) for x in inputs]
    state = {"i": 0}
    def plan(variant, cub=cubin, operator=op.SPLIT_KV):
        x = inputs[0]
        return op.DecodeAttention(x.q, x.k_cache, x.v_cache, x.block_table, x.seq_lens,
                                  max_seq_len=length, cubin=cub, k_scale=x.k_scale,
                                  v_scale=x.v_scale, variant=variant, operator=operator)

    plans = {v: plan(v) for v in ("baseline", "pipelined", "bulk", "deep")}
    plans["deep_ticket"] = plan("deep", operator=dataclasses.replace(op.SPLIT_KV_DEEP, launch=()))
    for name, cub in (ablations or {}).items():
        plans[name] = plan("deep", cub)
    for planned in plans.values():  # the graphs capture every input: validated beforehand
        for x in inputs:
            planned.admit(x.block_table, x.seq_lens)

    def call(variant):
        planned = plans[variant]

        def fn():
            i = state["i"] = (state["i"] + 1) % n_inputs
            x = inputs[i]
            return planned.run(x.q, x.k_cache, x.v_cache, x.block_table, x.seq_lens, outs[i])
        return fn

    def unplanned():
        i = state["i"] = (state["i"] + 1) % n_inputs
        x = inputs[i]
        return op.decode_attention(x.q, x.k_cache, x.v_cache, x.block_table, x.seq_lens,
                                   max_seq_len=length, cubin=cubin, k_scale=x.k_scale,
                                   v_scale=x.v_scale, out=outs[i])

    def sdpa():
        i = state["i"] = (state["i"] + 1) % n_inputs
        return reference.dense_sdpa(inputs[i].q, *dense[i])

    def floor():  # the launch floor: one small kernel per call, no memory to wait on
        i = state["i"] = (state["i"] + 1) % n_inputs
        return outs[i].zero_()

    fns = {"e5m2_baseline": call("baseline"), "e5m2_pipelined": call("pipelined"),
           "e5m2_bulk": call("bulk"), "e5m2_deep": call("deep"), "sdpa_bf16_dense": sdpa,
           "floor_zero_kernel": floor}
    fns.update({f"e5m2_{n}": call(n) for n in plans if n.startswith(("deep_", "abl_"))})
    res = {"shape": "B1x1024 GQA32/8 D128 page64 e5m2", "rotating_inputs": n_inputs,
           "bulk_kernel": plans["bulk"].kernel, "deep_kernel": plans["deep"].kernel,
           "launcher": "cuLaunchKernel" if plans["baseline"].launcher.raw is not None
           else "cuda.core launch", "variants": {}}
    names = list(fns)
    graph = {n: [] for n in names}
    wall = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            graph[n].extend(timing.graph_replay_us(fns[n], device=dev, launches=n_inputs,
                                                   replays=3))
            for _ in range(20):
                fns[n]()
            torch.cuda.synchronize(dev)
            calls = 400
            t0 = time.perf_counter()
            for _ in range(calls):
                fns[n]()
            torch.cuda.synchronize(dev)
            wall[n].append((time.perf_counter() - t0) / calls * 1e6)
    for _ in range(20):
        unplanned()
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    for _ in range(400):
        unplanned()
    torch.cuda.synchronize(dev)
    res["unplanned_call_us"] = (time.perf_counter() - t0) / 400 * 1e6
    # where a call's host time goes: the launch alone, and torch's own launch
    launcher, x = plans["baseline"].launcher, inputs[0]
    ptrs = (x.q.data_ptr(), x.k_cache.data_ptr(), x.v_cache.data_ptr(),
            x.block_table.data_ptr(), x.seq_lens.data_ptr(), outs[0].data_ptr(),
            plans["baseline"].ws_acc.data_ptr(), plans["baseline"].ws_ml.data_ptr(),
            plans["baseline"].counters.data_ptr())
    stream = torch.cuda.current_stream(dev).cuda_stream
    for name, fn in (("launch_only_us", lambda: launcher(stream, ptrs)),
                     ("torch_zero_launch_us", lambda: outs[0].zero_())):
        for _ in range(20):
            fn()
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(400):
            fn()
        torch.cuda.synchronize(dev)
        res[name] = (time.perf_counter() - t0) / 400 * 1e6
    for n in names:
        res["variants"][n] = {"gpu_us_graph_samples": graph[n], "gpu_us_median": median(graph[n]),
                              "gpu_spread": spread(graph[n]), "call_us_samples": wall[n],
                              "call_us_median": median(wall[n]), "call_spread": spread(wall[n])}
    return res


# --------------------------------------------------------------------- phase

def phase_attribution(build_rec: dict, dev, repeats: int) -> dict:
    """B16 ragged 17.8K E5M2 (GQA 32/8, D128, page 64): each RG_PHASE variant of
    both kernels, interleaved, L2 flushed."""
    from rowgate.ops.cases import context_tokens, seq_lengths
    ctx = context_tokens("17.8K", 64)
    lens = seq_lengths("ragged", ctx, 16, 0)
    case = Case(0, 16, "ragged", "17.8K", 64, "e5m2", 32, 8, 128, lens)
    inp = make_inputs(case, dev)
    out = torch.empty_like(inp.q)
    fns = {}
    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    for n, name in PHASES.items():
        cub = Path(build_rec["cubins"][f"phase{n}"])
        for variant in ("baseline", "pipelined"):
            planned = op.DecodeAttention(*args, max_seq_len=ctx, cubin=cub, k_scale=inp.k_scale,
                                         v_scale=inp.v_scale, variant=variant)
            fns[f"{variant}:{name}"] = functools.partial(planned.run, *args, out=out)
    samples = timing.interleaved(fns, repeats=repeats, device=dev, flush=True)
    med = {k: median(v) for k, v in samples["samples_us"].items()}
    res = {"shape": f"B16 ragged max {ctx} (lens {lens}) e5m2 GQA32/8 D128 page64",
           "kv_bytes": sum(lens) * 8 * 128 * 2, "medians_us": med,
           "samples_us": samples["samples_us"], "attribution_us": {}}
    for variant in ("baseline", "pipelined"):
        full = med[f"{variant}:full"]
        res["attribution_us"][variant] = {
            "full": full,
            "k_load_exposed (full - no_k_load)": full - med[f"{variant}:no_k_load"],
            "v_load_exposed (full - no_v_load)": full - med[f"{variant}:no_v_load"],
            "qk (qk_x2 - full)": med[f"{variant}:qk_x2"] - full,
            "pv (pv_x2 - full)": med[f"{variant}:pv_x2"] - full,
            "convert (convert_x2 - full)": med[f"{variant}:convert_x2"] - full,
            "sync (full - no_sync)": full - med[f"{variant}:no_sync"],
            "smem_publish (full - no_smem_publish)": full - med[f"{variant}:no_smem_publish"],
        }
    return res


# ----------------------------------------------------------------------- ncu

NCU_METRICS = ",".join([
    "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smsp__warps_eligible.avg.per_cycle_active",
    "smsp__average_warp_latency_issue_stalled_long_scoreboard",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed.avg.per_cycle_active", "smsp__inst_executed.sum",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
    "launch__registers_per_thread", "launch__occupancy_limit_registers",
    "sm__maximum_warps_per_active_cycle_pct",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "lts__t_sectors_srcunit_tex_op_read.sum",
    # where a request queues between the SM and DRAM, and the shared-memory pipe
    "lts__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_sector_hit_rate.pct",
    "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "launch__waves_per_multiprocessor", "sm__cycles_active.avg",
    "breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "breakdown:l1tex__throughput.avg.pct_of_peak_sustained_active",
])


def ncu_target(cubin: Path, dev) -> None:
    """What ncu profiles: one launch of each variant on the two target shapes."""
    from rowgate.ops.cases import context_tokens, seq_lengths
    shapes = [Case(7, 16, "uniform", "16384", 64, "e5m2", 32, 8, 128, [16384] * 16),
              Case(0, 16, "ragged", "17.8K", 64, "e5m2", 32, 8, 128,
                   seq_lengths("ragged", context_tokens("17.8K", 64), 16, 0)),
              Case(7, 1, "uniform", "1024", 64, "e5m2", 32, 8, 128, [1024]),
              Case(7, 16, "uniform", "16384", 64, "bf16", 32, 8, 128, [16384] * 16)]
    for case in shapes:
        inp = make_inputs(case, dev)
        for variant in ("baseline", "pipelined", "bulk", "deep"):
            op.decode_attention(inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens,
                                max_seq_len=max(case.lens), cubin=cubin, k_scale=inp.k_scale,
                                v_scale=inp.v_scale, variant=variant)
        torch.cuda.synchronize(dev)


def run_ncu(out: Path, cubin: Path) -> dict:
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    csv_path = out / "ncu.csv"
    cmd = [ncu, "--clock-control", "none", "--kernel-name", "regex:split_kv", "--metrics",
           NCU_METRICS, "--csv", "--page", "raw", sys.executable, __file__, "--ncu-target",
           "--cubin", str(cubin)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400,
                       env={**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"})
    text = p.stdout
    start = text.find('"ID"')
    csv_path.write_text(text[start:] if start >= 0 else text + "\n" + p.stderr)
    return {"returncode": p.returncode, "command": cmd, "stderr_tail": p.stderr[-2000:]}


# ---------------------------------------------------------------------- main

def section(results: dict, name: str, fn):
    t0 = time.time()
    try:
        results[name] = fn()
        log(f"[{name}] ok in {time.time() - t0:.1f}s")
    except Exception:  # noqa: BLE001 - a broken section is recorded, the next one runs
        results[name] = {"error": traceback.format_exc()}
        log(f"[{name}] FAILED in {time.time() - t0:.1f}s\n{traceback.format_exc()}")
    return results[name]


def environment(dev) -> dict:
    import importlib.metadata as md
    env = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
           "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "python": sys.version.split()[0],
           "sm_count": torch.cuda.get_device_properties(dev).multi_processor_count}
    for dist in ("cuda-core", "cuda-bindings", "cuda-python", "numpy"):
        try:
            env[dist] = md.version(dist)
        except md.PackageNotFoundError:
            env[dist] = None
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.mem,"
                          "clocks.max.sm,temperature.gpu,power.draw", "--format=csv,noheader"],
                         capture_output=True, text=True)
    env["nvidia_smi"] = smi.stdout.strip()
    return env


def summary(results: dict) -> None:
    log("\n===== summary =====")
    c = results.get("ceiling", {})
    if "tb_per_s" in c:
        log(f"copy ceiling: {c['tb_per_s']:.3f} TB/s ({c['median_us']:.1f} us for 4 GiB moved)")
    for key in ("operator", "operator_bf16", "operator_g2"):
        o = results.get(key, {})
        if "cases" in o:
            log(f"{key}: {o['cases']} cases, bitwise mismatches {o['bitwise_mismatches']}, "
                f"bad cases {o['bad_cases']}, max abs err {o['max_abs_err']:.4g}, "
                f"{o['seconds']} s")
    big = results.get("bench_large", {})
    if "bitwise_equal_to_baseline" in big:
        log(f"B16x16K bitwise == baseline: {big['bitwise_equal_to_baseline']}; max |err| vs "
            f"fp64: {big['max_abs_err_vs_fp64']}")
    for name, v in big.get("variants", {}).items():
        log(f"B16x16K {name:22s} {v['median_us']:9.1f} us  [{v['min']:.1f}..{v['max']:.1f}]  "
            f"{v['tb_per_s']:.3f} TB/s  {v['pct_of_copy']:.1f}% of copy")
    sdpa = {n: v["median_us"] for n, v in big.get("variants", {}).items()
            if n.startswith("sdpa_bf16_dense")}
    if sdpa:  # the bf16 bar: the deep candidate and each of its builds against the fastest
        best = min(sdpa, key=sdpa.__getitem__)
        for name, v in big["variants"].items():
            if name.startswith("bf16_deep"):
                log(f"B16x16K {name} against the fastest SDPA ({best}, {sdpa[best]:.1f} us): "
                    f"{100 * (v['median_us'] / sdpa[best] - 1):+.1f} %")
    small = results.get("bench_small", {})
    if "bulk_kernel" in small:
        log(f"B1x1K   bulk runs {small['bulk_kernel']}, deep runs {small.get('deep_kernel')}")
    for name, v in small.get("variants", {}).items():
        log(f"B1x1K   {name:22s} gpu {v['gpu_us_median']:7.2f} us  call {v['call_us_median']:7.2f} us")
    if "unplanned_call_us" in small:
        log(f"B1x1K   unplanned decode_attention() call {small['unplanned_call_us']:.2f} us "
            f"(launcher {small['launcher']}); launch only {small['launch_only_us']:.2f} us; "
            f"torch zero_() {small['torch_zero_launch_us']:.2f} us")
    ph = results.get("phase", {})
    for variant, att in ph.get("attribution_us", {}).items():
        log(f"phase {variant}: " + ", ".join(f"{k.split(' ')[0]}={v:.1f}" for k, v in att.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True,
                    help="results directory (outside the tree: raw results are never checked in)")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--row", type=Path, default=ROWS / "SM70-XQA-E5M2-DECODE.toml")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--skip", action="append", default=[], help="section names to skip")
    ap.add_argument("--ncu-target", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cubin", type=Path,
                    help="a split_kv cubin built elsewhere (skips the build and phase sections)")
    ap.add_argument("--candidate", help="the operator sections' candidate variant "
                                        "(default: the row's), e.g. e5m2_bulk or e5m2_deep")
    ns = ap.parse_args(argv)
    dev = torch.device("cuda:0")
    if ns.ncu_target:
        ncu_target(ns.cubin, dev)
        return 0
    ns.out.mkdir(parents=True, exist_ok=True)
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability(dev))
    results: dict = {"command": " ".join(sys.argv), "arch": arch}
    results["env"] = environment(dev)
    log(json.dumps(results["env"]))
    if ns.cubin:
        build_rec, cubin = {"cubin": str(ns.cubin)}, ns.cubin
        ns.skip.append("phase")
    else:
        build_rec = section(results, "build", lambda: build(
            ns.nvcc, arch, REPO / "build", ns.out))
        cubin = op.cubin_path(arch, REPO / "build")
    cand = {"candidate": ns.candidate} if ns.candidate else {}
    cand16 = {"candidate": "bf16_" + ns.candidate.rsplit("_", 1)[-1]} if ns.candidate else {}
    ceiling = section(results, "ceiling", lambda: copy_ceiling(dev)).get("tb_per_s", float("nan"))
    plan = {"smoke": lambda: smoke(cubin, dev, ns.out, results),
            "bench_large": lambda: bench_large(cubin, dev, ns.repeats, ceiling),
            "bench_small": lambda: bench_small(cubin, dev, max(9, ns.repeats // 2), {
                n: Path(build_rec["cubins"][n]) for n in ABLATIONS
                if n in build_rec.get("cubins", {})}),
            "operator": lambda: run_operator(operator_spec(ns.row, **cand), cubin, dev,
                                             ns.out / "operator", "row"),
            "operator_bf16": lambda: run_operator(
                operator_spec(ns.row, kv_dtypes=["bf16"], batches=[1, 4, 16], seeds=[0],
                              timing_repeats=9, **cand16), cubin, dev,
                Path("/tmp/operator_bf16"), "bf16"),
            "operator_g2": lambda: run_operator(
                operator_spec(ns.row, kv_dtypes=["bf16"], batches=[1, 4, 8], seeds=[0],
                              heads=[[16, 8]], page_sizes=[16],
                              contexts=["1", "page-1", "page", "page+1", "1024"],
                              timing_repeats=3, baseline="bf16_baseline",
                              **(cand16 or {"candidate": "bf16_pipelined"})), cubin, dev,
                Path("/tmp/operator_g2"), "bf16 g2"),
            "phase": lambda: phase_attribution(build_rec, dev, ns.repeats),
            "ncu": lambda: run_ncu(ns.out, cubin)}
    for name, fn in plan.items():
        if name in ns.skip:
            continue
        section(results, name, fn)
        (ns.out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    summary(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
