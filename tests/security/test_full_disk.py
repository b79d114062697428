"""A full disk is one line, exit 4, and nothing half-written.

The disk is a real tmpfs of a few hundred KiB or MiB mounted for the test (the kernel's
own ENOSPC, no mock), under --out, --reviews, the merge record, a report page and the
build cache. After each failure the filesystem holds exactly what it held before.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.review_support import World
from tests.security._support import (
    UNCONFINED,
    Run,
    assert_one_line,
    cli,
    fill,
    host_row,
    make_subject,
    snapshot,
    subject_state,
)

FULL = r".*No space left on device.*"
STORAGE = 4


@pytest.fixture
def world(tmp_path, monkeypatch, capsys):
    world = World(tmp_path, monkeypatch, capsys)
    yield world
    world.close()


def files_of(root: Path) -> dict[str, tuple]:
    """A snapshot of the files under root (directories rowgate made and emptied again do
    not count: there is nothing half-written in an empty directory)."""
    return {k: v for k, v in snapshot(root).items() if v[0] != 0o040000}


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() or p.is_symlink())


def test_gate_into_a_full_out_is_one_line_and_leaves_nothing(tmp_path, capsys, tmpfs):
    out = tmpfs("out", 1 << 20)
    subject = make_subject(tmp_path / "subject")
    row = host_row(tmp_path / "rows", "TEST-FULL",
                   [sys.executable, "-c", "print('x' * (3 << 20))"])
    run = cli(capsys, "-q", "gate", row, "--repo", subject, "--out", out)
    assert_one_line(run, STORAGE, FULL)
    assert _files(out) == [], "a full disk left files behind"
    assert not [p for p in out.rglob(".*")], "a full disk left staging behind"


def test_a_seal_that_does_not_fit_is_one_line_and_leaves_nothing(tmp_path, capsys, tmpfs):
    """The artifacts fit; the seal's own files (results, manifest, signature) do not."""
    out = tmpfs("out", 4 << 20)
    subject = make_subject(tmp_path / "subject")
    script = tmp_path / "fill.py"
    # leave 6 KiB once the command's log is written: the seal's own files need more
    script.write_text(
        "import os, sys\nst = os.statvfs(sys.argv[1])\n"
        "free = st.f_bavail * st.f_frsize\nsys.stdout.write('x' * max(0, free - (6 << 10)))\n")
    row = host_row(tmp_path / "rows", "TEST-FULL", [sys.executable, str(script), str(out)],
                   extra=UNCONFINED)
    run = cli(capsys, "-q", "gate", row, "--repo", subject, "--out", out)
    assert_one_line(run, STORAGE, FULL)
    assert _files(out) == []


def test_review_into_a_full_reviews_dir_leaves_no_temp_file(world, tmpfs):
    reviews = tmpfs("reviews", 256 << 10)
    row = world.row()
    bundle = world.gate(row)
    fill(reviews)
    before = files_of(reviews)
    world.as_reviewer()
    code, out, err = world.cli("review", bundle, "--repo", world.repo_dir, "--row", row,
                               "--reviews", reviews, "--key", world.gate_pub)
    assert_one_line(Run(code, "\n".join(out), err), STORAGE, FULL)
    assert files_of(reviews) == before


def test_attestation_into_a_full_reviews_dir_leaves_nothing(world, tmpfs):
    reviews = tmpfs("reviews", 512 << 10)
    row = world.row(attestation=True)
    bundle = world.gate(row)
    world.reviews = reviews
    code, out, err = world.review(bundle, row)
    assert code == 0, (out, err)
    review = Path(out[-1])
    fill(reviews)
    before = files_of(reviews)
    world.as_gate()
    code, out, err = world.cli("attest-operator", review)
    assert_one_line(Run(code, "\n".join(out), err), STORAGE, FULL)
    assert files_of(reviews) == before


def test_a_merge_whose_record_cannot_be_written_is_never_made(world, tmpfs):
    """Before: the merge commit landed on main, then writing its record failed."""
    reviews = tmpfs("reviews", 512 << 10)
    world.reviews = reviews
    row = world.row()
    bundle = world.gate(row)
    code, out, err = world.review(bundle, row)
    assert code == 0, (out, err)
    fill(reviews)
    before = files_of(reviews)
    repo_before = subject_state(world.repo_dir)
    main_before = world.repo.heads.main.commit.hexsha
    branch_before = world.repo.active_branch.name
    code, out, err = world.merge(row)
    assert_one_line(Run(code, "\n".join(out), err), STORAGE, FULL)
    assert world.repo.heads.main.commit.hexsha == main_before, "an unrecorded merge"
    assert world.repo.active_branch.name == branch_before
    assert subject_state(world.repo_dir) == repo_before
    assert files_of(reviews) == before


def test_a_report_page_on_a_full_disk_is_one_line_and_no_partial_page(world, tmpfs):
    pages = tmpfs("pages", 128 << 10)
    row = world.row()
    bundle = world.gate(row)
    fill(pages, leave=4096)
    before = files_of(pages)
    world.as_gate()
    code, out, err = world.cli("report", bundle, "--html", pages / "page.html", "--key",
                               world.gate_pub)
    assert_one_line(Run(code, "\n".join(out), err), STORAGE, FULL)
    assert files_of(pages) == before


@pytest.mark.slow
def test_a_build_whose_cache_is_full_is_one_line(tmp_path, capsys, tmpfs, monkeypatch):
    cache = tmpfs("cache", 256 << 10)
    monkeypatch.setenv("ROWGATE_CACHE_DIR", str(cache))
    subject = make_subject(tmp_path / "subject")
    before = subject_state(subject)
    fill(cache, leave=8192)
    snap = files_of(cache)
    run = cli(capsys, "-q", "build", "--arch", "sm_70", "--repo", subject)
    assert_one_line(run, STORAGE, FULL)
    assert files_of(cache) == snap
    assert subject_state(subject) == before
    assert os.statvfs(cache).f_bavail * os.statvfs(cache).f_frsize <= 8192 + 4096
