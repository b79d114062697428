"""The catalogue of `--option` keys stays the set of keys the code reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rowgate.errors import UsageError
from rowgate.rows import options

PIPELINE = Path(__file__).resolve().parent.parent / "src" / "rowgate"
READS = re.compile(r"""(?:options|opts)(?:\.get\(|\[)"([a-z0-9_]+)"|"""
                   r"""(?:flag|integer)\(options, "([a-z0-9_]+)"|_OPTION = "([a-z0-9_]+)\"""")


def _read_in_code() -> set[str]:
    found = set()
    for path in PIPELINE.rglob("*.py"):
        if path.name == "options.py":
            continue
        for m in READS.finditer(path.read_text()):
            found.add(next(g for g in m.groups() if g))
    return found


def test_every_key_the_code_reads_is_declared_described_and_nothing_else():
    from rowgate import plugins
    from rowgate.gates import registry

    declared = {k for kind in plugins.own(plugins.GATES) for k in registry.lookup(kind).options}
    assert _read_in_code() == declared == set(options.SAYS)


def test_a_close_misspelling_gets_a_suggestion_and_a_far_one_the_list():
    accepted = options.for_kinds(["tokens", "no-such-kind"])
    with pytest.raises(UsageError, match=r"did you mean 'candidate_model'\?"):
        options.check({"candidate_modle": "x"}, accepted, "row R's gates")
    with pytest.raises(UsageError) as exc:
        options.check({"zzz": "x"}, accepted, "row R's gates")
    assert "did you mean" not in str(exc.value) and "oracle_record_key" in str(exc.value)
    options.check({"seed": "1", "nvcc": "/x"}, accepted, "row R's gates")  # accepted: no error
