"""Compact bundles: the build and audit gates seal SASS dumps, PTX, objects, fatbins and
extracted images gzipped (byte-stable), every reader takes the `.gz` transparently, and
artifacts sealed plain by an earlier rowgate (the checked-in pagedmini bundle, the
b68c77e fixture) read exactly as before. Real builds (the session's build cache)."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import git
import pytest

from rowgate import compressed
from rowgate.cli.main import main
from rowgate.cli.progress import PlainProgress
from rowgate.decision.review import evaluate
from rowgate.gates import audit, build
from rowgate.records.gate_result import GateResult
from rowgate.records.status import Status
from rowgate.rows import row as rows
from rowgate.run import runner
from rowgate.seal import signing
from rowgate.seal.bundle import Bundle
from tests.support import LAB, write_row

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PAGEDMINI = next((REPO / "docs" / "evidence" / "SUBJECT-PAGEDMINI-SM90").iterdir())
QUIET = PlainProgress(quiet=True)
BUILD_GATES = frozenset({"build"})
KERNEL = "decode_attention"
ROW = '''
    [[gates]]
    id = "build"
    kind = "build"
    kernels = ["decode_attention"]

    [[gates]]
    id = "audit"
    kind = "audit"
    kernels = ["decode_attention"]
'''


def _subject(root: Path) -> Path:
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Test Author")
        cw.set_value("user", "email", "author@example.com")
    shutil.copytree(LAB / "kernels", root / "kernels")
    repo.index.add(["kernels"])
    repo.index.commit("kernels\n\nSigned-off-by: Test Author <author@example.com>\n")
    return root


@pytest.fixture(scope="module")
def sealed(tmp_path_factory) -> tuple[Path, dict[str, GateResult], rows.LoadedRow, signing.Signer]:
    """A bundle of a build + audit row (sm_70 NVRTC, sm_90 nvcc) sealed by this rowgate."""
    tmp = tmp_path_factory.mktemp("compact")
    root = _subject(tmp / "subject")
    loaded = rows.load_row(write_row(tmp, "TEST-COMPACT", ROW, arch="sm_70", kind="kernel-pr",
                                     target_extra='build_arches = ["sm_70", "sm_90"]'))
    signer = signing.default_signer(announce=lambda msg: None)
    run = runner.run_row(loaded, root, tmp / "evidence", signer, QUIET)
    return run.bundle, {r.gate_id: r for r in run.results}, loaded, signer


@pytest.fixture(scope="module")
def copied(sealed, tmp_path_factory) -> Path:
    """The audit of the same subject measured with no build gate beside it: it builds
    (the session's cache) and seals its own copy of every build, as before."""
    path, _, _, _ = sealed
    out = tmp_path_factory.mktemp("copied") / "audit"
    audit.measure_audit(path.parents[2] / "subject", ["sm_70", "sm_90"], [KERNEL], {}, out, QUIET)
    assert (out / "builds.json").is_file() and (out / "sm_90" / KERNEL / f"{KERNEL}.o.gz").is_file()
    return out


def _is_stable_gzip(data: bytes) -> bool:
    """gzip magic, no FNAME flag (no temp path leaks in), mtime 0."""
    return data[:3] == b"\x1f\x8b\x08" and not data[3] & 0x08 and data[4:8] == b"\0\0\0\0"


def test_sass_ptx_object_fatbin_and_images_are_sealed_gzipped(sealed):
    path, results, _, signer = sealed
    assert results["build"].status is Status.PASS, results["build"].reason
    assert results["audit"].status is Status.PASS, results["audit"].reason
    bundle = Bundle.open(path)
    bundle.verify(signer.verifier())  # the manifest covers the .gz bytes
    files = set(bundle.manifest.files)
    art = path / "artifacts"
    d = f"artifacts/build/sm_90/{KERNEL}"
    assert {f"{d}/{KERNEL}.ptx.gz", f"{d}/{KERNEL}.o.gz", f"{d}/{KERNEL}.fatbin.gz",
            f"{d}/{KERNEL}.sm_90.cubin"} <= files
    assert not {f"{d}/{KERNEL}.ptx", f"{d}/{KERNEL}.o", f"{d}/{KERNEL}.fatbin"} & files
    # each sealed output is the content its build.json digests
    record = json.loads((art / "build" / "sm_90" / KERNEL / "build.json").read_text())
    for name, digest in record["outputs"].items():
        sealed_file = build.sealed_output(art / "build" / "sm_90" / KERNEL, name)
        content = compressed.read_bytes(sealed_file)
        assert hashlib.sha256(content).hexdigest() == digest, name
    # the audit references the build gate's outputs instead of sealing a copy
    # (tests/gates/test_audit_ref.py); the copying audit is checked on `copied` below
    assert not {f for f in files if f.startswith("artifacts/audit/") and
                (f.endswith((".cubin", ".o.gz", ".fatbin.gz", ".ptx.gz")) or "build.json" in f)}
    for arch in ("sm_70", "sm_90"):
        sass = art / "audit" / arch / KERNEL / "sass.txt.gz"
        assert _is_stable_gzip(sass.read_bytes())
        assert f"code for {arch}" in gzip.decompress(sass.read_bytes()).decode()
        assert f"artifacts/audit/{arch}/{KERNEL}/sass.txt" not in files
    # the fatbin and the object embed the same cubin: sealed once, both containers' records
    # name that file (and derive hashes it for each)
    images = sorted((art / "audit" / "sm_90" / KERNEL / "embedded").rglob("*.cubin.gz"))
    assert len(images) == 1 and _is_stable_gzip(images[0].read_bytes())
    index = json.loads((art / "audit" / "audit.json").read_text())
    entry = next(e for e in index if e["arch"] == "sm_90")
    assert sorted(i["container"] for i in entry["embedded"]) == [f"{KERNEL}.fatbin",
                                                                  f"{KERNEL}.o"]
    assert {i["file"] for i in entry["embedded"]} == {
        images[0].relative_to(art / "audit" / "sm_90" / KERNEL).as_posix()}


def test_the_sealed_bundle_rederives_at_review_and_reads_in_inspect_and_report(
        sealed, tmp_path, capsys):
    path, results, loaded, _ = sealed
    ev = evaluate(loaded.row, Bundle.open(path))
    checks = {g.gate_id: g for g in ev.gates}
    for gate in ("build", "audit"):
        assert checks[gate].rederived == "consistent", (gate, checks[gate])
    again = audit.Audit().derive(loaded.row, None, path / "artifacts" / "audit")
    assert (again.status, again.reason, again.cells) == (
        results["audit"].status, results["audit"].reason, results["audit"].cells)
    assert again.cells[f"{KERNEL}/decode_attention_e5m2_hd128@sm_90"]["sass_instructions"] > 0
    _cli_reads(path, tmp_path, capsys)


def _cli_reads(path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`inspect` and `report` (Markdown and HTML) of a bundle, with its checked-in or
    session key: each shows the audit's sealed verdict."""
    key = _key_for(path)
    with pytest.raises(SystemExit) as done:
        main(["inspect", str(path)])
    assert done.value.code == 0 and "audit" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        main(["inspect", "--json", str(path)])
    doc = json.loads(capsys.readouterr().out)
    assert done.value.code == 0
    assert "SASS rules hold" in next(g["reason"] for g in doc["gates"] if g["kind"] == "audit")
    for flag, page in (("--markdown", tmp_path / "report.md"), ("--html", tmp_path / "r.html")):
        with pytest.raises(SystemExit) as done:
            main(["report", str(path), flag, str(page), "--key", str(key),
                  "--reviews", str(tmp_path / "reviews")])
        assert done.value.code == 0 and "SASS rules hold" in page.read_text(), flag


def _key_for(path: Path) -> Path:
    signer = Bundle.open(path).manifest.signer
    keys = {signing.KeyVerifier(p).identity.id: p
            for p in (REPO / "docs" / "evidence" / "keys").glob("*.pub.pem")}
    if signer.id in keys:
        return keys[signer.id]
    return signing.default_signer(announce=lambda msg: None).public_key_file()


def test_a_gzipped_sass_that_was_changed_fails_the_audit(sealed, tmp_path):
    """The .gz is read, not skipped: a SASS dump edited to claim another arch FAILs the
    re-derivation (the real dump is decompressed, edited, recompressed)."""
    path, results, _, _ = sealed
    copy = tmp_path / "artifacts"
    shutil.copytree(path / "artifacts", copy)
    sass = copy / "audit" / "sm_90" / KERNEL / "sass.txt.gz"
    text = compressed.read_text(sass)
    assert "Function : decode_attention_e5m2_hd128" in text
    compressed.write_text(sass, text.replace("code for sm_90", "code for sm_80", 1))
    derived = audit.derive_audit(copy / "audit", BUILD_GATES)
    assert derived.status is Status.FAIL
    assert f"{KERNEL}/* sm_90: SASS arch: sm_80" in derived.reason


def test_a_sealed_output_that_is_not_the_one_built_fails_build_and_audit(sealed, copied, tmp_path):
    path, _, _, _ = sealed
    copy = tmp_path / "artifacts"
    shutil.copytree(path / "artifacts", copy)
    shutil.copytree(copied, copy / "audit-copy")  # an audit with its own copy, as before
    for gate in ("build", "audit-copy"):
        ptx = copy / gate / "sm_90" / KERNEL / f"{KERNEL}.ptx.gz"
        compressed.write_bytes(ptx, compressed.read_bytes(ptx) + b"// edited\n")
    derived = build.derive_builds(copy / "build")
    assert derived.status is Status.FAIL
    assert f"{KERNEL} sm_90: output {KERNEL}.ptx.gz has sha256 " in derived.reason
    assert "not the " in derived.reason and "its build recorded" in derived.reason
    assert audit.derive_audit(copy / "audit-copy").status is Status.FAIL
    referencing = audit.derive_audit(copy / "audit", BUILD_GATES)
    assert referencing.status is Status.FAIL
    assert f"build/sm_90/{KERNEL}/{KERNEL}.ptx.gz has sha256" in referencing.reason


def _unpack_to_old_layout(audit_dir: Path) -> None:
    """What an earlier rowgate sealed: plain sass.txt, outputs and images, audit.json
    naming them plain."""
    for gz in list(audit_dir.rglob("*.gz")):
        plain = gz.with_name(gz.name.removesuffix(".gz"))
        plain.write_bytes(compressed.read_bytes(gz))
        gz.unlink()
    entries = json.loads((audit_dir / "audit.json").read_text())
    for e in entries:
        e["sass"] = e["sass"] and e["sass"].removesuffix(".gz")
        for image in e["embedded"]:
            image["file"] = image["file"].removesuffix(".gz")
    (audit_dir / "audit.json").write_text(json.dumps(entries, indent=2))


def test_plain_sass_txt_artifacts_read_as_before(sealed, copied, tmp_path):
    path, results, _, _ = sealed
    old = tmp_path / "audit"
    shutil.copytree(copied, old)
    _unpack_to_old_layout(old)
    assert (old / "sm_90" / KERNEL / "sass.txt").is_file()
    assert not list(old.rglob("*.gz"))
    derived = audit.derive_audit(old)
    assert (derived.status, derived.reason, derived.cells) == (
        results["audit"].status, results["audit"].reason, results["audit"].cells)
    assert build.derive_builds(old).status is Status.PASS
    # and the plain reader really reads: a forbidden-arch edit to the plain dump FAILs
    sass = old / "sm_90" / KERNEL / "sass.txt"
    sass.write_text(sass.read_text().replace("code for sm_90", "code for sm_80", 1))
    assert audit.derive_audit(old).status is Status.FAIL


def test_measuring_twice_seals_the_same_bytes(tmp_path):
    root = _subject(tmp_path / "subject")
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        audit.measure_audit(root, ["sm_90"], [KERNEL], {}, out, QUIET)
    for rel in (f"sm_90/{KERNEL}/sass.txt.gz", f"sm_90/{KERNEL}/{KERNEL}.ptx.gz",
                f"sm_90/{KERNEL}/{KERNEL}.fatbin.gz"):
        assert (outs[0] / rel).read_bytes() == (outs[1] / rel).read_bytes(), rel


def test_the_checked_in_compact_bundle_rederives_build_and_audit(tmp_path, capsys):
    """docs/evidence's pagedmini bundle (re-sealed on the H200 in the compact format: build
    outputs gzipped, the audit inspecting them by reference): the gates' derive on its
    artifacts, with its row's build gate as a review takes it, gives what was sealed. (Old
    plain bundles: test_plain_sass_txt_artifacts_read_as_before.)"""
    row = rows.load_row(REPO / "tests" / "data" / "rows" / "SUBJECT-PAGEDMINI-SM90.toml").row
    for gate, derive in (("build", build.Build().derive), ("audit", audit.Audit().derive)):
        sealed_result = json.loads((PAGEDMINI / "gates" / f"{gate}.json").read_text())
        again = derive(row, row.gate(gate), PAGEDMINI / "artifacts" / gate)
        assert (again.status.value, again.reason) == (sealed_result["status"],
                                                      sealed_result["reason"]), gate
    own = PAGEDMINI / "artifacts" / "audit" / "sm_90" / "pm_decode"
    assert (own / "sass.txt.gz").is_file() and not list(own.glob("pm_decode.*"))  # referenced
    _cli_reads(PAGEDMINI, tmp_path, capsys)
