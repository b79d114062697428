"""Progress reporting for long steps: rich bars on a terminal, plain lines otherwise.

Gates get a `Progress` (`rowgate.gates.interface.Progress`) as `ctx.progress`
and never print. Long loops open a sub-task with a total:

    with ctx.progress.task("throughput i16-c1", total=2 * spec.repeats) as t:
        for arm, repeat in schedule:
            t.update(f"{arm} repeat {repeat + 1}/{spec.repeats}")
            ...
            t.advance()

On a terminal every task is a bar under the row's bar, removed when it ends,
leaving one line (`✓ label (n/total, 12.3s)`). When stderr is not a terminal
(CI logs, pipes) each update is one plain `rowgate: …` line, a sub-task's
advances are logged every 10 % of its total, and its end is one line too.
`--quiet` prints nothing at all.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

LOG_STEPS = 10
"""Plain logs show a sub-task's count this many times over its total (every 10 %)."""


def _join(parent: str, label: str) -> str:
    return f"{parent}: {label}" if parent else label


def _count(done: int, total: int | None) -> str:
    return f"{done}/{total}" if total is not None else str(done)


class PlainProgress:
    """One line per step on stderr: CI logs stay readable. `quiet` silences it."""

    def __init__(self, quiet: bool, label: str = "", total: int | None = None):
        self._quiet, self._label = quiet, label
        self.total, self.done = total, 0

    def _say(self, text: str) -> None:
        if not self._quiet:
            print(f"rowgate: {text}", file=sys.stderr, flush=True)

    def update(self, message: str) -> None:
        self._say(_join(self._label, message))

    def advance(self, total: int | None = None) -> None:
        if total is not None:
            self.total = total
        self.done += 1
        if self._label and self._worth_logging():
            self._say(f"{self._label} [{_count(self.done, self.total)}]")

    def _worth_logging(self) -> bool:
        if not self.total or self.total <= LOG_STEPS or self.done >= self.total:
            return True
        return self.done * LOG_STEPS // self.total != (self.done - 1) * LOG_STEPS // self.total

    @contextmanager
    def task(self, label: str, total: int | None = None) -> Iterator[PlainProgress]:
        name = _join(self._label, label)
        self._say(f"{name} ..." + (f" (0/{total})" if total is not None else ""))
        child = PlainProgress(self._quiet, name, total)
        start = time.monotonic()
        try:
            yield child
        except BaseException:
            self._say(f"{name}: stopped at {_count(child.done, child.total)}")
            raise
        self._say(f"{name}: done {_count(child.done, child.total)} "
                  f"in {time.monotonic() - start:.1f}s")


class RichProgress:
    """A task of a live rich display; sub-tasks are further bars of the same display."""

    def __init__(self, progress: Progress, task: TaskID, label: str = "", depth: int = 0):
        self._p, self._task, self._label, self._depth = progress, task, label, depth

    def update(self, message: str) -> None:
        self._p.update(self._task, description="  " * self._depth + _join(self._label, message))

    def advance(self, total: int | None = None) -> None:
        if total is not None:
            self._p.update(self._task, total=total)
        self._p.advance(self._task)

    @contextmanager
    def task(self, label: str, total: int | None = None) -> Iterator[RichProgress]:
        name = _join(self._label, label)
        tid = self._p.add_task("  " * (self._depth + 1) + name, total=total)
        child = RichProgress(self._p, tid, name, self._depth + 1)
        start = time.monotonic()
        try:
            yield child
        except BaseException:
            self._p.console.print(Text.assemble(("✗", "red"), f" {name}: stopped at "
                                                f"{self._done(tid)}"))
            raise
        else:
            self._p.console.print(Text.assemble(("✓", "green"), f" {name} ({self._done(tid)}, "
                                                f"{time.monotonic() - start:.1f}s)"))
        finally:
            self._p.remove_task(tid)

    def _done(self, tid: TaskID) -> str:
        t = self._p.tasks[self._p.task_ids.index(tid)]
        return _count(int(t.completed), int(t.total) if t.total is not None else None)


@contextmanager
def progress(total: int | None, label: str, quiet: bool = False,
             console: Console | None = None) -> Iterator[RichProgress | PlainProgress]:
    """The progress of one command: a bar on a terminal, plain lines otherwise."""
    console = console or Console(stderr=True)
    if quiet or not console.is_terminal:
        yield PlainProgress(quiet)
        return
    # markup=False: a label from a row or a gate (`rowgate[cuda13]`) prints as written
    with Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as p:
        yield RichProgress(p, p.add_task(label, total=total))
