#!/bin/bash
# Device call H: where the tiny model's host noise comes from (benchmarks/host_noise.py).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|NUMA|Model name|CPU max)" ; cat /sys/kernel/mm/transparent_hugepage/enabled /proc/sys/kernel/numa_balancing 2>/dev/null
cat /sys/devices/system/cpu/isolated 2>/dev/null; cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null
uptime
timeout 200 python3 benchmarks/host_noise.py cuda --seconds 130 --block-s 2 --also-load probe-qwen3-h2048-l16 --out $OUT/hn 2>&1 | tail -40
rm -rf $OUT/hn/scratch
uptime
