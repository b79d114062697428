"""`manifest.json`: what a bundle is evidence of, and every file's digest."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.records.base import Model
from pipeline.records.identity import SignerIdentity
from pipeline.records.provenance import Provenance, Subject
from pipeline.records.status import Status


class FileDigest(Model):
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class RowRef(Model):
    id: str
    file: str
    """Row file path, relative to the rowgate checkout that ran the gate."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class GateSummary(Model):
    gate_id: str
    kind: str
    status: Status
    reason: str
    file: str


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
    files: dict[str, FileDigest]
    """Every file of the bundle except manifest.json and the signature."""
