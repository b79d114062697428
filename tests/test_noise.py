"""Noise guards: warm-up until stable, moved clocks, large spread."""

from __future__ import annotations

from rowgate.stats import noise


def test_warmup_ends_when_both_arms_settle_or_at_the_maximum():
    settling = {"baseline": [50.0, 98.0, 99.0], "candidate": [40.0, 97.0, 98.5]}
    assert noise.warmup_done(settling, 1, 6, 0.05)
    assert not noise.warmup_done({k: v[:2] for k, v in settling.items()}, 1, 6, 0.05)
    assert not noise.warmup_done({"baseline": [99.0, 99.0], "candidate": [50.0, 99.0]}, 1, 6,
                                 0.05)
    assert noise.warmup_done({"baseline": [1.0, 2.0, 4.0], "candidate": [1, 3, 9]}, 1, 3, 0.05)
    assert not noise.warmup_done({"baseline": [99.0, 99.0], "candidate": [99.0, 99.0]}, 3, 6,
                                 0.05)


def test_a_round_whose_sm_or_memory_clock_moved_is_named():
    steady = [{"sm_clock_mhz": 1980, "mem_clock_mhz": 3201}] * 4
    assert noise.clock_move(steady, 0.02) is None
    drop = steady[:3] + [{"sm_clock_mhz": 1755, "mem_clock_mhz": 3201}]
    assert noise.clock_move(drop, 0.02) == "SM clock moved 1755-1980 MHz (11.4% > 2.0%)"
    mem = steady[:3] + [{"sm_clock_mhz": 1980, "mem_clock_mhz": 1593}]
    assert noise.clock_move(mem, 0.02).startswith("memory clock moved 1593-3201")
    assert noise.clock_move([], 0.02) is None


def test_spread_warnings_in_pyperfs_style():
    assert noise.spread_warning([0.001, -0.002, 0.0], {"a": [100, 101, 99]}, 0.02) is None
    text = noise.spread_warning([0.05, -0.05, 0.04], {"a": [100, 140, 70]}, 0.02)
    assert "paired ratio varies by" in text and "a speed varies by" in text


def test_no_gain_ends_the_warmup_once_no_arm_is_still_getting_faster():
    warming = {"baseline": [50.0, 95.0, 99.0], "candidate": [40.0, 97.0, 98.5]}
    assert not noise.warmup_done({k: v[:2] for k, v in warming.items()}, 1, 6, 0.05, "no-gain")
    assert noise.warmup_done(warming, 1, 6, 0.05, "no-gain")
    # noise: a slower round is no reason to warm up more; agree would go on
    noisy = {"baseline": [99.0, 80.0], "candidate": [90.0, 93.0]}
    assert noise.warmup_done(noisy, 1, 6, 0.05, "no-gain")
    assert not noise.warmup_done(noisy, 1, 6, 0.05, "agree")
    assert not noise.warmup_done({"baseline": [99.0, 80.0], "candidate": [80.0, 90.0]}, 1, 6,
                                 0.05, "no-gain")  # the candidate still gains 12.5 %
    assert not noise.warmup_done({"baseline": [99.0]}, 1, 6, 0.05, "no-gain")  # needs two
    import pytest

    with pytest.raises(ValueError, match="warm-up rule 'flat'"):
        noise.settled(noisy, 0.05, "flat")
