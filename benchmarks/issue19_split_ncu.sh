#!/usr/bin/env bash
# One device call (issue 19, after runs 75-77): where a persistent split warp's ~1 us a token
# goes. Builds the tree's tensor-core persistent kernel with -lineinfo (the same SASS as the
# build gate's: line tables only) and takes ncu's source counters of one b1 step of run 77's
# `kv1-norm-in` list (one fat split task a kv head, 16 tokens a warp) and of the default
# list, summed by line of kernels/persistent/attention_split.cuh
# (benchmarks/megakernel_ncu.py --source). carry [".site"], made with `bash
# benchmarks/device_site.sh pydantic pydantic_core annotated_types typing_inspection` (the
# full site no longer fits beside the tree); results in $OUT/{kv1,default}: ncu.json (the
# step's counters), source.json (stall samples by line), the reports.
set -u
. benchmarks/device_env.sh || exit 1
ONLY=mk_mma EXTRA=-lineinfo bash benchmarks/issue19_build.sh /tmp/kli > /tmp/build.txt 2>&1 ||
  { tail -20 /tmp/build.txt; exit 1; }
K=/tmp/kli/cubins
for list in kv1 default; do
  if [ "$list" = kv1 ]; then
    OPT='{"fine_deps": false, "fuse_norm": true, "fuse_merge": false, "kv_splits": 1}'
  else
    OPT='{"fine_deps": false, "fuse_norm": true, "fuse_merge": false}'
  fi
  timeout 280 python3 benchmarks/megakernel_ncu.py --out "$OUT/$list" --batch 1 \
    --options "$OPT" --cubin mma="$K/mk_mma.cubin" \
    --source kernels/persistent/attention_split.cuh 2>&1 | tail -n 6
done
