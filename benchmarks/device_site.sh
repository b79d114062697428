#!/usr/bin/env bash
# The Python packages a lent device lacks, installed here once for its Python (3.12,
# x86-64) and packed as one xz tarball, .site/site.tar.xz: 16 MB where the wheels are
# 26 MB. The device tool sends the working tree and the carried paths, 64 MiB in all, and
# with the checked-in evidence (~29 MB of docs/evidence) the tree and the wheels no longer
# fit; the unpacked site compresses better than the wheels' per-file deflate.
#   bash benchmarks/device_site.sh        # here, after filling .whl (docs/operators.md)
# then carry [".site"] instead of [".whl"]; benchmarks/device_env.sh unpacks it there.
#   bash benchmarks/device_site.sh pydantic pydantic_core annotated_types typing_inspection
# packs only the wheels named (the full site, 9.5 MB, no longer fits beside the 56.6 MB tree;
# the megakernel benchmarks need only pydantic's four packages, 2 MB: run 77).
# pip installs the wheels (their .dist-info, .data and entry points handled as pip does);
# it only targets the device's interpreter instead of this one's.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "$(ls .whl/*.whl 2>/dev/null)" ] || { echo "no wheels in .whl/ (docs/operators.md)" >&2; exit 2; }
wheels=(.whl/*.whl)
if [ $# -gt 0 ]; then
  wheels=()
  for name in "$@"; do
    found=$(ls .whl/"$name"-[0-9]*.whl 2>/dev/null | head -1)
    [ -n "$found" ] || { echo "no wheel of $name in .whl/" >&2; exit 2; }
    wheels+=("$found")
  done
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  --target "$tmp/site" "${wheels[@]}"
mkdir -p .site
tar cJf .site/site.tar.xz.part -C "$tmp" site
mv .site/site.tar.xz.part .site/site.tar.xz   # whole or absent
ls -la .site/site.tar.xz
