"""Terminal rendering of core objects: rich tables for `rowgate gate` and `inspect`, the
lines `rowgate review` prints.

Nothing here computes a verdict; it only shows what a bundle or run holds.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from pipeline.evidence import Bundle
from pipeline.records.gate_result import GateResult
from pipeline.records.review import Outcome, ReviewRecord
from pipeline.records.status import Status

if TYPE_CHECKING:
    from pipeline.build.local import LocalBuild
    from pipeline.rows import LoadedRow

STYLE = {Status.PASS: "green", Status.FAIL: "red", Status.PENDING: "yellow", Status.ERROR: "magenta"}
KEY_METRICS = 6
PLAIN_WIDTH = 160


def console(stderr: bool = False) -> Console:
    """A console that does not squeeze tables to 80 columns in CI logs and pipes."""
    c = Console(stderr=stderr)
    return c if c.is_terminal else Console(stderr=stderr, width=PLAIN_WIDTH)


def _metrics(result: GateResult) -> str:
    items = list(result.metrics.items())[:KEY_METRICS]
    return ", ".join(f"{k}={v}" for k, v in items)


def gate_table(results: list[GateResult], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in ("gate", "kind", "status", "reason", "key metrics"):
        table.add_column(col, overflow="fold")
    for r in results:
        arch = f" [{r.arch}{' stand-in' if r.stand_in else ''}]" if r.arch else ""
        table.add_row(r.gate_id, r.kind + arch, f"[{STYLE[r.status]}]{r.status.value}[/]",
                      r.reason, _metrics(r))
    return table


def print_inspect(bundle: Bundle, console: Console) -> None:
    m = bundle.manifest
    console.print(f"bundle   {bundle.path}")
    console.print(f"row      {m.row.id}  ({m.row.file}, sha256 {m.row.sha256[:12]}…)")
    console.print(f"subject  {m.subject.repo} {m.subject.branch} {m.subject.commit[:12]} "
                  f"(base {m.subject.base[:12]}, dirty={m.subject.dirty})")
    console.print(f"signer   {m.signer}")
    console.print(f"sealed   {m.created}   status [{STYLE[m.status]}]{m.status.value}[/]")
    console.print(gate_table(bundle.results(), "gates"))


def inspect_json(bundle: Bundle) -> str:
    m = bundle.manifest
    return json.dumps({
        "bundle": str(bundle.path), "id": bundle.id, "row": m.row.id,
        "subject": m.subject.model_dump(), "signer": m.signer.model_dump(),
        "status": m.status.value, "created": m.created,
        "gates": [json.loads(r.model_dump_json()) for r in bundle.results()]}, indent=2)


def resource_table(result: "LocalBuild") -> Table:
    """A rich Table: one row per kernel entry point per arch, used / budget."""
    def frac(used, budget) -> str:
        used = "-" if used is None else str(used)
        return used if budget is None else f"{used} / {budget}"

    table = Table(title=f"kernel resources (build {result.build.status.value}, "
                        f"audit {result.audit.status.value})", title_justify="left")
    for col in ("kernel", "entry point", "arch", "regs", "static smem B", "stack B",
                "spill st/ld B", "local B", "cmem[0] B", "SASS insns"):
        table.add_column(col, overflow="fold")
    for key, c in sorted(result.audit.cells.items(), key=lambda kv: kv[0].rsplit("@", 1)[::-1]):
        name_ep, arch = key.rsplit("@", 1)
        kernel, ep = name_ep.split("/", 1)
        table.add_row(kernel, ep, arch, frac(c["registers"], c["max_registers"]),
                      frac(c["static_shared"], c["max_static_shared"]), str(c["stack_frame"]),
                      f"{c['spill_stores']}/{c['spill_loads']}", str(c["local"]), str(c["cmem0"]),
                      "-" if c["sass_instructions"] is None else str(c["sass_instructions"]))
    return table


def rows_table(loaded_rows: list["LoadedRow"]) -> Table:
    """`rowgate rows`: every row's gates and whether each can run here."""
    from pipeline import device, gates

    devices = device.inventory()  # one enumeration for every row and gate listed
    table = Table(title="rows", title_justify="left")
    for col in ("row", "target", "gate", "kind", "here"):
        table.add_column(col, overflow="fold")
    for loaded in loaded_rows:
        row = loaded.row
        for n, spec in enumerate(row.gates):
            state, why = gates.availability(row, spec, devices)
            table.add_row(row.id if n == 0 else "", row.target.arch if n == 0 else "",
                          spec.id, spec.kind, f"{state}: {why}" if why else state)
    return table


def describe_review(record: ReviewRecord) -> list[str]:
    """Plain lines for a terminal: the summary, then the per-criterion table."""
    lines = [f"{record.row_id} bundle {record.bundle.id}: {record.verdict.value}"]
    lines += [f"  {reason}" for reason in record.reasons]
    for c in record.criteria:
        measured = ", ".join(f"{k}={v}" for k, v in c.measured.items()) or "-"
        # a pending criterion's detail repeats its gate's reason, listed above
        detail = f" ({c.detail})" if c.detail and c.outcome is not Outcome.PENDING else ""
        lines.append(f"  criterion {c.id}: {c.outcome.value}: {c.gate}.{c.metric} "
                     f"{c.comparison.symbol} {c.threshold:g} [{c.arch}] measured {measured}"
                     f"{detail}")
    for a in record.implementation:
        state = {True: "admitted", False: "not admitted", None: "undecided"}[a.admitted]
        lines.append(f"  implementation gated on {a.gate}: {state}: {a.reason}")
    return lines
