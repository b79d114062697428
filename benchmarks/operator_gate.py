"""Run one row's operator gate here, through the registered gate class, and
write its GateResult beside the raw artifacts (no sealing, no signing: this is
the device-side half of `rowgate gate`, for a machine without the signing stack).

    PYTHONPATH=. python3 benchmarks/operator_gate.py --row SM70-XQA-E5M2-DECODE \
        --out DIR [--option cubin=build/ops/sm_90/split_kv.cubin | --option nvcc=PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline import device, gates, runner  # noqa: E402
from pipeline.rows import resolve_row  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", default="SM70-XQA-E5M2-DECODE")
    ap.add_argument("--gate", default="operator")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    ns = ap.parse_args(argv)
    loaded = resolve_row(ns.row)
    spec = loaded.row.gate(ns.gate)
    options = dict(o.split("=", 1) for o in ns.option)
    ctx = runner.gate_context(loaded.row, spec, repo=REPO, artifact_dir=ns.out / ns.gate,
                              subject=None, provenance=None, devices=device.inventory(),
                              options=options)
    result = gates.run(loaded.row, spec, ctx, ns.out)
    (ns.out / ns.gate / "gate-result.json").write_text(result.model_dump_json(indent=1) + "\n")
    print(f"{result.gate_id}: {result.status.value} arch={result.arch} "
          f"stand_in={result.stand_in}: {result.reason}")
    for key in ("cases", "bitwise_mismatches", "reference_failures", "unwritten_elements",
                "nan_outputs", "max_abs_err"):
        print(f"  {key} = {result.metrics.get(key)}")
    return 0 if result.status.value in ("PASS", "PENDING") else 1


if __name__ == "__main__":
    sys.exit(main())
