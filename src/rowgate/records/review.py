"""`REVIEWS/ROW/BUNDLE-ID.review.json`: the signed decision on one bundle, and its parts."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import Field

from rowgate.records.base import Model
from rowgate.records.criteria import Comparison, StopAction
from rowgate.records.identity import SignerIdentity
from rowgate.records.provenance import Subject
from rowgate.records.status import MetricValue, Status

REVIEW_SUFFIX = ".review.json"


class Verdict(str, Enum):
    APPROVE = "APPROVE"
    REJECT = "REJECT"
    PENDING = "PENDING"


class Outcome(str, Enum):
    """What one criterion came to."""

    PASS = "pass"
    FAIL = "fail"
    PENDING = "pending"
    """Its gate could not run here."""
    NOT_SATISFIABLE = "not satisfiable here"
    """Measured on a stand-in or another arch: says nothing about the target arch."""
    MISSING = "missing"
    """The gate ran but did not produce the metric or cell the criterion names."""
    ERROR = "error"


class BundleVerifierRef(Model):
    """How the reviewer verified the bundle, so merge and attestation can do it again."""

    kind: Literal["key", "sigstore"]
    public_key_pem: str = ""
    identity: str = ""
    issuer: str = ""


class BundleRef(Model):
    id: str
    path: str
    """Where the reviewer had the bundle (absolute)."""
    signer: SignerIdentity | None = None
    verifier: BundleVerifierRef | None = None
    status: Status | None = None
    created: str = ""


class Freshness(Model):
    branch_head: str = ""
    """Head of the subject's branch in the reviewer's clone when reviewed."""
    merge_base: str = ""
    row_sha256: str = ""
    """Digest of the row file the review was made against."""
    moved: list[str] = Field(default_factory=list)
    """What moved since the bundle was sealed; empty when fresh."""
    already_present: str = ""
    """`already present in <branch>: …` when merging the head into the row's merge target
    changes nothing (the merge then records it as merged, with no merge commit)."""


class GateCheck(Model):
    gate_id: str
    kind: str
    status: Status
    reason: str
    required: bool
    arch: str = ""
    stand_in: bool = False
    rederived: Literal["consistent", "inconsistent", "not re-derivable"]
    detail: str = ""


class CriterionRow(Model):
    """One row of the per-criterion table."""

    id: str
    gate: str
    metric: str
    comparison: Comparison
    threshold: float
    cells: list[str]
    arch: str
    """Arch the measurement must come from."""
    measured: dict[str, MetricValue]
    """Measured value per cell (`(gate)` for the gate-level metric)."""
    outcome: Outcome
    detail: str = ""


class StopRow(Model):
    id: str
    gate: str
    metric: str
    comparison: Comparison
    threshold: float
    cells: list[str]
    action: StopAction
    says: str
    measured: dict[str, MetricValue]
    triggered: bool | None
    """None when it could not be evaluated (gate PENDING/ERROR, metric missing)."""
    detail: str = ""


class Admission(Model):
    """Whether implementation work gated on `gate` is admitted."""

    gate: str
    admitted: bool | None
    reason: str
    dependents: list[str]
    """Row gates that exist only if admitted (an `abi` gate's `admitted_by`)."""


class PendingItem(Model):
    gate: str
    reason: str
    until: str = ""


class ReviewRecord(Model):
    """`REVIEWS/ROW/BUNDLE-ID.review.json`: the signed decision on one bundle."""

    schema_version: Literal[1] = 1
    rowgate_version: str
    created: str
    verdict: Verdict
    summary: str
    """One line: the verdict and its first reason."""
    reasons: list[str]
    """Every reason for REJECT or PENDING, in the order found."""
    row_id: str
    bundle: BundleRef
    subject: Subject | None = None
    reviewer: SignerIdentity
    freshness: Freshness | None = None
    gates: list[GateCheck] = Field(default_factory=list)
    criteria: list[CriterionRow] = Field(default_factory=list)
    stop_conditions: list[StopRow] = Field(default_factory=list)
    implementation: list[Admission] = Field(default_factory=list)
    pending: list[PendingItem] = Field(default_factory=list)
