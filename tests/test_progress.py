"""Progress: plain lines when not a terminal, rich bars on one, nothing with --quiet."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from rowgate.cli.progress import PlainProgress, RichProgress, progress
from rowgate.gates.interface import GateContext, Progress


def _lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def _use(p: Progress) -> None:
    """What a gate does: a sub-task with a total, a nested one without."""
    p.update("gate build (build)")
    with p.task("build sm_90", total=3) as t:
        for k in ("a", "b", "c"):
            t.update(f"nvcc {k}")
            t.advance()
        with t.task("ptxas report") as inner:
            inner.advance()
    p.advance()


def test_plain_lines_for_updates_tasks_and_counts(capsys):
    _use(PlainProgress(quiet=False))
    lines = _lines(capsys)
    assert lines[:6] == ["rowgate: gate build (build)",
                         "rowgate: build sm_90 ... (0/3)",
                         "rowgate: build sm_90: nvcc a",
                         "rowgate: build sm_90 [1/3]",
                         "rowgate: build sm_90: nvcc b",
                         "rowgate: build sm_90 [2/3]"]
    assert "rowgate: build sm_90: ptxas report ..." in lines
    assert "rowgate: build sm_90: ptxas report [1]" in lines
    assert lines[-1].startswith("rowgate: build sm_90: done 3/3 in ")


def test_plain_counts_are_logged_every_tenth_of_a_long_task(capsys):
    p = PlainProgress(quiet=False)
    with p.task("repeats", total=100) as t:
        for _ in range(100):
            t.advance()
    counts = [line for line in _lines(capsys) if line.startswith("rowgate: repeats [")]
    assert counts == [f"rowgate: repeats [{n}/100]" for n in range(10, 101, 10)]


def test_a_failed_task_says_where_it_stopped(capsys):
    p = PlainProgress(quiet=False)
    with pytest.raises(RuntimeError), p.task("oracle run", total=9) as t:
        t.advance()
        raise RuntimeError("engine died")
    assert _lines(capsys)[-1] == "rowgate: oracle run: stopped at 1/9"


def test_advance_can_set_the_total(capsys):
    p = PlainProgress(quiet=False)
    with p.task("cases") as t:
        t.advance(total=2)
        t.advance()
    assert _lines(capsys)[-1].startswith("rowgate: cases: done 2/2")


def test_quiet_prints_nothing(capsys):
    _use(PlainProgress(quiet=True))
    with progress(3, "row", quiet=True) as p:
        _use(p)
    assert capsys.readouterr().err == ""


def test_not_a_terminal_gives_plain_progress():
    console = Console(file=io.StringIO(), force_terminal=False)
    with progress(1, "row", console=console) as p:
        assert isinstance(p, PlainProgress)


def test_a_terminal_gets_bars_and_a_line_per_finished_task():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with progress(1, "row", console=console) as p:
        assert isinstance(p, RichProgress)
        _use(p)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())  # ANSI codes
    assert "✓ build sm_90 (3/3," in text
    assert "✓ build sm_90: ptxas report (1," in text


def test_the_default_gate_context_progress_supports_tasks_and_prints_nothing(tmp_path, capsys):
    ctx = GateContext(repo=tmp_path, artifact_dir=tmp_path, subject=None,  # type: ignore[arg-type]
                      provenance=None)  # type: ignore[arg-type]
    _use(ctx.progress)
    with ctx.progress.task("outer", total=2) as outer, outer.task("inner") as inner:
        inner.update("a step")
        inner.advance(total=1)
        outer.advance()
    assert capsys.readouterr() == ("", "")


def test_gate_command_logs_plain_lines_and_q_after_the_subcommand_silences(
        host_row: Path, git_repo, tmp_path, capsys):
    from rowgate.cli.main import main

    repo = git_repo.working_dir
    with pytest.raises(SystemExit) as exit_:
        main(["gate", str(host_row), "--repo", repo, "--out", str(tmp_path / "ev")])
    assert exit_.value.code == 0
    err = capsys.readouterr().err
    assert "rowgate: gate host (host)" in err and "rowgate: sealing and signing" in err

    with pytest.raises(SystemExit) as exit_:
        main(["gate", str(host_row), "--repo", repo, "--out", str(tmp_path / "ev"), "-q"])
    assert exit_.value.code == 0
    assert "rowgate: gate" not in capsys.readouterr().err
