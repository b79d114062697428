"""`REVIEWS/ROW/BUNDLE-ID.attestation.json`: the operator's signed statement."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rowgate.records.base import Model
from rowgate.records.identity import SignerIdentity
from rowgate.records.provenance import Gpu, Host

ATTESTATION_SUFFIX = ".attestation.json"


class Hardware(Model):
    host: Host
    gpus: list[Gpu]


class Attestation(Model):
    """`REVIEWS/ROW/BUNDLE-ID.attestation.json`: the operator's signed statement."""

    schema_version: Literal[1] = 1
    rowgate_version: str
    created: str
    row_id: str
    bundle_id: str
    review_file: str
    review_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    operator: SignerIdentity
    statement: str
    hardware: Hardware
    note: str = ""
