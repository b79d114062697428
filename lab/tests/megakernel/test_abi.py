"""Descriptor packing: round trips, and the layout equals the C header's, checked by
compiling the header with the machine's g++ (host C++, `-x c++`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap

import numpy as np
import pytest

from rowgate_lab.megakernel import abi
from rowgate_lab.megakernel.abi import NO_COUNTER, Opcode, Operand, StepShape, Task

GXX = shutil.which("g++")
needs_gxx = pytest.mark.skipif(GXX is None, reason="needs the machine's g++ to compile the header")

TASK_FIELDS = ["opcode", "flags", "signal", "wait_counter", "wait_value", "buffer", "offset",
               "tile", "reserved"]

PROGRAM = textwrap.dedent(r"""
    #include <cstddef>
    #include <cstdio>
    #include <cstring>
    #include "task_abi.cuh"
    using namespace rowgate::task;

    #define FIELD(T, f) std::printf("\"%s\": [%zu, %zu],", #f, offsetof(T, f), sizeof(((T*)0)->f))

    int main(int argc, char** argv) {
      std::printf("{\"task\": {");
      FIELD(TaskDesc, opcode); FIELD(TaskDesc, flags); FIELD(TaskDesc, signal);
      FIELD(TaskDesc, wait_counter); FIELD(TaskDesc, wait_value); FIELD(TaskDesc, buffer);
      FIELD(TaskDesc, offset); FIELD(TaskDesc, tile); FIELD(TaskDesc, reserved);
      std::printf("\"size\": [0, %zu]}, \"shape\": {", sizeof(TaskDesc));
    %SHAPE_FIELDS%
      std::printf("\"size\": [0, %zu]}, \"version\": %u, \"opcodes\": %d, \"no_counter\": %u, "
                  "\"flags\": %u, \"stage\": %u, \"scratch\": %u, \"min_even_chunk\": %u}",
                  sizeof(StepShape), kAbiVersion, static_cast<int>(kOpcodeCount), kNoCounter,
                  static_cast<unsigned>(kKnownFlags), kStageBytes, kScratchBytes, kMinEvenChunk);
      // A descriptor with every field distinct, written as raw bytes for the round trip.
      TaskDesc t{};
      t.opcode = kAttnSplit; t.flags = kFlagRopeIn; t.signal = 0x01020304u;
      t.wait_counter[0] = 7; t.wait_value[0] = 9; t.wait_counter[1] = 8; t.wait_value[1] = 10;
      t.wait_counter[2] = kNoCounter; t.wait_value[2] = 0;
      for (int i = 0; i < kOperands; ++i) { t.buffer[i] = 100 + i; t.offset[i] = 0x10000 * i + 3; }
      for (int i = 0; i < kTileWords; ++i) t.tile[i] = 0xa0000000u + i;
      std::FILE* f = std::fopen(argv[argc - 1], "wb");
      std::fwrite(&t, sizeof t, 1, f);
      std::fclose(f);
      return 0;
    }
