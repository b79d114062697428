"""The deep candidate at B16x16K (E5M2 and bf16) under each preferred shared-memory carveout:
how much of the SM's 256 KB the L1 keeps beside the CTAs' shared memory, where the
candidate's cp.async.ca copies are staged in flight. One copy of the cubin a
carveout (a module each, so each launch carries only its own attribute), every variant
checked bit for bit against the default first, then timed interleaved (L2 flushed).

    python3 benchmarks/deep_carveout.py --cubin build/ops/sm_90/split_kv.cubin --out DIR
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
from pathlib import Path

import torch
from benchmarks.decode_attention import log, median, spread
from benchmarks.deep_ceiling import planned

from rowgate.ops import timing
from rowgate.ops.paged_inputs import Case, make_inputs
from rowgate_lab.ops import split_kv as op

REPO = Path(__file__).resolve().parents[1]

CARVEOUTS = {"default": -1, "c164": 72, "c196": 86, "c228": 100}
"""Requested carveout, % of the most shared memory an SM can have (228 KB): none (the
driver's choice), 72, 86 and 100 % (164, 196 and 228 KB requested). The driver takes a
configuration of at least the request that also fits the occupancy (CTAs an SM are
reported beside), so a request is a lower bound on the shared memory and an upper bound on
the L1 that the copies are staged through."""


def set_carveout(plan: op.DecodeAttention, pct: int) -> int:
    """The launch's preferred carveout, and the CTAs an SM the driver then reports."""
    from cuda.bindings import driver as d

    raw = plan.launcher.raw
    if pct >= 0:
        (err,) = d.cuFuncSetAttribute(
            raw, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, pct)
        if err != d.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuFuncSetAttribute(preferred carveout {pct} %): {err!r}")
    err, blocks = d.cuOccupancyMaxActiveBlocksPerMultiprocessor(raw, plan.launcher.block,
                                                                plan.launcher.smem)
    if err != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor: {err!r}")
    return int(blocks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cubin", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=15)
    ns = ap.parse_args()
    dev = torch.device("cuda", 0)
    ns.out.mkdir(parents=True, exist_ok=True)
    fns, bits, blocks = {}, {}, {}
    for kv in ("e5m2", "bf16"):
        inp = make_inputs(Case(7, 16, "uniform", "16384", 64, kv, 32, 8, 128, [16384] * 16), dev)
        args = (inp.q, inp.k_cache, inp.v_cache, inp.block_table, inp.seq_lens)
        out = torch.empty_like(inp.q)
        ref = None
        for name, pct in CARVEOUTS.items():
            cub = ns.out / f"split_kv.{kv}.{name}.cubin"
            shutil.copy(ns.cubin, cub)
            plan = planned(inp, cub)
            blocks[f"{kv}_{name}"] = set_carveout(plan, pct)
            got = plan.run(*args).view(torch.int16).clone()
            ref = got if ref is None else ref
            bits[f"{kv}_{name}"] = bool(torch.equal(got, ref))
            fns[f"{kv}_{name}"] = functools.partial(plan.run, *args, out=out)
    log(f"bitwise == default: {bits}; CTAs an SM: {blocks}")
    samples = timing.interleaved(fns, repeats=ns.repeats, device=dev, flush=True)
    res: dict = {"device": torch.cuda.get_device_name(dev), "carveouts": CARVEOUTS,
                 "bitwise_equal_to_default": bits, "ctas_per_sm": blocks,
                 "order": samples["order"], "variants": {}}
    for name, smp in samples["samples_us"].items():
        res["variants"][name] = {"samples_us": smp, "median_us": median(smp), **spread(smp)}
        log(f"carveout {name:14s} {median(smp):7.1f} us  [{min(smp):.1f}..{max(smp):.1f}]")
    (ns.out / "results.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
