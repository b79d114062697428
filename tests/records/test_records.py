"""The records layer on its own: canonical bytes, the checked chain every signed
document is read through, and the patterns that become path components."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from rowgate.errors import VerificationError
from rowgate.records.canonical import canonical_json, strict_loads
from rowgate.records.gate_result import GateResult
from rowgate.records.ids import ARTIFACT_PATH, BUNDLE_FILE, BUNDLE_ID, GATE_ID, ROW_ID
from rowgate.records.schema import SCHEMAS_DIR, load_checked
from rowgate.records.status import Status


def test_canonical_json_is_sorted_indented_utf8_with_a_final_newline():
    assert canonical_json({"b": 1, "a": "é"}) == '{\n  "a": "é",\n  "b": 1\n}\n'.encode()


def test_the_schemas_dir_is_the_checkouts():
    assert (SCHEMAS_DIR / "gate-result.schema.json").is_file()


def _result(**changes) -> bytes:
    doc = {"gate_id": "host", "kind": "host", "status": "PASS", "reason": "ok", **changes}
    return canonical_json(doc)


def test_load_checked_gives_the_model():
    result = load_checked(GateResult, "gate-result", _result(), "gates/host.json")
    assert (result.gate_id, result.status) == ("host", Status.PASS)


@pytest.mark.parametrize(("data", "message"), [
    (b"{", r"^gates/host.json: not JSON"),
    (_result(status="MAYBE"), r"^gates/host.json: schema gate-result: status: 'MAYBE' is not "),
    (_result(extra=1), r"^gates/host.json: schema gate-result: \(top level\): Additional "),
    (b'{"gate_id": "host", "status": "FAIL", "status": "PASS"}',
     r"^gates/host.json: duplicate key 'status'$"),
    (b'{"metrics": {"a": {"b": 1, "b": 2}}}', r"^gates/host.json: duplicate key 'b'$"),
    (b'{"x": NaN}', r"^gates/host.json: not JSON"),
    (_result(artifacts=["artifacts/other/x"]), r"^gates/host.json: .*not under artifacts/host/"),
])
def test_each_failure_is_one_line_naming_the_file(data, message):
    with pytest.raises(VerificationError, match=message) as exc:
        load_checked(GateResult, "gate-result", data, "gates/host.json")
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(("pattern", "good", "bad"), [
    (ROW_ID, ["DEMO-CPU-DECODE", "A1"], ["demo", "-A", "A_B", "A\n", ""]),
    (BUNDLE_ID, ["0123456789abcdef"], ["0123456789ABCDEF", "0123456789abcde", "../x"]),
    (GATE_ID, ["host", "tokens-2"], ["Host", "../x", "/abs", "h\u043est", ""]),
    (ARTIFACT_PATH, ["artifacts/host/x.log", "artifacts/b/sm_90/k/.keep", "artifacts/h/..x"],
     ["artifacts/host/../x", "artifacts/host/./x", "artifacts/host//x", "artifacts/host/",
      "/artifacts/host/x", "artifacts/Host/x", "artifacts/host/x\x00", "gates/host.json"]),
    (BUNDLE_FILE, ["gates/host.json", "artifacts/host/x"], ["manifest.json", "gates/../x.json",
                                                             "gates/sub/x.json", "../x"]),
])
def test_id_patterns(pattern, good, bad):
    assert all(re.fullmatch(pattern, g) for g in good)
    assert not any(re.fullmatch(pattern, b) for b in bad)


def test_strict_loads_reads_what_json_reads_when_every_key_is_said_once():
    assert strict_loads(b'{"a": [1, {"b": null}]}', "x") == {"a": [1, {"b": None}]}
    with pytest.raises(VerificationError, match="^x: duplicate key 'a'$"):
        strict_loads('[{"a": 1, "a": 1}]', "x")


def _formats(node: object) -> list[str]:
    if isinstance(node, dict):
        own = [node["format"]] if isinstance(node.get("format"), str) else []
        return own + [f for v in node.values() for f in _formats(v)]
    if isinstance(node, list):
        return [f for v in node for f in _formats(v)]
    return []


def test_no_schema_declares_a_format():
    """What lets rowgate import jsonschema without its optional format checkers."""
    found = {p.name: _formats(json.loads(p.read_text()))
             for p in SCHEMAS_DIR.glob("*.schema.json")}
    assert found and not any(found.values()), found


def test_the_iri_format_grammars_are_not_compiled_in_a_rowgate_process():
    """rfc3987-syntax compiles 39 lark grammars when imported (seconds per process): it
    stays unloaded while rowgate imports jsonschema, and importable afterwards."""
    pytest.importorskip("rfc3987_syntax")
    code = ("import sys, rowgate.records.schema\n"
            "assert 'rfc3987_syntax' not in sys.modules, 'loaded'\n"
            "import rfc3987_syntax\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
