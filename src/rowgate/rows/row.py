"""The row model and TOML loading: the only place a row file is parsed.

A row is data. Every table forbids unknown keys, so a typo in a row file is an
error that names the file and the key rather than a setting silently ignored.
Criteria are typed records (metric, comparison, threshold, cells) and are
evaluated by `Criterion.holds`, never by evaluating strings. The row's parts are
`rowgate.rows.spec`; each gate kind's spec model is its gate's (`rowgate.gates`).
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)

from rowgate import dirs, plugins
from rowgate.errors import RowError, UsageError
from rowgate.records.ids import ROW_ID
from rowgate.rows.datasets import DatasetRef
from rowgate.rows.spec import (
    Arms,
    Criterion,
    GateSpec,
    HistoryEntry,
    ModelRef,
    Pending,
    Reference,
    ReviewPolicy,
    RowBudget,
    SandboxPolicy,
    StopCondition,
    Target,
    Workload,
)
from rowgate.storage import read_regular

ROWS_ENV = "ROWGATE_ROWS"
DEMO_PREFIX = "demos/"
"""How a bundle records a built-in demo row's file: relative to rowgate's package data."""


def rows_dirs(explicit: Path | None = None) -> list[Path]:
    """Where a row id is looked up, first match wins: `--rows DIR` if given, else
    `$ROWGATE_ROWS` (os.pathsep-separated), else `./rows` if it is a directory; then
    rowgate's built-in demos (package data)."""
    if explicit is not None:
        found, source = [explicit], "--rows"
    elif os.environ.get(ROWS_ENV):
        found = [Path(p) for p in os.environ[ROWS_ENV].split(os.pathsep) if p]
        source = f"${ROWS_ENV}"
    else:
        found, source = ([Path("rows")] if Path("rows").is_dir() else []), ""
    for d in found:  # a mistyped directory would otherwise list the demos alone
        if not d.is_dir():
            raise UsageError(f"{source} {d}: not a directory")
    return [*found, dirs.demos_dir()]


def _gate_table(value: Any, handler: ValidatorFunctionWrapHandler) -> GateSpec:
    """One [[gates]] table, validated by the spec model its kind registered.

    Through the plugins (entry points, or a kind registered in code) when the row is
    validated, not a union fixed when this module was imported: a plugin's kind
    validates like rowgate's own, with no edit here. A kind nothing installed provides
    is one line naming the installed ones; a table that names no kind goes to the base
    spec, which says what is missing. The JSON schema (`rowgate schemas`) is the union
    of rowgate's own kinds."""
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    gate = plugins.load(plugins.GATES, kind) if isinstance(kind, str) else None
    if gate is None:
        if isinstance(kind, str):
            raise ValueError(plugins.unknown(plugins.GATES, kind, "gate kind"))
        spec: GateSpec = handler(value)  # pydantic's handler is untyped (Any)
        return spec
    model: type[GateSpec] = gate.spec_model
    if isinstance(value, model):  # a spec already validated (a row built in code)
        return value
    return model.model_validate(value)


if TYPE_CHECKING:
    GateTable = GateSpec
else:  # each kind's spec model, through its plugin; the schema names the installed ones
    GateTable = Annotated[GateSpec, WrapValidator(_gate_table)]


