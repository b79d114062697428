"""The runner workflows: actionlint, rowgate's policy for them, and the commands they run.

actionlint checks syntax, expressions, contexts and action inputs. The policy
schema (jsonschema, Draft 2020-12) checks what rowgate relies on and actionlint
cannot know: self-hosted GPU runners, keyless signing permission, one
concurrency group per device, the bundle uploaded, the review verifying the
gate workflow's identity. The cross-checks tie the workflows to the noxfile's
gate sessions and to the rows' launchers, and parse every `rowgate` command
line in them with rowgate's own argument parser.
"""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from rowgate.cli.main import _parser
from rowgate.rows import row as rows

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
TARGETS = {"sm70", "sm90", "thor"}
GATE_IDENTITY = "https://github.com/${{ github.repository }}/.github/workflows/gate.yml@refs/heads/main"
ISSUER = "https://token.actions.githubusercontent.com"


def _load(name: str) -> dict:
    doc = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as the boolean True.
    doc["on"] = doc.pop(True, doc.get("on"))
    return doc


def _actionlint() -> str:
    found = shutil.which("actionlint") or shutil.which("actionlint", path=str(Path(sys.executable).parent))
    if not found:
        pytest.skip("actionlint is not installed (pip install '.[test]' brings it)")
    return found


def test_actionlint_finds_nothing():
    run = subprocess.run([_actionlint(), "-no-color"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout == ""


def test_actionlint_would_catch_a_broken_workflow(tmp_path):
    """The linter really runs on our files: a bad expression in a copy is reported."""
    (tmp_path / ".github").mkdir()
    shutil.copytree(WORKFLOWS, tmp_path / ".github" / "workflows")
    shutil.copy(ROOT / ".github" / "actionlint.yaml", tmp_path / ".github")
    gate = tmp_path / ".github" / "workflows" / "gate.yml"
    gate.write_text(gate.read_text().replace("${{ matrix.target }}\"]", "${{ matrix.targte }}\"]"))
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)  # actionlint finds the project by git
    run = subprocess.run([_actionlint(), "-no-color"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 1 and "targte" in run.stdout


GATE_POLICY = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["name", "on", "permissions", "jobs"],
    "properties": {
        "permissions": {"type": "object", "required": ["id-token"],
                        "properties": {"id-token": {"const": "write"}}},
        "jobs": {"type": "object", "required": ["gate"], "properties": {"gate": {
            "type": "object",
            "required": ["runs-on", "concurrency", "strategy", "steps"],
            "properties": {
                "runs-on": {"const": ["self-hosted", "linux", "${{ matrix.target }}"]},
                "concurrency": {"type": "object", "required": ["group", "cancel-in-progress"],
                                "properties": {
                                    "group": {"type": "string",
                                              "pattern": r"\$\{\{ matrix\.target \}\}"},
                                    "cancel-in-progress": {"const": False}}},
                "strategy": {"type": "object", "required": ["matrix"], "properties": {
                    "fail-fast": {"const": False},
                    "matrix": {"type": "object", "required": ["include"],
                               "additionalProperties": False, "properties": {"include": {
                                   "type": "array", "minItems": 3, "items": {
                                       "type": "object",
                                       "required": ["target", "session", "row", "launcher"],
                                       "additionalProperties": False,
                                       "properties": {
                                           "target": {"enum": sorted(TARGETS)},
                                           "session": {"type": "string",
                                                       "pattern": "^gate-[a-z0-9-]+$"},
                                           "row": {"type": "string"},
                                           "launcher": {"type": "string"}}}}}}}},
                "steps": {"type": "array", "contains": {
                    "type": "object", "required": ["uses", "with"],
                    "properties": {"uses": {"pattern": "^actions/upload-artifact@"},
                                   "with": {"required": ["name", "path", "if-no-files-found"],
                                            "properties": {"if-no-files-found": {
                                                "const": "error"}}}}}},
            }}}},
    },
}

REVIEW_POLICY = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["on", "permissions", "jobs"],
    "properties": {
        "on": {"type": "object", "required": ["workflow_run"], "properties": {"workflow_run": {
            "required": ["workflows", "types"],
            "properties": {"workflows": {"const": ["gate"]}, "types": {"const": ["completed"]}}}}},
        "permissions": {"type": "object", "required": ["actions", "id-token"],
                        "properties": {"actions": {"const": "read"},
                                       "id-token": {"const": "write"}}},
        "jobs": {"type": "object", "required": ["review"], "properties": {"review": {
            "type": "object", "required": ["env", "steps"],
            "properties": {
                "env": {"type": "object", "required": ["GATE_IDENTITY", "GATE_ISSUER"],
                        "properties": {"GATE_IDENTITY": {"const": GATE_IDENTITY},
                                       "GATE_ISSUER": {"const": ISSUER}}},
                "steps": {"type": "array", "allOf": [
                    {"contains": {"properties": {"uses": {
                        "pattern": "^actions/download-artifact@"}}, "required": ["uses"]}},
                    {"contains": {"properties": {"uses": {
                        "pattern": "^actions/upload-artifact@"}}, "required": ["uses"]}},
                ]},
            }}}},
    },
}


@pytest.mark.parametrize(("name", "policy"), [("gate.yml", GATE_POLICY),
                                              ("review.yml", REVIEW_POLICY)])
def test_workflow_follows_the_policy(name, policy):
    jsonschema.validate(_load(name), policy, cls=jsonschema.Draft202012Validator)


def test_the_policy_rejects_a_workflow_without_keyless_permission():
    doc = _load("gate.yml")
    doc["permissions"].pop("id-token")
    with pytest.raises(jsonschema.ValidationError, match="id-token"):
        jsonschema.validate(doc, GATE_POLICY, cls=jsonschema.Draft202012Validator)


def _nox_row_sessions() -> dict[str, str]:
    """`ROW_SESSIONS` of the noxfile, read without importing nox."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "ROW_SESSIONS"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("noxfile.py has no ROW_SESSIONS")


def _gate_steps() -> list[dict]:
    return _load("gate.yml")["jobs"]["gate"]["steps"]


def test_matrix_targets_match_nox_sessions_and_rows():
    include = _load("gate.yml")["jobs"]["gate"]["strategy"]["matrix"]["include"]
    assert {e["target"] for e in include} == TARGETS
    sessions = _nox_row_sessions()
    for entry in include:
        assert sessions[entry["session"]] == entry["row"]
        row = rows.resolve_row(entry["row"]).row
        assert entry["launcher"] == " ".join(row.target.launcher), entry
    assert {e["target"]: e["launcher"] for e in include}["thor"] == "rc --"


def test_a_launcher_row_runs_without_a_lock_and_others_lock_the_device():
    runs = [s for s in _gate_steps() if "nox -f" in s.get("run", "")]
    by_condition = {s["if"]: s["run"] for s in runs}
    assert set(by_condition) == {"matrix.launcher == ''", "matrix.launcher != ''"}
    assert "flock" not in by_condition["matrix.launcher != ''"]
    assert '"${prefix[@]}" nox -f' in by_condition["matrix.launcher != ''"]
    assert by_condition["matrix.launcher == ''"].startswith("flock --exclusive")
    for run in by_condition.values():  # main's rowgate gates the subject checkout
        assert '-- --repo "$GITHUB_WORKSPACE/subject"' in run


def _rowgate_commands(script: str) -> list[list[str]]:
    """Every `rowgate …` (and `nox -s gate-… -- …`) command line in a run script,
    as the argument list rowgate's parser receives (shell variables kept as text)."""
    joined = re.sub(r"\\\n\s*", " ", script)
    found = []
    # At a command position (line start, or after `if !`), not inside a message.
    for m in re.finditer(r"(?:^\s*|!\s+)rowgate (\S.*?)(?=;|\|\||$)", joined, re.MULTILINE):
        found.append(shlex.split(m.group(1)))
    for m in re.finditer(r'\bnox -f rowgate/noxfile.py -s "\$SESSION" -- (.*?)$', joined,
                         re.MULTILINE):
        found.append(["gate", "ROW", *shlex.split(m.group(1))])
    return found


def test_rowgate_comes_from_main_or_its_pinned_ref_and_the_subject_from_the_inputs():
    checkouts = {s["with"]["path"]: s["with"] for s in _gate_steps()
                 if s.get("uses", "").startswith("actions/checkout@")}
    assert checkouts["rowgate"]["repository"] == "${{ inputs.rowgate_repository || github.repository }}"
    assert checkouts["rowgate"]["ref"] == "${{ inputs.rowgate_ref || github.sha }}"
    assert checkouts["subject"]["repository"] == \
        "${{ inputs.subject_repository || github.repository }}"
    assert checkouts["subject"]["ref"] == "${{ inputs.subject_ref || github.sha }}"
    assert checkouts["subject"]["fetch-depth"] == 0


def test_a_subject_repository_calls_the_gate_with_rowgate_pinned():
    on = _load("gate.yml")["on"]
    assert set(on["workflow_dispatch"]["inputs"]) == {"subject_repository", "subject_ref"}
    called = on["workflow_call"]["inputs"]
    assert called["rowgate_repository"]["required"] and called["rowgate_ref"]["required"]
    assert not called["subject_repository"]["required"] and not called["subject_ref"]["required"]
    example = yaml.safe_load((ROOT / "docs" / "examples" / "subject-gate.yml").read_text())
    job = example["jobs"]["gate"]
    assert job["uses"].split("@")[0].endswith("/.github/workflows/gate.yml")
    assert job["permissions"]["id-token"] == "write"
    assert set(job["with"]) <= set(called) and {"rowgate_repository", "rowgate_ref"} <= set(job["with"])
    assert (ROOT / "docs" / "examples" / "subject-gate.yml").name in \
        (ROOT / "docs" / "operators.md").read_text()


def test_actionlint_accepts_the_subject_example(tmp_path):
    """The few lines a subject adds, linted as the subject's own workflow."""
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(ROOT / "docs" / "examples" / "subject-gate.yml",
                tmp_path / ".github" / "workflows" / "rowgate.yml")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    run = subprocess.run([_actionlint(), "-no-color"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_rowgate_command_in_the_workflows_parses():
    scripts = [s.get("run", "") for name in ("gate.yml", "review.yml")
               for job in _load(name)["jobs"].values() for s in job["steps"]]
    commands = [c for s in scripts for c in _rowgate_commands(s)]
    assert {c[0] for c in commands} == {"gate", "verify", "review", "report"}
    for argv in commands:
        ns = _parser().parse_args(argv)
        if ns.command in ("verify", "review", "report"):
            assert (ns.identity, ns.issuer) == ("$GATE_IDENTITY", "$GATE_ISSUER"), argv
