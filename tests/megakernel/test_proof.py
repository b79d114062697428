"""The proof's comparison of eager and persistent greedy outputs: exact, tie, mismatch."""

from __future__ import annotations

from pipeline.megakernel.proof import Out, compare, divergence


def _out(tokens, logprobs=None, runner_up=None) -> Out:
    n = len(tokens)
    return Out(tuple(tokens), tuple(logprobs or [-0.1] * n),
               tuple(runner_up or [(999, -5.0)] * n))


def test_equal_outputs_do_not_diverge():
    assert divergence(_out([1, 2, 3]), _out([1, 2, 3]), 0.5) is None


def test_a_swap_of_the_top_two_within_the_margin_is_a_tie():
    want = _out([1, 2, 3, 4], [-0.1, -0.7, -0.1, -0.1], [(9, -5), (5, -0.8), (9, -5), (9, -5)])
    got = _out([1, 5, 6, 7], [-0.1, -0.69, -0.1, -0.1], [(9, -5), (2, -0.75), (9, -5), (9, -5)])
    d = divergence(want, got, 0.5)
    assert d["tie"] and d["position"] == 1 and (d["eager"], d["persistent"]) == (2, 5)
    assert d["eager_gap"] == 0.1 and d["persistent_gap"] == 0.06
    assert not divergence(want, got, 0.05)["tie"]  # the same swap under a tighter margin


def test_a_divergence_to_a_token_that_was_not_the_runner_up_is_a_mismatch():
    want = _out([1, 2], [-0.1, -0.7], [(9, -5), (5, -0.8)])
    got = _out([1, 6], [-0.1, -0.7], [(9, -5), (2, -0.8)])  # 6, not eager's runner-up 5
    assert divergence(want, got, 10.0)["tie"] is False


def test_a_missing_runner_up_never_counts_as_a_tie():
    want = Out((1, 2), (-0.1, -0.1), ())
    assert divergence(want, Out((1, 3), (-0.1, -0.1), ()), 10.0)["tie"] is False


def test_compare_counts_and_names_the_first_real_mismatch():
    tie_w = _out([1, 2], [-0.1, -0.7], [(9, -5), (5, -0.8)])
    tie_g = _out([1, 5], [-0.1, -0.7], [(9, -5), (2, -0.8)])
    doc = compare([_out([1, 2]), tie_w, _out([4, 4])], [_out([1, 2]), tie_g, _out([4, 8])], 0.5)
    assert (doc["exact_requests"], doc["tie_requests"], doc["mismatched_requests"]) == (1, 1, 1)
    assert doc["first_divergence"]["request"] == 2 and doc["first_divergence"]["position"] == 1
    assert [d["request"] for d in doc["divergences"]] == [1, 2]


def test_a_shorter_output_is_a_mismatch():
    doc = compare([_out([1, 2, 3])], [_out([1, 2])], 0.5)
    assert doc["mismatched_requests"] == 1 and doc["first_divergence"]["position"] == 2
