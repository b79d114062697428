"""kernels/kernels.toml: what to build, for which arches, and the budgets to hold; in
format version 2 also the operators the kernels implement and the Triton kernels to
compile ahead of time (`rowgate.cuda.operators`).

The only place that file is parsed. The format is documented at its top and in
docs/build.md and docs/contracts.md; unknown keys are errors naming the file and the key. The file belongs to
the subject, so it is untrusted (docs/security.md): kernel names match a strict pattern
(they become directories), and the file itself, every source, include dir and header
the compiler may read through them resolves inside the subject and is a regular file
(`rowgate.confine`, the one rule for what a subject names).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from rowgate import confine
from rowgate.cuda.operators import DEFINE, NAME_PATTERN, OperatorDecl, TritonDecl, check_operators
from rowgate.errors import SubjectError
from rowgate.rows.spec import ARCH_PATTERN
from rowgate.storage import read_regular

KERNELS_DIR = "kernels"
MANIFEST = "kernels.toml"
Arch = Annotated[str, Field(pattern=ARCH_PATTERN)]
Bytes = Annotated[int, Field(ge=0)]
Name = Annotated[str, Field(pattern=NAME_PATTERN)]


class KernelsError(SubjectError):
    """kernels.toml is missing or malformed, or names something that is not there."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BudgetOverride(_Model):
    """Budget keys as written: any subset; `all` then the arch's table apply."""

    max_registers: Annotated[int, Field(gt=0, le=255)] | None = None
    max_spill_stores: Bytes | None = None
    max_spill_loads: Bytes | None = None
    max_stack_bytes: Bytes | None = None
    max_local_bytes: Bytes | None = None
    max_static_shared_bytes: Bytes | None = None


class Budget(_Model):
    """The resolved budget of one kernel on one arch (per entry point)."""

    max_registers: int | None = None
    """None: no register budget (ptxas' own limit applies)."""
    max_spill_stores: int = 0
    max_spill_loads: int = 0
    max_stack_bytes: int = 0
    max_local_bytes: int = 0
    max_static_shared_bytes: int | None = None


class SassRule(_Model):
    entry_points: list[str] = ["*"]
    """fnmatch patterns over the kernel's entry points."""
    arches: list[Arch] = []
    """Arches the rule applies to; empty means all of the kernel's arches."""
    forbid: list[str] = []
    """Opcode families (text before the first dot) that must not appear."""
    require: list[str] = []
    """Opcode families that must appear at least once."""

    def applies(self, entry: str, arch: str, shown: str = "") -> bool:
        """`entry`: the symbol; `shown`: its demangled name (a pattern may name either)."""
        return (not self.arches or arch in self.arches) and any(
            fnmatch.fnmatchcase(name, p) for p in self.entry_points
            for name in (entry, shown or entry))


RECIPE_OWNED = ("-o", "-c", "-cubin", "-ptx", "-fatbin", "-gencode", "--generate-code",
                "-arch", "--gpu-architecture", "-code", "--gpu-code", "--keep", "-std",
                "--std", "-Xptxas", "--ptxas-options", "-Xcompiler", "--compiler-options",
                "-ccbin", "--compiler-bindir")
"""nvcc options rowgate's recipe sets itself (outputs, arches, the C++ standard, the
ptxas and host-compiler channels): a kernel's `nvcc_flags` may not set them."""
WEAKENING = ("-w", "--disable-warnings", "-Wno", "--Wno", "-diag-suppress",
             "--diag-suppress", "--diag_suppress", "-Werror=no", "-Wno-error")
"""Options that would silence warnings: the warning policy is declared, never flagged
away (`host_warnings` relaxes the host compiler's, and the build record says so)."""


def _flag_problem(flag: str, where: str) -> str | None:
    head = flag.split("=", 1)[0]
    if head in RECIPE_OWNED and where == "nvcc_flags":
        return f"{where}: {flag!r} is set by rowgate's recipe"
    if flag == "-w" or any(flag.startswith(w) for w in WEAKENING if w != "-w"):
        return f"{where}: {flag!r} would silence warnings (warnings are errors; see host_warnings)"
    if not flag.startswith("-") or any(c in flag for c in "\0\n"):
        return f"{where}: {flag!r} is not an option"
    return None


