"""JSON Schemas generated from the pydantic models, checked in under schemas/,
and validation against them (jsonschema, Draft 2020-12)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import BaseModel, ValidationError

from pipeline import CHECKOUT
from pipeline.errors import VerificationError

SCHEMAS_DIR = CHECKOUT / "schemas"


def _models() -> dict[str, type[BaseModel]]:
    # Imported here: evidence and review import this module.
    from pipeline.evidence import Manifest
    from pipeline.gates.interface import GateResult
    from pipeline.merge import MergeRecord
    from pipeline.review import Attestation, ReviewRecord
    from pipeline.rows import Row

    return {"manifest": Manifest, "gate-result": GateResult, "row": Row, "review": ReviewRecord,
            "attestation": Attestation, "merge": MergeRecord}


def generate() -> dict[str, dict[str, Any]]:
    out = {}
    for name, model in _models().items():
        schema = model.model_json_schema()
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://rowgate.dev/schemas/{name}.schema.json"
        out[name] = schema
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_all(directory: Path = SCHEMAS_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in generate().items():
        path = directory / f"{name}.schema.json"
        path.write_text(render(schema))
        written.append(path)
    return written


def drift(directory: Path = SCHEMAS_DIR) -> list[str]:
    """Names of the checked-in schemas that are missing or differ from the models."""
    return [name for name, schema in generate().items()
            if not (directory / f"{name}.schema.json").is_file()
            or (directory / f"{name}.schema.json").read_text() != render(schema)]


@cache
def load(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS_DIR / f"{name}.schema.json").read_text())


def load_checked(model: type, name: str, data: bytes, where: str):
    """JSON bytes -> `model`, checked against schema `name` first: the one chain every
    signed document rowgate reads goes through (manifests, review and attestation
    records). Each failure is one VerificationError line naming `where`."""
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise VerificationError(f"{where}: not JSON ({exc})") from exc
    validate(name, raw, where)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise VerificationError(f"{where}: {exc.errors()[0]['msg']}") from exc


def validate(name: str, instance: Any, where: str) -> None:
    """Validate against the checked-in schema; the first error names file and key."""
    validator = jsonschema.Draft202012Validator(load(name))
    error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
    if error is not None:
        path = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        raise VerificationError(f"{where}: schema {name}: {path}: {error.message}")
