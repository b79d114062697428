"""One status rule: a bundle, a run and `rowgate build` combine statuses the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from rowgate.cli.main import STATUS_EXIT
from rowgate.errors import ExitCode
from rowgate.gates.interface import Derived
from rowgate.records.status import Status, overall_status
from rowgate.run.local_build import LocalBuild

P, F, W, E = Status.PASS, Status.FAIL, Status.PENDING, Status.ERROR


@pytest.mark.parametrize(("statuses", "overall"), [
    ([], P), ([P, P], P), ([P, W], W), ([W, F], F), ([P, E], F), ([E, W], F), ([W, W], W),
])
def test_fail_or_error_is_fail_then_pending_then_pass(statuses, overall):
    assert overall_status(statuses) is overall
    assert overall_status(iter(statuses)) is overall  # any iterable, read once


@pytest.mark.parametrize(("build", "audit", "overall", "code"), [
    (P, P, P, ExitCode.OK), (P, W, W, ExitCode.PENDING), (F, P, F, ExitCode.FAILED),
    (E, P, F, ExitCode.FAILED), (E, W, F, ExitCode.FAILED),
])
def test_rowgate_build_combines_like_a_bundle(build, audit, overall, code):
    """ERROR counts as FAIL there too (it stayed ERROR before); its exit code is unchanged."""
    result = LocalBuild(Derived(build, ""), Derived(audit, ""), Path("out"))
    assert result.status is overall
    assert STATUS_EXIT[result.status] is code
