#!/bin/bash
# Device call V (issue 19, run 9): the attention phase -- split tasks emitted split-major
# (the same logits) and `one_wave` split plans (at most one split task per SM) -- with the
# kernel of run 8 (`mma8`, .devrun/k24) against the previous kernel `mma` (1ac5993) bit for
# bit, beside the graph-fused baselines; then the persistent kernel's gpu-marked tests.
# carry [".whl", ".devrun/k24"].
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
rm -rf /tmp/run9; mkdir -p /tmp/run9
timeout 400 python3 benchmarks/megakernel_ab.py --out /tmp/run9 \
  --cubins mma=.devrun/k24/mk_mma.cubin mma8=.devrun/k24/mk_mma8.cubin \
  --split-kv-cubin .devrun/k24/split_kv.sm_90.cubin --variants wave --repeats 7 --budget-s 300 \
  --batches 1 8 4 --compile max-autotune-no-cudagraphs --fused-chunks 0 64 2>&1 |
  grep -v "triton_mm\|AUTOTUNE\|strides:\|dtypes:\|Autotune\|best_kernel\|SingleProcess\|^  mm \|^  addmm\|TypedStorage\|current_out_size\|stage windows" | tail -n 60
cp /tmp/run9/results.json "$OUT/results.json"
echo "ab took $(( $(date +%s) - T0 )) s"
ROWGATE_NVCC="$(command -v nvcc)" timeout $(( 585 - ($(date +%s) - T0) )) python3 -m pytest \
  -p no:cacheprovider -m gpu -q -rs tests/megakernel/test_persistent_gpu.py 2>&1 | tail -n 15 |
  tee "$OUT/pytest-persistent-gpu.txt"
echo "all took $(( $(date +%s) - T0 )) s"
