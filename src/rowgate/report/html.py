"""A `Report` as one self-contained HTML page.

Self-contained: CSS inline, figures inlined as base64 PNG, no script, no
external URL. The Content-Security-Policy says so to the browser as well
(`default-src 'none'`), so a page that tried to load anything from outside
would be refused rather than silently reaching out.
"""

from __future__ import annotations

import base64
from html import escape

from rowgate.report import plots
from rowgate.report.model import Figure, PendingItem, Report, ReviewSummary, Section, Table
from rowgate.report.tables import INFORMATIONAL, is_wide, status_cell

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1b1b1b;
       margin: 2em auto; max-width: 1100px; padding: 0 1em; }
h1 { font-size: 1.5em; margin-bottom: .2em; } h2 { font-size: 1.2em; margin-top: 1.8em; }
h3 { font-size: 1em; margin: 1.2em 0 .4em; }
.verdict { font-size: 1.3em; font-weight: 600; padding: .4em .8em; border-radius: 4px;
           display: inline-block; margin: .5em 0; }
.sub { color: #555; }
table { border-collapse: collapse; margin: .4em 0 1em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td { font-variant-numeric: tabular-nums; }
table.facts th { width: 9em; } table.facts td { word-break: break-all; }
.PASS, .APPROVE, .PARITY, .BETTER { background: #d9f2d9; color: #14521b; }
.FAIL, .ERROR, .REJECT, .UNREADABLE, .WORSE, .unverified { background: #f9d6d5; color: #7a1512; }
.PENDING, .INCONCLUSIVE { background: #fff2cc; color: #6b4e00; }
.INFORMATIONAL { background: #eceff3; color: #3d4653; font-weight: 400; }
div.scroll { overflow: auto; max-width: 100%; max-height: 32em; }
details.table > summary { cursor: pointer; font-weight: 600; margin: 1.2em 0 .4em; }
.missing { color: #b00020; font-weight: 600; }
thead th { position: sticky; top: 0; }
.verified { background: #d9f2d9; color: #14521b; }
.implicit { background: #fff2cc; color: #6b4e00; }
td.status { font-weight: 600; }
section.gate { border-top: 2px solid #ddd; }
figure { margin: .6em 0 1.2em; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 12px; }
.note { color: #555; font-style: italic; }
footer { margin-top: 3em; color: #777; font-size: 12px; }
"""


def _status_class(value: str) -> str:
    if value.endswith(INFORMATIONAL):  # does not count: never an alarm colour
        return "INFORMATIONAL"
    return value.upper() if value.upper().isalpha() else "UNKNOWN"


def _table(t: Table, css: str = "") -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in t.columns)
    body = []
    for row in t.rows:
        cells = []
        for i, v in enumerate(row):
            cls = f' class="status {_status_class(v)}"' if i == t.status_column else ""
            cells.append(f"<td{cls}>{escape(v)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    more = (f'<p class="note">{t.truncated} more row(s) in the artifacts</p>'
            if t.truncated else "")
    cls = f' class="{css}"' if css else ""
    grid = (f'<div class="scroll"><table{cls}><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>{more}")
    if is_wide(t):  # collapsed: the page stays readable; the scroll box holds the rest
        return (f'<details class="table"><summary>{escape(t.title)} ({len(t.rows)} rows × '
                f"{len(t.columns)} columns)</summary>{grid}</details>")
    return f"<h3>{escape(t.title)}</h3>{grid}"


def _figure(f: Figure) -> str:
    data = base64.b64encode(plots.render(f)).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{escape(f.title)}">'
            f"<figcaption>{escape(f.title)}</figcaption></figure>")


def _verdict(s: Section) -> str:
    """A gate's status badge; an informational gate's in grey, saying so."""
    if s.required:
        return f'<span class="verdict {s.status.value}">{s.status.value}</span>'
    text = status_cell(s.status.value, False)
    return f'<span class="verdict INFORMATIONAL">{escape(text)}</span>'


def _section(s: Section) -> str:
    where = f" on {s.arch}" + (" (stand-in)" if s.stand_in else "") if s.arch else ""
    parts = [f'<section class="gate" id="gate-{escape(s.gate_id)}">',
             f"<h2>{escape(s.gate_id)} <span class=\"sub\">({escape(s.kind)}{escape(where)})"
             f'</span> {_verdict(s)}</h2>',
             f"<p>{escape(s.reason)}</p>"]
    parts += [f'<p class="missing">missing: {escape(m)}</p>' for m in s.missing]
    parts += [f'<p class="note">{escape(n)}</p>' for n in s.notes]
    parts += [_figure(f) for f in s.figures]
    parts += [_table(t) for t in s.tables]
    if s.artifacts:
        items = "".join(f"<li><code>{escape(a)}</code></li>" for a in s.artifacts)
        parts.append(f"<details><summary>{len(s.artifacts)} artifact(s)</summary>"
                     f"<ul>{items}</ul></details>")
    parts.append("</section>")
    return "\n".join(parts)


def _time(r: Report) -> str:
    if r.time is None:
        return ""
    figure = _figure(r.time_figure) if r.time_figure is not None else ""
    return f'<section id="time"><h2>Time</h2>{figure}{_table(r.time)}</section>'


def _pending(items: tuple[PendingItem, ...]) -> str:
    if not items:
        return '<section id="pending"><h2>Pending</h2><p>Nothing is pending.</p></section>'
    rows = "".join(f"<tr><td>{escape(p.source)}</td><td>{escape(p.gate)}</td>"
                   f"<td>{escape(p.reason)}</td><td>{escape(p.until)}</td></tr>" for p in items)
    return ('<section id="pending"><h2>Pending</h2><table><thead><tr><th>from</th><th>gate</th>'
            f"<th>reason</th><th>until</th></tr></thead><tbody>{rows}</tbody></table></section>")


def _review(rv: ReviewSummary) -> str:
    reasons = "".join(f"<li>{escape(x)}</li>" for x in rv.reasons)
    return (f'<section id="review"><h2>Review: <span class="verdict {_status_class(rv.verdict)}">'
            f"{escape(rv.verdict)}</span></h2><p>{escape(rv.reason)}</p>"
            + (f"<ul>{reasons}</ul>" if len(rv.reasons) > 1 else "")
            + f'<p class="sub">record <code>{escape(rv.path)}</code>; reviewer '
            f"{escape(rv.reviewer or '—')}; signature {escape(rv.signature)}</p>"
            + "".join(_table(t) for t in rv.tables) + "</section>")


def render(report: Report) -> str:
    r = report
    facts = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in r.facts)
    sig_class, sig_text = (("verified", "signature verified") if r.verification.verified else
                           ("implicit", "signature matches an implicit key only")
                           if r.verification.implicit else
                           ("unverified", "signature NOT verified"))
    review = _review(r.review) if r.review is not None else ""
    title = f"{r.row_id}: {r.row_title}" if r.row_title else r.row_id
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>rowgate report: {escape(r.row_id)} {escape(r.bundle_id)}</title>
<style>{CSS}</style>
</head>
<body>
<header>
<h1>{escape(title)}</h1>
<p class="sub">bundle <code>{escape(r.bundle_id)}</code> · <code>{escape(r.bundle_path)}</code></p>
<p><span class="verdict {_status_class(r.verdict)}" id="verdict">{escape(r.verdict)}</span>
<span class="sub">({escape(r.verdict_source)})</span>
<span class="verdict {sig_class}" id="signature">{sig_text}</span></p>
<table class="facts">{facts}
<tr><th>row file</th><td>{escape(r.row_file)} (sha256 {escape(r.row_sha256[:16])}…):
{escape(r.row_note)}</td></tr></table>
</header>
{review}
{_pending(r.pending)}
<section id="gates"><h2>Gates</h2>{_table(r.gates)}</section>
{_time(r)}
{"".join(_section(s) for s in r.sections)}
<footer>rowgate report · sealed {escape(r.created)} by rowgate {escape(r.rowgate_version)}
</footer>
</body>
</html>
"""
