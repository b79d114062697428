"""Reviewer pictures of an analysed trace (matplotlib, Agg): no computation here."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from rowgate.trace.analysis import Analysis

COLORS = {"kernel": "#1f77b4", "memcpy": "#ff7f0e", "memset": "#9467bd", "cpu_op": "#2ca02c"}
IDLE_COLORS = {"busy": "#1f77b4", "host_wait": "#d62728", "kernel_wait": "#ff7f0e",
               "other": "#7f7f7f", "host": "#d62728"}


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    # typed as a module whether or not matplotlib (the `report` extra) is installed
    return importlib.import_module("matplotlib.pyplot")


def timeline_spans(a: Analysis, max_steps: int = 4
                   ) -> dict[tuple[int, str], list[tuple[float, float]]]:
    """What `timeline` draws: per (step row, colour), each item of the first `max_steps`
    steps as (ms from its step's start, ms long; at least 0.1 µs so it shows)."""
    shown = a.steps[:max_steps]
    spans: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for w in a.items:
        if 0 <= w.step < len(shown):
            spans.setdefault((w.step, COLORS.get(w.kind, "#333333")), []).append(
                ((w.ts - shown[w.step].ts) / 1e3, max(w.dur / 1e3, 1e-4)))
    return spans


def timeline(a: Analysis, title: str, path: Path, max_steps: int = 4) -> None:
    """The first steps' work on one axis, one row per step, time from each step's start."""
    plt = _pyplot()
    shown = a.steps[:max_steps]
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.6 * len(shown)))
    for row, s in enumerate(shown):
        ax.broken_barh([(0, s.dur / 1e3)], (row - 0.45, 0.9), facecolors="#eeeeee")
    # One collection per step and colour: an artist per item made a 12-step megakernel
    # trace's picture take seconds (thousands of kernels a step).
    for (row, color), xs in timeline_spans(a, max_steps).items():
        ax.broken_barh(xs, (row - 0.4, 0.8), facecolors=color)
    ax.set_yticks(range(len(shown)), [f"step {s.index}" for s in shown])
    ax.set_xlabel("ms from step start (grey: the step; colour: device work / top-level ops)")
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def idle_breakdown(analyses: dict[str, Analysis], path: Path) -> None:
    """Per capture: busy / idle-by-cause shares, and the recoverable parts beside them."""
    plt = _pyplot()
    names = list(analyses)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 1.5 + 0.6 * len(names)))
    for y, name in enumerate(names):
        t = analyses[name].temporal["summary"]
        x = 0.0
        for key in ("busy", "host_wait", "kernel_wait", "other", "host"):
            v = t.get(f"{key}_fraction")
            if v:
                left.barh(y, v, left=x, color=IDLE_COLORS[key],
                          label=key if y == 0 or key not in ("busy",) else None)
                x += v
        c = analyses[name].capacity
        x = 0.0
        for key, color in (("gap_fraction", "#d62728"), ("tail_fraction", "#9467bd"),
                           ("bandwidth_fraction", "#8c564b")):
            v = c[key] or 0.0  # None: not measurable on this trace (tails on a CPU)
            right.barh(y, v, left=x, color=color, label=key if y == 0 else None)
            x += v
        right.axvline(c["material_idle_fraction"], color="black", linestyle="--", linewidth=1)
    for ax, title in ((left, "step time: busy vs idle (by cause)"),
                      (right, "recoverable share (dashed: material)")):
        ax.set_yticks(range(len(names)), names)
        ax.set_xlim(0, 1)
        ax.set_title(title)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
