#!/usr/bin/env bash
# One device call: `rowgate gate` on an external subject (pagedmini) and on the
# same subject with a planted last-page bug, and on rowgate's own tree, with the same rows
# and gates (benchmarks/subject_gates.py); then, with GPU_TESTS=1, the gpu-marked tests of
# the contract (tests/ops/test_decode_attention_gpu.py, tests/gates/test_operator_gpu.py,
# tests/gates/test_subject_gpu.py; SKIP_GATES=1 runs those alone). Run from the repo root
# with `.site` (or `.whl`) carried (the Python packages the device image lacks,
# benchmarks/device_site.sh, docs/operators.md):
#   bash benchmarks/subject_gates.sh                  # the gates (about 5 minutes)
#   SKIP_GATES=1 GPU_TESTS=1 bash benchmarks/subject_gates.sh   # the gpu-marked tests
#   ONLY=pagedmini bash benchmarks/subject_gates.sh   # one subject (re-seal its bundle)
#   ONLY="pagedv pagedv-bug" bash benchmarks/subject_gates.sh   # several
# Writes $OUT/summary.txt (one line per expectation, ok/FAIL), $OUT/results.tar.gz (the
# summary JSON, every gate log, the device's public key), the sealed evidence bundles
# with their raw artifacts (cases.json, timing.json, phase.json, ncu-*.csv, aot.json) as
# $OUT/evidence.tar.gz.part-* (15 MiB pieces: cat them | tar xzf -) and, with GPU_TESTS=1,
# $OUT/pytest-gpu.txt. Exit status: the script's (0: every expectation held).
set -uo pipefail
R=/tmp/subject-gates
rm -rf "$R" && mkdir -p "$R"
. benchmarks/device_env.sh || exit 1
export ROWGATE_SIGNER=key
export XDG_CONFIG_HOME=/tmp/rowgate-config ROWGATE_CACHE_DIR=/tmp/rowgate-cache
NVCC="$(command -v nvcc)"
{ nvidia-smi --query-gpu=name,driver_version --format=csv; "$NVCC" --version | tail -2;
  command -v ncu && ncu --version | tail -1; } 2>&1 | tee "$R/environment.txt"
status=0
if [ -z "${SKIP_GATES:-}" ]; then
  PYTHONPATH=".:$PYTHONPATH" timeout "${SCRIPT_TIMEOUT:-480}" python3 benchmarks/subject_gates.py --out "$R" --nvcc "$NVCC" \
    $(for name in ${ONLY:-}; do printf -- '--only %s ' "$name"; done) 2>&1 | tee "$OUT/summary.txt"
  status=${PIPESTATUS[0]}
fi
if [ -n "${GPU_TESTS:-}" ]; then
  ROWGATE_NVCC="$NVCC" timeout "${GPU_TESTS_TIMEOUT:-420}" python3 -m pytest -p no:cacheprovider \
    -m gpu -q -rs tests/ops/test_decode_attention_gpu.py tests/gates/test_operator_gpu.py \
    tests/gates/test_subject_gpu.py 2>&1 | tee "$OUT/pytest-gpu.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
cp "$XDG_CONFIG_HOME/rowgate/signing-key.pub.pem" "$R/device-key.pub.pem" 2>/dev/null
rm -rf "$R/subjects"  # the subjects are remade from the fixture; their evidence is kept
tar czf "$OUT/results.tar.gz" -C "$R" --exclude=./evidence .
# the device returns files of at most 16 MiB: split the sealed evidence
tar czf - -C "$R" evidence | split -b 15M - "$OUT/evidence.tar.gz.part-"
ls -la "$OUT"
exit "$status"
