"""Evidence bundles: staging, sealing, reading and verifying.

Sealing is atomic: the bundle is built in a hidden staging directory on the
same filesystem, every file is fsynced and made read-only, and one `rename`
publishes it under `ROW/BUNDLE-ID`. A process killed at any moment leaves a
`.staging-*` directory (swept by the next run) or a whole bundle, never a
partial one. A sealed bundle is never modified: re-running makes a new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import __version__
from pipeline.errors import EvidenceError, UsageError, VerificationError
from pipeline.records import schema
from pipeline.records.canonical import canonical_json
from pipeline.records.gate_result import GateResult
from pipeline.records.identity import SignerIdentity
from pipeline.records.ids import BUNDLE_ID_LEN
from pipeline.records.manifest import FileDigest, GateSummary, Manifest
from pipeline.records.provenance import Provenance, Subject
from pipeline.records.status import overall_status
from pipeline.signing import SIGNATURE_FILE, Signer, Verifier

if TYPE_CHECKING:
    from pipeline.rows import LoadedRow

MANIFEST_FILE = "manifest.json"
STAGING_PREFIX = ".staging-"
_CHUNK = 1 << 20


# --------------------------------------------------------------- file digests


def sha256_file(path: Path) -> FileDigest:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
    return FileDigest(sha256=h.hexdigest(), size=size)


def _walk(root: Path) -> Iterator[tuple[str, Path]]:
    """Every entry under root as (relative posix path, path); refuses anything
    that is not a regular file or directory, symlinks included."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise VerificationError(f"{rel}: symbolic link inside the bundle")
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise VerificationError(f"{rel}: not a regular file")
            if stat.S_ISREG(mode):
                yield rel, path


def digest_tree(root: Path, exclude: set[str]) -> dict[str, FileDigest]:
    files = [(rel, p) for rel, p in _walk(root) if rel not in exclude]
    # hashlib releases the GIL on large buffers: threads hash files in parallel.
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        digests = list(pool.map(lambda item: sha256_file(item[1]), files))
    return {rel: d for (rel, _), d in zip(files, digests)}


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -------------------------------------------------------------------- staging


class Stage:
    """A bundle being built. Gates write artifacts; `seal` publishes it."""

    def __init__(self, out_dir: Path, row_id: str):
        self.row_dir = out_dir / row_id
        self.row_dir.mkdir(parents=True, exist_ok=True)
        sweep_stale_stages(self.row_dir)
        self._holder = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-",
                                             dir=self.row_dir))
        self.root = self._holder / "bundle"
        (self.root / "gates").mkdir(parents=True)
        (self.root / "artifacts").mkdir()

    def artifact_dir(self, gate_id: str) -> Path:
        return self.root / "artifacts" / gate_id

    def add_result(self, result: GateResult) -> None:
        data = json.loads(result.model_dump_json())
        schema.validate("gate-result", data, f"gates/{result.gate_id}.json")
        (self.root / "gates" / f"{result.gate_id}.json").write_bytes(canonical_json(data))

    def results(self) -> list[GateResult]:
        return [GateResult.model_validate_json(p.read_bytes())
                for p in sorted((self.root / "gates").glob("*.json"))]

    def seal(self, *, row: "LoadedRow", row_file: str, subject: Subject, provenance: Provenance,
             signer: Signer, order: list[str]) -> Path:
        """Write the manifest, sign, freeze and publish. Returns the bundle path."""
        by_id = {r.gate_id: r for r in self.results()}
        results = [by_id[g] for g in order if g in by_id]
        counted = {g.id for g in row.row.gates if g.required}
        manifest = Manifest(
            rowgate_version=__version__,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            run_id=uuid.uuid4().hex,
            row={"id": row.row.id, "file": row_file, "sha256": row.sha256},
            subject=subject, provenance=provenance, signer=signer.identity,
            status=overall_status([r.status for r in results if r.gate_id in counted]),
            gates=[GateSummary(gate_id=r.gate_id, kind=r.kind, status=r.status, reason=r.reason,
                               file=f"gates/{r.gate_id}.json") for r in results],
            files=digest_tree(self.root, exclude={MANIFEST_FILE, SIGNATURE_FILE}))
        data = canonical_json(json.loads(manifest.model_dump_json()))
        schema.validate("manifest", json.loads(data), MANIFEST_FILE)
        (self.root / MANIFEST_FILE).write_bytes(data)
        bundle_id = hashlib.sha256(data).hexdigest()[:BUNDLE_ID_LEN]
        named = self._holder / bundle_id  # the signed statement names the bundle id
        self.root.rename(named)
        self.root = named
        signer.sign(named, named / SIGNATURE_FILE, ignore=[SIGNATURE_FILE])
        final = publish(named, self.row_dir / bundle_id, "bundle")
        shutil.rmtree(self._holder, ignore_errors=True)
        return final

    def discard(self) -> None:
        thaw(self._holder)
        shutil.rmtree(self._holder, ignore_errors=True)


def publish(named: Path, final: Path, what: str) -> Path:
    """Freeze a signed directory (every file fsynced and read-only) and move it to
    `final` in one rename on the same filesystem: readers see it whole or not at all
    (bundles here, oracle records in pipeline.oracle)."""
    _freeze(named)
    try:
        os.rename(named, final)
    except OSError as exc:
        raise EvidenceError(f"cannot publish {what} {final}: {exc.strerror}") from exc
    _fsync_path(final.parent)
    return final


def _freeze(root: Path) -> None:
    """fsync every file and directory, then make them read-only."""
    for dirpath, _, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = Path(dirpath) / name
            _fsync_path(path)
            path.chmod(0o444)
        _fsync_path(Path(dirpath))
        Path(dirpath).chmod(0o555)


