"""rowgate.confine on its own: the rule for what a subject names, on real trees."""

from __future__ import annotations

import os

import pytest

from rowgate import confine
from rowgate.errors import SubjectError


@pytest.fixture
def subject(tmp_path):
    root = tmp_path / "subject"
    (root / "k").mkdir(parents=True)
    (root / "k" / "a.cu").write_text("x")
    (tmp_path / "outside.cu").write_text("secret")
    os.symlink("a.cu", root / "k" / "inside.cu")
    os.symlink(tmp_path / "outside.cu", root / "k" / "out.cu")
    os.symlink(tmp_path, root / "k" / "up")
    return root


@pytest.mark.parametrize(("rel", "why"), [
    ("out.cu", "resolves outside the subject"), ("up/outside.cu", "resolves outside the subject"),
    ("../../outside.cu", "resolves outside the subject"), ("up/subject/k/../../outside.cu",
                                                           "resolves outside the subject"),
    ("missing.cu", "does not exist"), (".", "is a directory, not a regular file"),
    ("a\x00.cu", "control character"), ("a\udcff.cu", "not UTF-8"),
])
def test_what_leaves_the_subject_or_is_not_a_file_is_refused(subject, rel, why):
    with pytest.raises(SubjectError, match=f"^T: K: .*{why}"):
        confine.inside(subject, rel, "T", "K", base=subject / "k")


def test_links_that_stay_inside_resolve(subject):
    assert confine.inside(subject, "inside.cu", "T", "K", base=subject / "k") == \
        (subject / "k" / "a.cu").resolve()
    assert confine.inside(subject, "nope", "T", "K", missing_ok=True) is None


@pytest.mark.parametrize("name", ["", "..", "a/b", "k\x00", "\uff4b", "k" * 65, "-k"])
def test_names_that_cannot_be_a_path_component(name):
    with pytest.raises(SubjectError, match="not a valid kernel name"):
        confine.name(name, "T", "kernels.x")


def test_names_that_differ_only_by_case():
    with pytest.raises(SubjectError, match=r"^T: kernels\.K: differs from kernels\.k only by case"):
        confine.distinct_by_case(["k", "K"], "T", "kernels.")


def test_shown_makes_any_name_one_printable_line():
    assert confine.shown("bad-\udcff") == "bad-\\xff"
    assert confine.shown("k\u202e") == "k\\u202e"
    assert confine.shown("ok.cu") == "ok.cu"


def test_scan_lists_regular_files_and_names_what_cannot_be_sealed(tmp_path):
    d = tmp_path / "host"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "log.txt").write_text("x")
    os.symlink("sub", d / "link")
    os.mkfifo(d / "pipe")
    files, problems = confine.scan_artifacts(d, "artifacts/host")
    assert files == ["artifacts/host/sub/log.txt"]
    assert problems == ["artifacts/host/link: a symbolic link, not a regular file (not sealed)",
                        "artifacts/host/pipe: a FIFO, not a regular file (not sealed)"]
