"""A row's wall-time budget (`[budget] wall_s`): a gate that finds it spent is not run
(ERROR naming the budget and what spent it), the seal and the review still work, and a
row without one runs every gate. The throughput gate's share of it: test_timed_rounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from rowgate.records.status import Status
from tests.support import write_row

SLOW_THEN_FAST = '''
    [[gates]]
    id = "slow"
    kind = "host"
    commands = [["python", "-c", "import time; time.sleep(1.5)"]]

    [[gates]]
    id = "after"
    kind = "host"
    commands = [["python", "-c", "print('ok')"]]
'''


def _run(tmp_path: Path, git_repo, budget: str):
    from rowgate.cli.progress import PlainProgress
    from rowgate.rows import row as rows
    from rowgate.run import runner
    from rowgate.seal import signing

    path = write_row(tmp_path, "TEST-BUDGET", SLOW_THEN_FAST + budget)
    signer = signing.default_signer(announce=lambda m: None)
    return runner.run_row(rows.load_row(path), Path(git_repo.working_dir), tmp_path / "ev",
                          signer, PlainProgress(True))


def test_a_gate_after_the_budget_is_spent_is_not_run_and_says_why(tmp_path, git_repo):
    run = _run(tmp_path, git_repo, "\n[budget]\nwall_s = 1\n")
    slow, after = run.results
    assert slow.status is Status.PASS and slow.duration_s >= 1.5
    assert after.status is Status.ERROR and run.status is Status.FAIL
    assert after.reason.startswith("not run: the row's wall budget ([budget] wall_s = 1 s)")
    assert "slow 2 s" in after.reason or "slow 1 s" in after.reason  # what spent it


def test_a_budget_that_suffices_changes_nothing(tmp_path, git_repo):
    run = _run(tmp_path, git_repo, "\n[budget]\nwall_s = 600\n")
    assert [r.status for r in run.results] == [Status.PASS, Status.PASS]


@pytest.mark.parametrize("value", ["0", "-5", '"ten"'])
def test_a_budget_that_is_not_a_positive_number_is_one_row_error(tmp_path, value):
    from rowgate.errors import RowError
    from rowgate.rows import row as rows

    path = write_row(tmp_path, "TEST-BUDGET", SLOW_THEN_FAST + f"\n[budget]\nwall_s = {value}\n")
    with pytest.raises(RowError, match="budget.wall_s"):
        rows.load_row(path)


def test_the_plan_holds_the_budget_against_the_last_sealed_run(tmp_path, git_repo, capsys):
    from rowgate.cli.main import main

    _run(tmp_path, git_repo, "\n[budget]\nwall_s = 1\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["gate", str(tmp_path / "TEST-BUDGET.toml"), "--repo", git_repo.working_dir,
              "--plan", "--out", str(tmp_path / "ev")])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "budget: 1 s of wall time for the run" in out, out
    assert "the row's last sealed bundle took" in out and "would leave out after" in out, out
