"""`rowgate gate`: provenance, each gate in order, then seal and sign.

The runner never measures (gates do) and never signs by itself (the sealer
does, with the signer it is given).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline import CHECKOUT, gates, provenance
from pipeline.evidence import Bundle, Stage, overall_status
from pipeline.gates.interface import GateContext, GateResult, Progress, Status
from pipeline.rows import LoadedRow
from pipeline.signing import Signer


@dataclass(frozen=True)
class GateRun:
    bundle: Path
    results: list[GateResult]

    @property
    def status(self) -> Status:
        return overall_status([r.status for r in self.results])


def row_file_ref(loaded: LoadedRow) -> str:
    """The row path as recorded: relative to the rowgate checkout when inside it."""
    try:
        return loaded.path.relative_to(CHECKOUT).as_posix()
    except ValueError:
        return loaded.path.as_posix()


def run_row(loaded: LoadedRow, repo: Path, out_dir: Path, signer: Signer, progress: Progress,
            base: str | None = None, options: dict[str, str] | None = None) -> GateRun:
    row = loaded.row
    subject = provenance.subject(repo, base, row.review.merge_into)
    prov = provenance.collect()
    stage = Stage(out_dir, row.id)
    try:
        for spec in row.gates:
            progress.update(f"gate {spec.id} ({spec.kind})")
            ctx = GateContext(repo=Path(subject.repo), artifact_dir=stage.artifact_dir(spec.id),
                              subject=subject, provenance=prov, progress=progress,
                              options=dict(options or {}))
            stage.add_result(gates.run(row, spec, ctx, stage.root))
            progress.advance()
        progress.update("sealing and signing")
        bundle = stage.seal(row=loaded, row_file=row_file_ref(loaded), subject=subject,
                            provenance=prov, signer=signer, order=[g.id for g in row.gates])
    except BaseException:
        stage.discard()
        raise
    # Self-check before reporting: what we print must be what `rowgate verify` accepts.
    sealed = Bundle.open(bundle)
    sealed.verify(signer.verifier())
    return GateRun(bundle=bundle, results=sealed.results())
