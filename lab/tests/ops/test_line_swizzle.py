"""The deep candidate's whole-line layout (split_kv.cu's line_swz): a
bijection of each row's 16-byte chunks, and every 16-byte access of a quarter warp (the
copies' writes, the QK's K reads, the PV's V reads) in eight different bank groups.

The kernel's bitwise equality is proven on the GPU (the operator gates); this proves the
layout's bank arithmetic here, on the formulas the kernel states (read from its source, so
that a change there fails this test until the properties are shown again)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "kernels" / "decode_attention" / "split_kv.cu"


def line_swz(kv_bytes: int, row: int) -> int:
    q = (row >> 1) & 3
    if kv_bytes == 1:
        return (q << 1) ^ ((row & 1) << 2)
    return ((q & 1) | ((q >> 1) << 2)) ^ (row & 1)


def test_the_formulas_are_the_kernels() -> None:
    src = SOURCE.read_text()
    body = src[src.index("__device__ __forceinline__ int line_swz(int row)"):]
    body = body[:body.index("\n}\n")]
    returns = [re.sub(r"\s+", " ", r).strip() for r in re.findall(r"return ([^;]+);", body)]
    assert returns == ["(q << 1) ^ ((row & 1) << 2)", "((q & 1) | ((q >> 1) << 2)) ^ (row & 1)"]
    assert "const int q = (row >> 1) & 3;" in body


Swizzle = Callable[[int, int], int]


def _conflict_free(kv_bytes: int, accesses: list[tuple[int, int]],
                   swz: Swizzle = line_swz) -> bool:
    """A 16-byte-per-lane access is served in quarter warps of 8 lanes; 32 banks x 4 bytes
    are eight 16-byte groups, and a row is 128 (E5M2) or 256 (bf16) bytes."""
    def group(row: int, chunk: int) -> int:
        return (row * 128 * kv_bytes + 16 * (chunk ^ swz(kv_bytes, row))) // 16 % 8

    return all(len({group(*accesses[lane]) for lane in range(8 * q, 8 * q + 8)}) == 8
               for q in range(4))


@pytest.mark.parametrize("kv_bytes", [1, 2])
def test_each_row_is_a_permutation_of_its_chunks(kv_bytes: int) -> None:
    chunks = 8 * kv_bytes
    for row in range(16):
        assert sorted(c ^ line_swz(kv_bytes, row) for c in range(chunks)) == list(range(chunks))


@pytest.mark.parametrize("kv_bytes", [1, 2])
def test_copies_and_reads_of_a_quarter_warp_hit_eight_bank_groups(kv_bytes: int) -> None:
    chunks = 8 * kv_bytes                  # per row
    rows_per_copy = 32 // chunks           # E5M2 4, bf16 2
    ku = kv_bytes                          # a K half's chunks a lane (Mma::HB / 16)
    vu = kv_bytes                          # V chunks a lane (Mma::VD * bytes / 16)
    for i in range(16 // rows_per_copy):  # the copies: lane l row RPI i + l / CH, chunk l % CH
        assert _conflict_free(kv_bytes, [(rows_per_copy * i + lane // chunks, lane % chunks)
                                         for lane in range(32)])
    for nt in range(2):                    # QK: row nt 8 + grp, chunk h CH/2 + tig KU + u
        for h in range(2):
            for u in range(ku):
                assert _conflict_free(kv_bytes, [
                    (nt * 8 + (lane >> 2), h * chunks // 2 + (lane & 3) * ku + u)
                    for lane in range(32)])
    for r in range(4):                     # PV: row 2tig + r % 2 + r / 2 8, chunk grp VU + u
        for u in range(vu):
            assert _conflict_free(kv_bytes, [
                (2 * (lane & 3) + (r & 1) + (r >> 1) * 8, (lane >> 2) * vu + u)
                for lane in range(32)])


def test_an_unswizzled_layout_would_conflict() -> None:
    """The check can fail: without the swizzle the PV's reads are 4-way conflicted."""
    pv = [(2 * (lane & 3), lane >> 2) for lane in range(32)]
    assert _conflict_free(1, pv)
    assert not _conflict_free(1, pv, swz=lambda kv_bytes, row: 0)