def _relative(path: str) -> str:
    if ".." in path.split("/"):
        raise ValueError(f"{path!r}: no '..' (a path relative to the subject's root)")
    return path


RelPath = Annotated[str, Field(pattern=r"^[^/\x00-\x1f][^\x00-\x1f]{0,511}$"),
                    AfterValidator(_relative)]
"""A path relative to the subject's root that stays inside it."""


class ProjectBuild(_Model):
    """The project's own build (`rowgate.cuda.project_build`): its commands, run in order
    in a private writable copy of the subject (its root), every nvcc the build runs being
    rowgate's wrapper; and the files the build leaves holding the kernel's device code."""

    commands: Annotated[list[Annotated[list[str], Field(min_length=1)]], Field(min_length=1)]
    """argv lists; `{nvcc}`, `{arch}` (sm_NN) and `{sm}` (NN) are filled in. Make:
    `["make", "NVCC={nvcc}", "TARGET"]`; CMake: configure and build (`CUDACXX` and
    `CUDAARCHS` already name the wrapper and the arch)."""
    outputs: Annotated[list[RelPath], Field(min_length=1)]
    """Object files, shared libraries, fatbins or cubins, relative to the subject root."""
    unit: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+-]+$")] = ""
    """Where the outputs hold device code of several translation units (a shared library
    built from many .cu files): the one holding this kernel, by its source's base name
    (`gelu` for `src/gelu.cu`: cuobjdump names the unit's cubin `gelu.sm_90.cubin`)."""


class Kernel(_Model):
    source: str = ""
    """The .cu file, relative to kernels/ (rowgate's recipe builds it); or `build`."""
    build: ProjectBuild | None = None
    """The project builds it itself (instead of `source`)."""
    entry_points: Annotated[list[str], Field(min_length=1)]
    """`extern "C"` or mangled symbols, or C++ patterns over demangled names
    (`gelu_forward_kernel2<*>`): `rowgate.cuda.symbols`."""
    arches: Annotated[list[Arch], Field(min_length=1)]
    defines: list[Annotated[str, Field(pattern=DEFINE)]] = []
    budgets: dict[Literal["all"] | Arch, BudgetOverride] = {}
    sass: list[SassRule] = []
    nvcc_flags: list[str] = []
    """Extra nvcc options for this kernel (`-lineinfo`, `--use_fast_math`,
    `--expt-relaxed-constexpr`), placed before rowgate's own."""
    host_flags: list[str] = []
    """Options for the host compiler (nvcc passes them with `-Xcompiler`)."""
    headers: list[Literal["cublas", "nvtx", "cusparse", "cusolver", "nlohmann-json", "torch"]] = []
    """CUDA libraries whose headers the kernel's code includes (`cublas_v2.h`,
    `nvtx3/nvToolsExt.h`): each from its wheel of the toolchain's release, in an include
    directory of its own (`rowgate.cuda.library_headers`)."""
    spill_warnings: Literal["errors", "audit"] = "errors"
    """`errors`: ptxas fails the build on any function's spills or local memory
    (`-warn-spills -warn-lmem-usage`); `audit`: ptxas reports them (`-v`) without failing,
    and the audit judges each declared entry point against its budgets (no spills, stack
    or local memory unless raised). For a translation unit that instantiates more than
    the table declares (a launcher's switch over head sizes and dtypes): its other
    functions are recorded, not judged."""
    host_warnings: Literal["errors", "off"] = "errors"
    """`errors`: host code compiles with `-Wall -Wextra -Werror`, as device code does;
    `off`: the host compiler's defaults (device and ptxas warnings stay errors). The
    build record and the bundle say which."""

    @model_validator(mode="after")
    def _budget_arches_are_built(self) -> "Kernel":
        stray = [a for a in self.budgets if a != "all" and a not in self.arches]
        if stray:
            raise ValueError(f"budgets for {', '.join(stray)}: not in arches {self.arches}")
        if bool(self.source) == (self.build is not None):
            raise ValueError("source or build: exactly one (rowgate's recipe builds a source; "
                             "a build is the project's own)")
        problems = [p for where, flags in (("nvcc_flags", self.nvcc_flags),
                                           ("host_flags", self.host_flags))
                    for f in flags if (p := _flag_problem(f, where))]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def budget(self, arch: str) -> Budget:
        merged: dict[str, int] = {}
        for key in ("all", arch):
            if key in self.budgets:
                merged.update(self.budgets[key].model_dump(exclude_none=True))
        return Budget(**merged)

    def rules(self, entry: str, arch: str, shown: str = "") -> list[SassRule]:
        return [r for r in self.sass if r.applies(entry, arch, shown)]


