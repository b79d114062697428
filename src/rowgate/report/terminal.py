"""Terminal rendering of core objects: rich tables for `rowgate gate`, `inspect`, `rows`,
`build` and `review`.

Nothing here computes a verdict; it only shows what a bundle, run or record holds.
Every piece of text from a bundle, a row or a subject goes into a `rich.text.Text`,
never through rich's markup parser: a reason that says `pip install 'rowgate[cuda13]'`
prints as written (markup would eat `[cuda13]`). Identifiers (gate ids, kinds, arches,
statuses) never wrap; reasons and metrics wrap at spaces. A gate measured on a
stand-in arch says `sm_90 (stand-in)`, as the Markdown and HTML reports do.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from rowgate.records.gate_result import GateResult
from rowgate.records.identity import SignerIdentity
from rowgate.records.review import Outcome, ReviewRecord
from rowgate.records.status import MetricValue, Status
from rowgate.report.model import Table as ModelTable
from rowgate.report.timing import time_table
from rowgate.report.units import metric
from rowgate.seal.bundle import Bundle

if TYPE_CHECKING:
    from rowgate.report.compare import Comparison
    from rowgate.report.history import History
    from rowgate.rows.row import LoadedRow
    from rowgate.run.local_build import LocalBuild

STYLE = {Status.PASS: "green", Status.FAIL: "red", Status.PENDING: "yellow", Status.ERROR: "magenta"}
VERDICT_STYLE = {"APPROVE": "green", "REJECT": "red", "PENDING": "yellow"}
KEY_METRICS = 6
PLAIN_WIDTH = 160


def console(stderr: bool = False) -> Console:
    """A console that does not squeeze tables to 80 columns in CI logs and pipes
    (`COLUMNS`, when set, is the width: what a test or a narrow log asks for)."""
    c = Console(stderr=stderr)
    if c.is_terminal:
        return c
    width = os.environ.get("COLUMNS", "")
    return Console(stderr=stderr, width=int(width) if width.isdigit() else PLAIN_WIDTH)


def where(arch: str, stand_in: bool) -> str:
    """`sm_90 (stand-in)` for a gate measured on a stand-in; `—` for no arch."""
    if not arch:
        return "—"
    return f"{arch} (stand-in)" if stand_in else arch


def status_text(status: Status | str) -> Text:
    """A gate status or review verdict, coloured."""
    value = status.value if isinstance(status, Status) else status
    statuses = {s.value: s for s in Status}
    style = STYLE[statuses[value]] if value in statuses else VERDICT_STYLE.get(value, "")
    return Text(value, style=style)


def key_metrics(metrics: dict[str, MetricValue], limit: int = KEY_METRICS) -> str:
    """The first `limit` metrics that have a value, one `name=value` per line."""
    shown = [(k, v) for k, v in metrics.items() if v is not None][:limit]
    return "\n".join(f"{k}: {metric(k, v)}" for k, v in shown)  # wraps after the colon


def _rich(t: ModelTable) -> Table:
    """A report table (`rowgate.report.model.Table`) for the terminal; its last column
    wraps."""
    table = _table(t.title, [(c, i == len(t.columns) - 1) for i, c in enumerate(t.columns)])
    for row in t.rows:
        table.add_row(*(Text(str(v)) for v in row))
    return table


def _table(title: str, columns: Iterable[tuple[str, bool]]) -> Table:
    """Columns as (name, wraps): identifiers never wrap, text wraps at spaces."""
    table = Table(title=Text(title), title_justify="left")
    for name, wraps in columns:
        if wraps:
            table.add_column(name, overflow="fold")
        else:
            table.add_column(name, no_wrap=True)
    return table


def gate_table(results: list[GateResult], title: str,
               informational: Iterable[str] = ()) -> Table:
    """One row per gate: id, kind and arch stacked (never wrapped), status (and
    `informational` under it for a gate the row does not require: it does not count
    in the overall status), and one wide column with the reason and then the key
    metrics, one per line: at 100 columns every word still fits whole."""
    info = set(informational)
    table = _table(title, (("gate", False), ("status", False), ("reason · key metrics", True)))
    for r in results:
        detail = Text(r.reason)
        metrics = key_metrics(r.metrics)
        if metrics:
            detail.append("\n" + metrics, style="dim")
        # an informational gate's status does not count: never an alarm colour
        status = Text(r.status.value, style="dim") if r.gate_id in info else status_text(r.status)
        if r.gate_id in info:
            status.append("\ninformational", style="dim italic")
        if r.sandbox is not None and not r.sandbox.confined:
            status.append("\nUNCONFINED", style="bold red")
            detail.append(f"\nsandbox off: {r.sandbox.reason}", style="red")
        table.add_row(Text(f"{r.gate_id}\n{r.kind} · {where(r.arch, r.stand_in)}"), status,
                      detail)
    return table


def _line(label: str, *parts: Text | str) -> Text:
    return Text.assemble(Text(f"{label:<9}"), *(Text(p) if isinstance(p, str) else p
                                                 for p in parts))


def inspect_view(bundle: Bundle) -> Group:
    m = bundle.manifest
    return Group(
        _line("bundle", str(bundle.path)),
        _line("row", f"{m.row.id}  ({m.row.file}, sha256 {m.row.sha256[:12]}…)"),
        _line("subject", f"{m.subject.repo} {m.subject.branch} {m.subject.commit[:12]} "
                         f"(base {m.subject.base[:12]}, dirty={m.subject.dirty})"),
        _line("signer", str(m.signer)),
        _line("sealed", f"{m.created}   status ", status_text(m.status),
              *unconfined_note(bundle.results())),
        gate_table(bundle.results(), "gates", informational_ids(bundle)),
        _rich(time_table(bundle.results())))


def informational_ids(bundle: Bundle) -> list[str]:
    """The gates the bundle's row does not require (sealed in its manifest)."""
    return bundle.manifest.informational()


