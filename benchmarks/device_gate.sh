#!/usr/bin/env bash
# One device call: optionally the trace capture set and the megakernel benchmark, then
# `rowgate gate ROW` for each row given. The device returns at most 8 files: logs and
# results come back as $OUT/results.tar.gz, the sealed bundles as
# $OUT/evidence.tar.gz.part-* (15 MiB pieces). Run from the repo root
# with `.site` (or `.whl`) carried (the Python packages the device image lacks,
# benchmarks/device_site.sh, docs/operators.md):
#   bash benchmarks/device_gate.sh KERNEL-CUDA-DECODE-MEGAKERNEL [ROW ...]
# Environment: SKIP_TRACE=1 skips the trace capture set; MEGAKERNEL_BENCH="ARGS" runs
# lab/benchmarks/megakernel.py ARGS after the rows (results under megakernel/);
# GPU_TESTS=1 then runs the `gpu`-marked tests (log pytest-gpu.txt).
set -uo pipefail
R=/tmp/device-results  # everything but the evidence, tarred into $OUT at the end
rm -rf "$R" && mkdir -p "$R"
[ $# -ge 1 ] || { echo "usage: $0 ROW [ROW ...]" >&2; exit 2; }
. benchmarks/device_env.sh || exit 1
export ROWGATE_SIGNER=key
export XDG_CONFIG_HOME=/tmp/rowgate-config
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,driver_version --format=csv
nvcc --version | tail -2
# The device receives a copy of the working tree, with or without a .git that matches
# it: the subject is that tree committed as one signed-off snapshot commit (on top of
# the copied history when there is one, else on a fresh main), recorded as such.
if ! git rev-parse --verify -q HEAD >/dev/null 2>&1; then
  rm -rf .git && git init -q -b main . || exit 1
fi
if [ -n "$(git status --porcelain)" ]; then
  git add -A . && git -c user.name=rowgate-device -c user.email=device@rowgate.dev \
    commit -qs -m "device snapshot of the working tree" || exit 1
fi
# The subject commit travels back as a git bundle, so a reviewer can review exactly the
# commit the device gated (docs/operators.md): thin when its parent is a commit the
# reviewer has (the copied history), whole when the snapshot started a fresh repo.
if git rev-parse -q --verify HEAD~1 >/dev/null; then
  git bundle create "$R/subject.gitbundle" HEAD ^HEAD~1 2>/dev/null
else
  git bundle create "$R/subject.gitbundle" HEAD 2>/dev/null
fi
[ -n "${SKIP_TRACE:-}" ] || timeout 300 python3 benchmarks/trace_capture.py --device cuda --out "$R" 2>&1 | tee "$R/trace-log.txt"
n=0
for row in "$@"; do  # a row named twice runs twice (the second on the caches the first left)
  n=$((n + 1))
  start=$(date +%s)
  timeout "${GATE_TIMEOUT:-240}" python3 -m rowgate.cli.main gate "$row" --repo lab --out /tmp/evidence \
    --option nvcc="$(command -v nvcc)" 2>&1 | tee "$R/gate-log-$n-$row.txt"
  echo "$row: exit ${PIPESTATUS[0]} after $(( $(date +%s) - start )) s" | tee -a "$R/gate-walls.txt"
done
if [ -n "${MEGAKERNEL_BENCH:-}" ]; then
  # shellcheck disable=SC2086  # the variable holds the benchmark's arguments
  timeout "${MEGAKERNEL_TIMEOUT:-240}" python3 lab/benchmarks/megakernel.py --out "$R/megakernel" \
    --nvcc "$(command -v nvcc)" $MEGAKERNEL_BENCH 2>&1 | tee "$R/megakernel-log.txt"
fi
if [ -n "${GPU_TESTS:-}" ]; then
  ROWGATE_NVCC="$(command -v nvcc)" timeout "${GPU_TESTS_TIMEOUT:-240}" python3 -m pytest -p no:cacheprovider -m gpu -q -rs \
    tests lab/tests 2>&1 | tee "$R/pytest-gpu.txt"
fi
cp "$XDG_CONFIG_HOME/rowgate/signing-key.pub.pem" "$R/device-key.pub.pem" 2>/dev/null
tar czf "$OUT/results.tar.gz" -C "$R" .
# the device returns files of at most 16 MiB: split the sealed evidence
tar czf - -C /tmp evidence | split -b 15M - "$OUT/evidence.tar.gz.part-"
ls -la "$OUT"
