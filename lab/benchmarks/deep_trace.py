"""The deep candidate's CTAs on the global timer: ramp, slot occupancy, drain.

    python3 benchmarks/deep_trace.py --out DIR              (on the GPU: build and trace)
    python3 benchmarks/deep_trace.py --read DIR/trace.json.gz  (anywhere: the table, the plot)

split_kv.cu's RG_DEEP_TRACE=1 build (timing-only: no result comes from it) makes each CTA
of the deep candidate write its start and end (%globaltimer, ns) and its SM as it leaves.
At B16x16K (GQA 32/8, D128, page 64; E5M2 and bf16) the CTAs' records are read back after
launches that run after an L2 flush ("flush"), after a flush and a read of one byte every
64 KB of K and V, which warms the address translations and leaves L2 cold ("touch"), and
back to back ("warm"). From them: how long the first wave takes to fill every slot (ramp),
the first wave's CTAs' lifetimes against the later ones', how long the launch runs after
its last CTA started (drain), and the slot time it leaves idle, as microseconds of the
whole launch. The traced build's own time is taken beside the
default build's (both interleaved, L2 flushed) to show what the trace costs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

REPO = Path(__file__).resolve().parents[1]

LENGTH, BATCH, HQ, HKV, DIM, PAGE = 16384, 16, 32, 8, 128, 64
LAUNCHES = 7


def build(out: Path) -> dict[str, Path]:
    """The default and the traced cubin, with the device's nvcc (warnings as errors)."""
    from benchmarks.decode_attention import nvcc_cmd

    cubins = {"default": out / "split_kv.cubin", "trace": out / "split_kv.trace.cubin"}
    for name, path in cubins.items():
        defines = ["RG_DEEP_TRACE=1"] if name == "trace" else []
        subprocess.run(nvcc_cmd(shutil.which("nvcc") or "nvcc", "sm_90", path, defines),
                       check=True, capture_output=True)
    return cubins


