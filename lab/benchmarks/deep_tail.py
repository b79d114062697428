"""The deep candidate with two split sizes, short splits last: timing only (issue 19, item 3).

    python3 benchmarks/deep_tail.py --out DIR            (on the GPU: build, check, time, trace)
    python3 benchmarks/deep_tail.py --read DIR/tail.json.gz  (anywhere: the table)

Runs 66-67 traced ~14 µs of B16x16K's slot time idle in the launch's drain: after the last
CTA starts, the slots empty over one CTA's life (21-26 µs). split_kv.cu's RG_DEEP_TAIL=T
build (timing-only) gives each (sequence, head) T last splits of RG_DEEP_TAIL_SHORT tokens
and runs the grid split-major, so the CTAs that start last are short ones and the drain
lasts one short CTA. Run 69 (H100) found that plan slower whenever it adds CTAs (each costs
a slot ~9.6 µs whatever its length), so the `L` variants keep the uniform plan's 16 CTAs a
(sequence, head): their long splits grow past 1024 tokens (an RG_DEEP_MAX_CHUNK=1152 build;
`x1152` is that build on the default plan, the control for its code alone); run 70 (H200)
found those slower still (docs/perf.md). Before the plan
rule, the operator contract and the baseline change for it (the operator gate compares
baseline and candidate bit for bit, so both would need the same splits), this measures what
it would buy.

At B16x16K (GQA 32/8, D128, page 64; E5M2 and bf16) each variant is launched on its grid
and chunk, checked against the float64 reference beside the default deep build (its error
may not be larger: the merge order changes, the math does not), timed interleaved with the
default, a uniform 512-token plan and (bf16) torch SDPA's backends, L2 flushed, and traced
(RG_DEEP_TRACE=1 on the same plan: its drain and idle slot time, benchmarks/deep_trace.py's
statistics).
"""

from __future__ import annotations

import concurrent.futures
import functools
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

REPO = Path(__file__).resolve().parents[1]

LENGTH, BATCH, HQ, HKV, DIM, PAGE, CHUNK = 16384, 16, 32, 8, 128, 64, 1024
LAUNCHES = 5
VARIANTS = {"major": (1, 1024, 1024), "t4h": (4, 512, 1024), "t4q": (4, 256, 1024),
            "x1152": (0, 0, 1024), "L1152t4": (4, 640, 1152), "L1088t4": (4, 832, 1088),
            "L1152t8": (8, 896, 1152), "L1088t2": (2, 576, 1088)}
"""name: (T short splits a (sequence, head), each SHORT tokens, the long splits' CHUNK).
`major` is the split-major order alone (its last split is a whole chunk); `x1152` the
longer-chunk build's code on the default plan."""
LONG_BUILD = 1152
"""RG_DEEP_MAX_CHUNK of the variants whose chunk passes the default build's 1024 (and of
`x1152`): a multiple of 128 tokens (kMaxWarpTiles whole tiles for each of 8 warps)."""


def splits(tail: int, short: int, chunk: int = CHUNK) -> int:
    """The grid's splits at LENGTH: whole chunks, then the T short ones covering the rest;
    every split starts on a page (the kernel indexes a split's pages from its first)."""
    rest = LENGTH - tail * short
    if rest < 0 or rest % chunk or short % PAGE or chunk % PAGE or short > chunk:
        raise ValueError(f"tail {tail} x {short} tokens after {chunk}-token splits: not whole "
                         f"chunks of whole pages covering {LENGTH}")
    return rest // chunk + tail


def defines(tail: int, short: int, chunk: int, trace: bool) -> list[str]:
    out = ["RG_UNIT=3"]
    if tail:
        out += [f"RG_DEEP_TAIL={tail}", f"RG_DEEP_TAIL_SHORT={short}"]
    if chunk > CHUNK or not tail:  # the long splits' build (and `x1152`, its control)
        out += [f"RG_DEEP_MAX_CHUNK={LONG_BUILD}"]
    return out + (["RG_DEEP_TRACE=1"] if trace else [])


def compile_all(out: Path, jobs: dict[str, list[str]]) -> dict[str, Path]:
    """split_kv.cu built for sm_90 once for each job (name: defines) into
    out/split_kv.<name>.cubin, with the device's nvcc, warnings as errors, eight at once;
    every build's ptxas -v into out/ptxas.log (registers and spills beside the times)."""
    from benchmarks.decode_attention import nvcc_cmd

    nvcc = shutil.which("nvcc") or "nvcc"
    paths = {name: out / f"split_kv.{name}.cubin" for name in jobs}

    def one(name: str) -> str:
        done = subprocess.run(nvcc_cmd(nvcc, "sm_90", paths[name], jobs[name]), check=True,
                              capture_output=True, text=True)
        return f"== {name}: {' '.join(jobs[name])}\n{done.stderr}"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        (out / "ptxas.log").write_text("".join(pool.map(one, jobs)))
    return paths


