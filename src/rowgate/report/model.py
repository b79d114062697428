"""The report model: what one bundle page shows, as plain data.

Everything a renderer needs is computed here (or in `build` / `sections`)
and frozen; the HTML, Markdown and plot code only lay it out. Figures are
data too (`IntervalFigure`, `TimelineFigure`, `BarFigure`): `plots` turns
them into PNGs without deciding anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from rowgate.records.status import Status


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    status_column: int | None = None
    """Index of the column holding a `Status` value (renderers colour it)."""
    truncated: int = 0
    """Rows left out to keep the page readable (the artifacts hold them all)."""


@dataclass(frozen=True)
class IntervalFigure:
    """A point estimate with its confidence interval per label (e.g. ratio per cell)."""

    title: str
    ylabel: str
    labels: tuple[str, ...]
    values: tuple[float, ...]
    lows: tuple[float, ...]
    highs: tuple[float, ...]
    reference: float | None = 1.0
    """A horizontal line (parity for ratios)."""
    band: tuple[float, float] | None = None
    """A shaded band (e.g. the row's minimum effect around parity)."""
    better: str = "higher"
    """Which way is better for the candidate ("higher" / "lower"): written on the plot
    (a speed ratio and a latency ratio point opposite ways)."""


BACKGROUND = "(whole step)"
"""A span of this name is drawn as its lane's grey background (a decode step's extent)."""


@dataclass(frozen=True)
class Span:
    lane: str
    start: float
    duration: float
    name: str


@dataclass(frozen=True)
class TimelineFigure:
    """Spans on lanes over time (kernels per stream in a trace window)."""

    title: str
    unit: str
    spans: tuple[Span, ...]
    omitted: int = 0


@dataclass(frozen=True)
class BarFigure:
    title: str
    unit: str
    labels: tuple[str, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class Panel:
    """One cell's samples per arm (e.g. per-request TPOT of oracle and candidate)."""

    title: str
    series: tuple[tuple[str, tuple[float, ...]], ...]


@dataclass(frozen=True)
class DistributionFigure:
    """Empirical CDFs of raw samples, one panel per cell, one line per arm, in absolute
    units; `better` ("lower" / "higher") is written on the axis."""

    title: str
    unit: str
    better: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class SeriesFigure:
    """Values over a sequence of points (bundles over time): one line per series;
    a None is a point where that series has no value."""

    title: str
    ylabel: str
    xlabels: tuple[str, ...]
    series: tuple[tuple[str, tuple[float | None, ...]], ...]


@dataclass(frozen=True)
class ImageFigure:
    """A PNG the gate itself sealed into the bundle (e.g. the trace gate's timeline)."""

    title: str
    png: bytes = field(repr=False)


Figure = Union[IntervalFigure, TimelineFigure, BarFigure, SeriesFigure, DistributionFigure,
               ImageFigure]


@dataclass(frozen=True)
class Section:
    """One gate: its status and reason, then tables and figures."""

    gate_id: str
    kind: str
    status: Status
    reason: str
    arch: str = ""
    stand_in: bool = False
    tables: tuple[Table, ...] = ()
    figures: tuple[Figure, ...] = ()
    notes: tuple[str, ...] = ()
    artifacts: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    """What the section could not show because an artifact it needs is not sealed
    (or does not parse): renderers put these first, in red."""
    required: bool = True
    """False: an informational gate, shown as such (its status does not count)."""


@dataclass(frozen=True)
class Verification:
    """Did the bundle verify (signature, every digest, schemas) for this report?"""

    verified: bool
    """Verified against a key or identity the reader named."""
    detail: str
    """Who signed and what it was checked against, else the first problem found."""
    implicit: bool = False
    """The signature matched the implicit local key, which nobody named: not verified
    (`rowgate verify` refuses implicit keys), and the page says so."""


@dataclass(frozen=True)
class PendingItem:
    source: str
    """`gate` (a result), `row` (declared in the row file) or `review`."""
    gate: str
    reason: str
    until: str = ""


@dataclass(frozen=True)
class ReviewSummary:
    """The review record filed for this bundle, read as written (not re-judged)."""

    path: str
    verdict: str
    reason: str
    reasons: tuple[str, ...] = ()
    reviewer: str = ""
    signature: str = ""
    """The record's signature file, or a note that it has none."""
    tables: tuple[Table, ...] = ()
    """Per-criterion, stop-condition, admission and gate-check tables."""
    pending: tuple[PendingItem, ...] = ()


@dataclass(frozen=True)
class Report:
    bundle_id: str
    bundle_path: str
    row_id: str
    row_title: str
    row_file: str
    row_sha256: str
    row_note: str
    """Whether the row file was found beside this rowgate and matches the digest."""
    created: str
    rowgate_version: str
    status: Status
    """The bundle's own overall status."""
    signer: str
    verification: Verification
    review: ReviewSummary | None
    facts: tuple[tuple[str, str], ...]
    """Header lines: subject, host, devices."""
    gates: Table
    sections: tuple[Section, ...] = ()
    time: Table | None = None
    """Where the wall time went, per gate and phase (`rowgate.report.timing`)."""
    time_figure: BarFigure | None = None
    pending: tuple[PendingItem, ...] = field(default_factory=tuple)

    @property
    def verdict(self) -> str:
        """The headline: the review's verdict when one is filed, else the bundle status."""
        if self.review is not None:
            return self.review.verdict
        return self.status.value

    @property
    def verdict_source(self) -> str:
        return f"review {self.review.path}" if self.review else "bundle status (no review record)"
