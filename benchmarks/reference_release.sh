#!/usr/bin/env bash
# The megakernel row's reference release (cohere-ai/cohere-megakernel at 67d0b9ca) as a
# subject: make it a repository from a fetched copy of its files, commit rowgate's
# declarations on top (rows/declarations/cohere-megakernel), gate it with
# rows/REFERENCE-COHERE-MEGAKERNEL.toml (the pin, its own CMake build, the audit), and
# compute its executing path per decode step with its own schedule builder in the
# sandbox (benchmarks/reference_schedule.py). The release's files never enter this
# repository: RELEASE names the fetched copy (default .subjects/cohere-megakernel, an
# ignored directory; its PROVENANCE.json beside it lists each file's commit).
#   bash benchmarks/reference_release.sh [OUT]      # OUT default: $OUT or /tmp/reference-release
# NVCC: a complete CUDA 13 toolkit's nvcc (the release's CMake needs find_package(CUDAToolkit):
# cudart and the driver stub, which the nvcc wheels do not lay out); default: the one on PATH.
set -uo pipefail
out="${1:-${OUT:-/tmp/reference-release}}"
release="${RELEASE:-.subjects/cohere-megakernel}"
work="$out/subject"
mkdir -p "$out" && rm -rf "$work"
[ -d "$release" ] || { echo "no release copy at $release (RELEASE=DIR)" >&2; exit 2; }
cp -r "$release" "$work" && rm -rf "$work/.git"
git -C "$work" init -q -b main
git -C "$work" add -A --force  # every file as fetched, whatever its .gitignore files say
git -C "$work" -c user.name=rowgate -c user.email=rowgate@localhost commit -q -m \
  "cohere-megakernel 67d0b9ca (files as fetched)"
git -C "$work" branch -q release
cp -r rows/declarations/cohere-megakernel/kernels "$work/kernels"
git -C "$work" add kernels
git -C "$work" -c user.name=rowgate -c user.email=rowgate@localhost commit -q -s -m \
  "rowgate declarations: the build and audit of the release"
nvcc_opt=()
nvcc="${NVCC:-$(command -v nvcc || true)}"
[ -n "$nvcc" ] && nvcc_opt=(--option "nvcc=$nvcc")
python3 -m rowgate.cli.main gate rows/REFERENCE-COHERE-MEGAKERNEL.toml --repo "$work" \
  --base release --out "$out/evidence" "${nvcc_opt[@]}" 2>&1 | tee "$out/gate-log.txt"
status=${PIPESTATUS[0]}
PYTHONPATH=".:${PYTHONPATH:-}" python3 benchmarks/reference_schedule.py --subject "$work" \
  --out "$out" 2>&1 | tail -n 5
exit "$status"
