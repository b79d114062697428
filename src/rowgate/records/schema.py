"""Validation against the checked-in JSON Schemas (jsonschema, Draft 2020-12), and the
one checked chain every signed document rowgate reads goes through.

The schemas are generated from the record models by `rowgate.cli.schemas`
(`rowgate schemas`) and checked in under schemas/ beside the package.
"""

from __future__ import annotations

import json
import sys
from functools import cache
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

# jsonschema registers its optional format checkers when it is imported. The "iri" one's
# package, rfc3987-syntax (installed by others' `jsonschema[format-nongpl]`, jupyter's for
# one), compiles 39 lark grammars at import: about 2.6 s in every rowgate process.
# rowgate checks no formats (its schemas declare none and it passes no FormatChecker),
# so that package is kept from loading while jsonschema imports, and importable after.
_UNUSED_FORMATS = "rfc3987_syntax"
_hide = _UNUSED_FORMATS not in sys.modules
if _hide:
    sys.modules[_UNUSED_FORMATS] = None  # type: ignore[assignment]
try:
    import jsonschema
finally:
    if _hide:
        del sys.modules[_UNUSED_FORMATS]

from rowgate import dirs  # noqa: E402
from rowgate.errors import VerificationError  # noqa: E402
from rowgate.records.canonical import strict_loads  # noqa: E402

SCHEMAS_DIR = dirs.schemas_dir()
"""The JSON Schemas shipped as package data (`rowgate schemas` regenerates them)."""

M = TypeVar("M", bound=BaseModel)


@cache
def load(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMAS_DIR / f"{name}.schema.json").read_text())
    return schema


def load_checked(model: type[M], name: str, data: bytes, where: str) -> M:
    """JSON bytes -> `model`, checked against schema `name` first: the one chain every
    signed document rowgate reads goes through (manifests, review and attestation
    records). Each failure is one VerificationError line naming `where`."""
    raw = strict_loads(data, where)
    validate(name, raw, where)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise VerificationError(f"{where}: {loc}: {err['msg']}") from exc


def validate(name: str, instance: Any, where: str) -> None:
    """Validate against the checked-in schema; the first error names file and key."""
    validator = jsonschema.Draft202012Validator(load(name))
    error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    if error is not None:
        path = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        raise VerificationError(f"{where}: schema {name}: {path}: {error.message}")
