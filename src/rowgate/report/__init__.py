"""Rendering for people: terminal tables, and the one-page report of a bundle.

`build` reads a sealed bundle into a `Report` (pure data); `html`, `markdown`
and `plots` only lay that data out. Nothing here decides a verdict: the page
shows the bundle's own status, whether it verified, and the review record's
verdict when one is filed.
"""

from __future__ import annotations

from pathlib import Path

from rowgate import storage
from rowgate.report import history, html, markdown
from rowgate.report.assemble import build, find_row, read_review, report_for, review_path, verify
from rowgate.report.model import Report
from rowgate.report.terminal import (
    STYLE,
    compare_view,
    console,
    gate_table,
    history_table,
    inspect_json,
    print_inspect,
    resource_table,
    review_view,
    rows_table,
    toolchain_table,
    verify_doc,
)

__all__ = ["STYLE", "Report", "build", "compare_view", "console", "find_row", "gate_table", "history",
           "history_table", "inspect_json", "print_inspect", "resource_table", "review_view",
           "rows_table", "toolchain_table", "publish", "read_review", "report_for", "review_path", "verify",
           "verify_doc"]


def _write(path: Path, text: str) -> Path:
    """Atomically: a full disk leaves the old page or none, never half of one."""
    with storage.writing(f"{path.name} was not written", path):
        return storage.write_atomic(path, text.encode("utf-8"))


def publish(report: Report, html_out: Path | None = None,
            markdown_out: Path | None = None) -> tuple[list[Path], str]:
    """Write the requested files and append the runner step summary when there is one.

    Returns (paths written, the Markdown text).
    """
    md = markdown.render(report)
    written = []
    if html_out is not None:
        written.append(_write(html_out, html.render(report)))
    if markdown_out is not None:
        written.append(_write(markdown_out, md))
    summary = markdown.append_step_summary(md)
    if summary is not None:
        written.append(summary)
    return written, md
