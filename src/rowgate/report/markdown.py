"""A `Report` as GitHub-flavoured Markdown (files and runner step summaries).

Figures are not embedded: step summaries do not render data-URI images. The
numbers behind every figure are in the section's tables; the HTML page has
the plots.
"""

from __future__ import annotations

import os
from pathlib import Path

from rowgate.report.model import Report, Section, Table
from rowgate.report.tables import INFORMATIONAL, is_wide, status_cell

STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
STEP_SUMMARY_LIMIT = 1 << 20
"""GitHub refuses step summaries over 1 MiB; a longer report is cut with a note."""
ICON = {"PASS": "✅", "FAIL": "❌", "ERROR": "💥", "PENDING": "⏳", "APPROVE": "✅", "REJECT": "❌"}


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _status(text: str) -> str:
    if text.endswith(INFORMATIONAL):  # does not count: no alarm icon
        return f"ℹ️ {text}"
    return f"{ICON[text]} {text}" if text in ICON else text


def table(t: Table) -> str:
    """A GFM table; a wide or long one inside `<details>` (collapsed in a job summary)."""
    grid = ["| " + " | ".join(_cell(c) for c in t.columns) + " |",
            "|" + "---|" * len(t.columns)]
    for row in t.rows:
        cells = [_status(v) if i == t.status_column else v for i, v in enumerate(row)]
        grid.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if t.truncated:
        grid.append(f"\n_{t.truncated} more row(s) in the artifacts_")
    if is_wide(t):  # blank lines around the table: GitHub renders Markdown inside <details>
        summary = f"{_html(t.title)} ({len(t.rows)} rows × {len(t.columns)} columns)"
        return "\n".join([f"<details><summary><b>{summary}</b></summary>", "", *grid, "",
                          "</details>"]) + "\n"
    return "\n".join([f"**{_cell(t.title)}**", "", *grid]) + "\n"


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _section(s: Section) -> str:
    where = f" on {s.arch}" + (" (stand-in)" if s.stand_in else "") if s.arch else ""
    out = [f"### {s.gate_id} ({s.kind}{where}): {_status(status_cell(s.status.value, s.required))}",
           "", s.reason, ""]
    out += [f"> [!CAUTION]\n> missing: {_cell(m)}\n" for m in s.missing]
    out += [f"_{n}_\n" for n in s.notes]
    if s.figures:
        out.append(f"_{len(s.figures)} plot(s) in the HTML report: "
                   + "; ".join(f.title for f in s.figures) + "_\n")
    out += [table(t) for t in s.tables]
    return "\n".join(out)


def render(report: Report) -> str:
    r = report
    sig = ("verified" if r.verification.verified else
           "**matches an implicit key only** (not verified)" if r.verification.implicit else
           "**NOT verified**")
    out = [f"## rowgate report: {r.row_id}" + (f" — {r.row_title}" if r.row_title else ""), "",
           f"**Verdict: {_status(r.verdict)}** ({r.verdict_source}); signature {sig}", "",
           f"Bundle `{r.bundle_id}` (`{r.bundle_path}`)", ""]
    out += [f"- **{k}**: {_cell(v)}" for k, v in r.facts]
    out += [f"- **row file**: {r.row_file} (sha256 {r.row_sha256[:16]}…): {r.row_note}", ""]
    if r.review is not None:
        rv = r.review
        out += [f"### Review: {_status(rv.verdict)}", "", rv.reason, ""]
        out += [f"- {x}" for x in rv.reasons[1:]]
        out += ["", f"Record `{rv.path}`; reviewer {rv.reviewer or '—'}; signature "
                f"{rv.signature}", ""]
        out += [table(t) for t in rv.tables]
    out += ["### Pending", ""]
    if r.pending:
        out += [f"- **{p.gate}** ({p.source}): {p.reason}" + (f" — until {p.until}"
                                                                if p.until else "")
                for p in r.pending]
    else:
        out.append("Nothing is pending.")
    out += ["", table(r.gates)]
    if r.time is not None:
        out += ["", table(r.time)]
    out += [_section(s) for s in r.sections]
    return "\n".join(out) + "\n"


def append_step_summary(markdown: str, env: dict[str, str] | None = None) -> Path | None:
    """Append to `$GITHUB_STEP_SUMMARY` when running in a runner job; else nothing."""
    target = (env if env is not None else os.environ).get(STEP_SUMMARY_ENV)
    if not target:
        return None
    data = markdown.encode()
    if len(data) > STEP_SUMMARY_LIMIT:
        note = b"\n\n_(cut: the full report is in the uploaded artifact)_\n"
        data = data[: STEP_SUMMARY_LIMIT - len(note)].decode(errors="ignore").encode() + note
    with open(target, "ab") as f:
        f.write(data)
    return Path(target)
