"""What a gate's commands write never breaks (or leaks into) the seal.

A row's host command is the subject's code. Here it is hostile: while its gate runs it
finds rowgate's staging area under --out (it is the same user) and plants git paths at
every level, a forged gate result, a file whose name is not UTF-8, a hardlink to a file
outside --out, symbolic links, a FIFO, a socket, a device node. Whatever it plants, the
published bundle verifies (rowgate's verify and model-signing's CLI), nothing outside
--out changes, and what cannot be sealed is refused with one line in the gate's reason.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.security._support import UNCONFINED, Run, host_row, make_subject, own_key, rowgate, tree_text

PLANT = r'''
import json, os, socket, stat, sys
out, mode, outside = sys.argv[1], sys.argv[2], sys.argv[3]

def artifact_dirs():
    for dirpath, _, _ in os.walk(out):
        if os.path.basename(dirpath) == "host" and \
                os.path.basename(os.path.dirname(dirpath)) == "artifacts":
            yield dirpath

def staging_dirs():
    for dirpath, dirnames, _ in os.walk(out):
        for d in list(dirnames):
            if d.startswith(".staging"):
                root = os.path.join(dirpath, d)
                yield root
                for sub, subdirs, _ in os.walk(root):
                    if sub.count(os.sep) - root.count(os.sep) < 3:
                        yield sub

planted = 0
if mode == "git-paths":
    for d in set(staging_dirs()):
        for rel, text in ((".github/x", "x\n"), (".gitignore", "*\n"), (".gitattributes", "* -diff\n"),
                          (".git/config", "[core]\n")):
            p = os.path.join(d, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, "w").write(text)
            planted += 1
        if os.path.basename(d) == "gates":
            json.dump({"gate_id": "evil", "kind": "host", "status": "PASS", "reason": "planted",
                       "metrics": {}, "cells": {}, "artifacts": []},
                      open(os.path.join(d, "evil.json"), "w"))
for d in artifact_dirs():
    planted += 1
    if mode == "non-utf8":
        open(os.fsencode(d) + b"/bad-\xff.log", "wb").write(b"x\n")
    elif mode == "newline":
        open(os.path.join(d, "two\nlines"), "w").write("x\n")
    elif mode == "non-utf8-dir":
        os.mkdir(os.fsencode(d) + b"/dir-\xfe")
        open(os.fsencode(d) + b"/dir-\xfe/inner.txt", "wb").write(b"x\n")
    elif mode == "hardlink":
        os.link(os.path.join(outside, "precious.txt"), os.path.join(d, "linked.txt"))
    elif mode == "symlink":
        os.symlink(os.path.join(outside, "secret.cu"), os.path.join(d, "link.txt"))
    elif mode == "symlink-dir":
        os.symlink(outside, os.path.join(d, "linkdir"))
    elif mode == "dangling":
        os.symlink("/nonexistent/rowgate", os.path.join(d, "dangling"))
    elif mode == "fifo":
        os.mkfifo(os.path.join(d, "pipe"))
    elif mode == "socket":
        s = socket.socket(socket.AF_UNIX)
        here = os.getcwd()
        os.chdir(d)  # AF_UNIX paths are limited to 108 bytes
        s.bind("sock")
        os.chdir(here)
    elif mode == "device":
        os.mknod(os.path.join(d, "null"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
print("planted", planted)
sys.exit(0 if planted else 3)
'''


class Planted:
    """One hostile run: the row, its evidence dir, the result and the sealed bundle."""

    def __init__(self, tmp: Path, mode: str, outside: Path):
        self.out = tmp / "evidence"
        self.subject = make_subject(tmp / "subject")
        script = tmp / "plant.py"
        script.write_text(PLANT)
        self.row = host_row(tmp / "rows", "TEST-PLANT",
                            [sys.executable, str(script), str(self.out), mode, str(outside)],
                            extra=UNCONFINED)
        self.run: Run = rowgate("-q", "gate", self.row, "--repo", self.subject, "--out", self.out,
                                timeout=180)
        assert "Traceback" not in self.run.err, self.run.err
        self.bundle = Path(self.run.last)

    def gate(self) -> dict:
        assert self.bundle.is_dir(), ("no bundle", self.run.code, self.run.out, self.run.err)
        return json.loads((self.bundle / "gates" / "host.json").read_text())

    def assert_verifies(self) -> None:
        assert self.bundle.is_dir(), ("no bundle", self.run.code, self.run.out, self.run.err)
        verify = rowgate("verify", self.bundle, *own_key(), timeout=120)
        assert verify.code == 0, verify.err
        top = sorted(p.name for p in self.bundle.iterdir())
        assert top == ["artifacts", "gates", "manifest.json", "signature.sigstore.json"], top
        assert sorted(p.name for p in (self.bundle / "gates").iterdir()) == ["host.json"]
        assert not [p for p in self.bundle.rglob("*") if p.is_symlink()]
        assert not list((self.out / "TEST-PLANT").glob(".*")), "staging left behind"


def _model_signing_verifies(bundle: Path) -> subprocess.CompletedProcess:
    cli = shutil.which("model_signing", path=str(Path(sys.executable).parent)) or \
        shutil.which("model_signing")
    if not cli:
        pytest.skip("model_signing's CLI is not installed")
    from rowgate.seal import signing

    pub = signing.local_public_key()
    return subprocess.run([cli, "--log-level", "ERROR", "verify", "key", str(bundle),
                           "--signature", str(bundle / "signature.sigstore.json"),
                           "--public_key", str(pub)], capture_output=True, text=True,
                          timeout=120, check=False)


def test_git_paths_and_a_forged_result_planted_in_staging_are_never_sealed(tmp_path, sentinel):
    """Case 4: .github/x, .gitignore, .gitattributes, .git/config at every level of the
    staging area, and a forged gates/evil.json: the bundle holds none of them and verifies
    for rowgate and for model-signing (which ignores git paths at the top)."""
    p = Planted(tmp_path, "git-paths", sentinel.root)
    assert p.run.code == 0, (p.run.out, p.run.err)
    p.assert_verifies()
    assert "planted" not in tree_text(p.bundle / "gates")
    third_party = _model_signing_verifies(p.bundle)
    assert third_party.returncode == 0, third_party.stdout + third_party.stderr
    sentinel.assert_untouched()


@pytest.mark.parametrize(("mode", "name", "what"), [
    ("non-utf8", r"bad-\\xff\.log", "file name is not UTF-8"),
    ("non-utf8-dir", r"dir-\\xfe", "file name is not UTF-8"),
    ("newline", r"two\\nlines", "file name holds a control character"),
    ("symlink", "link.txt", "symbolic link"),
    ("symlink-dir", "linkdir", "symbolic link"),
    ("dangling", "dangling", "symbolic link"),
    ("fifo", "pipe", "FIFO"),
    ("socket", "sock", "socket"),
    ("device", "null", "character device"),
])
def test_what_cannot_be_sealed_is_refused_with_one_line(tmp_path, sentinel, mode, name, what):
    """Case 5 and the special files: the gate is ERROR naming the entry (exit 1), the entry
    is not in the bundle, the bundle verifies, nothing was followed or read."""
    if mode == "device" and os.geteuid() != 0:
        pytest.skip("mknod needs root")
    p = Planted(tmp_path, mode, sentinel.root)
    assert p.run.code == 1, (p.run.out, p.run.err)
    gate = p.gate()
    assert gate["status"] == "ERROR"
    pattern = rf"artifacts/host/{name}: .*{what}.*not sealed.*"
    assert re.fullmatch(pattern, gate["reason"]), gate["reason"]
    assert "\n" not in gate["reason"]
    p.assert_verifies()
    assert not [a for a in gate["artifacts"] if name.replace("\\", "") in a]
    text = tree_text(p.bundle)
    assert "SENTINEL-SECRET" not in text and "deep\n" not in text
    sentinel.assert_untouched()


def test_a_hardlink_to_a_file_outside_is_copied_never_chmodded(tmp_path, sentinel):
    """Case 6: the seal makes its files read-only; the outside file keeps its mode."""
    p = Planted(tmp_path, "hardlink", sentinel.root)
    assert p.run.code == 0, (p.run.out, p.run.err)
    p.assert_verifies()
    sealed = p.bundle / "artifacts" / "host" / "linked.txt"
    assert sealed.read_text() == "precious\n"
    assert sealed.stat().st_nlink == 1
    assert stat.S_IMODE((sentinel.root / "precious.txt").stat().st_mode) == 0o640
    sentinel.assert_untouched()


def test_the_host_command_does_not_run_in_the_staging_area(tmp_path):
    """Commands run in the subject checkout (their documented working directory), never
    in rowgate's staging area, and the stage they could find holds no bundle yet."""
    subject = make_subject(tmp_path / "subject")
    out = tmp_path / "evidence"
    probe = ("import os, sys; print('cwd', os.getcwd()); "
             "print('bundles', [d for d, _, f in os.walk(sys.argv[1]) if 'manifest.json' in f])")
    row = host_row(tmp_path / "rows", "TEST-CWD", [sys.executable, "-c", probe, str(out)])
    run = rowgate("-q", "gate", row, "--repo", subject, "--out", out)
    assert run.code == 0, run.err
    bundle = Path(run.last)
    log = (bundle / "artifacts" / "host" / "command-0.log").read_text()
    assert f"cwd {subject}" in log
    assert "bundles []" in log