def _matrix_kind(kind: str) -> bool:
    """Whether a kind's cells are the workload matrix's (criteria must name its cells)."""
    gate = plugins.load(plugins.GATES, kind)
    return gate is not None and bool(gate.workload_matrix)


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    id: Annotated[str, Field(pattern=ROW_ID)]
    title: str
    kind: Literal["research", "kernel-pr", "parity", "demo"]
    summary: str = ""
    target: Target
    models: list[ModelRef] = []
    arms_declared: Arms | None = Field(default=None, alias="arms")
    """`[arms]`: required when a gate drives engines (tokens, throughput, trace,
    accuracy and the like: `Gate.drives_arms`); a kernel-only row leaves it out."""
    workload_declared: Workload | None = Field(default=None, alias="workload")
    """`[workload]`: required with `[arms]`, optional otherwise."""
    gates: list[GateTable]
    criteria: list[Criterion] = []
    stop_conditions: list[StopCondition] = []
    pending: list[Pending] = []
    references: list[Reference] = []
    rules: list[str] = []
    history: list[HistoryEntry] = []
    review: ReviewPolicy = ReviewPolicy()
    sandbox: SandboxPolicy = SandboxPolicy()
    budget: RowBudget | None = None
    """`[budget] wall_s`: the run's wall-time budget (rows.spec.RowBudget); none: unbounded."""

    @model_validator(mode="after")
    def _cross_references(self) -> "Row":
        problems: list[str] = []
        ids = [g.id for g in self.gates]
        for dup in sorted({i for i in ids if ids.count(i) > 1}):
            problems.append(f"gates: gate id {dup!r} is used more than once")
        kinds = {g.id: g.kind for g in self.gates}
        matrix = set(self.cells())
        model_ids = [m.id for m in self.models]
        problems += self._engine_sections()
        problems += self._arm_references()
        tables: tuple[tuple[str, Sequence[Criterion | StopCondition | Pending]], ...] = (
            ("criteria", self.criteria), ("stop_conditions", self.stop_conditions),
            ("pending", self.pending))
        for where, items in tables:
            for i, item in enumerate(items):
                unknown = [m for m in getattr(item, "models", []) if m not in model_ids]
                if unknown:
                    problems.append(f"{where}[{i}].models: {', '.join(map(repr, unknown))} "
                                    f"not among the row's models ({', '.join(model_ids)})")
                if item.gate not in kinds:
                    problems.append(f"{where}[{i}].gate: no gate with id {item.gate!r} "
                                    f"(gates: {', '.join(ids)})")
                    continue
                cells = getattr(item, "cells", [])
                if _matrix_kind(kinds[item.gate]) and cells != ["*"]:
                    for cell in cells:
                        if cell not in matrix:
                            problems.append(f"{where}[{i}].cells: {cell!r} is not a cell of the "
                                            f"workload matrix ({', '.join(sorted(matrix))})")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _engine_sections(self) -> list[str]:
        """A gate that drives the row's engines needs `[arms]` and `[workload]`; a row
        whose gates only build, audit and launch kernels needs neither."""
        missing = [name for name, value in (("[arms]", self.arms_declared),
                                            ("[workload]", self.workload_declared))
                   if value is None]
        if not missing:
            return []
        out = []
        for i, g in enumerate(self.gates):
            gate = plugins.load(plugins.GATES, g.kind)
            if gate is not None and (gate.drives_arms or gate.workload_matrix):
                out.append(f"gates[{i}] ({g.id}): a {g.kind} gate drives the row's engines "
                           f"on its workload, and the row declares no {' and no '.join(missing)}")
        return out

    @property
    def arms(self) -> Arms:
        """The row's arms (a row whose gates drive engines has them: checked on load)."""
        if self.arms_declared is None:
            raise RowError(self.id, ["arms: the row declares no [arms], and something read "
                                     "them (a gate that drives engines needs [arms.oracle] "
                                     "and [arms.candidate])"])
        return self.arms_declared

    @property
    def workload(self) -> Workload:
        """The row's workload (a row whose gates drive engines has one: checked on load)."""
        if self.workload_declared is None:
            raise RowError(self.id, ["workload: the row declares no [workload], and something "
                                     "read it (a gate that drives engines needs one)"])
        return self.workload_declared

    def _arm_references(self) -> list[str]:
        """Gates name arms (a trace gate's `arms`, a throughput gate's `baseline`): each
        must be an arm of the row (`Arms.named`)."""
        names = self.arms_declared.named() if self.arms_declared else {}
        out = []
        for i, g in enumerate(self.gates):
            gate = plugins.load(plugins.GATES, g.kind)
            refs: list[str] = []
            for key in (gate.arm_fields if gate else ()):
                value = getattr(g, key)
                refs += [value] if isinstance(value, str) else list(value)
            for ref in refs:
                if ref not in names:
                    out.append(f"gates[{i}] ({g.id}): no arm named {ref!r} (arms: "
                               f"{', '.join(names)})")
        return out

    def cells(self) -> list[str]:
        """The workload matrix's cell names: models x input lengths x concurrency (a
        model's cells start `<model id>/` when the row has several; none without one)."""
        if self.workload_declared is None:
            return []
        return self.workload_declared.cells([m.id for m in self.models])

    def gate(self, gate_id: str) -> GateSpec:
        for g in self.gates:
            if g.id == gate_id:
                return g
        raise KeyError(gate_id)

    def gates_before(self, gate_id: str) -> list[GateSpec]:
        """The gates the runner runs before `gate_id` (it runs the row's gates in order;
        all of them for a gate not in the row): what that gate could read of its bundle.
        A gate reading another's artifacts reads them only from these, and so does its
        derive: a review re-derives a sealed bundle that holds every gate's artifacts,
        a later gate's included."""
        ids = [g.id for g in self.gates]
        return self.gates[:ids.index(gate_id)] if gate_id in ids else list(self.gates)

    def build_arches(self) -> list[str]:
        return self.target.build_arches or [self.target.arch]


# -------------------------------------------------------------------- loading


class LoadedRow(BaseModel):
    """A row with where it came from and the digest the bundle records."""

    model_config = ConfigDict(frozen=True)
    row: Row
    path: Path
    sha256: str


