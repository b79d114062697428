"""`manifest.json`: what a bundle is evidence of, and every file's digest."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from rowgate.records.base import Model
from rowgate.records.identity import SignerIdentity
from rowgate.records.ids import BUNDLE_FILE, GATE_FILE, GATE_ID, ROW_ID
from rowgate.records.provenance import Provenance, Subject
from rowgate.records.status import Status


class FileDigest(Model):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class RowRef(Model):
    id: str = Field(pattern=ROW_ID)
    file: str
    """Row file path, relative to the rowgate checkout that ran the gate."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class GateSummary(Model):
    gate_id: str = Field(pattern=GATE_ID)
    kind: str
    status: Status
    reason: str
    file: str = Field(pattern=GATE_FILE)
    """Always `gates/GATE-ID.json`."""
    required: bool = True
    """False for an informational gate (`required = false` in the row): shown as such
    everywhere, and its status does not count in the bundle's."""

    @model_validator(mode="after")
    def _file_is_the_gates(self) -> GateSummary:
        if self.file != f"gates/{self.gate_id}.json":
            raise ValueError(f"gate {self.gate_id}: file {self.file!r} is not "
                             f"gates/{self.gate_id}.json")
        return self


class Manifest(Model):
    """`manifest.json`: what the bundle is evidence of, and every file's digest."""

    schema_version: Literal[1] = 1
    rowgate_version: str
    created: str
    """UTC time of sealing, ISO 8601."""
    run_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    """Random per run: two runs never seal the same manifest, even within one second
    over identical artifacts, so a re-run always makes a new bundle."""
    row: RowRef
    subject: Subject
    provenance: Provenance
    signer: SignerIdentity
    """Identity the signature must verify as."""
    status: Status
    """Overall, over the row's required gates: FAIL if any FAILed or ERRORed, else
    PENDING if any is, else PASS. Informational gates (`required = false`) are listed
    in `gates` with their own status and do not count (the review treats them the
    same way): a noisy informational A/B cannot turn a bundle FAIL."""
    gates: list[GateSummary]
    files: dict[Annotated[str, Field(pattern=BUNDLE_FILE)], FileDigest] = Field(
        json_schema_extra={"additionalProperties": False})
    """Every file of the bundle except manifest.json and the signature."""

    @model_validator(mode="after")
    def _gates_once(self) -> Manifest:
        ids = [g.gate_id for g in self.gates]
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"gates: gate {twice[0]} is listed more than once")
        return self

    def informational(self) -> list[str]:
        """The gates whose status does not count: as sealed (`required`); a manifest
        sealed before it said so names none, so there a FAIL or ERROR the bundle's status
        did not count is informational (only required gates make a bundle FAIL)."""
        counted_fail = self.status in (Status.FAIL, Status.ERROR)
        return [g.gate_id for g in self.gates
                if ("required" in g.model_fields_set and not g.required)
                or ("required" not in g.model_fields_set and not counted_fail
                    and g.status in (Status.FAIL, Status.ERROR))]
