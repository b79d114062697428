"""The deep split-KV candidate on small shapes, for compute-sanitizer.

    compute-sanitizer --tool racecheck --kernel-name kns=_deep \
        python3 benchmarks/deep_sanitize.py --cubin build/ops/sm_90/split_kv.cubin

Shapes with more splits than a cluster holds (the workspace, ticket and staged merge) and
with at most 8 (the cluster entry point), ragged, partial tiles and pages of 16 and 64,
each against the baseline bit for bit; small enough that memcheck and racecheck finish in
seconds. Prints one line a shape and
exits 1 if any output differs from the baseline's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from rowgate.ops.paged_inputs import Case, make_inputs
from rowgate_lab.ops import split_kv as op

REPO = Path(__file__).resolve().parents[1]

SHAPES = [  # kv, batch, context, hq, hkv, dim, page
    ("e5m2", 2, 2000, 8, 1, 128, 16),
    ("e5m2", 1, 4100, 4, 1, 128, 64),
    ("bf16", 2, 1500, 8, 2, 64, 16),
    ("bf16", 2, 1500, 8, 2, 128, 16),  # D128: whole lines
    ("e5m2", 1, 700, 8, 1, 64, 16),  # at most 8 splits: the cluster entry point
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cubin", type=Path, required=True)
    ns = ap.parse_args(argv)
    dev = torch.device("cuda:0")
    bad = 0
    for i, (kv, batch, ctx, hq, hkv, dim, page) in enumerate(SHAPES):
        lens = [ctx - 37 * j for j in range(batch)]
        inp = make_inputs(Case(40 + i, batch, "ragged", str(ctx), page, kv, hq, hkv, dim, lens),
                          dev)
        outs = {}
        for variant in ("baseline", "deep"):
            planned = op.DecodeAttention(inp.q, inp.k_cache, inp.v_cache, inp.block_table,
                                         inp.seq_lens, max_seq_len=ctx, cubin=ns.cubin,
                                         k_scale=inp.k_scale, v_scale=inp.v_scale,
                                         variant=variant, operator=op.SPLIT_KV_DEEP)
            outs[variant] = planned.run(inp.q, inp.k_cache, inp.v_cache, inp.block_table,
                                        inp.seq_lens)
        torch.cuda.synchronize(dev)
        same = torch.equal(outs["deep"].view(torch.int16), outs["baseline"].view(torch.int16))
        bad += not same
        print(f"{kv} B{batch}x{ctx} {hq}/{hkv} d{dim} p{page} {planned.kernel} "
              f"splits {planned.plan.splits}: bitwise {same}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
