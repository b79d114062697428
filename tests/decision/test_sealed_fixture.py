"""A bundle sealed by an earlier rowgate (main at b68c77e, before the re-layering) still
verifies byte for byte and re-derives to the verdict that rowgate judged then.

tests/data/bundles/ holds the whole bundle (artifacts, manifest, signature), the public
key it was signed with, its row file and `*.expected.json`: what that rowgate's review
re-derived (per gate, per criterion, per stop condition, and the verdict). The private
key was thrown away; nothing here can re-sign the bundle."""

from __future__ import annotations

import json
from pathlib import Path

from rowgate.decision.criteria import verdict_of
from rowgate.decision.review import evaluate
from rowgate.rows import row as rows
from rowgate.seal import signing
from rowgate.seal.bundle import Bundle

DATA = Path(__file__).resolve().parents[1] / "data" / "bundles"
ROW_ID = "FIXTURE-SEALED-B68C77E"


def _fixture():
    bundle_dir = next(p for p in (DATA / ROW_ID).iterdir() if p.is_dir())
    expected = json.loads((DATA / f"{ROW_ID}.expected.json").read_text())
    return Bundle.open(bundle_dir), rows.load_row(DATA / f"{ROW_ID}.toml"), expected


def test_the_old_bundle_still_verifies_with_its_key():
    bundle, loaded, expected = _fixture()
    identity = bundle.verify(signing.KeyVerifier(DATA / f"{ROW_ID}.pub.pem"))
    assert identity == bundle.manifest.signer
    assert bundle.id == expected["bundle_id"]
    assert bundle.manifest.status.value == expected["manifest_status"]
    assert bundle.manifest.row.sha256 == loaded.sha256  # the row text it was sealed against


def test_the_old_bundle_rederives_to_the_same_verdict():
    bundle, loaded, expected = _fixture()
    ev = evaluate(loaded.row, bundle)
    verdict, summary = verdict_of(ev.rejects, ev.pendings)
    assert (verdict.value, summary) == (expected["verdict"], expected["summary"])
    assert ev.rejects + ev.pendings == expected["reasons"]
    assert {g.gate_id: {"status": g.status.value, "rederived": g.rederived}
            for g in ev.gates} == expected["gates"]
    assert {c.id: c.outcome.value for c in ev.criteria} == expected["criteria"]
    assert {s.id: s.triggered for s in ev.stops} == expected["stop_conditions"]
