"""Which of the deep candidate's build variants was fastest at B16x16K (deep_pick.sh).

    python3 benchmarks/deep_pick.py RESULTS_JSON BUILD [BUILD ...]

RESULTS_JSON is decode_attention.py's results.json of a `--deep-builds` run; BUILD a name
of its DEEP_BUILDS ("ps", "psr", ...). A build counts only where both its E5M2 and its
bf16 kernel were bit for bit its baseline's at B16x16K; of those, the one whose E5M2 and
bf16 medians sum least is printed (nothing where none counts). The pick only says which
build the call checks whole (sanitizers, the operator gate's matrices): the timings stay
what decode_attention.py recorded, each with its samples.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def pick(results: dict[str, Any], builds: list[str]) -> str | None:
    """The counted build with the least E5M2 + bf16 median, or None."""
    bench = results.get("bench_large", {})
    bitwise = bench.get("bitwise_equal_to_baseline", {})
    variants = bench.get("variants", {})
    sums: dict[str, float] = {}
    for b in builds:
        names = [f"e5m2_deep_{b}", f"bf16_deep_{b}"]
        if all(bitwise.get(n) is True and n in variants for n in names):
            sums[b] = sum(float(variants[n]["median_us"]) for n in names)
    return min(sums, key=lambda b: sums[b]) if sums else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("builds", nargs="+")
    ns = ap.parse_args(argv)
    try:
        results = json.loads(ns.results.read_text())
    except (OSError, ValueError) as e:
        print(f"deep_pick: cannot read {ns.results}: {e}", file=sys.stderr)
        return 2
    best = pick(results, ns.builds)
    if best is not None:
        print(best)
    return 0


if __name__ == "__main__":
    sys.exit(main())
