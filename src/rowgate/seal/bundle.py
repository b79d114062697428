"""Evidence bundles: staging, sealing, reading and verifying.

Gates write their artifacts into the work area of a staging directory that this run
owns by a lock (`rowgate.seal.staging`). Sealing builds the bundle in a fresh directory:
the gate results and the manifest are written by rowgate itself, the artifacts each gate
listed are moved in without following a link, every file is fsynced and made read-only,
the signature is made and the whole bundle is verified; only then does one `rename`
publish it under `ROW/BUNDLE-ID`. A process killed at any moment leaves a staging
directory (swept by the next run) or a whole bundle, never a partial one; anything the
subject's commands planted elsewhere in the staging area is never sealed. A sealed
bundle is never modified: re-running makes a new one.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rowgate import __version__
from rowgate.errors import EvidenceError, UsageError, VerificationError
from rowgate.records import schema
from rowgate.records.canonical import canonical_json
from rowgate.records.gate_result import GateResult
from rowgate.records.identity import SignerIdentity
from rowgate.records.ids import BUNDLE_ID_LEN
from rowgate.records.manifest import FileDigest, GateSummary, Manifest, RowRef
from rowgate.records.provenance import Provenance, Subject
from rowgate.records.status import overall_status
from rowgate.seal import staging
from rowgate.seal.signing import SIGNATURE_FILE, Signer, Verifier
from rowgate.storage import is_storage

if TYPE_CHECKING:
    from rowgate.rows.row import LoadedRow

MANIFEST_FILE = "manifest.json"
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


# -------------------------------------------------------------------- staging


class Stage:
    """A bundle being built. Gates write artifacts under `root`; `seal` publishes it."""

    def __init__(self, out_dir: Path, row_id: str):
        self.row_dir = out_dir / row_id
        try:
            self.row_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if is_storage(exc):
                raise
            raise EvidenceError(f"{self.row_dir}: cannot create ({exc.strerror})") from exc
        staging.sweep(self.row_dir)
        self._holder = staging.Holder(self.row_dir)
        self.root = self._holder.path / "work"
        """Where gates write: `artifacts/GATE-ID/…` below it. Never sealed as it is."""
        (self.root / "artifacts").mkdir(parents=True)
        self._results: dict[str, GateResult] = {}

    def artifact_dir(self, gate_id: str) -> Path:
        return self.root / "artifacts" / gate_id

    def add_result(self, result: GateResult) -> None:
        schema.validate("gate-result", json.loads(result.model_dump_json()),
                        f"gates/{result.gate_id}.json")
        self._results[result.gate_id] = result

    def results(self) -> list[GateResult]:
        return list(self._results.values())

    def seal(self, *, row: "LoadedRow", row_file: str, subject: Subject, provenance: Provenance,
             signer: Signer, order: list[str]) -> Path:
        """Write the manifest, sign, freeze, verify and publish. Returns the bundle path."""
        self._holder.check()
        results = [self._results[g] for g in order if g in self._results]
        counted = {g.id for g in row.row.gates if g.required}  # informational gates do not
        bundle = Path(tempfile.mkdtemp(prefix="bundle-", dir=self._holder.path))
        (bundle / "gates").mkdir()
        for r in results:
            (bundle / "gates" / f"{r.gate_id}.json").write_bytes(
                canonical_json(json.loads(r.model_dump_json())))
        (bundle / "artifacts").mkdir()
        for r in results:  # exactly what each gate listed, links never followed
            staging.take(self.root, bundle, r.artifacts)
        manifest = Manifest(
            rowgate_version=__version__,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            run_id=uuid.uuid4().hex,
            row=RowRef(id=row.row.id, file=row_file, sha256=row.sha256),
            subject=subject, provenance=provenance, signer=signer.identity,
            status=overall_status([r.status for r in results if r.gate_id in counted]),
            gates=[GateSummary(gate_id=r.gate_id, kind=r.kind, status=r.status, reason=r.reason,
                               file=f"gates/{r.gate_id}.json", required=r.gate_id in counted)
                   for r in results],
            files=digest_tree(bundle, exclude={MANIFEST_FILE, SIGNATURE_FILE}))
        data = canonical_json(json.loads(manifest.model_dump_json()))
        schema.validate("manifest", json.loads(data), MANIFEST_FILE)
        (bundle / MANIFEST_FILE).write_bytes(data)
        bundle_id = hashlib.sha256(data).hexdigest()[:BUNDLE_ID_LEN]
        named = self._holder.path / bundle_id  # the signed statement names the bundle id
        bundle.rename(named)
        signer.sign(named, named / SIGNATURE_FILE, ignore=[SIGNATURE_FILE])
        staging.freeze(named)
        # What we publish must be what `rowgate verify` accepts: checked before, not after.
        Bundle(named, manifest, data).verify_contents(signer.verifier())
        self._holder.check()
        final = staging.publish(named, self.row_dir / bundle_id, "bundle")
        self._holder.close()
        return final

    def discard(self) -> None:
        self._holder.close()


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
        """Read and check the manifest (strict JSON, schema, every name and path in it);
        nothing it names is opened before that."""
        path = Path(path)
        if path.is_symlink() or not path.is_dir():
            raise UsageError(f"{path}: not a bundle directory")
        data = _read(path, MANIFEST_FILE)
        manifest = schema.load_checked(Manifest, "manifest", data, MANIFEST_FILE)
        return cls(path.resolve(), manifest, data)

    def gate_result(self, gate_id: str) -> GateResult:
        """The sealed result of one of the manifest's gates, read strictly."""
        summary = next((g for g in self.manifest.gates if g.gate_id == gate_id), None)
        if summary is None:
            raise VerificationError(f"{MANIFEST_FILE}: no gate {gate_id!r}")
        result = schema.load_checked(GateResult, "gate-result", _read(self.path, summary.file),
                                     summary.file)
        if result.gate_id != gate_id:
            raise VerificationError(f"{summary.file}: is the result of gate {result.gate_id!r}")
        return result

    def results(self) -> list[GateResult]:
        return [self.gate_result(g.gate_id) for g in self.manifest.gates]

    def verify(self, verifier: Verifier) -> SignerIdentity:
        """Check the bundle byte for byte, and that it is filed where its manifest says;
        raise VerificationError naming the first problem."""
        m = self.manifest
        expected_id = hashlib.sha256(self.manifest_bytes).hexdigest()[:BUNDLE_ID_LEN]
        if self.id != expected_id:
            raise VerificationError(f"{MANIFEST_FILE}: digest gives bundle id {expected_id}, "
                                    f"but the bundle is named {self.id} (manifest edited or "
                                    f"bundle renamed)")
        if self.path.parent.name != m.row.id:
            raise VerificationError(f"bundle is filed under row {self.path.parent.name!r} but "
                                    f"its manifest is for row {m.row.id!r}")
        return self.verify_contents(verifier)

    def verify_contents(self, verifier: Verifier) -> SignerIdentity:
        """Every byte against the manifest and the signature, wherever the bundle lies
        (the seal checks a bundle before it publishes it)."""
        m = self.manifest
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
            result = self.gate_result(g.gate_id)
            if (result.status, result.reason) != (g.status, g.reason):
                raise VerificationError(f"{g.file}: status/reason differ from the manifest's summary")
            unlisted = [a for a in result.artifacts if a not in self.manifest.files]
            if unlisted:
                raise VerificationError(f"{g.file}: artifacts: {unlisted[0]!r} is not a file of "
                                        f"the bundle")


def _read(root: Path, rel: str) -> bytes:
    """A file of a bundle, opened without following a link (a symlink planted for a
    sealed file never leads outside)."""
    try:
        fd = os.open(root / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise VerificationError(f"{rel}: missing ({exc.strerror})") from exc
    except OSError as exc:
        raise VerificationError(f"{rel}: cannot read ({exc.strerror})") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise VerificationError(f"{rel}: not a regular file")
        with open(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


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
