"""`rowgate schemas`: the JSON Schemas of every sealed or signed document, generated from
the pydantic models and shipped as package data (src/rowgate/schemas/).

The one module that knows every record model (and the row model): validation against
the checked-in files is `rowgate.records.schema`, which knows none of them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import BaseModel, Field, create_model

from rowgate import plugins
from rowgate.records.attestation import Attestation
from rowgate.records.gate_result import GateResult
from rowgate.records.manifest import Manifest
from rowgate.records.merge import MergeRecord
from rowgate.records.review import ReviewRecord
from rowgate.records.schema import SCHEMAS_DIR
from rowgate.rows.row import Row


def row_model() -> type[BaseModel]:
    """The row with its [[gates]] tables as the union of rowgate's own kinds' spec models
    (a plugin's kinds validate through the registry but are not in rowgate's schema)."""
    from rowgate.gates import registry

    specs = tuple(g.spec_model for k in plugins.own(plugins.GATES) if (g := registry.lookup(k)))
    table = Annotated[Union[specs], Field(discriminator="kind")]  # type: ignore[valid-type]
    model: type[BaseModel] = create_model("Row", __base__=Row, gates=(list[table], ...))
    return model


def _models() -> dict[str, type[BaseModel]]:
    return {"manifest": Manifest, "gate-result": GateResult, "row": row_model(),
            "review": ReviewRecord, "attestation": Attestation, "merge": MergeRecord}


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


def write_all(directory: Path) -> list[Path]:
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
