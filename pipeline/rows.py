"""Row models and TOML loading: the only place a row file is parsed.

A row is data. Every table forbids unknown keys, so a typo in a row file is an
error that names the file and the key rather than a setting silently ignored.
Criteria are typed records (metric, comparison, threshold, cells) and are
evaluated by `Criterion.holds`, never by evaluating strings.
"""

from __future__ import annotations

import hashlib
import operator
import re
import tomllib
from enum import Enum
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline import CHECKOUT
from pipeline.errors import RowError

ROWS_DIR = CHECKOUT / "rows"
ARCH_PATTERN = r"^(cpu|sm_[0-9]{2,3}a?)$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------- target


class Target(_Model):
    """Where the row's execution gates must run."""

    arch: Annotated[str, Field(pattern=ARCH_PATTERN)]
    """Compute arch the row is about (`sm_110`, `sm_70`, …) or `cpu`."""
    device: str = "any"
    """Device selector such as `thor:gpu0`; `any` takes the first GPU of `arch`."""
    launcher: list[str] = []
    """Prefix for every GPU command on leased devices (e.g. `["rc", "--"]`).
    When set, the launcher owns the device lock: rowgate adds none of its own."""
    stand_in_arches: list[Annotated[str, Field(pattern=ARCH_PATTERN)]] = []
    """Arches whose devices may run the execution gates as a labelled stand-in;
    results from a stand-in never satisfy criteria bound to `arch`."""
    build_arches: list[Annotated[str, Field(pattern=ARCH_PATTERN)]] = []
    """Arches the build and audit gates compile for (defaults to `arch`)."""


# ----------------------------------------------------------------------- arms


class EngineKind(str, Enum):
    VLLM = "vllm"
    OPENAI = "openai"
    REFERENCE = "reference"
    LLAMA_CPP = "llama.cpp"


class Arm(_Model):
    """One side of an A/B: an engine, pinned."""

    engine: EngineKind
    version: str = ""
    """Exact version the arm is pinned to (required for an oracle)."""
    commit: str = ""
    command: list[str] = []
    """Command that starts an OpenAI-compatible server (engine `openai`)."""
    mode: Literal["eager", "graph", "persistent", "default"] = "default"
    kernel_variant: str = ""
    dtype: str = "float32"
    note: str = ""


class Arms(_Model):
    oracle: Arm
    candidate: Arm
    fallbacks: list[Arm] = []
    """Arms used where the candidate does not support a shape (declared, recorded)."""

    @model_validator(mode="after")
    def _oracle_pinned(self) -> "Arms":
        if not self.oracle.version:
            raise ValueError("oracle.version: the oracle must be pinned to an exact version")
        return self


class SyntheticModel(_Model):
    """A Qwen3-architecture model rowgate builds from a fixed seed (no download)."""

    vocab_size: Annotated[int, Field(gt=0)] = 1024
    hidden_size: Annotated[int, Field(gt=0)] = 128
    intermediate_size: Annotated[int, Field(gt=0)] = 256
    num_layers: Annotated[int, Field(gt=0)] = 2
    num_heads: Annotated[int, Field(gt=0)] = 4
    num_kv_heads: Annotated[int, Field(gt=0)] = 2
    head_dim: Annotated[int, Field(gt=0)] = 64
    max_position: Annotated[int, Field(gt=0)] = 2048
    seed: int = 0


class ModelRef(_Model):
    id: str
    name: str
    """Model name as the engines know it (HF repo id or `tiny-qwen3`)."""
    weights: str = ""
    """Local path to weights; empty means rowgate builds the model (tiny or
    `synthetic`) or the gates that need it stay PENDING."""
    synthetic: SyntheticModel | None = None
    """Shape of a model rowgate builds itself (e.g. the megakernel row's probe)."""
    dtype: str = "float32"
    note: str = ""


# ------------------------------------------------------------------- workload


class Sampling(_Model):
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    ignore_eos: bool = True
    """True for fixed-length decode timing; False for natural EOS (accuracy)."""


class Workload(_Model):
    """The identical workload both arms run; its digest must match across arms."""

    input_lens: list[Annotated[int, Field(gt=0)]]
    concurrency: list[Annotated[int, Field(gt=0)]]
    output_len: Annotated[int, Field(gt=0)]
    requests_per_cell: Annotated[int, Field(gt=0)] = 8
    sampling: Sampling = Sampling()
    seeds: list[int] = [0]
    dataset: str = "random-token-ids"
    prefix_caching: bool = False

    def cells(self) -> list[str]:
        """Matrix cell names, `i<input_len>-c<concurrency>`."""
        return [f"i{i}-c{c}" for i in self.input_lens for c in self.concurrency]