""")


@pytest.fixture(scope="module")
def header_layout(tmp_path_factory):
    if GXX is None:
        pytest.skip("needs g++")
    d = tmp_path_factory.mktemp("layout")
    shape_fields = "\n".join(f"  FIELD(StepShape, {f});" for f in abi.SHAPE_FIELDS)
    (d / "layout.cpp").write_text(PROGRAM.replace("%SHAPE_FIELDS%", shape_fields))
    subprocess.run([GXX, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-x", "c++",
                    f"-I{abi.HEADER.parent}", str(d / "layout.cpp"), "-o", str(d / "layout")],
                   check=True, capture_output=True, text=True)
    out = subprocess.run([str(d / "layout"), str(d / "task.bin")], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out), (d / "task.bin").read_bytes()


def _offsets(dtype: np.dtype) -> dict[str, list[int]]:
    return {name: [off, sub.itemsize] for name, (sub, off) in dtype.fields.items()}


@needs_gxx
def test_task_layout_matches_the_header(header_layout):
    c, _ = header_layout
    assert c["task"].pop("size") == [0, abi.TASK_BYTES]
    assert c["task"] == _offsets(abi.TASK_DTYPE)
    assert abi.TASK_DTYPE.itemsize == abi.TASK_BYTES


@needs_gxx
def test_shape_layout_matches_the_header(header_layout):
    c, _ = header_layout
    assert c["shape"].pop("size") == [0, abi.SHAPE_BYTES]
    assert c["shape"] == _offsets(abi.SHAPE_DTYPE)


@needs_gxx
def test_constants_match_the_header(header_layout):
    c, _ = header_layout
    assert c["version"] == abi.ABI_VERSION
    assert c["opcodes"] == len(Opcode)
    assert c["no_counter"] == NO_COUNTER
    assert c["flags"] == int(sum(abi.Flag))
    assert (c["stage"], c["scratch"]) == (abi.STAGE_BYTES, abi.SCRATCH_BYTES)
    assert c["min_even_chunk"] == abi.MIN_EVEN_CHUNK  # even_chunk's floor, host and device


@needs_gxx
def test_bytes_written_by_cxx_decode_and_re_encode_identically(header_layout):
    _, raw = header_layout
    (t,) = abi.unpack(raw)
    assert t.opcode == Opcode.ATTN_SPLIT and t.flags == abi.Flag.ROPE_IN
    assert t.signal == 0x01020304 and t.waits == ((7, 9), (8, 10))
    assert t.operands == tuple(Operand(100 + i, 0x10000 * i + 3) for i in range(abi.OPERANDS))
    assert t.tile == tuple(0xA0000000 + i for i in range(abi.TILE_WORDS))
    assert abi.pack([t]) == raw


def test_pack_unpack_round_trip():
    tasks = [Task(Opcode.GEMV, (0, 16, 2048, 4096, 2048, 8192),
                  (Operand(3, 0), Operand(200, 16), Operand(200, 64), Operand(4, 0)),
                  ((5, 12), (6, 1), (7, 2)), 6, int(abi.Flag.NORM_IN)),
             Task(Opcode.NOP),
             Task(Opcode.RESIDUAL_ADD, (256, 256, 2048, 0), (Operand(1, 2), Operand(1, 3)),
                  ((1, 2), (3, 4)), NO_COUNTER)]
    data = abi.pack(tasks)
    assert len(data) == 3 * abi.TASK_BYTES
    assert abi.unpack(data) == tasks


def test_shape_round_trip():
    s = StepShape(batch=4, hidden=2048, num_heads=16, num_kv_heads=8, head_dim=128,
                  intermediate=6144, vocab=151936, page_size=16, table_width=256, max_splits=5,
                  rms_eps=1e-6, softmax_scale=0.125, meta_buffer=213, ids_at=0, positions_at=4,
                  slots_at=8, context_lens_at=12, block_tables_at=16)
    back = abi.unpack_shape(abi.pack_shape(s))
    assert back.batch == 4 and back.meta_buffer == 213 and back.block_tables_at == 16
    assert back.rms_eps == pytest.approx(1e-6, rel=1e-7) and back.softmax_scale == 0.125


def test_a_field_too_wide_is_refused_naming_the_task():
    with pytest.raises(abi.AbiError, match=r"task 1 \(big\)"):
        abi.pack([Task(Opcode.NOP), Task(Opcode.GEMV, (1 << 33, 0, 0, 0), label="big")])


def test_truncated_bytes_are_refused():
    with pytest.raises(abi.AbiError, match="not a multiple of 128"):
        abi.unpack(b"\0" * 129)


def test_reserved_words_must_be_zero():
    raw = bytearray(abi.pack([Task(Opcode.NOP), Task(Opcode.NOP)]))
    raw[abi.TASK_BYTES + 120] = 1
    with pytest.raises(abi.AbiError, match="task 1: reserved"):
        abi.unpack(bytes(raw))


def test_short_tiles_are_padded_and_too_many_waits_refused():
    assert Task(Opcode.GEMV, (1, 2, 3, 4)).tile == (1, 2, 3, 4, 0, 0, 0, 0)
    with pytest.raises(abi.AbiError, match="at most 3 waits"):
        abi.pack([Task(Opcode.NOP, waits=((0, 1),) * 4)])