def build(out: Path) -> dict[str, Path]:
    """Every variant's cubin and its traced twin (`default` the plain deep build)."""
    jobs = {"default": ["RG_UNIT=3"], "default.trace": ["RG_UNIT=3", "RG_DEEP_TRACE=1"]}
    for name, (tail, short, chunk) in VARIANTS.items():
        jobs[name] = defines(tail, short, chunk, False)
        jobs[f"{name}.trace"] = defines(tail, short, chunk, True)
    return compile_all(out, jobs)


def on_grid(run: Any, n_splits: int, chunk: int) -> Any:
    """A planned deep launch moved onto a grid of `n_splits` splits of `chunk` tokens: its
    workspace and a launcher of its own, with that grid, the chunk's shared memory and the
    chunk as its scalar (built here: the operator's plan refuses a chunk past its max_chunk,
    as it should)."""
    import torch

    from rowgate.ops import contract
    from rowgate_lab.ops import split_kv as op

    shape = run.shape
    n_acc, n_ml, _ = contract.workspace_elements(shape.batch, shape.hkv, n_splits,
                                                 shape.group, shape.dim)
    run.ws_acc = torch.empty(n_acc, dtype=torch.float32, device=run.ws_acc.device)
    run.ws_ml = torch.empty(n_ml, dtype=torch.float32, device=run.ws_ml.device)
    old, grid = run.launcher, (n_splits, shape.hkv, shape.batch)
    names = [p.name for p in contract.PARAMETERS[contract.POINTERS:]]
    smem = op.SPLIT_KV_DEEP.smem(run.kernel, chunk, shape.group, shape.dim)
    run.launcher = op._Launcher(old.fn, run.kernel, grid, old.block, smem, run.index)
    run.launcher.set_scalars(tuple(chunk if n == "chunk" else v
                                   for n, v in zip(names, old.scalars)))
    return run


def b16_inputs(kv: str, dev: Any) -> tuple[Any, tuple[Any, ...], Any]:
    """B16x16K's paged inputs of one KV dtype, the operator's arguments and the float64
    reference output (deep_tail and deep_merge)."""
    from rowgate.ops import reference
    from rowgate.ops.paged_inputs import Case, make_inputs

    inp = make_inputs(Case(7, BATCH, "uniform", str(LENGTH), PAGE, kv, HQ, HKV, DIM,
                           [LENGTH] * BATCH), dev)
    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
    return inp, args, reference.decode_attention_fp64(*args, k_scale=inp.k_scale,
                                                      v_scale=inp.v_scale)


def sdpa_paths(q: Any, dev: Any) -> dict[str, Any]:
    """torch SDPA's backends on the same bytes, dense bf16 (the bf16 bar's baseline)."""
    import torch
    from benchmarks.decode_attention import dense_bf16, sdpa_backends

    from rowgate.ops import reference

    gen = torch.Generator(device=dev).manual_seed(11)
    dk, dv = dense_bf16(BATCH, HKV, LENGTH, DIM, dev, gen)
    return dict(sdpa_backends(functools.partial(reference.dense_sdpa, q, dk, dv)))


