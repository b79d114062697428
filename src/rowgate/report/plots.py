"""Figures (report model data) to PNG bytes with matplotlib's Agg canvas.

Nothing is computed here beyond layout: every value drawn comes from the
figure object. No pyplot (no global state, no GUI backend): each figure is a
`matplotlib.figure.Figure` on its own `FigureCanvasAgg`.
"""

from __future__ import annotations

import io
from functools import singledispatch
from typing import TYPE_CHECKING

from rowgate.errors import UsageError
from rowgate.report.model import (
    BACKGROUND,
    BarFigure,
    DistributionFigure,
    Figure,
    ImageFigure,
    IntervalFigure,
    SeriesFigure,
    TimelineFigure,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure as MplFigure

DPI = 100
WIDTH_IN = 9.0
LEGEND_NAMES = 8
"""A timeline names its kernels in a legend when there are at most this many."""


def _new(height_in: float) -> MplFigure:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure as MplFigure
    except ImportError as exc:
        raise UsageError("plots need matplotlib, a dependency of rowgate: reinstall rowgate "
                         "(python3 -m pip install -e .)") from exc
    fig = MplFigure(figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


TITLE_CHARS = int(WIDTH_IN * 12)
"""Characters of a 10 pt title that fit the figure's width: longer ones wrap, never cut."""


def _wrap(title: str) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(title, TITLE_CHARS)) or title


def _png(fig: MplFigure) -> bytes:
    buf = io.BytesIO()
    # No timestamps/software tag: the same report model gives the same bytes.
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


@singledispatch
def render(figure: Figure) -> bytes:
    raise TypeError(f"no plot for {type(figure).__name__}")


@render.register
def _interval(figure: IntervalFigure) -> bytes:
    fig = _new(3.6)
    ax = fig.add_subplot()
    x = range(len(figure.labels))
    if figure.band is not None:
        ax.axhspan(*figure.band, color="#d9ead3", label="minimum effect band")
    if figure.reference is not None:
        ax.axhline(figure.reference, color="#666666", linewidth=1, linestyle="--",
                   label="parity")
    lower = [v - lo for v, lo in zip(figure.values, figure.lows)]
    upper = [hi - v for v, hi in zip(figure.values, figure.highs)]
    ax.errorbar(list(x), figure.values, yerr=[lower, upper], fmt="o", color="#1f4e79",
                ecolor="#1f4e79", capsize=4, label="median ratio, CI")
    ax.set_xticks(list(x), figure.labels, rotation=30 if len(figure.labels) > 6 else 0)
    ax.set_ylabel(figure.ylabel)
    # which way is better, on the plot itself: ratios of speeds and of latencies point
    # opposite ways
    up, down = (("candidate better ↑", "candidate worse ↓") if figure.better == "higher"
                else ("candidate worse ↑", "candidate better ↓"))
    for y, text, va in ((0.98, up, "top"), (0.02, down, "bottom")):
        ax.text(0.005, y, text, transform=ax.transAxes, fontsize=8, va=va, ha="left",
                color="#14521b" if "better" in text else "#7a1512")
    ax.set_title(_wrap(figure.title), fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)


@render.register
def _bar(figure: BarFigure) -> bytes:
    fig = _new(0.6 + 0.35 * max(3, len(figure.labels)))
    ax = fig.add_subplot()
    y = range(len(figure.labels))
    ax.barh(list(y), figure.values, color="#c55a11")
    ax.set_yticks(list(y), figure.labels)
    ax.invert_yaxis()
    ax.set_xlabel(figure.unit)
    ax.set_title(_wrap(figure.title), fontsize=10)
    for i, v in enumerate(figure.values):
        ax.annotate(f"{v:.3g}", (v, i), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)
    return _png(fig)


@render.register
def _timeline(figure: TimelineFigure) -> bytes:
    lanes = list(dict.fromkeys(s.lane for s in figure.spans))
    fig = _new(1.0 + 0.45 * max(2, len(lanes)))
    ax = fig.add_subplot()
    from matplotlib.patches import Patch

    palette = ["#1f4e79", "#c55a11", "#548235", "#7030a0", "#bf9000", "#2e75b6"]
    names = list(dict.fromkeys(s.name for s in figure.spans if s.name != BACKGROUND))
    for i, lane in enumerate(lanes):
        back = [s for s in figure.spans if s.lane == lane and s.name == BACKGROUND]
        ax.broken_barh([(s.start, s.duration) for s in back], (i - 0.45, 0.9),
                       facecolors="#eeeeee")
        spans = [s for s in figure.spans if s.lane == lane and s.name != BACKGROUND]
        ax.broken_barh([(s.start, s.duration) for s in spans], (i - 0.4, 0.8),
                       facecolors=[palette[names.index(s.name) % len(palette)] for s in spans])
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    if len(names) <= LEGEND_NAMES:
        ax.legend(handles=[Patch(color=palette[i % len(palette)], label=n[:40])
                           for i, n in enumerate(names)], fontsize=7, loc="upper left",
                  bbox_to_anchor=(1.0, 1.0))  # beside the lanes, never over them
    ax.set_xlabel(f"time ({figure.unit})")
    ax.set_title(_wrap(figure.title), fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


@render.register
def _series(figure: SeriesFigure) -> bytes:
    fig = _new(3.8)
    ax = fig.add_subplot()
    x = list(range(len(figure.xlabels)))
    for name, values in figure.series:
        points = [(i, v) for i, v in zip(x, values) if v is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    ax.set_xticks(x, figure.xlabels, rotation=30 if len(x) > 4 else 0, ha="right"
                  if len(x) > 4 else "center", fontsize=8)
    ax.set_ylabel(figure.ylabel)
    ax.set_title(_wrap(figure.title), fontsize=10)
    ax.grid(alpha=0.3)
    if len(figure.series) > 1:
        ax.legend(fontsize=8, loc="best")
    return _png(fig)


ARM_COLORS = {"oracle": "#1f4e79", "baseline": "#1f4e79", "candidate": "#c55a11"}
LOG_SPAN = 20.0
"""A panel whose samples span more than this factor gets a log x axis (latency tails)."""
PANEL_COLUMNS = 3


@render.register
def _distribution(figure: DistributionFigure) -> bytes:
    import math

    n = max(1, len(figure.panels))
    cols = min(PANEL_COLUMNS, math.ceil(math.sqrt(n)))
    rows = math.ceil(n / cols)
    fig = _new(0.6 + 2.6 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    arrow = "← lower is better" if figure.better == "lower" else "higher is better →"
    for k, ax in enumerate(axes.flat):
        if k >= n:
            ax.set_visible(False)
            continue
        panel = figure.panels[k]
        for i, (arm, values) in enumerate(panel.series):
            xs = sorted(values)
            if not xs:
                continue
            color = ARM_COLORS.get(arm, ["#548235", "#7030a0"][i % 2])
            ys = [(j + 1) / len(xs) for j in range(len(xs))]
            ax.step(xs, ys, where="post", color=color, label=f"{arm} (n={len(xs)})")
            median = xs[(len(xs) - 1) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1]
                                                                + xs[len(xs) // 2]) / 2
            ax.axvline(median, color=color, linestyle="--", linewidth=0.8)
        positive = [v for _, vs in panel.series for v in vs if v > 0]
        log = bool(positive) and max(positive) / min(positive) > LOG_SPAN
        if log:
            ax.set_xscale("log")
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel(f"{figure.unit}{', log scale' if log else ''}  ({arrow})", fontsize=8)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
        if k % cols == 0:
            ax.set_ylabel("fraction ≤ x", fontsize=8)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(_wrap(f"{figure.title} (dashed: medians)"), fontsize=10)
    return _png(fig)


@render.register
def _image(figure: ImageFigure) -> bytes:
    return figure.png  # drawn by the gate, sealed in the bundle: shown as it is
