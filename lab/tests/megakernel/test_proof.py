"""The proof's comparison of eager and persistent greedy outputs: exact, tie, mismatch."""

from __future__ import annotations

from rowgate_lab.megakernel.proof import Out, compare, divergence

FAR = ((998, -5.0), (999, -6.0))


def _out(tokens, logprobs=None, alternatives=None) -> Out:
    n = len(tokens)
    return Out(tuple(tokens), tuple(logprobs or [-0.1] * n), tuple(alternatives or [FAR] * n))


# at position 1 eager keeps 2, persistent 5; each has the other's choice among its
# alternatives: eager 0.1 nats below its own, persistent 0.06 (a third token, 44, in
# between on eager's side: a three-way bf16 tie)
TIE_W = _out([1, 2, 3, 4], [-0.1, -0.7, -0.1, -0.1],
             [FAR, ((44, -0.75), (5, -0.8)), FAR, FAR])
TIE_G = _out([1, 5, 6, 7], [-0.1, -0.69, -0.1, -0.1],
             [FAR, ((2, -0.75), (44, -0.9)), FAR, FAR])


def test_equal_outputs_do_not_diverge():
    assert divergence(_out([1, 2, 3]), _out([1, 2, 3]), 0.5) is None


def test_each_choice_among_the_others_alternatives_within_the_margin_is_a_tie():
    d = divergence(TIE_W, TIE_G, 0.5)
    assert d["tie"] and d["position"] == 1 and (d["eager"], d["persistent"]) == (2, 5)
    assert d["eager_gap"] == 0.1 and d["persistent_gap"] == 0.06
    assert not divergence(TIE_W, TIE_G, 0.08)["tie"]  # the same swap under a tighter margin


def test_a_choice_the_other_path_did_not_rank_near_the_top_is_a_mismatch():
    got = _out([1, 6], [-0.1, -0.7], [FAR, ((2, -0.8),)])  # 6 is not among eager's
    d = divergence(TIE_W, got, 10.0)
    assert d["tie"] is False and d["eager_gap"] is None and d["persistent_gap"] == 0.1


def test_missing_alternatives_never_count_as_a_tie():
    want = Out((1, 2), (-0.1, -0.1), ())
    assert divergence(want, Out((1, 3), (-0.1, -0.1), ()), 10.0)["tie"] is False


def test_compare_counts_and_names_the_first_real_mismatch():
    doc = compare([_out([1, 2]), TIE_W, _out([4, 4])], [_out([1, 2]), TIE_G, _out([4, 8])], 0.5)
    assert (doc["exact_requests"], doc["tie_requests"], doc["mismatched_requests"]) == (1, 1, 1)
    assert doc["first_divergence"]["request"] == 2 and doc["first_divergence"]["position"] == 1
    assert [d["request"] for d in doc["divergences"]] == [1, 2]


def test_a_shorter_output_is_a_mismatch():
    doc = compare([_out([1, 2, 3])], [_out([1, 2])], 0.5)
    assert doc["mismatched_requests"] == 1 and doc["first_divergence"]["position"] == 2