# ---------------------------------------------------------------------- gates


class _GateBase(_Model):
    id: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    description: str = ""
    required: bool = True
    """A required gate that is not PASS blocks the merge."""
    device: str = ""
    """Device selector for this gate alone (e.g. `name:H100`); default the row's."""


class HostGate(_GateBase):
    kind: Literal["host"]
    commands: list[Annotated[list[str], Field(min_length=1)]] = []
    require_clean: bool = True
    require_dco: bool = True


class BuildGate(_GateBase):
    kind: Literal["build"]
    arches: list[Annotated[str, Field(pattern=ARCH_PATTERN)]] = []
    """Arches to build; empty means the row's `target.build_arches`."""
    kernels: list[str] = []
    """Kernel names from kernels/kernels.toml; empty means all."""
    aot_reachability: bool = False
    """Also record whether the pinned Triton compiles ahead of time per arch."""
    aot_arches: list[Annotated[str, Field(pattern=ARCH_PATTERN)]] = []
    """Arches the Triton AOT probe asks about (e.g. ones a release omits); empty
    means the arches built."""


class AuditGate(_GateBase):
    kind: Literal["audit"]
    arches: list[Annotated[str, Field(pattern=ARCH_PATTERN)]] = []
    kernels: list[str] = []
    verify_embedded_images: bool = True


class Tolerance(_Model):
    rtol: Annotated[float, Field(ge=0)] = 1e-2
    atol: Annotated[float, Field(ge=0)] = 1e-2


class OperatorGate(_GateBase):
    kind: Literal["operator"]
    baseline: str
    candidate: str
    batches: list[Annotated[int, Field(gt=0)]] = [1, 4, 8, 12, 16]
    layouts: list[Literal["uniform", "ragged"]] = ["uniform", "ragged"]
    contexts: list[Annotated[str, Field(pattern=r"^(page[+-]1|page|[0-9]+(\.[0-9]+)?K?)$")]] = [
        "1", "page-1", "page", "page+1", "1024", "16384", "17.8K"]
    page_sizes: list[Annotated[int, Field(gt=0)]] = [16, 64]
    kv_dtypes: list[Literal["bf16", "e5m2"]] = ["bf16", "e5m2"]
    heads: list[Annotated[list[int], Field(min_length=2, max_length=2)]] = [[32, 8], [8, 1]]
    head_dims: list[Literal[64, 128]] = [128, 64]
    seeds: list[int] = [0, 1]
    tolerance: Tolerance = Tolerance()
    timing_repeats: Annotated[int, Field(ge=9)] = 9


class PhaseGate(_GateBase):
    kind: Literal["phase"]
    phases: list[str]
    shape: str
    """Exact shape the attribution is measured on (e.g. `B16-ragged-17.8K-e5m2`)."""
    counters: list[str] = []


class TokensGate(_GateBase):
    kind: Literal["tokens"]
    oracle_record: str = ""
    """Path of a signed oracle record to compare against when the oracle cannot
    run beside the candidate; empty means run the oracle here."""
    oracle_record_key: str = ""
    """Public key (PEM, a path in the repo) the record must be signed with: pinned in
    the row so a reviewer sees whose record counts (`--option oracle_record_key`
    overrides it)."""
    tie_margin: Annotated[float, Field(ge=0)] = 0.0
    """Near-tie rule (pipeline/divergence.py) for arms that round differently from the
    oracle (bf16 against fp32, another engine's kernels): a request whose first
    divergence keeps, on each side, a token the other side had within this many nats of
    its own choice is not a mismatch. 0 holds the ids exactly equal. The row says why."""
    quantized: bool = False
    min_agreement: Annotated[float, Field(ge=0, le=1)] = 1.0
    max_logprob_divergence: Annotated[float, Field(ge=0)] = 0.0


