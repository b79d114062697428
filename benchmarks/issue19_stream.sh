#!/usr/bin/env bash
# One device call (issue 19, run 86): the weight stream across the stage barrier
# (RG_MK_STREAM=1, megakernel_ab.py `--variants stream`): builds split_kv (the graph-fused
# engine's), the tree's persistent kernel (mk_mma) and the stream build (mk_mmastream) with
# issue19_build.sh's ONLY, then times the stream set at b1, b4 and b8 beside the tree's
# kernel on its default lists and on the padded static lists (every list bitwise its
# family's unfused list, greedy tokens against eager), after the stream build's bit-for-bit
# gpu test (tests/megakernel/test_persistent_gpu.py -k stream_ring); COMPILE=max-autotune-no-cudagraphs
# adds the strong baseline's compile to the same rounds (a few minutes a batch).
# carry [".site"] (benchmarks/device_site.sh pydantic pydantic_core annotated_types
# typing_inspection); results in $OUT. SET=streamtail (run 87) times megakernel_ab.py's
# `streamtail` set instead (SKIP_TEST=1 leaves the bit-for-bit test out). SET=plain (run 88)
# times the tree's kernel (RG_MK_STREAM=1 since run 87) beside the plain ring it replaced;
# SUITE=SECONDS then runs every persistent gpu test but the latency variants on it. Since
# run 87 mk_mma is the tree's kernel (RG_MK_STREAM=1): runs 86-87 ran the RG_MK_MMA=1 build
# as mk_mma, and the one flag RG_MK_STREAM=1 as mk_mmastream.
set -u
T0=$(date +%s)
. benchmarks/device_env.sh || exit 1
K=/tmp/k/cubins
ONLY="split_kv.sm_90 mk_mma mk_mmaplain mk_mmastream mk_mmastreamt" bash benchmarks/issue19_build.sh \
  /tmp/k > /tmp/build.txt 2>&1 || { tail -20 /tmp/build.txt; exit 1; }
grep -H "registers" "$K"/mk_*.log | tee "$OUT/registers.txt"
echo "build took $(( $(date +%s) - T0 )) s"
# the stream build bit for bit against the tree's kernel on a tensor-core tiny model first
# (its own process: a fault there leaves the timing's CUDA context alone)
[ -n "${SKIP_TEST:-}" ] ||
  persistent_gpu_tests 150 "${TEST_K:-stream_ring}" "$OUT/pytest-stream.txt" "$K/mk_mma.cubin"
echo "bitwise test took $(( $(date +%s) - T0 )) s"
rm -rf /tmp/runstream && mkdir -p /tmp/runstream
timeout "${AB_LIMIT:-480}" python3 benchmarks/megakernel_ab.py --out /tmp/runstream \
  --cubins mma="$K/mk_mma.cubin" mma9="$K/mk_mma.cubin" mmastream="$K/mk_mmastream.cubin" \
  mmastreamt="$K/mk_mmastreamt.cubin" mmaplain="$K/mk_mmaplain.cubin" --split-kv-cubin "$K/split_kv.sm_90.cubin" \
  --variants "${SET:-stream}" --repeats "${REPEATS:-7}" \
  --batches ${BATCHES:-1 4 8} --compile "${COMPILE:-none}" --fused-chunks 0 2>&1 |
  grep -v "profile" | tail -n 150
cp /tmp/runstream/results.json "$OUT/results.json"
if [ -n "${SUITE:-}" ]; then  # SUITE=SECONDS: the persistent gpu suite on the tree's kernel
  persistent_gpu_tests "$SUITE" "not latency_variant" "$OUT/pytest-suite.txt" "$K/mk_mma.cubin"
fi
echo "all took $(( $(date +%s) - T0 )) s"
