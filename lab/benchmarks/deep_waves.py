"""The deep candidate's fixed cost a launch against its streaming rate.

    python3 benchmarks/deep_waves.py --cubin CUBIN --out DIR      (on the GPU: samples)
    python3 benchmarks/deep_waves.py --fit DIR/results.json        (anywhere: the fit)

At 16K tokens a sequence (GQA 32/8, D128, page 64) it times the deep candidate on E5M2 and
bf16, and torch SDPA (cuDNN) on the same bf16 bytes dense, at batches 4 to 99: 128 CTAs a
sequence, so B16's 2,048 CTAs are 5.2 waves of the 396 slots (3 CTAs an SM, E5M2) and B99's
12,672 are 32 whole waves. Every deep launch is checked bit for bit against the baseline of
its plan first. The fit (scipy.stats.linregress of each path's median on its bytes) splits
the time into what each byte costs in the stream (the slope: its steady rate against the
copy ceiling) and what a launch costs whatever its size (the intercept: ramp-up, the last
wave's drain, launch): if B16's shortfall from the bar is the intercept, no change inside
the stream recovers it.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

LENGTH, HQ, HKV, DIM, PAGE = 16384, 32, 8, 128, 64
BATCHES = (4, 8, 16, 24, 32, 48, 64, 99)


def kv_bytes(kv: str, batch: int) -> int:
    """K and V bytes a launch reads at `batch` sequences of LENGTH tokens."""
    return batch * LENGTH * HKV * DIM * 2 * (1 if kv == "e5m2" else 2)


def paths(cubin: Path, batch: int, dev: Any) -> tuple[dict[str, Any], dict[str, bool]]:
    """The deep candidate on E5M2 and bf16 and cuDNN SDPA on the bf16 bytes dense at
    `batch` sequences, and whether each deep launch is bit for bit its baseline's."""
    import torch
    from benchmarks.decode_attention import dense_bf16, sdpa_backends

    from rowgate.ops import reference
    from rowgate.ops.paged_inputs import Case, make_inputs
    from rowgate_lab.ops import split_kv as op

    fns, bits = {}, {}
    for kv in ("e5m2", "bf16"):
        inp = make_inputs(Case(7, batch, "uniform", str(LENGTH), PAGE, kv, HQ, HKV, DIM,
                               [LENGTH] * batch), dev)
        args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
        plan = functools.partial(op.DecodeAttention, *args, max_seq_len=LENGTH, cubin=cubin,
                                 k_scale=inp.k_scale, v_scale=inp.v_scale,
                                 operator=op.SPLIT_KV_DEEP)
        deep, base = plan(variant="deep"), plan(variant="baseline")
        bits[kv] = bool(torch.equal(deep.run(*args).view(torch.int16),
                                    base.run(*args).view(torch.int16)))
        fns[f"{kv}_deep"] = functools.partial(deep.run, *args, out=torch.empty_like(inp.q))
        if kv == "bf16":
            gen = torch.Generator(device=dev).manual_seed(11)
            dk, dv = dense_bf16(batch, HKV, LENGTH, DIM, dev, gen)
            sdpa = sdpa_backends(functools.partial(reference.dense_sdpa, inp.q, dk, dv))
            fns.update({k: v for k, v in sdpa.items() if k.endswith("cudnn_attention")})
    return fns, bits


def sample(cubin: Path, out: Path, repeats: int) -> dict[str, Any]:
    """Every batch's paths, timed interleaved with the L2 flushed (GPU)."""
    import torch
    from benchmarks.decode_attention import copy_ceiling, log, median

    from rowgate.ops import timing

    dev = torch.device("cuda:0")
    res: dict[str, Any] = {"cubin": str(cubin), "ceiling": copy_ceiling(dev), "batches": {}}
    for batch in BATCHES:
        fns, bits = paths(cubin, batch, dev)
        samples = timing.interleaved(fns, repeats=repeats, device=dev, flush=True)
        res["batches"][str(batch)] = {"bitwise_equal_to_baseline": bits,
                                      "samples_us": samples["samples_us"]}
        log(f"B{batch}: " + ", ".join(f"{n} {median(s):.1f} us"
                                      for n, s in samples["samples_us"].items()) + f"; {bits}")
        del fns
        torch.cuda.empty_cache()
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    return res


