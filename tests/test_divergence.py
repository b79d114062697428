"""Matched correctness windows: a timed or traced pass's tokens against the correctness
pass of the same requests (rowgate.engines.divergence.matched_windows)."""

from __future__ import annotations

from rowgate.engines.divergence import Out, matched_windows


def out(tokens, alternatives=None):
    alts = alternatives or [((t + 1, -5.0),) for t in tokens]
    return Out(tuple(tokens), tuple(-0.1 for _ in tokens), tuple(alts))


def test_equal_prefixes_match_whatever_their_lengths():
    correct = {"r0": out([5, 6, 7, 8]), "r1": out([9, 10])}
    window = {"r0": out([5, 6, 7, 8, 11, 12]), "r1": out([9])}
    doc = matched_windows(correct, window)
    assert doc["matched"] and (doc["exact_requests"], doc["compared"]) == (2, 2)


def test_a_planted_divergence_in_the_window_is_refused_with_where():
    correct = {"r0": out([5, 6, 7, 8]), "r1": out([9, 10, 11])}
    window = {"r0": out([5, 6, 7, 8]), "r1": out([9, 40, 11])}
    doc = matched_windows(correct, window)
    assert not doc["matched"] and doc["mismatched_requests"] == 1
    first = doc["first_mismatch"]
    assert (first["request"], first["position"], first["correctness"], first["window"]) == \
        ("r1", 1, 10, 40)


def test_a_near_tie_kept_the_other_way_is_not_a_mismatch():
    correct = {"r0": out([5, 6], [((9, -5.0),), ((40, -0.2),)])}
    window = {"r0": out([5, 40], [((9, -5.0),), ((6, -0.15),)])}
    assert not matched_windows(correct, window, 0.0)["matched"]
    doc = matched_windows(correct, window, 0.5)
    assert doc["matched"] and doc["tie_requests"] == 1


def test_a_window_request_never_checked_is_a_mismatch():
    doc = matched_windows({"r0": out([1])}, {"r0": out([1]), "r9": out([2])})
    assert not doc["matched"] and doc["unmatched_requests"] == 1
    assert doc["first_mismatch"] == {"request": "r9", "unmatched": True}


def test_windows_keyed_by_prompt():
    prompt = (3, 4, 5)
    assert matched_windows({prompt: out([7, 8])}, {prompt: out([7, 8, 9])})["matched"]