def kv_paths(kv: str, cubins: dict[str, Path], dev: Any, repeats: int) -> dict[str, Any]:
    """One KV dtype: each variant's error against float64 beside the default's, the
    interleaved samples, and the traced launches' statistics."""
    import torch
    from benchmarks.deep_trace import launch_stats

    from rowgate.ops import timing
    from rowgate_lab.ops import split_kv as op

    inp, args, exact = b16_inputs(kv, dev)

    def planned(cubin: Path, q: Any, variant: str = "", chunk: int | None = None) -> Any:
        run = op.DecodeAttention(q, *args[1:], max_seq_len=LENGTH, cubin=cubin,
                                 k_scale=inp.k_scale, v_scale=inp.v_scale, variant="deep",
                                 operator=op.SPLIT_KV_DEEP, chunk=chunk)
        return on_grid(run, grids[variant], VARIANTS[variant][2]) if variant else run

    grids = {name: splits(*spec) for name, spec in VARIANTS.items()}
    runs = {"default": planned(cubins["default"], inp.q),
            "c512": planned(cubins["default"], inp.q, chunk=512),
            **{n: planned(cubins[n], inp.q, n) for n in VARIANTS}}
    check = {}
    for name, run in runs.items():
        got = run.run(*args).double()
        err = (got - exact).abs()
        check[name] = {"max_abs_err": float(err.max()), "mean_abs_err": float(err.mean()),
                       "finite": bool(torch.isfinite(got).all())}
    fns = {n: functools.partial(r.run, *args, out=torch.empty_like(inp.q)) for n, r in runs.items()}
    if kv == "bf16":
        fns.update(sdpa_paths(inp.q, dev))
    samples = timing.interleaved(fns, repeats=repeats, device=dev, flush=True)["samples_us"]
    traces = {}
    flush = timing.L2Flush(dev)
    for name in ("default", *VARIANTS):
        q_trace = inp.q.clone()  # the traced build writes its records over its q
        n_splits = grids.get(name, LENGTH // CHUNK)
        traced = planned(cubins[f"{name}.trace"], q_trace, "" if name == "default" else name)
        ctas = n_splits * HKV * BATCH
        launches = []
        for i in range(2 + LAUNCHES):
            flush()
            traced.run(q_trace, *args[1:], out=torch.empty_like(inp.q))
            torch.cuda.synchronize(dev)
            words = q_trace.view(torch.int64).reshape(-1)[: 3 * ctas].view(ctas, 3)
            if i >= 2:
                launches.append(launch_stats(words.cpu().tolist()))
        traces[name] = {k: median(s[k] for s in launches) for k in launches[0]}
    return {"splits": {"default": LENGTH // CHUNK, "c512": LENGTH // 512, **grids},
            "check": check, "samples_us": samples, "trace": traces}


REPEATS = 21


def path_rows(res: dict[str, Any],
              extra: Callable[[dict[str, Any], str], dict[str, Any]]) -> dict[str, Any]:
    """Each recorded path's median, its change against the default and against the best
    SDPA backend (bf16), its check, and what `extra(the dtype's record, path)` adds."""
    rows: dict[str, Any] = {}
    for kv, r in res["kv"].items():
        base = median(r["samples_us"]["default"])
        sdpa = min((median(s) for n, s in r["samples_us"].items() if n.startswith("sdpa")),
                   default=None)
        for name, s in r["samples_us"].items():
            m = median(s)
            row = {"median_us": m, "vs_default_us": m - base, "min_us": min(s), "max_us": max(s)}
            if sdpa:
                row["vs_best_sdpa_pct"] = 100 * (m / sdpa - 1)
            row.update(r["check"].get(name, {}))
            row.update(extra(r, name))
            rows[f"{kv} {name}"] = row
    return rows


def show_rows(rows: dict[str, Any], title: str, cols: tuple[str, ...]) -> None:
    """The rows as a rich table of `cols` (µs and % in the headers, errors in e-notation)."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    t.add_column("path")
    for c in cols:
        t.add_column(c.replace("_us", " µs").replace("_pct", " %"))
    for name, r in rows.items():
        t.add_row(name, *("" if r.get(c) is None else f"{r[c]:.2e}" if c == "max_abs_err"
                          else f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c])
                          for c in cols))
    Console(width=170).print(t)


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    """Each path's median, its change against the default, its error and trace."""
    return path_rows(res, lambda r, name: {
        "splits": r["splits"].get(name),
        **{f"trace_{k}": v for k, v in r["trace"].get(name, {}).items()
           if k in ("span_us", "drain_us", "idle_us", "later_life_us")}})


def show(rows: dict[str, Any]) -> None:
    show_rows(rows, f"B{BATCH}x{LENGTH // 1024}K deep candidate: two split sizes, short last "
                    "(medians, L2 flushed; trace = RG_DEEP_TRACE build of the same plan)",
              ("splits", "median_us", "vs_default_us", "vs_best_sdpa_pct", "max_abs_err",
               "trace_drain_us", "trace_idle_us", "trace_later_life_us"))


def measure_kvs(cubins: dict[str, Path], header: dict[str, Any],
                kv_paths: Callable[[str, dict[str, Path], Any, int], dict[str, Any]],
                repeats: int) -> dict[str, Any]:
    """`header` with each KV dtype's `kv_paths` on the GPU under "kv" (deep_tail and
    deep_merge); the cubins, built for this run alone, removed after it."""
    import torch

    res: dict[str, Any] = {**header, "kv": {}}
    for kv in ("e5m2", "bf16"):
        res["kv"][kv] = kv_paths(kv, cubins, torch.device("cuda:0"), repeats)
        torch.cuda.empty_cache()
    for c in cubins.values():
        c.unlink()
    return res


def measure(out: Path, repeats: int) -> dict[str, Any]:
    return measure_kvs(build(out), {"variants": VARIANTS}, kv_paths, repeats)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.deep_trace import bench_exit

    return bench_exit(argv, __doc__, "deep_tail", "tail.json.gz", measure, summarize, show, REPEATS)


if __name__ == "__main__":
    sys.exit(main())
