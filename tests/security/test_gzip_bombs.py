"""A sealed `.gz` artifact is untrusted input: a few kilobytes of deflate that inflate to
gigabytes must stop at `compressed.INFLATE_LIMIT` with one line naming the file, and every
artifact reader turns that into its own one-line error (a gate's derive: ERROR naming the
artifact, so the review REJECTs instead of exhausting memory)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from rowgate import compressed
from rowgate.gates.artifacts import read_json, read_jsonl
from rowgate.gates.interface import GateError

LIMIT = 1 << 20
CHUNK = 1 << 16


def _bomb(path: Path, inflated: int) -> Path:
    """About `inflated` bytes of one JSON document, gzipped in 64 KiB writes (a real bomb's
    ratio: ~1000:1 for a run of one byte)."""
    with gzip.GzipFile(path, "wb", compresslevel=9, mtime=0) as f:
        f.write(b'{"a": "')
        chunk = b"x" * CHUNK
        for _ in range(inflated // len(chunk)):
            f.write(chunk)
        f.write(b'"}\n')
    return path


@pytest.fixture
def small_limit(monkeypatch):
    monkeypatch.setattr(compressed, "INFLATE_LIMIT", LIMIT)


def test_a_gzip_that_inflates_past_the_limit_is_refused_naming_it(tmp_path, small_limit):
    bomb = _bomb(tmp_path / "analysis.json.gz", 4 * LIMIT)
    assert bomb.stat().st_size < LIMIT // 64  # what a bundle carries
    with pytest.raises(OSError, match=rf"^analysis\.json\.gz: inflates past {LIMIT} bytes"):
        compressed.read_bytes(bomb)
    # a caller with its own limit still gets limit + 1 bytes to see it is over
    assert len(compressed.read_bytes(bomb, limit=100)) == 101


def test_a_gzip_within_the_limit_reads_whole(tmp_path, small_limit):
    ok = _bomb(tmp_path / "ok.json.gz", LIMIT // 2)
    assert len(compressed.read_bytes(ok)) == LIMIT // 2 + 10


def test_a_plain_artifact_is_not_capped(tmp_path, small_limit):
    plain = tmp_path / "plain.json"
    plain.write_bytes(b"[" + b" " * (2 * LIMIT) + b"]")
    assert len(compressed.read_bytes(plain)) == 2 * LIMIT + 2  # its bytes are on disk


@pytest.mark.parametrize("reader", [read_json, read_jsonl])
def test_a_gate_artifact_that_is_a_bomb_is_one_gate_error(tmp_path, small_limit, reader):
    bomb = _bomb(tmp_path / "cases.json.gz", 3 * LIMIT)
    with pytest.raises(GateError) as err:
        reader(bomb)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"artifact cases.json.gz unreadable in {tmp_path}")
    assert f"inflates past {LIMIT} bytes" in msg


def test_the_limit_is_far_above_what_rowgate_seals():
    # the largest artifact of the checked-in bundles inflates to 22 MB (a SASS dump)
    biggest = 0
    for path in (Path(__file__).resolve().parents[2] / "docs" / "evidence").rglob("*.gz"):
        biggest = max(biggest, len(compressed.read_bytes(path)))
    assert 0 < biggest < compressed.INFLATE_LIMIT // 8
