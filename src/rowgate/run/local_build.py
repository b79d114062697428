"""`rowgate build --arch`: build and audit a checkout's kernels/ outside a bundle, with
the build and audit gates' own measure and derive, and combine their statuses."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from rowgate import storage
from rowgate.cuda import cache, kernels, toolchains
from rowgate.errors import Error, UsageError
from rowgate.gates.audit import derive_audit, measure_audit
from rowgate.gates.build import derive_builds, measure_aot
from rowgate.gates.interface import Derived, Progress
from rowgate.records.status import Status, overall_status


@dataclass(frozen=True)
class LocalBuild:
    """What `rowgate build --arch` found: the build and audit verdicts, and where."""

    build: Derived
    audit: Derived
    out: Path

    @property
    def status(self) -> Status:
        """Combined as a bundle's gates are: FAIL if either is FAIL or ERROR, else
        PENDING if either is, else PASS."""
        return overall_status((self.build.status, self.audit.status))


def _toolchains(arches: list[str], options: dict[str, str]) -> None:
    """Every arch's toolchain, or UsageError (exit 2): a toolchain not installed is this
    machine's configuration to fix (the message says how), not a result to report."""
    for arch in arches:
        try:
            toolchains.for_options(arch, options)
        except Error as exc:
            raise UsageError(f"rowgate build --arch {arch}: no toolchain: "
                             f"{exc.diagnostics()}") from exc


def local_build(repo: Path, arches: list[str], names: list[str], options: dict[str, str],
                progress: Progress, aot: bool = False) -> LocalBuild:
    """Build and audit outside a bundle into the cache's reports/SUBJECT/ARCHES/
    (replaced each run; the build cache makes an unchanged re-run instant), never into
    the subject. Raises GateError."""
    _toolchains(arches, options)
    out = cache.reports(repo, arches)
    try:
        with storage.writing("the build was not written", out):
            kernels.load(repo)  # a subject kernels.toml refused is the user's to fix: exit 2
            if out.exists():
                shutil.rmtree(out)
            out.mkdir(parents=True)
            measure_audit(repo, arches, names, options, out, progress)
            if aot:
                measure_aot(arches, out, progress)
    except BaseException:
        # A report half-written (a full disk, a kill) is no report: the next run would
        # read it. The directory is replaced every run, so nothing older is lost.
        shutil.rmtree(out, ignore_errors=True)
        raise
    return LocalBuild(derive_builds(out), derive_audit(out), out)
