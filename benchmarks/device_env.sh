# Sourced by the device-call scripts (benchmarks/*.sh): rowgate's Python packages into
# /tmp/site, from the carried .site/site.tar.xz (benchmarks/device_site.sh) or else the
# carried .whl/ wheels, and PYTHONPATH to them and the tree. Returns non-zero if neither
# is there or the install fails.
if [ -f .site/site.tar.xz ]; then
  rm -rf /tmp/site && tar xJf .site/site.tar.xz -C /tmp || return 1
else
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
fi
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
# persistent_gpu_tests SECONDS EXPR LOG [CUBIN]: the persistent kernel's gpu tests picked by
# `-k EXPR`, at most SECONDS, on CUBIN when given (else the build gate's own build of the
# tree); the summary's last lines to LOG. The device-call scripts' one spelling of it.
persistent_gpu_tests() {
  ROWGATE_PERSISTENT_CUBIN="${4:-}" ROWGATE_NVCC="$(command -v nvcc)" timeout "$1" \
    python3 -m pytest -p no:cacheprovider --noconftest -m gpu -q -rs \
    tests/megakernel/test_persistent_gpu.py -k "$2" 2>&1 | tail -n 8 | tee "$3"
}