def _loc(loc: tuple[str | int, ...]) -> str:
    """Render a pydantic error location as `gates[0].commands`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in plugins.names(plugins.GATES) and out.endswith("]"):
            continue  # discriminator tag pydantic inserts: not a key the user wrote
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _problems(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors(include_url=False):
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "value_error" and msg.startswith("Value error, "):
            # cross-reference problems already carry their own key paths; a table's own
            # (an unknown gate kind) is placed by pydantic
            where = f"{_loc(err['loc'])}: " if err["loc"] else ""
            for part in msg.removeprefix("Value error, ").split("; "):
                lines.append(where + part)
            continue
        lines.append(f"{_loc(err['loc'])}: {msg}")
    return lines


def load_row(path: Path | str) -> LoadedRow:
    """Parse and validate one row file. Raises `RowError` listing every problem."""
    path = Path(path)
    raw = read_regular(path, f"{path}: (file)")  # a FIFO is refused, never waited on
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RowError(str(path), [f"(toml): {exc}"]) from exc
    try:
        row = Row.model_validate(data)
    except ValidationError as exc:
        raise RowError(str(path), _problems(exc)) from exc
    if path.stem != row.id:
        raise RowError(str(path), [f"id: {row.id!r} does not match the file name {path.stem!r}"])
    return LoadedRow(row=_with_row_dir(row, path.resolve().parent), path=path.resolve(),
                     sha256=hashlib.sha256(raw).hexdigest())


ROW_RELATIVE = ("oracle_record", "oracle_record_key", "dataset_path")
"""Gate keys that name a file relative to the row file (never to the subject: a row is
the operator's, a subject is untrusted)."""


def _relative_to(row_dir: Path, text: str) -> str:
    return text if not text or Path(text).is_absolute() else str(row_dir / text)


def _with_row_dir(row: Row, row_dir: Path) -> Row:
    """The row with the files it names made absolute: a row names its prompt file,
    datasets and oracle records relative to itself, and the gates that read them do not
    know where the row file was."""
    update: dict[str, Any] = {}
    ds = row.workload_declared.dataset if row.workload_declared else None
    if isinstance(ds, DatasetRef) and not Path(ds.path).is_absolute():
        dataset = ds.model_copy(update={"path": str(row_dir / ds.path)})
        update["workload_declared"] = row.workload.model_copy(update={"dataset": dataset})
    gates = [g.model_copy(update={k: _relative_to(row_dir, getattr(g, k))
                                  for k in ROW_RELATIVE if isinstance(getattr(g, k, None), str)})
             for g in row.gates]
    if gates != list(row.gates):
        update["gates"] = gates
    return row.model_copy(update=update) if update else row


def resolve_row(ref: str, rows_dir: Path | None = None) -> LoadedRow:
    """A path to a TOML file, or a row id (`PERF-THOR-DECODE-PARITY`) looked up in
    `rows_dirs(rows_dir)`."""
    if ref.endswith(".toml") or "/" in ref:
        return load_row(ref)
    if not re.fullmatch(ROW_ID, ref):
        raise RowError(ref, [f"(argument): {ref!r} is neither a row id nor a .toml path"])
    places = rows_dirs(rows_dir)
    for place in places:
        path = place / f"{ref}.toml"
        if path.is_file():
            return load_row(path)
    known = ", ".join(sorted({p.stem for d in places for p in d.glob("*.toml")}))
    where = ", ".join(str(d) for d in places[:-1]) + (", " if len(places) > 1 else "")
    raise RowError(ref, [f"(argument): no row {ref!r} in {where}the built-in demos "
                         f"(rows: {known}; --rows DIR or ${ROWS_ENV} names a rows directory)"])


def all_rows(rows_dir: Path | None = None) -> list[LoadedRow]:
    """Every row `resolve_row` could find by id (a directory's first, then the demos)."""
    seen: dict[str, LoadedRow] = {}
    for place in rows_dirs(rows_dir):
        for path in sorted(place.glob("*.toml")):
            seen.setdefault(path.stem, load_row(path))
    return list(seen.values())


def recorded_file(loaded: LoadedRow) -> str:
    """The row path a bundle records: `demos/ID.toml` for a built-in demo (found in any
    install), else relative to the working directory when inside it, else absolute."""
    for base, prefix in ((dirs.demos_dir().resolve(), DEMO_PREFIX), (Path.cwd().resolve(), "")):
        try:
            return prefix + loaded.path.relative_to(base).as_posix()
        except ValueError:
            continue
    return loaded.path.as_posix()


def recorded_places(recorded: str, *bases: Path) -> list[Path]:
    """Where a recorded row path may be here: itself if absolute; a demo in this
    install's package data; else under each of `bases` (a checkout, the cwd)."""
    path = Path(recorded)
    if path.is_absolute():
        return [path]
    if recorded.startswith(DEMO_PREFIX):
        return [dirs.demos_dir() / recorded.removeprefix(DEMO_PREFIX)]
    return [base / path for base in bases]