class KernelManifest(_Model):
    version: Literal[1, 2]
    include_dirs: list[str] = ["include"]
    kernels: dict[Name, Kernel]
    operators: dict[Name, OperatorDecl] = {}
    """Version 2: the operators the kernels implement (docs/contracts.md)."""
    triton: dict[Name, TritonDecl] = {}
    """Version 2: Triton kernels the AOT gate compiles."""

    @model_validator(mode="after")
    def _operators_name_what_is_built(self) -> "KernelManifest":
        if self.version == 1 and (self.operators or self.triton):
            raise ValueError("operators/triton tables need version = 2")
        problems = check_operators(self.operators, {n: k.entry_points
                                                    for n, k in self.kernels.items()})
        if problems:
            raise ValueError(problems[0])
        return self

    def operator(self, name: str = "") -> tuple[str, OperatorDecl]:
        """The operator `name`, or the only one declared. Raises KernelsError."""
        if not name:
            if len(self.operators) != 1:
                raise KernelsError(f"{MANIFEST} declares {len(self.operators)} operators "
                                   f"({', '.join(sorted(self.operators)) or 'none'}): the row's "
                                   f"gate must name one (operator = \"NAME\")")
            name = next(iter(self.operators))
        if name not in self.operators:
            raise KernelsError(f"operator {name!r}: not in {MANIFEST} (operators: "
                               f"{', '.join(sorted(self.operators)) or 'none'})")
        return name, self.operators[name]

    def select(self, names: list[str], arch: str) -> list[str]:
        """Kernels to build for `arch`: `names` (all when empty) that target it.

        Raises KernelsError for a named kernel that does not exist or does not
        list the arch: asking for it and silently building nothing would pass.
        """
        for name in names:
            if name not in self.kernels:
                raise KernelsError(f"kernel {name!r}: not in {MANIFEST} "
                                   f"(known: {', '.join(sorted(self.kernels))})")
            if arch not in self.kernels[name].arches:
                raise KernelsError(f"kernel {name!r}: does not target {arch} "
                                   f"(arches: {', '.join(self.kernels[name].arches)})")
        return [n for n in (names or sorted(self.kernels)) if arch in self.kernels[n].arches]


