"""Helpers of the security suite: real subjects, real keys, the real CLI, tree snapshots.

Everything here drives rowgate from outside (its CLI, in-process or as a subprocess) on
real files and real git repositories, so the tests survive a re-layering of src/rowgate/.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

import git
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.support import REPO

SIGNOFF = "\n\nSigned-off-by: Test Author <author@example.com>\n"
FIXTURES = REPO / "tests" / "fixtures" / "kernels"
CLEAN_TOML = '''
    version = 1
    [kernels.k]
    source = "clean.cu"
    entry_points = ["scale"]
    arches = ["sm_70"]
'''
HOST_GATE_OK = f'''
    [[gates]]
    id = "host"
    kind = "host"
    commands = [["{sys.executable}", "-c", "print('ok')"]]
'''
BUILD_GATE = '''
    [[gates]]
    id = "build"
    kind = "build"
    arches = ["sm_70"]
'''


# ------------------------------------------------------------------ the CLI


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()

    @property
    def last(self) -> str:
        return self.lines[-1] if self.lines else ""


def cli(capsys, *args: object, cwd: Path | None = None) -> Run:
    """`rowgate ARGS` in-process (rowgate.cli.main.main): exit code, stdout, stderr."""
    from rowgate.cli.main import main

    capsys.readouterr()
    old = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        with pytest.raises(SystemExit) as exc:
            main([a if isinstance(a, str) else str(a) for a in args])
    finally:
        os.chdir(old)
    out, err = capsys.readouterr()
    return Run(int(exc.value.code or 0), out, err)


def proc_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    env.update(extra)
    return env


def rowgate_argv(*args: object) -> list[str | bytes]:
    return [sys.executable, "-m", "rowgate.cli.main",
            *[a if isinstance(a, (str, bytes)) else str(a) for a in args]]


def rowgate(*args: object, cwd: Path | None = None, timeout: float = 300,
            env: dict[str, str] | None = None) -> Run:
    """`python -m rowgate.cli.main ARGS` as a subprocess (kills, concurrency, FIFOs, cwd)."""
    proc = subprocess.run(rowgate_argv(*args), cwd=cwd, env=env or proc_env(),
                          capture_output=True, timeout=timeout, check=False)
    return Run(proc.returncode, proc.stdout.decode(errors="replace"),
               proc.stderr.decode(errors="replace"))


def own_key() -> tuple[str, Path]:
    """`--key` and the public half of the user's own key (the test's config dir), which
    every gate here signs with unless a test names another: `verify`, `review` and
    `oracle verify` check against a signer the caller names."""
    from rowgate.seal import signing

    return "--key", signing.local_public_key()


def assert_one_line(run: Run, code: int, pattern: str) -> str:
    """Exit `code`, no traceback, and stderr is exactly one line matching `pattern`."""
    err = run.err.strip()
    assert "Traceback" not in run.err, run.err
    assert run.code == code, (run.code, run.out, run.err)
    assert len(err.splitlines()) == 1, run.err
    assert re.fullmatch(pattern, err), f"{err!r} does not match {pattern!r}"
    return err


# ---------------------------------------------------------------- snapshots


def snapshot(root: Path, skip: tuple[str, ...] = ()) -> dict[str, tuple]:
    """Every entry under root (itself included): type, mode, size, mtime, content digest,
    link target. Comparing two snapshots proves nothing under root changed."""
    out: dict[str, tuple] = {}
    if not os.path.lexists(root):
        return out
    entries = [root]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip]
        entries += [Path(dirpath) / n for n in dirnames + filenames]
    for path in entries:
        st = path.lstat()
        rel = path.relative_to(root).as_posix()
        digest = link = ""
        if stat.S_ISREG(st.st_mode):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            link = os.readlink(path)
        mtime = st.st_mtime_ns if not stat.S_ISDIR(st.st_mode) else 0
        out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_size, mtime,
                    digest, link, st.st_nlink if not stat.S_ISDIR(st.st_mode) else 0)
    return out


def dir_mtimes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.lstat().st_mtime_ns
            for p in [root, *root.rglob("*")] if p.is_dir() and not p.is_symlink()}


class Sentinel:
    """A directory rowgate has no business touching: files, a sub-dir, a secret, modes."""

    def __init__(self, root: Path):
        self.root = root
        (root / "sub").mkdir(parents=True)
        (root / "precious.txt").write_text("precious\n")
        (root / "sub" / "deep.txt").write_text("deep\n")
        (root / "secret.cu").write_text("// SENTINEL-SECRET-7f3a do not read\n")
        (root / "gate.json").write_text(json.dumps({
            "gate_id": "outside", "kind": "host", "status": "PASS",
            "reason": "SENTINEL-OUTSIDE-TEXT", "metrics": {}, "cells": {}, "artifacts": []}))
        os.chmod(root / "precious.txt", 0o640)
        self.rebase()

    def rebase(self) -> None:
        """Take the snapshot again (after a test put its own bait in)."""
        self.before = snapshot(self.root)
        self.dirs = dir_mtimes(self.root)

    def assert_untouched(self) -> None:
        assert snapshot(self.root) == self.before, "the sentinel directory changed"
        assert dir_mtimes(self.root) == self.dirs, "a sentinel directory's entries changed"


def tree_text(root: Path) -> str:
    """All bytes of all regular files under root, for "does X appear anywhere" checks."""
    chunks = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                chunks.append(p.read_bytes().decode(errors="replace"))
    return "\n".join(chunks)


# ----------------------------------------------------------------- subjects


def git_commit_all(repo: git.Repo, message: str) -> git.Commit:
    repo.git.add("-A")
    return repo.index.commit(message + SIGNOFF)


def make_subject(root: Path, files: dict[str, object] | None = None,
                 toml: str | None = CLEAN_TOML) -> Path:
    """A real subject repository at `root`: main with one commit, then branch `feature`
    checked out with `files` (and kernels/kernels.toml) committed, symlinks included.

    `files` maps a path to bytes/str content, `Link(target)` for a symlink, or
    `FIXTURE` for a copy of tests/fixtures/kernels/<name>."""
    repo = git.Repo.init(root, initial_branch="main")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "Test Author")
        cw.set_value("user", "email", "author@example.com")
    (root / "README.md").write_text("subject\n")
    git_commit_all(repo, "initial")
    repo.git.checkout("-b", "feature")
    files = dict(files if files is not None else {"kernels/clean.cu": FIXTURE,
                                                  "kernels/include/.keep": ""})
    if toml is not None:
        files.setdefault("kernels/kernels.toml", textwrap.dedent(toml))
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Link):
            os.symlink(content.target, path)
        elif content is FIXTURE:
            shutil.copyfile(FIXTURES / path.name, path)
        else:
            path.write_bytes(content.encode() if isinstance(content, str) else content)
    git_commit_all(repo, "kernels")
    repo.close()
    return root


@dataclass(frozen=True)
class Link:
    target: str


FIXTURE = object()


def subject_state(root: Path) -> tuple[dict, str]:
    """(snapshot of the work tree without .git, `git status` including ignored files)."""
    status = subprocess.run(["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
                            cwd=root, capture_output=True, text=True, check=True).stdout
    return snapshot(root, skip=(".git",)), status


def write_row(directory: Path, row_id: str, body: str) -> Path:
    from tests.support import write_row as _write_row

    return _write_row(directory, row_id, body)


UNCONFINED = ('\n[sandbox]\nmode = "off"\nreason = "the test runs what a subject could do '
              'were its code unconfined: the seal\'s own defences"\n')
"""Row text that turns the sandbox off: the tests of what the seal refuses or survives
on its own (planted entries, a full disk) need a command that can reach the staging
area, which the sandbox (tests/security/test_sandbox.py) never lets one do."""


def host_row(directory: Path, row_id: str, *commands: list[str], require_clean: bool = True,
             extra: str = "") -> Path:
    """A row whose one gate is `host` with `commands`."""
    cmds = ", ".join(json.dumps(c) for c in commands)
    body = (f'\n[[gates]]\nid = "host"\nkind = "host"\ncommands = [{cmds}]\n'
            f'require_clean = {str(require_clean).lower()}\n' + extra)
    return write_row(directory, row_id, body)


def only_bundle(out: Path, row_id: str) -> Path:
    found = [p for p in (out / row_id).iterdir() if not p.name.startswith(".")]
    assert len(found) == 1, found
    return found[0]


def leftovers(out: Path) -> list[str]:
    """Hidden entries (staging, temp files) anywhere under an evidence/reviews dir."""
    return sorted(p.relative_to(out).as_posix() for p in out.rglob(".*")) if out.exists() else []


# --------------------------------------------------------------------- keys


def pem_private(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def pem_public(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


class Keys:
    """Real keys of every kind a user might hand rowgate, as files."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.p256 = ec.generate_private_key(ec.SECP256R1())
        self.private = self._write("gate-key.pem", pem_private(self.p256))
        self.public = self._write("gate-key.pub.pem", pem_public(self.p256))
        p384 = ec.generate_private_key(ec.SECP384R1())
        self.p384_private = self._write("p384.pem", pem_private(p384))
        self.p384_public = self._write("p384.pub.pem", pem_public(p384))
        rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.rsa_private = self._write("rsa.pem", pem_private(rsa_key))
        self.encrypted = self._write("encrypted.pem", self.p256.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"hunter2")))
        self.crlf_private = self._write("crlf.pem", pem_private(self.p256).replace(b"\n", b"\r\n"))
        self.crlf_public = self._write("crlf.pub.pem", pem_public(self.p256).replace(b"\n", b"\r\n"))
        self.bare_public = self._write("bare.pub.pem", pem_public(self.p256).rstrip(b"\n"))
        self.empty = self._write("empty.pem", b"")
        self.garbage = self._write("garbage.pem", b"not a key at all\n")
        self.directory = root / "a-directory.pem"
        self.directory.mkdir()
        self.fifo = root / "fifo.pem"
        os.mkfifo(self.fifo)
        self.missing = root / "missing.pem"

    def _write(self, name: str, data: bytes) -> Path:
        path = self.root / name
        path.write_bytes(data)
        return path


