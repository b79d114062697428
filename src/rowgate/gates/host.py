"""Host gate: a change to gate (the head's tree differs from its base's), a clean tree,
DCO sign-off on every commit since the base, and the row's commands run in the subject
repo."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import git
from pydantic import Field

from rowgate import sandbox
from rowgate.gates.artifacts import read_json
from rowgate.gates.interface import Derived, Gate, GateContext, GateError
from rowgate.records.status import MetricValue, Status
from rowgate.rows.spec import GateSpec
from rowgate.seal.gitrepo import SIGNED_OFF

if TYPE_CHECKING:
    from rowgate.rows.row import Row

COMMAND_TIMEOUT_S = 1800
SHOWN_ARGV = 120
"""A command line is shown (progress, reasons) cut to this many characters: a row may
pass arguments of any size, a reason is one line."""


def shown(argv: list[str]) -> str:
    line = " ".join(argv)
    return line if len(line) <= SHOWN_ARGV else f"{line[:SHOWN_ARGV]}… ({len(line)} characters)"
TREES = "trees.json"
"""The head's and the base's tree ids: equal trees are a change with nothing in it."""


class HostGate(GateSpec):
    kind: Literal["host"]
    commands: list[Annotated[list[str], Field(min_length=1)]] = []
    require_clean: bool = True
    require_dco: bool = True


class Host(Gate[HostGate]):
    kind = "host"
    spec_model = HostGate
    subject_steps = True

    def measure(self, row: Row, spec: HostGate, ctx: GateContext) -> None:
        out = ctx.artifact_dir
        subject = ctx.subject
        try:
            # the repository the subject directory is in (a monorepo's project: its root)
            with git.Repo(subject.repo) as repo:  # closing ends git's cat-file processes
                status = repo.git.status("--porcelain", "--untracked-files=all")
                commits = [{"sha": c.hexsha, "subject": c.summary, "message": c.message}
                           for c in repo.iter_commits(f"{subject.base}..{subject.commit}")]
                trees = {"commit": subject.commit, "base": subject.base,
                         "commit_tree": repo.commit(subject.commit).tree.hexsha,
                         "base_tree": repo.commit(subject.base).tree.hexsha
                         if subject.base else ""}
        except git.GitCommandError as exc:
            raise GateError(f"host gate: git failed in {ctx.repo}: {exc.stderr.strip()}") from exc
        (out / "status.txt").write_text(status + ("\n" if status else ""))
        (out / "commits.json").write_text(json.dumps(commits, indent=2) + "\n")
        (out / TREES).write_text(json.dumps(trees, indent=2) + "\n")
        with ctx.phase("commands"):
            records = [self._run(i, cmd, ctx) for i, cmd in enumerate(spec.commands)]
        (out / "commands.json").write_text(json.dumps(records, indent=2) + "\n")

    def _run(self, i: int, argv: list[str], ctx: GateContext) -> dict[str, Any]:
        """One of the row's commands, a subject step: in the sandbox, the subject's whole
        repository read-only (its commands read git), a private /tmp and $HOME."""
        ctx.progress.update(f"host: {shown(argv)}")
        log = ctx.artifact_dir / f"command-{i}.log"
        step = sandbox.Step(argv, cwd=ctx.repo, read_only=[Path(ctx.subject.repo)],
                            limits=sandbox.Limits(wall_s=COMMAND_TIMEOUT_S))
        try:
            done = ctx.run_step(step, merged=True)
        except OSError as exc:  # E2BIG (arguments beyond ARG_MAX), EACCES, ENOEXEC, …
            done = sandbox.Result(126, f"cannot run {shown(argv)}: {exc.strerror}\n".encode(), b"")
        output = done.stdout
        if done.returncode == 127:
            output += f"command not found: {argv[0][:SHOWN_ARGV]}\n".encode()
        if done.limit:
            output += f"\nstopped at its {done.limit} limit\n".encode()
        log.write_bytes(output)
        return {"argv": argv, "returncode": done.returncode, "log": log.name,
                "duration_s": round(done.duration_s, 3), "limit": done.limit}

    def derive(self, row: Row, spec: HostGate, artifact_dir: Path) -> Derived:
        try:
            status = (artifact_dir / "status.txt").read_text()
        except (OSError, ValueError) as exc:
            raise GateError(f"host gate artifacts unreadable in {artifact_dir}: {exc}") from exc
        commits = read_json(artifact_dir / "commits.json")
        commands = read_json(artifact_dir / "commands.json")
        # Bundles sealed before rowgate recorded the trees have none: the review's own
        # look at the subject's commits (decision/change.py) covers them.
        trees = read_json(artifact_dir / TREES) if (artifact_dir / TREES).is_file() else None
        dirty = [line for line in status.splitlines() if line.strip()]
        unsigned = [c for c in commits if not SIGNED_OFF.search(c["message"])]
        failed = [c for c in commands if c["returncode"] != 0]
        metrics: dict[str, MetricValue] = {"dirty_paths": len(dirty), "commits_since_base": len(commits),
                   "commits_without_signoff": len(unsigned), "commands": len(commands),
                   "commands_failed": len(failed)}
        if trees is not None:
            metrics["changed"] = int(trees["commit_tree"] != trees["base_tree"])
        problems = []
        if trees is not None and not metrics["changed"]:  # the SM70 PR's head: nothing to gate
            problems.append(f"no change to gate: head {trees['commit'][:12]} has the tree of "
                            f"its base {trees['base'][:12]} ({trees['commit_tree'][:12]})")
        if spec.require_clean and dirty:
            problems.append(f"working tree not clean: {len(dirty)} path(s), first {dirty[0].strip()!r}")
        if spec.require_dco and unsigned:
            c = unsigned[0]
            problems.append(f"{len(unsigned)} commit(s) without DCO Signed-off-by, first "
                            f"{c['sha'][:12]} {c['subject']!r}")
        if failed:
            c = failed[0]
            problems.append(f"command {shown(c['argv'])!r} exited {c['returncode']} "
                            f"(log: {c['log']}{_said(artifact_dir / c['log'], c['returncode'])})")
        if problems:
            return Derived(Status.FAIL, "; ".join(problems), metrics)
        return Derived(Status.PASS, f"clean tree, {len(commits)} commit(s) signed off, "
                                    f"{len(commands)} command(s) passed", metrics)


def _said(log: Path, returncode: int) -> str:
    """For a command that could not start (126), the log's one line says why."""
    if returncode != 126:
        return ""
    try:
        return ": " + log.read_text(errors="replace").strip().splitlines()[0][-200:]
    except (OSError, IndexError):
        return ""
