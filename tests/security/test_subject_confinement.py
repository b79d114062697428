"""What a subject's kernels/kernels.toml names stays inside the subject.

Every attack is a real subject repository (symlinks committed as git stores them), driven
through `rowgate build` (exit 2, one line naming the file and the key) and, for the ones
that reach evidence, through `rowgate gate` (the build gate is ERROR with that line, the
bundle still verifies). A sentinel directory sits exactly where each attack aims: it must
come through byte for byte, mtimes and modes included, and the subject tree too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.security._support import (
    BUILD_GATE,
    CLEAN_TOML,
    FIXTURE,
    HOST_GATE_OK,
    Link,
    Sentinel,
    assert_one_line,
    cli,
    make_subject,
    own_key,
    rowgate,
    snapshot,
    subject_state,
    tree_text,
    write_row,
)


def _toml(name: str = "k", source: str = "clean.cu", include_dirs: str = "") -> str:
    inc = f"include_dirs = {include_dirs}\n" if include_dirs else ""
    return (f'version = 1\n{inc}[kernels."{name}"]\nsource = "{source}"\n'
            f'entry_points = ["scale"]\narches = ["sm_70"]\n')


class Attack:
    """A subject made to reach `victim` (a sentinel dir beside it), and the refusal."""

    def __init__(self, tmp: Path, files: dict[str, object], toml: str | None = CLEAN_TOML):
        self.tmp = tmp
        self.victim = tmp / "victim"
        self.subject = make_subject(tmp / "subject", files, toml)
        self.manifest = self.subject / "kernels" / "kernels.toml"
        self.before = subject_state(self.subject)

    def refusal(self, key: str, phrase: str) -> str:
        where = re.escape(str(self.manifest))
        return rf"{where}: {key}: .*{phrase}.*" if key else rf"{where}: .*{phrase}.*"

    def assert_subject_untouched(self) -> None:
        assert subject_state(self.subject) == self.before, "rowgate wrote into the subject"


@pytest.fixture
def victim(tmp_path) -> Sentinel:
    """A sentinel directory at tmp/victim, beside the subject: what every attack aims at."""
    return Sentinel(tmp_path / "victim")


@pytest.fixture
def strays(tmp_path):
    """Paths outside tmp_path that main's build wrote into while being attacked (its cache
    followed `..` in a kernel name): removed after the test so the defect leaves no litter."""
    roots = [tmp_path.parent.parent, tmp_path.parent]
    before = {r: set(os.listdir(r)) for r in roots}
    yield
    for root in roots:
        for name in set(os.listdir(root)) - before[root]:
            shutil.rmtree(root / name, ignore_errors=True)


def _victim_abs(tmp: Path, rel: str) -> str:
    return str(tmp / "victim" / rel)


# Each case: (id, files in the subject, kernels.toml text, refused key, refusal phrase).
# `V:` in a string is replaced by the victim's absolute path.
NAME = "not a valid kernel name"
OUTSIDE = "outside the subject"
NOT_REGULAR = "not a regular file"
SOURCE_CASES = [
    ("name-climbs-out", {}, _toml(name="../../../../../victim"), r"kernels\..*", NAME),
    ("name-absolute", {}, _toml(name="V:"), r"kernels\..*", NAME),
    ("name-dotdot", {}, _toml(name=".."), r"kernels\..*", NAME),
    ("name-empty", {}, _toml(name=""), r"kernels\..*", NAME),
    ("name-slash", {}, _toml(name="a/b"), r"kernels\..*", NAME),
    ("name-nul", {}, _toml(name="k\\u0000"), r"kernels\..*", NAME),
    ("name-division-slash", {}, _toml(name="..\u2215victim"), r"kernels\..*", NAME),
    ("name-fullwidth", {}, _toml(name="\uff4b"), r"kernels\..*", NAME),
    ("name-rtl-override", {}, _toml(name="k\u202egpj"), r"kernels\..*", NAME),
    ("name-too-long", {}, _toml(name="k" * 300), r"kernels\..*", NAME),
    ("names-differ-by-case", {}, _toml(name="k") + _toml(name="K").replace("version = 1\n", ""),
     r"kernels\.K", "only by case"),
    ("source-climbs-out", {}, _toml(source="../../victim/secret.cu"), r"kernels\.k\.source",
     OUTSIDE),
    ("source-absolute", {}, _toml(source="V:/secret.cu"), r"kernels\.k\.source", OUTSIDE),
    ("source-symlink-out", {"kernels/link.cu": Link("V:/secret.cu")}, _toml(source="link.cu"),
     r"kernels\.k\.source", OUTSIDE),
    ("source-nested-symlinks", {"kernels/a.cu": Link("b.cu"), "kernels/b.cu": Link("c/d.cu"),
                                "kernels/c/d.cu": Link("../../../victim/secret.cu")},
     _toml(source="a.cu"), r"kernels\.k\.source", OUTSIDE),
    ("symlinked-dir-in-kernels", {"kernels/ext": Link("V:")}, _toml(source="ext/secret.cu"),
     r"kernels\.k\.source", OUTSIDE),
    ("dotdot-after-normalisation", {"kernels/deep": Link("V:/sub")},
     _toml(source="deep/../secret.cu"), r"kernels\.k\.source", OUTSIDE),
    ("source-is-a-directory", {"kernels/dir.cu/x": ""}, _toml(source="dir.cu"),
     r"kernels\.k\.source", NOT_REGULAR),
    ("source-control-character", {}, _toml(source="clean\\u0000.cu"), r"kernels\.k\.source",
     "control character"),
    ("include-dir-climbs-out", {"kernels/clean.cu": FIXTURE}, _toml(include_dirs='["../../victim"]'),
     r"include_dirs\[0\]", OUTSIDE),
    ("include-dir-symlink-out", {"kernels/clean.cu": FIXTURE, "kernels/include": Link("V:")},
     _toml(), r"include_dirs\[0\]", OUTSIDE),
    ("header-in-include-symlink-out", {"kernels/clean.cu": FIXTURE,
                                       "kernels/include/evil.cuh": Link("V:/secret.cu")},
     _toml(), r"include_dirs\[0\]", OUTSIDE),
    ("header-beside-source-symlink-out", {"kernels/clean.cu": FIXTURE, "kernels/include/.keep": "",
                                          "kernels/side.cuh": Link("V:/secret.cu")},
     _toml(), r"kernels\.k\.source", OUTSIDE),
]


def _resolve(value, tmp: Path):
    if isinstance(value, Link):
        return Link(value.target.replace("V:", _victim_abs(tmp, "").rstrip("/")))
    if isinstance(value, str):
        return value.replace("V:", _victim_abs(tmp, "").rstrip("/"))
    return value


def _attack(tmp: Path, files: dict, toml: str) -> Attack:
    files = {k: _resolve(v, tmp) for k, v in files.items()}
    if not any(k == "kernels/include" or k.startswith("kernels/include/") for k in files):
        files["kernels/include/.keep"] = ""
    if not any(k.endswith("clean.cu") for k in files):
        files["kernels/clean.cu"] = FIXTURE
    return Attack(tmp, files, _resolve(toml, tmp))


@pytest.mark.parametrize(("files", "toml", "key", "phrase"),
                         [c[1:] for c in SOURCE_CASES], ids=[c[0] for c in SOURCE_CASES])
def test_rowgate_build_refuses_what_leaves_the_subject(tmp_path, capsys, victim, strays,
                                                       files, toml, key, phrase):
    attack = _attack(tmp_path, files, toml)
    run = cli(capsys, "-q", "build", "--arch", "sm_70", "--repo", attack.subject)
    assert_one_line(run, 2, attack.refusal(key, phrase))
    victim.assert_untouched()
    attack.assert_subject_untouched()


def test_kernels_toml_that_is_a_symlink_out_is_refused(tmp_path, capsys, victim, strays):
    """Case 3: kernels/kernels.toml itself points outside and names a real kernel there."""
    (tmp_path / "victim" / "kernels.toml").write_text(CLEAN_TOML.replace("clean.cu", "secret.cu"))
    victim.rebase()
    attack = Attack(tmp_path, {"kernels/clean.cu": FIXTURE, "kernels/include/.keep": "",
                               "kernels/kernels.toml": Link(str(tmp_path / "victim" / "kernels.toml"))})
    run = cli(capsys, "-q", "build", "--arch", "sm_70", "--repo", attack.subject)
    assert_one_line(run, 2, attack.refusal("", OUTSIDE))
    victim.assert_untouched()
    attack.assert_subject_untouched()


def test_kernels_dir_that_is_a_symlink_out_is_refused(tmp_path, capsys, victim, strays):
    shutil.copyfile(Path(__file__).parents[1] / "fixtures" / "kernels" / "clean.cu",
                    tmp_path / "victim" / "clean.cu")
    (tmp_path / "victim" / "kernels.toml").write_text(CLEAN_TOML)
    victim.rebase()
    attack = Attack(tmp_path, {"kernels": Link(str(tmp_path / "victim"))}, toml=None)
    run = cli(capsys, "-q", "build", "--arch", "sm_70", "--repo", attack.subject)
    assert_one_line(run, 2, attack.refusal("", OUTSIDE))
    victim.assert_untouched()
    attack.assert_subject_untouched()


def test_kernels_toml_that_is_a_fifo_is_refused_not_read(tmp_path, victim):
    attack = Attack(tmp_path, {"kernels/clean.cu": FIXTURE, "kernels/include/.keep": ""}, toml=None)
    os.mkfifo(attack.manifest)  # untracked, in the working tree the build reads
    attack.before = subject_state(attack.subject)
    run = rowgate("-q", "build", "--arch", "sm_70", "--repo", attack.subject, timeout=60)
    assert_one_line(run, 2, attack.refusal("", NOT_REGULAR))
    attack.assert_subject_untouched()


def test_a_fifo_header_is_refused_not_compiled(tmp_path, victim):
    """nvcc would block reading it; the confinement refuses it before any compiler runs."""
    attack = Attack(tmp_path, {"kernels/clean.cu": FIXTURE, "kernels/include/.keep": ""})
    os.mkfifo(attack.subject / "kernels" / "include" / "pipe.cuh")
    attack.before = subject_state(attack.subject)
    run = rowgate("-q", "build", "--arch", "sm_70", "--repo", attack.subject, timeout=120)
    assert_one_line(run, 2, attack.refusal(r"include_dirs\[0\]", NOT_REGULAR))
    attack.assert_subject_untouched()


def test_a_header_with_a_non_utf8_name_is_refused(tmp_path, capsys, victim):
    attack = Attack(tmp_path, {"kernels/clean.cu": FIXTURE, "kernels/include/.keep": ""})
    bad = os.fsencode(attack.subject / "kernels" / "include") + b"/bad-\xff.cuh"
    with open(bad, "wb") as f:
        f.write(b"// a header\n")
    attack.before = subject_state(attack.subject)
    run = cli(capsys, "-q", "build", "--arch", "sm_70", "--repo", attack.subject)
    assert_one_line(run, 2, attack.refusal(r"include_dirs\[0\]", "not UTF-8"))
    attack.assert_subject_untouched()


def test_build_without_kernels_toml_is_one_line_and_leaves_nothing(tmp_path, capsys):
    """Case 15 (last part): no kernels.toml, no build/ left behind."""
    subject = make_subject(tmp_path / "subject", {"README2.md": "x\n"}, toml=None)
    before = subject_state(subject)
    run = cli(capsys, "-q", "build", "--arch", "sm_70", "--repo", subject)
    where = re.escape(str(subject / "kernels" / "kernels.toml"))
    assert_one_line(run, 2, rf"{where}: cannot read: No such file or directory")
    assert subject_state(subject) == before


# ------------------------------------------------------------ the same through a gate


def _gate_attack(tmp_path: Path, capsys, attack: Attack, key: str, phrase: str, out: Path,
                 signer: Path | None = None):
    """`signer`: the public key the gate signs with, when a test sets ROWGATE_SIGNING_KEY."""
    row = write_row(tmp_path / "rows", "TEST-CONFINE", HOST_GATE_OK + BUILD_GATE)
    run = cli(capsys, "-q", "gate", row, "--repo", attack.subject, "--out", out)
    assert "Traceback" not in run.err, run.err
    assert run.code == 1, (run.out, run.err)
    bundle = Path(run.last)
    verify_key = ("--key", signer) if signer is not None else own_key()
    assert cli(capsys, "verify", bundle, *verify_key).code == 0

    build = json.loads((bundle / "gates" / "build.json").read_text())
    assert build["status"] == "ERROR"
    assert re.fullmatch(attack.refusal(key, phrase), build["reason"]), build["reason"]
    attack.assert_subject_untouched()
    return bundle


def test_gate_kernel_name_cannot_replace_an_earlier_bundle(tmp_path, capsys, strays):
    """Case 1 (second half): a name that climbs from the build's artifacts to a sealed bundle."""
    out = tmp_path / "evidence"
    honest = make_subject(tmp_path / "honest")
    row = write_row(tmp_path / "rows", "TEST-CONFINE", HOST_GATE_OK)
    first = cli(capsys, "-q", "gate", row, "--repo", honest, "--out", out)
    assert first.code == 0, first.err
    earlier = Path(first.last)
    sealed_before = snapshot(earlier)
    name = f"../../../../../{earlier.name}"
    attack = _attack(tmp_path, {}, _toml(name=name))
    _gate_attack(tmp_path, capsys, attack, r"kernels\..*", NAME, out)
    assert snapshot(earlier) == sealed_before
    assert cli(capsys, "verify", earlier, *own_key()).code == 0


