#!/usr/bin/env bash
# The reference release on a lent GPU, in the parts one device call can hold (each
# part well under the call's 10 minutes; the machine keeps /tmp between calls while
# warm). Run from the repo root with `.site` and `.release` carried (.release holds
# the fetched release packed: tar cJf .release/cohere-megakernel.tar.xz -C .subjects
# cohere-megakernel cohere-megakernel.PROVENANCE.json):
#   bash benchmarks/reference_device.sh gate     # the row: pin, its own build, audit
#   bash benchmarks/reference_device.sh decode   # its synthetic decode, b1 and b8, timed
#   bash benchmarks/reference_device.sh lab      # the lab's megakernel at the same context
# Each part leaves $OUT/reference-PART.tar.gz (logs, JSON, evidence) and the device's
# public key; the sealed bundle is checked in with benchmarks/checkin_evidence.py.
set -uo pipefail
. benchmarks/device_env.sh || exit 1
export XDG_CONFIG_HOME=/tmp/rowgate-config ROWGATE_SIGNER=key
rel=/tmp/rel/cohere-megakernel
if [ ! -d "$rel" ]; then
  mkdir -p /tmp/rel && tar xJf .release/cohere-megakernel.tar.xz -C /tmp/rel || exit 1
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > /tmp/ref-env.txt
nvcc --version | tail -2 >> /tmp/ref-env.txt
status=0
for part in "$@"; do
  dir=/tmp/ref-$part && rm -rf "$dir" && mkdir -p "$dir" && cp /tmp/ref-env.txt "$dir/env.txt"
  case "$part" in
    gate) RELEASE=$rel NVCC=$(command -v nvcc) timeout 560 bash benchmarks/reference_release.sh "$dir" \
            > "$dir/run.txt" 2>&1 || status=$?
          rm -rf "$dir/subject" ;;
    decode) PYTHONPATH=".:$PYTHONPATH" timeout 560 python3 benchmarks/reference_decode.py \
              --subject "$rel" --out "$dir" --batches ${BATCHES:-1 8} > "$dir/run.txt" 2>&1 || status=$? ;;
    lab) PYTHONPATH=".:$PYTHONPATH" timeout 400 python3 lab/benchmarks/megakernel.py --out "$dir" \
           --batches ${BATCHES:-1 8} --sections steps --repeats "${REPEATS:-7}" \
           > "$dir/run.txt" 2>&1 || status=$? ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
  tail -n 25 "$dir/run.txt"
  tar czf "$OUT/reference-$part.tar.gz" -C /tmp "ref-$part"
done
cp "$XDG_CONFIG_HOME/rowgate/signing-key.pub.pem" "$OUT/device-key.pub.pem" 2>/dev/null
exit "$status"
