"""Re-derivation compares floats to within a few units in the last place, nothing more:
a bundle sealed under another Python (3.12's `sum` is compensated) re-derives
consistently, and an edited sample still does not."""

from __future__ import annotations

import math

from rowgate.decision.rederive import FLOAT_REL_TOL, _first_difference, _same


def result(**metrics: object) -> dict[str, object]:
    return {"status": "PASS", "reason": "r", "metrics": metrics, "cells": {}}


def test_python_312s_compensated_sum_re_derives_as_311s_plain_one():
    xs = [0.1] * 10 + [1e16, 1.0, -1e16]  # plain and compensated sums part here
    plain = 0.0
    for x in xs:
        plain += x
    assert plain != math.fsum(xs)
    a, b = 0.005349459433501204, 0.005349459433501206  # the megakernel bundle's pair
    assert a != b and _same(result(bw=a), result(bw=b))
    assert _same({"x": [1.0, {"y": 2.0}]}, {"x": [1.0 + 1e-15, {"y": 2.0 * (1 + 1e-12)}]})


def test_a_real_change_is_still_a_difference():
    a = 1.2104
    b = a * (1 + 100 * FLOAT_REL_TOL)
    assert not _same(result(ratio=a), result(ratio=b))
    assert _first_difference(result(ratio=a), result(ratio=b)).startswith("metrics.ratio")
    assert not _same(result(n=1), result(n=True))  # a bool is not the number 1
    assert not _same(result(n=1.0), result(n="1.0"))
    assert not _same({"x": [1.0]}, {"x": [1.0, 2.0]})
    assert not _same({"x": 1.0}, {"x": 1.0, "y": 2.0})
    assert not _same(result(), {**result(), "reason": "another"})
