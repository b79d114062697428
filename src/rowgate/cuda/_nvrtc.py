"""`python -m rowgate.cuda._nvrtc LIB SRC OUT.ptx [NVRTC options…]`: one NVRTC compile.

Run as its own process so the build records a command line anyone can re-run,
and so a crash in the driver-less NVRTC library cannot take rowgate down. Prints
NVRTC's program log verbatim; exits with NVRTC's result code.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path


def _check(lib: ctypes.CDLL, rc: int, what: str) -> None:
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        print(f"nvrtc: {what}: {lib.nvrtcGetErrorString(rc).decode()}", file=sys.stderr)
        sys.exit(rc)


def main(argv: list[str]) -> int:
    lib_path, src, out, *options = argv
    lib = ctypes.CDLL(lib_path)
    prog = ctypes.c_void_p()
    source = Path(src).read_bytes() + b"\0"
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source, Path(src).name.encode(),
                                       0, None, None), "create program")
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    rc: int = lib.nvrtcCompileProgram(prog, len(options), opts)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    sys.stdout.write(log.value.decode(errors="replace"))
    if rc == 0:
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        _check(lib, lib.nvrtcGetPTX(prog, ptx), "get PTX")
        Path(out).write_bytes(ptx.value)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
