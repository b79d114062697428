#!/bin/bash
# Device call X (issue 19, run 10): the deep ring (RG_MK_DEEP=1, `mmadeep`) and the tree's
# default layout (`mma9`) against the previous kernel `mma` (1ac5993) bit for bit, beside the
# graph-fused baselines; a smoke of the deep ring at b1/b2/b4 first, in its own process;
# then the persistent kernel's gpu-marked tests on the tree. carry [".whl", ".devrun/k25"].
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
K=.devrun/k25
rm -rf /tmp/run10 /tmp/smoke10; mkdir -p /tmp/run10 /tmp/smoke10
VARIANTS=deep
timeout 120 python3 benchmarks/megakernel_ab.py --out /tmp/smoke10 \
  --cubins mma=$K/mk_mma.cubin mmadeep=$K/mk_deep.cubin --split-kv-cubin $K/split_kv.sm_90.cubin \
  --variants deepsmoke --repeats 1 --batches 1 2 4 --compile none 2>&1 | grep "bitwise\|greedy\|FAILED\|did not\|Error" | head -20
python3 -c "
import json, sys
d = json.load(open('/tmp/smoke10/results.json'))
ok = all(isinstance(d.get(b), dict) and d[b].get('bitwise', {}).get('mk-deep-norm-in', {}).get('equal') for b in ('b1', 'b2', 'b4'))
print('deep smoke', 'ok' if ok else 'FAILED'); sys.exit(0 if ok else 1)" || VARIANTS=mma
cp /tmp/smoke10/results.json "$OUT/smoke.json"
echo "smoke took $(( $(date +%s) - T0 )) s; timing set: $VARIANTS"
CUBINS="mma=$K/mk_mma.cubin mma9=$K/mk_mma9.cubin"
[ "$VARIANTS" = deep ] && CUBINS="$CUBINS mmadeep=$K/mk_deep.cubin"
timeout 330 python3 benchmarks/megakernel_ab.py --out /tmp/run10 --cubins $CUBINS \
  --split-kv-cubin $K/split_kv.sm_90.cubin --variants deep --repeats 7 --budget-s 250 \
  --batches 1 8 4 --compile max-autotune-no-cudagraphs --fused-chunks 0 64 2>&1 |
  grep -v "triton_mm\|AUTOTUNE\|strides:\|dtypes:\|Autotune\|best_kernel\|SingleProcess\|^  mm \|^  addmm\|TypedStorage\|current_out_size\|stage windows\|profile" | tail -n 45
cp /tmp/run10/results.json "$OUT/results.json"
echo "ab took $(( $(date +%s) - T0 )) s"
ROWGATE_NVCC="$(command -v nvcc)" timeout $(( 585 - ($(date +%s) - T0) )) python3 -m pytest \
  -p no:cacheprovider -m gpu -q -rs tests/megakernel/test_persistent_gpu.py 2>&1 | tail -n 15 |
  tee "$OUT/pytest-persistent-gpu.txt"
echo "all took $(( $(date +%s) - T0 )) s"
