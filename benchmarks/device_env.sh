# Sourced by the device-call scripts (benchmarks/*.sh, lab/benchmarks/*.sh): what a lent
# device lacks, from the carried .site/site.tar.xz (benchmarks/device_site.sh): rowgate's
# wheel and the Python packages the image lacks into /tmp/site (rowgate installed as a
# user installs it, never from the tree), bubblewrap and its libraries into /tmp/bwrap
# (every subject step runs in it), and the lab installed editable (a subject checkout).
# Returns non-zero if the site is not there or an install fails.
[ -f .site/site.tar.xz ] || { echo "no .site/site.tar.xz carried (benchmarks/device_site.sh)" >&2; return 1; }
rm -rf /tmp/site /tmp/bwrap && tar xJf .site/site.tar.xz -C /tmp || return 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
if [ -d /tmp/site/bwrap ] && ! command -v bwrap >/dev/null; then
  mv /tmp/site/bwrap /tmp/bwrap
  export PATH="/tmp/bwrap:$PATH" LD_LIBRARY_PATH="/tmp/bwrap/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e lab >/dev/null || return 1
