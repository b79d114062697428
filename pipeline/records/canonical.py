"""The one byte form of sealed JSON: sorted keys, two-space indent, UTF-8, a final
newline. Digests and signatures are over these bytes."""

from __future__ import annotations

import json
from typing import Any


def canonical_json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
