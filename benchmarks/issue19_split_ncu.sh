#!/usr/bin/env bash
# One device call (issue 19, run 78, after runs 75-77): where a persistent split warp's
# ~1 us a token goes. Builds the tree's tensor-core persistent kernel with -lineinfo (the same SASS as the
# build gate's: line tables only) and takes ncu's source counters of one b1 step of run 77's
# `kv1-norm-in` list (one fat split task a kv head, 16 tokens a warp) and of the default
# list, summed by line of kernels/persistent/attention_split.cuh
# (benchmarks/megakernel_ncu.py --source). carry [".site"], made with `bash
# benchmarks/device_site.sh pydantic pydantic_core annotated_types typing_inspection` (the
# full site no longer fits beside the tree); results in $OUT/{kv1,default}: ncu.json (the
# step's counters), source.json (stall samples by line), the reports.
# CUBINS="mk_mma mk_mmaraw4" (run 80) profiles those builds of issue19_build.sh side by side
# (each named by what follows mk_, the reports dropped: 8 files come back at most).
set -u
CUBINS=${CUBINS:-mk_mma}
. benchmarks/device_env.sh || exit 1
ONLY=$CUBINS EXTRA=-lineinfo bash benchmarks/issue19_build.sh /tmp/kli > /tmp/build.txt 2>&1 ||
  { tail -20 /tmp/build.txt; exit 1; }
K=/tmp/kli/cubins
args=()
for c in $CUBINS; do args+=(--cubin "${c#mk_}=$K/$c.cubin"); done
for list in kv1 default; do
  if [ "$list" = kv1 ]; then
    OPT='{"fine_deps": false, "fuse_norm": true, "fuse_merge": false, "kv_splits": 1}'
  else
    OPT='{"fine_deps": false, "fuse_norm": true, "fuse_merge": false}'
  fi
  timeout 280 python3 benchmarks/megakernel_ncu.py --out "$OUT/$list" --batch 1 \
    --options "$OPT" "${args[@]}" \
    --source kernels/persistent/attention_split.cuh 2>&1 | tail -n 6
  tail -n 3 "$OUT/$list"/*.log
  rm -f "$OUT/$list/ncu.csv" "$OUT/$list"/*.log   # ncu.json holds its rows; 8 files at most
  [ "$CUBINS" = mk_mma ] || rm -f "$OUT/$list"/*.ncu-rep
done
for c in $CUBINS; do cp "$K/$c.cubin" "$OUT/$c-lineinfo.cubin"; done   # their SASS, for the pcs