def trace_kv(kv: str, cubins: dict[str, Path], dev: Any) -> dict[str, Any]:
    """LAUNCHES traced launches' CTA records, and both builds' times, for one KV dtype."""
    import functools

    import torch

    from rowgate.ops import timing
    from rowgate.ops.paged_inputs import Case, make_inputs
    from rowgate_lab.ops import split_kv as op

    inp = make_inputs(Case(7, BATCH, "uniform", str(LENGTH), PAGE, kv, HQ, HKV, DIM,
                           [LENGTH] * BATCH), dev)
    args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)

    def planned(cubin: Path, q: Any) -> Any:
        run = op.DecodeAttention(q, *args[1:], max_seq_len=LENGTH, cubin=cubin,
                                 k_scale=inp.k_scale, v_scale=inp.v_scale, variant="deep",
                                 operator=op.SPLIT_KV_DEEP)
        return functools.partial(run.run, q, *args[1:], out=torch.empty_like(inp.q))

    q_trace = inp.q.clone()  # the traced build writes its records over its q
    traced, default = planned(cubins["trace"], q_trace), planned(cubins["default"], inp.q)
    grid = BATCH * HKV * (LENGTH // 1024)
    assert q_trace.numel() * 2 >= grid * 24, "q holds the CTAs' records"
    flush = timing.L2Flush(dev)
    # one element every 64 KB of K and V: the translations warm, ~0.05 % of the bytes in L2
    pages = [t.view(torch.uint8).reshape(-1)[::1 << 16] for t in (inp.k_cache, inp.v_cache)]
    before = {"flush": [flush], "touch": [flush, lambda: [int(p.sum()) for p in pages]],
              "warm": []}
    modes = {}
    for mode, steps in before.items():
        launches = []
        for _ in range(3 + LAUNCHES):
            for step in steps:
                step()
            traced()
            torch.cuda.synchronize(dev)
            words = q_trace.view(torch.int64).reshape(-1)[: 3 * grid].view(grid, 3)
            launches.append(words.cpu().tolist())
        modes[mode] = launches[3:]
    times = timing.interleaved({"default": default, "trace": traced}, repeats=15, device=dev)
    return {"ctas": grid, "modes": modes, "samples_us": times["samples_us"]}


def launch_stats(words: list[list[int]]) -> dict[str, float]:
    """One launch's CTA records [start ns, end ns, sm]: ramp, drain, idle slot time."""
    t0 = min(w[0] for w in words)
    start = sorted((w[0] - t0) / 1e3 for w in words)
    end = sorted((w[1] - t0) / 1e3 for w in words)
    life = sorted((w[1] - w[0]) / 1e3 for w in words)
    active = occupancy(start, end)
    full = max(n for _, n in active)
    span = end[-1]
    ramp = next(t for t, n in active if n == full)
    busy = sum((b[0] - a[0]) * a[1] for a, b in zip(active, active[1:]))
    first = [(w[1] - w[0]) / 1e3 for w in words if w[0] - t0 < 1000]
    later = [(w[1] - w[0]) / 1e3 for w in words if w[0] - t0 >= 1000]
    return {"span_us": span, "slots": full, "ramp_us": ramp,
            "last_start_us": start[-1], "drain_us": span - start[-1],
            "idle_us": span - busy / full, "life_median_us": median(life),
            "life_p10_us": life[len(life) // 10], "life_max_us": life[-1],
            "first_wave_life_us": median(first), "later_life_us": median(later or first),
            "sms": len({w[2] for w in words})}


def occupancy(start: list[float], end: list[float]) -> list[tuple[float, int]]:
    """The CTAs active from each start or end on: [(µs, count)], in time order."""
    events = sorted([(t, 1) for t in start] + [(t, -1) for t in end])
    out, n = [], 0
    for t, d in events:
        n += d
        out.append((t, n))
    return out


def modes_of(r: dict[str, Any]) -> dict[str, Any]:
    """A KV dtype's launches by what ran before each (the first recorded runs hold "flush"
    only)."""
    return r["modes"] if "modes" in r else {"flush": r["launches"]}


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    """Each KV dtype's and mode's launches, the median of each statistic over them."""
    out: dict[str, Any] = {}
    for kv, r in res["kv"].items():
        for mode, launches in modes_of(r).items():
            per = [launch_stats(w) for w in launches]
            row = out[f"{kv} {mode}"] = {k: median(p[k] for p in per) for k in per[0]}
            row["default_us"] = median(r["samples_us"]["default"])
            row["trace_us"] = median(r["samples_us"]["trace"])
    return out


def show(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="B16x16K deep candidate, CTAs on the global timer (medians of launches)")
    cols = ("span_us", "default_us", "trace_us", "slots", "ramp_us", "last_start_us",
            "drain_us", "idle_us", "first_wave_life_us", "later_life_us", "life_max_us")
    t.add_column("kv, before")
    for c in cols:
        t.add_column(c.replace("_us", " µs"))
    for kv, s in summary.items():
        t.add_row(kv, *(f"{s[c]:.1f}" if c.endswith("_us") else f"{s[c]:.0f}" for c in cols))
    Console(width=160).print(t)


def plot(res: dict[str, Any], path: Path) -> None:
    """Active CTAs over one launch (the first traced) of each KV dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    for kv, r in res["kv"].items():
        words = modes_of(r)["flush"][0]
        t0 = min(w[0] for w in words)
        act = occupancy([(w[0] - t0) / 1e3 for w in words], [(w[1] - t0) / 1e3 for w in words])
        ax.step([t for t, _ in act], [n for _, n in act], where="post", label=kv)
    ax.set_xlabel("µs from the first CTA's start")
    ax.set_ylabel("CTAs running")
    ax.set_title("B16x16K deep candidate: slots over one launch")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def read_recorded(path: Path, tool: str) -> Any:
    """A run's recorded JSON (gzipped if it ends in .gz) for `--read`; None, with one line
    on stderr naming the file, if it cannot be read."""
    try:
        raw = path.read_bytes()
        return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    except (OSError, ValueError, EOFError) as e:
        print(f"{tool}: cannot read {path}: {e}", file=sys.stderr)
        return None


def bench_main(argv: list[str] | None, doc: str, tool: str, record: str,
               measure: Callable[[Path, int], dict[str, Any]],
               summarize: Callable[[dict[str, Any]], dict[str, Any]],
               show: Callable[[dict[str, Any]], None],
               repeats: int | None = None) -> tuple[Any, Path]:
    """A deep benchmark's command line: `--read` a recorded run (None if it cannot be read:
    one line on stderr), or `measure(out, repeats)` on the GPU with its record written
    gzipped as out/<record>; then the summary
    beside it as summary.json, shown. Returns the run and that directory."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp") / tool.replace("_", "-"))
    ap.add_argument("--read", type=Path, help=f"a {record} to summarize (no GPU)")
    if repeats is not None:
        ap.add_argument("--repeats", type=int, default=repeats)
    ns = ap.parse_args(argv)
    if ns.read:
        res, out = read_recorded(ns.read, tool), ns.read.parent
        if res is None:
            return None, out
    else:
        out = ns.out
        out.mkdir(parents=True, exist_ok=True)
        res = measure(out, getattr(ns, "repeats", 0))
        (out / record).write_bytes(gzip.compress(json.dumps(res).encode()))
    rows = summarize(res)
    (out / "summary.json").write_text(json.dumps(rows, indent=1))
    show(rows)
    return res, out


def measure(out: Path, repeats: int) -> dict[str, Any]:
    import torch

    cubins = build(out)
    res = {"kv": {kv: trace_kv(kv, cubins, torch.device("cuda:0")) for kv in ("e5m2", "bf16")}}
    for c in cubins.values():
        c.unlink()
    return res


def main(argv: list[str] | None = None) -> int:
    res, out = bench_main(argv, __doc__, "deep_trace", "trace.json.gz", measure, summarize, show)
    if res is None:
        return 2
    try:
        plot(res, out / "occupancy.png")
    except ImportError:  # the device image may lack matplotlib: the records are written
        print(f"deep_trace: no matplotlib here; plot with --read {out / 'trace.json.gz'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
