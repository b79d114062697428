"""`python -m rowgate.cuda._triton_aot sm_XX`: can the installed Triton compile ahead of
time for this arch? Prints one JSON object: {arch, triton, reachable, error, …}.

No GPU is needed: `triton.compile` with an explicit `GPUTarget` lowers through
Triton's own LLVM and its bundled ptxas. Run in its own process (with a private
TRITON_CACHE_DIR from the caller) so an answer is never a cache hit and a crash
in Triton's native code is an answer, not a dead gate.
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any


def _probe(arch: str) -> dict[str, Any]:
    answer: dict[str, Any] = {"arch": arch, "triton": None, "reachable": False, "error": None}
    try:
        import triton
        import triton.language as tl
        from triton.backends.compiler import GPUTarget
    except ImportError as exc:
        answer["error"] = f"triton is not installed: {exc}"
        return answer
    answer["triton"] = triton.__version__

    # Representative: masked loads/stores, a reduction and a dot-free softmax row,
    # the shapes decode kernels are made of.
    # Triton is untyped, and it reads a kernel's parameter annotations as
    # specialisation hints, so the pointer and size parameters stay unannotated.
    @triton.jit  # type: ignore[untyped-decorator]
    def softmax_row(x_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + row * n + offs, mask=mask, other=-float("inf"))
        e = tl.exp(x - tl.max(x, axis=0))
        tl.store(out_ptr + row * n + offs, e / tl.sum(e, axis=0), mask=mask)

    capability = int(arch.removeprefix("sm_").rstrip("a"))
    try:
        src = triton.compiler.ASTSource(
            fn=softmax_row, signature={"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
                                       "BLOCK": "constexpr"}, constexprs={"BLOCK": 1024})
        compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32))
    except Exception as exc:  # noqa: BLE001 - any compiler failure is the answer we record
        answer["error"] = f"{type(exc).__name__}: {exc}"
        return answer
    cubin = compiled.asm["cubin"]
    answer.update(reachable=True, cubin_sha256=hashlib.sha256(cubin).hexdigest(),
                  cubin_bytes=len(cubin), kernel="softmax_row")
    return answer


if __name__ == "__main__":
    print(json.dumps(_probe(sys.argv[1])))