def unconfined_note(results: Iterable[GateResult]) -> list[Text]:
    """`UNCONFINED` beside a bundle's status when any subject step ran outside the sandbox."""
    off = [r.gate_id for r in results if r.sandbox is not None and not r.sandbox.confined]
    return [Text(f"   UNCONFINED ({', '.join(off)})", style="bold red")] if off else []


def print_inspect(bundle: Bundle, console: Console) -> None:
    console.print(inspect_view(bundle))


def inspect_doc(bundle: Bundle) -> dict[str, Any]:
    m = bundle.manifest
    results = bundle.results()
    return {"bundle": str(bundle.path), "id": bundle.id, "row": m.row.id,
            "subject": m.subject.model_dump(), "signer": m.signer.model_dump(),
            "status": m.status.value, "created": m.created,
            "unconfined": [r.gate_id for r in results if r.sandbox and not r.sandbox.confined],
            "informational": informational_ids(bundle),
            "gates": [json.loads(r.model_dump_json()) for r in results]}


def inspect_json(bundle: Bundle) -> str:
    return json.dumps(inspect_doc(bundle), indent=2)


def resource_table(result: "LocalBuild") -> Table:
    """A rich Table: one row per kernel entry point per arch, used / budget."""
    def frac(used: object, budget: object) -> str:
        used = "-" if used is None else str(used)
        return used if budget is None else f"{used} / {budget}"

    table = _table(f"kernel resources (build {result.build.status.value}, "
                   f"audit {result.audit.status.value})",
                   ((c, c == "entry point") for c in (
                       "kernel", "entry point", "arch", "regs", "static smem B", "stack B",
                       "spill st/ld B", "local B", "cmem[0] B", "SASS insns")))
    for key, c in sorted(result.audit.cells.items(), key=lambda kv: kv[0].rsplit("@", 1)[::-1]):
        name_ep, arch = key.rsplit("@", 1)
        kernel, ep = name_ep.split("/", 1)
        cells = (kernel, ep, arch, frac(c["registers"], c["max_registers"]),
                 frac(c["static_shared"], c["max_static_shared"]), str(c["stack_frame"]),
                 f"{c['spill_stores']}/{c['spill_loads']}", str(c["local"]), str(c["cmem0"]),
                 "-" if c["sass_instructions"] is None else str(c["sass_instructions"]))
        table.add_row(*(Text(x) for x in cells))
    return table


