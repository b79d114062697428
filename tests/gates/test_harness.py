"""`contract = "harness/1"`: a kernel in its own signature and cache layout (pagedv:
vLLM's `[blocks, heads, D/x, S, x]` key cache, tests/fixtures/subjects/vllm_paged) gated
through the project's harness. On the CPU: the declaration's rules, the plan, and the
row's build and audit (the operator gate PENDING without a GPU, the harness confined and
parsed, never imported here). The GPU half is in test_subject_gpu.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from rowgate.cli.main import main
from rowgate.cuda import kernels
from rowgate.errors import SubjectError
from tests.subjects import vllm_paged_subject

ROOT = Path(__file__).resolve().parents[2]
ROW = ROOT / "tests" / "data" / "rows" / "SUBJECT-PAGEDV-SM90.toml"


@pytest.fixture
def pagedv(tmp_path) -> Path:
    repo = vllm_paged_subject(tmp_path / "pagedv")
    repo.close()
    return tmp_path / "pagedv"


def _edit(subject: Path, old: str, new: str) -> None:
    path = subject / "kernels" / "kernels.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_the_harness_operator_loads_with_its_file_confined(pagedv):
    decl = kernels.load(pagedv).operators["paged_attention_v1"]
    op = decl.to_contract("paged_attention_v1")
    assert op.is_harness and op.harness == "rowgate_harness.py:run"
    assert op.entries("bf16", 128, 4) == {"baseline": "baseline", "candidate": "candidate"}
    assert op.launchable("baseline") == []


@pytest.mark.parametrize("old,new,said", [
    ('harness = "rowgate_harness.py:run"', 'harness = "rowgate_harness.py:launch"',
     "operators.paged_attention_v1.harness: rowgate_harness.py defines no top-level "
     "function 'launch'"),
    ('harness = "rowgate_harness.py:run"', 'harness = "link.py:run"',
     "operators.paged_attention_v1.harness: 'link.py' resolves outside the subject"),
    ('harness = "rowgate_harness.py:run"', 'harness = "rowgate_harness.py:run"\n'
     'baseline = "paged_attention_v1_bf16_h{head_dim}"',
     "contract harness/1: baseline belong to the fixed contract"),
    ('harness = "rowgate_harness.py:run"\n', '',
     'contract harness/1: harness = "FILE.py:FUNCTION" is required'),
], ids=["no-such-function", "outside", "fixed-contract-keys", "no-harness"])
def test_a_harness_declaration_that_does_not_hold_is_one_line(pagedv, old, new, said):
    (pagedv.parent / "outside.py").write_text("def run(*a):\n    pass\n")
    (pagedv / "link.py").symlink_to(pagedv.parent / "outside.py")
    _edit(pagedv, old, new)
    with pytest.raises(SubjectError) as exc:  # KernelsError, or confine's refusal
        kernels.load(pagedv)
    assert said in str(exc.value), str(exc.value)


def test_the_plan_resolves_the_harness(pagedv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["gate", str(ROW), "--repo", str(pagedv), "--plan", "--plan-gpu", "sm_90:H100"])
    out = capsys.readouterr().out
    assert exc.value.code == 3, out  # the operator gate: PENDING without a GPU here
    assert ("needs operator paged_attention_v1 (harness/1) of kernel paged_attention: its "
            "harness rowgate_harness.py:run launches the build's cubin") in out


def test_a_phase_gate_refuses_a_harness_operator(pagedv, tmp_path, capsys):
    row = tmp_path / "PHASE-HARNESS.toml"
    row.write_text(ROW.read_text().replace('id = "SUBJECT-PAGEDV-SM90"', 'id = "PHASE-HARNESS"')
                   + textwrap.dedent('''
        [[gates]]
        id = "phase"
        kind = "phase"
        operator = "paged_attention_v1"
        phases = ["qk"]
        shape = "B4-uniform-1024-bf16-h32x8-d128-p16"
    '''))
    with pytest.raises(SystemExit) as exc:
        main(["gate", str(row), "--repo", str(pagedv), "--plan", "--plan-gpu", "sm_90:H100"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "gate phase: phase gate: operator paged_attention_v1 is a harness/1 operator" in err


@pytest.mark.slow
def test_the_rows_build_and_audit_pass_and_the_operator_waits_for_a_gpu(pagedv, tmp_path,
                                                                       capsys):
    import json

    with pytest.raises(SystemExit) as exc:
        main(["-q", "gate", str(ROW), "--repo", str(pagedv), "--out", str(tmp_path / "ev"),
              "--json"])
    doc = json.loads(capsys.readouterr().out)
    got = {g["gate_id"]: g["status"] for g in doc["gates"]}
    assert got == {"host": "PASS", "build": "PASS", "audit": "PASS", "operator": "PENDING"}
    assert exc.value.code == 3
