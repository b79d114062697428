"""Parse what ptxas and cuobjdump report, and hold it against kernels.toml budgets.

Pure functions over text: the audit gate's `derive` and the review run them on
the raw logs stored in a bundle.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rowgate import compressed
from rowgate.cuda.kernels import Budget, Kernel

_COMPILING = re.compile(r"^ptxas info\s*: Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPERTIES = re.compile(r"^ptxas info\s*: Function properties for (\S+)")
_FRAME = re.compile(r"^\s*(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"^ptxas info\s*: Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[(\d+)\]")
_LMEM = re.compile(r"(\d+) bytes lmem")
_BARRIERS = re.compile(r"used (\d+) barriers")
_PTXAS_REPORT = re.compile(r"^(ptxas info\s*:|\s+\d+ bytes stack frame,)")

NVRTC_SM70_NOTICE = ("nvrtc: warning: Architectures prior to '<compute/sm>_75' are deprecated "
                     "and may be removed in a future release")
"""NVRTC 12.8 prints this fixed line for every sm_70 compile; it is the one
diagnostic the build gate ignores (NVRTC has no -Werror and no way to mute it)."""


@dataclass
class PtxasFunction:
    """One entry function as `ptxas -v` reports it."""

    name: str
    arch: str
    registers: int | None = None
    stack_frame: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    shared: int = 0
    local: int = 0
    barriers: int | None = None
    cmem: dict[int, int] = field(default_factory=dict)


def parse_ptxas(text: str) -> dict[str, PtxasFunction]:
    """Entry functions of a `ptxas -v` log (standalone or through nvcc -Xptxas -v)."""
    out: dict[str, PtxasFunction] = {}
    current: PtxasFunction | None = None
    for line in text.splitlines():
        if m := _COMPILING.match(line):
            current = out.setdefault(m.group(1), PtxasFunction(m.group(1), m.group(2)))
        elif m := _PROPERTIES.match(line):
            current = out.get(m.group(1), current)
        elif (m := _FRAME.match(line)) and current is not None:
            current.stack_frame, current.spill_stores, current.spill_loads = map(int, m.groups())
        elif (m := _USED.match(line)) and current is not None:
            current.registers = int(m.group(1))
            if s := _SMEM.search(line):
                current.shared = int(s.group(1))
            if s := _LMEM.search(line):
                current.local = int(s.group(1))
            if s := _BARRIERS.search(line):
                current.barriers = int(s.group(1))
            current.cmem = {int(bank): int(n) for n, bank in _CMEM.findall(line)}
    return out


def diagnostics(log: str, tool: str) -> list[str]:
    """Lines of a compiler log that are not the ptxas -v report: warnings and errors.

    Warnings are errors (-Werror everywhere; NVRTC, which has none, by this rule),
    so any such line fails the build. The fixed NVRTC sm_70 notice is skipped.
    """
    lines = []
    for line in log.splitlines():
        if not line.strip() or _PTXAS_REPORT.match(line):
            continue
        if tool == "nvrtc" and line.strip() == NVRTC_SM70_NOTICE:
            continue
        lines.append(line.rstrip())
    return lines


def parse_resource_usage(text: str) -> dict[str, dict[str, int]]:
    """`cuobjdump --dump-resource-usage`: {function: {REG, STACK, SHARED, LOCAL, …}}."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("Function ") and s.endswith(":"):
            current = out.setdefault(s[len("Function "):-1], {})
        elif current is not None and ":" in s and not s.endswith(":"):
            for item in s.split():
                key, _, value = item.partition(":")
                if value.isdigit():
                    current[key] = int(value)
            current = None
    return out


_SASS_FUNCTION = re.compile(r"^\s*Function : (\S+)")
_SASS_CODE_FOR = re.compile(r"^\s*code for (sm_\w+)")
_SASS_INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(\.[A-Z0-9_]+)*)")


