#!/bin/bash
# Device call S (issue 19, run 6): the merges and norms without their serial L2 round
# trips (`mma6`, the tree's kernel) against the previous kernel (`mma`, built from HEAD
# 1ac5993), bit for bit and timed, beside the graph-fused baselines with the contract's
# split_kv plan and with 64-token splits, each profiled by kernel; then the persistent
# kernel's gpu-marked tests on the tree. Cubins built here (nvcc 13.0.88, the build gate's
# flags) into .devrun/k22; carry [".whl", ".devrun/k22"].
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
rm -rf /tmp/run6; mkdir -p /tmp/run6
timeout 400 python3 benchmarks/megakernel_ab.py --out /tmp/run6 \
  --cubins mma=.devrun/k22/mk_mma.cubin mma6=.devrun/k22/mk_mma6.cubin \
  --split-kv-cubin .devrun/k22/split_kv.sm_90.cubin --variants merge --repeats 7 --budget-s 300 \
  --batches 1 8 4 --compile max-autotune-no-cudagraphs --fused-chunks 0 64 2>&1 |
  grep -v "triton_mm\|AUTOTUNE\|strides:\|dtypes:\|Autotune\|best_kernel\|SingleProcess\|^  mm \|^  addmm\|TypedStorage\|current_out_size" | tail -n 70
cp /tmp/run6/results.json "$OUT/results.json"
echo "ab took $(( $(date +%s) - T0 )) s"
ROWGATE_NVCC="$(command -v nvcc)" timeout $(( 585 - ($(date +%s) - T0) )) python3 -m pytest \
  -p no:cacheprovider -m gpu -q -rs tests/megakernel/test_persistent_gpu.py 2>&1 | tail -n 15 |
  tee "$OUT/pytest-persistent-gpu.txt"
echo "all took $(( $(date +%s) - T0 )) s"