def toolchain_table(listed: list[dict[str, str]]) -> Table:
    """`rowgate toolchain list`: the toolchain that builds each arch here."""
    table = _table("CUDA toolchains here", ((c, c == "note") for c in (
        "arch", "toolchain", "compiler", "host compiler", "SASS tools", "note")))
    for r in listed:
        table.add_row(*(Text(r[k]) for k in ("arch", "toolchain", "compiler", "host", "sass",
                                             "note")))
    return table


def rows_table(loaded_rows: list["LoadedRow"]) -> Table:
    """`rowgate rows`: every row's gates and whether each can run here."""
    from rowgate import gates
    from rowgate.seal import device

    devices = device.inventory()  # one enumeration for every row and gate listed
    table = _table("rows", (("row", False), ("target", False), ("gate", False),
                            ("kind", False), ("here", True)))
    for loaded in loaded_rows:
        row = loaded.row
        for n, spec in enumerate(row.gates):
            state, why = gates.availability(row, spec, devices)
            table.add_row(Text(row.id if n == 0 else ""), Text(row.target.arch if n == 0 else ""),
                          Text(spec.id), Text(spec.kind),
                          Text(f"{state}: {why}" if why else state))
    return table


def review_view(record: ReviewRecord) -> Group:
    """`rowgate review`: the verdict and its reasons, each gate as re-derived (with
    its arch, `(stand-in)` where it was one), the criteria. (The CLI prints the
    record's path after it, as plain text, so no width ever wraps it.)"""
    parts: list[Text | Table] = [Text.assemble(Text(f"{record.row_id} bundle {record.bundle.id}: "),
                                 status_text(record.verdict.value))]
    parts += [Text(f"  {reason}") for reason in record.reasons]
    gates = _table("gates (re-derived)", (("gate", False), ("kind", False), ("arch", False),
                                          ("required", False), ("status", False),
                                          ("re-derived", False), ("reason", True)))
    for g in record.gates:
        gates.add_row(Text(g.gate_id), Text(g.kind), Text(where(g.arch, g.stand_in)),
                      Text("yes" if g.required else "no"), status_text(g.status),
                      Text(g.rederived), Text(g.reason))
    crit = _table("criteria", (("criterion", False), ("outcome", False), ("metric", True),
                               ("arch", False), ("measured", True)))
    for c in record.criteria:
        measured = ", ".join(f"{k}={metric(c.metric, v)}" for k, v in c.measured.items()) or "—"
        detail = f" ({c.detail})" if c.detail and c.outcome is not Outcome.PENDING else ""
        crit.add_row(Text(c.id), Text(c.outcome.value),
                     Text(f"{c.gate}.{c.metric} {c.comparison.symbol} {c.threshold:g}"),
                     Text(c.arch or "—"), Text(measured + detail))
    parts += [gates, crit] if record.criteria else [gates]
    for a in record.implementation:
        state = {True: "admitted", False: "not admitted", None: "undecided"}[a.admitted]
        parts.append(Text(f"  implementation gated on {a.gate}: {state}: {a.reason}"))
    return Group(*parts)


