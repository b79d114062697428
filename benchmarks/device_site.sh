#!/usr/bin/env bash
# What a lent device lacks, packed here once for its Python (3.12, x86-64) as one xz
# tarball, .site/site.tar.xz: rowgate's own wheel (built from this checkout) and the
# wheels in .whl/ (the packages the device image lacks: docs/operators.md), installed
# into a site directory the way pip installs them, plus bubblewrap and the libraries it
# links (the image has no bwrap). The device tool sends the tree and the carried paths,
# 64 MiB in all; the unpacked site compresses better than the wheels' own deflate.
#   bash benchmarks/device_site.sh      # then carry [".site"]; device_env.sh unpacks it
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "$(ls .whl/*.whl 2>/dev/null)" ] || { echo "no wheels in .whl/ (docs/operators.md)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip wheel -q --no-deps -w "$tmp/own" .
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  --target "$tmp/site" .whl/*.whl "$tmp"/own/rowgate-*.whl
if command -v bwrap >/dev/null; then
  mkdir -p "$tmp/site/bwrap/lib"
  cp "$(command -v bwrap)" "$tmp/site/bwrap/"
  ldd "$(command -v bwrap)" | awk '/=> \//{print $3}' | grep -v -e libc.so -e ld-linux \
    | xargs -r cp -t "$tmp/site/bwrap/lib/"
fi
mkdir -p .site
tar cJf .site/site.tar.xz.part -C "$tmp" site
mv .site/site.tar.xz.part .site/site.tar.xz   # whole or absent
ls -la .site/site.tar.xz
