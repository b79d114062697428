"""The parts of a row that gates, engines and workloads read: target, arms, models,
workload, the base of every gate spec, criteria and stop conditions.

Below `rowgate.gates` so that a gate module can type its spec and read the row's
parts without importing `rowgate.rows.row` (which reads the gate registry to validate a
row's gate tables). Every table forbids unknown keys.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Annotated, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rowgate import plugins
from rowgate.records.criteria import Comparison, StopAction
from rowgate.records.ids import GATE_ID
from rowgate.rows.datasets import RANDOM as RANDOM_DATASET
from rowgate.rows.datasets import DatasetRef

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
    """rowgate's own engines (entry points of group `rowgate.engines`); a row may name
    any installed engine."""

    VLLM = "vllm"
    OPENAI = "openai"
    REFERENCE = "reference"
    LLAMA_CPP = "llama.cpp"


MAIN_ARMS = ("oracle", "candidate")


class Arm(_Model):
    """One side of an A/B: an engine, pinned."""

    engine: Annotated[str, Field(min_length=1)]
    """An installed engine's name (`rowgate.engines` entry points): vllm, openai,
    llama.cpp, reference, or a plugin's."""
    name: Annotated[str, Field(pattern=r"^([a-z0-9][a-z0-9-]*)?$")] = ""
    """What gates call this arm (a fallback's `baseline`, a trace gate's `arms`), e.g.
    `accepted`; `oracle` and `candidate` are the two main arms' names."""
    version: str = ""
    """Exact version the arm is pinned to (required for an oracle)."""
    commit: str = ""
    command: list[str] = []
    """Command that starts an OpenAI-compatible server (engines `openai`, `llama.cpp`):
    `{port}` (rowgate's choice of a loopback port) or `{socket}` (a Unix socket path the
    server listens on itself: no relay into the sandbox), one of them required, and
    `{model}`, `{subject}` (the subject checkout, also the server's working directory)
    are filled in."""
    mode: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")] = "default"
    """How the engine runs (each engine says which modes it has; reference: eager,
    graph, default)."""

    @field_validator("engine")
    @classmethod
    def _installed(cls, engine: str) -> str:
        if plugins.load(plugins.ENGINES, engine) is None:
            raise ValueError(plugins.unknown(plugins.ENGINES, engine, "engine"))
        return engine
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
        names = [a.name for a in self.fallbacks if a.name]
        for dup in sorted({n for n in names if names.count(n) > 1 or n in MAIN_ARMS}):
            raise ValueError(f"fallbacks: the arm name {dup!r} is used twice")
        for role, arm in (("oracle", self.oracle), ("candidate", self.candidate),
                          *((f"fallbacks[{i}]", a) for i, a in enumerate(self.fallbacks))):
            if arm.command and not any("{port}" in a or "{socket}" in a for a in arm.command):
                raise ValueError(f"{role}.command: no {{port}} or {{socket}}: rowgate chooses "
                                 f"where the server listens (a fixed port collides and waits "
                                 f"out the start timeout)")
        return self

    def named(self) -> dict[str, "Arm"]:
        """Every arm by the name gates use: `oracle`, `candidate`, then each fallback by
        its `name` (a fallback without one by its mode, as rows named baselines first)."""
        out = {"oracle": self.oracle, "candidate": self.candidate}
        for arm in self.fallbacks:
            out.setdefault(arm.name or arm.mode, arm)
        return out


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
    """The identical workload both arms run; its digest must match across arms.
    `dataset`: `random-token-ids`, or a pinned local prompt file (`rowgate.rows.datasets`)."""

    input_lens: list[Annotated[int, Field(gt=0)]]
    concurrency: list[Annotated[int, Field(gt=0)]]
    output_len: Annotated[int, Field(gt=0)]
    requests_per_cell: Annotated[int, Field(gt=0)] = 8
    sampling: Sampling = Sampling()
    seeds: list[int] = [0]
    # cast: rowgate.rows.datasets declares RANDOM a plain str (this literal is its value)
    dataset: Literal["random-token-ids"] | DatasetRef = cast(Literal["random-token-ids"],
                                                             RANDOM_DATASET)
    prefix_caching: bool = False

    def cells(self, models: list[str] | tuple[str, ...] = ()) -> list[str]:
        """Matrix cell names, `i<input_len>-c<concurrency>`, each prefixed `<model id>/`
        when the row has more than one model (`cell_prefix`)."""
        prefixes = [cell_prefix(m, models) for m in models] or [""]
        return [f"{p}i{i}-c{c}" for p in prefixes for i in self.input_lens
                for c in self.concurrency]