@pytest.mark.slow
def test_gate_source_pointing_at_the_signing_key_never_reaches_the_bundle(tmp_path, capsys,
                                                                          keys, monkeypatch):
    """Case 2: the compiler would quote the operator's key into the sealed nvcc/nvrtc log."""
    monkeypatch.setenv("ROWGATE_SIGNING_KEY", str(keys.private))
    attack = _attack(tmp_path, {"kernels/key.cu": Link(str(keys.private))}, _toml(source="key.cu"))
    bundle = _gate_attack(tmp_path, capsys, attack, r"kernels\.k\.source", OUTSIDE,
                          tmp_path / "evidence", signer=keys.public)
    body = keys.private.read_text().splitlines()[1]
    assert body not in tree_text(tmp_path / "evidence")
    assert body not in tree_text(Path(os.environ["ROWGATE_CACHE_DIR"]))
    assert "PRIVATE KEY" not in tree_text(bundle)


def test_gate_kernels_toml_symlink_out_is_an_error_naming_it(tmp_path, capsys, victim, strays):
    (tmp_path / "victim" / "kernels.toml").write_text(CLEAN_TOML.replace("clean.cu", "secret.cu"))
    victim.rebase()
    attack = Attack(tmp_path, {"kernels/clean.cu": FIXTURE, "kernels/include/.keep": "",
                               "kernels/kernels.toml": Link(str(tmp_path / "victim" / "kernels.toml"))})
    _gate_attack(tmp_path, capsys, attack, "", OUTSIDE, tmp_path / "evidence")
    victim.assert_untouched()