class ThroughputGate(_GateBase):
    kind: Literal["throughput"]
    repeats: Annotated[int, Field(ge=5)] = 9
    warmup: Annotated[int, Field(ge=0)] = 1
    order: Literal["alternating", "random"] = "alternating"
    min_effect: Annotated[float, Field(ge=0)] = 0.02
    """Smallest relative difference treated as real (e.g. 0.02 = 2 %)."""
    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.05
    bootstrap: Annotated[int, Field(ge=1000)] = 10000
    cells: list[str] = []
    """Subset of the workload matrix; empty means every cell."""
    endpoint: bool = False
    """Drive the arms through their OpenAI endpoints (streamed TTFT/TPOT/ITL)."""
    baseline: str = "oracle"
    """The A side: `oracle`, or the mode of one of the row's fallback arms (e.g.
    `graph`: the persistent candidate against CUDA-graph replay on the same device).
    The artifacts keep calling the A side `oracle`; meta.json names the arm."""


class TraceGate(_GateBase):
    kind: Literal["trace"]
    modes: list[Literal["eager", "graph", "persistent"]] = ["graph"]
    warm_concurrency: Annotated[int, Field(gt=0)] = 1
    primer_steps: Annotated[int, Field(ge=0)] = 256
    primer_concurrency: Annotated[int, Field(gt=0)] = 1
    arm_delay: Annotated[int, Field(ge=0)] = 257
    """Step at which the profiler arms; activation follows immediately before
    the timed execution, so exactly one range is captured."""
    steps: Annotated[int, Field(gt=0)] = 32
    clock_tolerance: Annotated[float, Field(ge=0)] = 0.02
    """Max relative SM-clock spread inside the range."""
    graph_route_proof: bool = False
    material_idle_fraction: Annotated[float, Field(ge=0, le=1)] = 0.10
    """Recoverable idle capacity at or above this fraction of step time is material."""
    arms: list[Literal["oracle", "candidate"]] = ["oracle", "candidate"]


