#!/bin/bash
# Device call O (issue 18): the SM70 row's gate on the sm_90 stand-in and the external
# subject pagedmini re-sealed in the compact format, then the gpu-marked tests not run on
# the merged tree yet (the subject contract's, the persistent engine's); first ncu on the
# persistent b1 step (issue 19's measured limit; cubins from benchmarks/issue19_build.sh).
# carry [".whl", ".devrun/ncu"].
set -u
T0=$(date +%s)
rm -rf /tmp/evidence /tmp/mkncu  # a warm machine keeps the last call's /tmp
mkdir -p "$OUT/sm70" "$OUT/pagedmini" /tmp/mkncu
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
PYTHONPATH="/tmp/site:$PWD" timeout 150 python3 benchmarks/megakernel_ncu.py --out /tmp/mkncu \
  --batch 1 --cubin mma=.devrun/ncu/mk_mma.cubin --cubin mmal2=.devrun/ncu/mk_mmal2.cubin 2>&1 | tail -n 6
tar czf "$OUT/ncu.tar.gz" -C /tmp/mkncu .
echo "ncu took $(( $(date +%s) - T0 )) s"
OUT=$OUT/sm70 SKIP_TRACE=1 GATE_TIMEOUT=200 bash benchmarks/device_gate.sh SM70-XQA-E5M2-DECODE 2>&1 | tail -n 40
echo "sm70 took $(( $(date +%s) - T0 )) s"
OUT=$OUT/pagedmini ONLY=pagedmini GPU_TESTS=1 SCRIPT_TIMEOUT=250 GPU_TESTS_TIMEOUT=150 \
  bash benchmarks/subject_gates.sh 2>&1 | tail -n 30
echo "pagedmini took $(( $(date +%s) - T0 )) s"
export PYTHONPATH="/tmp/site:$PWD"
ROWGATE_NVCC="$(command -v nvcc)" timeout 120 python3 -m pytest -p no:cacheprovider -m gpu -q -rs \
  tests/megakernel/test_persistent_gpu.py 2>&1 | tail -n 15 | tee "$OUT/pytest-persistent-gpu.txt"
echo "all took $(( $(date +%s) - T0 )) s"
