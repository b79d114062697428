"""The names that become path components: row ids and bundle ids, one pattern each."""

from __future__ import annotations

ROW_ID = r"^[A-Z0-9][A-Z0-9-]*$"
"""A row id (`PERF-THOR-DECODE-PARITY`): the row file's stem and the evidence and
review directories' name."""
BUNDLE_ID_LEN = 16
BUNDLE_ID = rf"^[0-9a-f]{{{BUNDLE_ID_LEN}}}$"
"""A bundle id: the first 16 hex digits of its manifest's sha256."""