@dataclass
class Sass:
    arches: list[str]
    """`code for sm_XX` headers: the arch the disassembler read from the image."""
    opcodes: dict[str, Counter[str]]
    """Per function: opcode family (text before the first dot) -> count."""


def parse_sass(text: str) -> Sass:
    arches: list[str] = []
    opcodes: dict[str, Counter[str]] = {}
    current: Counter[str] | None = None
    for line in text.splitlines():
        if m := _SASS_CODE_FOR.match(line):
            arches.append(m.group(1))
        elif m := _SASS_FUNCTION.match(line):
            current = opcodes.setdefault(m.group(1), Counter())
        elif (m := _SASS_INSN.match(line)) and current is not None:
            # `@!PT` never executes: sm_70 code starts with a dummy `@!PT SHFL`
            # that would otherwise satisfy a `require = ["SHFL"]` rule.
            if (m.group(1) or "").strip() == "@!PT":
                continue
            current[m.group(2).split(".")[0]] += 1
    return Sass(arches, opcodes)


def sha256_file(path: Path) -> str:
    """sha256 of a file's content (decompressed when it is sealed as `.gz`)."""
    return hashlib.sha256(compressed.read_bytes(path)).hexdigest()


@dataclass(frozen=True)
class Violation:
    kernel: str
    entry: str
    arch: str
    what: str
    measured: int | str
    budget: int | str

    def __str__(self) -> str:
        return (f"{self.kernel}/{self.entry} {self.arch}: {self.what} {self.measured} "
                f"exceeds budget {self.budget}" if isinstance(self.measured, int)
                else f"{self.kernel}/{self.entry} {self.arch}: {self.what}: {self.measured} "
                     f"(rule: {self.budget})")


def check_budget(kernel_name: str, entry: str, arch: str, budget: Budget,
                 ptxas: PtxasFunction | None, usage: dict[str, int] | None) -> list[Violation]:
    """Every budget key against ptxas' report and cuobjdump's resource usage."""
    def v(what: str, measured: int, limit: int) -> Violation:
        return Violation(kernel_name, entry, arch, what, measured, limit)

    if ptxas is None:
        return [Violation(kernel_name, entry, arch, "ptxas report", "entry point missing",
                          "every entry point is compiled")]
    out = []
    regs = max(ptxas.registers or 0, (usage or {}).get("REG", 0))
    checks = [("registers", regs, budget.max_registers),
              ("spill stores (bytes)", ptxas.spill_stores or 0, budget.max_spill_stores),
              ("spill loads (bytes)", ptxas.spill_loads or 0, budget.max_spill_loads),
              ("stack frame (bytes)", max(ptxas.stack_frame or 0, (usage or {}).get("STACK", 0)),
               budget.max_stack_bytes),
              ("local memory (bytes)", max(ptxas.local, (usage or {}).get("LOCAL", 0)),
               budget.max_local_bytes),
              ("static shared memory (bytes)", ptxas.shared, budget.max_static_shared_bytes)]
    for what, measured, limit in checks:
        if limit is not None and measured > limit:
            out.append(v(what, measured, limit))
    return out


def check_sass(kernel_name: str, kernel: Kernel, entry: str, arch: str,
               opcodes: Counter[str] | None, shown: str = "") -> list[Violation]:
    """`entry`: the symbol; `shown`: its demangled name (a rule may name either)."""
    shown = shown or entry
    if opcodes is None:
        return [Violation(kernel_name, shown, arch, "SASS", "function missing from the dump",
                          "every entry point is disassembled")]
    out = []
    for rule in kernel.rules(entry, arch, shown):
        for family in rule.forbid:
            if opcodes.get(family):
                out.append(Violation(kernel_name, shown, arch, f"SASS forbids {family}",
                                     f"{opcodes[family]} {family} instruction(s)",
                                     f"forbid {family}"))
        for family in rule.require:
            if not opcodes.get(family):
                out.append(Violation(kernel_name, shown, arch, f"SASS requires {family}",
                                     f"no {family} instruction", f"require {family}"))
    return out