# ------------------------------------------------------- what stays inside still builds


@pytest.mark.slow
@pytest.mark.parametrize(("files", "source"), [
    ({"kernels/alias.cu": Link("clean.cu")}, "alias.cu"),
    ({"csrc/clean.cu": FIXTURE}, "../csrc/clean.cu"),
    ({"kernels/sub/x.cu": Link("../clean.cu")}, "sub/x.cu"),
], ids=["symlink-inside", "outside-kernels-inside-repo", "relative-symlink-inside"])
def test_paths_that_resolve_inside_the_subject_build(tmp_path, capsys, files, source):
    attack = _attack(tmp_path, files, _toml(source=source))
    run = cli(capsys, "-q", "build", "--arch", "sm_70", "--repo", attack.subject)
    assert run.code == 0, run.out + run.err
    assert "build: PASS" in run.out
    attack.assert_subject_untouched()


@pytest.mark.slow
def test_build_from_inside_the_subject_twice_leaves_it_as_it_was(tmp_path, capsys):
    """rowgate build from inside the subject, twice: the subject stays as it was."""
    subject = make_subject(tmp_path / "subject")
    before = subject_state(subject)
    for _ in range(2):
        run = cli(capsys, "-q", "build", "--arch", "sm_70", cwd=subject)
        assert run.code in (0, 1), run.err  # the verdict is the build's; the tree is ours
    assert subject_state(subject) == before
    assert not subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=subject,
                              capture_output=True, text=True, check=True).stdout
