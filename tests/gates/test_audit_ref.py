"""The audit inspects the build gate's sealed builds by reference instead of sealing a
second copy: it derives what the copying audit derives, a referenced file altered or
missing FAILs naming it, a reference that would leave the bundle (or name a gate that is
not a build gate) is refused, and without a usable build gate the audit copies as before.
Real builds (the session's build cache), real sealed bundles."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from rowgate import compressed
from rowgate.cuda import toolchains
from rowgate.decision.review import evaluate
from rowgate.gates import audit
from rowgate.gates.interface import GateError
from rowgate.records.status import Status
from rowgate.rows import row as rows
from rowgate.run import runner
from rowgate.seal import signing
from rowgate.seal.bundle import Bundle
from tests.gates.test_audit_compressed import KERNEL, QUIET, ROW, _subject
from tests.support import write_row

pytestmark = pytest.mark.slow

GATES = frozenset({"build"})


def _run(tmp: Path, row_id: str, gates: str) -> tuple[Path, rows.LoadedRow, dict[str, Status]]:
    root = _subject(tmp / "subject")
    loaded = rows.load_row(write_row(tmp, row_id, gates, arch="sm_70", kind="kernel-pr",
                                     target_extra='build_arches = ["sm_70", "sm_90"]'))
    signer = signing.default_signer(announce=lambda msg: None)
    run = runner.run_row(loaded, root, tmp / "evidence", signer, QUIET)
    return run.bundle, loaded, {r.gate_id: r.status for r in run.results}


@pytest.fixture(scope="module")
def sealed(tmp_path_factory) -> tuple[Path, rows.LoadedRow, Path]:
    """(bundle of a build + audit row, its row, an audit of the same subject that copied)."""
    tmp = tmp_path_factory.mktemp("auditref")
    path, loaded, statuses = _run(tmp, "TEST-AUDITREF", ROW)
    assert statuses == {"build": Status.PASS, "audit": Status.PASS}, statuses
    copied = tmp / "copied"
    audit.measure_audit(tmp / "subject", ["sm_70", "sm_90"], [KERNEL], {}, copied, QUIET)
    return path, loaded, copied


def _artifacts(path: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "artifacts"
    shutil.copytree(path / "artifacts", copy)
    return copy


def _entries(art: Path) -> list[dict]:
    return json.loads((art / "audit" / "audit.json").read_text())


def _write_entries(art: Path, entries: list[dict]) -> None:
    (art / "audit" / "audit.json").write_text(json.dumps(entries, indent=2))


def test_the_referencing_audit_derives_what_the_copying_one_does(sealed):
    path, loaded, copied = sealed
    art = path / "artifacts"
    sealed_result = Bundle.open(path).gate_result("audit")
    by_copy = audit.derive_audit(copied)
    assert (sealed_result.status, sealed_result.reason, sealed_result.cells) == (
        by_copy.status, by_copy.reason, by_copy.cells)
    assert sealed_result.metrics["embedded_images_verified"] == 2 == by_copy.metrics[
        "embedded_images_verified"]
    for entry in _entries(art):
        ref = entry["build_ref"]
        assert ref["gate"] == "build" and ref["dir"] == entry["dir"]
        record = json.loads((art / "build" / ref["dir"] / "build.json").read_text())
        for name, digest in record["outputs"].items():
            sealed_name = name if name == record["cubin"] else name + ".gz"
            assert ref["files"][sealed_name] == digest, name
        assert all(s["log"] in ref["files"] for s in record["steps"])
        assert not (art / "audit" / entry["dir"] / "build.json").exists()
    assert not (art / "audit" / "builds.json").exists()
    # the duplicate is gone: the copying audit is larger by (about) the builds, ARCH/KERNEL/
    builds = sum(f.stat().st_size for f in (art / "build").glob("sm_*/*/*") if f.is_file())
    size = {d: sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
            for d in (art / "audit", copied)}
    assert size[copied] - size[art / "audit"] >= builds * 0.95, (size, builds)
    ev = evaluate(loaded.row, Bundle.open(path))
    assert next(g for g in ev.gates if g.gate_id == "audit").rederived == "consistent"


@pytest.mark.parametrize("victim", ["build.json", "log", "cubin", "ptx"])
def test_a_referenced_file_altered_fails_naming_it(sealed, tmp_path, victim):
    path, loaded, _ = sealed
    art = _artifacts(path, tmp_path)
    d = art / "build" / "sm_90" / KERNEL
    record = json.loads((d / "build.json").read_text())
    name = {"build.json": "build.json", "cubin": record["cubin"], "ptx": f"{KERNEL}.ptx.gz",
            "log": next(s["log"] for s in record["steps"] if s["tool"] in ("ptxas", "nvcc"))}[victim]
    compressed.write_bytes(d / name, compressed.read_bytes(d / name) + b"\n")
    derived = audit.Audit().derive(loaded.row, None, art / "audit")
    assert derived.status is Status.FAIL
    assert f"referenced build file build/sm_90/{KERNEL}/{name} has sha256" in derived.reason


def test_a_referenced_file_missing_fails_naming_it(sealed, tmp_path):
    path, loaded, _ = sealed
    art = _artifacts(path, tmp_path)
    (art / "build" / "sm_70" / KERNEL / "build.json").unlink()
    derived = audit.Audit().derive(loaded.row, None, art / "audit")
    assert derived.status is Status.FAIL
    assert f"referenced build file build/sm_70/{KERNEL}/build.json missing" in derived.reason


def test_an_unpinned_log_fails(sealed, tmp_path):
    """A reference that leaves out a file derive reads does not let it be read unchecked."""
    path, loaded, _ = sealed
    art = _artifacts(path, tmp_path)
    entries = _entries(art)
    record = json.loads((art / "build" / entries[0]["dir"] / "build.json").read_text())
    log = record["steps"][0]["log"]
    del entries[0]["build_ref"]["files"][log]
    _write_entries(art, entries)
    derived = audit.Audit().derive(loaded.row, None, art / "audit")
    assert derived.status is Status.FAIL and f"{log} is not pinned" in derived.reason


@pytest.mark.parametrize("field, value", [
    ("dir", "../../../etc"), ("dir", "/etc"), ("dir", "sm_90/../../host"), ("dir", ""),
    ("gate", "host"), ("gate", "../build"), ("gate", "audit"),
    ("file", "../build.json"), ("file", "/etc/passwd"),
])
def test_a_reference_leaving_the_bundle_or_the_build_gates_is_refused(sealed, tmp_path,
                                                                       field, value):
    path, loaded, _ = sealed
    art = _artifacts(path, tmp_path)
    entries = _entries(art)
    ref = entries[0]["build_ref"]
    if field == "file":
        ref["files"][value] = "0" * 64
    else:
        ref[field] = value
    _write_entries(art, entries)
    with pytest.raises(GateError, match="audit build reference refused"):
        audit.Audit().derive(loaded.row, None, art / "audit")


def test_a_reference_through_a_link_is_refused(sealed, tmp_path):
    path, loaded, _ = sealed
    art = _artifacts(path, tmp_path)
    d = art / "build" / "sm_90" / KERNEL
    outside = tmp_path / "outside"
    shutil.move(d, outside)
    d.symlink_to(outside, target_is_directory=True)
    with pytest.raises(GateError, match="refused: build/sm_90/decode_attention is a link"):
        audit.Audit().derive(loaded.row, None, art / "audit")
    d.unlink()
    d.mkdir()
    for f in outside.iterdir():  # now each file a link to the real bytes
        (d / f.name).symlink_to(f)
    derived = audit.Audit().derive(loaded.row, None, art / "audit")
    assert derived.status is Status.FAIL
    assert f"build/sm_90/{KERNEL}/build.json is a link or not a regular file" in derived.reason


def test_without_a_row_no_reference_is_honoured(sealed):
    path, _, _ = sealed
    with pytest.raises(GateError, match=r"gate 'build' is not a build gate of the row \(none\)"):
        audit.Audit().derive(None, None, path / "artifacts" / "audit")


@pytest.mark.parametrize("gates", [
    '''
    [[gates]]
    id = "audit"
    kind = "audit"
    kernels = ["decode_attention"]
    ''',
    '''
    [[gates]]
    id = "build"
    kind = "build"
    kernels = ["decode_attention"]
    arches = ["sm_90"]

    [[gates]]
    id = "audit"
    kind = "audit"
    kernels = ["decode_attention"]
    '''], ids=["no-build-gate", "build-gate-built-fewer"])
def test_without_a_build_gate_covering_it_the_audit_keeps_its_own_copy(tmp_path, gates, sealed):
    path, _, _ = sealed
    bundle, _, statuses = _run(tmp_path, "TEST-AUDITCOPY", gates)
    assert statuses["audit"] is Status.PASS
    art = bundle / "artifacts" / "audit"
    assert not any("build_ref" in e for e in _entries(bundle / "artifacts"))
    for arch in ("sm_70", "sm_90"):
        own = art / arch / KERNEL / "build.json"
        theirs = path / "artifacts" / "build" / arch / KERNEL / "build.json"
        assert hashlib.sha256(own.read_bytes()).digest() == hashlib.sha256(
            theirs.read_bytes()).digest()
    assert (art / "sm_90" / KERNEL / f"{KERNEL}.fatbin.gz").is_file()
    assert Bundle.open(bundle).gate_result("audit").reason == Bundle.open(path).gate_result(
        "audit").reason


def test_an_arch_no_gate_can_build_here_still_audits_the_rest_by_reference(tmp_path, sealed,
                                                                           monkeypatch):
    """The SM70 row on the H200 (no CUDA 12.8 NVRTC there): the build gate builds sm_90 and
    ERRORs naming sm_70. The audit used to give up its reference for want of the sm_70
    build and seal a second copy of the sm_90 one (3.3 MB of that bundle), only to ERROR
    on the same missing toolchain before inspecting anything. Now it inspects the sm_90
    build by reference, seals only its own tool outputs, and ERRORs naming sm_70."""
    def absent() -> toolchains.Toolchain:
        raise toolchains.ToolchainError("nvidia-cuda-nvrtc-cu12 is not installed: "
                                        "pip install 'rowgate[cuda12]'")

    monkeypatch.setattr(toolchains, "_cuda12", absent)
    bundle, _, statuses = _run(tmp_path, "TEST-AUDITSTANDIN", ROW)
    assert statuses == {"build": Status.ERROR, "audit": Status.ERROR}, statuses
    reason = Bundle.open(bundle).gate_result("audit").reason
    assert reason.startswith("sm_70: nvidia-cuda-nvrtc-cu12 is not installed")
    assert reason.endswith("(audited for sm_90)"), reason
    entries = _entries(bundle / "artifacts")
    assert [(e["arch"], e["kernel"]) for e in entries] == [("sm_90", KERNEL)]
    assert all("build_ref" in e and e["sass"] for e in entries)
    own = bundle / "artifacts" / "audit" / "sm_90" / KERNEL
    assert (own / audit.SASS).is_file()
    assert not list(own.glob("build.json")) and not list(own.glob(f"{KERNEL}.*")), \
        sorted(p.name for p in own.iterdir())
    # the same inspection the PASSing referencing audit made of its sm_90 build
    path, _, _ = sealed
    theirs = [e for e in _entries(path / "artifacts") if e["arch"] == "sm_90"]
    assert entries[0]["build_ref"]["files"] == theirs[0]["build_ref"]["files"]


def test_a_failed_build_is_named_once_on_one_line():
    from rowgate.cuda.resources import Violation
    from rowgate.gates.audit import _violations_reason

    log = "k.cu(3): error: identifier \"x\" is undefined\nk.cu(9): error: ...\n2 errors"
    reason = _violations_reason([Violation("k", "*", "sm_90", "build", log, "a clean build"),
                                 Violation("k", "*", "sm_110", "build", log, "a clean build"),
                                 Violation("j", "e", "sm_90", "registers", 200, 128)])
    assert reason == ('3 violation(s): 2 kernel build(s) not clean (first k sm_90: '
                      'k.cu(3): error: identifier "x" is undefined); j/e sm_90: registers '
                      '200 exceeds budget 128')
    assert "\n" not in reason