def parse(text: str, where: str) -> KernelManifest:
    """Parse kernels.toml text; `where` names the file in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise KernelsError(f"{where}: {exc}") from exc
    names = data.get("kernels")
    if isinstance(names, dict):  # names become directories: checked before anything else
        for name in names:
            confine.name(name, where, f"kernels.{confine.shown(name)}")
        confine.distinct_by_case(names, where, "kernels.")
    try:
        return KernelManifest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        key = ".".join(str(p) for p in err["loc"] if p != "[key]")
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        msg = msg.removeprefix("Value error, ")
        raise KernelsError(f"{where}: {key}: {msg}" if key else f"{where}: {msg}") from None


def manifest_text(repo: Path) -> str:
    """The subject's kernels/kernels.toml, confined (a link out of the subject, a FIFO
    or a directory is refused, never read)."""
    where = str(repo / KERNELS_DIR / MANIFEST)
    for rel in (KERNELS_DIR, f"{KERNELS_DIR}/{MANIFEST}"):
        if confine.inside(repo, rel, where, "", kind="dir" if rel == KERNELS_DIR else "file",
                          missing_ok=True) is None:
            raise KernelsError(f"{where}: cannot read: No such file or directory")
    data = read_regular(repo / KERNELS_DIR / MANIFEST, where)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KernelsError(f"{where}: not UTF-8 ({exc})") from exc


def load(repo: Path) -> KernelManifest:
    """Parse the subject's kernels.toml and confine every file it makes the compiler read.
    Raises KernelsError (a SubjectError for what leaves the subject) naming file and key."""
    where = str(repo / KERNELS_DIR / MANIFEST)
    manifest = parse(manifest_text(repo), where)
    for name in manifest.kernels:
        kernel_files(repo, manifest, name)
    for name in manifest.triton:
        triton_source(repo, manifest, name)
    for name, decl in manifest.operators.items():
        if decl.harness:
            harness_file(repo, manifest, name)
    return manifest


def harness_file(repo: Path, manifest: KernelManifest, name: str) -> Path:
    """The confined real path of operator `name`'s harness file (relative to the subject's
    root), which must define its function at top level: read as text (its syntax tree),
    never imported here; it runs only in the kernel child."""
    import ast

    where = str(repo / KERNELS_DIR / MANIFEST)
    rel, function = manifest.operators[name].to_contract(name).harness_file()
    key = f"operators.{name}.harness"
    path = confine.inside(repo, rel, where, key)
    try:
        tree = ast.parse(read_regular(path, where), filename=rel)
    except (SyntaxError, ValueError) as exc:
        raise KernelsError(f"{where}: {key}: {rel} does not parse ({exc})") from exc
    if not any(isinstance(n, ast.FunctionDef) and n.name == function for n in tree.body):
        raise KernelsError(f"{where}: {key}: {rel} defines no top-level function {function!r}")
    return path


def triton_source(repo: Path, manifest: KernelManifest, name: str) -> Path:
    """The confined real path of Triton kernel `name`'s source file (under kernels/)."""
    where = str(repo / KERNELS_DIR / MANIFEST)
    return confine.inside(repo, manifest.triton[name].source, where, f"triton.{name}.source",
                          base=repo / KERNELS_DIR)


def kernel_files(repo: Path, manifest: KernelManifest, name: str) -> list[Path]:
    """The kernel's source, the headers beside it and every file under the include dirs:
    all a compile may read through what kernels.toml names, each confined to the subject
    (paths as named, under kernels/). Raises SubjectError naming the key that brought it in."""
    where = str(repo / KERNELS_DIR / MANIFEST)
    root = repo / KERNELS_DIR
    if manifest.kernels[name].build is not None:  # the project's build reads its whole tree
        return confine.files_under(repo, repo, where, f"kernels.{name}.build", skip=(".git",))
    source = manifest.kernels[name].source
    key = f"kernels.{name}.source"
    confine.inside(repo, source, where, key, base=root)
    src = root / source
    confine.inside(repo, os.path.relpath(src.parent, repo), where, key, kind="dir")
    files = [src] + confine.files_under(src.parent, repo, where, key, suffixes=(".cuh", ".h"))
    for i, inc in enumerate(manifest.include_dirs):
        if confine.inside(repo, inc, where, f"include_dirs[{i}]", base=root, kind="dir",
                          missing_ok=True) is not None:
            files += confine.files_under(root / inc, repo, where, f"include_dirs[{i}]")
    return files


def source_digest(repo: Path, manifest: KernelManifest, name: str) -> str:
    """sha256 over the kernel's source and every file under the include dirs.

    Every header counts (not just the ones included): a cache keyed on less could
    serve a stale build after a header edit. Headers beside the source count too
    (`persistent/task_abi.cuh` is included by its directory, not an include dir).
    """
    root = repo / KERNELS_DIR
    h = hashlib.sha256()
    for f in kernel_files(repo, manifest, name):
        h.update(Path(os.path.relpath(f, root)).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()