class ReadFlush:
    """An L2 flush that leaves clean lines: it reads a buffer several times the L2 (the
    write flush of rowgate.ops.timing leaves the L2 full of dirty lines, which the next
    launch's misses write back to DRAM as it reads)."""

    def __init__(self, device: Any) -> None:
        import torch

        from rowgate.ops.timing import L2_FLUSH_BYTES

        self.buf = torch.ones(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.sum()


def flush_ab(cubin: Path, repeats: int) -> dict[str, Any]:
    """B16's paths after the write flush and after the read flush, interleaved (GPU)."""
    import torch

    from rowgate.ops import timing

    dev = torch.device("cuda:0")
    flushes = {"write": timing.L2Flush(dev), "read": ReadFlush(dev)}
    fns = paths(cubin, 16, dev)[0]
    runs = [(n, f) for n in fns for f in flushes]
    samples: dict[str, list[float]] = {f"{n} {f}": [] for n, f in runs}
    for i in range(repeats):
        for n, f in runs[i % len(runs):] + runs[:i % len(runs)]:
            samples[f"{n} {f}"].append(timing.event_time_us(fns[n], flushes[f]))  # type: ignore[arg-type]
    return {"batch": 16, "samples_us": samples}


def fit(res: dict[str, Any]) -> dict[str, Any]:
    """Each path's median time on its bytes: slope (steady rate), intercept (fixed cost)."""
    from statistics import median

    from scipy.stats import linregress

    ceiling = float(res["ceiling"]["tb_per_s"])
    paths = sorted({n for b in res["batches"].values() for n in b["samples_us"]})
    rows: dict[str, Any] = {}
    for name in paths:
        kv = "e5m2" if name.startswith("e5m2") else "bf16"
        pts = [(kv_bytes(kv, int(b)), median(v["samples_us"][name]))
               for b, v in res["batches"].items() if name in v["samples_us"]]
        r = linregress([x for x, _ in pts], [y for _, y in pts])
        rate = 1e-6 / r.slope  # bytes per us -> TB/s
        rows[name] = {"points": pts, "slope_us_per_byte": r.slope,
                      "intercept_us": r.intercept, "intercept_stderr_us": r.intercept_stderr,
                      "r2": r.rvalue ** 2, "steady_tb_per_s": rate,
                      "steady_pct_of_copy": 100 * rate / ceiling}
    return {"ceiling_tb_per_s": ceiling, "paths": rows}


def show(f: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"time = fixed + bytes / steady rate (copy ceiling "
                    f"{f['ceiling_tb_per_s']:.3f} TB/s)")
    for col in ("path", "fixed µs (± se)", "steady TB/s", "% of copy", "r²", "B16 µs"):
        t.add_column(col)
    for name, r in f["paths"].items():
        b16 = dict(r["points"]).get(kv_bytes("e5m2" if name.startswith("e5m2") else "bf16", 16))
        t.add_row(name, f"{r['intercept_us']:.1f} ± {r['intercept_stderr_us']:.1f}",
                  f"{r['steady_tb_per_s']:.3f}", f"{r['steady_pct_of_copy']:.1f}",
                  f"{r['r2']:.5f}", f"{b16:.1f}" if b16 else "-")
    Console().print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cubin", type=Path, help="split_kv's cubin (sample on the GPU)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/deep-waves"))
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--fit", type=Path, help="a results.json to fit (no GPU)")
    ap.add_argument("--flush-ab", action="store_true", help="B16 only, after the write flush "
                    "and after a read flush, interleaved (flush_ab.json)")
    ns = ap.parse_args(argv)
    if ns.flush_ab and ns.cubin:
        ab = flush_ab(ns.cubin, ns.repeats)
        ns.out.mkdir(parents=True, exist_ok=True)
        (ns.out / "flush_ab.json").write_text(json.dumps(ab, indent=1))
        for name, s in ab["samples_us"].items():
            print(f"B16 {name:45s} {sorted(s)[len(s) // 2]:8.1f} us  [{min(s):.1f}..{max(s):.1f}]")
        return 0
    if ns.fit is None and ns.cubin is None:
        ap.error("--cubin (sample) or --fit (fit a results.json)")
    try:
        res = json.loads(ns.fit.read_text()) if ns.fit else sample(ns.cubin, ns.out, ns.repeats)
    except (OSError, ValueError) as e:
        print(f"deep_waves: cannot read {ns.fit}: {e}", file=sys.stderr)
        return 2
    try:
        f = fit(res)
    except ImportError:  # the device image may lack scipy: the samples are written
        print(f"deep_waves: no scipy here; fit with --fit {ns.out / 'results.json'}")
        return 0
    if ns.cubin:
        (ns.out / "fit.json").write_text(json.dumps(f, indent=1))
    show(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
