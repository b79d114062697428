"""`python -m rowgate._triton_subject REQUEST.json`: compile one of a subject's Triton
kernels ahead of time for one arch. Prints one JSON object: {arch, triton, reachable,
error, kernel, cubin, ptx, …}; writes the cubin and the PTX into the request's `out`.

The subject's file is not imported: only its top-level `@triton.jit` functions are
taken, by their source text, into a module written in the work directory (with
`import triton` and `import triton.language as tl` above them), and that module is
imported. A decorator other than a bare `@triton.jit`/`@jit`, or a default value that
is not a literal, is refused: nothing else of the subject's file runs. Run in its own
process with a private TRITON_CACHE_DIR (the caller's), so an answer is never a cache
hit and a crash in Triton's native code is an answer, not a dead gate.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

HEADER = "import triton\nimport triton.language as tl\nfrom triton import jit\n\n\n"
MODULE = "subject_triton_kernels.py"


class Refused(ValueError):
    """The subject's file does not fit the extraction rule (one line)."""


def _is_jit(dec: ast.expr) -> bool:
    return (isinstance(dec, ast.Name) and dec.id == "jit") or (
        isinstance(dec, ast.Attribute) and dec.attr == "jit"
        and isinstance(dec.value, ast.Name) and dec.value.id == "triton")


def extract(text: str, where: str) -> str:
    """The module text holding the file's top-level @triton.jit functions only."""
    try:
        tree = ast.parse(text, filename=where)
    except SyntaxError as exc:
        raise Refused(f"{where}:{exc.lineno}: {exc.msg}") from None
    parts = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or not any(_is_jit(d) for d in node.decorator_list):
            continue
        if len(node.decorator_list) != 1:
            raise Refused(f"{where}:{node.lineno}: {node.name}: only a bare @triton.jit "
                          f"decorator is taken")
        defaults = node.args.defaults + [d for d in node.args.kw_defaults if d is not None]
        if any(not isinstance(d, ast.Constant) for d in defaults):
            raise Refused(f"{where}:{node.lineno}: {node.name}: default values must be literals")
        node.decorator_list = []
        parts.append("@triton.jit\n" + ast.unparse(node))
    if not parts:
        raise Refused(f"{where}: no top-level @triton.jit function")
    return HEADER + "\n\n\n".join(parts) + "\n"


def _compile(req: dict[str, Any], answer: dict[str, Any]) -> None:
    import triton
    from triton.backends.compiler import GPUTarget

    answer["triton"] = triton.__version__
    work = Path(req["out"])
    module_path = work / MODULE
    module_path.write_text(extract(Path(req["source_path"]).read_text(), req["source"]))
    spec = importlib.util.spec_from_file_location("subject_triton_kernels", module_path)
    if spec is None or spec.loader is None:
        raise Refused(f"{module_path}: cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, req["function"], None)
    if fn is None:
        raise Refused(f"{req['source']}: no @triton.jit function {req['function']!r}")
    capability = int(re.sub(r"\D", "", req["arch"]))
    src = triton.compiler.ASTSource(fn=fn, signature=req["signature"],
                                    constexprs=req["constants"])
    compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32),
                              options={"num_warps": req["num_warps"],
                                       "num_stages": req["num_stages"]})
    cubin, ptx = compiled.asm["cubin"], compiled.asm["ptx"]
    name = f"{req['name']}.{req['arch']}"
    (work / f"{name}.cubin").write_bytes(cubin)
    (work / f"{name}.ptx").write_text(ptx)
    target = re.search(r"^\.target\s+(\S+)", ptx, re.MULTILINE)
    answer.update(reachable=True, kernel=compiled.metadata.name, cubin=f"{name}.cubin",
                  ptx=f"{name}.ptx", cubin_sha256=hashlib.sha256(cubin).hexdigest(),
                  cubin_bytes=len(cubin), ptx_target=target.group(1) if target else None,
                  shared=compiled.metadata.shared, num_warps=compiled.metadata.num_warps)


def main(argv: list[str]) -> int:
    req = json.loads(Path(argv[0]).read_text())
    answer: dict[str, Any] = {"arch": req["arch"], "name": req["name"], "triton": None,
                    "reachable": False, "error": None}
    try:
        _compile(req, answer)
    except ImportError as exc:
        answer["error"] = f"triton is not installed: {exc}"
    except Refused as exc:
        answer.update(error=str(exc), refused=True)
    except Exception as exc:  # noqa: BLE001 - any compiler failure is the answer we record
        answer["error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
