#!/bin/bash
# Device call T (issue 19, run 7): where a GEMV task's run goes (the trace splits it at the
# staged input now), the tree's kernel `mma7` and RG_MK_NORM_VEC=1 `nv`
# (benchmarks/megakernel_ab.py --variants diag); no torch.compile baseline (not what is
# asked here). Cubins built here into .devrun/k23; carry [".whl", ".devrun/k23"].
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
rm -rf /tmp/run7; mkdir -p /tmp/run7
timeout 300 python3 benchmarks/megakernel_ab.py --out /tmp/run7 \
  --cubins mma7=.devrun/k23/mk_mma7.cubin nv=.devrun/k23/mk_nv.cubin \
  --split-kv-cubin .devrun/k23/split_kv.sm_90.cubin --variants diag --repeats 5 \
  --batches 1 8 4 --compile none 2>&1 | tail -n 60
cp /tmp/run7/results.json "$OUT/results.json"
echo "all took $(( $(date +%s) - T0 )) s"
