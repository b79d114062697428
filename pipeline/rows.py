"""The row model and TOML loading: the only place a row file is parsed.

A row is data. Every table forbids unknown keys, so a typo in a row file is an
error that names the file and the key rather than a setting silently ignored.
Criteria are typed records (metric, comparison, threshold, cells) and are
evaluated by `Criterion.holds`, never by evaluating strings. The row's parts are
`pipeline.rowspec`; each gate kind's spec model is its gate's (`pipeline.gates`).
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)

from pipeline import CHECKOUT, gates
from pipeline.datasets import DatasetRef
from pipeline.errors import RowError
from pipeline.gates import registry
from pipeline.records.ids import ROW_ID
from pipeline.rowspec import (
    Arms,
    Criterion,
    GateSpec,
    HistoryEntry,
    ModelRef,
    Pending,
    Reference,
    ReviewPolicy,
    StopCondition,
    Target,
    Workload,
)
from pipeline.storage import read_regular

ROWS_DIR = CHECKOUT / "rows"


def _gate_table(value: Any, handler: ValidatorFunctionWrapHandler) -> GateSpec:
    """One [[gates]] table, validated by the spec model its kind registered.

    Through the registry when the row is validated, not a union fixed when this module
    was imported: a kind registered later (a gate module a test defines, or one outside
    rowgate's gates/) validates like rowgate's own, with no edit here. What the registry
    does not know goes to the union of the builtin kinds: it explains a table that is
    not one or names no kind, and an unknown kind (naming the expected ones) in
    pydantic's own words. The JSON schema (schemas/row.schema.json) is that union."""
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    gate = registry.lookup(kind) if isinstance(kind, str) else None
    if gate is None:
        spec: GateSpec = handler(value)  # pydantic's handler is untyped (Any)
        return spec
    if isinstance(value, gate.spec_model):  # a spec already validated (a row built in code)
        return value
    return gate.spec_model.model_validate(value)


if TYPE_CHECKING:
    GateTable = GateSpec
else:
    GateTable = Annotated[Union[tuple(g.spec_model for g in gates.BUILTIN)],
                          Field(discriminator="kind"), WrapValidator(_gate_table)]


def _matrix_kind(kind: str) -> bool:
    """Whether a kind's cells are the workload matrix's (criteria must name its cells)."""
    gate = registry.lookup(kind)
    return gate is not None and gate.workload_matrix


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Annotated[str, Field(pattern=ROW_ID)]
    title: str
    kind: Literal["research", "kernel-pr", "parity", "demo"]
    summary: str = ""
    target: Target
    models: list[ModelRef] = []
    arms: Arms
    workload: Workload
    gates: list[GateTable]
    criteria: list[Criterion] = []
    stop_conditions: list[StopCondition] = []
    pending: list[Pending] = []
    references: list[Reference] = []
    rules: list[str] = []
    history: list[HistoryEntry] = []
    review: ReviewPolicy = ReviewPolicy()

    @model_validator(mode="after")
    def _cross_references(self) -> "Row":
        problems: list[str] = []
        ids = [g.id for g in self.gates]
        for dup in sorted({i for i in ids if ids.count(i) > 1}):
            problems.append(f"gates: gate id {dup!r} is used more than once")
        kinds = {g.id: g.kind for g in self.gates}
        matrix = set(self.cells())
        model_ids = [m.id for m in self.models]
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

    def _arm_references(self) -> list[str]:
        """Gates name arms (a trace gate's `arms`, a throughput gate's `baseline`): each
        must be an arm of the row (`Arms.named`)."""
        names = self.arms.named()
        out = []
        for i, g in enumerate(self.gates):
            gate = registry.lookup(g.kind)
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
        model's cells start `<model id>/` when the row has several)."""
        return self.workload.cells([m.id for m in self.models])

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
        elif part in registry.KINDS and out.endswith("]"):
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
            # cross-reference problems already carry their own key paths
            for part in msg.removeprefix("Value error, ").split("; "):
                lines.append(part)
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


def _with_row_dir(row: Row, row_dir: Path) -> Row:
    """The row with its dataset path made absolute: a row names its prompt file relative
    to itself, and the gates that read it do not know where the row file was."""
    ds = row.workload.dataset
    if not isinstance(ds, DatasetRef) or Path(ds.path).is_absolute():
        return row
    dataset = ds.model_copy(update={"path": str(row_dir / ds.path)})
    return row.model_copy(update={"workload": row.workload.model_copy(
        update={"dataset": dataset})})


def resolve_row(ref: str, rows_dir: Path = ROWS_DIR) -> LoadedRow:
    """A row id (`PERF-THOR-DECODE-PARITY`) or a path to a TOML file."""
    if ref.endswith(".toml") or "/" in ref:
        return load_row(ref)
    if not re.fullmatch(ROW_ID, ref):
        raise RowError(ref, [f"(argument): {ref!r} is neither a row id nor a .toml path"])
    path = rows_dir / f"{ref}.toml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in rows_dir.glob("*.toml")))
        raise RowError(ref, [f"(argument): no row {ref!r} in {rows_dir} (rows: {known})"])
    return load_row(path)


def all_rows(rows_dir: Path = ROWS_DIR) -> list[LoadedRow]:
    return [load_row(p) for p in sorted(rows_dir.glob("*.toml"))]
