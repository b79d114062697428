"""The names and paths that become path components, one pattern each: row ids, gate
ids, bundle ids, and the paths of a bundle's files. A manifest or gate result whose
names do not match is refused before any of them is opened (docs/security.md)."""

from __future__ import annotations

ROW_ID = r"^[A-Z0-9][A-Z0-9-]*$"
"""A row id (`PERF-THOR-DECODE-PARITY`): the row file's stem and the evidence and
review directories' name."""
GATE_ID = r"^[a-z0-9][a-z0-9-]*$"
"""A gate id in a row: the name of its result file and artifact directory."""
BUNDLE_ID_LEN = 16
BUNDLE_ID = rf"^[0-9a-f]{{{BUNDLE_ID_LEN}}}$"
"""A bundle id: the first 16 hex digits of its manifest's sha256."""
_C = r"[^/\x00-\x1f\x7f]"
_COMPONENT = rf"(?:[^/.\x00-\x1f\x7f]{_C}*|\.[^/.\x00-\x1f\x7f]{_C}*|\.\.{_C}+)"
"""One path component: not empty, not `.` or `..`, no `/` and no control character."""
GATE_FILE = r"^gates/[a-z0-9][a-z0-9-]*\.json$"
"""Where a gate's result is sealed: `gates/GATE-ID.json`."""
ARTIFACT_PATH = rf"^artifacts/[a-z0-9][a-z0-9-]*(?:/{_COMPONENT})+$"
"""A raw artifact: relative, normalised, under `artifacts/GATE-ID/`."""
BUNDLE_FILE = rf"^(?:gates/[a-z0-9][a-z0-9-]*\.json|artifacts/[a-z0-9][a-z0-9-]*(?:/{_COMPONENT})+)$"
"""Any file a manifest lists: a gate result or an artifact."""
