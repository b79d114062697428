"""Entry points as a project declares them, resolved against the symbols a build has.

A kernels.toml entry point is either a symbol (an `extern "C"` name, or a mangled one;
a plain name no symbol has matches the C++ functions of that name, every overload) or a
C++ pattern over demangled names: `gelu_forward_kernel2<*>` matches every
instantiation of the template the project's own code made, `*::decode<float, 128>` a
member of a namespace. A pattern is matched (fnmatch) against each symbol's demangled
name without its return type and parameter list, and against the whole demangled
signature; every symbol it matches is an entry point, recorded by its mangled name and
shown by its demangled one. A declaration nothing matches is named with the names the
build does have.

Demangling is binutils' `c++filt`, run in the sandbox like every other tool that reads
the subject's output (a symbol name is the subject's text, and demanglers have had
crashes on crafted names).
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rowgate import sandbox

SYMBOL = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
DEMANGLE_TIMEOUT_S = 60.0
SHOWN = 8
"""Names a "missing" message lists (the rest are counted)."""


@dataclass(frozen=True)
class Entry:
    declared: str
    """As kernels.toml says it (a symbol or a pattern)."""
    symbol: str
    """The name in the build (mangled for C++)."""
    shown: str
    """The demangled name without return type and parameters (the symbol for C)."""


def is_pattern(entry: str) -> bool:
    """A C++ pattern (`name<*>`, `ns::name`), not a symbol."""
    return SYMBOL.fullmatch(entry) is None


def _depth_split(text: str) -> tuple[str, str]:
    """(before, parameter list) of a demangled signature: the last top-level `(...)`."""
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        c = text[i]
        if c in ")>":
            depth += 1
        elif c in "(<":
            depth -= 1
            if depth == 0 and c == "(":
                return text[:i], text[i:]
    return text, ""


def name_of(demangled: str) -> str:
    """`void gelu<__nv_bfloat16>(__nv_bfloat16*, int)` -> `gelu<__nv_bfloat16>`."""
    head, _ = _depth_split(demangled.strip())
    depth, start = 0, 0
    for i, c in enumerate(head):
        if c in "<(":
            depth += 1
        elif c in ">)":
            depth -= 1
        elif c == " " and depth == 0:
            start = i + 1  # a return type before the name
    return head[start:]


def demangle(symbols: Iterable[str]) -> dict[str, str]:
    """symbol -> demangled signature (a C symbol, or one c++filt cannot read: itself).
    Without c++filt every symbol maps to itself (patterns then match nothing, and say
    so)."""
    names = list(dict.fromkeys(symbols))
    mangled = [n for n in names if n.startswith("_Z")]
    out = {n: n for n in names}
    tool = shutil.which("c++filt")
    if not mangled or tool is None:
        return out
    with tempfile.TemporaryDirectory(prefix="rowgate-demangle-") as tmp:
        done = sandbox.run(sandbox.Step([tool], cwd=Path(tmp),
                                        limits=sandbox.Limits(wall_s=DEMANGLE_TIMEOUT_S)),
                           stdin="\n".join(mangled).encode() + b"\n")
    lines = done.stdout.decode(errors="replace").splitlines()
    if done.returncode == 0 and len(lines) == len(mangled):
        out.update(zip(mangled, lines))
    return out


def demangler_missing() -> str | None:
    return None if shutil.which("c++filt") else "no c++filt (binutils) on this machine"


def resolve(declared: Iterable[str], symbols: Iterable[str],
            demangled: dict[str, str]) -> tuple[list[Entry], list[str]]:
    """(entry points, declarations that matched nothing). A symbol declaration matches
    itself (or, being no symbol, the C++ functions of that name); a pattern matches every
    symbol whose demangled name (or signature) it fits."""
    have = list(dict.fromkeys(symbols))
    found: list[Entry] = []
    missing: list[str] = []
    for decl in declared:
        if not is_pattern(decl):
            # the symbol itself, else the C++ functions of that plain name (not
            # `extern "C"`: `gelu_forward_kernel2` is `_Z20gelu_forward_kernel2P…`)
            named = [decl] if decl in have else [
                s for s in have if s != decl and name_of(demangled.get(s, s)) == decl]
            if not named:
                missing.append(decl)
            found += [Entry(decl, s, name_of(demangled.get(s, s))) for s in named]
            continue
        hits = [s for s in have if fnmatch.fnmatchcase(name_of(demangled.get(s, s)), decl)
                or fnmatch.fnmatchcase(demangled.get(s, s), decl)]
        if not hits:
            missing.append(decl)
        found += [Entry(decl, s, name_of(demangled.get(s, s))) for s in hits]
    unique = list({e.symbol: e for e in found}.values())
    return unique, missing


def what_it_has(symbols: Iterable[str], demangled: dict[str, str]) -> str:
    """The build's names, demangled, for a message: `a, b, c (+N more)`."""
    names = sorted({name_of(demangled.get(s, s)) for s in symbols})
    more = f" (+{len(names) - SHOWN} more)" if len(names) > SHOWN else ""
    return (", ".join(names[:SHOWN]) + more) if names else "no entry points at all"
