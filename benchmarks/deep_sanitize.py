"""The deep split-KV candidate on small shapes, for compute-sanitizer (issue 19).

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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.ops import decode_attention as op  # noqa: E402
from pipeline.ops.paged_inputs import Case, make_inputs  # noqa: E402

SHAPES = [  # kv, batch, context, hq, hkv, dim, page
    ("e5m2", 2, 2000, 8, 1, 128, 16),
    ("e5m2", 1, 4100, 4, 1, 128, 64),
    ("bf16", 2, 1500, 8, 2, 64, 16),
    ("bf16", 2, 1500, 8, 2, 128, 16),  # D128: whole lines
    ("e5m2", 1, 700, 8, 1, 64, 16),  # at most 8 splits: the cluster entry point
]
PERSIST_SHAPES = [  # more splits than the SMs' slots take at once (16 x 8 (sequence, head)s)
    ("e5m2", 16, 3100, 32, 8, 128, 64),  # 3-4 splits of 1024, three CTAs a (sequence, head)
    ("bf16", 16, 2100, 32, 8, 128, 16),  # 2-3 splits, two CTAs; 64 pages a chunk
    ("e5m2", 16, 3300, 64, 8, 64, 16),  # 3-4 splits, three CTAs; per-lane pieces (D64)
]
"""`--persist`: shapes on which a RG_DEEP_PERSIST build's CTAs take more than one split
each (split_kv.cu's deep_per: the slots, 3 CTAs an SM or 2 (bf16 D128), shared out over
128 (sequence, head)s; the plan's chunks of 1024), the last one shorter than the rest
(a ragged batch: some sequences one split fewer). 54-138 MB of K/V each."""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cubin", type=Path, required=True)
    ap.add_argument("--persist", action="store_true",
                    help="the persistent CTAs' shapes (PERSIST_SHAPES) instead")
    ns = ap.parse_args(argv)
    dev = torch.device("cuda:0")
    bad = 0
    for i, (kv, batch, ctx, hq, hkv, dim, page) in enumerate(
            PERSIST_SHAPES if ns.persist else SHAPES):
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