def cell_prefix(model_id: str, models: list[str] | tuple[str, ...]) -> str:
    """What starts a model's cell names: nothing in a one-model row (its cells, records
    and criteria keep their names), `<model id>/` when the row gates several."""
    return f"{model_id}/" if len(models) > 1 else ""


# ---------------------------------------------------------------------- gates


class GateSpec(_Model):
    """What every [[gates]] table has; each kind's spec model (beside its gate, in
    `rowgate/gates/KIND.py` or a plugin's module) adds its own keys and a `kind` literal."""

    if TYPE_CHECKING:
        # Each kind's model declares its own `kind` field (a Literal); declared here for
        # the type checker alone, so pydantic's fields and the row schema stay the kinds'.
        kind: str

    id: Annotated[str, Field(pattern=GATE_ID)]
    description: str = ""
    required: bool = True
    """A required gate that is not PASS blocks the merge."""
    device: str = ""
    """Device selector for this gate alone (e.g. `name:H100`); default the row's."""


class Tolerance(_Model):
    rtol: Annotated[float, Field(ge=0)] = 1e-2
    atol: Annotated[float, Field(ge=0)] = 1e-2



# -------------------------------------------------------- criteria and stops


class Criterion(_Model):
    """An acceptance criterion: `metric <comparison> threshold` in every cell."""

    id: str
    gate: str
    metric: str
    comparison: Comparison
    threshold: float
    cells: list[str] = []
    """Cells it applies to; empty means the gate-level metric; `["*"]` every cell."""
    models: list[str] = []
    """Model ids whose cells it applies to (with `cells`: those cells of those models;
    with `["*"]`: every cell of those models); empty means every model's."""
    arch: str = ""
    """Arch the measurement must come from (defaults to the row's target arch);
    a stand-in arch never satisfies it."""
    says: str = ""

    def holds(self, measured: float) -> bool:
        return self.comparison.holds(measured, self.threshold)


class StopCondition(_Model):
    """A typed stop condition: when `metric <comparison> threshold`, take `action`."""

    id: str
    gate: str
    metric: str
    comparison: Comparison
    threshold: float
    cells: list[str] = []
    models: list[str] = []
    """As a criterion's: the models whose cells it looks at."""
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
    allow_unconfined: bool = False
    """Whether the review may approve a bundle whose subject steps ran unconfined
    (`[sandbox] mode = "off"`)."""


class SandboxPolicy(_Model):
    """How the row's subject steps run: in bubblewrap (the default) or, with a written
    reason, unconfined (the bundle then says UNCONFINED)."""

    mode: Literal["bubblewrap", "off"] = "bubblewrap"
    reason: str = ""
    """Why the sandbox is off: required with `mode = "off"`."""

    @model_validator(mode="after")
    def _reason(self) -> "SandboxPolicy":
        if self.mode == "off" and not self.reason.strip():
            raise ValueError("sandbox.reason: turning the sandbox off needs a written reason")
        return self

    @property
    def confined(self) -> bool:
        return self.mode != "off"


class RowBudget(_Model):
    """`[budget]`: the wall time one `rowgate gate` run of the row may take. Gates plan
    inside what is left when they start (a throughput cell's time budget shrinks to its
    share, and a cell that runs out stops underpowered with the rounds it needed); a
    gate that finds nothing left is not run: ERROR naming the budget and the gates that
    spent it, never an overrun."""

    wall_s: Annotated[float, Field(gt=0)]
    """Seconds for the whole run, from the first gate to the last (sealing excluded)."""


class HistoryEntry(_Model):
    """Review history that is part of the row's requirement."""

    event: str
    finding: str