class AccuracyGate(_GateBase):
    kind: Literal["accuracy"]
    dataset: str
    dataset_path: str = ""
    weights: str = ""
    sampling: Sampling
    num_questions: Annotated[int, Field(gt=0)] = 1319
    max_tokens: Annotated[int, Field(gt=0)] = 1024
    max_empty_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Health: largest fraction of outputs with no token before EOS."""
    max_runaway_rate: Annotated[float, Field(ge=0, le=1)] = 0.05
    """Health: largest fraction of outputs that hit max_tokens without EOS."""


class AbiGate(_GateBase):
    kind: Literal["abi"]
    abi_version: Annotated[int, Field(ge=1)] = 1
    schedules: list[Literal["static-round-robin", "dynamic-queue"]] = [
        "static-round-robin", "dynamic-queue"]
    admitted_by: str = ""
    """Trace gate whose capacity verdict must admit this work."""
    sm_count: Annotated[int, Field(gt=0)] = 132
    """SMs the task lists are sized to where no device is here (H100/H200 SXM: 132)."""
    tie_margin: Annotated[float, Field(ge=0)] = 0.0
    """Largest log-probability gap (nats) between each path's choice and the other's, at
    the first divergence, for persistent and eager parting to count as a near-tie kept
    the other way, not a mismatch (pipeline/megakernel/proof.py); 0 holds the tokens
    exactly equal. The row says why its value."""


GateSpec = Annotated[
    Union[HostGate, BuildGate, AuditGate, OperatorGate, PhaseGate, TokensGate,
          ThroughputGate, TraceGate, AccuracyGate, AbiGate],
    Field(discriminator="kind"),
]
WORKLOAD_MATRIX_KINDS = {"tokens", "throughput", "trace"}


# -------------------------------------------------------- criteria and stops


class Comparison(str, Enum):
    LT = "lt"
    LE = "le"
    EQ = "eq"
    GE = "ge"
    GT = "gt"

    def holds(self, measured: float, threshold: float) -> bool:
        return _COMPARATORS[self](measured, threshold)

    @property
    def symbol(self) -> str:
        return {"lt": "<", "le": "<=", "eq": "==", "ge": ">=", "gt": ">"}[self.value]


_COMPARATORS = {
    Comparison.LT: operator.lt, Comparison.LE: operator.le, Comparison.EQ: operator.eq,
    Comparison.GE: operator.ge, Comparison.GT: operator.gt,
}


class Criterion(_Model):
    """An acceptance criterion: `metric <comparison> threshold` in every cell."""

    id: str
    gate: str
    metric: str
    comparison: Comparison
    threshold: float
    cells: list[str] = []
    """Cells it applies to; empty means the gate-level metric; `["*"]` every cell."""
    arch: str = ""
    """Arch the measurement must come from (defaults to the row's target arch);
    a stand-in arch never satisfies it."""
    says: str = ""

    def holds(self, measured: float) -> bool:
        return self.comparison.holds(measured, self.threshold)


class StopAction(str, Enum):
    REFUSE = "refuse"
    """The bundle cannot be approved."""
    STOP_IMPLEMENTATION = "stop-implementation"
    """Implementation work the row gates on this is not admitted."""


class StopCondition(_Model):
    """A typed stop condition: when `metric <comparison> threshold`, take `action`."""

    id: str
    gate: str
    metric: str
    comparison: Comparison
    threshold: float
    cells: list[str] = []
    action: StopAction
    says: str


class Pending(_Model):
    """Something the row knows cannot run on the hardware we have, and why."""

    gate: str
    reason: str
    until: str


class Reference(_Model):
    """A performance reference: never a correctness source."""

    what: str
    value: float
    unit: str
    device: str = ""
    source: str = ""
    commit: str = ""


class ReviewPolicy(_Model):
    require_operator_attestation: bool = True
    merge_into: str = "main"
    push_authorised: Literal[False] = False
    """rowgate never pushes; a row cannot say otherwise."""


class HistoryEntry(_Model):
    """Review history that is part of the row's requirement."""

    event: str
    finding: str


class Row(_Model):
    id: Annotated[str, Field(pattern=r"^[A-Z0-9][A-Z0-9-]*$")]
    title: str
    kind: Literal["research", "kernel-pr", "parity", "demo"]
    summary: str = ""
    target: Target
    models: list[ModelRef] = []
    arms: Arms
    workload: Workload
    gates: list[GateSpec]
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
        matrix = set(self.workload.cells())
        for where, items in (("criteria", self.criteria), ("stop_conditions", self.stop_conditions),
                             ("pending", self.pending)):
            for i, item in enumerate(items):
                if item.gate not in kinds:
                    problems.append(f"{where}[{i}].gate: no gate with id {item.gate!r} "
                                    f"(gates: {', '.join(ids)})")
                    continue
                cells = getattr(item, "cells", [])
                if kinds[item.gate] in WORKLOAD_MATRIX_KINDS and cells != ["*"]:
                    for cell in cells:
                        if cell not in matrix:
                            problems.append(f"{where}[{i}].cells: {cell!r} is not a cell of the "
                                            f"workload matrix ({', '.join(sorted(matrix))})")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def gate(self, gate_id: str) -> GateSpec:
        for g in self.gates:
            if g.id == gate_id:
                return g
        raise KeyError(gate_id)

    def build_arches(self) -> list[str]:
        return self.target.build_arches or [self.target.arch]


# -------------------------------------------------------------------- loading


class LoadedRow(BaseModel):
    """A row with where it came from and the digest the bundle records."""

    model_config = ConfigDict(frozen=True)
    row: Row
    path: Path
    sha256: str


def _loc(loc: tuple) -> str:
    """Render a pydantic error location as `gates[0].commands`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in {"host", "build", "audit", "operator", "phase", "tokens", "throughput",
                      "trace", "accuracy", "abi"} and out.endswith("]"):
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
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RowError(str(path), [f"(file): cannot read: {exc.strerror}"]) from exc
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
    return LoadedRow(row=row, path=path.resolve(), sha256=hashlib.sha256(raw).hexdigest())


def resolve_row(ref: str, rows_dir: Path = ROWS_DIR) -> LoadedRow:
    """A row id (`PERF-THOR-DECODE-PARITY`) or a path to a TOML file."""
    if ref.endswith(".toml") or "/" in ref:
        return load_row(ref)
    if not re.fullmatch(r"[A-Z0-9][A-Z0-9-]*", ref):
        raise RowError(ref, [f"(argument): {ref!r} is neither a row id nor a .toml path"])
    path = rows_dir / f"{ref}.toml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in rows_dir.glob("*.toml")))
        raise RowError(ref, [f"(argument): no row {ref!r} in {rows_dir} (rows: {known})"])
    return load_row(path)


def all_rows(rows_dir: Path = ROWS_DIR) -> list[LoadedRow]:
    return [load_row(p) for p in sorted(rows_dir.glob("*.toml"))]
