#!/bin/bash
# Device call Q (issue 19, run 5): the tensor-core persistent kernel with its norms and
# merges fused into the consumers' prologues (benchmarks/megakernel_ab.py --variants fuse),
# the max-autotune graph-fused baseline at b1 only (its compile is most of the call).
# Cubins from `bash benchmarks/issue19_build.sh .devrun/k20` (mk_mma, split_kv); carry
# [".whl", ".devrun/k21"].
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
mkdir -p /tmp/run5
timeout 330 python3 benchmarks/megakernel_ab.py --out /tmp/run5 --cubins mma=.devrun/k21/mk_mma.cubin \
  --split-kv-cubin .devrun/k21/split_kv.sm_90.cubin --variants fuse --repeats 7 --budget-s 60 \
  --compile max-autotune-no-cudagraphs 2>&1 | grep -v "triton_mm\|AUTOTUNE\|strides:\|dtypes:\|Autotune\|best_kernel\|SingleProcess\|^  mm \|^  addmm\|TypedStorage\|current_out_size" | tail -n 60
cp /tmp/run5/results.json "$OUT/results.json"
echo "all took $(( $(date +%s) - T0 )) s"
