#!/usr/bin/env bash
# One device call: vLLM's own paged attention gated as docs/contracts.md's walk-through
# says, on the released source. vLLM 0.22.0's sdist is the last release with
# csrc/attention/paged_attention_v1.cu. The whole sdist (36 MB) does not fit a device
# call beside the tree, so `pack` (here, once) checks the sdist
# .subjects/vllm-0.22.0.tar.gz against its sha256 and keeps its sources, byte for byte:
# csrc/, cmake/ and the top-level build files (0.6 MB, .subjects/vllm-0.22.0-src.tar.xz).
# On the device that is made a git repository, the declarations of
# docs/examples/vllm-paged-attention/ are committed beside it, and `rowgate gate
# VLLM-PAGED-ATTENTION-SM90` builds, audits and gates it.
#   bash benchmarks/vllm_subject.sh pack     # here; then carry [".site", ".subjects"]
#   bash benchmarks/vllm_subject.sh          # on the device
# Environment: GATE_TIMEOUT (default 540 s); GPU_TESTS="PYTEST ARGS" then runs those
# gpu-marked tests (log pytest-gpu.txt). Returns $OUT/results.tar.gz (logs, the device's
# public key, the subject's commits as a git bundle) and the sealed bundle as
# $OUT/evidence.tar.gz.part-* (15 MiB pieces).
set -uo pipefail
SDIST=.subjects/vllm-0.22.0.tar.gz
SHA256=6d41581a9e5288cd69278518a550c6d7ce510ae27a506556a3427d01284be7fe
SOURCES=.subjects/vllm-0.22.0-src.tar.xz
KEPT=(csrc cmake CMakeLists.txt LICENSE pyproject.toml setup.py PKG-INFO README.md)
EXAMPLE=docs/examples/vllm-paged-attention
if [ "${1:-}" = pack ]; then
  echo "$SHA256  $SDIST" | sha256sum -c - || exit 2
  tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
  tar xzf "$SDIST" -C "$tmp" && tar cJf "$SOURCES" -C "$tmp/vllm-0.22.0" "${KEPT[@]}" || exit 1
  ls -la "$SOURCES"
  exit 0
fi
R=/tmp/vllm-results
rm -rf "$R" /tmp/vllm-evidence && mkdir -p "$R/src/vllm-0.22.0"
. benchmarks/device_env.sh || exit 1
export ROWGATE_SIGNER=key XDG_CONFIG_HOME=/tmp/rowgate-config
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$R/environment.txt"
nvcc --version | tail -2 | tee -a "$R/environment.txt"
python3 -m pip list 2>/dev/null | grep -i -E "^(torch|nvidia-cu(blas|sparse|solver)) " | tee -a "$R/environment.txt"
S="$R/src/vllm-0.22.0"
tar xJf "$SOURCES" -C "$S" || exit 1
commit() { git -C "$S" -c user.name=rowgate-device -c user.email=device@rowgate.dev commit -qs -m "$1"; }
git -C "$S" init -q -b main && git -C "$S" add -A &&
  commit "vLLM 0.22.0's sources as released: ${KEPT[*]} of the sdist (sha256 $SHA256)" || exit 1
mkdir -p "$S/kernels" "$S/rows"
cp "$EXAMPLE/kernels.toml" "$S/kernels/" && cp "$EXAMPLE/rowgate_harness.py" "$S/" &&
  cp "$EXAMPLE/VLLM-PAGED-ATTENTION-SM90.toml" "$S/rows/" || exit 1
git -C "$S" add -A && commit "rowgate's declarations ($EXAMPLE)" || exit 1
git -C "$S" log --format='%H %s' | tee "$R/subject-commits.txt"
git -C "$S" bundle create "$R/declarations.gitbundle" HEAD ^HEAD~1 2>/dev/null
(cd "$S" && timeout "${GATE_TIMEOUT:-540}" python3 -m rowgate.cli.main gate VLLM-PAGED-ATTENTION-SM90 \
   --repo . --out /tmp/vllm-evidence --option nvcc="$(command -v nvcc)") 2>&1 | tee "$R/gate-log.txt"
status=${PIPESTATUS[0]}
if [ -n "${GPU_TESTS:-}" ]; then
  # shellcheck disable=SC2086  # the variable holds pytest's arguments
  ROWGATE_NVCC="$(command -v nvcc)" timeout "${GPU_TESTS_TIMEOUT:-240}" python3 -m pytest \
    -p no:cacheprovider -m gpu -q -rs $GPU_TESTS 2>&1 | tee "$R/pytest-gpu.txt"
fi
cp "$XDG_CONFIG_HOME/rowgate/signing-key.pub.pem" "$R/device-key.pub.pem" 2>/dev/null
rm -rf "$R/src"
tar czf "$OUT/results.tar.gz" -C "$R" .
tar czf - -C /tmp vllm-evidence | split -b 15M - "$OUT/evidence.tar.gz.part-"
ls -la "$OUT"
exit "$status"
