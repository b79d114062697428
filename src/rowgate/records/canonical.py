"""The one byte form of sealed JSON (sorted keys, two-space indent, UTF-8, a final
newline: digests and signatures are over these bytes), and the one strict way to read
JSON that is sealed, signed or recorded."""

from __future__ import annotations

import json
from typing import Any

from rowgate.errors import VerificationError


def canonical_json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


class DuplicateKey(ValueError):
    """A JSON object says one key twice."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_loads(data: bytes | str, where: str) -> Any:
    """JSON whose every object says each key once (two parsers could read `"status":
    "FAIL", "status": "PASS"` two ways: the signed bytes must mean one thing), without
    NaN/Infinity. Raises VerificationError naming `where`."""
    try:
        return json.loads(data, object_pairs_hook=_unique, parse_constant=_no_constant)
    except DuplicateKey as exc:
        raise VerificationError(f"{where}: duplicate key {str(exc)!r}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise VerificationError(f"{where}: not JSON ({exc})") from exc
