"""`REVIEWS/ROW/merges/STAMP-HEAD.merge.json`: what `rowgate merge` did, and why."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict

from rowgate.records.identity import SignerIdentity


class MergeOutcome(str, Enum):
    MERGED = "merged"
    ALREADY_MERGED = "already-merged"
    REFUSED = "refused"


class MergeRecord(BaseModel):
    """What `rowgate merge` did, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    rowgate_version: str
    created: str
    row_id: str
    outcome: MergeOutcome
    message: str
    """The one line printed."""
    precondition: str = ""
    """Name of the precondition that refused (`clean-tree`, `review`, …)."""
    repo: str
    branch: str
    head: str
    into: str
    into_before: str
    into_after: str = ""
    merge_commit: str = ""
    merged_tree: str = ""
    bundle_id: str = ""
    review_file: str = ""
    review_sha256: str = ""
    merger: SignerIdentity
