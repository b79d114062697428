"""Run one row's operator gate here, through the registered gate classes, and write
the GateResults beside the raw artifacts (no sealing, no signing: this is the
device-side half of `rowgate gate`, for a machine without the signing stack). The
operator gate measures the cubins of the row's build gate, so that gate runs first,
into the same directory, as in a bundle.

    PYTHONPATH=. python3 benchmarks/operator_gate.py --row SM70-XQA-E5M2-DECODE \
        --out DIR [--repo SUBJECT] [--option nvcc=PATH]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rowgate import gates
from rowgate.rows.row import resolve_row
from rowgate.run import runner
from rowgate.seal import device

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--row", default="SM70-XQA-E5M2-DECODE")
    ap.add_argument("--gate", default="operator")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--repo", type=Path, default=REPO, help="the subject (default: rowgate)")
    ns = ap.parse_args(argv)
    loaded = resolve_row(ns.row)
    options = dict(o.split("=", 1) for o in ns.option)
    devices = device.inventory()
    wanted = loaded.row.gate(ns.gate)
    order = [g for g in loaded.row.gates if g.kind == "build" or g.id == wanted.id]
    for spec in order[:order.index(wanted) + 1]:
        ctx = runner.gate_context(loaded.row, spec, repo=ns.repo,
                                  artifact_dir=ns.out / "artifacts" / spec.id, subject=None,
                                  provenance=None, devices=devices, options=options)
        result = gates.run(loaded.row, spec, ctx, ns.out)
        (ctx.artifact_dir / "gate-result.json").write_text(result.model_dump_json(indent=1)
                                                           + "\n")
    print(f"{result.gate_id}: {result.status.value} arch={result.arch} "
          f"stand_in={result.stand_in}: {result.reason}")
    for key in ("cases", "bitwise_mismatches", "reference_failures", "unwritten_elements",
                "nan_outputs", "max_abs_err"):
        print(f"  {key} = {result.metrics.get(key)}")
    return 0 if result.status.value in ("PASS", "PENDING") else 1


if __name__ == "__main__":
    sys.exit(main())
