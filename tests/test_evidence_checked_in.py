"""Every bundle checked into docs/evidence verifies, whole, with a key checked in beside it.

docs/perf.md's figures that come from a sealed bundle link it (`docs/evidence/ROW/ID`)
and the key that signed it (`docs/evidence/keys/NAME-FP12.pub.pem`); anyone can run
`rowgate verify` on them from the repo alone. This test does, for every bundle there.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from rowgate.cli.main import main
from rowgate.decision.criteria import Evaluation
from rowgate.decision.rederive import check_gates
from rowgate.rows.row import load_row, recorded_places
from rowgate.seal import signing
from rowgate.seal.bundle import Bundle
from tests.support import DEMOS

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = ROOT / "docs" / "evidence"
BUDGET_BYTES = 30 * 1000 * 1000
LARGEST_PLAIN_FILE = 4 * 1000 * 1000
"""A file this large that is not gzip is a trace sealed uncompressed: the trace gate
seals gzip (src/rowgate/trace/events.py); keep such a bundle out of the repo."""
BUNDLES = sorted(p.parent for p in EVIDENCE.glob("*/*/manifest.json"))
KEYS = {signing.KeyVerifier(p).identity.id: p for p in sorted(EVIDENCE.glob("keys/*.pub.pem"))}
PERF = (ROOT / "docs" / "perf.md").read_text()


def _row_file(recorded: str) -> Path:
    """The row a checked-in bundle names: the demo rows moved from rows/ to rowgate's
    package data (their gates and criteria unchanged)."""
    if recorded.startswith("rows/DEMO-"):
        return DEMOS / Path(recorded).name
    return recorded_places(recorded, ROOT)[0]


def test_there_is_checked_in_evidence_and_its_keys():
    assert BUNDLES, "docs/evidence holds no bundle"
    assert any(b.parent.name == "DEMO-CPU-DECODE" for b in BUNDLES)


@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda b: f"{b.parent.name}/{b.name}")
def test_each_bundle_verifies_with_its_checked_in_key(bundle, capsys):
    signer = Bundle.open(bundle).manifest.signer
    assert signer.kind == "key", f"{bundle}: keyless bundles need --identity (none checked in yet)"
    key = KEYS.get(signer.id)
    assert key is not None, f"{bundle}: no docs/evidence/keys/*.pub.pem has fingerprint {signer.id}"
    with pytest.raises(SystemExit) as done:
        main(["verify", str(bundle), "--key", str(key)])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith(f"OK {bundle}")


@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda b: f"{b.parent.name}/{b.name}")
def test_each_bundle_re_derives_as_it_was_sealed(bundle):
    """Every gate re-derived here from its raw artifacts gives its sealed summary. The
    megakernel bundle caught two ways it could not: the trace gate (which runs before the
    tokens gate) matched traced tokens at review that it could not see when it ran, and
    floats summed by the device's Python 3.12 differ from 3.11's in the last place."""
    sealed = Bundle.open(bundle)
    row = load_row(_row_file(sealed.manifest.row.file)).row
    ev = Evaluation()
    check_gates(row, sealed, ev)
    assert ev.gates and not [r for r in ev.rejects if r.startswith("inconsistent")]


def test_no_file_of_checked_in_evidence_is_ignored_by_git():
    """A clone must get each bundle whole: an ignore pattern (`build/`) once dropped a
    sealed bundle's artifacts/build/ from the commit, and the clone's verify failed."""
    files = [str(p.relative_to(ROOT)) for p in EVIDENCE.rglob("*") if p.is_file()]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT,
                             input="\n".join(files), capture_output=True, text=True).stdout
    assert not ignored.split(), f"ignored by .gitignore: {ignored.split()[:5]}"


def test_evidence_stays_within_its_budget_and_traces_are_compressed():
    files = [p for p in EVIDENCE.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= BUDGET_BYTES
    for p in files:  # a trace (Chrome trace JSON: the bulk of a trace gate's artifacts)
        if p.stat().st_size > LARGEST_PLAIN_FILE and "trace" in p.name:
            assert p.read_bytes()[:2] == b"\x1f\x8b", f"{p}: a large trace, not gzip"


def test_perf_md_links_each_bundle_and_key_and_nothing_missing():
    linked = set(re.findall(r"docs/evidence/([A-Z0-9][A-Z0-9-]*/[0-9a-f]{16})", PERF))
    present = {f"{b.parent.name}/{b.name}" for b in BUNDLES}
    assert linked == present, f"in perf.md only: {linked - present}; unlinked: {present - linked}"
    for key in KEYS.values():
        if not key.name.startswith("cpu-demo-reviewer"):  # the review's key, not a bundle's
            assert f"docs/evidence/keys/{key.name}" in PERF, key.name


def test_raw_results_and_run_logs_stay_out_of_the_tree():
    """Results are not source: no tracked benchmark results, no file named after a run or
    an issue (history is in the commit messages), docs/perf.md a table, not a log."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    assert [f for f in tracked if "/results/" in f] == []
    assert [f for f in tracked if re.search(r"(^|/)[^/]*(issue|run)[0-9]", f, re.I)] == []
    assert len(PERF.splitlines()) <= 400
