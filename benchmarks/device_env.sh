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
