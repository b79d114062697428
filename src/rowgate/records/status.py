"""One status enum everywhere, and the one rule that combines several."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class Status(str, Enum):
    """One status enum everywhere."""

    PASS = "PASS"
    FAIL = "FAIL"
    PENDING = "PENDING"
    """Cannot run here (missing hardware, weights, credentials): with the reason."""
    ERROR = "ERROR"
    """The gate itself broke, or its kind is not implemented yet."""


MetricValue = float | int | str | bool | None


def overall_status(statuses: Iterable[Status]) -> Status:
    """FAIL if any is FAIL or ERROR, else PENDING if any is, else PASS: a bundle's
    status, a run's, and `rowgate build`'s."""
    statuses = list(statuses)
    if any(s in (Status.FAIL, Status.ERROR) for s in statuses):
        return Status.FAIL
    if any(s is Status.PENDING for s in statuses):
        return Status.PENDING
    return Status.PASS
