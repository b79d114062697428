"""The typed vocabulary of acceptance criteria and stop conditions: rows declare them,
review records carry them."""

from __future__ import annotations

import operator
from collections.abc import Callable
from enum import Enum


class Comparison(str, Enum):
    LT = "lt"
    LE = "le"
    EQ = "eq"
    GE = "ge"
    GT = "gt"

    def holds(self, measured: float, threshold: float) -> bool:
        return _COMPARATORS[self](measured, threshold)

    @property
    def symbol(self) -> str:
        return {"lt": "<", "le": "<=", "eq": "==", "ge": ">=", "gt": ">"}[self.value]


_COMPARATORS: dict[Comparison, Callable[[float, float], bool]] = {
    Comparison.LT: operator.lt, Comparison.LE: operator.le, Comparison.EQ: operator.eq,
    Comparison.GE: operator.ge, Comparison.GT: operator.gt,
}


class StopAction(str, Enum):
    REFUSE = "refuse"
    """The bundle cannot be approved."""
    STOP_IMPLEMENTATION = "stop-implementation"
    """Implementation work the row gates on this is not admitted."""
