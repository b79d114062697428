#!/bin/bash
# Device call R (issue 19, run 5 continued, on call Q's warm machine): the max-autotune
# graph-fused baseline at b8 and b4 beside the same persistent variants (call Q's budget
# compiled it at b1 only); carry [".whl", ".devrun/k21"]. The command, as run:
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1; rm -rf /tmp/run5b; mkdir -p /tmp/run5b
timeout 250 python3 benchmarks/megakernel_ab.py --out /tmp/run5b --cubins mma=.devrun/k21/mk_mma.cubin \
  --split-kv-cubin .devrun/k21/split_kv.sm_90.cubin --variants fuse --repeats 7 --budget-s 200 \
  --batches 8 4 --compile max-autotune-no-cudagraphs 2>&1 | grep -v "triton_mm\|AUTOTUNE\|strides:\|dtypes:\|Autotune\|best_kernel\|SingleProcess\|^  mm \|^  addmm\|TypedStorage\|current_out_size\|bitwise\|breakdown" | tail -n 40
cp /tmp/run5b/results.json $OUT/results.json