def thaw(root: Path) -> None:
    """Make a frozen staging tree removable again."""
    for dirpath, _, _ in os.walk(root):
        Path(dirpath).chmod(0o755)


def sweep_stale_stages(row_dir: Path) -> None:
    """Remove staging dirs whose process is gone (killed mid-gate or mid-seal)."""
    for entry in row_dir.glob(f"{STAGING_PREFIX}*"):
        pid = entry.name[len(STAGING_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and _alive(int(pid)):
            continue
        thaw(entry)
        shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# -------------------------------------------------------------------- reading


class Bundle:
    """A sealed bundle on disk. `open` parses; `verify` checks every byte."""

    def __init__(self, path: Path, manifest: Manifest, manifest_bytes: bytes):
        self.path = path
        self.manifest = manifest
        self.manifest_bytes = manifest_bytes

    @property
    def id(self) -> str:
        return self.path.name

    @classmethod
    def open(cls, path: Path) -> "Bundle":
        path = Path(path)
        if path.is_symlink() or not path.is_dir():
            raise UsageError(f"{path}: not a bundle directory")
        try:
            data = (path / MANIFEST_FILE).read_bytes()
        except OSError as exc:
            raise VerificationError(f"{MANIFEST_FILE}: missing ({exc.strerror})") from exc
        manifest = schema.load_checked(Manifest, "manifest", data, MANIFEST_FILE)
        return cls(path.resolve(), manifest, data)

    def gate_result(self, gate_id: str) -> GateResult:
        path = self.path / "gates" / f"{gate_id}.json"
        return GateResult.model_validate_json(path.read_bytes())

    def results(self) -> list[GateResult]:
        return [self.gate_result(g.gate_id) for g in self.manifest.gates]

    def verify(self, verifier: Verifier) -> SignerIdentity:
        """Check the bundle byte for byte; raise VerificationError naming the first problem."""
        m = self.manifest
        expected_id = hashlib.sha256(self.manifest_bytes).hexdigest()[:BUNDLE_ID_LEN]
        if self.id != expected_id:
            raise VerificationError(f"{MANIFEST_FILE}: digest gives bundle id {expected_id}, "
                                    f"but the bundle is named {self.id} (manifest edited or "
                                    f"bundle renamed)")
        if self.path.parent.name != m.row.id:
            raise VerificationError(f"bundle is filed under row {self.path.parent.name!r} but "
                                    f"its manifest is for row {m.row.id!r}")
        if not (self.path / SIGNATURE_FILE).is_file():
            raise VerificationError(f"{SIGNATURE_FILE}: missing")
        actual = digest_tree(self.path, exclude={SIGNATURE_FILE})  # every byte, hashed once
        manifest_digest = actual.pop(MANIFEST_FILE)
        _compare_files(m.files, actual)
        self._check_gate_files()
        signed = verifier.signed_digests(self.path / SIGNATURE_FILE)
        _compare_signed(signed, {**actual, MANIFEST_FILE: manifest_digest})
        identity = verifier.identity
        if identity.id != m.signer.id:
            raise VerificationError(f"{SIGNATURE_FILE}: verified as {identity}, but the manifest "
                                    f"names signer {m.signer}")
        return identity

    def _check_gate_files(self) -> None:
        listed = {g.file for g in self.manifest.gates}
        on_disk = {f"gates/{p.name}" for p in (self.path / "gates").glob("*.json")}
        if listed != on_disk:
            extra = sorted(on_disk - listed) or sorted(listed - on_disk)
            raise VerificationError(f"{extra[0]}: gate files differ from the manifest's gates")
        for g in self.manifest.gates:
            raw = json.loads((self.path / g.file).read_bytes())
            schema.validate("gate-result", raw, g.file)
            if (raw["status"], raw["reason"], raw["gate_id"]) != (g.status.value, g.reason, g.gate_id):
                raise VerificationError(f"{g.file}: status/reason differ from the manifest's summary")


def _compare_files(listed: dict[str, FileDigest], actual: dict[str, FileDigest]) -> None:
    added = sorted(set(actual) - set(listed))
    removed = sorted(set(listed) - set(actual))
    if added and removed:
        raise VerificationError(f"{added[0]}: not in the manifest; {removed[0]}: missing "
                                f"(renamed?)")
    if added:
        raise VerificationError(f"{added[0]}: file added after sealing (not in the manifest)")
    if removed:
        raise VerificationError(f"{removed[0]}: file listed in the manifest is missing")
    for rel, want in listed.items():
        got = actual[rel]
        if got != want:
            raise VerificationError(f"{rel}: sha256 {got.sha256[:16]}… size {got.size} does not "
                                    f"match the manifest's {want.sha256[:16]}… size {want.size}")


def _compare_signed(signed: dict[str, str], actual: dict[str, FileDigest]) -> None:
    """The signature must cover exactly the files on disk, byte for byte."""
    for rel in sorted(set(signed) | set(actual)):
        if rel not in signed:
            raise VerificationError(f"{rel}: not covered by the signature")
        if rel not in actual:
            raise VerificationError(f"{rel}: signed but missing from the bundle")
        if signed[rel] != actual[rel].sha256:
            raise VerificationError(f"{rel}: sha256 differs from the signed digest")


def find_bundles(out_dir: Path, row_id: str | None = None) -> list[Path]:
    """Sealed bundles under an evidence dir, oldest first (staging dirs excluded)."""
    rows = [out_dir / row_id] if row_id else [p for p in out_dir.iterdir() if p.is_dir()]
    found = [b for r in rows if r.is_dir() for b in r.iterdir()
             if b.is_dir() and not b.name.startswith(".") and (b / MANIFEST_FILE).exists()]
    return sorted(found, key=lambda p: p.stat().st_mtime)
