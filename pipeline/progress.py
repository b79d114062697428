"""Progress reporting for long steps: rich on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)


class RichProgress:
    def __init__(self, progress: Progress, task):
        self._p, self._task = progress, task

    def update(self, message: str) -> None:
        self._p.update(self._task, description=message)

    def advance(self, total: int | None = None) -> None:
        self._p.advance(self._task)


class PlainProgress:
    """One line per step on stderr: CI logs stay readable."""

    def __init__(self, quiet: bool):
        self._quiet = quiet

    def update(self, message: str) -> None:
        if not self._quiet:
            print(f"rowgate: {message}", file=sys.stderr, flush=True)

    def advance(self, total: int | None = None) -> None:
        pass


@contextmanager
def progress(total: int, label: str, quiet: bool = False) -> Iterator[RichProgress | PlainProgress]:
    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        yield PlainProgress(quiet)
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as p:
        yield RichProgress(p, p.add_task(label, total=total))
