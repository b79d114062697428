"""Workload: deterministic token-id prompts per cell and a digest sensitive to all of it."""

from __future__ import annotations

import dataclasses

import pytest

from rowgate.errors import Error
from rowgate.rows.spec import Sampling, Workload
from rowgate.rows.workload import (
    WorkloadError,
    WorkloadMismatch,
    build_passes,
    canonical,
    check_same_workload,
    workload_digest,
)

BASE = Workload(input_lens=[16, 64], concurrency=[1, 4], output_len=16, requests_per_cell=4)


def _digest(workload: Workload, vocab: int = 1024, special=(0, 1)) -> str:
    return workload_digest(build_passes(workload, vocab, special))


def test_cells_follow_the_row_matrix():
    passes = build_passes(BASE, 1024, (0, 1))
    assert [p.cell for p in passes] == BASE.cells() == ["i16-c1", "i16-c4", "i64-c1", "i64-c4"]
    assert [p.concurrency for p in passes] == [1, 4, 1, 4]
    for p in passes:
        assert len(p.requests) == 4
        assert {len(r.prompt_ids) for r in p.requests} == {int(p.cell[1:].split("-")[0])}
        assert {r.max_tokens for r in p.requests} == {16}
        assert len({r.id for r in p.requests}) == 4
        assert not p.prefix_caching and p.ignore_eos and p.temperature == 0.0


def test_same_row_same_prompts_and_digest():
    assert build_passes(BASE, 1024, (0, 1)) == build_passes(BASE, 1024, (0, 1))
    assert _digest(BASE) == _digest(BASE.model_copy())


def test_prompts_are_not_all_alike_and_avoid_special_ids():
    passes = build_passes(BASE, 1024, (0, 1, 7))
    prompts = [r.prompt_ids for p in passes for r in p.requests]
    ids = {i for prompt in prompts for i in prompt}
    assert not ids & {0, 1, 7}
    assert ids <= set(range(1024))
    assert len({p for p in prompts if len(p) == 16}) == 4  # distinct requests
    assert len(ids) > 200  # spread over the vocabulary


def test_prompts_pinned_to_a_known_value():
    # The derivation is part of the evidence format: a change must bump DIGEST_VERSION.
    first = build_passes(BASE, 1024, (0, 1))[0].requests[0].prompt_ids
    assert first[:6] == (37, 231, 112, 678, 29, 235)
    assert _digest(BASE) == PINNED_DIGEST


PINNED_DIGEST = "sha256:26b87788271945210944796f006b782f6eb0d3037fba23a2efa246e3c3203f43"


@pytest.mark.parametrize("change", [
    {"output_len": 17}, {"requests_per_cell": 5}, {"input_lens": [16, 65]},
    {"concurrency": [1, 8]}, {"seeds": [1]}, {"prefix_caching": True},
    {"sampling": Sampling(temperature=1.0)}, {"sampling": Sampling(top_k=20)},
    {"sampling": Sampling(top_p=0.95)}, {"sampling": Sampling(ignore_eos=False)},
])
def test_digest_sensitive_to_every_parameter(change):
    assert _digest(BASE.model_copy(update=change)) != _digest(BASE)


def test_digest_sensitive_to_vocab_and_special_ids():
    assert _digest(BASE, vocab=1000) != _digest(BASE)
    assert _digest(BASE, special=(0, 1, 2)) != _digest(BASE)


def test_digest_sensitive_to_one_prompt_token():
    passes = build_passes(BASE, 1024, (0, 1))
    req = passes[2].requests[1]
    ids = list(req.prompt_ids)
    ids[10] = ids[10] + 1 if ids[10] < 1023 else 2
    changed = dataclasses.replace(passes[2], requests=(
        passes[2].requests[0], dataclasses.replace(req, prompt_ids=tuple(ids)),
        *passes[2].requests[2:]))
    assert workload_digest([*passes[:2], changed, *passes[3:]]) != workload_digest(passes)
    assert canonical(passes) != canonical([*passes[:2], changed, *passes[3:]])


def test_seeds_cycle_over_requests():
    passes = build_passes(BASE.model_copy(update={"seeds": [3, 9]}), 1024, (0, 1))
    assert [r.seed for r in passes[0].requests] == [3, 9, 3, 9]


def test_mismatch_is_refused_with_both_digests():
    a, b = _digest(BASE), _digest(BASE.model_copy(update={"output_len": 8}))
    check_same_workload(a, a)
    with pytest.raises(WorkloadMismatch, match="workload digest differs") as info:
        check_same_workload(a, b)
    assert a in str(info.value) and b in str(info.value)
    assert isinstance(info.value, Error)


def test_no_usable_ids_is_an_error():
    with pytest.raises(WorkloadError, match="no token ids"):
        build_passes(BASE, 2, (0, 1))