def private_key_text(path: Path) -> str:
    """The base64 body of a PEM private key (what must never be copied anywhere)."""
    lines = path.read_text().splitlines()
    return "".join(ln for ln in lines if ln and not ln.startswith("-----"))[:64]


def fill(directory: Path, leave: int = 0) -> None:
    """Fill the filesystem of `directory` until at most `leave` bytes are free."""
    filler = directory / "filler.bin"
    with open(filler, "ab", buffering=0) as f:
        chunk = b"\0" * 65536
        while True:
            st = os.statvfs(directory)
            free = st.f_bavail * st.f_frsize
            if free <= leave:
                break
            try:
                f.write(chunk[: max(1, min(len(chunk), free - leave))])
                f.flush()
            except OSError:
                break


# ------------------------------------------------------------------ forgery


def canonical(doc: object) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def sign_dir(key: Path, directory: Path) -> None:
    """Sign a directory the way rowgate's key signer does (model-signing, every file)."""
    from rowgate.seal import signing

    sig = directory / signing.SIGNATURE_FILE
    if sig.exists():
        sig.unlink()
    signing.KeySigner(key).sign(directory, sig, ignore=[signing.SIGNATURE_FILE])


def make_writable(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                os.chmod(p, 0o644)


def reseal(bundle: Path, key: Path, *, files: dict | None = None, manifest=None,
           manifest_text=None) -> Path:
    """A forged bundle next to `bundle`: `files` {rel: text -> text} edited, the manifest's
    digests recomputed, `manifest` (dict -> None) and then `manifest_text` (text -> text)
    applied, renamed to the id its manifest digest gives and re-signed with `key`: a bundle
    whose signature and digests are all valid, whatever it says."""
    work = bundle.parent.parent.parent / "forge" / bundle.name
    if work.exists():
        make_writable(work)
        shutil.rmtree(work)
    shutil.copytree(bundle, work)
    make_writable(work)
    for rel, edit in (files or {}).items():
        (work / rel).write_text(edit((work / rel).read_text()))
    doc = json.loads((work / "manifest.json").read_text())
    doc["files"] = {}
    for dirpath, _, filenames in os.walk(work):
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(work).as_posix()
            if rel not in ("manifest.json", "signature.sigstore.json"):
                data = (Path(dirpath) / name).read_bytes()
                doc["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    doc["run_id"] = uuid.uuid4().hex  # every forgery is a bundle of its own
    if manifest is not None:
        manifest(doc)
    text = canonical(doc)
    if manifest_text is not None:
        text = manifest_text(text)
    data = text.encode()
    (work / "manifest.json").write_bytes(data)
    forged = bundle.parent / hashlib.sha256(data).hexdigest()[:16]
    os.rename(work, forged)
    sign_dir(key, forged)
    return forged


def sign_record(key: Path, record: Path) -> None:
    """Re-sign a single-file record as rowgate does: a directory named after it holding
    just the file, signed with model-signing, the signature beside the record."""
    import tempfile

    sig = record.with_name(record.name.removesuffix(".json") + ".sigstore.json")
    with tempfile.TemporaryDirectory() as tmp:
        holder = Path(tmp) / record.name.removesuffix(".json")
        holder.mkdir()
        shutil.copyfile(record, holder / record.name)
        from rowgate.seal import signing

        signing.KeySigner(key).sign(holder, Path(tmp) / "sig.json", ignore=[])
        shutil.copyfile(Path(tmp) / "sig.json", sig)


def duplicate_before(text: str, line: str, first: str) -> str:
    """Insert `first` (a `"key": value` pair) before the one line equal to `line`, same
    indent, so the JSON says that key twice: a last-wins parser reads `line`'s value."""
    lines = text.split("\n")
    hits = [i for i, ln in enumerate(lines) if ln == line or ln == line + ","]
    assert len(hits) == 1, (line, hits)
    indent = line[: len(line) - len(line.lstrip())]
    lines.insert(hits[0], f"{indent}{first},")
    return "\n".join(lines)