def history_table(history: "History") -> Table:
    """`rowgate history`: one line per bundle, oldest first; the metric one series per
    line. Review and signature columns only where there is something to say."""
    reviewed = any(e.review for e in history.entries)
    checked = any(e.signature != "not checked" for e in history.entries)
    columns = [("sealed", True), ("commit", False), ("bundle", False), ("status", False)]
    columns += [("review", False)] * reviewed + [("signature", True)] * checked
    columns += [("gates", True)] + [("value", True)] * bool(history.metric)
    title = f"{history.row_id}: {len(history.entries)} bundle(s) under {history.evidence}"
    if history.metric:
        title += f"; value = {history.metric}"
    if not checked:
        title += " (signatures not checked: pass --key or --identity/--issuer)"
    table = _table(title, columns)
    for e in history.entries:
        cells = [Text(e.created[:16].replace("T", " ")), Text(e.commit[:8]), Text(e.bundle_id),
                 status_text(e.status)]
        if reviewed:
            cells.append(status_text(e.review) if e.review else Text("—"))
        if checked:
            cells.append(Text(e.signature, style="" if e.signature == "verified" else "red"))
        cells.append(Text("\n".join(f"{g} {s}" for g, s in e.gates)))
        if history.metric:
            values = dict(e.values)
            cells.append(Text("\n".join(f"{s} {metric(history.metric, values.get(s))}"
                                         for s in history.series) or "—"))
        table.add_row(*cells)
    for path, why in history.unreadable:
        table.add_row(Text("—"), Text("—"), Text(Path(path).name), Text("UNREADABLE", "red"),
                      *(Text(why if i == 0 else "") for i in range(len(columns) - 4)))
    return table


def verify_doc(bundle: Bundle, identity: SignerIdentity | None = None,
               problem: str = "") -> dict[str, Any]:
    """`rowgate verify --json`: the outcome, for scripts."""
    m = bundle.manifest
    doc = {"ok": not problem, "bundle": str(bundle.path), "id": bundle.id, "row": m.row.id,
           "commit": m.subject.commit, "files": len(m.files), "status": m.status.value,
           "signer": m.signer.model_dump()}
    if problem:
        doc["problem"] = problem
    elif identity is not None:
        doc["verified_as"] = identity.model_dump()
    return doc


def compare_view(c: "Comparison") -> Group:
    """`rowgate compare`: both bundles, each gate's status A -> B, every metric's change
    (pyperf style), the notes, and the outcome last."""
    parts: list[Text | Table] = [
        Text(f"A  {c.a.bundle_id}  {c.a.commit[:12]}  {c.a.created}  {c.a.status}"),
        Text(f"B  {c.b.bundle_id}  {c.b.commit[:12]}  {c.b.created}  {c.b.status}")]
    gates = _table(f"{c.row_id}: gates A -> B", (("gate", False), ("kind", False),
                                                   ("A", False), ("B", False)))
    for g in c.gates:
        b = status_text(g.status_b)
        if g.regressed:
            b.append("  worse", style="red")
        gates.add_row(Text(g.gate), Text(g.kind), status_text(g.status_a), b)
    parts.append(gates)
    if c.changes:
        changes = _table("changes from the raw samples (one value per timed pass)",
                         (("gate · cell", False), ("metric", False), ("arm", False),
                          ("A median", False), ("B median", False), ("change", True)))
        for ch in c.changes:
            style = {"faster": "green", "slower": "red", "confounded": "yellow",
                     "inconclusive": "yellow"}.get(ch.outcome, "")
            changes.add_row(Text(f"{ch.gate} · {ch.cell}"), Text(ch.metric), Text(ch.arm),
                            Text(_value(ch.median_a, ch.unit)), Text(_value(ch.median_b, ch.unit)),
                            Text(ch.says(), style=style))
        parts.append(changes)
    parts += [Text(f"note: {n}", style="yellow") for n in c.notes]
    parts.append(Text.assemble("outcome: ", (c.outcome, {"regression": "red",
                                                          "inconclusive": "yellow"}.get(
        c.outcome, "green"))))
    return Group(*parts)


def _value(v: float, unit: str) -> str:
    return metric("x_ms" if unit == "ms" else "tok_s", v)
